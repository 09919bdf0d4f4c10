//! A simple Query's string cut into its statements at the `;` that end them, as PostgreSQL's
//! lexer would cut it: a `;` inside a string (`'…'`, `E'…'` with backslash escapes), a quoted
//! identifier (`"…"`), a dollar-quoted body (`$tag$…$tag$`) or a comment (`-- …`, nested
//! `/* … */`) ends nothing. Only the proxy's own commands need this: the proxy answers those
//! itself, so it must know exactly where one ends and the statements it forwards begin.

/// Whether `statement` (one statement, trimmed) ends a transaction block: `COMMIT`, `END`,
/// `ABORT`, `ROLLBACK`; not `ROLLBACK TO`, `… PREPARED` or `… AND CHAIN`, which leave a block
/// open or were never in one.
pub fn ends_block(statement: &str) -> bool {
    let lower = after_comments(statement).to_ascii_lowercase();
    let words: Vec<&str> = lower.split_whitespace().collect();
    let chains = words.windows(2).any(|w| w == ["and", "chain"]);
    match words.as_slice() {
        ["commit" | "end" | "abort", rest @ ..] => {
            !chains && rest.first().is_none_or(|w| *w != "prepared")
        }
        ["rollback", rest @ ..] => !chains && !rest.iter().any(|w| *w == "to" || *w == "prepared"),
        _ => false,
    }
}

/// Whether PostgreSQL parses `statement` (one statement) inside a failed transaction block, where
/// it refuses every other (25P02): those that end the block or return from its failure
/// (`IsTransactionExitStmt`): `COMMIT`/`END`, `ROLLBACK`/`ABORT` (with `AND CHAIN`, or `TO
/// SAVEPOINT`), `PREPARE TRANSACTION`; not `COMMIT PREPARED` or `ROLLBACK PREPARED`.
pub fn parses_in_failed_block(statement: &str) -> bool {
    let lower = after_comments(statement).to_ascii_lowercase();
    let mut words = lower
        .split(|c: char| c.is_whitespace() || c == ';')
        .filter(|w| !w.is_empty());
    match words.next() {
        Some("commit" | "end" | "abort" | "rollback") => words.next() != Some("prepared"),
        Some("prepare") => words.next() == Some("transaction"),
        _ => false,
    }
}

/// Whether `statement` (one statement, trimmed) ends a transaction block and chains the next:
/// `COMMIT AND CHAIN`, `ROLLBACK AND CHAIN` (and `END`, `ABORT`; not `AND NO CHAIN`).
pub fn chains_block(statement: &str) -> bool {
    let lower = after_comments(statement).to_ascii_lowercase();
    let words: Vec<&str> = lower.split_whitespace().collect();
    matches!(
        words.first(),
        Some(&("commit" | "end" | "abort" | "rollback"))
    ) && words.windows(2).any(|w| w == ["and", "chain"])
}

/// Whether a statement of `sql` may end the transaction block it runs in: one that
/// [`ends_block`], or `PREPARE TRANSACTION` (the block becomes a prepared transaction and the
/// session is outside any).
pub fn may_end_block(sql: &str) -> bool {
    statements(sql).iter().any(|statement| {
        ends_block(statement) || {
            let mut words = after_comments(statement).split_whitespace();
            words
                .next()
                .is_some_and(|w| w.eq_ignore_ascii_case("prepare"))
                && words
                    .next()
                    .is_some_and(|w| w.eq_ignore_ascii_case("transaction"))
        }
    })
}

/// The statements of a simple Query after the first one that [`ends_block`], joined with `;`:
/// they run outside the block, where the block's server may not be the one they need. None
/// when no statement ends a block or none follows.
pub fn after_block_end(sql: &str) -> Option<String> {
    let parts = statements(sql);
    let end = parts.iter().position(|part| ends_block(part))?;
    let rest = &parts[end + 1..];
    (!rest.is_empty()).then(|| rest.join(";"))
}

