//! Pass-through: the common simple Query that needs nothing from the proxy but a backend. In a
//! session between transactions, with no floor to honour (consistency `eventual`, no
//! `lsngate.min_lsn`, no lag bound, no causal scope), no route hint and nothing proxy-specific in its text, a
//! query classified as a write, or as a read while no replica serves, goes to the primary as the
//! client sent it: no re-encoding, no proxy segments, no allocation beyond the classification
//! key. The route is the one every flight gets (`plan.rs`): this is a fast branch of that plan,
//! not a second router. Everything else — and any of these conditions failing — takes the
//! general path in `session.rs`, which gives the same result with more work. This path exists because a pooler
//! pays its per-statement cost on every statement of every client.

use super::error::ClientError;
use super::plan::{Plan, plan};
use super::session::Session;
use crate::backend::{Role, Target};
use crate::causal::Outcome;
use crate::config::Level;
use crate::net::backend::TxStatus;
use crate::statement::{Class, RouteHint};

/// The text of a whole simple Query message (tag and length included): the bytes before its
/// closing NUL; None when it does not end with one.
fn query_text(message: &[u8]) -> Option<&[u8]> {
    match message.get(5..)?.split_last()? {
        (0, text) => Some(text),
        _ => None,
    }
}

impl Session {
    /// Sends a simple Query (`message`: the whole message as the client sent it) straight to
    /// the primary when nothing about it needs the general path; false when it does (nothing was
    /// sent then, though a server connection may have been attached for it).
    pub(super) async fn pass_through(&mut self, message: &[u8]) -> Result<bool, ClientError> {
        let idle_session = self.status == TxStatus::Idle
            && !self.pinned
            && self.pending.is_empty()
            && self.hint == RouteHint::Auto
            && self.floors.mode.level == Level::Eventual
            && self.floors.own().is_none()
            && self.floors.scope.is_none()
            // No write under a causal scope still owes its position (the general path takes
            // it behind this flight).
            && !self.scopes.active(None)
            && !self.settings_in_doubt
            && self.config.causal.lag_bound.max_bytes.is_none()
            && self.config.causal.lag_bound.max_lag.is_none()
            && self.backend.as_ref().is_none_or(|b| {
                !b.awaiting_replies()
                    && b.target == Target::Primary
                    && b.retry.is_none()
                    && !b.discarding()
                    && !b.doomed
            });
        if !idle_session {
            return Ok(false);
        }
        let Some(text) = query_text(message) else {
            return Ok(false);
        };
        // One scan classifies it and checks it: no NUL inside, UTF-8, no mention of lsngate (a
        // hint comment or a proxy command).
        let Some(class) =
            self.class_memo
                .classify_query(&self.proxy.classes, text, &self.config.write_functions)
        else {
            return Ok(false);
        };
        if crate::statement::sets_session_in_parts(text) {
            // A SET among other statements: the general path reads the settings back after it.
            return Ok(false);
        }
        // Routed by the plan every flight gets (`plan.rs`), and passed through where it sends
        // the statement to the primary: a write, or a read while no replica serves (the node
        // a replica read would get, picked once here).
        let node = match (class, plan(self.view(), Some(class), None)) {
            (Class::Write, Plan::Send(Some(Target::Primary))) => {
                self.proxy.nodes.pick(Target::Primary)
            }
            (Class::Read, Plan::ReplicaRead) => match self.proxy.nodes.pick(Target::Replica) {
                Some(n) if n.role() == Role::Replica => return Ok(false),
                primary => primary,
            },
            _ => return Ok(false),
        };
        // An idle server connection is taken without a future; opening or waiting for one (and
        // the error when there is no primary) is `attach`'s.
        if self.backend.is_none()
            && !node.as_deref().is_some_and(|node| self.attach_idle(node))
            && let Err(e) = self.attach(Target::Primary, node).await
        {
            self.no_backend(e, 1).await?;
            return Ok(true);
        }
        let attached = self.backend.as_mut().expect("attached");
        if attached.conn.applied != self.settings {
            // The backend needs the client's settings first: the general path adds them.
            return Ok(false);
        }
        if class == Class::Read {
            self.proxy.causal.record(Outcome::NoReplica);
        }
        // A simple Query drops the server's unnamed statement.
        attached.conn.unnamed = None;
        attached.expect.push_back(super::attached::Owner::Client);
        attached.segments_sent += 1;
        attached.batch = super::attached::Batch::Synced;
        attached.read_over();
        // Outside a transaction block every statement may commit: a FATAL under it leaves the
        // outcome unknown, as on the general path (`flight.rs`), not "terminating connection".
        attached.may_commit = true;
        self.proxy.queries[0].add(1);
        self.proxy.passed_through.add(1);
        let sent = match attached.conn.send_now(message) {
            Ok(n) if n == message.len() => Ok(()),
            Ok(n) => attached.conn.send_rest(&message[n..]).await,
            Err(e) => Err(e),
        };
        if let Err(e) = sent {
            self.backend_lost(e).await?;
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::Frame;

    #[test]
    fn only_query_text_ending_in_nul_passes() {
        let message = |body: &[u8]| Frame::new(b'Q', body.to_vec()).to_bytes();
        assert_eq!(query_text(&message(b"SELECT 1\0")), Some(&b"SELECT 1"[..]));
        assert_eq!(query_text(&message(b"SELECT 1")), None);
        assert_eq!(query_text(&message(b"")), None);
        assert_eq!(query_text(b"Q\0"), None);
    }
}
