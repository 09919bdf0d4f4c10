//! What the gate knows about its replicas: per *server* replayed positions (monotonic max), per
//! replica URL health / role / lag, and the primary's WAL clock used to turn a replay position
//! into a time lag.
//!
//! Fed by every wait, check and read (their results), and by the background monitor. Only
//! raises what a server itself reported, so a shortcut taken from it ("already replayed, read at
//! once") is never wrong for that server. It does no I/O itself.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use lsngate_core::timeline::{Need, ReplicaTimeline, admits};
use lsngate_core::{Lsn, ReplicaState, Role, ServerId, WalClock};
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
    /// Servers seen behind the URL, with when they last reported.
    servers: HashMap<ServerId, Instant>,
}

/// A server not heard of for this long no longer counts for its URL (it was restarted — a new
/// postmaster start time is a new server — or a load balancer stopped sending there). Only
/// routing forgets it; a read that reaches it again is checked against its own position.
const SERVER_FORGOTTEN_AFTER: Duration = Duration::from_secs(5);

/// Public snapshot of one replica, for dashboards and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaStatus {
    /// `replica0`, `replica1`, ...
    pub name: String,
    /// host:port of its URL.
    pub address: String,
    /// Reachable at the last contact.
    pub healthy: bool,
    /// `Standby`, `Primary` (promoted: no longer used as a replica) or `Unknown`.
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
    replayed: Mutex<HashMap<ServerId, Lsn>>,
    slots: Vec<Mutex<SlotState>>,
    /// The primary's WAL clock, its times since `origin`.
    clock: Mutex<WalClock>,
    origin: Instant,
    primary_timeline: Mutex<Option<u32>>,
}

const CLOCK_SAMPLES: usize = 2048;

impl Watcher {
    pub fn new(replicas: usize) -> Watcher {
        Watcher {
            replayed: Mutex::new(HashMap::new()),
            slots: (0..replicas)
                .map(|_| {
                    Mutex::new(SlotState {
                        healthy: true,
                        ..SlotState::default()
                    })
                })
                .collect(),
            clock: Mutex::new(WalClock::new(CLOCK_SAMPLES)),
            origin: Instant::now(),
            primary_timeline: Mutex::new(None),
        }
    }

    /// What `server` is known to have replayed.
    pub fn replayed(&self, server: &ServerId) -> Option<Lsn> {
        lock(&self.replayed).get(server).copied()
    }

    /// `server`, reached through replica `slot`, reported having replayed `lsn` (never lowers).
    pub fn observe_replayed(&self, slot: usize, server: &ServerId, lsn: Lsn) {
        {
            let mut map = lock(&self.replayed);
            let known = map.entry(server.clone()).or_insert(lsn);
            *known = (*known).max(lsn);
        }
        let mut state = lock(&self.slots[slot]);
        state.servers.insert(server.clone(), Instant::now());
        state.healthy = true;
        if state.role == Role::Unknown {
            state.role = Role::Standby;
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
        let at = when.saturating_duration_since(self.origin);
        lock(&self.clock).observe(at, lsn);
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

    /// The primary's last sampled position.
    pub fn primary_position(&self) -> Option<Lsn> {
        lock(&self.clock).latest()
    }

    /// How long ago the primary first wrote past `replayed`: zero when the replica has all the
    /// primary's known WAL. Unlike `now() - pg_last_xact_replay_timestamp()` this does not grow
    /// while the primary is idle.
    pub fn lag_behind(&self, replayed: Lsn, now: Instant) -> Option<Duration> {
        lock(&self.clock).lag_behind(replayed, now.saturating_duration_since(self.origin))
    }

    /// Lowest replayed position over the servers seen behind `slot`.
    fn slot_replayed(&self, state: &SlotState) -> Option<Lsn> {
        let map = lock(&self.replayed);
        let now = Instant::now();
        let mut positions = state
            .servers
            .iter()
            .filter(|(_, seen)| now.saturating_duration_since(**seen) < SERVER_FORGOTTEN_AFTER)
            .map(|(s, _)| map.get(s).copied());
        let first = positions.next()??;
        positions.try_fold(first, |low, p| p.map(|p| low.min(p)))
    }

    /// Routing input for every replica. A replica whose timeline does not admit `need` (an
    /// orphan of a failover, or one not known to be on the token's history) is reported
    /// unhealthy for this read: `WAIT FOR LSN` compares numbers only.
    pub fn states(&self, need: Need) -> Vec<ReplicaState> {
        let primary = self.primary_position();
        let newest = self.primary_timeline();
        self.slots
            .iter()
            .map(|slot| {
                let state = lock(slot);
                let replayed = self.slot_replayed(&state);
                let timeline_ok = admits(state.timeline, newest, need);
                ReplicaState {
                    healthy: state.healthy && timeline_ok,
                    role: if state.role == Role::Unknown {
                        Role::Standby
                    } else {
                        state.role
                    },
                    replayed,
                    lag_bytes: match (primary, replayed) {
                        (Some(p), Some(r)) => Some(p.bytes_since(r)),
                        _ => None,
                    },
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
                // One guard, dropped before the next slot: a second `lock()` in the same
                // expression would deadlock on this non-reentrant mutex.
                let (role, servers_seen) = {
                    let slot = lock(&self.slots[i]);
                    (slot.role, slot.servers.len())
                };
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

/// A poisoned lock only means another thread panicked mid-update of plain numbers; the data is
/// still usable.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
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
    fn lag_comes_from_the_primary_wal_clock() {
        let watcher = Watcher::new(0);
        let start = Instant::now();
        assert_eq!(watcher.lag_behind(lsn(10), start), None, "no clock yet");
        watcher.observe_primary(start, lsn(100), Some(1));
        watcher.observe_primary(start + Duration::from_secs(1), lsn(200), Some(1));
        watcher.observe_primary(start + Duration::from_secs(2), lsn(300), Some(1));
        let now = start + Duration::from_secs(3);
        assert_eq!(watcher.lag_behind(lsn(300), now), Some(Duration::ZERO));
        assert_eq!(
            watcher.lag_behind(lsn(150), now),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            watcher.lag_behind(lsn(50), now),
            Some(Duration::from_secs(3))
        );
        assert_eq!(watcher.primary_timeline(), Some(1));
    }

    #[test]
    fn unreachable_promoted_and_orphaned_replicas_do_not_serve() {
        let watcher = Watcher::new(4);
        watcher.mark_unreachable(0, "test");
        watcher.observe_role(1, Role::Primary);
        for slot in [2, 3] {
            watcher.observe_role(slot, Role::Standby);
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
        watcher.observe_role(0, Role::Standby);
        watcher.observe_receiver(0, None);
        assert!(!watcher.states(Need::Floor(None))[0].is_serving());
    }
}
