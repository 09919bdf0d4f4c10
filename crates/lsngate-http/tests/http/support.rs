//! Test helpers: a counting `metrics` recorder (the `redis-server` on a random port is the test
//! kit's, `lsngate_cluster::RedisServer`).

pub use lsngate_cluster::RedisServer;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{
    Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};

/// Every counter registered so far, by its full key (name plus labels).
type Counters = Arc<Mutex<Vec<(Key, Arc<AtomicU64>)>>>;

/// Counts every counter increment by its full key (name plus labels).
#[derive(Default, Clone)]
pub struct CountingRecorder {
    counters: Counters,
}

struct Cell(Arc<AtomicU64>);

impl CounterFn for Cell {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.0.store(value, Ordering::Relaxed);
    }
}

impl CountingRecorder {
    /// The sum of counter `name` over every label set containing all of `labels`.
    pub fn count(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let counters = self.counters.lock().unwrap();
        counters
            .iter()
            .filter(|(key, _)| key.name() == name)
            .filter(|(key, _)| {
                labels
                    .iter()
                    .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
            })
            .map(|(_, cell)| cell.load(Ordering::Relaxed))
            .sum()
    }
}

impl Recorder for CountingRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut counters = self.counters.lock().unwrap();
        let cell = match counters.iter().find(|(k, _)| k == key) {
            Some((_, cell)) => cell.clone(),
            None => {
                let cell = Arc::new(AtomicU64::new(0));
                counters.push((key.clone(), cell.clone()));
                cell
            }
        };
        Counter::from_arc(Arc::new(Cell(cell)))
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

/// Runs `future` on a current-thread runtime with `recorder` installed for this thread, so only
/// this test's increments are counted.
pub fn with_recorder<T>(
    recorder: &CountingRecorder,
    future: impl std::future::Future<Output = T>,
) -> T {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(recorder, || runtime.block_on(future))
}

/// The user a test request belongs to: its `x-user` header (for the token stores).
pub fn user_header(parts: &http::request::Parts) -> Option<String> {
    parts
        .headers
        .get("x-user")?
        .to_str()
        .ok()
        .map(str::to_owned)
}