/// The statements of `sql`, trimmed, without their `;` and without empty ones.
pub fn statements(sql: &str) -> Vec<&str> {
    let bytes = sql.as_bytes();
    let mut found = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        i = match bytes[i] {
            b';' => {
                push(&mut found, &sql[start..i]);
                start = i + 1;
                i + 1
            }
            b'\'' => {
                let escapes = i > 0
                    && bytes[i - 1].eq_ignore_ascii_case(&b'e')
                    && (i < 2 || !is_ident(bytes[i - 2]));
                quoted(bytes, i, b'\'', escapes)
            }
            b'"' => quoted(bytes, i, b'"', false),
            b'-' if bytes.get(i + 1) == Some(&b'-') => bytes[i..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(bytes.len(), |n| i + n + 1),
            b'/' if bytes.get(i + 1) == Some(&b'*') => block_comment(bytes, i),
            b'$' if i == 0 || !is_ident(bytes[i - 1]) => dollar_quoted(bytes, i),
            _ => i + 1,
        };
    }
    push(&mut found, &sql[start.min(sql.len())..]);
    found
}

fn push<'a>(found: &mut Vec<&'a str>, statement: &'a str) {
    let statement = statement.trim();
    if !statement.is_empty() && !only_comments(statement) {
        found.push(statement);
    }
}

/// Whether a statement is nothing but comments (the server sends EmptyQueryResponse for it).
fn only_comments(statement: &str) -> bool {
    after_comments(statement).is_empty()
}

/// `statement` from its first word on: the whitespace and comments before it skipped.
fn after_comments(statement: &str) -> &str {
    let bytes = statement.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        i = match bytes[i] {
            b if b.is_ascii_whitespace() => i + 1,
            b'-' if bytes.get(i + 1) == Some(&b'-') => bytes[i..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(bytes.len(), |n| i + n + 1),
            b'/' if bytes.get(i + 1) == Some(&b'*') => block_comment(bytes, i),
            _ => return &statement[i..],
        };
    }
    ""
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80
}

