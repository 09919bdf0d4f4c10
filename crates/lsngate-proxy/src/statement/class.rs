//! Where may this SQL run? The classification is conservative by construction: anything the
//! parser does not understand, or that might write, lock or leave state behind, goes to the
//! primary; only plain queries without locking clauses, data-modifying CTEs or effectful
//! functions may go to a replica. A wrong "write" costs a replica some load; a wrong "read" sends
//! a write to a server that refuses it, or a read of session state to a server that lacks it, so
//! every doubt falls on the primary's side. It answers what a statement needs, not which node
//! serves it: that is the session's decision, with the client's floors and hints in hand.

use sqlparser::ast::Statement;
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

/// Functions that write, take locks or depend on session state created on the primary.
const EFFECT_FUNCTIONS: &[&str] = &[
    "nextval",
    "setval",
    "currval",
    "lastval",
    "pg_advisory_lock",
    "pg_advisory_xact_lock",
    "pg_advisory_lock_shared",
    "pg_advisory_xact_lock_shared",
    "pg_try_advisory_lock",
    "pg_try_advisory_xact_lock",
    "pg_try_advisory_lock_shared",
    "pg_try_advisory_xact_lock_shared",
    "pg_advisory_unlock",
    "pg_advisory_unlock_all",
    "pg_advisory_unlock_shared",
    "txid_current",
    "pg_current_xact_id",
    "set_config",
    "pg_notify",
    "lo_create",
    "lo_import",
    "lo_unlink",
    "lo_put",
    "lo_from_bytea",
    "pg_logical_emit_message",
    "dblink_exec",
    "pg_current_wal_lsn",
    "pg_current_wal_insert_lsn",
    "pg_current_wal_flush_lsn",
];

/// What a statement (or a multi-statement string) needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)] // variant fields are described by the variant docs
pub enum Class {
    /// Only reads: a replica may serve it outside a transaction block.
    Read,
    /// May write, lock or is not understood: the primary.
    Write,
    /// Opens a transaction block; `read_only` blocks may go to a replica.
    Begin { read_only: bool },
    /// COMMIT / ROLLBACK: goes wherever the transaction is, and ends it.
    TransactionControl,
    /// Changes only the transaction it runs in (SAVEPOINT, RELEASE, SET LOCAL, SET TRANSACTION,
    /// SET CONSTRAINTS): goes wherever the transaction is — a block, or the implicit one of an
    /// extended batch still open on a replica — and ends nothing.
    TransactionLocal,
    /// Session state (SET, RESET, DISCARD, DEALLOCATE): runs on the primary and is re-applied
    /// on every backend the client later uses.
    SessionState,
    /// LISTEN, SQL-level PREPARE, DECLARE (cursors WITH HOLD): state the proxy cannot move
    /// between backends, so the client stays on one primary backend from now on.
    Pin,
}

/// Classifies SQL text conservatively.
pub fn classify(sql: &str, write_functions: &[String]) -> Class {
    let lower = sql.to_ascii_lowercase();
    let first = lower
        .trim_start()
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or_default()
        .to_string();
    if first == "set" && transaction_local_set(&lower) {
        return Class::TransactionLocal;
    }
    match first.as_str() {
        "set" | "reset" | "discard" | "deallocate" => return Class::SessionState,
        "listen" | "unlisten" | "prepare" | "declare" => return Class::Pin,
        // Alone: among other statements the string is judged by all of them (seed
        // 20261218805: `SHOW …; START TRANSACTION` opened its block on a replica).
        "show" if !several_statements(&lower) => return Class::Read,
        "savepoint" | "release" if !several_statements(&lower) => {
            return Class::TransactionLocal;
        }
        _ => {}
    }
    if calls(&lower, "set_config") && !set_config_local_only(&lower) {
        // A setting changed by a function for the session: session state like SET (the
        // server's settings are read back afterwards).
        return Class::SessionState;
    }
    let Ok(statements) = Parser::parse_sql(&PostgreSqlDialect {}, sql) else {
        return Class::Write;
    };
    let mut class = None;
    for statement in &statements {
        let this = match statement {
            Statement::Query(_) if reads_only(&lower, write_functions) => Class::Read,
            Statement::Copy { .. }
                if lower.contains(" to stdout") && reads_only(&lower, write_functions) =>
            {
                Class::Read
            }
            Statement::StartTransaction { .. } => Class::Begin {
                read_only: is_read_only_begin(&lower),
            },
            Statement::Commit { .. } | Statement::Rollback { .. } => Class::TransactionControl,
            Statement::ShowVariable { .. } => Class::Read,
            _ => Class::Write,
        };
        class = Some(match (class, this) {
            (None, c) => c,
            (Some(Class::Read), Class::Read) => Class::Read,
            (Some(Class::TransactionControl), Class::TransactionControl) => {
                Class::TransactionControl
            }
            _ => Class::Write,
        });
    }
    class.unwrap_or(Class::Read)
}

