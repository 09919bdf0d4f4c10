"""A commit whose position was lost with the primary, seen by psycopg 3 (a driver nobody here
wrote) through the lsngate proxy in token mode.
Usage: lost_position_psycopg.py URL TABLE   (TABLE has an `id int` column and no rows)
It talks with the test one line at a time: it prints what it saw, and before each fault step it
reads the line that says the test has set it ("cut": the primary's connection is cut right after
the next ReadyForQuery; "healed").
Prints, in order:
  first <commit_lsn>             after INSERT 1 (ParameterStatus)
  lost <commit_lsn!r> <commit_token!r>    after INSERT 2, whose position was lost
  show refused <SQLSTATE> | show <value>  SHOW lsngate.commit_lsn with the primary unreachable
  known <SHOW value> <ParameterStatus>    once healed (retried every 100 ms, at most 30 s)
  read <count of id 2>           another connection after SET lsngate.min_lsn to that value
  empty refused <SQLSTATE>       SET lsngate.min_lsn = ''
"""
import sys
import time

import psycopg

url, t = sys.argv[1], sys.argv[2]


def say(*words):
    print(*words, flush=True)


def expect(word):
    line = sys.stdin.readline().strip()
    assert line == word, f"expected {word!r} from the test, got {line!r}"


def connect():
    return psycopg.connect(url, autocommit=True, options="-c lsngate.consistency=token")


with connect() as writer:
    writer.execute(f"INSERT INTO {t} VALUES (1)")
    say("first", writer.info.parameter_status("lsngate.commit_lsn"))
    expect("cut")
    writer.execute(f"INSERT INTO {t} VALUES (2)")
    say(
        "lost",
        repr(writer.info.parameter_status("lsngate.commit_lsn")),
        repr(writer.info.parameter_status("lsngate.commit_token")),
    )
    try:
        say("show", writer.execute("SHOW lsngate.commit_lsn").fetchone()[0])
    except psycopg.Error as e:
        say("show refused", e.sqlstate)
    expect("healed")
    deadline = time.monotonic() + 30
    while True:
        try:
            known = writer.execute("SHOW lsngate.commit_lsn").fetchone()[0]
            break
        except psycopg.Error as e:
            assert time.monotonic() < deadline, f"commit_lsn never known again: {e}"
            time.sleep(0.1)
    say("known", known, writer.info.parameter_status("lsngate.commit_lsn"))

with connect() as reader:
    reader.execute(f"SET lsngate.min_lsn = '{known}'")
    say("read", reader.execute(f"SELECT count(*) FROM {t} WHERE id = 2").fetchone()[0])
    try:
        reader.execute("SET lsngate.min_lsn = ''")
        say("empty accepted")
    except psycopg.Error as e:
        say("empty refused", e.sqlstate)
