//! Test helpers: a counting `metrics` recorder and a `redis-server` on a random port.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// A `redis-server` on a free port in a temp dir; killed on drop.
pub struct RedisServer {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server not found: run scripts/install/http.sh");
        let server = RedisServer {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
