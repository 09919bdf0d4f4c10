//! Replies: what comes back from the attached backend and where it goes. Client-owned replies
//! are relayed (flushed when nothing more is buffered), proxy-owned ones are consumed, a held-back
//! replica reply is released or — on 25006 — discarded and its flight re-run on the primary, and
//! a broken backend turns into errors for the replies still due. Sending is `flight.rs`.

use lsngate_core::{Fallback, Lsn, Replay, Verdict};
use tokio::time::Instant;

use super::attached::{Attached, Batch, Duty, Owner, ProxyAnswer};
use super::causal::{Discard, ReadWait};
use super::effects::RESYNC_SQL;
use super::error::ClientError;
use super::session::Session;
use crate::backend::{BackendError, Target};
use crate::causal::{Floor, Outcome};
use crate::net::backend::TxStatus;
use crate::net::sqlstate;
use crate::net::{BackendMessage, ErrorFields, Frame, FrontendMessage};

/// Waits until the attached backend has sent a whole frame. While a wait's answer is due, only
/// until the wait's deadline: a replica that stops answering (frozen, cut off) is given up rather
/// than waited on past the read's budget. Cancel-safe.
pub(super) async fn fill_attached(attached: &mut Attached) -> Result<(), BackendError> {
    let Some(deadline) = attached.pending_verdict().map(|v| v.deadline) else {
        return attached.conn.fill().await;
    };
    match crate::timer::timeout_at(deadline, attached.conn.fill()).await {
        Ok(filled) => filled,
        Err(_) => Err(BackendError::Lost {
            node: attached.conn.address.clone(),
            why: "no answer to the wait within its budget; the replica is given up".into(),
        }),
    }
}

/// The next frame from an attached backend, within a wait's deadline (see [`fill_attached`]).
pub(super) async fn recv_attached(attached: &mut Attached) -> Result<Frame, BackendError> {
    fill_attached(attached).await?;
    attached.conn.next_frame().expect("filled")
}

/// Parameters a server reports about itself, not about the session: a replica's `in_hot_standby`
/// is not the client's to hear of (directly it talks to the primary), nor are differences
/// between the servers behind the proxy.
const SERVER_FACTS: &[&str] = &[
    "in_hot_standby",
    "server_version",
    "server_encoding",
    "integer_datetimes",
];

/// How many connections' reported values a session remembers its client's covering (see
/// `Session::reported_covers`): about a pool's worth.
const REPORTED_COVERS: usize = 64;

/// Replies to the client's statements that need no decision by the proxy: relayed byte for byte.
/// (Not ParameterStatus: see `Session::report_changes`.)
/// Replies to a proxy segment that `on_proxy_reply` ignores: Parse/Bind/CloseComplete,
/// CommandComplete, RowDescription, NoData, ParameterDescription, EmptyQuery, PortalSuspended.
/// (Rows, errors, notices, ParameterStatus and ReadyForQuery each mean something.)
fn ignored_by_proxy(tag: u8) -> bool {
    matches!(
        tag,
        b'1' | b'2' | b'3' | b'C' | b'T' | b'n' | b't' | b'I' | b's'
    )
}

/// The largest held-back reply buffer a session keeps for its next replica read.
const SPARE_HELD_MAX: usize = 16 * 1024;

fn relayed_as_is(tag: u8) -> bool {
    // RowDescription, DataRow, CommandComplete, EmptyQuery, NoData, ParameterDescription,
    // Parse/Bind/CloseComplete, PortalSuspended, Notice, Notification, CopyOutResponse,
    // CopyData, CopyDone, FunctionCallResponse.
    matches!(
        tag,
        b'T' | b'D'
            | b'C'
            | b'I'
            | b'n'
            | b't'
            | b'1'
            | b'2'
            | b'3'
            | b's'
            | b'N'
            | b'A'
            | b'H'
            | b'd'
            | b'c'
            | b'V'
    )
}

impl Session {
    /// Tells the client, in front of a ReadyForQuery of its own, of every reported value of its
    /// server connection that differs from what the client was told. PostgreSQL (14 and later)
    /// reports changed `GUC_REPORT` settings right before ReadyForQuery, only where the value
    /// differs from the one it last reported on that connection; a pooled connection last
    /// reported to whichever client or proxy segment ran there before, so its own reports are
    /// neither all nor only the client's changes. Its values at the client's ReadyForQuery are
    /// the client's session's (the proxy makes it carry exactly the client's settings), so the
    /// client hears of exactly the changes a direct connection would report.
    pub(super) fn report_changes(&mut self) {
        let Some(b) = self.backend.as_ref() else {
            return;
        };
        let stamp = b.conn.reported_stamp;
        if self.reported_covers.contains(&stamp) {
            return;
        }
        let mut told = false;
        for (name, value) in &b.conn.reported {
            if SERVER_FACTS.contains(&name.as_str())
                || self
                    .reported
                    .get(name)
                    .is_some_and(|v| crate::net::same_text(v, value))
            {
                continue;
            }
            self.io
                .queue(&crate::net::backend::build::parameter_status(name, value));
            self.reported.insert(name.clone(), value.clone());
            told = true;
        }
        if told || self.reported_covers.len() >= REPORTED_COVERS {
            self.reported_covers.clear();
        }
        self.reported_covers.push(stamp);
    }

    /// Queues a ReadyForQuery the proxy answers (`status`), with what changed in the server's
    /// reported settings ahead of it, as PostgreSQL reports them (a failed block's end undoes
    /// a SET: `Session::abort_server_block`).
    pub(super) fn queue_ready(&mut self, status: TxStatus) {
        self.report_changes();
        self.io.queue_ready(status);
    }

    /// Relays replies until none are due. Not into a COPY FROM STDIN the client has not ended
    /// (the server answers nothing until it does); one it ended (CopyDone, CopyFail) is waited
    /// for, so what the session does next never takes the COPY's answer for its own.
    pub(super) async fn drain(&mut self) -> Result<(), ClientError> {
        while let Some(b) = self.backend.as_mut() {
            if b.expect.is_empty() || (b.copy.running && b.copy.closed) {
                break;
            }
            let frame = recv_attached(b).await;
            self.on_backend(frame).await?;
        }
        Ok(())
    }

    /// Relays replies until the server has answered every extended-protocol message sent since
    /// the last Sync, or failed one. True when it failed one: the server then skips everything up
    /// to the next Sync, a simple Query included, so the session must not expect an answer to
    /// one. What the session answers itself (proxy commands) waits here too, so it is never
    /// queued ahead of the server's answers to messages sent before it.
    pub(super) async fn settle_unsynced(&mut self) -> Result<bool, ClientError> {
        loop {
            let Some(b) = self.backend.as_mut() else {
                return Ok(false);
            };
            match b.batch {
                Batch::Open { skipping: true, .. } => return Ok(true),
                Batch::Open { due, .. } if due > 0 || !b.expect.is_empty() => {}
                _ => return Ok(false),
            }
            let frame = recv_attached(b).await;
            self.on_backend(frame).await?;
        }
    }

