//! What the causal reads saw over the last 15 minutes, for the dashboard's charts: one point a
//! second — each replica's replay lag (WAL clock), causal reads, waits and fallbacks per second,
//! the breaker — in a fixed ring of [`POINTS`], so memory stays bounded however long the proxy
//! runs. The read rate the budget advice uses comes from here too (its lag samples are the replay
//! book's, `lsngate_core::replay`). Fed by one sampler task (`serve`); no I/O here.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lsngate_core::sync::lock;
use tokio::time::Instant;

/// How far back the rings reach.
pub const SPAN: Duration = Duration::from_secs(15 * 60);
/// Between two chart points (and two ticks of the sampler).
pub const POINT_EVERY: Duration = Duration::from_secs(1);
/// Chart points kept: [`SPAN`] at one a second.
pub const POINTS: usize = (SPAN.as_secs() / POINT_EVERY.as_secs()) as usize;
/// The read rate the advice uses is the mean over this much of the latest history.
pub const RATE_OVER: Duration = Duration::from_secs(60);

/// One second of the charts.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Point {
    /// Unix time, ms.
    pub at_ms: u64,
    /// Each replica's replay lag (WAL clock), ms; `null` when unknown.
    pub lag_ms: BTreeMap<String, Option<f64>>,
    /// Causal reads finished per second.
    pub reads_per_s: f64,
    /// Reads that waited on a replica per second.
    pub waits_per_s: f64,
    /// Reads that fell back to the primary per second.
    pub fallbacks_per_s: f64,
    /// The fallback breaker was open.
    pub breaker_open: bool,
}

/// Running totals read from the statistics at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Causal reads finished.
    pub reads: u64,
    /// Waits for a floor on a replica.
    pub waits: u64,
    /// Fallbacks to the primary.
    pub fallbacks: u64,
}

/// What one tick of the sampler observed.
#[derive(Debug, Clone)]
pub struct Observation {
    /// When.
    pub now: Instant,
    /// Each replica's address and WAL-clock lag.
    pub lags: Vec<(String, Option<Duration>)>,
    /// Statistics totals.
    pub totals: Totals,
    /// The breaker is open.
    pub breaker_open: bool,
}

#[derive(Debug, Default)]
struct Rings {
    points: VecDeque<Point>,
    last_point: Option<(Instant, Totals)>,
}

/// The rings, behind one lock.
#[derive(Debug, Default)]
pub struct History {
    rings: Mutex<Rings>,
}

impl History {
    /// Takes one observation: a chart point when [`POINT_EVERY`] has passed since the last one.
    pub fn observe(&self, seen: Observation) {
        let mut rings = lock(&self.rings);
        let now = seen.now;
        let due = rings
            .last_point
            .is_none_or(|(at, _)| now.saturating_duration_since(at) >= POINT_EVERY);
        if !due {
            return;
        }
        let (elapsed, before) = match rings.last_point {
            Some((at, totals)) => (now.saturating_duration_since(at).as_secs_f64(), totals),
            None => (0.0, seen.totals),
        };
        let per_s = |now: u64, before: u64| {
            if elapsed > 0.0 {
                now.saturating_sub(before) as f64 / elapsed
            } else {
                0.0
            }
        };
        let point = Point {
            at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            lag_ms: seen
                .lags
                .iter()
                .map(|(name, lag)| (name.clone(), lag.map(|l| l.as_secs_f64() * 1000.0)))
                .collect(),
            reads_per_s: per_s(seen.totals.reads, before.reads),
            waits_per_s: per_s(seen.totals.waits, before.waits),
            fallbacks_per_s: per_s(seen.totals.fallbacks, before.fallbacks),
            breaker_open: seen.breaker_open,
        };
        rings.last_point = Some((now, seen.totals));
        rings.points.push_back(point);
        while rings.points.len() > POINTS {
            rings.points.pop_front();
        }
    }

    /// The chart points, oldest first.
    pub fn points(&self) -> Vec<Point> {
        lock(&self.rings).points.iter().cloned().collect()
    }

    /// Mean causal reads per second over the last [`RATE_OVER`] of points.
    pub fn read_rate(&self) -> f64 {
        let rings = lock(&self.rings);
        let last = (RATE_OVER.as_secs_f64() / POINT_EVERY.as_secs_f64()) as usize;
        let recent: Vec<f64> = rings
            .points
            .iter()
            .rev()
            .take(last)
            .map(|p| p.reads_per_s)
            .collect();
        if recent.is_empty() {
            0.0
        } else {
            recent.iter().sum::<f64>() / recent.len() as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(now: Instant, reads: u64) -> Observation {
        Observation {
            now,
            lags: vec![("r:1".into(), Some(Duration::from_millis(5)))],
            totals: Totals {
                reads,
                waits: reads / 2,
                fallbacks: 0,
            },
            breaker_open: false,
        }
    }

    #[test]
    fn the_ring_stays_bounded_and_rates_come_from_deltas() {
        let history = History::default();
        let t0 = Instant::now();
        history.observe(seen(t0, 0));
        history.observe(seen(t0 + POINT_EVERY / 2, 3));
        assert_eq!(
            history.points().len(),
            1,
            "half a second later is no new point"
        );
        for i in 1..(POINTS as u64 + 50) {
            history.observe(seen(t0 + POINT_EVERY * i as u32, i * 10));
        }
        let points = history.points();
        assert_eq!(points.len(), POINTS);
        assert_eq!(points.last().unwrap().reads_per_s, 10.0);
        assert_eq!(points.last().unwrap().waits_per_s, 5.0);
        assert_eq!(points.last().unwrap().lag_ms["r:1"], Some(5.0));
        assert_eq!(history.read_rate(), 10.0);
    }
}
