//! Causal scopes, client side: which scopes a statement works under, which scopes a commit
//! raises, and the floor a read under scopes must see. The book of floors itself is
//! `causal::scopes`, shared by every client.
//!
//! A statement works under the scopes of its `lsngate_scope` comments, else under the session's
//! `lsngate.scope` (set with SET, or in the startup options), else under none. A write sent to
//! the primary under a scope is remembered until the next position segment behind a commit is
//! sent (`flight.rs`), which takes it; when that segment's answer arrives (`replies.rs`) — before
//! the client hears its ReadyForQuery — the scopes it took, and those of any earlier segment
//! still unanswered, are raised to the commit's position. A position that never arrives makes
//! the book forget those scopes: a read under a forgotten scope waits for the primary's current
//! position, which is past the commit. The same happens to a read under a scope the book does not
//! hold for any other reason (evicted, expired, written through another proxy), so no read under
//! a scope is served from a replica that may be behind a write made under it here. With
//! `scope_store`, the floors live in Redis too, raised there before the client hears its commit
//! is done, and read from there: a write through one proxy is seen by reads through another.

use std::collections::VecDeque;

use lsngate_core::ScopeName;

use super::session::Session;
use crate::causal::{Floor, Outcome, ScopeFloorSource};

/// One client's scope bookkeeping (the session scope itself is `ClientFloors::scope`, set with
/// the other proxy settings).
#[derive(Debug, Default)]
pub struct ClientScopes {
    /// Scopes of the flight being dispatched, from its comments (empty: the session's).
    pub(super) flight: Vec<ScopeName>,
    /// Scopes written under since the last position segment behind a commit was sent.
    written: Vec<ScopeName>,
    /// Position segments sent with scopes to raise, in order: segment number and scopes.
    due: VecDeque<(u64, Vec<ScopeName>)>,
    /// Number of the last position segment sent.
    positions_sent: u64,
    /// The read being routed works under a scope (its outcome is counted for scopes too).
    pub(super) reading: bool,
}

impl ClientScopes {
    /// The scopes the current flight works under.
    pub(super) fn current<'a>(&'a self, session: Option<&'a ScopeName>) -> &'a [ScopeName] {
        if self.flight.is_empty() {
            session.map(std::slice::from_ref).unwrap_or_default()
        } else {
            &self.flight
        }
    }

    /// Whether commit positions are needed for scopes (even in a mode that tracks none).
    pub(super) fn active(&self, session: Option<&ScopeName>) -> bool {
        session.is_some()
            || !self.flight.is_empty()
            || !self.written.is_empty()
            || !self.due.is_empty()
    }

    /// A flight that may write was sent to the primary.
    pub(super) fn note_write(&mut self, session: Option<&ScopeName>) {
        let current: Vec<ScopeName> = self.current(session).to_vec();
        for scope in current {
            if !self.written.contains(&scope) {
                self.written.push(scope);
            }
        }
    }

    /// A position segment is sent; returns its number. Behind a commit (`wrote`), it takes the
    /// scopes written under so far.
    pub(super) fn position_sent(&mut self, wrote: bool) -> u64 {
        self.positions_sent += 1;
        if wrote && !self.written.is_empty() {
            self.due
                .push_back((self.positions_sent, std::mem::take(&mut self.written)));
        }
        self.positions_sent
    }

    /// The scopes of every position segment up to number `upto`, now answered (or lost).
    pub(super) fn answered(&mut self, upto: u64) -> Vec<ScopeName> {
        let mut scopes = Vec::new();
        while self.due.front().is_some_and(|(n, _)| *n <= upto) {
            let (_, names) = self.due.pop_front().expect("checked");
            scopes.extend(names);
        }
        scopes
    }
}

