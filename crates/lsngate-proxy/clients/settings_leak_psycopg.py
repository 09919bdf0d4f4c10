"""Stress through the lsngate proxy: 8 psycopg clients set session settings in many shapes
(plain, pipelined behind an error, rolled back, RESET, in a read-only block, set_config, in an
aborted block) and leave; every fresh client must see the server's defaults (work_mem 4MB, no
application_name of theirs) on its first read, wherever it runs. Prints `fresh reads N, bad M`
and the first bad ones. Usage: settings_leak_psycopg.py URL SECONDS SEED"""
import random, sys, threading, time
import psycopg

url, seconds, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
deadline = time.time() + seconds
bad, fresh_reads, lock = [], [0], threading.Lock()

def dirty(conn, rng):
    shape = rng.randrange(9)
    mb = rng.randrange(5, 60)
    try:
        if shape == 0:
            conn.execute(f"SET work_mem = '{mb}MB'")
            conn.execute("SELECT current_setting('work_mem')").fetchone()
        elif shape == 1:
            with conn.pipeline():
                conn.execute(f"SET work_mem = '{mb}MB'")
                conn.execute("SELECT 1/0")
                conn.execute(f"SET work_mem = '{mb+1}MB'")
        elif shape == 2:
            conn.execute("BEGIN")
            conn.execute(f"SET work_mem = '{mb}MB'")
            conn.execute("ROLLBACK")
        elif shape == 3:
            conn.execute(f"SET work_mem = '{mb}MB'; SELECT 1")
            conn.execute("RESET work_mem")
        elif shape == 4:
            conn.execute("BEGIN READ ONLY")
            conn.execute(f"SET work_mem = '{mb}MB'")
            conn.execute("SELECT current_setting('work_mem')").fetchone()
            conn.execute("COMMIT")
        elif shape == 5:
            conn.execute(f"SELECT set_config('work_mem', '{mb}MB', false)").fetchone()
        elif shape == 6:
            with conn.pipeline():
                conn.execute(f"SET work_mem = '{mb}MB'")
                conn.execute("SELECT current_setting('work_mem')")
                conn.execute(f"SET application_name = 'x{mb}'")
        elif shape == 7:
            conn.execute("BEGIN")
            conn.execute(f"SET work_mem = '{mb}MB'")
            conn.execute("SELECT 1/0")
        else:
            conn.execute(f"SET work_mem = '{mb}MB'")
            conn.execute("SELECT pg_sleep(0.001)")
    except psycopg.Error:
        pass

def worker(i):
    rng = random.Random(seed * 100 + i)
    while time.time() < deadline:
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                for _ in range(rng.randrange(1, 4)):
                    dirty(conn, rng)
            with psycopg.connect(url, autocommit=True) as conn:
                got = conn.execute("SELECT current_setting('work_mem'), current_setting('application_name'), pg_is_in_recovery()").fetchone()
                with lock:
                    fresh_reads[0] += 1
                    if got[0] != "4MB" or got[1].startswith("x"):
                        bad.append(got)
        except psycopg.Error as e:
            with lock:
                bad.append(("error", str(e)))

threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
print(f"fresh reads {fresh_reads[0]}, bad {len(bad)}")
for b in bad[:10]:
    print("  ", b)
