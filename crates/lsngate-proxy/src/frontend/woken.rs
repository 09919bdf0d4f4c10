//! A future polled only when its own waker fired. A `select!` polls every pending branch each
//! time the task wakes; for a branch that almost never completes (the drain signal in every
//! session loop) that is work on every message of every client. `WhenWoken` skips the inner
//! poll until the inner future has asked to be woken, or the task's waker changed.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

/// The waker handed to the inner future: notes the wake-up, then wakes the task.
#[derive(Default)]
struct Flag {
    woken: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        if let Some(task) = self.task.lock().expect("waker lock").as_ref() {
            task.wake_by_ref();
        }
    }
}

/// See the module documentation.
pub struct WhenWoken<F> {
    inner: Pin<Box<F>>,
    flag: Arc<Flag>,
    /// The task waker the inner future was last polled under (None: never polled).
    polled_under: Option<Waker>,
}

impl<F: Future> WhenWoken<F> {
    pub fn new(inner: F) -> WhenWoken<F> {
        WhenWoken {
            inner: Box::pin(inner),
            flag: Arc::default(),
            polled_under: None,
        }
    }
}

impl<F: Future> Future for WhenWoken<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let same_task = this
            .polled_under
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()));
        // A plain load first: the swap (a locked instruction) only when the flag is up.
        if same_task
            && !(this.flag.woken.load(Ordering::Acquire)
                && this.flag.woken.swap(false, Ordering::AcqRel))
        {
            return Poll::Pending;
        }
        if !same_task {
            *this.flag.task.lock().expect("waker lock") = Some(cx.waker().clone());
            this.polled_under = Some(cx.waker().clone());
        }
        let waker = Waker::from(Arc::clone(&this.flag));
        this.inner.as_mut().poll(&mut Context::from_waker(&waker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::watch;

    #[tokio::test]
    async fn completes_when_the_inner_future_is_woken_and_not_before() {
        let (tx, mut rx) = watch::channel(false);
        let mut changed = std::pin::pin!(WhenWoken::new(async move {
            rx.changed().await.unwrap();
            *rx.borrow()
        }));
        // Polled many times while nothing happens: pending every time.
        for _ in 0..3 {
            assert!(futures_poll_once(changed.as_mut()).await.is_none());
        }
        tx.send(true).unwrap();
        assert!(changed.await, "the drain signal arrived");
    }

    /// One poll of `f` under the current task's waker.
    async fn futures_poll_once<F: Future + Unpin>(mut f: F) -> Option<F::Output> {
        std::future::poll_fn(|cx| {
            Poll::Ready(match Pin::new(&mut f).poll(cx) {
                Poll::Ready(v) => Some(v),
                Poll::Pending => None,
            })
        })
        .await
    }
}
