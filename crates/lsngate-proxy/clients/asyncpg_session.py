"""Scripted asyncpg session through the lsngate proxy: DDL, insert, prepared statements,
executemany, a transaction, COPY in/out, an error and recovery.
Usage: asyncpg_session.py URL TABLE. Prints OK and exits 0 on success."""
import asyncio
import io
import sys

import asyncpg

PRIMARY = "/* lsngate:route=primary */ "


async def main(url: str, t: str) -> None:
    conn = await asyncpg.connect(url)
    await conn.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, note text)")
    await conn.execute(f"INSERT INTO {t} VALUES ($1, $2)", 1, "one")
    insert = await conn.prepare(f"INSERT INTO {t} VALUES ($1, $2)")
    for i in range(2, 7):
        await insert.fetch(i, f"n{i}")
    await conn.executemany(f"INSERT INTO {t} VALUES ($1, $2)", [(i, "many") for i in range(10, 20)])
    async with conn.transaction():
        await conn.execute(f"UPDATE {t} SET note = 'updated' WHERE id = 1")
        assert await conn.fetchval(f"SELECT note FROM {t} WHERE id = 1") == "updated"
    # copy_records_to_table first reads the table's columns: a read that must see the new table,
    # so send it to the primary (replicas may not have replayed the CREATE TABLE yet).
    await conn.execute("SET lsngate.route = primary")
    await conn.copy_records_to_table(t, records=[(i, "copied") for i in range(100, 110)])
    await conn.execute("RESET lsngate.route")
    try:
        await conn.execute(f"INSERT INTO {t} VALUES (1, 'duplicate')")
        raise SystemExit("duplicate insert did not fail")
    except asyncpg.UniqueViolationError:
        pass
    count = await conn.fetchval(PRIMARY + f"SELECT count(*) FROM {t}")
    assert count == 26, count
    out = io.BytesIO()
    await conn.copy_from_query(PRIMARY + f"SELECT id FROM {t} ORDER BY id", output=out)
    assert out.getvalue().split(b"\n")[0] == b"1"
    replica = await conn.fetchval("SELECT pg_is_in_recovery()")
    assert replica is True, "a plain read should be served by a replica"
    await conn.close()
    print("OK asyncpg", asyncpg.__version__)


asyncio.run(main(sys.argv[1], sys.argv[2]))