/// Whether a string holds more than one statement, split naively on `;` (a `;` inside a literal
/// only makes a statement count as several, the conservative side).
pub fn several_statements(sql: &str) -> bool {
    sql.trim().trim_end_matches(';').contains(';')
}

/// A single `SET LOCAL`, `SET TRANSACTION` or `SET CONSTRAINTS`: its effect ends with the
/// transaction it runs in.
fn transaction_local_set(lower: &str) -> bool {
    let words: Vec<&str> = lower.split_whitespace().take(2).collect();
    !several_statements(lower)
        && matches!(
            words.as_slice(),
            ["set", "local" | "transaction" | "constraints"]
        )
}

fn is_read_only_begin(lower: &str) -> bool {
    let squashed = lower.split_whitespace().collect::<Vec<_>>().join(" ");
    squashed.contains("read only") && !squashed.contains("read write")
}

fn reads_only(lower: &str, write_functions: &[String]) -> bool {
    const LOCKS: &[&str] = &[
        "for update",
        "for share",
        "for no key update",
        "for key share",
    ];
    const MODIFYING: &[&str] = &["insert", "update", "delete", "merge", "into"];
    let squashed = lower.split_whitespace().collect::<Vec<_>>().join(" ");
    if LOCKS.iter().any(|l| squashed.contains(l)) {
        return false;
    }
    if MODIFYING.iter().any(|kw| has_word(&squashed, kw)) {
        return false;
    }
    let extra = write_functions.iter().map(String::as_str);
    !EFFECT_FUNCTIONS
        .iter()
        .copied()
        .chain(extra)
        .any(|f| calls(&squashed, f))
}

/// Whether `c` may continue an identifier (or a `$n` parameter).
pub(super) fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$'
}

/// Whether `word` stands in `text` as a whole word, not inside an identifier.
pub(super) fn has_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(i, _)| {
        let before = i == 0 || !is_ident(text.as_bytes()[i - 1]);
        let after = text
            .as_bytes()
            .get(i + word.len())
            .is_none_or(|&c| !is_ident(c));
        before && after
    })
}

/// Whether every `set_config(...)` call in `lower` passes a literal `true` as its last argument
/// (`is_local`: the value ends with the transaction, as PostgREST and row-level-security setups
/// use it on every request).
fn set_config_local_only(lower: &str) -> bool {
    lower.match_indices("set_config").all(|(i, _)| {
        let Some(args) = lower[i + "set_config".len()..]
            .trim_start()
            .strip_prefix('(')
        else {
            return true; // not a call
        };
        let (mut depth, mut quoted, mut last_comma) = (0usize, false, None);
        for (j, c) in args.char_indices() {
            match c {
                '\'' => quoted = !quoted,
                _ if quoted => {}
                '(' => depth += 1,
                ')' if depth == 0 => {
                    return last_comma.is_some_and(|k: usize| args[k + 1..j].trim() == "true");
                }
                ')' => depth -= 1,
                ',' if depth == 0 => last_comma = Some(j),
                _ => {}
            }
        }
        false
    })
}

