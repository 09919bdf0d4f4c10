//! Counting for `/metrics`: the process-wide Prometheus recorder (with the wait histogram's
//! buckets) and [`Tally`], a counter cheap enough for the per-statement path. A leaf: the
//! session, causal and admin layers count here and the admin port reports.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Upper bounds (ms) of the wait-time histogram buckets.
pub const WAIT_BUCKETS_MS: [f64; 12] = [
    0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 5000.0,
];

static PROMETHEUS: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the process-wide Prometheus recorder (once); None if another recorder won.
pub fn prometheus() -> Option<&'static PrometheusHandle> {
    PROMETHEUS
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    metrics_exporter_prometheus::Matcher::Full("lsngate_proxy_wait_seconds".into()),
                    &WAIT_BUCKETS_MS.map(|ms| ms / 1000.0),
                )
                .expect("non-empty buckets")
                .build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok().map(|_| handle)
        })
        .as_ref()
}

/// A counter bumped on every statement: a plain atomic add on the hot path, handed to the
/// metrics registry when /metrics is scraped (the registry's own counters cost a dynamic call
/// and two atomic adds per bump). Several proxies in one process add up, as registry counters do.
#[derive(Debug)]
pub struct Tally {
    count: std::sync::atomic::AtomicU64,
    reported: std::sync::atomic::AtomicU64,
    counter: metrics::Counter,
}

impl Tally {
    /// A tally reported to `counter`.
    pub fn new(counter: metrics::Counter) -> Tally {
        Tally {
            count: Default::default(),
            reported: Default::default(),
            counter,
        }
    }

    /// Counts `n` more.
    pub fn add(&self, n: u64) {
        self.count
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Everything counted so far.
    pub fn count(&self) -> u64 {
        self.count.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Hands what was counted since the last report to the registry.
    pub fn report(&self) {
        let count = self.count.load(std::sync::atomic::Ordering::Relaxed);
        let before = self
            .reported
            .swap(count, std::sync::atomic::Ordering::Relaxed);
        self.counter.increment(count.saturating_sub(before));
    }
}
