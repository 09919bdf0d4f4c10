//! Per-database figures for SHOW STATS, STATS_TOTALS and STATS_AVERAGES, as PgBouncer names and
//! counts them: the totals are read live; the averages are over the last complete
//! `stats_period_ms` (PgBouncer's `stats_period`), from the totals the proxy's sampler takes at
//! the end of every period ([`Periods`]). Until the first period has ended they are over the
//! time since the proxy started, so a fresh proxy does not show zeros for a minute. A leaf: the
//! proxy reads its pools and counters into [`DatabaseStats`] (`Proxy::database_stats`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::traffic::TrafficTotals;

/// One database's totals: server assignments (checkouts), what its clients asked (queries,
/// transactions, bytes and the time they took) and the time checkouts queued.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DatabaseStats {
    pub assignments: u64,
    pub traffic: TrafficTotals,
    pub wait_us: u64,
}

impl DatabaseStats {
    /// (server_assignment_count, xact_count, query_count, received, sent, xact_time,
    /// query_time, wait_time) as totals, in PgBouncer's order and units (bytes, microseconds).
    pub fn totals(&self) -> [u64; 8] {
        let t = &self.traffic;
        [
            self.assignments,
            t.transactions,
            t.queries,
            t.received,
            t.sent,
            t.transaction_us,
            t.query_us,
            self.wait_us,
        ]
    }

    /// The same as averages of what was counted over `elapsed`: counts and bytes per second,
    /// times per transaction, per query and per server assignment.
    pub fn averages(&self, elapsed: Duration) -> [u64; 8] {
        let seconds = elapsed.as_secs_f64();
        let per_second = |n: u64| {
            if seconds > 0.0 {
                (n as f64 / seconds).round() as u64
            } else {
                0
            }
        };
        let mean = |sum: u64, count: u64| sum.checked_div(count).unwrap_or(0);
        let t = &self.traffic;
        [
            per_second(self.assignments),
            per_second(t.transactions),
            per_second(t.queries),
            per_second(t.received),
            per_second(t.sent),
            mean(t.transaction_us, t.transactions),
            mean(t.query_us, t.queries),
            mean(self.wait_us, self.assignments),
        ]
    }

    /// What was counted since `earlier` (counters only grow; a database new since then counts
    /// from zero).
    fn since(&self, earlier: &DatabaseStats) -> DatabaseStats {
        let (t, e) = (&self.traffic, &earlier.traffic);
        DatabaseStats {
            assignments: self.assignments.saturating_sub(earlier.assignments),
            traffic: TrafficTotals {
                queries: t.queries.saturating_sub(e.queries),
                query_us: t.query_us.saturating_sub(e.query_us),
                transactions: t.transactions.saturating_sub(e.transactions),
                transaction_us: t.transaction_us.saturating_sub(e.transaction_us),
                received: t.received.saturating_sub(e.received),
                sent: t.sent.saturating_sub(e.sent),
            },
            wait_us: self.wait_us.saturating_sub(earlier.wait_us),
        }
    }
}

/// The totals at one period's end.
#[derive(Debug, Clone)]
struct Snapshot {
    at: Instant,
    totals: BTreeMap<String, DatabaseStats>,
}

/// The totals at the ends of the last two periods.
#[derive(Debug, Default)]
pub struct Periods {
    previous: Option<Snapshot>,
    last: Option<Snapshot>,
}

impl Periods {
    /// A period ended at `at` with these totals (the sampler's first call, at start, begins the
    /// first period).
    pub fn ended(&mut self, at: Instant, totals: BTreeMap<String, DatabaseStats>) {
        self.previous = self.last.take();
        self.last = Some(Snapshot { at, totals });
    }

    /// Each database of `now`'s averages: over the last complete period when one has ended,
    /// otherwise over the time from `started` to `at`.
    pub fn averages(
        &self,
        now: &BTreeMap<String, DatabaseStats>,
        started: Instant,
        at: Instant,
    ) -> BTreeMap<String, [u64; 8]> {
        match (&self.previous, &self.last) {
            (Some(previous), Some(last)) => {
                let elapsed = last.at.saturating_duration_since(previous.at);
                now.keys()
                    .map(|database| {
                        let end = last.totals.get(database).copied().unwrap_or_default();
                        let start = previous.totals.get(database).copied().unwrap_or_default();
                        (database.clone(), end.since(&start).averages(elapsed))
                    })
                    .collect()
            }
            _ => {
                let elapsed = at.saturating_duration_since(started);
                now.iter()
                    .map(|(database, stats)| (database.clone(), stats.averages(elapsed)))
                    .collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(queries: u64, query_us: u64) -> DatabaseStats {
        DatabaseStats {
            assignments: queries,
            traffic: TrafficTotals {
                queries,
                query_us,
                transactions: queries,
                transaction_us: query_us,
                received: queries * 10,
                sent: queries * 100,
            },
            wait_us: 0,
        }
    }

    fn one(database: &str, value: DatabaseStats) -> BTreeMap<String, DatabaseStats> {
        BTreeMap::from([(database.to_string(), value)])
    }

    #[test]
    fn before_a_period_ends_the_averages_run_since_start() {
        let started = Instant::now();
        let mut periods = Periods::default();
        periods.ended(started, BTreeMap::new());
        let now = one("app", stats(100, 5_000));
        let averages = periods.averages(&now, started, started + Duration::from_secs(10));
        // 100 queries in 10 s, 50 µs each, 10 and 100 bytes each.
        assert_eq!(averages["app"], [10, 10, 10, 100, 1000, 50, 50, 0]);
    }

    #[test]
    fn after_a_period_the_averages_are_the_last_periods_alone() {
        let started = Instant::now();
        let mut periods = Periods::default();
        periods.ended(started, one("app", stats(0, 0)));
        // A busy first minute: 6,000 queries.
        let minute = started + Duration::from_secs(60);
        periods.ended(minute, one("app", stats(6_000, 600_000)));
        let now = one("app", stats(6_000, 600_000));
        let averages = periods.averages(&now, started, minute + Duration::from_secs(5));
        assert_eq!(
            averages["app"][2], 100,
            "queries per second over that minute"
        );
        assert_eq!(averages["app"][6], 100, "µs per query over that minute");
        // An idle second minute: the averages fall to zero, while the totals keep the past.
        let second = minute + Duration::from_secs(60);
        periods.ended(second, one("app", stats(6_000, 600_000)));
        let averages = periods.averages(&now, started, second);
        assert_eq!(averages["app"], [0; 8]);
    }

    #[test]
    fn a_database_new_in_the_period_counts_from_zero() {
        let started = Instant::now();
        let mut periods = Periods::default();
        periods.ended(started, BTreeMap::new());
        let end = started + Duration::from_secs(2);
        periods.ended(end, one("new", stats(20, 200)));
        let averages = periods.averages(&one("new", stats(20, 200)), started, end);
        assert_eq!(averages["new"][2], 10);
        assert_eq!(averages["new"][6], 10);
    }
}
