//! Counters of causal reads, kept twice: in the `metrics` facade for Prometheus and as plain
//! atomics the `/status` document and the dashboard read back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::tally::{Tally, WAIT_BUCKETS_MS};

/// How one read with a floor (or a routed replica read) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A replica already known to have the floor served it: no wait.
    Replica,
    /// A replica served it after waiting (or checking) for the floor.
    Waited,
    /// The primary served it: no replica had the floor within the budget.
    Fallback,
    /// The primary served it: no replica was up.
    NoReplica,
    /// The replica's possibly stale answer was served, flagged (fallback = stale).
    Stale,
    /// The client got an error instead (fallback = error, or the primary guard refused).
    Error,
}

impl Outcome {
    /// Every outcome, in export order.
    pub const ALL: [Outcome; 6] = [
        Outcome::Replica,
        Outcome::Waited,
        Outcome::Fallback,
        Outcome::NoReplica,
        Outcome::Stale,
        Outcome::Error,
    ];

    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Replica => "replica",
            Outcome::Waited => "waited",
            Outcome::Fallback => "fallback",
            Outcome::NoReplica => "no_replica",
            Outcome::Stale => "stale",
            Outcome::Error => "error",
        }
    }
}

/// Read outcomes and wait times.
#[derive(Debug)]
pub struct Stats {
    /// Reads per outcome, handed to `lsngate_proxy_causal_reads_total` at each scrape.
    outcomes: [Tally; 6],
    /// Fallback reads the primary guard refused a slot, once per read however often it asks
    /// (`lsngate_proxy_guard_refused_reads_total`).
    pub refused: Tally,
    /// Of those, reads sent to a replica seen to have their floor while they queued for a slot
    /// (`lsngate_proxy_guard_rescued_reads_total`).
    pub rescued: Tally,
    waits: [AtomicU64; 13],
    wait_micros: AtomicU64,
    wait_histogram: metrics::Histogram,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            outcomes: Outcome::ALL.map(|o| {
                Tally::new(metrics::counter!(
                    "lsngate_proxy_causal_reads_total",
                    "outcome" => o.as_str()
                ))
            }),
            refused: Tally::new(metrics::counter!("lsngate_proxy_guard_refused_reads_total")),
            rescued: Tally::new(metrics::counter!("lsngate_proxy_guard_rescued_reads_total")),
            waits: Default::default(),
            wait_micros: AtomicU64::new(0),
            wait_histogram: metrics::histogram!("lsngate_proxy_wait_seconds"),
        }
    }
}

impl Stats {
    /// Counts one finished read.
    pub fn record(&self, outcome: Outcome) {
        let i = Outcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0);
        self.outcomes[i].add(1);
    }

    /// Records how long a read waited for its floor on a replica (successful or not).
    pub fn record_wait(&self, waited: Duration) {
        let ms = waited.as_secs_f64() * 1000.0;
        let bucket = WAIT_BUCKETS_MS
            .iter()
            .position(|&b| ms <= b)
            .unwrap_or(WAIT_BUCKETS_MS.len());
        self.waits[bucket].fetch_add(1, Ordering::Relaxed);
        self.wait_micros
            .fetch_add(waited.as_micros() as u64, Ordering::Relaxed);
        self.wait_histogram.record(waited.as_secs_f64());
    }

    /// Hands the outcomes counted since the last scrape to the metrics registry.
    pub fn report(&self) {
        self.outcomes.iter().for_each(Tally::report);
        self.refused.report();
        self.rescued.report();
    }

    /// (outcome, count) pairs.
    pub fn outcomes(&self) -> Vec<(&'static str, u64)> {
        Outcome::ALL
            .iter()
            .zip(&self.outcomes)
            .map(|(o, n)| (o.as_str(), n.count()))
            .collect()
    }

    /// (bucket upper bound in ms or "+Inf", count) pairs, non-cumulative, and the total wait.
    pub fn waits(&self) -> (Vec<(String, u64)>, Duration) {
        let buckets = WAIT_BUCKETS_MS
            .iter()
            .map(|b| b.to_string())
            .chain(["+Inf".to_string()])
            .zip(&self.waits)
            .map(|(b, n)| (b, n.load(Ordering::Relaxed)))
            .collect();
        (
            buckets,
            Duration::from_micros(self.wait_micros.load(Ordering::Relaxed)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_land_in_their_bucket() {
        let stats = Stats::default();
        stats.record_wait(Duration::from_micros(300));
        stats.record_wait(Duration::from_millis(30));
        stats.record_wait(Duration::from_secs(9));
        let (buckets, total) = stats.waits();
        let count = |label: &str| buckets.iter().find(|(b, _)| b == label).unwrap().1;
        assert_eq!((count("0.5"), count("50"), count("+Inf")), (1, 1, 1));
        assert!(total > Duration::from_secs(9));
        stats.record(Outcome::Waited);
        assert!(stats.outcomes().contains(&("waited", 1)));
    }
}
