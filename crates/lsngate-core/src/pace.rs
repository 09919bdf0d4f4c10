//! How often lsngate tries again while a read waits: for a primary-guard slot (a fallback read
//! queued under [`WhenGuarded::Wait`]) and for a replica's replay to reach a floor (PostgreSQL ≤
//! 18, no `WAIT FOR LSN`). One number each, for the library and the proxy. Pure: it says how long
//! to pause; the caller sleeps on its own runtime.

use std::time::Duration;

use crate::guard::WhenGuarded;

/// Pause between two tries for a primary-guard slot. A fallback read on the primary takes about
/// a millisecond, so a slot frees up at that pace; 2 ms keeps a queued read within a read or two
/// of the slot it waits for (5 ms, the library's old pause, left it up to five reads late), and a
/// try costs one uncontended lock.
pub const GUARD_QUEUE_PAUSE: Duration = Duration::from_millis(2);

/// The first pause between two replay checks on one server.
pub const REPLAY_FIRST_PAUSE: Duration = Duration::from_millis(1);

/// The longest pause between two replay checks. A check costs the replica one trivial query;
/// what the read loses is the time between replay reaching its floor and the next check. 10 ms
/// bounds that by the order of a healthy replica's lag (the library's old 25 ms cap could add
/// more than the lag itself), at most ~100 checks per second per waiting read.
pub const REPLAY_MAX_PAUSE: Duration = Duration::from_millis(10);

/// How long a read refused a guard slot pauses before trying again, `left` being what remains of
/// its queue deadline; `None`: it does not queue (another [`WhenGuarded`] policy, or the deadline
/// has passed) and takes the refusal.
pub fn guard_queue_pause(when_guarded: WhenGuarded, left: Duration) -> Option<Duration> {
    (when_guarded == WhenGuarded::Wait && !left.is_zero()).then(|| GUARD_QUEUE_PAUSE.min(left))
}

/// Pauses between replay checks: [`REPLAY_FIRST_PAUSE`], doubling up to [`REPLAY_MAX_PAUSE`],
/// never past the deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayBackoff {
    next: Duration,
}

impl Default for ReplayBackoff {
    fn default() -> Self {
        ReplayBackoff {
            next: REPLAY_FIRST_PAUSE,
        }
    }
}

impl ReplayBackoff {
    /// The pause before the next check, `left` being what remains of the budget.
    pub fn next_pause(&mut self, left: Duration) -> Duration {
        let pause = self.next.min(left);
        self.next = (self.next * 2).min(REPLAY_MAX_PAUSE);
        pause
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn replay_pauses_double_to_the_cap_and_never_pass_the_deadline() {
        let mut backoff = ReplayBackoff::default();
        let pauses: Vec<_> = (0..6).map(|_| backoff.next_pause(MS(1000))).collect();
        assert_eq!(pauses, [MS(1), MS(2), MS(4), MS(8), MS(10), MS(10)]);
        assert_eq!(backoff.next_pause(MS(3)), MS(3));
        assert_eq!(backoff.next_pause(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn only_a_waiting_read_with_time_left_queues() {
        assert_eq!(
            guard_queue_pause(WhenGuarded::Wait, MS(100)),
            Some(GUARD_QUEUE_PAUSE)
        );
        assert_eq!(guard_queue_pause(WhenGuarded::Wait, MS(1)), Some(MS(1)));
        assert_eq!(guard_queue_pause(WhenGuarded::Wait, Duration::ZERO), None);
        assert_eq!(guard_queue_pause(WhenGuarded::FailFast, MS(100)), None);
        assert_eq!(guard_queue_pause(WhenGuarded::ServeStale, MS(100)), None);
    }
}
