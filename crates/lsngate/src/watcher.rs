//! What the gate knows about its replicas: the replay knowledge shared with the proxy
//! (`lsngate_core::replay::ReplayBook`: per *server* replayed positions, the servers seen behind
//! each replica URL, the primary's WAL clock), plus what only the library keeps per replica URL —
//! health, role, measured lag, timeline — and the newest primary timeline.
//!
//! Fed by every wait, check and read (their results), and by the background monitor. It does no
//! I/O and holds no rule of its own beyond logging and metrics: the rules are core's.

use std::sync::Mutex;
use std::time::Duration;

use lsngate_core::sync::lock;
use lsngate_core::timeline::{Need, ReplicaTimeline, admits};
use lsngate_core::{Lsn, ReplayBook, ReplicaState, Role, ServerId};
use tokio::time::Instant;

use crate::error::ReplicaPosition;

/// Health, role and lag of one replica URL.
#[derive(Debug, Default)]
struct SlotState {
    healthy: bool,
    role: Role,
    lag: Option<Duration>,
    /// The timeline its WAL receiver streams, and whether one runs (see `lsngate_core::timeline`).
    timeline: ReplicaTimeline,
}

/// Public snapshot of one replica, for dashboards and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaStatus {
    /// `replica0`, `replica1`, ...
    pub name: String,
    /// host:port of its URL.
    pub address: String,
    /// Reachable at the last contact.
    pub healthy: bool,
    /// `Replica`, `Primary` (promoted: no longer used as a replica) or `Unknown`.
    pub role: Role,
    /// Lowest known replay position over the servers reached through this URL.
    pub replayed: Option<Lsn>,
    /// Bytes behind the primary's last known position.
    pub lag_bytes: Option<u64>,
    /// Time behind the primary, from the primary's WAL clock.
    pub lag: Option<Duration>,
    /// Distinct servers seen behind this URL (more than one: a load balancer).
    pub servers_seen: usize,
}

/// Shared knowledge about replicas and the primary.
#[derive(Debug)]
pub(crate) struct Watcher {
    /// Replay knowledge, its times since `origin`; slots are replica indexes.
    book: Mutex<ReplayBook>,
    slots: Vec<Mutex<SlotState>>,
    origin: Instant,
    primary_timeline: Mutex<Option<u32>>,
}

impl Watcher {
    pub fn new(replicas: usize) -> Watcher {
        Watcher {
            book: Mutex::new(ReplayBook::default()),
            slots: (0..replicas)
                .map(|_| {
                    Mutex::new(SlotState {
                        healthy: true,
                        ..SlotState::default()
                    })
                })
                .collect(),
            origin: Instant::now(),
            primary_timeline: Mutex::new(None),
        }
    }

    /// What `server` is known to have replayed.
    pub fn replayed(&self, server: &ServerId) -> Option<Lsn> {
        lock(&self.book).replayed(server)
    }

