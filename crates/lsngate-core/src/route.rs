//! The routing decision: which node serves a read, and whether it must wait first.
//!
//! Pure: the caller passes what it knows about each replica (from its watcher) and gets a
//! [`Decision`]. A token is satisfied per replica, never cluster-wide: one replica having
//! replayed a position says nothing about another (GitLab once unstuck sessions as soon as *one*
//! replica caught up, and served stale reads from the others).

use std::time::Duration;

use crate::lsn::Lsn;

/// What a node currently is, as last detected with `pg_is_in_recovery()` (see
/// [`crate::probe::Poll`]). The one role model of the library and the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// In recovery: a streaming replica (a standby, in PostgreSQL's words).
    Replica,
    /// Not in recovery: a primary (a replica that answers this was promoted).
    Primary,
    /// Not yet checked, or unreachable since.
    #[default]
    Unknown,
}

impl Role {
    /// Its name for status pages and metric labels: `replica`, `primary`, `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Replica => "replica",
            Role::Primary => "primary",
            Role::Unknown => "unknown",
        }
    }
}

/// What the caller knows about one replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReplicaState {
    /// Reachable at the last check.
    pub healthy: bool,
    /// Replica, promoted, or not yet known.
    pub role: Role,
    /// The highest position this server is known to have replayed. Only ever raised by
    /// observations of the same server.
    pub replayed: Option<Lsn>,
    /// Bytes the replica is behind the primary's latest known position.
    pub lag_bytes: Option<u64>,
    /// True lag, from a heartbeat, when measured.
    pub lag: Option<Duration>,
    /// Work the caller has in flight there now (server connections in use); among replicas
    /// that can serve a read equally well, the least busy one gets it. 0 when not counted.
    pub busy: usize,
}

impl ReplicaState {
    /// Usable as a replica at all.
    pub fn is_serving(&self) -> bool {
        self.healthy && self.role == Role::Replica
    }

    /// Known to have replayed `floor` already: a read there needs no wait.
    pub fn covers(&self, floor: Lsn) -> bool {
        self.replayed.is_some_and(|replayed| replayed >= floor)
    }
}

/// Bounds on lag for reads without a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LagBound {
    /// Most bytes a replica may be behind the primary's latest known position.
    pub max_bytes: Option<u64>,
    /// Most time lag a replica may have, when lag is measured.
    pub max_lag: Option<Duration>,
}

impl LagBound {
    /// Unknown lag passes: a replica just added has not been measured yet.
    pub fn admits(&self, replica: &ReplicaState) -> bool {
        let bytes_ok = match (self.max_bytes, replica.lag_bytes) {
            (Some(max), Some(bytes)) => bytes <= max,
            _ => true,
        };
        let time_ok = match (self.max_lag, replica.lag) {
            (Some(max), Some(lag)) => lag <= max,
            _ => true,
        };
        bytes_ok && time_ok
    }
}

/// One read to place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequest {
    /// The position the read must see; `None` for a read without a token.
    pub floor: Option<Lsn>,
    /// May wait on a replica that has not yet replayed the floor (false: the "fast" modes that
    /// only route to replicas known to have it).
    pub may_wait: bool,
    /// Lag bound for reads without a floor.
    pub lag_bound: LagBound,
    /// Rotates the choice among equally good, equally busy replicas (a counter or a random
    /// number).
    pub spin: usize,
}

/// Why a read goes to the primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrimaryReason {
    /// No replica is healthy and in recovery.
    NoReplica,
    /// No replica is known to have the floor and waiting is not allowed.
    NotCaughtUp,
    /// Every serving replica is over the lag bound.
    AllLagging,
}

/// Where a read goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Read on replica `index`; when `wait` is set, first wait there for the floor.
    Replica {
        /// Index of the replica in the slice given to [`route`].
        index: usize,
        /// The replica is not known to have the floor: wait for it there first.
        wait: bool,
    },
    /// Read on the primary, for this reason.
    Primary(PrimaryReason),
}

