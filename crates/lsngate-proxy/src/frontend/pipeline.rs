//! The client's prepared statements as each message of a flight finds them.
//!
//! PostgreSQL applies the messages of a pipeline in order: a Parse defines its name for the
//! messages after it (and fails with `42P05` only if the name already exists *there*), a Close
//! or an executed `DEALLOCATE ALL` drops names for the messages after it, and a Bind of a name
//! that is parsed only later in the pipeline fails with `26000`. The session records each
//! message's effect on its view of the client's statements as the message arrives
//! (`Session::statements` is the view after the pending messages), and keeps, for the flight
//! being assembled, what the names it touches were before it ([`FlightLog::before`]) and what
//! each of its Parses defines ([`FlightLog::parsed`]). [`statements_at`] replays the flight on
//! that starting point, so routing and `flight.rs` preparation look at the statement a message
//! really names at its own position.

use std::collections::HashMap;

use std::sync::Arc;

use super::client_statement::ClientStatement;
use crate::net::{FrontendMessage, NameMap, same_text};

/// What the messages of the flight being assembled changed in the client's view.
#[derive(Debug, Default, Clone)]
pub struct FlightLog {
    /// Each name the flight parsed or closed, with the statement the client held under it
    /// before the flight's first message that touched it (`""` is the unnamed statement).
    pub before: Vec<(String, Option<Arc<ClientStatement>>)>,
    /// What each Parse of the flight defines, in order.
    pub parsed: Vec<(String, Arc<ClientStatement>)>,
    /// The record of a flight sent before and running again (see [`FlightLog::under`]): what
    /// its send changes in the client's view was changed when it was first sent.
    pub rerun: bool,
}

impl FlightLog {
    /// Empties the log for the next flight, keeping its room (a new one allocated twice per
    /// flight).
    pub fn clear(&mut self) {
        self.before.clear();
        self.parsed.clear();
        self.rerun = false;
    }

    /// This record of a flight run again, read while `later`, the record of the messages
    /// received since, is being assembled: names this flight did not touch stand as they did
    /// before `later`'s messages (as this flight left them).
    pub fn under(&self, later: &FlightLog) -> FlightLog {
        let mut log = self.clone();
        log.rerun = true;
        for (name, before) in &later.before {
            log.touch(name, before.as_ref());
        }
        log
    }

    /// Records the value of `name` before the flight first touches it.
    pub fn touch(&mut self, name: &str, current: Option<&Arc<ClientStatement>>) {
        if !self.before.iter().any(|(n, _)| same_text(n, name)) {
            self.before.push((name.to_string(), current.cloned()));
        }
    }
}

/// One message's statement, as of its position in the flight.
#[derive(Debug, Clone, Copy)]
pub enum At<'a> {
    /// Not a message that names a statement, or a name the client does not hold there.
    Nothing,
    /// The statement a Bind or Describe names, or the one a Parse defines.
    Statement(&'a Arc<ClientStatement>),
    /// A Parse of a name the client already holds there: the server refuses it with `42P05` and
    /// keeps this one.
    Duplicate(&'a Arc<ClientStatement>),
    /// An Execute of a portal bound to `DEALLOCATE ALL`: every named statement is gone after it.
    DeallocateAll,
}

impl<'a> At<'a> {
    pub fn statement(self) -> Option<&'a ClientStatement> {
        self.definition().map(|s| &**s)
    }

    /// [`At::statement`], shared.
    pub fn definition(self) -> Option<&'a Arc<ClientStatement>> {
        match self {
            At::Statement(s) | At::Duplicate(s) => Some(s),
            At::Nothing | At::DeallocateAll => None,
        }
    }
}

/// The named statements the client holds after a flight, with their definitions.
pub type Kept<'a> = Vec<(String, &'a Arc<ClientStatement>)>;