fn calls(text: &str, function: &str) -> bool {
    text.match_indices(function).any(|(i, _)| {
        let before = i == 0 || !is_ident(text.as_bytes()[i - 1]) || text.as_bytes()[i - 1] == b'.';
        before && text[i + function.len()..].trim_start().starts_with('(')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(sql: &str) -> Class {
        classify(sql, &["audit".to_string()])
    }

    #[test]
    fn plain_reads_go_to_replicas() {
        assert_eq!(c("SELECT 1"), Class::Read);
        assert_eq!(c("select * from t where id = $1"), Class::Read);
        assert_eq!(c("SELECT a FROM t; SELECT b FROM u"), Class::Read);
        assert_eq!(c("WITH x AS (SELECT 1) SELECT * FROM x"), Class::Read);
        assert_eq!(c("SHOW server_version"), Class::Read);
        assert_eq!(c("COPY t TO STDOUT"), Class::Read);
        assert_eq!(c("select updated_at from t"), Class::Read);
    }

    #[test]
    fn anything_that_may_write_goes_to_the_primary() {
        for sql in [
            "INSERT INTO t VALUES (1)",
            "SELECT 1; DELETE FROM t",
            "SELECT nextval('s')",
            "select pg_advisory_lock(1)",
            "SELECT * FROM t FOR UPDATE",
            "SELECT * FROM t for  no key update",
            "WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d",
            "SELECT * INTO new_t FROM t",
            "SELECT audit(1)",
            "SELECT public.setval('s', 1)",
            "CREATE TABLE x (a int)",
            "COPY t FROM STDIN",
            "this is not sql",
            "WAIT FOR LSN '0/1'",
        ] {
            assert_eq!(c(sql), Class::Write, "{sql}");
        }
    }

    #[test]
    fn transactions_session_state_and_local_commands() {
        assert_eq!(c("BEGIN"), Class::Begin { read_only: false });
        assert_eq!(c("BEGIN READ ONLY"), Class::Begin { read_only: true });
        assert_eq!(
            c("START TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"),
            Class::Begin { read_only: true }
        );
        assert_eq!(c("COMMIT"), Class::TransactionControl);
        for local in [
            "SAVEPOINT sp1",
            "release savepoint sp1;",
            "SET LOCAL work_mem = '3MB'",
            "set  local statement_timeout to 5",
            "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
            "SET CONSTRAINTS ALL DEFERRED",
        ] {
            assert_eq!(c(local), Class::TransactionLocal, "{local}");
        }
        // Among other statements, the string is judged by all of them.
        assert_eq!(
            c("SET LOCAL work_mem = '3MB'; INSERT INTO t VALUES (1)"),
            Class::SessionState
        );
        assert_eq!(c("SAVEPOINT a; INSERT INTO t VALUES (1)"), Class::Write);
        assert_eq!(
            c("SHOW application_name; START TRANSACTION"),
            Class::Write,
            "a block opened behind a SHOW goes to the primary (seed 20261218805)"
        );
        assert_eq!(c("SHOW work_mem; SHOW application_name"), Class::Read);
        assert_eq!(c("SET search_path = app"), Class::SessionState);
        assert_eq!(
            c("SELECT pg_catalog.set_config('search_path', 'app', false)"),
            Class::SessionState
        );
        assert_eq!(c("SELECT current_setting('search_path')"), Class::Read);
        assert_eq!(
            c("SELECT set_config('a.b', 'x,(y)', is_local => false)"),
            Class::SessionState
        );
        for local in [
            "SELECT set_config('request.jwt.claims', '{\"a\": 1}', true)",
            "select set_config('role', 'x', TRUE), set_config('a.b', format('%s', 1), true)",
        ] {
            assert_ne!(c(local), Class::SessionState, "{local}");
        }
        assert_eq!(c("LISTEN jobs"), Class::Pin);
        assert_eq!(c("PREPARE q AS SELECT 1"), Class::Pin);
    }
}