impl Session {
    /// The floor a read under the flight's scopes must see; `None` when it works under none.
    /// With `scope_store`, each scope's floor is Redis' (where every proxy raises it), asked once
    /// per read within the wait budget. A scope with no floor there (or here, without a store) —
    /// and any scope when Redis does not answer — costs the primary's current position (shared
    /// with other readers asking at the same moment), which then becomes its floor.
    pub(super) async fn scope_floor(&mut self) -> anyhow::Result<Option<Floor>> {
        let scopes: Vec<ScopeName> = self.scopes.current(self.floors.scope.as_ref()).to_vec();
        if scopes.is_empty() {
            return Ok(None);
        }
        let proxy = std::sync::Arc::clone(&self.proxy);
        let book = &proxy.causal.scopes;
        let limits = self.config.causal.scopes;
        let store = self.config.causal.scope_store.as_deref();
        let bound = self.config.causal.wait_timeout;
        let mut floor = None;
        let mut unknown = Vec::new();
        for scope in scopes {
            let local = book.floor(&scope, limits);
            let known = match store {
                None => local,
                // Only Redis knows the other proxies' writes: without its floor, this proxy's
                // own is not enough.
                Some(url) => match book.load_shared(url, &scope, bound).await {
                    Ok(Some(shared)) => Floor::merge(local, Some(shared)),
                    Ok(None) | Err(_) => None,
                },
            };
            match known {
                Some(known) => floor = Floor::merge(floor, Some(known)),
                None => unknown.push(scope),
            }
        }
        if unknown.is_empty() {
            book.record_floor(ScopeFloorSource::Known);
            return Ok(floor);
        }
        book.record_floor(ScopeFloorSource::Unknown);
        let primary = proxy
            .causal
            .primary_position(&proxy.nodes, self.config.connect_timeout)
            .await?;
        for scope in &unknown {
            book.raise(scope, primary, limits);
            if let Some(url) = store {
                // A seed only: a failure costs the next reader the same primary round trip.
                let _ = book
                    .save_shared(url, scope, primary, limits.ttl, bound)
                    .await;
            }
        }
        Ok(Floor::merge(floor, Some(primary)))
    }

    /// Position segments up to number `upto` were answered: their scopes rise to `floor`, or
    /// are forgotten when the position is unknown — here, and in Redis with `scope_store`, before
    /// the client hears that its commit is done. A scope Redis could not be told of is reported
    /// to the client in a NOTICE: reads under it through other proxies may miss the commit.
    pub(super) async fn scopes_committed(&mut self, upto: u64, floor: Option<Floor>) {
        let scopes = self.scopes.answered(upto);
        if scopes.is_empty() {
            return;
        }
        let proxy = std::sync::Arc::clone(&self.proxy);
        let book = &proxy.causal.scopes;
        let limits = self.config.causal.scopes;
        let bound = self.config.causal.wait_timeout;
        let store = self.config.causal.scope_store.clone();
        let mut unshared = Vec::new();
        for scope in &scopes {
            match floor {
                Some(floor) => book.raise(scope, floor, limits),
                None => book.forget(scope),
            }
            let Some(url) = store.as_deref() else {
                continue;
            };
            let shared = match floor {
                Some(floor) => book.save_shared(url, scope, floor, limits.ttl, bound).await,
                None => book.remove_shared(url, scope, bound).await,
            };
            if let Err(e) = shared {
                unshared.push((scope.as_str().to_string(), e));
            }
        }
        if let Some((_, why)) = unshared.first() {
            let names: Vec<&str> = unshared.iter().map(|(n, _)| n.as_str()).collect();
            let notice = format!(
                "lsngate: the commit's position could not be shared for scope {} ({why}); reads under it through other proxies may not see this commit (this proxy's do)",
                names.join(", ")
            );
            self.io.queue(
                &crate::net::ErrorFields::new("NOTICE", crate::net::sqlstate::WARNING, notice)
                    .to_frame(b'N'),
            );
        }
    }

    /// Counts how a routed read ended (and, under a scope, for the scopes too).
    pub(super) fn record_read(&self, outcome: Outcome) {
        self.proxy.causal.record(outcome);
        if self.scopes.reading {
            self.proxy.causal.scopes.record_outcome(outcome);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> ScopeName {
        ScopeName::parse(s).unwrap()
    }

    #[test]
    fn a_commit_position_raises_the_scopes_written_before_it_and_no_later_ones() {
        let mut scopes = ClientScopes::default();
        let session = name("user:1");
        scopes.note_write(Some(&session));
        scopes.flight = vec![name("user:2")];
        scopes.note_write(Some(&session));
        scopes.flight.clear();
        let first = scopes.position_sent(true);
        // Pipelined behind it: another write and its commit position.
        scopes.flight = vec![name("user:3")];
        scopes.note_write(Some(&session));
        scopes.flight.clear();
        assert_eq!(scopes.position_sent(false), first + 1, "a read's position");
        let second = scopes.position_sent(true);
        assert_eq!(scopes.answered(first), vec![name("user:1"), name("user:2")]);
        assert!(scopes.active(None), "user:3 still waits for its position");
        assert_eq!(scopes.answered(second), vec![name("user:3")]);
        assert!(!scopes.active(None));
        assert!(scopes.active(Some(&session)));
    }

    #[test]
    fn a_lost_segment_is_settled_by_a_later_one() {
        let mut scopes = ClientScopes::default();
        scopes.note_write(Some(&name("a")));
        scopes.position_sent(true);
        scopes.note_write(Some(&name("b")));
        let later = scopes.position_sent(true);
        assert_eq!(scopes.answered(later), vec![name("a"), name("b")]);
    }
}
