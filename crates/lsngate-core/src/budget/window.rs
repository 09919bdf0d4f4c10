//! A window of lag samples, bounded in time and in count: what a long-running process keeps per
//! replica for the budget advice (the proxy's replay book, `lsngate lag --advise --serve`).

use std::time::Duration;

/// A window of lag samples, bounded in time and in count: what a long-running process (the
/// proxy, the library) keeps per replica for the advice.
#[derive(Debug, Clone, PartialEq)]
pub struct LagWindow {
    samples: std::collections::VecDeque<(Duration, Duration)>,
    span: Duration,
    capacity: usize,
}

impl LagWindow {
    /// Keeps samples no older than `span`, at most `capacity` of them (the oldest go first).
    pub fn new(span: Duration, capacity: usize) -> LagWindow {
        LagWindow {
            samples: std::collections::VecDeque::new(),
            span,
            capacity: capacity.max(1),
        }
    }

    /// A lag of `lag` was measured at `at` (times since the caller's origin, rising).
    pub fn push(&mut self, at: Duration, lag: Duration) {
        self.samples.push_back((at, lag));
        while self.samples.len() > self.capacity
            || self
                .samples
                .front()
                .is_some_and(|&(t, _)| at.saturating_sub(t) > self.span)
        {
            self.samples.pop_front();
        }
    }

    /// How far back before `now` the samples kept reach (the window they cover); `None` with
    /// none. Shorter than the span when the count bound dropped older ones.
    pub fn reach(&self, now: Duration) -> Option<Duration> {
        self.samples
            .iter()
            .find(|&&(t, _)| now.saturating_sub(t) <= self.span)
            .map(|&(t, _)| now.saturating_sub(t))
    }

    /// The samples within the span before `now`.
    pub fn lags(&self, now: Duration) -> Vec<Duration> {
        self.samples
            .iter()
            .filter(|&&(t, _)| now.saturating_sub(t) <= self.span)
            .map(|&(_, lag)| lag)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn a_lag_window_is_bounded_in_time_and_count() {
        let mut window = LagWindow::new(Duration::from_secs(10), 3);
        for i in 0..5u64 {
            window.push(Duration::from_secs(i), MS(i));
        }
        assert_eq!(window.lags(Duration::from_secs(5)), [MS(2), MS(3), MS(4)]);
        assert_eq!(
            window.reach(Duration::from_secs(5)),
            Some(Duration::from_secs(3)),
            "the count bound dropped the samples at 0 and 1 s"
        );
        assert_eq!(
            window.lags(Duration::from_secs(13)),
            [MS(3), MS(4)],
            "older than 10 s"
        );
    }
}
