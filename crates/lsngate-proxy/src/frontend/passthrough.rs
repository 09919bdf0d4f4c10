//! Pass-through: the common simple Query that needs nothing from the proxy but a backend. In a
//! session between transactions, with no floor to honour (consistency `eventual`, no
//! `lsngate.min_lsn`, no lag bound), no route hint and nothing proxy-specific in its text, a
//! query classified as a write, or as a read while no replica serves, goes to the primary as the
//! client sent it: no re-encoding, no proxy segments, no allocation beyond the classification
//! key. Everything else — and any of these conditions failing — takes the general path in
//! `session.rs`, which gives the same result with more work. This path exists because a pooler
//! pays its per-statement cost on every statement of every client.

use super::router::{Class, RouteHint};
use super::session::Session;
use crate::backend::{Role, Target};
use crate::causal::{Level, Outcome};
use crate::net::Frame;

/// The SQL of a simple Query frame, when it is well formed (one NUL, at the end; UTF-8).
fn query_text(frame: &Frame) -> Option<&str> {
    let (nul, text) = frame.body.split_last()?;
    if *nul != 0 || text.contains(&0) {
        return None;
    }
    std::str::from_utf8(text).ok()
}

/// Whether the text mentions lsngate in any case (a hint comment or a proxy command).
fn mentions_lsngate(sql: &str) -> bool {
    let bytes = sql.as_bytes();
    memchr::memchr2_iter(b'l', b'L', bytes).any(|i| {
        bytes
            .get(i..i + 7)
            .is_some_and(|w| w.eq_ignore_ascii_case(b"lsngate"))
    })
}

impl Session {
    /// Sends a simple Query straight to the primary when nothing about it needs the general
    /// path; false when it does (nothing was sent then, though a server connection may have
    /// been attached for it).
    pub(super) async fn pass_through(&mut self, frame: &Frame) -> anyhow::Result<bool> {
        let idle_session = self.status == b'I'
            && !self.pinned
            && self.pending.is_empty()
            && self.hint == RouteHint::Auto
            && self.floors.mode.level == Level::Eventual
            && self.floors.own().is_none()
            && !self.settings_in_doubt
            && self.config.causal.lag_bound.max_bytes.is_none()
            && self.config.causal.lag_bound.max_lag.is_none()
            && self.backend.as_ref().is_none_or(|b| {
                !b.awaiting_replies()
                    && b.target == Target::Primary
                    && b.retry.is_none()
                    && b.discard.is_none()
                    && !b.doomed
            });
        if !idle_session {
            return Ok(false);
        }
        let Some(sql) = query_text(frame) else {
            return Ok(false);
        };
        if mentions_lsngate(sql) {
            return Ok(false);
        }
        let class =
            self.class_memo
                .classify(&self.proxy.classes, sql, &self.config.write_functions);
        // The node a read would get: the primary when no replica serves (picked once here).
        let node = match class {
            Class::Write => None,
            Class::Read => match self.proxy.nodes.pick(Target::Replica) {
                Some(n) if n.role() == Role::Replica => return Ok(false),
                primary => primary,
            },
            _ => return Ok(false),
        };
        if self.backend.is_none()
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
        attached.expect.push_back(super::flight::Owner::Client);
        attached.extended = false;
        attached.open = false;
        attached.read = None;
        self.proxy.queries[0].increment(1);
        self.proxy.passed_through.increment(1);
        if let Err(e) = attached.conn.send_frame(frame).await {
            self.backend_lost(e).await?;
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_well_formed_query_text_passes() {
        assert_eq!(
            query_text(&Frame::new(b'Q', &b"SELECT 1\0"[..])),
            Some("SELECT 1")
        );
        assert_eq!(query_text(&Frame::new(b'Q', &b"SELECT 1"[..])), None);
        assert_eq!(query_text(&Frame::new(b'Q', &b"SEL\0ECT 1\0"[..])), None);
        assert_eq!(query_text(&Frame::new(b'Q', &b"\xff\0"[..])), None);
        assert_eq!(query_text(&Frame::new(b'Q', &b""[..])), None);
    }

    #[test]
    fn any_mention_of_lsngate_takes_the_general_path() {
        assert!(mentions_lsngate("SET LSNGATE.route = primary"));
        assert!(mentions_lsngate("/* lsngate:route=replica */ SELECT 1"));
        assert!(!mentions_lsngate("SELECT 1"));
    }
}