/// Places one read.
///
/// With a floor: a replica known to cover it, else — when waiting is allowed — the replica with
/// the highest known replay position, which is the likeliest to catch up within the budget.
/// Without a floor: a replica inside the lag bound. Among the replicas that qualify, the least
/// busy one; `spin` rotates among equally busy ones.
pub fn route(request: &ReadRequest, replicas: &[ReplicaState]) -> Decision {
    // No lists built: this runs for every routed read, so each choice is a filter walked again
    // (a handful of replicas) rather than a vector allocated per step.
    let serving = |i: &usize| replicas[*i].is_serving();
    if !(0..replicas.len()).any(|i| serving(&i)) {
        return Decision::Primary(PrimaryReason::NoReplica);
    }
    // The least busy serving replica that `qualifies`, `spin` rotating among equally busy ones.
    let pick = |qualifies: &dyn Fn(&ReplicaState) -> bool| {
        let among = || (0..replicas.len()).filter(|i| serving(i) && qualifies(&replicas[*i]));
        let least = among().map(|i| replicas[i].busy).min()?;
        let idle = || among().filter(|&i| replicas[i].busy == least);
        idle().nth(request.spin % idle().count())
    };
    match request.floor {
        Some(floor) => {
            if let Some(index) = pick(&|r| r.covers(floor)) {
                return Decision::Replica { index, wait: false };
            }
            if !request.may_wait {
                return Decision::Primary(PrimaryReason::NotCaughtUp);
            }
            let best = (0..replicas.len())
                .filter(serving)
                .map(|i| replicas[i].replayed)
                .max()
                .flatten();
            let index = pick(&|r| r.replayed == best).expect("the best is a serving replica's");
            Decision::Replica { index, wait: true }
        }
        None => match pick(&|r| request.lag_bound.admits(r)) {
            Some(index) => Decision::Replica { index, wait: false },
            None => Decision::Primary(PrimaryReason::AllLagging),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn standby(replayed: u64) -> ReplicaState {
        ReplicaState {
            healthy: true,
            role: Role::Replica,
            replayed: Some(Lsn::new(replayed)),
            ..ReplicaState::default()
        }
    }

    fn read(floor: Option<u64>, may_wait: bool, spin: usize) -> ReadRequest {
        ReadRequest {
            floor: floor.map(Lsn::new),
            may_wait,
            lag_bound: LagBound::default(),
            spin,
        }
    }

    #[test]
    fn covered_floor_reads_at_once_on_a_covering_replica() {
        let replicas = [standby(10), standby(50), standby(40)];
        for spin in 0..4 {
            let decision = route(&read(Some(40), true, spin), &replicas);
            assert!(matches!(
                decision,
                Decision::Replica {
                    index: 1 | 2,
                    wait: false
                }
            ));
        }
    }

    #[test]
    fn uncovered_floor_waits_on_the_most_advanced_replica() {
        let replicas = [standby(10), standby(30), standby(20)];
        assert_eq!(
            route(&read(Some(99), true, 7), &replicas),
            Decision::Replica {
                index: 1,
                wait: true
            }
        );
        assert_eq!(
            route(&read(Some(99), false, 7), &replicas),
            Decision::Primary(PrimaryReason::NotCaughtUp)
        );
    }

    #[test]
    fn promoted_and_down_replicas_are_skipped() {
        let mut promoted = standby(100);
        promoted.role = Role::Primary;
        let mut down = standby(100);
        down.healthy = false;
        assert_eq!(
            route(&read(Some(5), true, 0), &[promoted, down]),
            Decision::Primary(PrimaryReason::NoReplica)
        );
        assert_eq!(
            route(&read(Some(5), true, 0), &[promoted, down, standby(1)]),
            Decision::Replica {
                index: 2,
                wait: true
            }
        );
    }

    #[test]
    fn reads_without_a_floor_respect_the_lag_bound_and_rotate() {
        let mut lagging = standby(1);
        lagging.lag_bytes = Some(10_000_000);
        let replicas = [standby(5), lagging, standby(5)];
        let mut request = read(None, true, 0);
        request.lag_bound.max_bytes = Some(1_000_000);
        let mut seen = std::collections::BTreeSet::new();
        for spin in 0..10 {
            request.spin = spin;
            match route(&request, &replicas) {
                Decision::Replica { index, wait: false } => {
                    seen.insert(index);
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(
            route(&request, &[lagging]),
            Decision::Primary(PrimaryReason::AllLagging)
        );
    }

    #[test]
    fn the_least_busy_of_the_qualifying_replicas_gets_the_read() {
        let busy = |replayed: u64, busy: usize| ReplicaState {
            busy,
            ..standby(replayed)
        };
        // Covering replicas: the idle one, whatever the spin; a busier replica that does not
        // cover the floor is never preferred for being idle.
        let replicas = [busy(50, 3), busy(50, 1), busy(10, 0), busy(50, 1)];
        let mut seen = std::collections::BTreeSet::new();
        for spin in 0..8 {
            match route(&read(Some(40), true, spin), &replicas) {
                Decision::Replica { index, wait: false } => {
                    seen.insert(index);
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![1, 3]);
        // Waiting: among the most advanced, the least busy.
        let replicas = [busy(30, 2), busy(30, 0), busy(20, 0)];
        for spin in 0..4 {
            assert_eq!(
                route(&read(Some(99), true, spin), &replicas),
                Decision::Replica {
                    index: 1,
                    wait: true
                }
            );
        }
        // No floor: the least busy inside the lag bound.
        let mut lagging = busy(1, 0);
        lagging.lag_bytes = Some(10_000_000);
        let mut request = read(None, true, 0);
        request.lag_bound.max_bytes = Some(1_000_000);
        for spin in 0..4 {
            request.spin = spin;
            assert_eq!(
                route(&request, &[busy(5, 4), lagging, busy(5, 2)]),
                Decision::Replica {
                    index: 2,
                    wait: false
                }
            );
        }
    }

    /// `route` as it was written first, building a list at each step: the allocation-free
    /// version must choose exactly as this one does.
    fn route_by_lists(request: &ReadRequest, replicas: &[ReplicaState]) -> Decision {
        let serving: Vec<usize> = (0..replicas.len())
            .filter(|&i| replicas[i].is_serving())
            .collect();
        if serving.is_empty() {
            return Decision::Primary(PrimaryReason::NoReplica);
        }
        let pick = |among: &[usize]| {
            let least = among.iter().map(|&i| replicas[i].busy).min().unwrap_or(0);
            let idle: Vec<usize> = among
                .iter()
                .copied()
                .filter(|&i| replicas[i].busy == least)
                .collect();
            idle[request.spin % idle.len()]
        };
        let among = |keep: &dyn Fn(&ReplicaState) -> bool| -> Vec<usize> {
            serving
                .iter()
                .copied()
                .filter(|&i| keep(&replicas[i]))
                .collect()
        };
        match request.floor {
            Some(floor) => {
                let covering = among(&|r| r.covers(floor));
                if !covering.is_empty() {
                    return Decision::Replica {
                        index: pick(&covering),
                        wait: false,
                    };
                }
                if !request.may_wait {
                    return Decision::Primary(PrimaryReason::NotCaughtUp);
                }
                let best = serving
                    .iter()
                    .map(|&i| replicas[i].replayed)
                    .max()
                    .flatten();
                Decision::Replica {
                    index: pick(&among(&|r| r.replayed == best)),
                    wait: true,
                }
            }
            None => {
                let fresh = among(&|r| request.lag_bound.admits(r));
                if fresh.is_empty() {
                    Decision::Primary(PrimaryReason::AllLagging)
                } else {
                    Decision::Replica {
                        index: pick(&fresh),
                        wait: false,
                    }
                }
            }
        }
    }

    proptest! {
        #[test]
        fn chooses_as_the_list_building_version_did(
            positions in proptest::collection::vec(proptest::option::of(0u64..6), 0..6),
            healthy in proptest::collection::vec(any::<bool>(), 6),
            busy in proptest::collection::vec(0usize..3, 6),
            lags in proptest::collection::vec(proptest::option::of(0u64..6), 6),
            floor in proptest::option::of(0u64..8),
            max_bytes in proptest::option::of(0u64..6),
            may_wait: bool,
            spin: usize,
        ) {
            let replicas: Vec<ReplicaState> = positions.iter().enumerate().map(|(i, p)| ReplicaState {
                healthy: healthy[i],
                role: Role::Replica,
                replayed: p.map(Lsn::new),
                lag_bytes: lags[i],
                busy: busy[i],
                ..ReplicaState::default()
            }).collect();
            let request = ReadRequest {
                floor: floor.map(Lsn::new),
                may_wait,
                lag_bound: LagBound { max_bytes, max_lag: None },
                spin,
            };
            prop_assert_eq!(route(&request, &replicas), route_by_lists(&request, &replicas));
        }

        /// The guarantee in one line: a read that does not wait only ever lands on a replica
        /// known to have replayed its floor.
        #[test]
        fn never_reads_without_waiting_below_the_floor(
            positions in proptest::collection::vec(proptest::option::of(0u64..100), 0..5),
            healthy in proptest::collection::vec(any::<bool>(), 5),
            busy in proptest::collection::vec(0usize..3, 5),
            floor in 0u64..120,
            may_wait: bool,
            spin: usize,
        ) {
            let replicas: Vec<ReplicaState> = positions.iter().zip(&healthy).zip(&busy).map(|((p, h), b)| ReplicaState {
                healthy: *h,
                role: Role::Replica,
                replayed: p.map(Lsn::new),
                busy: *b,
                ..ReplicaState::default()
            }).collect();
            match route(&read(Some(floor), may_wait, spin), &replicas) {
                Decision::Replica { index, wait } => {
                    prop_assert!(replicas[index].is_serving());
                    if !wait {
                        prop_assert!(replicas[index].covers(Lsn::new(floor)));
                    } else {
                        prop_assert!(may_wait);
                    }
                }
                Decision::Primary(_) => {
                    prop_assert!(!replicas.iter().any(|r| r.is_serving() && r.covers(Lsn::new(floor))));
                }
            }
        }
    }
}
