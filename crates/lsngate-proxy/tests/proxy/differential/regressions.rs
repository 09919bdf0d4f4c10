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

fn close(name: &str) -> Step {
    Step::Send(Msg::Close {
        kind: 'S',
        name: name.into(),
    })
}

const COPY_IN: &str = "COPY {t} (id, v) FROM STDIN";

/// (name, case) for every known sequence.
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
    ]
}
