"""Reads that run again, driven by libpq's pipeline mode (through psycopg's `pq` module: libpq's
protocol code, not lsngate's), each answer compared with PostgreSQL's own on a direct connection.

After each INSERT, two read flights pipelined together, each with its own Sync:
  describe: Parse "" of a count / Sync, then Describe S "" and Parse "" of another statement / Sync
  reparse:  Parse s3 / Sync, then Parse s3 again / Sync (PostgreSQL refuses it: 42P05)
Through a replica held behind the primary, each read waits for the INSERT and may run again
elsewhere (seeds 20261220829 and 20261217757: a read run again was read against the wrong record
of the client's statements).

usage: libpq_pipeline_reruns.py DIRECT_URL PROXY_URL TABLE ROUNDS
prints: rounds N, unlike PostgreSQL: describe D, reparse R
"""
import sys

import psycopg
from psycopg import pq

direct_url, proxy_url, table, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])


def pipeline(pg, sends):
    """Each of `sends` with its own Sync, sent together; the results, per message."""
    pg.enter_pipeline_mode()
    for send in sends:
        send(pg)
        pg.pipeline_sync()
    while pg.flush() != 0:
        pass
    out, syncs = [], 0
    while syncs < len(sends):
        pg.consume_input()
        r = pg.get_result()
        if r is None:
            continue
        status = pq.ExecStatus(r.status)
        if status == pq.ExecStatus.PIPELINE_SYNC:
            syncs += 1
        elif status == pq.ExecStatus.FATAL_ERROR:
            out.append(("error", r.error_field(pq.DiagnosticField.SQLSTATE)))
        else:
            out.append((status.name, r.nparams, [r.fname(i) for i in range(r.nfields)]))
    pg.exit_pipeline_mode()
    return out


def describe(pg):
    pg.send_describe_prepared(b"")
    pg.send_prepare(b"", b"SELECT g AS n, g * $1 AS m FROM generate_series(1, 4) g")


shapes = {
    "describe": [
        lambda pg: pg.send_prepare(b"", f"SELECT count(*) FROM {table}".encode()),
        describe,
    ],
    "reparse": [
        lambda pg: pg.send_prepare(b"s3", f"SELECT id FROM {table} ORDER BY id".encode()),
        lambda pg: pg.send_prepare(b"s3", f"SELECT id FROM {table} ORDER BY id".encode()),
    ],
}
unlike = {name: 0 for name in shapes}
with psycopg.connect(direct_url, autocommit=True, prepare_threshold=None) as direct, \
        psycopg.connect(proxy_url, autocommit=True, prepare_threshold=None) as proxy:
    for i in range(rounds):
        for name, sends in shapes.items():
            answers = []
            for conn in (direct, proxy):
                conn.execute(f"INSERT INTO {table} VALUES ({i})")
                answers.append(pipeline(conn.pgconn, sends))
                conn.execute("DEALLOCATE ALL")
            if answers[0] != answers[1]:
                unlike[name] += 1
                print(f"round {i} {name}: PostgreSQL {answers[0]}, lsngate {answers[1]}", file=sys.stderr)
print(f"rounds {rounds}, unlike PostgreSQL: " + ", ".join(f"{k} {v}" for k, v in unlike.items()))
