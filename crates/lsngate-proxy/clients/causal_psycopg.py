"""Causal reads through the lsngate proxy, with psycopg 3 (a driver nobody here wrote).
Usage: causal_psycopg.py SCENARIO URL TABLE N [WORKERS]
  own     WORKERS threads, one connection each: insert a row, read it back at once (session mode)
  token   write on A, take A's ParameterStatus lsngate.commit_lsn, SET lsngate.min_lsn on B, read on B
  global  write on A, read on B, both in consistency global (no token handed over)
  naive   the control: write on A, read on B in consistency eventual (expected to miss rows)
Prints one line: `stale=S replica=R reads=N` (replica = reads a standby answered) and exits 0."""
import sys
import threading

import psycopg

scenario, url, t, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
workers = int(sys.argv[5]) if len(sys.argv) > 5 else 1
READ = f"SELECT v, pg_is_in_recovery() FROM {t} WHERE id = %s"
counts = {"stale": 0, "replica": 0, "reads": 0}
lock = threading.Lock()


def connect(mode):
    return psycopg.connect(url, autocommit=True, options=f"-c lsngate.consistency={mode}")


def tally(row, expected):
    with lock:
        counts["reads"] += 1
        if row is None or row[0] != expected:
            counts["stale"] += 1
        elif row[1]:
            counts["replica"] += 1


def own(worker):
    with connect("session") as conn:
        for i in range(n):
            key = worker * 1_000_000 + i
            conn.execute(f"INSERT INTO {t} (id, v) VALUES (%s, %s)", (key, i))
            tally(conn.execute(READ, (key,)).fetchone(), i)


def across(mode_a, mode_b, hand_over):
    with connect(mode_a) as a, connect(mode_b) as b:
        for i in range(n):
            a.execute(f"INSERT INTO {t} (id, v) VALUES (%s, %s)", (i, i))
            if hand_over:
                token = a.info.parameter_status("lsngate.commit_lsn")
                assert token, "no lsngate.commit_lsn after a commit"
                shown = a.execute("SHOW lsngate.commit_lsn").fetchone()[0]
                assert shown == token, (shown, token)
                b.execute(f"SET lsngate.min_lsn = '{token}'")
            tally(b.execute(READ, (i,)).fetchone(), i)


if scenario == "own":
    threads = [threading.Thread(target=own, args=(w,)) for w in range(workers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
elif scenario == "token":
    across("token", "token", True)
elif scenario == "global":
    across("global", "global", False)
elif scenario == "naive":
    across("eventual", "eventual", False)
else:
    raise SystemExit(f"unknown scenario {scenario}")
print(f"stale={counts['stale']} replica={counts['replica']} reads={counts['reads']}")
