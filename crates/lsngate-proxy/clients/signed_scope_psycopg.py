"""Signed causal scopes through the lsngate proxy, with psycopg 3, signed here in Python from the
format the README documents (nothing of lsngate's code): `<name>~e<unix>~s<base64url HMAC-SHA256
under the token secret of b"lsngate-scope:" + everything before "~s">`.
Usage: signed_scope_psycopg.py URL SECRET TABLE N
Each of N rounds writes row i under a signed scope on one connection and reads it on another
under the same signed scope (the replica is behind). Before that, a bare name, a forged
signature and an expired scope are each tried and must be refused.
Prints `unsigned=<SQLSTATE> forged=<SQLSTATE> expired=<SQLSTATE> stale=S replica=R reads=N`."""
import base64
import hashlib
import hmac
import sys
import time

import psycopg

url, secret, t, n = sys.argv[1], sys.argv[2].encode(), sys.argv[3], int(sys.argv[4])


def sign(name, expires_at):
    body = f"{name}~e{expires_at}"
    mac = hmac.new(secret, b"lsngate-scope:" + body.encode(), hashlib.sha256).digest()
    return body + "~s" + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def refused(conn, value):
    try:
        conn.execute(f"SET lsngate.scope = '{value}'")
    except psycopg.Error as e:
        return e.sqlstate
    return "accepted"


scope = sign("user:42", int(time.time()) + 300)
with psycopg.connect(url, autocommit=True) as probe:
    unsigned = refused(probe, "user:42")
    forged = refused(probe, scope.replace("user:42", "user:43", 1))
    expired = refused(probe, sign("user:42", int(time.time()) - 10))

stale = replica = reads = 0
with psycopg.connect(url, autocommit=True) as writer, psycopg.connect(url, autocommit=True) as reader:
    writer.execute(f"SET lsngate.scope = '{scope}'")
    for i in range(n):
        writer.execute(f"INSERT INTO {t} (id, v) VALUES (%s, %s)", (i, i))
        row = reader.execute(
            f"/* lsngate_scope='{scope}' */ SELECT v, pg_is_in_recovery() FROM {t} WHERE id = %s", (i,)
        ).fetchone()
        reads += 1
        if row is None or row[0] != i:
            stale += 1
        elif row[1]:
            replica += 1
print(f"unsigned={unsigned} forged={forged} expired={expired} stale={stale} replica={replica} reads={reads}")
