//! The session-level effects of a client's flight (SET, RESET, DISCARD, DEALLOCATE, PREPARE,
//! LISTEN): recorded when sent, confirmed or undone by the server's answers, and the client's
//! settings read back (`RESYNC_SQL`, `Session::on_resync`) or applied again
//! (`Session::restore_settings`) when an answer leaves them in doubt.

use std::collections::HashSet;

use super::attached::{Duty, Owner, ProxyAnswer};
use super::client_statement::ClientStatement;
use super::error::ClientError;
use super::flight::segment_ends;
use super::pipeline::Unconfirmed;
use super::preparation::{all_dropped, all_in_doubt, settings_sql};
use super::session::Session;
use crate::backend::Settings;
use crate::net::backend::TxStatus;
use crate::net::{FrontendMessage, NameMap};
use crate::statement::{Class, session_set, setting_reset};

/// [`Attached::reset_tags`] entries for a flight: per Execute whether its portal (bound in this
/// flight or before, as `portals` records) runs a RESET sent as SET; `None` per Sync or Query.
pub(super) fn reset_tags(
    flight: &[FrontendMessage],
    statements: &[Option<&ClientStatement>],
    portals: &mut HashSet<String>,
) -> Vec<Option<bool>> {
    let mut tags = Vec::new();
    for (m, s) in flight.iter().zip(statements) {
        match m {
            FrontendMessage::Bind { portal, .. } => {
                if s.is_some_and(|s| s.reset_as_set) {
                    portals.insert(portal.clone());
                } else if !portals.is_empty() {
                    portals.remove(portal);
                }
            }
            FrontendMessage::Close { kind: b'P', name } => {
                portals.remove(name);
            }
            FrontendMessage::Execute { portal, .. } => tags.push(Some(portals.contains(portal))),
            FrontendMessage::Sync
            | FrontendMessage::Query(_)
            | FrontendMessage::FunctionCall(_) => tags.push(None),
            _ => {}
        }
    }
    tags
}

/// The session-level settings of a server connection: after the client's transaction is over,
/// exactly the client's (the proxy resets anyone else's before the client's first statement).
pub(super) const RESYNC_SQL: &str =
    "SELECT name, setting FROM pg_catalog.pg_settings WHERE source = 'session'";

/// What a flight's Executes after its last Sync (or Query) run ([`Session::unsynced_run`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct UnsyncedRun {
    /// `None` when there are none, else whether one of them runs a BEGIN.
    pub executed: Option<bool>,
    /// The batch is inside a block it opened: one of its Executes ran a BEGIN and none after it
    /// may end a block. Its implicit transaction became that block (what ran before the BEGIN
    /// joins it), so nothing of it commits at the batch's Sync.
    pub in_block: bool,
}

impl Session {
    /// The statements a flight runs that change session state (SET, RESET, DISCARD, DEALLOCATE,
    /// LISTEN, ...): a simple Query's text, or the statement behind each portal an
    /// extended-protocol flight executes (drivers send `SET` that way as often as not).
    /// `per_message` is the flight's [`Session::statement_per_message`].
    pub(super) fn session_effects(
        &self,
        flight: &[FrontendMessage],
        class: Option<Class>,
        per_message: &[Option<&ClientStatement>],
    ) -> Vec<(Class, String)> {
        let changes_state = |c: Class| matches!(c, Class::Pin | Class::SessionState);
        if let [FrontendMessage::Query(sql)] = flight {
            return match class {
                Some(c) if changes_state(c) => vec![(c, sql.clone())],
                // Classified by its other statements, but its SET applies all the same; with a
                // `;` in it, it is recorded as not understood (read back afterwards).
                _ if crate::statement::sets_session_in_parts(sql.as_bytes()) => {
                    vec![(Class::SessionState, sql.clone())]
                }
                _ => Vec::new(),
            };
        }
        let mut portals = NameMap::default();
        let mut effects = Vec::new();
        for (m, statement) in flight.iter().zip(per_message.iter().copied()) {
            match m {
                FrontendMessage::Bind { portal, .. } => {
                    portals.insert(portal, statement);
                }
                FrontendMessage::Execute { portal, .. } => {
                    if let Some(Some(s)) = portals.get(portal)
                        && changes_state(s.class)
                    {
                        effects.push((s.class, s.query.to_string()));
                    }
                }
                _ => {}
            }
        }
        effects
    }

