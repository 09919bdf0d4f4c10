//! Known sequences: the smallest cases the differential checker shrank its findings to
//! (2026-12-01), run before the random ones in every run, so each bug keeps a test of its own
//! however the generator changes. Each is named after what the proxy must get right.

use super::case::{Case, Msg, Step};

fn q(sql: &str) -> Step {
    Step::Send(Msg::Query(sql.into()))
}

fn parse(name: &str, sql: &str) -> Step {
    Step::Send(Msg::Parse {
        name: name.into(),
        sql: sql.into(),
        types: Vec::new(),
    })
}

fn bind(statement: &str) -> Step {
    Step::Send(Msg::Bind {
        portal: String::new(),
        statement: statement.into(),
        params: Vec::new(),
        binary_results: false,
    })
}

fn execute() -> Step {
    Step::Send(Msg::Execute {
        portal: String::new(),
        max_rows: 0,
    })
}

fn sync() -> Step {
    Step::Send(Msg::Sync)
}

fn copy_data(data: &str) -> Step {
    Step::Send(Msg::CopyData(data.into()))
}

fn copy_done() -> Step {
    Step::Send(Msg::CopyDone)
}

fn describe(kind: char, name: &str) -> Step {
    Step::Send(Msg::Describe {
        kind,
        name: name.into(),
    })
}

fn close(name: &str) -> Step {
    Step::Send(Msg::Close {
        kind: 'S',
        name: name.into(),
    })
}

fn execute_rows(max_rows: i32) -> Step {
    Step::Send(Msg::Execute {
        portal: String::new(),
        max_rows,
    })
}

fn bind_with(portal: &str, statement: &str, params: &[&str]) -> Step {
    Step::Send(Msg::Bind {
        portal: portal.into(),
        statement: statement.into(),
        params: params.iter().map(|p| Some(p.to_string())).collect(),
        binary_results: false,
    })
}

const COPY_IN: &str = "COPY {t} (id, v) FROM STDIN";

/// (name, case) for every known sequence.
/// Known sequences a PostgreSQL 19 prerelease cannot run directly: a simple Query behind an
/// unsynced Execute outside a block, after which 19rc1 fails the batch's Sync (XX000). They run
/// on the other versions.
pub const NOT_ON_19_PRERELEASE: &[&str] =
    &["a write committed by the stand-in for a proxy command is read back"];