/// The index past a quoted run opening at `open` (a doubled quote stays inside; with
/// `escapes`, so does a backslash-escaped character). Unterminated: the end of the string.
fn quoted(bytes: &[u8], open: usize, quote: u8, escapes: bool) -> usize {
    let mut i = open + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if escapes => i += 2,
            b if b == quote && bytes.get(i + 1) == Some(&quote) => i += 2,
            b if b == quote => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// The index past a `/* … */` comment opening at `open`; they nest.
fn block_comment(bytes: &[u8], open: usize) -> usize {
    let mut depth = 0;
    let mut i = open;
    while i < bytes.len() {
        if bytes[i..].starts_with(b"/*") {
            depth += 1;
            i += 2;
        } else if bytes[i..].starts_with(b"*/") {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    bytes.len()
}

/// The index past a dollar-quoted body opening at `open`, or past the `$` when it opens none
/// (`$1`, a parameter).
fn dollar_quoted(bytes: &[u8], open: usize) -> usize {
    let tag_len = bytes[open + 1..]
        .iter()
        .position(|&b| !(b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80));
    let Some(tag_len) = tag_len else {
        return bytes.len();
    };
    let close = open + 1 + tag_len;
    let opens = bytes[close] == b'$' && bytes.get(open + 1).is_none_or(|b| !b.is_ascii_digit());
    if !opens {
        return open + 1;
    }
    let tag = &bytes[open..=close];
    let body = close + 1;
    bytes[body..]
        .windows(tag.len())
        .position(|w| w == tag)
        .map_or(bytes.len(), |n| body + n + tag.len())
}

#[cfg(test)]
mod tests {
    use super::{after_block_end, chains_block, may_end_block, parses_in_failed_block, statements};
    use proptest::prelude::*;

    #[test]
    fn statements_end_at_semicolons_outside_quotes_and_comments() {
        assert_eq!(
            statements("SET lsngate.scope = 'user:7'; INSERT INTO t VALUES (1);"),
            ["SET lsngate.scope = 'user:7'", "INSERT INTO t VALUES (1)"]
        );
        assert_eq!(
            statements("SELECT 'a;b', \"c;d\", E'it\\'s;'; SELECT 2"),
            ["SELECT 'a;b', \"c;d\", E'it\\'s;'", "SELECT 2"]
        );
        assert_eq!(
            statements("SELECT 'it''s;'; SELECT $$ ; $$, $x$ $$ ; $x$; SELECT $1"),
            [
                "SELECT 'it''s;'",
                "SELECT $$ ; $$, $x$ $$ ; $x$",
                "SELECT $1"
            ]
        );
        assert_eq!(
            statements("SELECT 1 -- a; comment\n; /* a /* nested; */ one; */ SELECT 2"),
            [
                "SELECT 1 -- a; comment",
                "/* a /* nested; */ one; */ SELECT 2"
            ]
        );
        // `e'` inside a name is not an escape string: `name'` cannot occur, but `some'` in
        // `some'x\'` must not swallow the rest.
        assert_eq!(
            statements("SELECT 'x\\'; SELECT 2"),
            ["SELECT 'x\\'", "SELECT 2"]
        );
        assert_eq!(statements(" ; -- only\n ;  "), Vec::<&str>::new());
        assert_eq!(
            statements("SELECT 'open; SELECT 2"),
            ["SELECT 'open; SELECT 2"]
        );
        assert_eq!(
            statements("SELECT a$b; SELECT 2"),
            ["SELECT a$b", "SELECT 2"]
        );
    }

    proptest! {
        #[test]
        fn splitting_never_panics_and_loses_no_statement_text(sql in ".{0,120}") {
            let parts = statements(&sql);
            for part in parts {
                prop_assert!(sql.contains(part));
                prop_assert!(!part.is_empty());
            }
        }
    }

    #[test]
    fn statements_a_failed_block_still_parses() {
        for sql in [
            "ROLLBACK TO SAVEPOINT sp1",
            "rollback to sp1",
            "COMMIT;",
            "/* c */ end",
            "ABORT AND CHAIN",
            "ROLLBACK",
            "PREPARE TRANSACTION 'x'",
        ] {
            assert!(parses_in_failed_block(sql), "{sql}");
        }
        for sql in [
            "COMMIT PREPARED 'x'",
            "ROLLBACK PREPARED 'x'",
            "PREPARE p AS SELECT 1",
            "SAVEPOINT sp1",
            "RELEASE SAVEPOINT sp1",
            "SELECT 1",
            "",
        ] {
            assert!(!parses_in_failed_block(sql), "{sql}");
        }
    }

    #[test]
    fn what_runs_after_a_block_ends_in_a_query() {
        assert_eq!(
            after_block_end("SELECT 1; COMMIT; UPDATE t SET v = 1").as_deref(),
            Some("UPDATE t SET v = 1")
        );
        assert_eq!(
            after_block_end("select 1; end; select 2; insert into t values (1)").as_deref(),
            Some("select 2;insert into t values (1)")
        );
        assert_eq!(after_block_end("SELECT 1; COMMIT"), None);
        assert_eq!(
            after_block_end("ROLLBACK TO SAVEPOINT a; UPDATE t SET v = 1"),
            None
        );
        assert_eq!(
            after_block_end("COMMIT AND CHAIN; UPDATE t SET v = 1"),
            None
        );
        assert_eq!(
            after_block_end("COMMIT PREPARED 'x'; UPDATE t SET v = 1"),
            None
        );
        assert_eq!(after_block_end("SELECT 'commit; update t'"), None);
    }

    #[test]
    fn what_may_end_the_block_it_runs_in() {
        for ends in [
            "COMMIT",
            "end work",
            "INSERT INTO t VALUES (1); COMMIT",
            "SET work_mem = '8MB'; rollback",
            "/* app */ COMMIT",
            "-- app\nABORT;",
            "PREPARE TRANSACTION 'x'",
        ] {
            assert!(may_end_block(ends), "{ends}");
        }
        for stays in [
            "INSERT INTO t VALUES (1)",
            "ROLLBACK TO SAVEPOINT a",
            "COMMIT AND CHAIN",
            "COMMIT PREPARED 'x'",
            "PREPARE q AS SELECT 1",
            "SELECT 'commit'",
            "/* commit */ SELECT 1",
        ] {
            assert!(!may_end_block(stays), "{stays}");
        }
    }

    #[test]
    fn what_ends_a_block_and_chains_the_next() {
        for chains in [
            "COMMIT AND CHAIN",
            "rollback work and chain",
            "END TRANSACTION AND CHAIN",
            "/* app */ ABORT AND CHAIN",
        ] {
            assert!(chains_block(chains), "{chains}");
        }
        for not in [
            "COMMIT",
            "COMMIT AND NO CHAIN",
            "ROLLBACK TO SAVEPOINT chain",
            "SELECT 'commit and chain'",
        ] {
            assert!(!chains_block(not), "{not}");
        }
    }
}