    /// What the flight's Executes after its last Sync (or Query) run, left for a later Sync to
    /// end; `in_block` is whether the batch they join already opened a block
    /// ([`UnsyncedRun::in_block`] of the flights before in it). `per_message` is the flight's
    /// [`Session::statement_per_message`].
    pub(super) fn unsynced_run(
        flight: &[FrontendMessage],
        per_message: &[Option<&ClientStatement>],
        in_block: bool,
    ) -> UnsyncedRun {
        let tail = flight
            .iter()
            .rposition(FrontendMessage::ends_segment)
            .map_or(0, |i| i + 1);
        let mut portals = NameMap::default();
        let mut run = UnsyncedRun {
            executed: None,
            in_block,
        };
        for (m, statement) in flight.iter().zip(per_message.iter().copied()).skip(tail) {
            match m {
                FrontendMessage::Bind { portal, .. } => {
                    portals.insert(portal, statement);
                }
                FrontendMessage::Execute { portal, .. } => {
                    let statement = portals.get(portal).copied().flatten();
                    let begins = statement.is_some_and(|s| matches!(s.class, Class::Begin { .. }));
                    run.executed = Some(begins || run.executed.unwrap_or(false));
                    if begins {
                        run.in_block = true;
                    } else if statement.is_none_or(|s| crate::statement::may_end_block(&s.query)) {
                        run.in_block = false;
                    }
                }
                _ => {}
            }
        }
        run
    }

    /// Tracks the session-level `effects` of a flight (its [`Session::session_effects`]). True
    /// when a change of settings may yet be undone or was not understood: a SET inside a
    /// transaction block (a ROLLBACK undoes it), in a pipeline or a multi-statement string (a
    /// later error undoes it), or one the proxy cannot parse. The server's settings are then
    /// read back when the transaction is over ([`Duty::Resync`], sent at the ReadyForQuery that
    /// says idle). `SET LOCAL`, `SET TRANSACTION` and `SET CONSTRAINTS` are not session state
    /// (`Class::TransactionLocal`).
    pub(super) fn note_session_effects(
        &mut self,
        flight: &[FrontendMessage],
        effects: Vec<(Class, String)>,
    ) -> bool {
        let executes = flight
            .iter()
            .filter(|m| matches!(m, FrontendMessage::Execute { .. }))
            .count();
        // Outside a block as far as the client heard, and nothing before it still due: a
        // segment still due may open a block the statement then runs in, and a ROLLBACK undo it
        // (a `BEGIN` sent right before a SET or RESET, without waiting for its answer: the
        // change stayed recorded after the ROLLBACK, and the next client was given the server's
        // undone value; seed 20261422566).
        let settled = self.status == TxStatus::Idle
            && self
                .backend
                .as_ref()
                .is_none_or(|b| b.client_segments_due() == 0);
        let alone = settled && effects.len() == 1 && executes <= 1;
        let mut doubt = false;
        let simple = matches!(flight, [FrontendMessage::Query(_)]);
        let pin_settled = self.pinned
            && self
                .backend
                .as_ref()
                .is_some_and(|b| b.pin_unconfirmed.is_none());
        let pins = effects.iter().any(|(class, _)| *class == Class::Pin);
        // Sent into a batch the server skips to its Sync (an earlier message of it failed, and
        // that error was already relayed): nothing of the flight runs, so no error of its own
        // will say so (seed 20261207985: a SET behind a failed Execute stayed recorded).
        let skipped = self.backend.as_ref().is_some_and(|b| {
            matches!(b.batch, super::attached::Batch::Open { skipping: true, .. })
        });
        for (class, sql) in effects {
            if let Some(understood) = self.note_session_effect(class, &sql, simple) {
                doubt |= class == Class::SessionState && (skipped || !(understood && alone));
                if class == Class::SessionState {
                    // Recorded before the server ran it: an error in its segment (its own, or
                    // one that made the server skip it) puts the settings in doubt.
                    self.backend.as_mut().expect("attached").effects_due = true;
                }
            }
        }
        if pins && !pin_settled {
            // Until one of them is confirmed, the pin lasts to the last segment of the latest
            // flight that sent a pinning statement (an earlier one the server skipped must not
            // undo the pin of a later one that ran, seeds 777336 then 777338). The flight's last
            // segment is the one still open when it ends in Flush.
            let attached = self.backend.as_mut().expect("attached");
            let ends = segment_ends(flight) as u64;
            let open_tail = !flight.last().is_some_and(FrontendMessage::ends_segment);
            let last = attached.segments_sent + ends + u64::from(open_tail);
            attached.pin_unconfirmed = Some(last.saturating_sub(1));
        }
        doubt
    }

