//! The primary guard: what happens when reads fall back to the primary, and how many may.
//!
//! When a token's budget is spent, or no replica can serve, a read "falls back" to the primary.
//! One replica stalling is harmless; a cluster-wide lag event (a bulk load, a long report pausing
//! replay) times out every waiter at once and would move the whole read load onto the primary
//! that is busy with the very writes causing the lag. [`PrimaryGuard`] bounds that: a cap on
//! concurrent fallbacks plus a circuit breaker on the fallback *rate*. What a refused read does
//! instead ([`WhenGuarded`]: wait, fail fast, serve stale) is the caller's policy.
//!
//! Pure state machine: time is passed in as a [`Duration`] since any fixed origin, so every
//! transition is a plain function call in a test. It is not a scheduler; [`SharedGuard`] is the
//! one lock around it that the library and the proxy share, and `crate::pace` says how long a
//! refused read that queues pauses between tries.

use std::time::Duration;

/// What to do with a token read whose replica could not serve it in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fallback {
    /// Read the primary (subject to the [`PrimaryGuard`]). Always fresh, costs primary capacity.
    #[default]
    Primary,
    /// Return an error naming the token and the replica positions; the caller decides.
    Error,
    /// Return the replica's answer flagged stale, so the caller can show an optimistic value.
    /// When no replica answered at all (every one unreachable) the primary is read instead.
    Stale,
}

/// What a read does when the guard refuses it a primary slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WhenGuarded {
    /// Queue for a slot, up to the configured queue timeout, then fail.
    #[default]
    Wait,
    /// Fail at once with an error that says the primary is being protected.
    FailFast,
    /// Serve the replica's (possibly stale) answer, flagged; fail when there is none.
    ServeStale,
}

/// Limits of the guard. `Default`: 32 concurrent fallbacks; the breaker opens for 5 s when more
/// than half of at least 50 reads in the last 10 s fell back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GuardConfig {
    /// Most fallback reads running on the primary at once.
    pub max_concurrent: usize,
    /// Length of one rate window; the rate is taken over the current and the previous window.
    pub window: Duration,
    /// Fewer reads than this in the two windows never trip the breaker (no verdict on 3 reads).
    pub min_reads: u32,
    /// Fallback share (0.0–1.0) above which the breaker opens.
    pub max_fallback_ratio: f64,
    /// How long the breaker stays open before fallbacks are admitted again.
    pub open_for: Duration,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            max_concurrent: 32,
            window: Duration::from_secs(10),
            min_reads: 50,
            max_fallback_ratio: 0.5,
            open_for: Duration::from_secs(5),
        }
    }
}

/// Breaker position, as exported in metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Fallbacks admitted (up to the cap).
    Closed,
    /// Fallbacks refused until `until` (same time origin as the calls).
    Open {
        /// When fallbacks are admitted again.
        until: Duration,
    },
}

/// Why the guard refused a fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "the primary already serves {in_flight} fallback reads (the cap); raise the cap or the replica budget, or add replicas"
    )]
    /// The cap on concurrent fallbacks is reached.
    AtCapacity {
        /// Fallback reads running on the primary now.
        in_flight: usize,
    },
    #[error(
        "the fallback circuit breaker is open (too many reads fell back to the primary recently); replicas are lagging — check replay lag, or raise the budget"
    )]
    /// The breaker on the fallback rate is open.
    BreakerOpen,
}

/// Counts of one rate window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Window {
    start: Duration,
    reads: u32,
    fallbacks: u32,
}

/// Concurrency cap and fallback-rate breaker for one primary.
#[derive(Debug, Clone)]
pub struct PrimaryGuard {
    config: GuardConfig,
    in_flight: usize,
    previous: Window,
    current: Window,
    open_until: Option<Duration>,
}

impl PrimaryGuard {
    /// A closed guard with no history.
    pub fn new(config: GuardConfig) -> PrimaryGuard {
        PrimaryGuard {
            config,
            in_flight: 0,
            previous: Window::default(),
            current: Window::default(),
            open_until: None,
        }
    }

    /// The limits in force.
    pub fn config(&self) -> &GuardConfig {
        &self.config
    }

