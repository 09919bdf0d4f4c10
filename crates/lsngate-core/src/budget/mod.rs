//! The budget advisor: which wait budget (`wait_timeout`, `WAIT FOR LSN ... TIMEOUT`) to choose,
//! from measured replay lag rather than a guess. The budget never decides correctness — the token
//! does — only who serves a token read and how late: within the budget a replica, past it the
//! primary. This module turns a replay-lag sample distribution per replica, a read rate and a pool
//! size into a table of candidate budgets and one recommendation.
//!
//! The model, and what it assumes:
//! - **A token read arrives right after its write** (read-your-writes: save, then show), so the
//!   replica needs the whole replay lag `L` to have it. `L` is drawn from the replica's samples:
//!   a sample is the time from a write on the primary to that write being visible on the replica
//!   (a heartbeat), or the primary's WAL-clock lag of the replica while the primary writes.
//! - **Reads spread evenly over the replicas** (the router sends a waiting read to the least busy
//!   one), each independent of the others. When replicas differ the real share is a little higher
//!   than predicted: a read may find another replica that has its token.
//! - `replica_share(b)` = the mean over replicas of P(L ≤ b): the empirical distribution, no fit.
//! - `fallbacks_per_s(b)` = rate × (1 − share).
//! - **A waiter holds a replica connection** until replay reaches its token or the budget runs
//!   out: for `min(L, b)`. Little's law gives the connections held waiting on a replica's pool:
//!   (rate / replicas) × E[min(L, b)] on average; at p99, the same rate over a stretch of time
//!   when lag sits at its p99 (lag is a state of the replica that lasts, not independent per
//!   read): (rate / replicas) × min(p99(L), b). Both are for the replica that holds the most, to
//!   compare with one replica pool's size. The read itself (after the wait) is not counted.
//! - **The guard's cap in the worst lag event seen**: every replica at once as far behind as the
//!   worst sample. A budget below that sends every read to the primary, which then runs
//!   rate × (one primary read's time) fallbacks at once (Little's law again); the cap is hit when
//!   that is more than [`GuardConfig::max_concurrent`](crate::GuardConfig).
//! - **The recommendation** is the smallest candidate whose share is within
//!   [`SHARE_TOLERANCE`] of the best share any candidate reaches whose p99 waiters fit the pool:
//!   a larger budget then buys almost nothing and holds connections longer. When even the
//!   smallest candidate's waiters do not fit the pool it says so.
//!
//! Pure: samples and numbers in, a table out. Gathering samples is the caller's (`lsngate lag
//! --advise` beats a heartbeat; the proxy samples its watcher's WAL-clock lag).

use std::time::Duration;

mod report;
mod window;

pub use report::{AdviceReport, ReplicaSummary, Window};
pub use window::LagWindow;

/// Budgets tried when the caller names none, in milliseconds.
pub const CANDIDATE_BUDGETS_MS: [u64; 12] =
    [1, 5, 10, 20, 50, 100, 200, 300, 500, 1000, 2000, 5000];

/// What one read on the primary takes when nothing better is known (a fallback holds a guard
/// slot that long): about a millisecond, as `crate::pace` counts on too.
pub const TYPICAL_PRIMARY_READ: Duration = Duration::from_millis(1);

/// A candidate whose replica share is within this of the best one is as good: the smallest such
/// budget is recommended.
pub const SHARE_TOLERANCE: f64 = 0.01;

/// One replica's measured replay lag.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaLag {
    /// How the replica is named to the user (`host:port`).
    pub name: String,
    /// Lag samples over the window, in any order.
    pub samples: Vec<Duration>,
}

impl ReplicaLag {
    /// Share of samples at or under `budget` (0 with no samples).
    pub fn share_within(&self, budget: Duration) -> f64 {
        if self.samples.is_empty() {
            return 0.0;
        }
        let within = self.samples.iter().filter(|&&l| l <= budget).count();
        within as f64 / self.samples.len() as f64
    }

    /// The `q` quantile (0–1) of the samples, nearest rank; `None` with no samples.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let mut sorted = self.samples.clone();
        sorted.sort_unstable();
        let rank = ((q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize).max(1);
        sorted.get(rank - 1).copied()
    }

    /// Mean time a waiter with budget `budget` holds a connection: E[min(L, budget)].
    fn mean_held(&self, budget: Duration) -> Duration {
        if self.samples.is_empty() {
            return Duration::ZERO;
        }
        let total: Duration = self.samples.iter().map(|&l| l.min(budget)).sum();
        total / self.samples.len() as u32
    }
}

