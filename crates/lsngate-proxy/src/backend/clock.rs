//! The pool's clock: `CLOCK_MONOTONIC_COARSE`. A connection is checked out and given back on
//! every transaction, and both note the time (idle since, age); the coarse clock is a read of a
//! value the kernel keeps (resolution of a few milliseconds), where `Instant::now` reads the
//! timer. The limits it serves are a second and up (`server_idle_timeout`, `server_lifetime`,
//! the probe of connections idle for a second), so milliseconds do not matter.

use std::ops::{Add, Sub};
use std::time::Duration;

/// A reading of the coarse monotonic clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Coarse(Duration);

impl Coarse {
    /// The time now.
    pub fn now() -> Coarse {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec to write to; the clock id is a constant Linux has
        // had since 2.6.32. It cannot fail with these arguments.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
        debug_assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC_COARSE)");
        Coarse(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }

    /// The time from `earlier` to `self`; zero when `earlier` is later.
    pub fn since(self, earlier: Coarse) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

impl Add<Duration> for Coarse {
    type Output = Coarse;
    fn add(self, d: Duration) -> Coarse {
        Coarse(self.0 + d)
    }
}

impl Sub<Duration> for Coarse {
    type Output = Coarse;
    fn sub(self, d: Duration) -> Coarse {
        Coarse(self.0.saturating_sub(d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_forward_with_the_real_clock() {
        let c0 = Coarse::now();
        std::thread::sleep(Duration::from_millis(50));
        let c1 = Coarse::now();
        // At least 50 ms passed; the coarse clock lags by at most one tick (1–10 ms).
        assert!(
            c1.since(c0) >= Duration::from_millis(40),
            "{:?}",
            c1.since(c0)
        );
        assert_eq!(c0.since(c1), Duration::ZERO, "saturates backwards");
        assert_eq!(
            (c0 + Duration::from_secs(2)).since(c0),
            Duration::from_secs(2)
        );
        assert_eq!((c1 - Duration::from_secs(2)).since(c1), Duration::ZERO);
    }
}