    /// Handles the replies the attached backend already sent, without another turn of the
    /// session loop. Runs of ordinary replies to the client's own statements (rows, command
    /// completions, notices…) are copied to the client as they are, or, for a replica read that
    /// may still run again on the primary, to the replies it holds back
    /// ([`RetryBuffer`](super::attached::RetryBuffer));
    /// everything that needs a decision (ReadyForQuery, errors, COPY IN, the proxy's own
    /// segments) goes through `on_backend` one by one.
    pub(super) async fn on_buffered_replies(&mut self) -> Result<(), ClientError> {
        loop {
            let pinned = self.pinned;
            let Some(b) = self.backend.as_mut() else {
                return Ok(());
            };
            if !(b.awaiting_replies() || pinned) {
                return Ok(());
            }
            if matches!(b.expect.front(), Some(Owner::Proxy(_))) {
                // What `on_proxy_reply` ignores of a proxy segment's answer goes unread.
                b.conn.skip_plain(ignored_by_proxy);
            }
            let plain_relay = b.expect.front() == Some(&Owner::Client)
                && !b.discarding()
                && b.describing.is_empty()
                && b.reset_rewritten.is_none()
                && b.substitute.is_none()
                && b.unprepared_in_aborted_block.is_none()
                && b.reset_tags.is_empty()
                && !b.copy.running
                && b.unconfirmed.is_empty()
                // Its CommandComplete confirms it (`on_backend`).
                && b.pin_unconfirmed.is_none();
            if plain_relay && let Some(retry) = b.retry.as_mut() {
                // Held back whole (one copy, as to the client) until the read is known not to
                // need its re-run on the primary (`client_ready`), or there is too much to hold.
                b.conn.take_plain(&mut retry.held, relayed_as_is);
                if retry.over(self.config.retry_buffer_size) {
                    let retry = b.retry.take().expect("checked");
                    self.io.out().extend_from_slice(&retry.held);
                    self.io.flush().await?;
                }
            } else if plain_relay && b.conn.take_plain(self.io.out(), relayed_as_is) > 0 {
                let b = self.backend.as_ref().expect("attached");
                if !b.conn.has_frame() || self.io.queued() > 64 * 1024 {
                    self.io.flush().await?;
                }
            }
            let b = self.backend.as_mut().expect("attached");
            // Not behind held-back replies: `client_ready` hands them over first.
            let last_plain = plain_relay
                && b.retry.is_none()
                && b.expect.len() == 1
                && b.copy.is_idle()
                && b.read.is_none()
                && !self.floors.guard_slot
                && !self.settings_in_doubt;
            if last_plain && let Some(status) = b.conn.take_ready() {
                // The end of a transaction nothing more is due for: relayed as is, and the
                // connection goes back to the pool before the client hears of it.
                b.expect.pop_front();
                b.error_relayed = false;
                // As on the slow path (`client_ready`): a flight sent next in a block opened
                // since is not taken as one that may commit.
                b.all_answered();
                self.block_ended(status);
                self.status = status;
                self.queue_ready(status);
                self.maybe_release();
                self.io.flush().await?;
                continue;
            }
            let b = self.backend.as_mut().expect("attached");
            let Some(frame) = b.conn.next_frame() else {
                return Ok(());
            };
            self.on_backend(frame).await?;
        }
    }