/// What the advice is computed for, besides the lag.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Workload {
    /// Token reads per second arriving at the whole cluster.
    pub reads_per_second: f64,
    /// Server connections in one replica's pool.
    pub pool_size: usize,
    /// The primary guard's cap on concurrent fallback reads.
    pub guard_cap: usize,
    /// How long one read takes on the primary (a fallback holds a guard slot that long).
    pub primary_read: Duration,
}

/// The predicted outcome of one budget.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Candidate {
    /// The budget, in milliseconds.
    pub budget_ms: u64,
    /// Share (0–1) of token reads a replica serves within the budget.
    pub replica_share: f64,
    /// Reads per second that fall back to the primary.
    pub fallbacks_per_s: f64,
    /// Connections of the busiest replica pool held by waiting reads, on average.
    pub held_connections_mean: f64,
    /// The same while lag sits at its p99.
    pub held_connections_p99: f64,
    /// Whether the primary guard's cap would be hit in a lag event of the worst size seen.
    #[serde(skip)]
    pub guard_cap_hit: bool,
}

/// The table and the pick.
#[derive(Debug, Clone, PartialEq)]
pub struct Advice {
    /// One row per candidate budget, smallest first.
    pub candidates: Vec<Candidate>,
    /// The recommended budget, in milliseconds.
    pub recommended_budget_ms: u64,
    /// Why, in one line.
    pub reason: String,
    /// The worst lag sampled on any replica.
    pub worst_lag: Duration,
}

/// Why no advice can be given.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdviceError {
    /// No replica has a single sample.
    #[error(
        "no replay-lag samples: no replica was measured over the window; check that the replicas are up and streaming, or sample for longer"
    )]
    NoSamples,
    /// No candidate budgets.
    #[error("no candidate budgets given")]
    NoCandidates,
}

/// The candidate table for `budgets` (milliseconds, any order) and the recommended budget.
/// Replicas without samples are left out (a replica that is down serves nothing).
pub fn advise(
    replicas: &[ReplicaLag],
    workload: &Workload,
    budgets_ms: &[u64],
) -> Result<Advice, AdviceError> {
    let measured: Vec<&ReplicaLag> = replicas.iter().filter(|r| !r.samples.is_empty()).collect();
    if measured.is_empty() {
        return Err(AdviceError::NoSamples);
    }
    let mut budgets = budgets_ms.to_vec();
    budgets.sort_unstable();
    budgets.dedup();
    if budgets.is_empty() {
        return Err(AdviceError::NoCandidates);
    }
    let worst_lag = measured
        .iter()
        .flat_map(|r| r.samples.iter().copied())
        .max()
        .unwrap_or_default();
    let candidates: Vec<Candidate> = budgets
        .iter()
        .map(|&ms| candidate(&measured, workload, worst_lag, ms))
        .collect();
    let (recommended_budget_ms, reason) = recommend(&measured, workload, &candidates);
    Ok(Advice {
        candidates,
        recommended_budget_ms,
        reason,
        worst_lag,
    })
}

fn candidate(
    replicas: &[&ReplicaLag],
    workload: &Workload,
    worst_lag: Duration,
    budget_ms: u64,
) -> Candidate {
    let budget = Duration::from_millis(budget_ms);
    let rate = workload.reads_per_second.max(0.0);
    let per_replica = rate / replicas.len() as f64;
    let share =
        replicas.iter().map(|r| r.share_within(budget)).sum::<f64>() / replicas.len() as f64;
    let most = |held: fn(&ReplicaLag, Duration) -> Duration| {
        replicas
            .iter()
            .map(|r| per_replica * held(r, budget).as_secs_f64())
            .fold(0.0, f64::max)
    };
    let held_mean = most(|r, b| r.mean_held(b));
    let held_p99 = most(|r, b| r.quantile(0.99).unwrap_or_default().min(b));
    let fallbacks_in_event = if worst_lag > budget {
        rate * workload.primary_read.as_secs_f64()
    } else {
        0.0
    };
    Candidate {
        budget_ms,
        replica_share: share,
        fallbacks_per_s: rate * (1.0 - share),
        held_connections_mean: held_mean,
        held_connections_p99: held_p99,
        guard_cap_hit: fallbacks_in_event > workload.guard_cap as f64,
    }
}

