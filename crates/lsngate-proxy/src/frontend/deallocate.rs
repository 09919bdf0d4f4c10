//! The lifecycle of a client's prepared statements across server connections. A client's named
//! statements live in the session (`Session::statements`); under transaction pooling each server
//! connection holds whichever of them it was last asked to run, parsed on demand
//! (`flight.rs` `preparation`). So a statement the client drops must be gone *for that client*
//! on every server connection, not only on the one its `DEALLOCATE` happens to land on:
//!
//! - SQL `DEALLOCATE [PREPARE] name` for a statement the client prepared with Parse (pgx sends
//!   one for every statement its cache evicts) is answered by the proxy: the name leaves the
//!   client's view, and the server connections that hold it close it when the session next
//!   uses them. Forwarded, it met a connection that never parsed it: `26000`, and the driver's
//!   bookkeeping drifted from the servers'.
//! - A name the client does not hold gets PostgreSQL's own `26000 prepared statement "…" does not
//!   exist`, unless the session is pinned to one server connection (SQL `PREPARE` pins it): then
//!   the server there answers, as it would directly.
//! - `DEALLOCATE ALL` is the server's (it is session state), and the names go everywhere else too.
//! - Binding or describing a name the client does not hold closes a stale copy first, so the
//!   server answers `26000` as it would directly (`flight.rs`).

use super::error::ClientError;
use super::session::Session;
use crate::net::backend::TxStatus;
use crate::net::backend::build;
use crate::net::sqlstate;

/// What a `DEALLOCATE` statement names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deallocate {
    /// `DEALLOCATE [PREPARE] name`: the name as the server would fold it.
    One(String),
    /// `DEALLOCATE [PREPARE] ALL`.
    All,
}

/// Reads `DEALLOCATE [PREPARE] name|ALL` (one statement, optional `;`); `None` for anything else.
pub fn parse(sql: &str) -> Option<Deallocate> {
    let text = sql.trim().trim_end_matches(';').trim_end();
    let rest = strip_word(text, "deallocate")?;
    let rest = strip_word(rest, "prepare").unwrap_or(rest);
    if rest.is_empty() {
        return None;
    }
    if rest.eq_ignore_ascii_case("all") {
        return Some(Deallocate::All);
    }
    identifier(rest).map(Deallocate::One)
}

/// `text` without a leading `word` (case-insensitive) and the space after it.
fn strip_word<'a>(text: &'a str, word: &str) -> Option<&'a str> {
    let head = text.get(..word.len())?;
    let rest = &text[word.len()..];
    (head.eq_ignore_ascii_case(word) && rest.starts_with(|c: char| c.is_ascii_whitespace()))
        .then(|| rest.trim_start())
}

/// One SQL identifier and nothing after it: `"quoted ""name"""` kept as written, a plain one
/// folded to lower case as the server folds it.
fn identifier(text: &str) -> Option<String> {
    if let Some(quoted) = text.strip_prefix('"') {
        let mut name = String::new();
        let mut chars = quoted.chars();
        while let Some(c) = chars.next() {
            if c == '"' {
                match chars.next() {
                    Some('"') => name.push('"'),
                    None => return (!name.is_empty()).then_some(name),
                    Some(_) => return None,
                }
            } else {
                name.push(c);
            }
        }
        return None;
    }
    let plain = text
        .chars()
        .all(|c| c.is_alphanumeric() || c == '_' || c == '$')
        && !text.starts_with(|c: char| c.is_ascii_digit() || c == '$');
    plain.then(|| text.to_lowercase())
}

/// Most names a session remembers to close on server connections it uses later.
const CLOSING_KEPT: usize = 16;

impl Session {
    /// Answers `DEALLOCATE name` itself when the client prepared `name` with Parse, or does not
    /// hold it at all outside a transaction block (see the module doc); false when the server
    /// must run the statement.
    pub(super) async fn deallocate(&mut self, what: &Deallocate) -> Result<bool, ClientError> {
        if self
            .backend
            .as_ref()
            .is_some_and(|b| !b.batch.is_open() && !b.expect.is_empty())
        {
            // The answer depends on the transaction status, and the one last heard may be out of
            // date: a batch pipelined in front may yet fail and abort the block.
            self.drain().await?;
        }
        // In an aborted transaction the server refuses everything with 25P02: let it say so,
        // and drop nothing (a refused `DEALLOCATE ALL` closed the client's statements on the
        // next server connections, seed 20261214677).
        if self.status == TxStatus::Failed {
            return Ok(false);
        }
        let name = match what {
            Deallocate::All => {
                let names: Vec<String> = self.statements.keys().cloned().collect();
                names.into_iter().for_each(|n| self.close_later(n));
                return Ok(false);
            }
            Deallocate::One(name) => name,
        };
        if self.statements.remove(name).is_some() {
            self.close_later(name.clone());
            let answer = vec![build::command_complete("DEALLOCATE")];
            self.answer_query(answer, false).await?;
            return Ok(true);
        }
        if self.pinned {
            return Ok(false);
        }
        if self.status != TxStatus::Idle {
            // The server says 26000 and aborts the transaction, as it would directly, once a
            // stale copy of the name there (another client's) is closed in front.
            self.close_later(name.clone());
            return Ok(false);
        }
        let message = format!("prepared statement \"{name}\" does not exist");
        self.answer_error(sqlstate::INVALID_SQL_STATEMENT_NAME, &message)
            .await?;
        Ok(true)
    }

    /// Remembers to close `name` on the server connections this session uses from now on.
    fn close_later(&mut self, name: String) {
        if !self.closing.contains(&name) {
            if self.closing.len() == CLOSING_KEPT {
                self.closing.pop_front();
            }
            self.closing.push_back(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deallocate_statements_parse_like_the_server_reads_them() {
        let one = |n: &str| Some(Deallocate::One(n.to_string()));
        assert_eq!(parse("deallocate \"lrupsc_1_0\""), one("lrupsc_1_0"));
        assert_eq!(parse("DEALLOCATE PREPARE Q1;"), one("q1"));
        assert_eq!(
            parse("  Deallocate   \"Mixed\"\"Case\"  "),
            one("Mixed\"Case")
        );
        assert_eq!(parse("DEALLOCATE ALL"), Some(Deallocate::All));
        assert_eq!(parse("deallocate prepare all;"), Some(Deallocate::All));
        assert_eq!(parse("DEALLOCATE \"all\""), one("all"));
        for not in [
            "DEALLOCATE",
            "DEALLOCATE a b",
            "DEALLOCATE a; SELECT 1",
            "DEALLOCATEx",
            "SELECT 1",
            "DEALLOCATE \"open",
            "DEALLOCATE \"\"",
        ] {
            assert_eq!(parse(not), None, "{not}");
        }
    }
}