    /// Handles one reply from the attached backend.
    pub(super) async fn on_backend(
        &mut self,
        frame: Result<Frame, BackendError>,
    ) -> Result<(), ClientError> {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => return self.backend_lost(e).await,
        };
        let attached = self.backend.as_mut().expect("replies only while attached");
        let message = match attached.conn.parse(&frame) {
            Ok(m) => m,
            Err(e) => return self.backend_lost(e).await,
        };
        let owner = attached.expect.front().copied().unwrap_or(Owner::Client);
        tracing::trace!(tag = %(frame.tag as char), ?owner, expect = attached.expect.len(), "← backend");
        if let Owner::Proxy(duty) = owner {
            return self.on_proxy_reply(duty, &frame, message).await;
        }
        if attached.discarding() {
            // The replica's answer to a read whose wait failed: never shown to the client.
            if let BackendMessage::ReadyForQuery(status) = message {
                attached.expect.pop_front();
                attached.error_relayed = false;
                // Run again elsewhere: what it did here stays as recorded.
                let done = attached.segments_done();
                while attached
                    .unconfirmed
                    .front()
                    .is_some_and(|u| u.segment < done)
                {
                    attached.unconfirmed.pop_front();
                }
                if status != TxStatus::Idle {
                    // It opened a transaction block the client never heard of (`BEGIN READ
                    // ONLY`): ended here, before the flight runs again, on this connection or
                    // (once it is back in the pool) on another client's.
                    let rollback = attached.send_query("ROLLBACK", Owner::Proxy(Duty::Rollback));
                    if let Err(e) = rollback.await {
                        return self.backend_lost(e).await;
                    }
                }
                if attached.expect.is_empty() {
                    return self.after_discarded().await;
                }
            }
            return Ok(());
        }
        if attached.substitute.is_some() {
            // The stand-in for a Query the proxy answers itself (`Session::answer_query`):
            // its answer (EmptyQueryResponse, a CommandComplete, or the error it was made to
            // raise) is replaced, its ReadyForQuery relayed as the server's transaction status.
            // Refused as in an aborted block, it is the server's refusal the client hears.
            let refused = matches!(message, BackendMessage::ErrorResponse(ref e)
                if e.sqlstate() == Some(sqlstate::IN_FAILED_SQL_TRANSACTION));
            match frame.tag {
                b'E' if refused => attached.substitute = None,
                b'I' | b'E' | b'C' => {
                    let substitute = attached.substitute.take().expect("checked");
                    if let Some((floors, hint)) = substitute.installs {
                        self.floors = floors;
                        self.hint = hint;
                    }
                    substitute.answer.iter().for_each(|f| self.io.queue(f));
                    return Ok(());
                }
                b'Z' => attached.substitute = None,
                b'N' | b'S' | b'A' => {}
                _ => return Ok(()),
            }
        }
        if let BackendMessage::ParameterStatus { .. } = message {
            // Recorded by the connection; the client hears of it at its ReadyForQuery, if it
            // is news to the client (`report_changes`).
            return Ok(());
        }
        if !attached.unconfirmed.is_empty() {
            // Which message an error refuses, for a Parse of the unnamed statement among them.
            attached.count_answer(frame.tag);
        }
        let mut frame = frame;
        if !attached.reset_tags.is_empty() {
            // Which Execute this answers (see `Attached::reset_tags`).
            let tags = &mut attached.reset_tags;
            match frame.tag {
                b'C' | b's' | b'I' if matches!(tags.front(), Some(Some(_))) => {
                    let reset = tags.pop_front() == Some(Some(true));
                    if reset && frame.tag == b'C' {
                        frame = crate::net::backend::build::command_complete("RESET");
                    }
                }
                // The server skips the rest of the segment's messages: they get no answer.
                b'E' => {
                    while matches!(tags.front(), Some(Some(_))) {
                        tags.pop_front();
                    }
                }
                b'Z' => while let Some(Some(_)) = tags.pop_front() {},
                _ => {}
            }
        }
        if let Some(tag) = attached.reset_rewritten {
            match frame.tag {
                b'T' | b'D' => return Ok(()),
                b'C' => {
                    return self
                        .relay(crate::net::backend::build::command_complete(tag))
                        .await;
                }
                b'Z' => attached.reset_rewritten = None,
                _ => {}
            }
        }
        if !attached.describing.is_empty() && matches!(frame.tag, b'T' | b'n' | b'E' | b'Z') {
            self.note_shape(frame.tag, &frame.body);
        }
        let attached = self.backend.as_mut().expect("attached");
        if attached.expect.is_empty() {
            // An answer to the extended messages sent since the last Sync (see
            // `settle_unsynced`).
            attached.batch.heard(frame.tag);
        }
        if matches!(frame.tag, b'1' | b'3' | b'C')
            && attached.unconfirmed.front().is_some_and(|u| {
                u.segment == attached.segments_done()
                    && u.answer == frame.tag
                    && (frame.tag != b'C'
                        || frame.body.starts_with(b"DEALLOCATE")
                        || frame.body.starts_with(b"DISCARD"))
            })
        {
            // ParseComplete and CloseComplete answer the client's Parses and Closes in order,
            // `DEALLOCATE ALL`'s (or `DISCARD ALL`'s) CommandComplete its Execute or Query.
            attached.unconfirmed.pop_front();
        }
        if frame.tag == b'C' && attached.pin_unconfirmed.is_some() && pins(&frame.body) {
            attached.pin_unconfirmed = None;
        }
        attached.copy.heard(frame.tag);
        match message {
            BackendMessage::ReadyForQuery(status) => {
                attached.expect.pop_front();
                attached.error_relayed = false;
                let done = attached.segments_done();
                if attached
                    .unprepared_in_aborted_block
                    .is_some_and(|segment| segment < done)
                {
                    attached.unprepared_in_aborted_block = None;
                }
                if !attached.unconfirmed.is_empty() {
                    self.undo_unconfirmed();
                }
                let attached = self.backend.as_mut().expect("attached");
                if attached
                    .pin_unconfirmed
                    .is_some_and(|segment| segment < done)
                {
                    // The statement that pinned the session did not run there: nothing holds
                    // the session to this connection (a pin to a replica would send its writes
                    // there, 25006).
                    attached.pin_unconfirmed = None;
                    self.pinned = false;
                }
                return self.client_ready(frame, status).await;
            }
            BackendMessage::CopyInResponse | BackendMessage::CopyBothResponse => {
                if attached.copy.copy_started(&mut attached.expect) {
                    attached.batch.open();
                }
                if let Some(retry) = attached.retry.take() {
                    self.io.out().extend_from_slice(&retry.held);
                }
            }
            BackendMessage::ErrorResponse(ref e)
                if e.sqlstate() == Some(sqlstate::READ_ONLY_SQL_TRANSACTION) =>
            {
                if let Some(retry) = attached.retry.as_mut() {
                    retry.read_only_violation = true;
                }
                attached.error_relayed = true;
            }
            BackendMessage::ErrorResponse(ref e)
                if e.sqlstate() == Some(sqlstate::INVALID_SQL_STATEMENT_NAME)
                    && attached.unprepared_in_aborted_block == Some(attached.segments_done()) =>
            {
                attached.unprepared_in_aborted_block = None;
                attached.error_relayed = true;
                let (code, message) = super::commands::ABORTED;
                return self
                    .relay(ErrorFields::new("ERROR", code, message).to_frame(b'E'))
                    .await;
            }
            BackendMessage::ErrorResponse(mut e) => {
                attached.error_relayed = true;
                // A SET recorded at send time may not have run (see `Attached::effects_due`).
                self.settings_in_doubt |= attached.effects_due;
                if let Some(changed) = self.changed_plan_error(&e) {
                    return self.relay(changed.to_frame(b'E')).await;
                }
                let attached = self.backend.as_mut().expect("attached");
                if matches!(e.get(b'S'), Some("FATAL" | "PANIC")) {
                    attached.doomed = true;
                    if attached.may_commit && attached.target == crate::backend::Target::Primary {
                        // A statement that may commit, ended by the server (a switchover's fast
                        // shutdown, 57P01): it may have committed first — PostgreSQL ends a
                        // commit waiting for its synchronous standby this way, after committing
                        // locally. Its outcome is unknown, and the client is told so (08006),
                        // not "terminating connection", which reads as "it did not happen".
                        let said = format!(
                            "{} {}",
                            e.sqlstate().unwrap_or("?"),
                            e.get(b'M').unwrap_or("")
                        );
                        let message = format!(
                            "lsngate: the server ended the connection while it ran your statement \
                             ({said}); its outcome is unknown: it may or may not have been \
                             committed, so it was not retried; check before running it again"
                        );
                        return self
                            .relay(
                                ErrorFields::new("ERROR", sqlstate::CONNECTION_FAILURE, message)
                                    .to_frame(b'E'),
                            )
                            .await;
                    }
                    // The server connection ends, the client's does not: to the client this is
                    // an ERROR, followed by ReadyForQuery when the loss is noticed.
                    for (code, value) in e.fields.iter_mut() {
                        if *code == b'S' || *code == b'V' {
                            *value = "ERROR".into();
                        }
                    }
                    return self.relay(e.to_frame(b'E')).await;
                }
            }
            _ => {}
        }
        self.relay(frame).await
    }

    /// A client segment ended: its Parses and Closes still unanswered did not happen (they
    /// failed, or the server skipped them after an error, as PostgreSQL skips everything up to
    /// the Sync). Their effects are undone, latest first: what the name was before one becomes
    /// what it was before the next change of the name still unanswered (or still pending in the
    /// session), else the client's view (unless the flight is about to run again on the
    /// primary, which keeps it) and the connection's record of what it holds.
    fn undo_unconfirmed(&mut self) {
        let attached = self.backend.as_mut().expect("attached");
        let done = attached.segments_done();
        let rerun = attached
            .retry
            .as_ref()
            .is_some_and(|r| r.read_only_violation);
        let mut undone = Vec::new();
        while attached
            .unconfirmed
            .front()
            .is_some_and(|u| u.segment < done)
        {
            if let Some(u) = attached.unconfirmed.pop_front() {
                // A Parse of the unnamed statement refused itself dropped the one before it;
                // one skipped after another message's error left it.
                let refused = u
                    .position
                    .is_some_and(|p| attached.refused_at == Some((u.segment, p)));
                undone.extend(u.effects.into_iter().map(|e| (e, refused)));
            }
        }
        for (mut effect, refused) in undone.into_iter().rev() {
            if effect.name.is_empty() {
                if refused {
                    effect.view_before = None;
                    effect.unnamed_held_before = Some(super::preparation::IN_DOUBT.into());
                }
                // Skipped, the Parse left the connection's unnamed statement as it was (seed
                // 20261218660: taken as in doubt, a Describe of it in the aborted block had a
                // Parse in front, refused with 25P02, where PostgreSQL describes the one there).
                // Refused, what it holds is not known: the next flight that uses the client's
                // parses it in front (or closes it).
                let conn = &mut attached.conn;
                if conn.unnamed.as_deref() == effect.view_after.as_deref() {
                    conn.unnamed = effect.unnamed_held_before.clone();
                }
            }
            let later = attached
                .unconfirmed
                .iter_mut()
                .flat_map(|u| u.effects.iter_mut())
                .find(|e| e.name == effect.name);
            if let Some(later) = later {
                later.view_before = effect.view_before;
                later.held_before = effect.held_before;
                later.unnamed_held_before = effect.unnamed_held_before;
                continue;
            }
            let prepared = &mut attached.conn.prepared;
            if !effect.name.is_empty() && prepared.get(&effect.name) == effect.held_after.as_ref() {
                match effect.held_before {
                    Some(identity) => prepared.insert(effect.name.clone(), identity),
                    None => prepared.remove(&effect.name),
                };
            }
            if rerun {
                continue;
            }
            if let Some(before) = self.log.before.iter_mut().find(|(n, _)| *n == effect.name) {
                // Messages still pending touched the name: they start from what it really is,
                // and the view after them is replayed from there.
                before.1 = effect.view_before;
                if effect.name.is_empty() {
                    // They parsed or closed the unnamed statement (that is what put it in the
                    // log): the view after them does not depend on what it was before.
                    continue;
                }
                let after = super::pipeline::replay(&self.log, &self.pending, &effect.name);
                match after {
                    Some(s) => self.statements.insert(effect.name, s),
                    None => self.statements.remove(&effect.name),
                };
                continue;
            }
            if effect.name.is_empty() {
                if self.unnamed.as_ref().map(|s| s.identity()) == effect.view_after.as_deref() {
                    self.unnamed = effect.view_before;
                }
                continue;
            }
            let now = self.statements.get(&effect.name).map(|s| s.identity());
            if now == effect.view_after.as_deref() {
                match effect.view_before {
                    Some(s) => self.statements.insert(effect.name, s),
                    None => self.statements.remove(&effect.name),
                };
            }
        }
    }

    async fn relay(&mut self, frame: Frame) -> Result<(), ClientError> {
        let limit = self.config.retry_buffer_size;
        let attached = self.backend.as_mut().expect("attached");
        if let Some(retry) = attached.retry.as_mut() {
            frame.encode(&mut retry.held);
            if retry.over(limit) {
                // Too much to hold: hand it over; a later 25006 then reaches the client as is.
                let retry = attached.retry.take().expect("checked");
                self.io.out().extend_from_slice(&retry.held);
            } else {
                return Ok(());
            }
        } else {
            self.io.queue(&frame);
        }
        let more_buffered = self.backend.as_ref().is_some_and(|b| b.conn.has_frame());
        if !more_buffered || self.io.queued() > 64 * 1024 {
            self.io.flush().await?;
        }
        Ok(())
    }

    /// Before the client hears `status`: a transaction block on the primary that ends here with
    /// no commit position due behind it leaves the client's commit position unknown, so its next
    /// read asks the primary for one. A position is taken behind a flight that ends a block
    /// where its first statement does (`COMMIT`); one such as `COMMIT; RESET …` as a Query, or
    /// `INSERT …; COMMIT`, is classified a write and inside a block took none: the next read went
    /// to a replica 50 ms behind without the block's rows.
    fn block_ended(&mut self, status: TxStatus) {
        let attached = self.backend.as_ref().expect("attached");
        let ended = self.status != TxStatus::Idle
            && status == TxStatus::Idle
            && attached.target == Target::Primary
            && self.floors.mode.tracks_positions();
        let position_due = attached
            .expect
            .iter()
            .any(|o| matches!(o, Owner::Proxy(Duty::Position { wrote: true, .. })));
        if ended && !position_due {
            for unknown in self.floors.commit_lost(&self.proxy.causal) {
                self.io.queue(&unknown);
            }
        }
    }

    async fn client_ready(&mut self, frame: Frame, status: TxStatus) -> Result<(), ClientError> {
        let attached = self.backend.as_mut().expect("attached");
        if let Some(retry) = attached.retry.take() {
            if retry.read_only_violation
                && status == TxStatus::Idle
                && let Some((flight, class, log)) = attached.take_rerun()
            {
                metrics::counter!("lsngate_proxy_retries_total", "reason" => "read_only")
                    .increment(1);
                tracing::debug!("replica refused a write (25006); re-running on the primary");
                attached.read = None;
                // dispatch_to drains the replica's trailing segments before it lets go of it
                let route = super::flight::Route {
                    log: Some(log),
                    ..super::flight::Route::to(Some(Target::Primary))
                };
                return Box::pin(self.dispatch_to(flight, class, route)).await;
            }
            self.io.out().extend_from_slice(&retry.held);
            // Kept for the next read unless a large answer grew it.
            if retry.held.capacity() <= SPARE_HELD_MAX {
                let mut held = retry.held;
                held.clear();
                self.spare_held = held;
            }
        }
        self.block_ended(status);
        self.status = status;
        let attached = self.backend.as_mut().expect("attached");
        let last = attached.client_segments_due() == 0;
        let held = attached.copy.on_ready();
        if !held.is_empty()
            && let Err(e) = attached.conn.send(&held).await
        {
            return self.backend_lost(e).await;
        }
        if last {
            self.backend.as_mut().expect("attached").all_answered();
            self.end_fallback();
        }
        let attached = self.backend.as_mut().expect("attached");
        // Inside a transaction block the settings are not final (a ROLLBACK may undo them), but
        // a RESET among the statements of a Query has already taken a startup setting to the
        // server login's value: read back now too, to apply the startup value in the block
        // before the client hears the Query is done (`on_resync`).
        let read_back = match status {
            TxStatus::Idle => self.settings_in_doubt,
            TxStatus::InBlock => attached.reset_in_doubt,
            _ => false,
        };
        if last
            && read_back
            && !attached.expect.contains(&Owner::Proxy(Duty::Resync))
            // Not into an extended batch still open or a COPY still running (the server would
            // take the Query as COPY data): the next ReadyForQuery of an idle server reads them.
            && !attached.batch.is_open()
            && attached.copy.is_idle()
        {
            // The transaction that may have undone a SET is over: read the server's settings
            // back on this connection before it goes back to the pool (and before the client
            // hears the transaction is over, unless a position segment already holds that).
            attached.conn.unnamed = None;
            attached.expect.push_back(Owner::Proxy(Duty::Resync));
            let resync = FrontendMessage::Query(RESYNC_SQL.to_string()).to_frame();
            if let Err(e) = attached.conn.send(std::slice::from_ref(&resync)).await {
                return self.backend_lost(e).await;
            }
            let attached = self.backend.as_mut().expect("attached");
            if !attached.trailing_segment_next() {
                attached.held_ready = Some(frame);
                return Ok(());
            }
        }
        let attached = self.backend.as_mut().expect("attached");
        if attached.trailing_segment_next() {
            // The trailing position follows; the client's floor (and ParameterStatus) first.
            attached.held_ready = Some(frame);
            return Ok(());
        }
        self.report_changes();
        self.io.queue(&frame);
        self.maybe_release();
        self.io.flush().await?;
        Ok(())
    }

    /// One reply to a segment the proxy added.
    async fn on_proxy_reply(
        &mut self,
        duty: Duty,
        frame: &Frame,
        message: BackendMessage,
    ) -> Result<(), ClientError> {
        let attached = self.backend.as_mut().expect("attached");
        let status = match message {
            BackendMessage::Other(b'D') => {
                let row = crate::net::backend::data_row(&frame.body);
                attached.answer.rows.extend(row);
                return Ok(());
            }
            BackendMessage::ErrorResponse(e) if duty == Duty::Resync => {
                // The settings stay in doubt; the next transaction's end reads them again.
                tracing::warn!(node = %attached.conn.address, "reading back the session's settings failed: {:?}", e.get(b'M'));
                attached.answer.failed = true;
                return Ok(());
            }
            // The failure it was sent for.
            BackendMessage::ErrorResponse(_) if duty == Duty::Abort => return Ok(()),
            // The name was taken already.
            BackendMessage::ErrorResponse(ref e)
                if duty == Duty::Take
                    && e.sqlstate() == Some(sqlstate::DUPLICATE_PREPARED_STATEMENT) =>
            {
                return Ok(());
            }
            BackendMessage::ErrorResponse(ref e)
                if duty == Duty::Prepare
                    && e.sqlstate() == Some(sqlstate::IN_FAILED_SQL_TRANSACTION) =>
            {
                // Statements put in front of the client's next segment inside a block that had
                // failed meanwhile: none of them was parsed. What the connection holds is in
                // doubt (the next flight that needs one parses it again), and the 26000 that
                // segment meets is the server's refusal of the aborted block.
                attached.unprepared_in_aborted_block = Some(attached.segments_done());
                attached
                    .conn
                    .prepared
                    .values_mut()
                    .for_each(|identity| *identity = super::preparation::IN_DOUBT.to_string());
                return Ok(());
            }
            BackendMessage::ErrorResponse(e) => {
                if matches!(duty, Duty::Served | Duty::Position { .. }) {
                    crate::causal::sql::forget_probes(&mut attached.conn.prepared);
                }
                // The client's cancel lands on whatever runs on its server connection, which may
                // be the wait: the client asked to stop, so it gets the cancel, not a fallback.
                // (A statement_timeout, also 57014, falls back like a timed-out wait.)
                let message = e.get(b'M').unwrap_or_default();
                if duty == Duty::Verdict
                    && e.sqlstate() == Some(sqlstate::QUERY_CANCELED)
                    && message.contains("user request")
                {
                    attached.answer.cancelled = Some(message.to_string());
                }
                tracing::warn!(node = %attached.conn.address, ?duty, "statement lsngate added failed: {:?}", e.get(b'M'));
                return Ok(());
            }
            BackendMessage::ReadyForQuery(status) => status,
            BackendMessage::NoticeResponse(_) => {
                // Asynchronous server messages belong to the client whoever's segment it is.
                self.io.queue(frame);
                return Ok(());
            }
            // Recorded by the connection: the client hears of a change at its own
            // ReadyForQuery (`report_changes`).
            BackendMessage::ParameterStatus { .. } => return Ok(()),
            _ => return Ok(()),
        };
        attached.expect.pop_front();
        attached.error_relayed = false;
        let answer = std::mem::take(&mut attached.answer);
        let text = |i: usize| answer.row().and_then(|r| r.get(i).cloned().flatten());
        let (node, server) = (attached.conn.node, attached.conn.facts.server.clone());
        let causal = &self.proxy.causal;
        match duty {
            Duty::Prepare
            | Duty::Take
            | Duty::Settings
            | Duty::Restore
            | Duty::Abort
            | Duty::Rollback
            | Duty::Begin => {}
            Duty::Resync => {
                if let Some(missing) = self.on_resync(status, answer) {
                    self.restore_settings(missing).await?;
                }
            }
            Duty::Verdict => return self.on_verdict(answer).await,
            Duty::Served => {
                let columns = answer.row().map(crate::net::backend::columns);
                let replay = columns.map(|r| Replay::from_row(&r)).unwrap_or_default();
                if let Some(lsn) = replay.replayed {
                    causal.watcher.observe_replayed(node, &server, lsn);
                    self.on_served(lsn);
                }
                if replay.in_recovery == Some(false)
                    && let Some(n) = self.proxy.nodes.get(node)
                {
                    n.request_check();
                }
            }
            Duty::Position { wrote, number } => {
                let lsn = text(0).and_then(|t| Lsn::parse(&t).ok());
                if lsn.is_none() && wrote {
                    tracing::warn!(node = %attached.conn.address, "no position after a commit; the client's next read asks the primary for one");
                    for unknown in self.floors.commit_lost(causal) {
                        self.io.queue(&unknown);
                    }
                }
                let facts = &attached.conn.facts;
                let floor = lsn.map(|lsn| Floor {
                    lsn: facts.reachable(lsn),
                    timeline: facts.timeline,
                });
                if let Some(floor) = floor {
                    causal.watcher.observe_primary(Instant::now(), floor.lsn);
                    if let Some(timeline) = floor.timeline {
                        self.proxy.nodes.newest_timeline.observe(timeline);
                    }
                }
                if wrote || floor.is_some() {
                    // Before the client's ReadyForQuery, like its own floor: the scopes written
                    // under up to this segment (any position taken after a commit is past it),
                    // forgotten when a commit's position is unknown.
                    self.scopes_committed(number, floor).await;
                }
                if let Some(floor) = floor {
                    self.on_position(floor, wrote).await?;
                }
            }
        }
        if self
            .backend
            .as_ref()
            .is_some_and(|b| b.discarding() && b.expect.is_empty())
        {
            return self.after_discarded().await;
        }
        let held = self
            .backend
            .as_mut()
            .filter(|b| !b.trailing_segment_next())
            .and_then(|b| b.held_ready.take());
        if let Some(held) = held {
            self.report_changes();
            self.io.queue(&held);
        }
        self.maybe_release();
        self.io.flush().await?;
        Ok(())
    }

    /// The wait (or check) in front of a replica read answered.
    async fn on_verdict(&mut self, mut answer: ProxyAnswer) -> Result<(), ClientError> {
        let attached = self.backend.as_mut().expect("attached");
        let Some(verdict) = attached.take_pending_verdict() else {
            return Ok(());
        };
        let (node, server) = (attached.conn.node, attached.conn.facts.server.clone());
        let causal = &self.proxy.causal;
        let cancelled = answer.cancelled.take();
        let columns = answer.row().map(crate::net::backend::columns);
        let answer = Verdict::from_row(columns.as_deref(), verdict.wait, verdict.floor.lsn);
        causal.stats.record_wait(verdict.sent.elapsed());
        if let Some(message) = cancelled {
            attached.wait = Some(ReadWait::Failed(Discard::Cancelled(message)));
            attached.retry = None;
            return Ok(());
        }
        match answer {
            Verdict::Passed => {
                causal
                    .watcher
                    .observe_replayed(node, &server, verdict.floor.lsn);
                self.record_read(Outcome::Waited);
                self.report_stale(false);
                return Ok(());
            }
            Verdict::NotInRecovery => {
                tracing::warn!(node = %attached.conn.address, "replica answered `not in recovery`; re-detecting roles");
                if let Some(n) = self.proxy.nodes.get(node) {
                    n.request_check();
                }
                attached.wait = Some(ReadWait::Failed(Discard::Rerun));
            }
            Verdict::NotYet { replayed } => {
                if let Some(r) = replayed {
                    causal.watcher.observe_replayed(node, &server, r);
                }
                let poll = !verdict.wait && verdict.polls;
                if poll {
                    attached.wait =
                        Some(ReadWait::Failed(Discard::Poll(verdict.floor, verdict.sent)));
                } else if self.config.causal.fallback == Fallback::Stale {
                    causal.record(Outcome::Stale);
                    if self.scopes.reading {
                        causal.scopes.record_outcome(Outcome::Stale);
                    }
                    let notice = format!(
                        "lsngate: served by replica {} which had not replayed {} within {} ms; the answer may be stale",
                        attached.conn.address,
                        verdict.floor,
                        self.config.causal.wait_timeout.as_millis()
                    );
                    self.io.queue(
                        &ErrorFields::new("NOTICE", sqlstate::WARNING, notice).to_frame(b'N'),
                    );
                    self.report_stale(true);
                    return Ok(());
                } else {
                    attached.wait = Some(ReadWait::Failed(Discard::Rerun));
                }
            }
        }
        let attached = self.backend.as_mut().expect("attached");
        attached.retry = None;
        Ok(())
    }

    /// Every reply of a read whose wait failed has been dropped: fall back, or poll.
    async fn after_discarded(&mut self) -> Result<(), ClientError> {
        let attached = self.backend.as_mut().expect("attached");
        let discard = attached.take_discard();
        let Some(read) = attached.take_read() else {
            return Ok(());
        };
        attached.retry = None;
        match discard {
            Some(Discard::Poll(floor, started)) => {
                Box::pin(self.poll_then_read(read, floor, started)).await
            }
            Some(Discard::Cancelled(message)) => {
                self.answer_flight_error(&read.flight, sqlstate::QUERY_CANCELED, &message)
                    .await?;
                self.maybe_release();
                Ok(())
            }
            _ => Box::pin(self.fall_back(read)).await,
        }
    }
}