/// The client's view replayed over `flight`: per message its [`At`], and, when a
/// `DEALLOCATE ALL` runs in it, the named statements the client holds after the flight.
/// `statements` and `unnamed` are the view after the flight's messages, `log` how the flight
/// got there (empty for a flight re-run later: its Parses then count as defining).
pub fn statements_at<'a>(
    statements: &'a HashMap<String, Arc<ClientStatement>>,
    unnamed: Option<&'a Arc<ClientStatement>>,
    log: &'a FlightLog,
    flight: &[FrontendMessage],
) -> (Vec<At<'a>>, Option<Kept<'a>>) {
    // The flight's own changes so far, by name; untouched names are what they were before it.
    let mut now: NameMap<'_, Option<&'a Arc<ClientStatement>>> = NameMap::default();
    let mut all_gone = false;
    let mut parsed = log.parsed.iter();
    // Portals bound in this flight to DEALLOCATE ALL (kept only for those).
    let mut deallocating: Vec<&str> = Vec::new();
    let before = |name: &str| -> Option<&'a Arc<ClientStatement>> {
        match log.before.iter().find(|(n, _)| same_text(n, name)) {
            Some((_, s)) => s.as_ref(),
            None if name.is_empty() => unnamed,
            None => statements.get(name),
        }
    };
    let lookup = |now: &NameMap<'_, Option<&'a Arc<ClientStatement>>>,
                  all_gone: bool,
                  name: &str| match now.get(name) {
        Some(s) => *s,
        None if all_gone && !name.is_empty() => None,
        None => before(name),
    };
    let mut at = Vec::with_capacity(flight.len());
    for m in flight {
        let here = match m {
            FrontendMessage::Parse {
                statement,
                query,
                param_types,
            } => {
                let own = match parsed.next() {
                    Some((name, s)) if same_text(name, statement) && s.is(param_types, query) => {
                        Some(s)
                    }
                    _ => None,
                };
                let held = lookup(&now, all_gone, statement);
                match (own, held) {
                    // The unnamed statement is replaced, never a duplicate.
                    (_, Some(held)) if !statement.is_empty() && own.is_some() => {
                        At::Duplicate(held)
                    }
                    // No record of this Parse (a flight re-run later): the view already has
                    // what it defined.
                    (None, Some(held)) if !statement.is_empty() && !held.is(param_types, query) => {
                        At::Duplicate(held)
                    }
                    (None, held) => {
                        now.insert(statement, held);
                        held.map_or(At::Nothing, At::Statement)
                    }
                    (Some(own), _) => {
                        now.insert(statement, Some(own));
                        At::Statement(own)
                    }
                }
            }
            FrontendMessage::Bind {
                portal, statement, ..
            } => {
                let s = lookup(&now, all_gone, statement);
                deallocating.retain(|p| !same_text(p, portal));
                if s.is_some_and(|s| s.deallocates_all) {
                    deallocating.push(portal.as_str());
                }
                s.map_or(At::Nothing, At::Statement)
            }
            FrontendMessage::Describe {
                kind: b'S',
                name: statement,
            } => lookup(&now, all_gone, statement).map_or(At::Nothing, At::Statement),
            FrontendMessage::Close { kind: b'S', name } => {
                // The statement it closes, if the client holds one there.
                let s = lookup(&now, all_gone, name);
                now.insert(name, None);
                s.map_or(At::Nothing, At::Statement)
            }
            FrontendMessage::Close { kind: b'P', name } => {
                deallocating.retain(|p| !same_text(p, name));
                At::Nothing
            }
            FrontendMessage::Execute { portal, .. }
                if deallocating.iter().any(|p| same_text(p, portal)) =>
            {
                now.retain(|name, _| name.is_empty());
                all_gone = true;
                At::DeallocateAll
            }
            FrontendMessage::Query(_) => {
                // A simple Query drops the unnamed statement.
                now.insert("", None);
                At::Nothing
            }
            _ => At::Nothing,
        };
        at.push(here);
    }
    let after = all_gone.then(|| {
        now.iter()
            .filter(|(name, _)| !name.is_empty())
            .filter_map(|(name, s)| s.map(|s| (name.to_string(), s)))
            .collect()
    });
    (at, after)
}

/// The named statements the client holds after `flight` (a flight's first messages, say).
pub fn held_after(
    statements: &HashMap<String, Arc<ClientStatement>>,
    log: &FlightLog,
    flight: &[FrontendMessage],
) -> Vec<(String, Arc<ClientStatement>)> {
    let (_, after) = statements_at(statements, None, log, flight);
    if let Some(after) = after {
        return after.into_iter().map(|(n, s)| (n, Arc::clone(s))).collect();
    }
    let mut names: Vec<&str> = statements.keys().map(String::as_str).collect();
    names.extend(log.before.iter().map(|(n, _)| n.as_str()));
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .filter(|n| !n.is_empty())
        .filter_map(|name| {
            // A Describe of the name at the end shows what the client holds there.
            let probe = FrontendMessage::Describe {
                kind: b'S',
                name: name.to_string(),
            };
            let mut with_probe = flight.to_vec();
            with_probe.push(probe);
            let (at, _) = statements_at(statements, None, log, &with_probe);
            at.last()
                .and_then(|a| a.definition())
                .map(|s| (name.to_string(), Arc::clone(s)))
        })
        .collect()
}