    /// Records one finished read (replica or primary) for the rate; `fell_back` when it was
    /// served by the primary as a fallback.
    pub fn record(&mut self, now: Duration, fell_back: bool) {
        self.roll(now);
        self.current.reads = self.current.reads.saturating_add(1);
        if fell_back {
            self.current.fallbacks = self.current.fallbacks.saturating_add(1);
        }
        let (reads, fallbacks) = self.counts();
        if self.open_until.is_none()
            && reads >= self.config.min_reads
            && f64::from(fallbacks) > self.config.max_fallback_ratio * f64::from(reads)
        {
            self.open_until = Some(now + self.config.open_for);
            // Start the next verdict from a clean slate, or it would re-open at once.
            self.previous = Window::default();
            self.current = Window {
                start: now,
                ..Window::default()
            };
        }
    }

    /// Asks for a primary slot for one fallback read. On `Ok` the caller must call
    /// [`PrimaryGuard::release`] when the read is done.
    pub fn try_admit(&mut self, now: Duration) -> Result<(), Refusal> {
        if let BreakerState::Open { .. } = self.state(now) {
            return Err(Refusal::BreakerOpen);
        }
        if self.in_flight >= self.config.max_concurrent {
            return Err(Refusal::AtCapacity {
                in_flight: self.in_flight,
            });
        }
        self.in_flight += 1;
        Ok(())
    }

    /// Returns a slot taken with [`PrimaryGuard::try_admit`].
    pub fn release(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// Fallbacks running now.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The breaker position at `now` (an elapsed open period closes it).
    pub fn state(&mut self, now: Duration) -> BreakerState {
        match self.open_until {
            Some(until) if now < until => BreakerState::Open { until },
            Some(_) => {
                self.open_until = None;
                BreakerState::Closed
            }
            None => BreakerState::Closed,
        }
    }

    /// Share of recent reads that fell back (0.0 with no reads).
    pub fn fallback_rate(&mut self, now: Duration) -> f64 {
        self.roll(now);
        let (reads, fallbacks) = self.counts();
        if reads == 0 {
            0.0
        } else {
            f64::from(fallbacks) / f64::from(reads)
        }
    }

    fn counts(&self) -> (u32, u32) {
        (
            self.previous.reads + self.current.reads,
            self.previous.fallbacks + self.current.fallbacks,
        )
    }

    fn roll(&mut self, now: Duration) {
        let window = self.config.window.max(Duration::from_millis(1));
        if now < self.current.start + window {
            return;
        }
        // A gap longer than two windows leaves no relevant history.
        self.previous = if now < self.current.start + 2 * window {
            self.current
        } else {
            Window::default()
        };
        self.current = Window {
            start: now,
            reads: 0,
            fallbacks: 0,
        };
    }
}

/// What a dashboard or a metric shows of a guard.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GuardStatus {
    /// The breaker is open: fallbacks are refused.
    pub breaker_open: bool,
    /// Fallback reads running on the primary now.
    pub in_flight: usize,
    /// Share of recent reads that fell back.
    pub fallback_rate: f64,
}

/// One [`PrimaryGuard`] shared by every read of a gate or a proxy, behind a lock held only for
/// the state machine's arithmetic. Time is still passed in (a duration since the caller's origin).
#[derive(Debug)]
pub struct SharedGuard(std::sync::Mutex<PrimaryGuard>);

impl SharedGuard {
    /// A closed guard with no history.
    pub fn new(config: GuardConfig) -> SharedGuard {
        SharedGuard(std::sync::Mutex::new(PrimaryGuard::new(config)))
    }

    /// See [`PrimaryGuard::try_admit`]; on `Ok` call [`SharedGuard::release`] after the read.
    pub fn try_admit(&self, now: Duration) -> Result<(), Refusal> {
        crate::sync::lock(&self.0).try_admit(now)
    }

    /// Returns a slot taken with [`SharedGuard::try_admit`].
    pub fn release(&self) {
        crate::sync::lock(&self.0).release();
    }

