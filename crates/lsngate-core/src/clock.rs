//! The primary's WAL clock: samples of (when, primary position) that turn a replica's replay
//! position into a time lag — how long ago the primary first wrote WAL the replica lacks. Unlike
//! `now() - pg_last_xact_replay_timestamp()` this does not grow while the primary is idle.
//!
//! Pure: times are durations since any fixed origin the caller keeps (its own `Instant`), so a
//! test drives it with plain numbers.

use std::collections::VecDeque;
use std::time::Duration;

use crate::lsn::Lsn;

/// Rising (time, position) samples of the primary, at most `capacity` of them.
#[derive(Debug, Clone)]
pub struct WalClock {
    samples: VecDeque<(Duration, Lsn)>,
    capacity: usize,
}

impl WalClock {
    /// An empty clock keeping at most `capacity` samples (the oldest go first).
    pub fn new(capacity: usize) -> WalClock {
        WalClock {
            samples: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// The primary was at `lsn` at time `at`. Only positions past the last one are kept.
    pub fn observe(&mut self, at: Duration, lsn: Lsn) {
        if self.samples.back().is_none_or(|&(_, last)| lsn > last) {
            self.samples.push_back((at, lsn));
            if self.samples.len() > self.capacity {
                self.samples.pop_front();
            }
        }
    }

    /// The last sampled position.
    pub fn latest(&self) -> Option<Lsn> {
        self.samples.back().map(|&(_, lsn)| lsn)
    }

    /// How long before `now` the primary first wrote past `replayed`: zero when the replica has
    /// all the primary's known WAL; `None` before any sample. A gap older than the samples kept
    /// reads as the age of the oldest sample (a lower bound).
    pub fn lag_behind(&self, replayed: Lsn, now: Duration) -> Option<Duration> {
        let latest = self.latest()?;
        if replayed >= latest {
            return Some(Duration::ZERO);
        }
        // Positions rise strictly along the samples: bisect for the first one past `replayed`.
        let first_missing = self.samples.partition_point(|&(_, lsn)| lsn <= replayed);
        let (at, _) = self.samples.get(first_missing)?;
        Some(now.saturating_sub(*at))
    }

    /// For a replica whose replay just rose from `after` to `upto`: how long each primary
    /// position sampled in between (`after < position ≤ upto`) took to become visible there —
    /// each is a position a token could carry (a commit's, or the primary's at a poll), so these
    /// are the waits of token reads issued right after those commits. At most `most` of them,
    /// evenly spread, so that a replica catching up a long way does not flood the caller.
    ///
    /// The replica is known not to have had `upto` at `not_before` (its previous report) and to
    /// have it at `now`: replay passed a position somewhere in between, so its age is taken at
    /// the middle of that interval — off by at most half the time between two reports (a monitor
    /// polling every 20 ms: 10 ms) instead of all of it.
    pub fn ages_between(
        &self,
        after: Lsn,
        upto: Lsn,
        not_before: Option<Duration>,
        now: Duration,
        most: usize,
    ) -> Vec<Duration> {
        let from = self.samples.partition_point(|&(_, lsn)| lsn <= after);
        let to = self.samples.partition_point(|&(_, lsn)| lsn <= upto);
        let count = to.saturating_sub(from);
        let step = count.div_ceil(most.max(1)).max(1);
        (from..to)
            .step_by(step)
            .map(|i| {
                let written = self.samples[i].0;
                let unseen_until = not_before.map_or(written, |t| t.max(written)).min(now);
                (unseen_until + (now - unseen_until) / 2).saturating_sub(written)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rise_of_replay_ages_the_positions_it_passed() {
        let s = Duration::from_secs;
        let mut clock = WalClock::new(8);
        for i in 1..=4u64 {
            clock.observe(s(i), Lsn::new(i * 100));
        }
        let ms = Duration::from_millis;
        // No earlier report: replay could have passed them any time since they were written.
        assert_eq!(
            clock.ages_between(Lsn::new(100), Lsn::new(350), None, s(5), 8),
            [ms(1500), s(1)]
        );
        // Reported without them at 4 s, with them at 5 s: passed at about 4.5 s.
        assert_eq!(
            clock.ages_between(Lsn::new(0), Lsn::new(400), Some(s(4)), s(5), 2),
            [ms(3500), ms(1500)]
        );
        assert!(
            clock
                .ages_between(Lsn::new(400), Lsn::new(500), None, s(5), 8)
                .is_empty()
        );
    }

    #[test]
    fn lag_is_the_age_of_the_first_missing_write() {
        let s = Duration::from_secs;
        let mut clock = WalClock::new(8);
        assert_eq!(clock.lag_behind(Lsn::new(10), s(0)), None, "no samples yet");
        clock.observe(s(0), Lsn::new(100));
        clock.observe(s(1), Lsn::new(200));
        clock.observe(s(1), Lsn::new(150));
        clock.observe(s(2), Lsn::new(300));
        assert_eq!(clock.latest(), Some(Lsn::new(300)), "positions only rise");
        assert_eq!(clock.lag_behind(Lsn::new(300), s(3)), Some(Duration::ZERO));
        assert_eq!(clock.lag_behind(Lsn::new(150), s(3)), Some(s(2)));
        assert_eq!(clock.lag_behind(Lsn::new(50), s(3)), Some(s(3)));
    }

    #[test]
    fn the_oldest_samples_go_first() {
        let mut clock = WalClock::new(2);
        for i in 1..=3u64 {
            clock.observe(Duration::from_secs(i), Lsn::new(i * 100));
        }
        assert_eq!(
            clock.lag_behind(Lsn::new(150), Duration::from_secs(5)),
            Some(Duration::from_secs(3)),
            "the sample at 1 s was dropped"
        );
    }

    proptest::proptest! {
        /// The bisection finds the same first missing sample as a walk from the oldest.
        #[test]
        fn lag_is_the_age_of_the_first_sample_past_the_replica(
            steps in proptest::collection::vec((0u64..5, 0u64..50), 1..60),
            replayed in 0u64..1500,
            capacity in 1usize..16,
        ) {
            let mut clock = WalClock::new(capacity);
            let (mut at, mut position) = (0u64, 0u64);
            for (dt, dl) in steps {
                at += dt;
                position += dl;
                clock.observe(Duration::from_secs(at), Lsn::new(position));
            }
            let now = Duration::from_secs(at + 1);
            let walk = match clock.latest() {
                None => None,
                Some(latest) if Lsn::new(replayed) >= latest => Some(Duration::ZERO),
                Some(_) => clock
                    .samples
                    .iter()
                    .find(|&&(_, lsn)| lsn > Lsn::new(replayed))
                    .map(|&(t, _)| now - t),
            };
            proptest::prop_assert_eq!(clock.lag_behind(Lsn::new(replayed), now), walk);
        }
    }
}