fn recommend(
    replicas: &[&ReplicaLag],
    workload: &Workload,
    candidates: &[Candidate],
) -> (u64, String) {
    let pool = workload.pool_size as f64;
    let fits = |c: &&Candidate| c.held_connections_p99 <= pool;
    let p99 = replicas
        .iter()
        .filter_map(|r| r.quantile(0.99))
        .max()
        .unwrap_or_default();
    let Some(best) = candidates
        .iter()
        .filter(fits)
        .map(|c| c.replica_share)
        .reduce(f64::max)
    else {
        let smallest = &candidates[0];
        return (
            smallest.budget_ms,
            format!(
                "even {} ms holds {:.1} connections waiting at p99, more than the pool of {}: raise pool_size (or add replicas) before relying on replicas",
                smallest.budget_ms, smallest.held_connections_p99, workload.pool_size
            ),
        );
    };
    let pick = candidates
        .iter()
        .filter(fits)
        .find(|c| c.replica_share >= best - SHARE_TOLERANCE)
        .expect("the best fitting candidate is within tolerance of itself");
    let better_beyond_pool = candidates.iter().find(|c| {
        c.budget_ms > pick.budget_ms && c.replica_share > pick.replica_share + SHARE_TOLERANCE
    });
    let reason = if let Some(better) = better_beyond_pool {
        format!(
            "the pool of {} caps it: replicas serve {:.1}% of token reads at {} ms; {} ms would serve {:.1}% but hold {:.1} connections waiting at p99 — raise pool_size to go further",
            workload.pool_size,
            pick.replica_share * 100.0,
            pick.budget_ms,
            better.budget_ms,
            better.replica_share * 100.0,
            better.held_connections_p99
        )
    } else if pick.replica_share == 0.0 {
        format!(
            "no candidate lets a replica serve token reads (p99 replay lag {} ms): keep the budget small so reads fall back at once, and fix the lag",
            p99.as_millis()
        )
    } else {
        format!(
            "smallest budget at which replicas serve {:.1}% of token reads (p99 replay lag {} ms), holding {:.1} of {} pool connections at p99{}",
            pick.replica_share * 100.0,
            p99.as_millis(),
            pick.held_connections_p99,
            workload.pool_size,
            if pick.guard_cap_hit {
                "; a lag event as bad as the worst seen would exceed the primary guard's cap"
            } else {
                ""
            }
        )
    };
    (pick.budget_ms, reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn replica(name: &str, samples_ms: &[u64]) -> ReplicaLag {
        ReplicaLag {
            name: name.into(),
            samples: samples_ms.iter().map(|&ms| MS(ms)).collect(),
        }
    }

    fn workload(reads_per_second: f64, pool_size: usize) -> Workload {
        Workload {
            reads_per_second,
            pool_size,
            guard_cap: 32,
            primary_read: MS(1),
        }
    }

    fn row(advice: &Advice, budget_ms: u64) -> &Candidate {
        advice
            .candidates
            .iter()
            .find(|c| c.budget_ms == budget_ms)
            .unwrap()
    }

    #[test]
    fn a_replica_held_200ms_behind_serves_nothing_at_20ms_and_everything_at_1s() {
        let lag: Vec<u64> = (0..100).map(|i| 200 + i % 7).collect();
        let advice = advise(
            &[replica("r1", &lag)],
            &workload(100.0, 20),
            &CANDIDATE_BUDGETS_MS,
        )
        .unwrap();
        let (at20, at1s) = (row(&advice, 20), row(&advice, 1000));
        assert_eq!(at20.replica_share, 0.0);
        assert_eq!(at20.fallbacks_per_s, 100.0);
        assert_eq!(at1s.replica_share, 1.0);
        assert_eq!(at1s.fallbacks_per_s, 0.0);
        // Every read waits the whole 20 ms, then falls back: 100/s × 20 ms = 2 connections.
        assert!((at20.held_connections_mean - 2.0).abs() < 1e-9);
        // At 1 s each read waits out its lag (~203 ms): 100/s × 0.203 s ≈ 20.3; p99 206 ms.
        assert!((at1s.held_connections_mean - 20.3).abs() < 0.1);
        assert!((at1s.held_connections_p99 - 20.6).abs() < 1e-9);
        assert_eq!(advice.worst_lag, MS(206));
    }

    #[test]
    fn recommends_the_smallest_budget_that_reaches_the_best_share() {
        // Lag 40–60 ms: 50 ms serves half, 100 ms all; 200 ms buys nothing more.
        let lag: Vec<u64> = (40..=60).collect();
        let advice = advise(
            &[replica("r", &lag)],
            &workload(50.0, 10),
            &[20, 50, 100, 200],
        )
        .unwrap();
        assert_eq!(advice.recommended_budget_ms, 100);
        assert!(
            advice.reason.starts_with("smallest budget"),
            "{}",
            advice.reason
        );
        assert!(advice.reason.contains("100.0%"), "{}", advice.reason);
    }

    #[test]
    fn a_small_pool_caps_the_budget() {
        // 1000 reads/s, lag 300 ms: waiting out the lag holds 300 connections, the pool has 50.
        // 20 ms holds 20 of them; 50 ms holds 50 (fits); 100 ms holds 100 (does not).
        let lag = [300u64; 10];
        let advice = advise(
            &[replica("r", &lag)],
            &workload(1000.0, 50),
            &[20, 50, 100, 500],
        )
        .unwrap();
        assert_eq!(advice.recommended_budget_ms, 20, "{}", advice.reason);
        assert!(
            advice
                .reason
                .starts_with("the pool of 50 caps it: replicas serve 0.0%"),
            "{}",
            advice.reason
        );
        let lag: Vec<u64> = (1..=100).collect();
        let advice = advise(
            &[replica("r", &lag)],
            &workload(1000.0, 50),
            &[20, 50, 100, 500],
        )
        .unwrap();
        assert_eq!(advice.recommended_budget_ms, 50, "{}", advice.reason);
        assert!(
            advice
                .reason
                .contains("100 ms would serve 100.0% but hold 99.0 connections"),
            "{}",
            advice.reason
        );
        let advice = advise(&[replica("r", &[300])], &workload(10_000.0, 5), &[20, 50]).unwrap();
        assert_eq!(advice.recommended_budget_ms, 20);
        assert!(
            advice
                .reason
                .starts_with("even 20 ms holds 200.0 connections"),
            "{}",
            advice.reason
        );
    }

    #[test]
    fn a_lag_no_budget_covers_says_so() {
        let advice = advise(&[replica("r", &[9000; 4])], &workload(10.0, 100), &[20, 50]).unwrap();
        assert_eq!(advice.recommended_budget_ms, 20);
        assert!(
            advice
                .reason
                .starts_with("no candidate lets a replica serve"),
            "{}",
            advice.reason
        );
    }

    #[test]
    fn reads_spread_over_replicas() {
        // One replica always caught up (0 ms), one 100 ms behind: at 50 ms half the reads stay on
        // replicas; the held connections are the slow replica's: 50/s × 50 ms.
        let advice = advise(
            &[
                replica("fast", &[0; 10]),
                replica("slow", &[100; 10]),
                replica("down", &[]),
            ],
            &workload(100.0, 10),
            &[50, 200],
        )
        .unwrap();
        assert_eq!(row(&advice, 50).replica_share, 0.5);
        assert!((row(&advice, 50).held_connections_mean - 2.5).abs() < 1e-9);
        assert_eq!(advice.recommended_budget_ms, 200);
    }

    #[test]
    fn the_guard_cap_is_hit_only_below_the_worst_lag_and_above_its_throughput() {
        let lag = [10u64, 10, 10, 900];
        let mut busy = workload(50_000.0, 100_000);
        busy.primary_read = MS(1);
        let advice = advise(&[replica("r", &lag)], &busy, &[20, 1000]).unwrap();
        assert!(
            row(&advice, 20).guard_cap_hit,
            "50 000/s × 1 ms = 50 at once > 32"
        );
        assert!(
            !row(&advice, 1000).guard_cap_hit,
            "the worst lag is within 1 s"
        );
        let advice = advise(&[replica("r", &lag)], &workload(1000.0, 100), &[20]).unwrap();
        assert!(!row(&advice, 20).guard_cap_hit, "1000/s × 1 ms = 1 at once");
    }

    #[test]
    fn nothing_measured_is_an_error_that_says_what_to_do() {
        let err = advise(&[replica("r", &[])], &workload(1.0, 1), &[10]).unwrap_err();
        assert_eq!(err, AdviceError::NoSamples);
        assert!(err.to_string().contains("streaming"));
        let err = advise(&[replica("r", &[1])], &workload(1.0, 1), &[]).unwrap_err();
        assert_eq!(err, AdviceError::NoCandidates);
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let r = replica("r", &[5, 1, 3, 2, 4]);
        assert_eq!(r.quantile(0.5), Some(MS(3)));
        assert_eq!(r.quantile(0.99), Some(MS(5)));
        assert_eq!(r.quantile(0.0), Some(MS(1)));
        assert_eq!(replica("r", &[]).quantile(0.5), None);
    }

    proptest::proptest! {
        /// A longer budget never serves fewer reads from replicas nor holds fewer connections.
        #[test]
        fn share_and_held_connections_rise_with_the_budget(
            lag in proptest::collection::vec(0u64..2000, 1..50),
            rate in 0.0f64..5000.0,
        ) {
            let advice = advise(&[replica("r", &lag)], &workload(rate, 100), &CANDIDATE_BUDGETS_MS).unwrap();
            for pair in advice.candidates.windows(2) {
                proptest::prop_assert!(pair[0].replica_share <= pair[1].replica_share);
                proptest::prop_assert!(pair[0].held_connections_mean <= pair[1].held_connections_mean + 1e-9);
                proptest::prop_assert!(pair[0].fallbacks_per_s + 1e-9 >= pair[1].fallbacks_per_s);
            }
            proptest::prop_assert!(advice.candidates.iter().any(|c| c.budget_ms == advice.recommended_budget_ms));
        }
    }
}