    /// `now` as the book's time.
    fn since_origin(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.origin)
    }

    /// `server`, reached through replica `slot`, reported having replayed `lsn` (never lowers).
    pub fn observe_replayed(&self, slot: usize, server: &ServerId, lsn: Lsn) {
        let now = self.since_origin(Instant::now());
        lock(&self.book).observe_replayed(slot, server, lsn, now);
        let mut state = lock(&self.slots[slot]);
        state.healthy = true;
        if state.role == Role::Unknown {
            state.role = Role::Replica;
        }
    }

    /// Replica `slot` answered as a standby (or as a promoted primary).
    pub fn observe_role(&self, slot: usize, role: Role) {
        let mut state = lock(&self.slots[slot]);
        state.healthy = true;
        if role == Role::Primary && state.role != Role::Primary {
            tracing::warn!(
                replica = slot,
                "replica answered `not in recovery`: it was promoted; no longer used as a replica"
            );
            metrics::counter!(crate::metrics::PROMOTIONS, "replica" => slot.to_string())
                .increment(1);
        }
        state.role = role;
    }

    /// Replica `slot`'s WAL receiver reported `received` (its `received_tli`: 0 when hidden from
    /// the monitor's role, `None` when no receiver runs).
    pub fn observe_receiver(&self, slot: usize, received: Option<u32>) {
        if lock(&self.slots[slot]).timeline.observe(received) {
            tracing::warn!(
                replica = slot,
                "the monitor cannot see this replica's WAL receiver timeline (grant pg_read_all_stats to the replica URL's user); after a failover an orphaned replica cannot be told from one that follows the new primary"
            );
        }
    }

    /// Replica `slot` failed to answer; it is skipped until it answers again.
    pub fn mark_unreachable(&self, slot: usize, cause: &str) {
        let mut state = lock(&self.slots[slot]);
        if state.healthy {
            tracing::warn!(
                replica = slot,
                cause,
                "replica unreachable; skipped until it answers"
            );
        }
        state.healthy = false;
        // A lag measured before it went silent would only mislead a dashboard.
        state.lag = None;
    }

    /// Records a time lag measured for `slot`.
    pub fn observe_lag(&self, slot: usize, lag: Option<Duration>) {
        lock(&self.slots[slot]).lag = lag;
    }

    /// The primary was at `lsn` at `when`, on `timeline`.
    pub fn observe_primary(&self, when: Instant, lsn: Lsn, timeline: Option<u32>) {
        let at = self.since_origin(when);
        lock(&self.book).observe_primary(at, lsn);
        if let Some(timeline) = timeline {
            // The newest seen: a connection opened before a failover reports the old one.
            let mut known = lock(&self.primary_timeline);
            *known = (*known).max(Some(timeline));
        }
    }

    /// The newest timeline the primary was seen writing, when known.
    pub fn primary_timeline(&self) -> Option<u32> {
        *lock(&self.primary_timeline)
    }

    /// How long ago the primary first wrote past `replayed`: zero when the replica has all the
    /// primary's known WAL. Unlike `now() - pg_last_xact_replay_timestamp()` this does not grow
    /// while the primary is idle.
    pub fn lag_behind(&self, replayed: Lsn, now: Instant) -> Option<Duration> {
        lock(&self.book).lag_behind(replayed, self.since_origin(now))
    }

    /// Routing input for every replica. A replica whose timeline does not admit `need` (an
    /// orphan of a failover, or one not known to be on the token's history) is reported
    /// unhealthy for this read: `WAIT FOR LSN` compares numbers only.
    pub fn states(&self, need: Need) -> Vec<ReplicaState> {
        let newest = self.primary_timeline();
        let now = self.since_origin(Instant::now());
        self.slots
            .iter()
            .enumerate()
            .map(|(index, slot)| {
                let (replayed, lag_bytes) = {
                    let book = lock(&self.book);
                    let replayed = book.slot_replayed(index, now);
                    (replayed, replayed.and_then(|r| book.lag_bytes(r)))
                };
                let state = lock(slot);
                let timeline_ok = admits(state.timeline, newest, need);
                ReplicaState {
                    healthy: state.healthy && timeline_ok,
                    role: if state.role == Role::Unknown {
                        Role::Replica
                    } else {
                        state.role
                    },
                    replayed,
                    lag_bytes,
                    lag: state.lag,
                    // Filled in by the read path, which holds the pools.
                    busy: 0,
                }
            })
            .collect()
    }

    /// Snapshot for [`crate::Gate::replicas`].
    pub fn status(&self, names: &[(String, String)]) -> Vec<ReplicaStatus> {
        let states = self.states(Need::Any);
        names
            .iter()
            .zip(states)
            .enumerate()
            .map(|(i, ((name, address), state))| {
                // One guard at a time: a second `lock()` of the same non-reentrant mutex in one
                // expression would deadlock.
                let role = lock(&self.slots[i]).role;
                let servers_seen = lock(&self.book).servers_seen(i);
                ReplicaStatus {
                    name: name.clone(),
                    address: address.clone(),
                    healthy: state.healthy,
                    role,
                    replayed: state.replayed,
                    lag_bytes: state.lag_bytes,
                    lag: state.lag,
                    servers_seen,
                }
            })
            .collect()
    }

    /// Positions for error messages.
    pub fn positions(&self, names: &[(String, String)]) -> Vec<ReplicaPosition> {
        self.status(names)
            .into_iter()
            .map(|s| ReplicaPosition {
                name: s.name,
                replayed: s.replayed,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lsn(n: u64) -> Lsn {
        Lsn::new(n)
    }

    #[test]
    fn replay_positions_only_rise_and_stay_with_their_server() {
        let watcher = Watcher::new(1);
        let (a, b) = (ServerId::from("7/1/a:1"), ServerId::from("7/1/b:1"));
        watcher.observe_replayed(0, &a, lsn(100));
        watcher.observe_replayed(0, &a, lsn(50));
        assert_eq!(watcher.replayed(&a), Some(lsn(100)));
        assert_eq!(
            watcher.replayed(&b),
            None,
            "what A replayed says nothing about B"
        );
        // One URL reaching two servers: routing sees the lower one.
        watcher.observe_replayed(0, &b, lsn(70));
        assert_eq!(watcher.states(Need::Any)[0].replayed, Some(lsn(70)));
        assert_eq!(
            watcher.status(&[("replica0".into(), "x".into())])[0].servers_seen,
            2
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_restarted_server_stops_holding_its_url_back() {
        let watcher = Watcher::new(1);
        let (old, new) = (ServerId::from("7/1/a:1"), ServerId::from("7/1/b:1"));
        watcher.observe_replayed(0, &old, lsn(70));
        watcher.observe_replayed(0, &new, lsn(100));
        assert_eq!(watcher.states(Need::Any)[0].replayed, Some(lsn(70)));
        tokio::time::advance(Duration::from_secs(6)).await;
        watcher.observe_replayed(0, &new, lsn(120));
        assert_eq!(
            watcher.states(Need::Any)[0].replayed,
            Some(lsn(120)),
            "the server gone for 6 s no longer counts"
        );
        assert_eq!(
            watcher.replayed(&old),
            Some(lsn(70)),
            "its own position is kept"
        );
    }

    #[test]
    fn lag_is_measured_from_the_gate_start_and_the_newest_timeline_is_kept() {
        let watcher = Watcher::new(0);
        let start = Instant::now();
        watcher.observe_primary(start, lsn(100), Some(2));
        watcher.observe_primary(start + Duration::from_secs(1), lsn(200), Some(1));
        let now = start + Duration::from_secs(3);
        assert_eq!(
            watcher.lag_behind(lsn(150), now),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            watcher.primary_timeline(),
            Some(2),
            "a connection opened before a failover reports the old timeline: never lowered"
        );
    }

    #[test]
    fn unreachable_promoted_and_orphaned_replicas_do_not_serve() {
        let watcher = Watcher::new(4);
        watcher.mark_unreachable(0, "test");
        watcher.observe_role(1, Role::Primary);
        for slot in [2, 3] {
            watcher.observe_role(slot, Role::Replica);
        }
        watcher.observe_receiver(2, Some(2));
        watcher.observe_receiver(3, Some(1));
        watcher.observe_primary(Instant::now(), lsn(500), Some(2));
        let states = watcher.states(Need::Floor(Some(1)));
        assert!(!states[0].is_serving());
        assert!(!states[1].is_serving());
        assert!(
            states[2].is_serving(),
            "the new timeline holds timeline 1's history up to the fork"
        );
        // Replica 3 stayed on timeline 1: it serves nothing, a bare token or none.
        for need in [Need::Any, Need::Floor(None), Need::Floor(Some(1))] {
            assert!(!watcher.states(need)[3].is_serving(), "{need:?}");
        }
        // A receiver that is down and never seen streaming: maybe an orphan, no floor read.
        watcher.observe_role(0, Role::Replica);
        watcher.observe_receiver(0, None);
        assert!(!watcher.states(Need::Floor(None))[0].is_serving());
    }
}