pub fn known() -> Vec<(&'static str, Case)> {
    let case = |steps: Vec<Step>| Case { steps };
    vec![
        (
            // PostgreSQL skips everything up to the Sync after an error, simple Queries too.
            "a simple Query sent while the server skips to Sync is not run",
            case(vec![bind("s3"), q("SAVEPOINT sp2")]),
        ),
        (
            // pgjdbc's autosave, in one write (issue #21).
            "a simple Query behind unsynced extended messages is answered after them",
            case(vec![
                parse("", "BEGIN"),
                bind(""),
                execute(),
                q("SAVEPOINT PGJDBC_AUTOSAVE"),
                parse("", "INSERT INTO {t} (id, v) VALUES (201, 1)"),
                bind(""),
                execute(),
                sync(),
            ]),
        ),
        (
            "a Sync after a finished COPY FROM STDIN gets its ReadyForQuery",
            case(vec![
                q(COPY_IN),
                copy_data("201\t1\n"),
                copy_done(),
                Step::Wait,
                sync(),
            ]),
        ),
        (
            "a Query pipelined behind a COPY FROM STDIN gets its own rows",
            case(vec![
                q(COPY_IN),
                copy_done(),
                q("VALUES (1, 'one'), (2, NULL)"),
            ]),
        ),
        (
            "extended messages after a COPY FROM STDIN get their replies, not the proxy's",
            case(vec![
                q(COPY_IN),
                copy_data("201\t1\n"),
                copy_done(),
                Step::Wait,
                parse("", "INSERT INTO {t} (id, v) VALUES (202, 2)"),
                bind(""),
                execute(),
                sync(),
            ]),
        ),
        (
            "a COPY FROM STDIN that is only parsed is not taken for a running COPY",
            case(vec![parse("", COPY_IN), sync()]),
        ),
        (
            "COPY FROM STDIN over the extended protocol keeps its server connection",
            case(vec![
                parse("", COPY_IN),
                bind(""),
                execute(),
                copy_data("201\t1\n"),
                copy_done(),
                sync(),
                Step::Wait,
            ]),
        ),
        (
            "SET lsngate.* in a failed transaction block fails with 25P02",
            case(vec![
                q("BEGIN"),
                q("SELECT 1/0"),
                q("SET lsngate.route = auto"),
            ]),
        ),
        (
            "a second Execute of a SET portal fails with 55000, as for any utility statement",
            case(vec![
                parse("", "SET lsngate.route = auto"),
                bind(""),
                execute(),
                execute(),
                sync(),
            ]),
        ),
        (
            "parsing a statement name that exists fails with 42P05",
            case(vec![
                parse("s1", "SELECT 1"),
                sync(),
                parse("s1", "SELECT 2"),
                sync(),
            ]),
        ),
        (
            // Seeds 20261221, 20261231: the proxy answered 42P05 to the first Parse.
            "a name parsed twice in one pipeline: the first Parse defines it, the second fails with 42P05",
            case(vec![
                parse("s1", "SELECT 1 AS one"),
                bind("s1"),
                execute(),
                parse("s1", "SELECT 2 AS two"),
                sync(),
            ]),
        ),
        (
            "a DEALLOCATE ALL run in a pipeline drops the statements parsed before it, not those parsed after",
            case(vec![
                parse("s1", "SELECT 1 AS one"),
                parse("", "DEALLOCATE ALL"),
                bind(""),
                execute(),
                parse("s1", "SELECT 2 AS two"),
                bind("s1"),
                execute(),
                sync(),
                bind("s1"),
                execute(),
                sync(),
            ]),
        ),
        (
            // Seeds 20261231 then 20261232: the statements a skipped DEALLOCATE ALL kept stayed
            // on the pooled connection, unknown to the proxy (42P05 for the next client).
            "a DEALLOCATE ALL the server skips after an error keeps the statements",
            case(vec![
                parse("s1", "SELECT 1 AS one"),
                sync(),
                bind("s9"),
                parse("", "DEALLOCATE ALL"),
                bind(""),
                execute(),
                sync(),
                bind("s1"),
                execute(),
                sync(),
                Step::Reconnect,
                parse("s1", "SELECT 2 AS two"),
                bind("s1"),
                execute(),
                sync(),
            ]),
        ),
        (
            // Seeds 20261358, 20261363: the proxy parsed it in front (or failed the Bind 08P01).
            "a Bind of a statement parsed later in the same pipeline fails with 26000",
            case(vec![
                bind("s1"),
                execute(),
                parse("s1", "SELECT 1 AS one"),
                sync(),
            ]),
        ),
        (
            "a Close in a pipeline drops the name for the messages after it, not before",
            case(vec![
                parse("s1", "SELECT 1 AS one"),
                sync(),
                bind("s1"),
                execute(),
                close("s1"),
                parse("s1", "SELECT 2 AS two"),
                bind("s1"),
                execute(),
                sync(),
            ]),
        ),
        (
            // Seed 20261274 (replicas): the read went to a replica, where the proxy parsed it.
            "a Parse the server skips after an error in its pipeline defines nothing",
            case(vec![
                bind("s9"),
                parse("s1", "VALUES (1, 'one')"),
                sync(),
                bind("s1"),
                execute(),
                sync(),
            ]),
        ),
        (
            // Seed 20261356 (replicas): the proxy closed the statement on the replica it read on.
            "a Close the server skips after an error in its pipeline keeps the statement",
            case(vec![
                parse("s1", "SELECT 1 AS one"),
                sync(),
                bind("s9"),
                close("s1"),
                sync(),
                parse("s1", "SELECT 2 AS two"),
                bind("s1"),
                execute(),
                sync(),
            ]),
        ),
        (
            "a simple Query drops the unnamed statement: Describe S \"\" fails with 26000",
            case(vec![
                parse("", "SELECT 1 AS one"),
                sync(),
                q("SELECT 2 AS two"),
                Step::Send(Msg::Describe {
                    kind: 'S',
                    name: String::new(),
                }),
                sync(),
            ]),
        ),
        (
            // Seed 20261352 (PostgreSQL 15): the server still had the unnamed statement, the
            // Query being the proxy's own, and the Parse behind the Describe hid it.
            "a Describe S \"\" before a Parse \"\" fails with 26000 after a proxy command dropped it",
            case(vec![
                parse("", "SELECT 1 AS one"),
                sync(),
                q("SET lsngate.route = auto"),
                Step::Send(Msg::Describe {
                    kind: 'S',
                    name: String::new(),
                }),
                parse("", "SELECT 2 AS two"),
                sync(),
            ]),
        ),
        (
            "a client cannot bind another client's prepared statement",
            case(vec![
                parse("s_leak", "SELECT 'the first client''s statement' AS owner"),
                sync(),
                Step::Reconnect,
                bind("s_leak"),
                execute(),
                sync(),
            ]),
        ),
        (
            "RESET goes back to the value the client logged in with",
            case(vec![
                q("SET application_name = 'diff-changed'"),
                q("RESET application_name"),
                q("SHOW application_name"),
            ]),
        ),
        (
            // Seeds 20261204, 20261260, 20261279: the pooled server connection's RESET returns to
            // its own login's value, and reports it.
            "RESET over the extended protocol goes back to the value the client logged in with",
            case(vec![
                parse("", "RESET application_name"),
                bind(""),
                describe('P', ""),
                execute(),
                sync(),
                q("SHOW application_name"),
            ]),
        ),
        (
            "a RESET portal is described and run again as RESET, not as what it is sent as",
            case(vec![
                q("SET application_name = 'diff-changed'"),
                parse("s1", "RESET application_name"),
                describe('S', "s1"),
                bind("s1"),
                execute_rows(1),
                sync(),
                q("SHOW application_name"),
                // The second Execute fails (55000) and undoes the first with its transaction.
                bind("s1"),
                execute_rows(1),
                execute(),
                sync(),
            ]),
        ),
        (
            "RESET ALL goes back to the values the client logged in with",
            case(vec![
                q("SET application_name = 'diff-changed'"),
                q("RESET ALL"),
                q("SHOW application_name"),
                parse("", "RESET ALL"),
                bind(""),
                execute(),
                sync(),
                q("SHOW application_name"),
            ]),
        ),
        (
            "DISCARD ALL goes back to the values the client logged in with",
            case(vec![
                q("SET application_name = 'diff-changed'"),
                q("DISCARD ALL"),
                q("SHOW application_name"),
            ]),
        ),
        (
            // Seeds 20261359, 20261382: a later client saw the SET of an earlier one.
            "a SET among other statements of a Query does not reach the next client",
            case(vec![
                q("SELECT 1; SET application_name = 'diff-7'"),
                Step::Reconnect,
                q("SHOW application_name"),
            ]),
        ),
        (
            // Seed 20261244: the server connection already had the value, so the server reported
            // no change; the client still has to hear of it.
            "a SET reports its value to the client even where the server connection had it",
            case(vec![
                q("SELECT 1; SET application_name = 'diff-1'"),
                Step::Reconnect,
                parse("s3", "SET application_name = 'diff-1'"),
                bind("s3"),
                execute(),
                sync(),
            ]),
        ),
        (
            // Seed 20261356: each Bind of "" binds the latest Parse "" before it; the SET was
            // taken for the flight's last unnamed statement, and went back to the pool unseen.
            "a SET parsed unnamed before another unnamed statement does not reach the next client",
            case(vec![
                parse("", "SET application_name = 'diff-7'"),
                bind(""),
                execute(),
                parse("", "SELECT 1 AS one"),
                bind(""),
                execute(),
                sync(),
                Step::Reconnect,
                q("SHOW application_name"),
            ]),
        ),
        (
            // Seed 20261261.
            "only the Execute of a RESET portal is answered RESET, not an unnamed one before it",
            case(vec![
                parse("", "SELECT 1 AS one"),
                bind(""),
                execute(),
                parse("", "RESET application_name"),
                bind(""),
                execute_rows(1),
                execute(),
                sync(),
            ]),
        ),
        (
            // The proxy answers its own command, but the server's transaction status is the
            // client's: the explicit block BEGIN opened in the batch (seed 20261238).
            "a proxy command behind an unsynced BEGIN is answered with the block's status",
            case(vec![
                parse("", "BEGIN"),
                bind(""),
                execute(),
                q("SET lsngate.route = auto"),
                sync(),
            ]),
        ),
        (
            // A DEALLOCATE the proxy answers itself inside an open batch must abort the
            // transaction as the server's error would: the SELECT then gets 25P02 (seed 20261358).
            "a DEALLOCATE of an unknown name behind an unsynced BEGIN aborts the block",
            case(vec![
                parse("", "BEGIN"),
                bind(""),
                execute(),
                q("DEALLOCATE q9"),
                q("SELECT 1 AS one"),
                sync(),
            ]),
        ),
        (
            // A Query ends the batch the read's Parse and Bind opened on a replica, and a bare
            // Flush after it opens nothing: the write after it goes to the primary, not to that
            // replica (25006 before; seed 20261363 on 15).
            "a write after a Query and a bare Flush is not held on the read's replica",
            case(vec![
                parse("", "SELECT id, v FROM {t} ORDER BY id"),
                bind(""),
                q("SET lsngate.route = auto"),
                Step::Send(Msg::Flush),
                parse("", "INSERT INTO {t} (id, v) VALUES (201, 1)"),
                bind(""),
                execute(),
                sync(),
            ]),
        ),
        (
            // psycopg's pipeline mode: a read fetched with a Flush, then a write before the
            // Sync. The read's batch ends on the replica, the write runs on the primary (it was
            // held on the replica, 25006).
            "a write behind a read flushed to a replica runs on the primary",
            case(vec![
                parse("s1", "SELECT id, v FROM {t} ORDER BY id"),
                bind("s1"),
                execute(),
                Step::Send(Msg::Flush),
                Step::Wait,
                parse("s2", "INSERT INTO {t} (id, v) VALUES (201, 1)"),
                bind("s2"),
                execute(),
                sync(),
            ]),
        ),
        (
            // asyncpg prepares with Parse/Describe/Flush and may send a simple Query next: a
            // write there runs on the primary, not on the replica the Parse went to (25006).
            "a simple Query write behind a Parse flushed to a replica runs on the primary",
            case(vec![
                parse("s1", "SELECT id, v FROM {t} ORDER BY id"),
                Step::Send(Msg::Describe {
                    kind: 'S',
                    name: "s1".into(),
                }),
                Step::Send(Msg::Flush),
                Step::Wait,
                q("INSERT INTO {t} (id, v) VALUES (201, 1)"),
                sync(),
            ]),
        ),
        (
            // The RESET sent as its startup value's set_config has its answer relayed as RESET's:
            // it must wait for the COPY's answer, not relabel it (seed 20261370).
            "a RESET right behind a finished COPY FROM STDIN leaves the COPY's tag alone",
            case(vec![
                q(COPY_IN),
                Step::Wait,
                copy_data("201\t1\n"),
                copy_done(),
                q("RESET application_name"),
            ]),
        ),
        (
            // Seed 20261226 behind 20261225, when the machine was busy: the proxy read the
            // client's next flight before the COPY's CommandComplete came back, took the server
            // to be still in COPY, and added nothing in front, so the statement an earlier
            // client left on the pooled connection under the same name was not closed (42P05).
            "a statement an earlier client left is closed in front of a Parse right behind a CopyDone",
            case(vec![
                parse("s2", "INSERT INTO {t} (id, v) VALUES (202, 2)"),
                sync(),
                Step::Reconnect,
                q(COPY_IN),
                Step::Wait,
                copy_data("201\t1\n"),
                copy_done(),
                parse("s2", "INSERT INTO {t} (id, v) VALUES (203, 3)"),
                bind("s2"),
                execute(),
                sync(),
            ]),
        ),
        (
            // Seeds 777040, 777188, 777312, 777640, 777675, 777926: among the statements of one
            // Query the RESET went to the server as it is, which returns to the pooled server
            // connection's own login value; the read-back then took that for the client's.
            "RESET among the statements of one Query goes back to the value the client logged in with",
            case(vec![
                q("SET application_name = 'diff-changed'"),
                q("RESET application_name; SELECT 1"),
                Step::Wait,
                q("SHOW application_name"),
                q("SET application_name = 'diff-changed'; RESET application_name"),
                q("SHOW application_name"),
            ]),
        ),
        (
            "RESET ALL among the statements of one Query goes back to the values the client logged in with",
            case(vec![
                q("SET application_name = 'diff-changed'; RESET ALL"),
                q("SHOW application_name"),
                q("RESET application_name; RESET application_name"),
                q("SHOW application_name"),
            ]),
        ),
        (
            "SET TO DEFAULT goes back to the value the client logged in with",
            case(vec![
                q("SET application_name = 'diff-changed'"),
                q("SET application_name TO DEFAULT"),
                q("SHOW application_name"),
                q("SET application_name = DEFAULT; SELECT 1"),
                q("SHOW application_name"),
                parse("", "SET application_name TO DEFAULT"),
                bind(""),
                execute(),
                sync(),
                q("SHOW application_name"),
            ]),
        ),
        (
            // Seed 777675: inside a transaction block the client heard the server login's value.
            "RESET among the statements of one Query in a transaction block goes back to the startup value until ROLLBACK",
            case(vec![
                q("BEGIN"),
                q("RESET application_name; SELECT 1"),
                q("SHOW application_name"),
                q("COMMIT"),
                q("SHOW application_name"),
                q("SET application_name = 'diff-changed'"),
                q("BEGIN"),
                Step::Wait,
                q("RESET application_name; SELECT 1"),
                Step::Wait,
                q("SHOW application_name"),
                q("ROLLBACK"),
                q("SHOW application_name"),
            ]),
        ),
        (
            // Seed 777969: the proxy answered the second Execute of its own command's portal
            // (55000) but left the server's transaction block running: ReadyForQuery T, and the
            // block's next statements ran where PostgreSQL refuses them (25P02).
            "an error answering a proxy command in a transaction block aborts the block",
            case(vec![
                q("BEGIN"),
                parse("", "SET lsngate.route = 'primary'"),
                bind(""),
                execute_rows(2),
                execute_rows(1),
                sync(),
                q("SELECT 1"),
                q("ROLLBACK"),
                q("SELECT 2"),
            ]),
        ),
        (
            // Seed 777010 (with replicas): the SET was recorded when it was sent, though the
            // server skipped its Execute after the failed Parse; the replica connection the next
            // Query went to was then given it (ParameterStatus where PostgreSQL says nothing).
            "a SET the server skipped after an error is not the client's setting",
            case(vec![
                parse("s2", "SET application_name = 'diff-6'"),
                parse("s2", "SELECT current_setting('application_name') AS app"),
                bind("s2"),
                execute(),
                sync(),
                q(""),
                q("SELECT current_setting('application_name') AS app"),
                parse("", "SET work_mem = 'not a size'"),
                bind(""),
                execute(),
                sync(),
                q("SELECT current_setting('work_mem') AS work_mem"),
            ]),
        ),
        (
            // Seed 777249: the Close the server skipped after the failed Describe left the
            // connection's record without the earlier client's `s3` it still held (42P05, then
            // the reply stream out of step).
            "a Close the server skipped after an error leaves the connection's record as it was",
            case(vec![
                parse("s3", "SELECT 1 AS one"),
                sync(),
                Step::Reconnect,
                describe('P', ""),
                close("s3"),
                sync(),
                parse("s3", "SELECT current_setting('application_name') AS app"),
                bind(""),
                sync(),
                Step::Wait,
                sync(),
            ]),
        ),
        (
            // Seed 777071: inside the batch the client opened nothing can go in front of its
            // Parse, so the statement an earlier client left under the name was still there
            // (42P05). A connection lent to a client now drops, in front of the first flight it
            // can, the names the client does not hold.
            "a Parse inside the client's open batch finds no statement an earlier client left",
            case(vec![
                parse("s1", "SELECT 1 AS one"),
                sync(),
                Step::Reconnect,
                parse("", "BEGIN"),
                Step::Send(Msg::Flush),
                Step::Wait,
                parse("s1", "UPDATE {t} SET v = v + $1 WHERE id <= $2"),
                sync(),
            ]),
        ),
        (
            // Seed 888800: as above, with the Parse in a batch a simple Query ends.
            "a Close the server skipped leaves the statement the pipelined Parse behind it replaces",
            case(vec![
                parse("s1", "SELECT 1 AS one"),
                sync(),
                Step::Reconnect,
                describe('P', ""),
                close("s1"),
                sync(),
                parse("s1", "ROLLBACK"),
                q(""),
                bind("s1"),
                sync(),
            ]),
        ),
        (
            // Seed 888035 (with replicas): the COPY FROM STDIN right behind the COMMIT of a
            // read-only block on a replica went to the replica, taken to be still in the block
            // (25006 "cannot execute COPY during recovery").
            "a write right behind the end of a read-only block on a replica goes to the primary",
            case(vec![
                q("BEGIN READ ONLY"),
                q("SELECT count(*) AS n FROM {t}"),
                q("COMMIT"),
                q(COPY_IN),
                copy_done(),
            ]),
        ),
        (
            "a write right behind the ROLLBACK of a read-only block on a replica goes to the primary",
            case(vec![
                q("BEGIN READ ONLY"),
                q("SELECT count(*) AS n FROM {t}"),
                q("ROLLBACK"),
                q("INSERT INTO {t} (id, v) VALUES (201, 1)"),
            ]),
        ),
        (
            // Seed 999395 (with replicas): the write behind a read-only BEGIN flushed to a
            // replica left that batch for the primary, out of the block (WARNING 25001 there,
            // and the COPY ran), where PostgreSQL refuses it in the read-only block (25006).
            "a write behind a read-only BEGIN flushed to a replica stays in the block",
            case(vec![
                parse("s3", "BEGIN READ ONLY"),
                bind("s3"),
                execute(),
                Step::Send(Msg::Flush),
                q(COPY_IN),
                copy_data("101\t1\n"),
                copy_done(),
                sync(),
            ]),
        ),
        (
            // Seed 999143 (with replicas): a SET LOCAL behind a read flushed to a replica left
            // that batch for the primary, where it ran outside any transaction (WARNING 25P01);
            // PostgreSQL runs it in the batch's implicit transaction.
            "a SET LOCAL behind a read flushed to a replica stays in the batch's transaction",
            case(vec![
                parse("", "SHOW application_name"),
                bind(""),
                execute(),
                Step::Send(Msg::Flush),
                parse("", "SET LOCAL work_mem = '3MB'"),
                bind(""),
                execute(),
                sync(),
            ]),
        ),
        (
            // Seed 777884 (15): a proxy command as a simple Query behind an unsynced END of an
            // aborted block was refused with 25P02, judged by the status the client last heard;
            // the server had left the block by then. In the second block the unsynced messages
            // leave it aborted: the SET is refused there too, and takes no effect.
            "a proxy command behind an unsynced END of an aborted block is answered",
            case(vec![
                q("BEGIN"),
                q("SELECT 1/0"),
                parse("", "END"),
                bind(""),
                execute(),
                q("SET lsngate.route = auto"),
                sync(),
                q("BEGIN"),
                q("SELECT 1/0"),
                parse("", "ROLLBACK"),
                q("SET lsngate.route = 'primary'"),
                sync(),
                q("ROLLBACK"),
                q("SHOW lsngate.route"),
            ]),
        ),
        (
            // Seeds 888943, 999836 (with replicas): a statement parsed and run on a replica,
            // bound inside an aborted block on the primary, got 26000 there (the statement was
            // never prepared on that connection) where PostgreSQL says 25P02.
            "a Bind in an aborted block of a statement parsed on a replica is refused as aborted",
            case(vec![
                parse("s2", "SELECT 1 AS one"),
                bind("s2"),
                execute(),
                sync(),
                q("INSERT INTO {t} (id, v) VALUES (101, 5)"),
                q("BEGIN"),
                q("SELECT 1/0"),
                bind("s2"),
                sync(),
            ]),
        ),
        (
            // Seed 999836: a DEALLOCATE ALL sent as a simple Query in an aborted block is refused
            // (25P02), but the proxy had dropped the client's statements from its books at send
            // time: the Bind behind it got 26000 where PostgreSQL says 25P02.
            "a DEALLOCATE ALL refused in an aborted block keeps the statements",
            case(vec![
                parse("s2", "BEGIN"),
                bind("s2"),
                execute_rows(1),
                execute(),
                sync(),
                q("DEALLOCATE ALL"),
                bind("s2"),
                sync(),
            ]),
        ),
        (
            // The same, answered before the client goes on, and the statement used after the
            // block: it still exists on a direct connection.
            "a statement outlives a DEALLOCATE ALL refused in an aborted block",
            case(vec![
                parse("s1", "SELECT 1 AS one"),
                q("BEGIN"),
                q("SELECT 1/0"),
                Step::Wait,
                q("DEALLOCATE ALL"),
                Step::Wait,
                q("ROLLBACK"),
                bind("s1"),
                execute(),
                sync(),
            ]),
        ),
        (
            // DISCARD ALL cannot run in a transaction block (25001): the statements stay.
            "a statement outlives a DISCARD ALL refused in a transaction block",
            case(vec![
                parse("s1", "SELECT 1 AS one"),
                sync(),
                q("BEGIN"),
                q("DISCARD ALL"),
                q("ROLLBACK"),
                bind("s1"),
                execute(),
                sync(),
            ]),
        ),
        (
            // Seed 222422 (with replicas): a SQL PREPARE in a batch the server skipped (behind an
            // Execute of no portal, 34000) pinned the session all the same, to the replica the
            // batch was on, and the COPY FROM STDIN behind it failed there with 25006.
            "a PREPARE the server skips does not pin the session",
            case(vec![
                execute_rows(2),
                q("COPY (SELECT id, v FROM {t} ORDER BY id) TO STDOUT (FORMAT csv, HEADER)"),
                parse("", "PREPARE q1 (int) AS SELECT v FROM {t} WHERE id = $1"),
                bind(""),
                execute(),
                sync(),
                q(COPY_IN),
                copy_done(),
                sync(),
            ]),
        ),
        (
            // Seed 222751: a simple Query the server skips (behind a failed Execute, up to the
            // Sync) dropped the client's unnamed statement in the proxy's books all the same, so a
            // Describe of it after the Sync got 26000.
            "a simple Query the server skips keeps the unnamed statement",
            case(vec![
                parse("", "SAVEPOINT sp1"),
                execute_rows(1),
                q("SELECT 1"),
                q("SELECT 2"),
                sync(),
                describe('S', ""),
                sync(),
            ]),
        ),
        (
            // A pin confirmed by its CommandComplete must be seen on every relay path: one relayed
            // byte for byte was missed, the pin undone, and the connection went back to the pool
            // holding q1 (the next client's PREPARE met 42P05; 43 of 1000 cases from seed 888000
            // before it was caught).
            "a PREPARE that ran keeps the session pinned, and the next client does not inherit it",
            case(vec![
                q("PREPARE q1 AS SELECT 1 AS one"),
                q("EXECUTE q1"),
                Step::Reconnect,
                q("PREPARE q1 AS SELECT 2 AS two"),
                q("EXECUTE q1"),
            ]),
        ),
        (
            // Seed 333336: a DEALLOCATE the proxy answers itself, pipelined behind a batch that
            // fails inside a block, was judged by the status last heard (T) and answered 26000
            // where PostgreSQL refuses it for the aborted block (25P02).
            "a DEALLOCATE pipelined behind a failing batch in a block is refused as aborted",
            case(vec![
                parse("", "BEGIN"),
                bind(""),
                execute(),
                Step::Send(Msg::Execute {
                    portal: "p2".into(),
                    max_rows: 0,
                }),
                sync(),
                q("DEALLOCATE q1"),
                sync(),
            ]),
        ),
        (
            // Seed 111291 (with replicas): a statement the client was shown the shape of on a
            // replica, bound on the primary behind a write still unanswered there. The shape
            // check drained the write's replies first, the last of them handed the connection
            // back to the pool, and the flight got 08006 "no primary is reachable".
            "a statement moved to the primary behind an unanswered write keeps its connection",
            case(vec![
                sync(),
                q("END"),
                parse(
                    "s2",
                    "SELECT g AS n, g * $1 AS m FROM generate_series(1, 4) g",
                ),
                bind_with("", "s2", &["7"]),
                describe('P', ""),
                execute(),
                Step::Send(Msg::Close {
                    kind: 'P',
                    name: "p1".into(),
                }),
                bind_with("p1", "s2", &["101"]),
                Step::Send(Msg::Execute {
                    portal: "p1".into(),
                    max_rows: 0,
                }),
                sync(),
                q("UPDATE {t} SET v = v + '1' WHERE id <= '1'"),
                bind_with("", "s2", &["103"]),
                describe('P', ""),
                execute(),
                parse("", "SELECT count(*) AS n, sum(v) AS total FROM {t}"),
                bind(""),
                execute(),
                Step::Send(Msg::Parse {
                    name: String::new(),
                    sql: "INSERT INTO {t} (id, v) VALUES ($1, $2)".into(),
                    types: vec![0, 0],
                }),
                bind_with("", "", &["104", "5"]),
                execute(),
                sync(),
                parse("s3", "INSERT INTO {t} (id, v) VALUES ($1, $2)"),
                bind_with("", "s3", &["3", "6"]),
                execute(),
                sync(),
            ]),
        ),
        (
            // Seed 777188 (with replicas, under load): a Query that resets a startup setting among
            // other statements, pipelined behind a CopyFail whose error had not come back yet. The
            // flight behind the Query did not wait for its read-back (the COPY's answer still
            // due counted as a COPY under way), so the read-back was never sent and the client
            // heard the login's application_name. Here the COPY is started and answered first,
            // so the rest meets it in that state every time.
            "a RESET among statements behind a failed COPY is read back before the next flight",
            case(vec![
                parse("", COPY_IN),
                bind(""),
                execute(),
                Step::Send(Msg::Flush),
                Step::Wait,
                Step::Send(Msg::CopyFail("the client gives up".into())),
                sync(),
                q("RESET application_name; SELECT 1 AS one"),
                sync(),
                q("SHOW application_name"),
            ]),
        ),
        (
            // Seeds 777336 then 777338: a PREPARE the server skipped (behind a Bind of no
            // statement) and, in the same write, one that ran. The first one's ReadyForQuery undid
            // the pin the second had made, and the connection went back to the pool holding q1:
            // the next client's EXECUTE q1 found it (42601) where PostgreSQL says 26000.
            "a PREPARE that ran stays pinned behind one the server skipped",
            case(vec![
                bind("s9"),
                parse("", "PREPARE q2 (int) AS SELECT v FROM {t} WHERE id = $1"),
                bind(""),
                execute(),
                sync(),
                q("PREPARE q1 (int) AS SELECT v FROM {t} WHERE id = $1"),
                Step::Reconnect,
                q("EXECUTE q1(1)"),
            ]),
        ),
        (
            // Seed 20261207305 (2026-12-06, the first differential run in `eventual` mode): the
            // proxy kept the unnamed portal it had bound to its own command past a simple
            // Query, which drops it, and answered its Describe with NoData (PostgreSQL: 34000).
            "a simple Query drops the unnamed portal bound to an lsngate command",
            case(vec![
                parse("", "RESET lsngate.route"),
                bind(""),
                q("SELECT 1 AS one"),
                describe('P', ""),
                sync(),
            ]),
        ),
        (
            // Same finding: outside a transaction block a Sync ends the implicit transaction and
            // every portal with it, the ones bound to lsngate commands too.
            "a Sync outside a block drops the portals bound to lsngate commands",
            case(vec![
                parse("", "RESET lsngate.route"),
                bind(""),
                sync(),
                describe('P', ""),
                execute(),
                sync(),
            ]),
        ),
        (
            // Seed 20261207985 (2026-12-06, random cases through 2 replicas): the server skipped
            // a SET sent behind a failed Execute in the same batch (its error relayed before
            // the SET was sent), and the proxy kept the SET recorded: the client's next server
            // connection got work_mem 6MB where PostgreSQL still had 4MB.
            "a SET the server skips behind an earlier error of its batch is not kept",
            case(vec![
                Step::Send(Msg::Execute {
                    portal: "p2".into(),
                    max_rows: 0,
                }),
                parse("", "BEGIN"),
                q("SAVEPOINT PGJDBC_AUTOSAVE"),
                parse("", "SET work_mem = '6MB'"),
                bind(""),
                execute(),
                sync(),
                q("SELECT current_setting('work_mem') AS work_mem"),
            ]),
        ),
        (
            // Seed 20261206466 (2026-12-06, random cases through 2 replicas): inside BEGIN READ
            // ONLY, held on a replica, `SELECT …; COMMIT` ends the block; a Query that then
            // writes is refused (0A000, the README's limit, kept out of random cases), and one
            // that only reads runs on the replica as on PostgreSQL.
            "a Query that ends a replica's block and only reads after it runs there",
            case(vec![
                q("BEGIN READ ONLY"),
                q(
                    "SELECT g AS n FROM generate_series(1, 2) g; COMMIT; SELECT v FROM {t} WHERE id = 2",
                ),
                q("SELECT count(*) AS n FROM {t}"),
            ]),
        ),
        (
            // Seed 20261206757, against the first version of that refusal: the harness's own
            // `ROLLBACK; SELECT …` was refused under `SET lsngate.route = 'primary'`.
            "a Query that ends a replica's block and then reads is not refused under a route hint",
            case(vec![
                q("BEGIN READ ONLY"),
                q("SET lsngate.route = 'primary'"),
                sync(),
            ]),
        ),
        (
            // Seed 20261206836 (2026-12-06, 15.18, with replicas): a stale read. An INSERT left
            // unsynced, then a proxy command as a simple Query: the proxy's stand-in Query
            // committed the batch's implicit transaction (15 to 18 commit it at a Query), and no
            // commit position was taken behind it, so the next read ran on a replica without
            // the row.
            "a write committed by the stand-in for a proxy command is read back",
            case(vec![
                parse("", "INSERT INTO {t} (id, v) VALUES (102, 5)"),
                bind(""),
                execute(),
                q("RESET lsngate.route"),
                q("SELECT id, v FROM {t} ORDER BY id"),
            ]),
        ),
        (
            // Seed 333584 (open since 2026-12-02, both versions): a RESET of a startup setting
            // over the extended protocol (sent as the startup value's SET, its tag relabelled)
            // pipelined behind a Flush-ended batch whose Execute was not answered yet. The
            // labels started counting at the RESET's flight: the earlier `SELECT 1` was relayed
            // as `RESET`, and the RESET's own answer as `SET`.
            "a RESET pipelined behind an unanswered Execute of an open batch labels only its own answer",
            case(vec![
                parse("", "SELECT id FROM {t} ORDER BY id LIMIT 1"),
                bind(""),
                execute(),
                Step::Send(Msg::Flush),
                Step::Write,
                parse("", "RESET application_name"),
                bind(""),
                execute(),
                Step::Send(Msg::Flush),
                Step::Wait,
                sync(),
                q("SHOW application_name"),
            ]),
        ),
        (
            // Seed 555882 (open since 2026-12-02, 19): a RESET of a startup setting refused in an
            // aborted block was recorded, the startup value's SET put in front of the next
            // flight failed there too, and that failure was taken for the statements the flight
            // binds: a Bind of a statement never defined got 25P02 where PostgreSQL says 26000.
            "a Bind of an undefined statement behind a RESET refused in an aborted block gets 26000",
            case(vec![
                q("BEGIN"),
                Step::Wait,
                q("SELECT 1/0"),
                Step::Wait,
                q("RESET application_name"),
                Step::Wait,
                bind("s1"),
                sync(),
            ]),
        ),
        (
            // The same, pipelined: the RESET is sent before the client has heard its block fail.
            // (It passed before the fix too; kept beside the one above.)
            "a Bind of an undefined statement behind a pipelined RESET in an aborted block gets 26000",
            case(vec![
                q("BEGIN"),
                q("SELECT 1/0"),
                q("RESET application_name"),
                bind("s1"),
                sync(),
            ]),
        ),
        (
            // Seed 555792 (open since 2026-12-02, 19, with replicas): s1 was parsed on the
            // primary (its flight also bound an unknown statement, so it counted as a write),
            // then a Parse and a Flush opened a batch on a replica, and a Bind of s1 in that
            // batch met a connection without it: 26000 where PostgreSQL binds it. The replica's
            // batch, reads only, now ends with the proxy's Sync, and s1 is parsed in front.
            "a Bind inside a replica batch of a statement parsed on the primary finds it",
            case(vec![
                parse("s1", "SELECT id, v FROM {t} ORDER BY id"),
                bind("s2"),
                sync(),
                parse("s3", "SELECT id, v FROM {t} ORDER BY id"),
                Step::Send(Msg::Flush),
                Step::Write,
                bind("s1"),
                execute(),
                sync(),
            ]),
        ),
        (
            // The shape of seed 111687 (19, primary-only, seen once, timing-dependent, cause not
            // found): a new client whose first message was a lone Sync was told the
            // `application_name` an earlier client had set twice in one pipeline. Not reproduced
            // by this sequence; kept as the guard for that shape.
            "a new client's lone Sync is told no setting an earlier client set twice in a pipeline",
            case(vec![
                parse("", "SET application_name = 'diff-1'"),
                bind(""),
                execute(),
                parse("", "SET application_name = 'diff-2'"),
                bind(""),
                execute(),
                sync(),
                Step::Reconnect,
                sync(),
                q("SHOW application_name"),
            ]),
        ),
        (
            // Seed 20261212293 (15.18, with replicas, 2026-12-06): a `Parse ""` skipped by the
            // server after an earlier error in its pipeline (an Execute of no portal, 34000)
            // still counted as the client's unnamed statement, so a later `Describe S ""`
            // described it (its RowDescription) where PostgreSQL describes the one before
            // (NoData).
            "a Parse of the unnamed statement skipped after an error leaves the one before",
            case(vec![
                parse("", "EXECUTE q1"),
                execute(),
                parse("", "SELECT count(*) AS n, sum(v) AS total FROM {t}"),
                sync(),
                describe('S', ""),
                sync(),
            ]),
        ),
        (
            // The other side of the one above: a `Parse ""` the server refuses itself has dropped
            // the unnamed statement before it (PostgreSQL drops it first), so a Bind of it after
            // the Sync gets 26000, on whichever connection it lands.
            "a Parse of the unnamed statement refused itself leaves none",
            case(vec![
                parse("", "SELECT id, v FROM {t} ORDER BY id"),
                sync(),
                parse("", "SELECT nothing FROM no_such_table"),
                sync(),
                bind(""),
                execute(),
                sync(),
            ]),
        ),
        (
            // Seed 20261214677 (19rc1, every setup): a `DEALLOCATE ALL` Query in an aborted
            // block, which the server refuses with 25P02, still made the proxy close the
            // client's statements on the server connections it used next; the client kept them.
            // So a Bind of `s1` with too few parameters had `Close`/`Parse s1` in front, whose
            // 25P02 the client got where PostgreSQL checks the parameters first (08P01).
            "a DEALLOCATE ALL refused in an aborted block closes nothing",
            case(vec![
                parse(
                    "s1",
                    "WITH moved AS (UPDATE {t} SET v = v - 1 WHERE id = $1 RETURNING v) SELECT v FROM moved",
                ),
                parse("", "START TRANSACTION"),
                bind(""),
                execute(),
                q("EXECUTE q2"),
                q("DEALLOCATE ALL"),
                bind_with("p2", "s1", &[]),
                sync(),
            ]),
        ),
        (
            // Seed 20261214754 (every version, the replica 50 ms behind): a read pipelined
            // behind a COPY's end and a Query holding a RESET was planned while the COPY's
            // answer was still to come, to stay on its connection. The RESET's read-back was
            // heard first, which ended the COPY; the connection was let go and the read went to
            // a replica with no floor: it missed the copied rows and the INSERT.
            "a read pipelined behind a COPY's end and a RESET sees the copied rows",
            case(vec![
                q("COPY {t} (id, v) FROM STDIN"),
                Step::Wait,
                copy_data("101\t\\N\n1"),
                copy_data("02\t28\n103\t\\N\n"),
                copy_done(),
                q("COMMIT; INSERT INTO {t} (id, v) VALUES ('104', '5'); RESET work_mem"),
                q("SELECT id, v FROM {t} ORDER BY id"),
            ]),
        ),
        (
            // Seed 20261218805 (every version, 2 replicas): `SHOW …; START TRANSACTION` was
            // classified by its first statement as a read, and its block opened on a replica:
            // the INSERT in it got 25006 where PostgreSQL runs it.
            "a block opened behind a SHOW in one Query takes writes",
            case(vec![
                q("SHOW application_name; START TRANSACTION"),
                q("INSERT INTO {t} (id, v) VALUES ('101', '5')"),
                q("COMMIT"),
                q("SELECT id, v FROM {t} ORDER BY id"),
            ]),
        ),
        (
            // CI's seed 20261394 (15.18, the replica 50 ms behind; intermittent): a write sent
            // right behind the end of its block was planned while the client's last
            // ReadyForQuery still said "in a block", so it took no position, and the read after
            // it went to the replica without its row. Waiting for the block's replies first
            // makes the planning meet the stale status every time.
            "a write pipelined behind the end of its block is read back",
            case(vec![
                q("BEGIN"),
                q("INSERT INTO {t} (id, v) VALUES ('101', '5')"),
                Step::Wait,
                q("ROLLBACK"),
                q("INSERT INTO {t} (id, v) VALUES ('102', '5')"),
                Step::Wait,
                q("SELECT id, v FROM {t} ORDER BY id"),
            ]),
        ),
        (
            // Seed 20261218660 (every version, 2 replicas): a `Parse ""` the server skipped after
            // an error in a block left the connection's unnamed statement as it was (the BEGIN);
            // the proxy took it as in doubt, so a `Describe S ""` in the aborted block had a
            // Parse of the BEGIN in front, which the block refused (25P02) where PostgreSQL
            // describes the BEGIN.
            "a Parse \"\" skipped after an error leaves the unnamed statement there",
            case(vec![
                parse("", "BEGIN"),
                bind(""),
                execute_rows(1),
                execute(),
                parse("", "SELECT count(*) AS n, sum(v) AS total FROM {t}"),
                sync(),
                describe('S', ""),
                Step::Send(Msg::Flush),
                Step::Wait,
                sync(),
            ]),
        ),
        (
            // Seed 20261220829 (15.18, the replica 50 ms behind): a read flight that describes
            // the unnamed statement and then parses another failed its wait and ran again. The
            // re-run read its messages against the record of the flight being assembled by
            // then (empty), so the `Describe S ""` took the statement the flight's own later
            // Parse defines: ParameterDescription [23] where PostgreSQL describes the count.
            "a read run again after its wait describes the statement it found",
            case(vec![
                q("INSERT INTO {t} (id, v) VALUES ('101', '7')"),
                parse(
                    "",
                    "/* lsngate:route=primary */ VALUES (1, 'one'), (2, NULL)",
                ),
                parse("", "SELECT count(*) AS n, sum(v) AS total FROM {t}"),
                sync(),
                describe('S', ""),
                parse(
                    "",
                    "SELECT g AS n, g * $1 AS m FROM generate_series(1, 4) g",
                ),
                sync(),
                sync(),
            ]),
        ),
        (
            // Seed 20261217757 (15.18, the replica 50 ms behind): the same hole as 20261220829.
            // A read that parses a name the client already holds (`s3`, parsed in the flight
            // before) failed its wait and ran again on the primary against an empty record, so
            // its Parse was taken as defining the name, not as one PostgreSQL refuses: the
            // client got ParseComplete where PostgreSQL says 42P05.
            "a read run again that parses a name the client holds is refused",
            case(vec![
                q("COPY {t} (id, v) FROM STDIN"),
                copy_data("101\t26\n"),
                copy_done(),
                parse("s3", "SELECT id, v FROM {t} ORDER BY id"),
                q("COMMIT"),
                parse("s3", "SELECT id, v FROM {t} ORDER BY id"),
                sync(),
            ]),
        ),
        (
            // Seed 20261218249 (19rc1, 2 replicas): `COMMIT AND CHAIN` of a failed
            // `BEGIN READ ONLY` block chains a block with the default characteristics (15.18 and
            // 19rc1 alike: it takes writes). The block was on a replica and stayed there: the
            // INSERT in the chained block got 25006 where PostgreSQL runs it.
            "a failed read-only block chained with COMMIT AND CHAIN takes writes",
            case(vec![
                q("BEGIN READ ONLY"),
                q("SELECT 1 / 0"),
                q("COMMIT AND CHAIN"),
                q("SHOW transaction_read_only"),
                q("INSERT INTO {t} (id, v) VALUES ('101', '5')"),
                q("COMMIT"),
                q("SELECT id, v FROM {t} ORDER BY id"),
            ]),
        ),
        (
            // The same with ROLLBACK AND CHAIN, each statement waiting for the one before.
            "a failed read-only block chained with ROLLBACK AND CHAIN takes writes",
            case(vec![
                q("BEGIN READ ONLY"),
                Step::Wait,
                q("SELECT 1 / 0"),
                Step::Wait,
                q("ROLLBACK AND CHAIN"),
                Step::Wait,
                q("INSERT INTO {t} (id, v) VALUES ('101', '5')"),
                q("COMMIT"),
                q("SELECT id, v FROM {t} ORDER BY id"),
            ]),
        ),
        (
            // Seed 20261229615 (15.18 and 19rc1, the replica 50 ms behind): a `SET` that became
            // part of a block, then a proxy command whose portal runs twice (55000) inside it.
            // The error fails the block, which undoes the SET, and PostgreSQL reports the old
            // `application_name` ahead of its ReadyForQuery `E`; the proxy's own answer came
            // without it, so the client kept believing the rolled-back value.
            "a proxy command failing a block reports the settings the block's end undid",
            case(vec![
                parse("", "SET application_name = 'diff-3'"),
                bind(""),
                execute(),
                parse("", "BEGIN"),
                bind(""),
                execute(),
                sync(),
                parse("", "SET lsngate.consistency = session"),
                bind(""),
                execute_rows(1),
                execute_rows(2),
                sync(),
                q("SHOW application_name"),
            ]),
        ),
        (
            // Seed 20261234471 (15.18, the replica 50 ms behind): a simple Query drops the
            // unnamed portal, also one the proxy answers itself behind unsynced messages. The
            // proxy's stand-in for it was an empty Query, which drops nothing, so a Describe of
            // the portal the client had bound before got its description where PostgreSQL
            // says 34000.
            "a proxy command behind unsynced messages drops the unnamed portal",
            case(vec![
                parse("", "BEGIN"),
                bind(""),
                execute_rows(1),
                parse("", "SHOW application_name"),
                bind(""),
                q("SET lsngate.route = 'primary'"),
                describe('P', ""),
                sync(),
            ]),
        ),
        (
            // The same inside a block, the portal bound in a batch already synced: the proxy
            // answered the command without the server, whose unnamed portal lived on.
            "a proxy command in a block drops the unnamed portal",
            case(vec![
                q("BEGIN"),
                parse("", "SHOW application_name"),
                bind(""),
                sync(),
                q("SET lsngate.route = 'primary'"),
                describe('P', ""),
                execute(),
                sync(),
                q("SHOW lsngate.route"),
                describe('P', ""),
                sync(),
            ]),
        ),
        (
            // Seed 20261237149 (15.18, the replica 50 ms behind): pgjdbc's autosave shape. A
            // BEGIN left unsynced, merged with the SAVEPOINT Query behind it, was taken for a
            // write in the batch's implicit transaction, so the proxy sent a commit position's
            // SELECT behind the SAVEPOINT — inside the block, where it took the transaction's
            // snapshot: the client's `BEGIN ISOLATION LEVEL` then failed (25001, "must be called
            // before any query") where PostgreSQL warns and goes on.
            "a savepoint released before the block's first query leaves its isolation level open",
            case(vec![
                parse("", "BEGIN"),
                bind(""),
                execute(),
                q("SAVEPOINT PGJDBC_AUTOSAVE"),
                q("RELEASE SAVEPOINT PGJDBC_AUTOSAVE"),
                parse("", "BEGIN ISOLATION LEVEL REPEATABLE READ"),
                bind(""),
                execute(),
                sync(),
            ]),
        ),
        (
            // The position that seed's fix holds back is taken at the block's end: a write in a
            // block opened by an unsynced BEGIN is read back after the COMMIT, whichever flights
            // come between (a Query behind the batch, a transaction-local one, the COMMIT over
            // either protocol).
            "a write in a block an unsynced BEGIN opened is read back after its COMMIT",
            case(vec![
                parse("", "BEGIN"),
                bind(""),
                execute(),
                parse("", "INSERT INTO {t} (id, v) VALUES ('101', '5')"),
                bind(""),
                execute(),
                q("COMMIT"),
                q("SELECT id, v FROM {t} ORDER BY id"),
            ]),
        ),
        (
            "a write before an unsynced BEGIN is read back after the block's COMMIT",
            case(vec![
                parse("", "INSERT INTO {t} (id, v) VALUES ('101', '5')"),
                bind(""),
                execute(),
                parse("", "BEGIN"),
                bind(""),
                execute(),
                q("SAVEPOINT a"),
                q("RELEASE a"),
                q("COMMIT"),
                q("SELECT id, v FROM {t} ORDER BY id"),
            ]),
        ),
        (
            "a write in a block an unsynced BEGIN opened is read back after an extended COMMIT",
            case(vec![
                parse("", "BEGIN"),
                bind(""),
                execute(),
                parse("", "INSERT INTO {t} (id, v) VALUES ('101', '5')"),
                bind(""),
                execute(),
                q("SAVEPOINT a"),
                Step::Wait,
                parse("", "COMMIT"),
                bind(""),
                execute(),
                sync(),
                q("SELECT id, v FROM {t} ORDER BY id"),
            ]),
        ),
        (
            // Seed 20261245900 (19rc1, 2 replicas), found on 3cad336, whose deferral of a
            // position to the end of a block an unsynced BEGIN opened (seed 20261237149) took it
            // at a bare Sync, inside the block the failed EXECUTE had aborted: that probe failed
            // before preparing its statement, and the one behind the pipelined `COMMIT AND
            // CHAIN`, built as if it had, failed inside the chained block (26000), so the
            // client's SELECT there got 25P02.
            "a position held for a block's end is not taken at a bare Sync",
            case(vec![
                parse("", "BEGIN"),
                bind(""),
                execute(),
                q("EXECUTE q1"),
                Step::Wait,
                sync(),
                parse("", "COMMIT AND CHAIN"),
                bind(""),
                execute(),
                sync(),
                q("SELECT count(*) AS n, sum(v) AS total FROM {t}"),
                sync(),
            ]),
        ),
        (
            // Seed 20261248831 (19rc1, the replica 50 ms behind), found on 3cad336, whose
            // stand-in `SELECT 1` for a proxy command (seed 20261234471) ran inside the block an
            // unsynced START TRANSACTION had opened and took its snapshot: the client's `BEGIN
            // ISOLATION LEVEL` then failed (25001) where PostgreSQL warns.
            "a proxy command behind an unsynced BEGIN leaves the block's isolation level open",
            case(vec![
                parse("", "START TRANSACTION"),
                bind(""),
                execute_rows(1),
                q("SET lsngate.consistency = session"),
                q("BEGIN ISOLATION LEVEL REPEATABLE READ"),
                q("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"),
                q("SHOW transaction_isolation"),
                sync(),
            ]),
        ),
        (
            // Seed 20261244221 (19rc1, 2 replicas): a Describe sent while a Query's rows were
            // still due. The proxy took the first RowDescription to come back, the INSERT …
            // RETURNING's, for the statement's shape, so the statement, parsed again on the
            // other replica, looked changed and its Bind got 0A000 "cached plan must not change
            // result type" where PostgreSQL binds.
            "a Describe behind a Query still answering records its own statement's shape",
            case(vec![
                q("INSERT INTO {t} (id, v) VALUES ('101', '7') RETURNING id, v"),
                parse("s1", "SELECT count(*) AS n, sum(v) AS total FROM {t}"),
                describe('S', "s1"),
                q("INSERT INTO {t} (id, v) VALUES ('103', '7') RETURNING id, v"),
                bind("s1"),
                sync(),
            ]),
        ),
        (
            // Seed 20261234371 (19rc1, the replica 50 ms behind): the extended protocol's form of
            // the two above. The failed block stayed on the replica, and the INSERT in the block
            // it chained got 25006 where PostgreSQL runs it.
            "a failed read-only block chained with an extended COMMIT AND CHAIN takes writes",
            case(vec![
                q("BEGIN READ ONLY"),
                q("SELECT 1 / 0"),
                parse("", "COMMIT AND CHAIN"),
                bind(""),
                describe('P', ""),
                execute(),
                sync(),
                q("SHOW transaction_read_only"),
                q("INSERT INTO {t} (id, v) VALUES ('101', '5')"),
                q("COMMIT"),
                q("SELECT id, v FROM {t} ORDER BY id"),
            ]),
        ),
        (
            // The same with a named ROLLBACK AND CHAIN parsed before the block failed, each step
            // waiting for the one before.
            "a failed read-only block chained with an extended ROLLBACK AND CHAIN takes writes",
            case(vec![
                q("BEGIN READ ONLY"),
                parse("s1", "ROLLBACK AND CHAIN"),
                sync(),
                Step::Wait,
                q("SELECT 1 / 0"),
                Step::Wait,
                bind("s1"),
                execute(),
                sync(),
                Step::Wait,
                parse("", "INSERT INTO {t} (id, v) VALUES ('101', '5')"),
                bind(""),
                execute(),
                sync(),
                q("COMMIT"),
                q("SELECT id, v FROM {t} ORDER BY id"),
            ]),
        ),
        (
            // Seed 20261400722 (19rc1, the replica 50 ms behind): a proxy command's Query,
            // answered by the proxy, left the server's unnamed statement, and a flight that
            // opened a batch (Flush, no Sync) did not touch it, so nothing could close it before
            // the `Describe S ""` of the next flight in that batch: the old statement answered
            // where PostgreSQL answers 26000.
            "a batch left open keeps the unnamed statement a proxy command's Query dropped",
            case(vec![
                parse("", "UPDATE {t} SET v = v + $1 WHERE id <= $2"),
                sync(),
                q("SET lsngate.consistency = session"),
                Step::Send(Msg::Close {
                    kind: 'P',
                    name: String::new(),
                }),
                Step::Send(Msg::Flush),
                Step::Wait,
                describe('S', ""),
                sync(),
            ]),
        ),
        (
            // The same with the client's unnamed statement parsed before a simple Query that the
            // server ran, then parsed again: the batch the Flush opens may go to a connection
            // whose unnamed statement is another, and the Bind of the next flight must find the
            // client's.
            "a batch left open binds the client's own unnamed statement",
            case(vec![
                parse("", "SELECT id, v FROM {t} WHERE id = 1"),
                sync(),
                Step::Wait,
                q("INSERT INTO {t} (id, v) VALUES ('101', '5')"),
                parse("", "SELECT id, v FROM {t} ORDER BY id"),
                sync(),
                Step::Wait,
                Step::Send(Msg::Close {
                    kind: 'P',
                    name: String::new(),
                }),
                Step::Send(Msg::Flush),
                Step::Wait,
                bind(""),
                execute(),
                sync(),
            ]),
        ),
        (
            // Seed 20261420741 (19rc1, 2 replicas): COMMIT AND CHAIN after a failed read-only
            // block on a replica, behind a batch that failed there too.
            "a failed read-only block with a failed batch in it chained with COMMIT AND CHAIN takes writes",
            case(vec![
                q("BEGIN READ ONLY; INSERT INTO {t} (id, v) VALUES ('101', '5');"),
                bind_with("", "", &["102", "7"]),
                execute(),
                Step::Send(Msg::Flush),
                Step::Wait,
                sync(),
                q("COMMIT AND CHAIN"),
                parse("", "INSERT INTO {t} (id, v) VALUES ($1, $2)"),
                sync(),
            ]),
        ),
        (
            // Seed 20261422566 (19rc1, 2 replicas), from what case 20261422560 left: `BEGIN`,
            // then `RESET work_mem` sent before BEGIN's answer came, then a ROLLBACK. The proxy
            // took the RESET for one outside a block, recorded the connection as reset, and the
            // next client on it was given the first client's `work_mem` (7MB where PostgreSQL
            // answers 4MB).
            "a RESET in a block the client did not wait for, rolled back, does not reach the next client",
            case(vec![
                q("SET work_mem = '7MB'"),
                q("BEGIN"),
                q("RESET work_mem"),
                q("ROLLBACK"),
                Step::Reconnect,
                q("/* lsngate:route=primary */ SHOW work_mem"),
                q("SHOW work_mem"),
            ]),
        ),
        (
            // The same with a SET: the client itself was then given the value its ROLLBACK undid.
            "a SET in a block the client did not wait for is undone by the block's ROLLBACK",
            case(vec![
                q("SET work_mem = '7MB'"),
                q("BEGIN"),
                q("SET work_mem = '5MB'"),
                q("ROLLBACK"),
                q("SHOW work_mem"),
                q("/* lsngate:route=primary */ SHOW work_mem"),
            ]),
        ),
        (
            // The extended protocol's form: the SET in a pipeline behind the BEGIN's.
            "an extended SET in a block the client did not wait for is undone by the block's ROLLBACK",
            case(vec![
                q("SET work_mem = '7MB'"),
                parse("", "BEGIN"),
                bind(""),
                execute(),
                sync(),
                parse("", "SET work_mem = '5MB'"),
                bind(""),
                execute(),
                sync(),
                q("ROLLBACK"),
                q("SHOW work_mem"),
                Step::Reconnect,
                q("/* lsngate:route=primary */ SHOW work_mem"),
            ]),
        ),
        (
            // Seed 20261452014 (19rc1, 2 replicas): a named statement described, closed and
            // parsed again with other columns in one pipeline. The Describe's answer came back
            // after the proxy had taken in the new definition, and was recorded as its shape; so
            // the new one, parsed again on another connection for a Bind, looked changed, and the
            // Bind got 0A000 "cached plan must not change result type" where PostgreSQL binds.
            "a Describe's answer is the shape of the definition it described, not of a later one",
            case(vec![
                parse(
                    "s3",
                    "SELECT g AS n, g * $1 AS m FROM generate_series(1, 4) g",
                ),
                describe('S', "s3"),
                close("s3"),
                parse("s3", "SELECT count(*) AS n, sum(v) AS total FROM {t}"),
                sync(),
                q("START TRANSACTION"),
                bind("s3"),
                execute(),
                sync(),
            ]),
        ),
        (
            // Seed 20261580735 (19rc1, 2 replicas): in a failed block, a Parse of a name the
            // client holds, of a statement a failed block still parses. The connection lacked
            // the name; the proxy's Parse of the client's statement in front was refused
            // (25P02), so the client's Parse succeeded where PostgreSQL refuses it (42P05), and
            // a Bind of the name then ran the new statement.
            "a Parse of a held name in a failed block is refused even where the connection lacked it",
            case(vec![
                parse("s2", "SELECT v FROM {t} WHERE id = $1"),
                sync(),
                q("BEGIN ISOLATION LEVEL REPEATABLE READ"),
                describe('S', ""),
                sync(),
                parse("s2", "ROLLBACK TO SAVEPOINT sp1"),
                sync(),
                bind_with("", "s2", &["1"]),
                execute(),
                sync(),
            ]),
        ),
    ]
}