    /// Records one statement's effect: `Some(false)` when it is not understood (the server's
    /// settings are then read back), `None` when nothing outlives the transaction.
    /// `simple`: the statement is a simple Query's (an extended flight's are in `preparation`,
    /// which knows their place in the flight).
    fn note_session_effect(&mut self, class: Class, sql: &str, simple: bool) -> Option<bool> {
        let lower = sql.trim().trim_end_matches(';').trim().to_ascii_lowercase();
        let conn = &mut self.backend.as_mut().expect("attached").conn;
        match class {
            Class::Pin => self.pinned = true,
            Class::SessionState if lower.contains(';') => {
                if crate::statement::resets_all_in_parts(sql) && self.status != TxStatus::Failed {
                    self.reset_proxy_settings();
                }
                return Some(false);
            }
            Class::SessionState => {
                if let Some((name, _)) = setting_reset(sql) {
                    // Sent as it is (one sent as the startup value's SET is recorded as that
                    // SET): the server went back to its own login's value. A direct connection
                    // goes back to the client's startup value, which the next flight's
                    // preparation applies again.
                    conn.applied.remove(&name);
                    match self.startup_settings.get(&name) {
                        Some(statement) => {
                            self.settings.insert(name, statement.clone());
                        }
                        None => {
                            self.settings.remove(&name);
                        }
                    }
                } else if let Some((name, value)) = session_set(sql) {
                    let statement = format!("SET {name} = {value}");
                    conn.applied.insert(name.clone(), statement.clone());
                    self.settings.insert(name, statement);
                } else if lower == "reset all" || lower == "discard all" {
                    // A direct connection returns to the values the client logged in with; the
                    // server connection returns to its own login's, so the startup settings are
                    // applied again right behind (`restore_due`, before the client hears the
                    // statement is done, so it is told of no value it never had).
                    self.settings = self.startup_settings.clone();
                    conn.applied.clear();
                    self.restore_due = !self.settings.is_empty();
                    if lower == "discard all" && simple {
                        self.drop_all_unconfirmed();
                    } else if lower == "discard all" {
                        self.statements.clear();
                        conn.prepared.clear();
                    }
                    // The server refuses both in an aborted block, and DISCARD ALL in any.
                    let refused = match self.status {
                        TxStatus::Failed => true,
                        TxStatus::InBlock => lower == "discard all",
                        TxStatus::Idle => false,
                    };
                    if !refused {
                        self.reset_proxy_settings();
                    }
                } else if lower == "deallocate all" || lower == "deallocate prepare all" {
                    if simple {
                        self.drop_all_unconfirmed();
                    }
                } else {
                    return Some(lower.starts_with("deallocate") || lower.starts_with("discard"));
                }
            }
            _ => {}
        }
        Some(true)
    }

    /// A simple Query's `DEALLOCATE ALL` or `DISCARD ALL`, about to be sent: the client's
    /// statements leave its view now, and come back if the server refuses it (25P02 in an
    /// aborted block, 25001 for `DISCARD ALL` in any block) or skips it, which only the missing
    /// CommandComplete tells (`replies.rs`).
    fn drop_all_unconfirmed(&mut self) {
        let held = std::mem::take(&mut self.statements);
        let attached = self.backend.as_mut().expect("attached");
        let mut effects = all_dropped(held);
        // Undone, the connection holds them again as it did (seed 20261214677: left in doubt
        // after a refusal, a Bind of one had a Parse in front, refused in the aborted block
        // with 25P02 where PostgreSQL answers the Bind itself).
        for effect in &mut effects {
            effect.held_before = attached.conn.prepared.get(&effect.name).cloned();
            effect.held_after = effect
                .held_before
                .as_ref()
                .map(|_| super::preparation::IN_DOUBT.to_string());
        }
        attached.unconfirmed.push_back(Unconfirmed {
            segment: attached.segments_sent,
            answer: b'C',
            effects,
            position: None,
        });
        all_in_doubt(&mut attached.conn);
    }

