//! What a server connection must carry before a client's flight runs on it, sent in the same
//! write: the client's settings (`settings_sql`), the statements the flight binds or describes
//! that this connection lacks (re-parsed under the client's names), the unnamed statement, and
//! the closing of statements other clients left or the client deallocated. The connection's
//! books (`prepared`, `unnamed`, `applied`) record what it holds; `IN_DOUBT` marks what a
//! refused or skipped statement may or may not have left.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::attached::{Attached, Duty, Owner};
use super::client_statement::ClientStatement;
use super::pipeline::{At, Effect, FlightLog, Unconfirmed};
use crate::backend::{BackendConn, Settings};
use crate::net::{Frame, FrontendMessage};

/// The statements that make a backend carry exactly the client's settings: the setting
/// statements that differ, `RESET` for leftovers.
pub(super) fn settings_sql(wanted: &Settings, applied: &Settings) -> Option<String> {
    let mut sql = String::new();
    for (name, statement) in wanted {
        if applied.get(name) != Some(statement) {
            sql.push_str(statement);
            sql.push(';');
        }
    }
    for name in applied.keys().filter(|n| !wanted.contains_key(n)) {
        sql.push_str(&format!("RESET {name};"));
    }
    (!sql.is_empty()).then_some(sql)
}

/// The `Parse ""` a flight needs in front when it binds or describes the unnamed statement without
/// parsing it, and the server's unnamed statement is not the client's (another client parsed
/// one there, a simple Query dropped it, or the client parsed it on another connection). Tracks
/// what `conn`'s unnamed statement is once the flight has run; injects nothing unless `may_inject`.
/// When the client has no unnamed statement (a simple Query dropped it) and the server has one,
/// it is a `Close S ""` instead, so the server answers 26000 as it would directly. Also returns
/// what the connection holds as its unnamed statement when the flight's first `Parse ""` runs.
/// A flight that leaves an extended batch open and does not touch the unnamed statement has it
/// made the client's all the same: the flights after it in that batch can put nothing in front
/// (seed 20261400722).
fn unnamed_preparation(
    conn: &mut BackendConn,
    client: Option<&ClientStatement>,
    flight: &[FrontendMessage],
    at: &[At<'_>],
    may_inject: bool,
) -> (Option<Frame>, Option<Arc<str>>) {
    // Only a Bind or Describe before the flight's first `Parse ""` needs the client's (after it,
    // the flight's own is there).
    let mut checked = !may_inject;
    let mut parse = None;
    let mut held_at_first_parse = None;
    // The client's unnamed statement must be the server's from here on (None: must be none).
    let reconcile = |conn: &mut BackendConn| match client {
        None => conn.unnamed.take().map(|_| {
            FrontendMessage::Close {
                kind: b'S',
                name: String::new(),
            }
            .to_frame()
        }),
        Some(s) if conn.unnamed.as_deref() != Some(s.identity()) => {
            conn.unnamed = Some(Arc::clone(&s.identity));
            let message = FrontendMessage::Parse {
                statement: String::new(),
                query: s.query.to_string(),
                param_types: s.param_types.to_vec(),
            };
            Some(message.to_frame())
        }
        Some(_) => None,
    };
    for (m, at) in flight.iter().zip(at) {
        match m {
            FrontendMessage::Parse {
                statement,
                query,
                param_types,
            } if statement.is_empty() => {
                if held_at_first_parse.is_none() {
                    held_at_first_parse = Some(conn.unnamed.clone());
                }
                checked = true;
                conn.unnamed = Some(parsed_identity(*at, param_types, query));
            }
            FrontendMessage::Bind { statement, .. }
            | FrontendMessage::Describe {
                kind: b'S',
                name: statement,
            } if statement.is_empty() && !checked => {
                // When the client has none (a simple Query dropped it), neither may the server,
                // which then answers 26000 as it would directly.
                checked = true;
                parse = reconcile(conn);
            }
            FrontendMessage::Close { kind: b'S', name } if name.is_empty() => {
                // From here on neither has one.
                checked = true;
                conn.unnamed = None;
            }
            FrontendMessage::Query(_) => {
                checked = true;
                conn.unnamed = None;
            }
            _ => {}
        }
    }
    let leaves_batch_open = flight.last().is_some_and(|m| !m.ends_segment());
    if !checked && leaves_batch_open {
        parse = reconcile(conn);
    }
    (parse, held_at_first_parse.flatten())
}

/// The identity of the statement a `Parse ""` of `query` makes on the server: the client's
/// definition's when it is this Parse's (shared, not built again per flight).
fn parsed_identity(at: At<'_>, param_types: &[u32], query: &str) -> Arc<str> {
    match at.statement() {
        Some(s) if s.is(param_types, query) => Arc::clone(&s.identity),
        _ => super::client_statement::statement_identity(param_types, query).into(),
    }
}

/// The identity recorded for a statement a connection may or may not hold: no statement's
/// (`statement_identity` always has a `|`).
pub(super) const IN_DOUBT: &str = "";

/// The effects of a `DEALLOCATE ALL` (or `DISCARD ALL`) on the statements the client `held`
/// before it: every one gone from the client's view, put back if the server does not confirm it
/// ran (`replies.rs` `undo_unconfirmed`).
pub(super) fn all_dropped(
    held: impl IntoIterator<Item = (String, Arc<ClientStatement>)>,
) -> Vec<Effect> {
    held.into_iter()
        .map(|(name, s)| Effect {
            name,
            view_before: Some(s),
            view_after: None,
            held_before: None,
            held_after: None,
            unnamed_held_before: None,
        })
        .collect()
}

/// A `DEALLOCATE ALL` (or `DISCARD ALL`) sent on `conn`: the server drops every named statement
/// there, the proxy's own included, unless it skips or refuses the statement (after an error in
/// its batch, or in an aborted block), and only its CommandComplete says which. Each is kept with
/// an identity no statement has, so whatever needs one there next closes and parses it again,
/// and a Parse of its name closes it first.
pub(super) fn all_in_doubt(conn: &mut BackendConn) {
    conn.prepared
        .values_mut()
        .for_each(|identity| *identity = IN_DOUBT.to_string());
}

/// Named statements a server connection may hold before those not in use are closed.
const MAX_PREPARED_PER_CONNECTION: usize = 256;

fn close_statement(name: &str) -> Frame {
    FrontendMessage::Close {
        kind: b'S',
        name: name.to_string(),
    }
    .to_frame()
}

/// Whether the flight leaves the client without an unnamed statement (its last `Parse ""` is
/// followed by a `Close` of it).
pub(super) fn closes_unnamed(flight: &[FrontendMessage]) -> bool {
    flight
        .iter()
        .rev()
        .find_map(|m| match m {
            FrontendMessage::Parse { statement, .. } if statement.is_empty() => Some(false),
            FrontendMessage::Close { kind: b'S', name } if name.is_empty() => Some(true),
            _ => None,
        })
        .unwrap_or(false)
}

/// What of the client's session a flight's preparation reads: its settings, the names it
/// deallocated, its statements after the pending messages, and how the flight got there.
pub(super) struct ClientView<'a> {
    pub settings: &'a Settings,
    pub closing: &'a std::collections::VecDeque<String>,
    pub statements: &'a HashMap<String, Arc<ClientStatement>>,
    pub unnamed: Option<&'a Arc<ClientStatement>>,
    pub log: &'a FlightLog,
}

