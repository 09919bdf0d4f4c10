//! Timers for the proxy, kept off the runtime that serves clients.
//!
//! tokio's time driver costs on every park of the runtime that has it: a lock on the timer
//! wheel, two clock reads and a pass over the wheel, whether or not any timer is set. A pooler
//! parks about once per statement, and almost no statement sets a timer (a passed-through query
//! sets none), so the serving runtime is built without a time driver (see [`crate::runtime`])
//! and every timer of the proxy lives on one process-wide thread, `lsngate-timer`, that runs only
//! tokio's timer wheel. A timer is created here and awaited anywhere; when it fires, that thread
//! wakes the task that awaits it. Setting and cancelling one takes the wheel's lock, as it does
//! on a runtime with its own driver.
//!
//! Everything in this crate sleeps and times out through these functions; `tokio::time`'s own
//! would panic on the serving runtime ("timers are disabled"), which the tests, running the proxy
//! on that runtime, would catch.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::{Instant, Sleep, Timeout};

/// The handle of the timer thread's runtime, started on first use.
fn wheel() -> &'static Handle {
    static WHEEL: OnceLock<Handle> = OnceLock::new();
    WHEEL.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("the timer thread's runtime");
        let handle = runtime.handle().clone();
        std::thread::Builder::new()
            .name("lsngate-timer".into())
            .spawn(move || runtime.block_on(std::future::pending::<()>()))
            .expect("the timer thread");
        handle
    })
}

/// Completes `duration` from now.
pub fn sleep(duration: Duration) -> Sleep {
    let _wheel = wheel().enter();
    tokio::time::sleep(duration)
}

/// `future`'s output, or an error once `duration` has passed.
pub fn timeout<F: Future>(duration: Duration, future: F) -> Timeout<F> {
    let _wheel = wheel().enter();
    tokio::time::timeout(duration, future)
}

/// `future`'s output, or an error at `deadline`.
pub fn timeout_at<F: Future>(deadline: Instant, future: F) -> Timeout<F> {
    let _wheel = wheel().enter();
    tokio::time::timeout_at(deadline, future)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runtime like the serving one: I/O only, no time driver.
    fn serving() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap()
    }

    #[test]
    fn timers_fire_on_a_runtime_without_a_time_driver() {
        serving().block_on(async {
            let started = std::time::Instant::now();
            sleep(Duration::from_millis(30)).await;
            assert!(started.elapsed() >= Duration::from_millis(30));
            let never = std::future::pending::<()>();
            assert!(timeout(Duration::from_millis(10), never).await.is_err());
            let deadline = Instant::now() + Duration::from_millis(10);
            assert!(
                timeout_at(deadline, std::future::pending::<()>())
                    .await
                    .is_err()
            );
            assert_eq!(
                timeout(Duration::from_secs(5), async { 7 }).await.unwrap(),
                7
            );
        });
    }

    #[test]
    fn a_dropped_timer_is_cancelled_and_others_still_fire() {
        serving().block_on(async {
            for _ in 0..100 {
                drop(sleep(Duration::from_secs(3600)));
            }
            let long = timeout(Duration::from_secs(3600), std::future::pending::<()>());
            drop(long);
            assert!(
                timeout(Duration::from_millis(5), std::future::pending::<()>())
                    .await
                    .is_err()
            );
        });
    }

    #[test]
    #[should_panic(expected = "timers are disabled")]
    fn tokio_timers_are_off_on_the_serving_runtime() {
        serving().block_on(async {
            tokio::time::sleep(Duration::from_millis(1)).await;
        });
    }
}