    /// The server's session settings, read back ([`Duty::Resync`]) once the client's
    /// transaction is over; `status` is the server's status after the read. Read outside a
    /// transaction block they are the client's settings from now on; a failed read leaves them
    /// in doubt for the next transaction's end.
    ///
    /// A startup setting the server has no session value for was returned to the server login's
    /// value (a RESET, `RESET ALL` or `SET ... TO DEFAULT` the proxy could not send as the
    /// startup value's SET, such as one among the statements of a Query): a direct connection
    /// would be back at the client's startup value, so that is the client's setting. Returns
    /// those settings, to apply again ([`Session::restore_settings`]). Read inside a transaction
    /// block (behind such a Query there, `client_ready`), only that comes of it: SET is undone by
    /// a ROLLBACK just as the client's RESET is, and the read at the block's end settles the
    /// settings.
    pub(super) fn on_resync(&mut self, status: TxStatus, answer: ProxyAnswer) -> Option<Settings> {
        let attached = self.backend.as_mut().expect("attached");
        attached.reset_in_doubt = false;
        if answer.failed || !matches!(status, TxStatus::Idle | TxStatus::InBlock) {
            return None;
        }
        let settings: Settings = answer
            .rows
            .into_iter()
            .filter_map(|row| match row.as_slice() {
                [Some(name), Some(value)] => {
                    let name = name.to_ascii_lowercase();
                    let statement = super::startup::set_config_statement(&name, value);
                    Some((name, statement))
                }
                _ => None,
            })
            .collect();
        let missing: Settings = self
            .startup_settings
            .iter()
            .filter(|(name, _)| !settings.contains_key(name))
            .map(|(name, statement)| (name.clone(), statement.clone()))
            .collect();
        if status == TxStatus::Idle {
            let mut wanted = settings.clone();
            for (name, statement) in &missing {
                wanted.insert(name.clone(), statement.clone());
            }
            attached.conn.applied = settings;
            self.settings = wanted;
            self.settings_in_doubt = false;
        }
        (!missing.is_empty()).then_some(missing)
    }

    /// Applies `missing` (startup settings, see [`Session::on_resync`]) at once, behind the
    /// read-back that found them missing and before the client hears its ReadyForQuery (held
    /// while this segment trails), so it is told of no value it never had. Where the client's
    /// next flight is already on the server (or the server is inside a batch or a COPY), the
    /// connection's books say they are not applied, and that flight's preparation applies them.
    pub(super) async fn restore_settings(&mut self, missing: Settings) -> Result<(), ClientError> {
        let attached = self.backend.as_mut().expect("attached");
        if attached.client_segments_due() > 0 || !attached.may_add_frames() {
            return Ok(());
        }
        let Some(sql) = settings_sql(&missing, &Settings::new()) else {
            return Ok(());
        };
        if self.status == TxStatus::Idle {
            // In a transaction block the books stay as they were until its end's read-back.
            for (name, statement) in &missing {
                attached
                    .conn
                    .applied
                    .insert(name.clone(), statement.clone());
            }
        }
        if let Err(e) = attached.send_query(&sql, Owner::Proxy(Duty::Restore)).await {
            return self.backend_lost(e).await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontend::client_statement::tests::defined;

    fn statement(query: &str, class: Class) -> ClientStatement {
        ClientStatement {
            class,
            ..defined(query)
        }
    }

    /// Parse, Bind and Execute of each statement, unsynced, with the statement each message
    /// finds (`None`: one the client does not hold).
    fn run(statements: &[Option<&ClientStatement>], in_block: bool) -> UnsyncedRun {
        let mut flight = Vec::new();
        let mut per_message = Vec::new();
        for s in statements {
            flight.push(FrontendMessage::Bind {
                portal: String::new(),
                statement: String::new(),
                rest: bytes::Bytes::new(),
            });
            flight.push(FrontendMessage::Execute {
                portal: String::new(),
                max_rows: 0,
            });
            per_message.extend([*s, None]);
        }
        flight.push(FrontendMessage::Flush);
        per_message.push(None);
        Session::unsynced_run(&flight, &per_message, in_block)
    }

    #[test]
    fn a_begin_nothing_after_may_end_leaves_the_batch_in_its_block() {
        let begin = statement("BEGIN", Class::Begin { read_only: false });
        let insert = statement("INSERT INTO t VALUES (1)", Class::Write);
        let savepoint = statement("SAVEPOINT a", Class::TransactionLocal);
        let commit = statement("COMMIT", Class::TransactionControl);
        let maybe = statement("SELECT f(); COMMIT", Class::Write);
        let in_block =
            |statements: &[Option<&ClientStatement>], before| run(statements, before).in_block;
        assert!(in_block(&[Some(&begin)], false));
        assert!(in_block(
            &[Some(&insert), Some(&begin), Some(&savepoint)],
            false
        ));
        assert!(in_block(&[Some(&begin), Some(&insert)], false));
        assert!(!in_block(&[Some(&begin), Some(&commit)], false));
        assert!(!in_block(&[Some(&begin), Some(&maybe)], false));
        // A statement the client does not hold may be anything.
        assert!(!in_block(&[Some(&begin), None], false));
        // A batch already in its block stays there, or leaves it.
        assert!(in_block(&[Some(&insert)], true));
        assert!(!in_block(&[Some(&commit)], true));
        assert!(!in_block(&[Some(&insert)], false));
        assert_eq!(run(&[Some(&insert)], false).executed, Some(false));
        assert_eq!(
            run(&[Some(&insert), Some(&begin)], false).executed,
            Some(true)
        );
        assert_eq!(run(&[], false).executed, None);
    }
}