/// Proxy frames that make `attached` ready for this flight: the client's settings and the
/// prepared statements the flight uses. `at` is each message's statement as of its position
/// (`pipeline::statements_at`, read once per flight by the caller, which also takes up what a
/// `DEALLOCATE ALL` in the flight leaves: `deallocated`).
pub(super) fn preparation(
    attached: &mut Attached,
    client: ClientView<'_>,
    flight: &[FrontendMessage],
    at: &[At<'_>],
    deallocated: bool,
) -> Vec<Frame> {
    // The server is in the middle of an extended batch or a COPY: nothing can go in front.
    let may_inject = attached.may_add_frames();
    let conn = &mut attached.conn;
    let mut frames = Vec::new();
    if may_inject {
        // Built only when the settings differ (it was built for every flight and dropped).
        let differs = *client.settings != conn.applied;
        if let Some(sql) = differs
            .then(|| settings_sql(client.settings, &conn.applied))
            .flatten()
        {
            frames.push(FrontendMessage::Query(sql).to_frame());
            conn.applied = client.settings.clone();
            // A simple Query drops the unnamed statement.
            conn.unnamed = None;
            attached.expect.push_back(Owner::Proxy(Duty::Settings));
        }
    }
    let mut statements = Vec::new();
    // The client's unnamed statement before the flight (a Parse in it replaced it since).
    let unnamed_before = match client.log.before.iter().find(|(n, _)| n.is_empty()) {
        Some((_, s)) => s.as_ref(),
        None => client.unnamed,
    };
    let (front, mut held_unnamed) =
        unnamed_preparation(conn, unnamed_before.map(|s| &**s), flight, at, may_inject);
    statements.extend(front);
    // Names whose state on the server the flight itself decides from some message on (it
    // parses, closes or uses them there): nothing goes in front for them after that.
    let mut defined_here = HashSet::new();
    if may_inject {
        for name in client.closing {
            // Names the client deallocated, as this connection may still hold them.
            if conn.prepared.remove(name).is_some() {
                statements.push(close_statement(name));
            }
        }
    }
    // The client's statement `s` must be on the server under `name` when the flight starts;
    // whether it was parsed for that.
    let ensure = |conn: &mut BackendConn,
                  statements: &mut Vec<Frame>,
                  name: &String,
                  s: &ClientStatement| {
        let parses = conn.prepared.get(name).map(String::as_str) != Some(s.identity());
        if parses {
            statements.push(close_statement(name));
            let parse = FrontendMessage::Parse {
                statement: name.clone(),
                query: s.query.to_string(),
                param_types: s.param_types.to_vec(),
            };
            statements.push(parse.to_frame());
            conn.prepared.insert(name.clone(), s.identity().to_string());
        }
        parses
    };
    // Names taken behind the statements in front, each in a segment of its own (see
    // `taking_segment`).
    let mut taken = Vec::new();
    // Parses, Closes and DEALLOCATE ALLs of earlier flights not answered yet run on this same
    // connection first (a flight goes elsewhere only once every answer is in): for their
    // names, or every name behind a DEALLOCATE ALL, the server's own state decides, and
    // nothing goes in front.
    let mut server_decides = false;
    for u in &attached.unconfirmed {
        server_decides |= u.answer == b'C';
        defined_here.extend(u.effects.iter().map(|e| e.name.clone()));
    }
    let mut segment = attached.segments_sent;
    // Each message's position among those of its segment the server answers one by one, while
    // the segment began in this flight (not in a batch an earlier flight left open).
    let mut answered_before = (!attached.batch.is_open()).then_some(0u32);
    // The client's unnamed statement as each message finds it.
    let mut unnamed_view = unnamed_before;
    let unconfirmed = &mut attached.unconfirmed;
    let mut note = |segment: u64, answer: u8, effects: Vec<Effect>, position: Option<u32>| {
        unconfirmed.push_back(Unconfirmed {
            segment,
            answer,
            effects,
            position,
        });
    };
    for (position, (m, here)) in flight.iter().zip(at).enumerate() {
        let answered_at = answered_before;
        match m {
            FrontendMessage::Sync
            | FrontendMessage::Query(_)
            | FrontendMessage::FunctionCall(_) => {
                segment += 1;
                answered_before = Some(0);
            }
            FrontendMessage::Parse { .. }
            | FrontendMessage::Bind { .. }
            | FrontendMessage::Describe { .. }
            | FrontendMessage::Execute { .. }
            | FrontendMessage::Close { .. } => answered_before = answered_before.map(|n| n + 1),
            _ => {}
        }
        match m {
            FrontendMessage::Query(_) => {
                unnamed_view = None;
                held_unnamed = None;
            }
            FrontendMessage::Parse {
                statement,
                query,
                param_types,
            } if statement.is_empty() => {
                // Undone if the server skips it or refuses it (`Session::undo_unconfirmed`).
                let defined = here.definition();
                let held = parsed_identity(*here, param_types, query);
                let effect = Effect {
                    name: String::new(),
                    view_before: unnamed_view.cloned(),
                    view_after: defined.map(|s| Arc::clone(&s.identity)),
                    held_before: None,
                    held_after: None,
                    unnamed_held_before: held_unnamed.replace(held),
                };
                note(segment, b'1', vec![effect], answered_at);
                unnamed_view = defined;
            }
            FrontendMessage::Close { kind, name } if *kind != b'S' || name.is_empty() => {
                if *kind == b'S' {
                    unnamed_view = None;
                    held_unnamed = None;
                }
                note(segment, b'3', Vec::new(), None)
            }
            _ => {}
        }
        match (m, *here) {
            (
                FrontendMessage::Parse {
                    statement, query, ..
                },
                At::Duplicate(s),
            ) if !statement.is_empty() => {
                note(segment, b'1', Vec::new(), None);
                // The client already holds the name here: the server must too, to refuse
                // the Parse (42P05) as it would directly. It keeps what it held.
                let first = defined_here.insert(statement.clone()) && !server_decides;
                if may_inject
                    && first
                    && ensure(conn, &mut statements, statement, s)
                    && crate::statement::parses_in_failed_block(query)
                {
                    // In a failed block the server refuses that Parse (25P02) and the name
                    // stays free, where it would parse the client's (seed 20261580735).
                    taken.push(statement.clone());
                    conn.prepared
                        .insert(statement.clone(), IN_DOUBT.to_string());
                }
            }
            (
                FrontendMessage::Parse {
                    statement,
                    query,
                    param_types,
                },
                _,
            ) if !statement.is_empty() => {
                // The client does not hold the name here: a copy the server has (another
                // client's, or one the client closed elsewhere) is closed in front. One
                // the flight itself closed or deallocated earlier is gone by then.
                let mut held_before = conn.prepared.get(statement).cloned();
                if defined_here.insert(statement.clone())
                    && !server_decides
                    && may_inject
                    && held_before.is_some()
                {
                    statements.push(close_statement(statement));
                    held_before = None;
                }
                let identity = super::client_statement::statement_identity(param_types, query);
                conn.prepared.insert(statement.clone(), identity.clone());
                note(
                    segment,
                    b'1',
                    vec![Effect {
                        name: statement.clone(),
                        view_before: None,
                        view_after: Some(identity.as_str().into()),
                        held_before,
                        held_after: Some(identity),
                        unnamed_held_before: None,
                    }],
                    None,
                );
            }
            (
                FrontendMessage::Bind { statement, .. }
                | FrontendMessage::Describe {
                    kind: b'S',
                    name: statement,
                },
                here,
            ) if !statement.is_empty() && defined_here.insert(statement.clone()) => {
                if !may_inject || server_decides {
                    continue;
                }
                match here.statement() {
                    Some(s) => {
                        ensure(conn, &mut statements, statement, s);
                    }
                    // Not the client's here: a copy left by another client or before a
                    // DEALLOCATE is closed, so the server answers 26000 as it would
                    // directly.
                    None => {
                        if !crate::causal::sql::is_proxy_statement(statement)
                            && conn.prepared.remove(statement).is_some()
                        {
                            statements.push(close_statement(statement));
                        }
                    }
                }
            }
            (FrontendMessage::Close { kind: b'S', name }, here) if !name.is_empty() => {
                let held_before = conn.prepared.remove(name);
                defined_here.insert(name.clone());
                note(
                    segment,
                    b'3',
                    vec![Effect {
                        name: name.clone(),
                        view_before: here.definition().cloned(),
                        view_after: None,
                        held_before,
                        held_after: None,
                        unnamed_held_before: None,
                    }],
                    None,
                );
            }
            (FrontendMessage::Execute { .. }, At::DeallocateAll) => {
                // What the client held just before it, restored if the server skips it.
                let held =
                    super::pipeline::held_after(client.statements, client.log, &flight[..position]);
                note(segment, b'C', all_dropped(held), None);
                all_in_doubt(conn);
                if !may_inject {
                    continue;
                }
                let names: Vec<String> = client.statements.keys().cloned().collect();
                defined_here.extend(names);
            }
            _ => {}
        }
    }
    if may_inject && !attached.foreign_closed && !server_decides && !deallocated {
        // The first flight of a connection lent to this client that can add frames: the
        // statements other clients left under names the client does not hold (or holds as
        // another statement) go, so a Parse of the name later, even inside a batch the client
        // opened where nothing can go in front, finds none (a direct connection has none).
        // The client's own, under the same text, stay for it to use.
        attached.foreign_closed = true;
        let foreign: Vec<String> = conn
            .prepared
            .iter()
            .filter(|(name, identity)| {
                !defined_here.contains(*name)
                    && !crate::causal::sql::is_proxy_statement(name)
                    && client.statements.get(*name).map(|s| s.identity()) != Some(identity.as_str())
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in foreign {
            conn.prepared.remove(&name);
            statements.push(close_statement(&name));
        }
    }
    if may_inject && conn.prepared.len() > MAX_PREPARED_PER_CONNECTION {
        // Statements of many clients and many evictions pile up on a pooled connection:
        // beyond the cap every one this flight does not use is closed (each is parsed
        // again where a client needs it).
        let keep = |name: &String| {
            defined_here.contains(name) || crate::causal::sql::is_proxy_statement(name)
        };
        let closed: Vec<String> = conn.prepared.keys().filter(|n| !keep(n)).cloned().collect();
        for name in closed {
            conn.prepared.remove(&name);
            statements.push(close_statement(&name));
        }
    }
    if !statements.is_empty() {
        frames.extend(statements);
        frames.push(FrontendMessage::Sync.to_frame());
        attached.expect.push_back(Owner::Proxy(Duty::Prepare));
    }
    for name in taken {
        frames.extend(taking_segment(&name));
        attached.expect.push_back(Owner::Proxy(Duty::Take));
    }
    frames
}

/// A segment that makes sure the server holds a statement named `name`, whatever its text:
/// the Parse of a statement PostgreSQL parses even in a failed block, refused (42P05) where
/// the name is already held. It is no client's: it fails if ever bound and run (a
/// savepoint no one made), and the name is recorded `IN_DOUBT`, so a flight that needs the
/// client's statement there closes and parses it again.
fn taking_segment(name: &str) -> [Frame; 2] {
    let parse = FrontendMessage::Parse {
        statement: name.to_string(),
        query: "ROLLBACK TO SAVEPOINT lsngate_name_taken".to_string(),
        param_types: Vec::new(),
    };
    [parse.to_frame(), FrontendMessage::Sync.to_frame()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_sql_sets_what_differs_and_resets_leftovers() {
        let wanted = Settings::from([(
            "application_name".to_string(),
            "SET application_name = 'app'".to_string(),
        )]);
        let applied =
            Settings::from([("search_path".to_string(), "SET search_path = x".to_string())]);
        assert_eq!(
            settings_sql(&wanted, &applied).unwrap(),
            "SET application_name = 'app';RESET search_path;"
        );
        assert_eq!(settings_sql(&wanted, &wanted), None);
    }

    #[test]
    fn closes_unnamed_looks_at_the_last_parse_or_close_of_it() {
        let parse = FrontendMessage::Parse {
            statement: String::new(),
            query: "SELECT 1".into(),
            param_types: vec![],
        };
        let close = |name: &str| FrontendMessage::Close {
            kind: b'S',
            name: name.into(),
        };
        let sync = FrontendMessage::Sync;
        assert!(closes_unnamed(&[parse.clone(), close(""), sync.clone()]));
        assert!(!closes_unnamed(&[close(""), parse, sync.clone()]));
        assert!(!closes_unnamed(&[close("s1"), sync]));
    }
}