/// The client's statement under `name` after the pending messages `pending`, from what it was
/// before them (`log`): Parses of a name it holds change nothing, Closes drop it.
pub fn replay(
    log: &FlightLog,
    pending: &[FrontendMessage],
    name: &str,
) -> Option<Arc<ClientStatement>> {
    let mut held = log
        .before
        .iter()
        .find(|(n, _)| same_text(n, name))
        .and_then(|(_, s)| s.clone());
    let mut defs = log.parsed.iter().filter(|(n, _)| same_text(n, name));
    for m in pending {
        match m {
            FrontendMessage::Parse { statement, .. } if same_text(statement, name) => {
                let def = defs.next();
                if held.is_none() {
                    held = def.map(|(_, s)| s.clone());
                }
            }
            FrontendMessage::Close {
                kind: b'S',
                name: n,
            } if same_text(n, name) => held = None,
            _ => {}
        }
    }
    held
}

/// A Parse, a Close or an Execute of `DEALLOCATE ALL` the client sent, until the server has
/// answered it: one whose segment ends
/// (ReadyForQuery) without its ParseComplete or CloseComplete did not happen — it failed, or
/// the server skipped it after an earlier error in the segment, as PostgreSQL skips everything
/// up to the Sync. Its effect on the client's view (recorded when it arrived) and on the
/// connection's record of what it holds (recorded when it was sent) is then undone.
#[derive(Debug, Clone)]
pub struct Unconfirmed {
    /// The client segment it belongs to (see `Attached::segments_sent`).
    pub segment: u64,
    /// The tag of the answer that confirms it: ParseComplete, CloseComplete, or the
    /// CommandComplete of an Execute of `DEALLOCATE ALL`.
    pub answer: u8,
    /// Its effects: none for one that changes nothing the proxy tracks (a Parse of a name the
    /// client holds, a Close of a portal), one per name dropped for a `DEALLOCATE ALL`. A Parse
    /// of the unnamed statement has one under `""`: the client's unnamed statement before it
    /// and the identity it defines (the connection's side is put in doubt when it is undone).
    pub effects: Vec<Effect>,
    /// A Parse of the unnamed statement: its position among the messages of its segment the
    /// server answers one by one (Parse, Bind, Describe, Execute, Close), when the segment
    /// began in its flight. An error answered at that position is its own: PostgreSQL then
    /// has dropped the unnamed statement. At a later one it was skipped and the statement
    /// before it stays (seed 20261212293).
    pub position: Option<u32>,
}

/// What a Parse or Close of a named statement changed.
#[derive(Debug, Clone)]
pub struct Effect {
    pub name: String,
    /// The client's statement under the name before it, and the identity after it.
    pub view_before: Option<Arc<ClientStatement>>,
    pub view_after: Option<std::sync::Arc<str>>,
    /// What the connection held under the name before it, and after it.
    pub held_before: Option<String>,
    pub held_after: Option<String>,
    /// Of a `Parse ""`: the unnamed statement the connection held before it
    /// (`BackendConn::unnamed`), held again if the server skips the Parse.
    pub unnamed_held_before: Option<Arc<str>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontend::client_statement::tests::defined;

    fn describe(name: &str) -> FrontendMessage {
        FrontendMessage::Describe {
            kind: b'S',
            name: name.into(),
        }
    }

    #[test]
    fn a_flight_run_again_reads_its_messages_as_they_stood_before_it() {
        let a = Arc::new(defined("SELECT 1"));
        let b = Arc::new(defined("SELECT 2"));
        let c = Arc::new(defined("SELECT 3"));
        let x = Arc::new(defined("SELECT 4"));
        // The read: it describes the unnamed statement, parses another over it, and describes
        // `s1`. Before it, the client held `a` unnamed and `x` as `s1`.
        let read = vec![
            describe(""),
            FrontendMessage::Parse {
                statement: String::new(),
                query: "SELECT 2".into(),
                param_types: vec![23],
            },
            describe("s1"),
            FrontendMessage::Sync,
        ];
        let mut kept = FlightLog::default();
        kept.touch("", Some(&a));
        kept.parsed.push((String::new(), Arc::clone(&b)));
        // Received since, not sent yet: a Parse of `c` unnamed and a Close of `s1`.
        let mut later = FlightLog::default();
        later.touch("", Some(&b));
        later.touch("s1", Some(&x));
        let statements = HashMap::new();
        let log = kept.under(&later);
        assert!(log.rerun);
        let (at, _) = statements_at(&statements, Some(&c), &log, &read);
        let texts: Vec<_> = at
            .iter()
            .map(|a| a.statement().map(|s| &*s.query))
            .collect();
        assert_eq!(
            texts,
            [Some("SELECT 1"), Some("SELECT 2"), Some("SELECT 4"), None]
        );
        // The flight's own record alone misses what the later messages changed.
        let (at, _) = statements_at(&statements, Some(&c), &kept, &read);
        assert!(at[2].statement().is_none());
    }
}
