"""Scripted psycopg 3 session through the lsngate proxy: DDL, insert, prepared statements,
a transaction, COPY in/out, pipeline mode (a write after a fetched read in one pipeline), an error and recovery, LISTEN/NOTIFY.
Usage: psycopg_session.py CONNINFO TABLE. Prints OK and exits 0 on success."""
import sys

import psycopg

url, t = sys.argv[1], sys.argv[2]
PRIMARY = "/* lsngate:route=primary */ "

with psycopg.connect(url, autocommit=True, application_name="psycopg-session") as conn:
    assert conn.info.parameter_status("application_name") == "psycopg-session"
    conn.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, note text)")
    conn.execute(f"INSERT INTO {t} VALUES (%s, %s)", (1, "one"))
    for i in range(2, 12):
        conn.execute(f"INSERT INTO {t} VALUES (%s, %s)", (i, f"n{i}"), prepare=True)
    with conn.transaction():
        conn.execute(f"UPDATE {t} SET note = 'updated' WHERE id = 1")
        assert conn.execute(f"SELECT note FROM {t} WHERE id = 1").fetchone()[0] == "updated"
    with conn.cursor() as cur:
        with cur.copy(f"COPY {t} (id, note) FROM STDIN") as copy:
            for i in range(100, 110):
                copy.write_row((i, f"c{i}"))
    try:
        conn.execute(f"INSERT INTO {t} VALUES (1, 'duplicate')")
        raise SystemExit("duplicate insert did not fail")
    except psycopg.errors.UniqueViolation:
        pass
    try:
        with conn.transaction():
            conn.execute(f"INSERT INTO {t} VALUES (500, 'rolled back')")
            conn.execute("SELECT 1/0")
    except psycopg.errors.DivisionByZero:
        pass
    with conn.pipeline():
        for i in range(200, 210):
            conn.execute(f"INSERT INTO {t} VALUES (%s, 'pipelined')", (i,))
    with conn.cursor() as cur:
        with cur.copy(PRIMARY + f"COPY (SELECT id FROM {t} ORDER BY id) TO STDOUT") as copy:
            ids = [int(row[0]) for row in copy.rows()]
    assert len(ids) == 31 and ids[0] == 1 and 500 not in ids, ids
    count = conn.execute(PRIMARY + f"SELECT count(*) FROM {t}").fetchone()[0]
    assert count == 31, count
    for _ in range(8):
        assert conn.execute("SELECT %s::int + 1", (41,), prepare=True).fetchone()[0] == 42
    # Pipeline mode fetches a read's rows with a Flush, so the write after it comes in the same
    # batch: the proxy ends the read's batch on the replica and writes on the primary (it held
    # the write on the replica before, 25006), with unnamed and with prepared statements.
    for i, prepare in ((300, False), (301, True)):
        with conn.pipeline():
            cur = conn.cursor()
            cur.execute(f"SELECT count(*) FROM {t} WHERE id < 300", prepare=prepare)
            assert cur.fetchone()[0] == 31
            cur.execute(f"INSERT INTO {t} VALUES (%s, 'after a read')", (i,), prepare=prepare)
            cur.execute(f"SELECT note FROM {t} WHERE id = %s", (i,), prepare=prepare)
            assert cur.fetchone()[0] == "after a read"
    conn.execute("LISTEN lsngate_psycopg")
    conn.execute("NOTIFY lsngate_psycopg, 'hello'")
    notes = list(conn.notifies(timeout=5, stop_after=1))
    assert notes and notes[0].payload == "hello", notes
print("OK psycopg", psycopg.__version__)