/// Whether a CommandComplete's tag is one of a statement that pins the session (see
/// `statement::Class::Pin`).
fn pins(tag: &[u8]) -> bool {
    [&b"PREPARE"[..], b"LISTEN", b"UNLISTEN", b"DECLARE"]
        .iter()
        .any(|t| tag.starts_with(t))
}

/// The reply state machine driven in-process: a session with a backend attached over an
/// in-memory pipe (`BackendConn::in_memory`), whose other end the test answers as the server
/// with hand-built frames, and a client that is another in-memory pipe. No sockets, no server:
/// each test sets up what the proxy sent (the replies it expects, by owner) as the sending side
/// would have, then checks what the client hears, what goes back to the server and what the
/// session records.
#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    use bytes::{BufMut, BytesMut};
    use tokio::io::{AsyncRead, AsyncWriteExt, DuplexStream, ReadBuf};

    use crate::backend::{BackendConn, PooledConn, Target};
    use crate::config::{Config, FileConfig};
    use crate::frontend::attached::{Attached, Batch, Duty, Owner};
    use crate::frontend::client_io::{ClientIo, ClientSocket};
    use crate::frontend::effects::RESYNC_SQL;
    use crate::frontend::session::Session;
    use crate::net::backend::TxStatus;
    use crate::net::backend::build;
    use crate::net::{ErrorFields, Frame, FrontendMessage, decode_frame};
    use crate::proxy::Proxy;

    impl ClientSocket for DuplexStream {}

    /// A session with a primary connection attached, the server's end of that connection and
    /// the client's end of the session.
    struct Harness {
        session: Session,
        server: DuplexStream,
        client: DuplexStream,
    }

    fn harness() -> Harness {
        let config = Config::build(FileConfig {
            primary: Some("postgres://app@127.0.0.1:1/app".into()),
            ..FileConfig::default()
        })
        .expect("config");
        let (client, proxy_end) = tokio::io::duplex(1 << 20);
        let io = ClientIo::new(Box::new(proxy_end), BytesMut::new(), 1 << 20);
        let mut session = Session::in_memory(Proxy::new(config), io);
        let (conn, server) = BackendConn::in_memory(0);
        session.backend = Some(Attached::new(
            PooledConn::unpooled(conn),
            Target::Primary,
            Default::default(),
        ));
        Harness {
            session,
            server,
            client,
        }
    }

    impl Harness {
        fn attached(&mut self) -> &mut Attached {
            self.session.backend.as_mut().expect("attached")
        }

        /// What the sending side records for a flight whose replies `owners` are due, in order.
        fn sent(&mut self, owners: &[Owner]) {
            let attached = self.attached();
            for owner in owners {
                attached.expect.push_back(*owner);
                if *owner == Owner::Client {
                    attached.segments_sent += 1;
                }
            }
        }

        /// The server answers with `frames`.
        async fn server_says(&mut self, frames: &[Frame]) {
            let mut bytes = BytesMut::new();
            frames.iter().for_each(|f| f.encode(&mut bytes));
            self.server.write_all(&bytes).await.expect("pipe");
        }

        /// Handles what the server has sent so far, one reply at a time, without waiting for
        /// more (`drain` would wait for every reply due).
        async fn handle_sent(&mut self) {
            self.attached().conn.fill().await.expect("filled");
            while let Some(frame) = self
                .session
                .backend
                .as_mut()
                .and_then(|b| b.conn.next_frame())
            {
                self.session.on_backend(frame).await.expect("handled");
            }
        }

        /// Everything the client has been sent so far, as frames.
        fn client_heard(&mut self) -> Vec<Frame> {
            frames_in(&mut self.client)
        }

        /// Everything the proxy sent to the server so far, as frames.
        fn server_got(&mut self) -> Vec<Frame> {
            frames_in(&mut self.server)
        }
    }

    /// The frames readable from `pipe` right now (without waiting).
    fn frames_in(pipe: &mut DuplexStream) -> Vec<Frame> {
        let mut bytes = BytesMut::new();
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            let mut chunk = [0u8; 4096];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut *pipe).poll_read(&mut cx, &mut read) {
                Poll::Ready(Ok(())) if !read.filled().is_empty() => {
                    bytes.extend_from_slice(read.filled())
                }
                _ => break,
            }
        }
        let mut frames = Vec::new();
        while let Some(frame) = decode_frame(&mut bytes, usize::MAX).expect("whole frames") {
            frames.push(frame);
        }
        assert!(bytes.is_empty(), "a partial frame");
        frames
    }

    fn tags(frames: &[Frame]) -> String {
        frames.iter().map(|f| f.tag as char).collect()
    }

    fn frame(tag: u8) -> Frame {
        Frame {
            tag,
            body: Default::default(),
        }
    }

    fn data_row(values: &[&str]) -> Frame {
        let mut body = BytesMut::new();
        body.put_i16(values.len() as i16);
        for value in values {
            body.put_i32(value.len() as i32);
            body.put_slice(value.as_bytes());
        }
        Frame {
            tag: b'D',
            body: body.freeze(),
        }
    }

    fn error(severity: &str, code: &str, message: &str) -> Frame {
        ErrorFields::new(severity, code, message).to_frame(b'E')
    }

    fn sqlstate(frame: &Frame) -> Option<String> {
        let fields = ErrorFields::parse(frame.tag, &frame.body).expect("an error or notice");
        fields.sqlstate().map(str::to_string)
    }

    /// The server's answer to the client's Parse, Bind, Execute, Sync of a one-row SELECT.
    fn a_select_s_replies() -> [Frame; 5] {
        [
            frame(b'1'),
            frame(b'2'),
            data_row(&["1"]),
            build::command_complete("SELECT 1"),
            build::ready_for_query(TxStatus::Idle),
        ]
    }

    /// Parse, Bind, Execute, Sync from the client: ParseComplete, BindComplete, a row,
    /// CommandComplete, ReadyForQuery, relayed byte for byte in the server's order; the client's
    /// status is the server's, and an idle connection goes back to the pool.
    #[tokio::test]
    async fn a_client_batch_is_relayed_in_order_and_its_end_frees_the_connection() {
        let mut h = harness();
        h.sent(&[Owner::Client]);
        let replies = a_select_s_replies();
        h.server_says(&replies).await;
        h.session.drain().await.expect("drain");
        assert_eq!(h.client_heard(), replies);
        assert_eq!(h.session.status, TxStatus::Idle);
        assert!(
            h.session.backend.is_none(),
            "released at the transaction's end"
        );
    }

    /// The same replies already buffered take the plain-relay path of `on_buffered_replies`:
    /// the client hears the same bytes.
    #[tokio::test]
    async fn buffered_replies_take_the_plain_relay_with_the_same_bytes() {
        let mut h = harness();
        h.sent(&[Owner::Client]);
        let replies = a_select_s_replies();
        h.server_says(&replies).await;
        h.attached().conn.fill().await.expect("filled");
        h.session.on_buffered_replies().await.expect("relayed");
        assert_eq!(h.client_heard(), replies);
        assert!(h.session.backend.is_none());
    }

    /// A transaction block's status is tracked from the server's ReadyForQuery: inside it
    /// (`T`, then `E` after an error) the connection stays attached; its end (`I`) frees it.
    #[tokio::test]
    async fn transaction_status_comes_from_ready_for_query() {
        let mut h = harness();
        h.sent(&[Owner::Client]);
        h.server_says(&[
            build::command_complete("BEGIN"),
            build::ready_for_query(TxStatus::InBlock),
        ])
        .await;
        h.session.drain().await.expect("drain");
        assert_eq!(h.session.status, TxStatus::InBlock);
        assert!(h.session.backend.is_some(), "held inside the block");

        h.sent(&[Owner::Client]);
        h.server_says(&[
            error("ERROR", "22012", "division by zero"),
            build::ready_for_query(TxStatus::Failed),
        ])
        .await;
        h.session.drain().await.expect("drain");
        assert_eq!(h.session.status, TxStatus::Failed);
        assert!(h.session.backend.is_some(), "held in the failed block");

        h.sent(&[Owner::Client]);
        h.server_says(&[
            build::command_complete("ROLLBACK"),
            build::ready_for_query(TxStatus::Idle),
        ])
        .await;
        h.session.drain().await.expect("drain");
        assert_eq!(h.session.status, TxStatus::Idle);
        assert!(h.session.backend.is_none());
        assert_eq!(tags(&h.client_heard()), "CZEZCZ");
    }

    /// The settings the proxy put in front of the client's flight: their replies, ReadyForQuery
    /// and ParameterStatus included, are the proxy's and never reach the client in their place;
    /// a notice raised meanwhile does (asynchronous messages are the client's whoever's segment
    /// it is). A reported value the client already knows is not repeated at its ReadyForQuery;
    /// one it does not know is, just before it.
    #[tokio::test]
    async fn a_proxy_duty_s_replies_are_swallowed_and_the_client_s_follow() {
        let mut h = harness();
        h.session
            .reported
            .insert("search_path".into(), "app".into());
        h.sent(&[Owner::Proxy(Duty::Prepare), Owner::Client]);
        let notice = ErrorFields::new("NOTICE", "00000", "from the duty").to_frame(b'N');
        h.server_says(&[
            build::parameter_status("search_path", "app"),
            notice.clone(),
            build::command_complete("SET"),
            build::ready_for_query(TxStatus::Idle),
        ])
        .await;
        let client = [
            build::command_complete("SELECT 0"),
            build::ready_for_query(TxStatus::Idle),
        ];
        h.server_says(&client).await;
        h.session.drain().await.expect("drain");
        assert_eq!(h.client_heard(), [vec![notice], client.to_vec()].concat());
        assert!(h.session.backend.is_none());

        let mut h = harness();
        h.sent(&[Owner::Proxy(Duty::Prepare), Owner::Client]);
        h.server_says(&[
            build::parameter_status("TimeZone", "UTC"),
            build::command_complete("SET"),
            build::ready_for_query(TxStatus::Idle),
        ])
        .await;
        h.server_says(&client).await;
        h.session.drain().await.expect("drain");
        let news = build::parameter_status("TimeZone", "UTC");
        assert_eq!(
            h.client_heard(),
            [client[0].clone(), news, client[1].clone()]
        );
    }

    /// A duty that fails is the proxy's failure, not the client's: the error is swallowed (only
    /// logged) and the client's own replies that follow are relayed as usual.
    #[tokio::test]
    async fn a_failing_duty_is_not_the_client_s_error() {
        let mut h = harness();
        h.sent(&[Owner::Proxy(Duty::Prepare), Owner::Client]);
        h.server_says(&[
            error("ERROR", "42704", "unrecognized configuration parameter"),
            build::ready_for_query(TxStatus::Idle),
            build::command_complete("SELECT 0"),
            build::ready_for_query(TxStatus::Idle),
        ])
        .await;
        h.session.drain().await.expect("drain");
        assert_eq!(tags(&h.client_heard()), "CZ");
    }

    /// Statements the proxy prepared in front of the client's segment inside a block that had
    /// failed meanwhile (25P02): what the connection holds is in doubt, and the server's 26000
    /// for the client's Bind of one reaches the client as the 25P02 a direct connection gives.
    #[tokio::test]
    async fn a_preparation_refused_in_an_aborted_block_answers_the_client_with_25p02() {
        let mut h = harness();
        h.session.status = TxStatus::Failed;
        h.attached()
            .conn
            .prepared
            .insert("lsngate_1".into(), "SELECT 1".into());
        h.sent(&[Owner::Proxy(Duty::Prepare), Owner::Client]);
        h.server_says(&[
            error("ERROR", "25P02", "current transaction is aborted"),
            build::ready_for_query(TxStatus::Failed),
            error(
                "ERROR",
                "26000",
                "prepared statement \"lsngate_1\" does not exist",
            ),
            build::ready_for_query(TxStatus::Failed),
        ])
        .await;
        h.session.drain().await.expect("drain");
        let heard = h.client_heard();
        assert_eq!(tags(&heard), "EZ");
        assert_eq!(sqlstate(&heard[0]).as_deref(), Some("25P02"));
        let attached = h.attached();
        assert_eq!(
            attached.conn.prepared["lsngate_1"],
            super::super::preparation::IN_DOUBT
        );
        assert_eq!(attached.unprepared_in_aborted_block, None, "used up");
    }

    /// An error in a flight whose session settings were recorded at send time puts them in
    /// doubt: at the transaction's end the proxy reads the server's settings back on the same
    /// connection and holds the client's ReadyForQuery until that answer is in, so the client
    /// cannot send its next SET ahead of it.
    #[tokio::test]
    async fn an_error_with_settings_recorded_reads_them_back_before_the_client_hears_ready() {
        let mut h = harness();
        h.sent(&[Owner::Client]);
        h.attached().effects_due = true;
        h.server_says(&[
            error("ERROR", "22023", "invalid value"),
            build::ready_for_query(TxStatus::Idle),
        ])
        .await;
        h.handle_sent().await;
        assert!(h.session.settings_in_doubt);
        // Nothing yet: the error waits in the write buffer behind which the ReadyForQuery is
        // held.
        assert_eq!(tags(&h.client_heard()), "");
        let sent = h.server_got();
        assert_eq!(sent, [FrontendMessage::Query(RESYNC_SQL.into()).to_frame()]);
        assert_eq!(h.attached().expect, [Owner::Proxy(Duty::Resync)]);

        // The read-back answers: the server's session settings become the client's.
        h.server_says(&[
            data_row(&["search_path", "app"]),
            build::command_complete("SELECT 1"),
            build::ready_for_query(TxStatus::Idle),
        ])
        .await;
        h.session.drain().await.expect("drain");
        assert_eq!(tags(&h.client_heard()), "EZ");
        assert!(!h.session.settings_in_doubt);
        assert!(h.session.settings.contains_key("search_path"));
        assert!(h.session.backend.is_none());
    }

    /// The read-back failing is swallowed like any duty's error: the client still hears its
    /// held ReadyForQuery, and the settings stay in doubt (the next transaction's end reads them
    /// again).
    #[tokio::test]
    async fn a_failed_read_back_leaves_the_settings_in_doubt() {
        let mut h = harness();
        h.session.settings_in_doubt = true;
        h.sent(&[Owner::Client]);
        h.server_says(&[
            build::command_complete("SELECT 0"),
            build::ready_for_query(TxStatus::Idle),
        ])
        .await;
        h.handle_sent().await;
        assert_eq!(tags(&h.client_heard()), "", "held behind the read-back");
        assert_eq!(h.server_got().len(), 1, "the read-back was sent");
        h.server_says(&[
            error("ERROR", "57014", "canceling statement"),
            build::ready_for_query(TxStatus::Idle),
        ])
        .await;
        h.session.drain().await.expect("drain");
        assert_eq!(tags(&h.client_heard()), "CZ");
        assert!(h.session.settings_in_doubt);
    }

    /// Extended messages sent without a Sync (the flight ended in Flush): each answer counts
    /// down what is due, and an error makes the server skip everything up to the next Sync,
    /// which `settle_unsynced` reports so the session expects nothing more.
    #[tokio::test]
    async fn an_error_in_an_unsynced_batch_skips_to_the_sync() {
        let mut h = harness();
        let attached = h.attached();
        attached.batch = Batch::Open {
            due: 3,
            executes: 0,
            skipping: false,
            executed: None,
        };
        h.server_says(&[frame(b'1'), error("ERROR", "42601", "syntax error")])
            .await;
        assert!(
            h.session.settle_unsynced().await.expect("settled"),
            "skipping"
        );
        assert_eq!(tags(&h.client_heard()), "1E");
        assert!(matches!(
            h.attached().batch,
            Batch::Open {
                due: 0,
                executes: 0,
                skipping: true,
                ..
            }
        ));

        let mut h = harness();
        let attached = h.attached();
        attached.batch = Batch::Open {
            due: 2,
            executes: 0,
            skipping: false,
            executed: None,
        };
        h.server_says(&[frame(b'1'), frame(b'2')]).await;
        assert!(!h.session.settle_unsynced().await.expect("settled"));
        assert!(h.attached().batch.open_and_sound());
        assert!(matches!(h.attached().batch, Batch::Open { due: 0, .. }));
        assert_eq!(tags(&h.client_heard()), "12");
    }

    /// A pinning statement (SQL PREPARE) whose segment ended without its CommandComplete (the
    /// server skipped it after an earlier error) did not run: the pin is undone. Its
    /// CommandComplete confirms it.
    #[tokio::test]
    async fn a_pin_holds_only_when_the_server_confirms_the_pinning_statement() {
        let mut h = harness();
        h.session.pinned = true;
        h.sent(&[Owner::Client]);
        h.attached().pin_unconfirmed = Some(0);
        h.server_says(&[
            error("ERROR", "22012", "division by zero"),
            build::ready_for_query(TxStatus::Idle),
        ])
        .await;
        h.session.drain().await.expect("drain");
        assert!(!h.session.pinned);
        assert!(h.session.backend.is_none());

        let mut h = harness();
        h.session.pinned = true;
        h.sent(&[Owner::Client]);
        h.attached().pin_unconfirmed = Some(0);
        h.server_says(&[
            build::command_complete("PREPARE"),
            build::ready_for_query(TxStatus::Idle),
        ])
        .await;
        h.session.drain().await.expect("drain");
        assert!(h.session.pinned);
        assert!(h.session.backend.is_some(), "pinned: kept");
    }

    /// A server's FATAL ends the server connection, not the client's: the client hears it as an
    /// ERROR and the connection takes no further flights.
    #[tokio::test]
    async fn a_fatal_from_the_server_reaches_the_client_as_an_error() {
        let mut h = harness();
        h.sent(&[Owner::Client]);
        h.server_says(&[error("FATAL", "57P01", "terminating connection")])
            .await;
        let b = h.attached();
        b.conn.fill().await.expect("filled");
        let frame = b.conn.next_frame().expect("a frame");
        h.session.on_backend(frame).await.expect("handled");
        let heard = h.client_heard();
        let fields = ErrorFields::parse(b'E', &heard[0].body).expect("error");
        assert_eq!(fields.get(b'S'), Some("ERROR"));
        assert_eq!(fields.sqlstate(), Some("57P01"));
        assert!(h.attached().doomed);
        assert!(h.attached().error_relayed);
    }

    /// Found by the Patroni switchover test: a write outside a transaction block whose server
    /// was shut down under it (57P01: in synchronous mode a commit waiting for its standby is
    /// ended so, after committing locally) reached the client as "terminating connection", which
    /// reads as "not done". It may have committed: the client hears 08006, outcome unknown.
    #[tokio::test]
    async fn a_fatal_under_a_statement_that_may_commit_is_an_unknown_outcome() {
        let mut h = harness();
        h.sent(&[Owner::Client]);
        h.attached().may_commit = true;
        h.server_says(&[error("FATAL", "57P01", "terminating connection")])
            .await;
        let b = h.attached();
        b.conn.fill().await.expect("filled");
        let frame = b.conn.next_frame().expect("a frame");
        h.session.on_backend(frame).await.expect("handled");
        let heard = h.client_heard();
        let fields = ErrorFields::parse(b'E', &heard[0].body).expect("error");
        assert_eq!(fields.get(b'S'), Some("ERROR"));
        assert_eq!(fields.sqlstate(), Some("08006"));
        let message = fields.get(b'M').unwrap_or_default();
        assert!(
            message.contains("57P01 terminating connection")
                && message.contains("outcome is unknown"),
            "{message}"
        );
        assert!(h.attached().doomed && h.attached().error_relayed);
    }

    /// The server connection closing while the client's statement is due: the client hears an
    /// 08006 error that says the outcome is unknown, then ReadyForQuery; its session goes on.
    #[tokio::test]
    async fn a_server_that_closes_mid_statement_answers_the_client_with_08006() {
        let mut h = harness();
        h.sent(&[Owner::Client]);
        h.server.shutdown().await.expect("closed");
        drop(h.server);
        h.session
            .drain()
            .await
            .expect("the client's session goes on");
        let heard = frames_in(&mut h.client);
        assert_eq!(tags(&heard), "EZ");
        assert_eq!(sqlstate(&heard[0]).as_deref(), Some("08006"));
        let message = ErrorFields::parse(b'E', &heard[0].body).expect("error");
        assert!(
            message
                .get(b'M')
                .unwrap_or_default()
                .contains("outcome is unknown")
        );
        assert_eq!(h.session.status, TxStatus::Idle);
        assert!(h.session.backend.is_none());
    }
}
