"""psycopg 3's pipeline mode inside a read-only transaction block: a read, COMMIT and an UPDATE
queued before one Sync. Usage: psycopg_pipeline_block_end.py CONNINFO TABLE. Prints one line per
step: where the block ran, what the pipeline got, the transaction status after it, and the
row's value read from the primary after a ROLLBACK."""
import sys

import psycopg

url, t = sys.argv[1], sys.argv[2]

with psycopg.connect(url, autocommit=True, application_name="psycopg-block-end") as conn:
    conn.execute("BEGIN READ ONLY")
    print("in_recovery", conn.execute("SELECT pg_is_in_recovery()").fetchone()[0])
    try:
        with conn.pipeline():
            conn.execute("SELECT 1")
            conn.execute("COMMIT")
            conn.execute(f"UPDATE {t} SET v = 11 WHERE id = 1")
        print("pipeline ok")
    except psycopg.Error as e:
        print("pipeline error", e.sqlstate, str(e).replace("\n", " "))
    print("status", conn.info.transaction_status.name)
    if conn.info.transaction_status.name != "IDLE":
        conn.execute("ROLLBACK")
    v = conn.execute(f"/* lsngate:route=primary */ SELECT v FROM {t} WHERE id = 1").fetchone()[0]
    print("v", v)