    /// Records one finished read (see [`PrimaryGuard::record`]) and tells where that leaves the
    /// guard.
    pub fn record(&self, now: Duration, fell_back: bool) -> GuardStatus {
        let mut guard = crate::sync::lock(&self.0);
        guard.record(now, fell_back);
        status(&mut guard, now)
    }

    /// Where the guard stands at `now`.
    pub fn status(&self, now: Duration) -> GuardStatus {
        status(&mut crate::sync::lock(&self.0), now)
    }
}

fn status(guard: &mut PrimaryGuard, now: Duration) -> GuardStatus {
    GuardStatus {
        breaker_open: matches!(guard.state(now), BreakerState::Open { .. }),
        in_flight: guard.in_flight(),
        fallback_rate: guard.fallback_rate(now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn config() -> GuardConfig {
        GuardConfig {
            max_concurrent: 2,
            window: ms(1000),
            min_reads: 10,
            max_fallback_ratio: 0.5,
            open_for: ms(500),
        }
    }

    #[test]
    fn cap_bounds_concurrent_fallbacks() {
        let mut guard = PrimaryGuard::new(config());
        assert_eq!(guard.try_admit(ms(0)), Ok(()));
        assert_eq!(guard.try_admit(ms(0)), Ok(()));
        assert_eq!(
            guard.try_admit(ms(0)),
            Err(Refusal::AtCapacity { in_flight: 2 })
        );
        guard.release();
        assert_eq!(guard.try_admit(ms(1)), Ok(()));
        assert_eq!(guard.in_flight(), 2);
    }

    #[test]
    fn breaker_opens_on_a_high_fallback_rate_and_closes_after_the_pause() {
        let mut guard = PrimaryGuard::new(config());
        for i in 0..9 {
            guard.record(ms(i), true);
        }
        // 9 reads: below min_reads, no verdict yet.
        assert_eq!(guard.state(ms(10)), BreakerState::Closed);
        guard.record(ms(10), true);
        assert_eq!(guard.state(ms(11)), BreakerState::Open { until: ms(510) });
        assert_eq!(guard.try_admit(ms(11)), Err(Refusal::BreakerOpen));
        assert_eq!(guard.state(ms(510)), BreakerState::Closed);
        assert_eq!(guard.try_admit(ms(510)), Ok(()));
    }

    #[test]
    fn a_low_fallback_rate_keeps_the_breaker_closed() {
        let mut guard = PrimaryGuard::new(config());
        for i in 0..100 {
            guard.record(ms(i), i % 4 == 0);
        }
        assert_eq!(guard.state(ms(100)), BreakerState::Closed);
        assert!((guard.fallback_rate(ms(100)) - 0.25).abs() < 1e-9);
    }

    #[test]
    fn old_windows_are_forgotten() {
        let mut guard = PrimaryGuard::new(config());
        for i in 0..5 {
            guard.record(ms(i), true);
        }
        assert_eq!(guard.fallback_rate(ms(5)), 1.0);
        assert_eq!(
            guard.fallback_rate(ms(1500)),
            1.0,
            "previous window still counts"
        );
        assert_eq!(guard.fallback_rate(ms(5000)), 0.0);
    }

    proptest! {
        /// Whatever happens, the cap holds and the breaker refuses only while open.
        #[test]
        fn cap_and_breaker_hold(events in proptest::collection::vec((0u8..4, 0u64..50), 0..300)) {
            let mut guard = PrimaryGuard::new(config());
            let mut now = 0u64;
            for (kind, step) in events {
                now += step;
                match kind {
                    0 => {
                        let open = matches!(guard.clone().state(ms(now)), BreakerState::Open { .. });
                        let full = guard.in_flight() >= 2;
                        let admitted = guard.try_admit(ms(now)).is_ok();
                        prop_assert_eq!(admitted, !open && !full);
                    }
                    1 => guard.release(),
                    2 => guard.record(ms(now), true),
                    _ => guard.record(ms(now), false),
                }
                prop_assert!(guard.in_flight() <= 2);
                let rate = guard.fallback_rate(ms(now));
                prop_assert!((0.0..=1.0).contains(&rate));
            }
        }
    }
}
