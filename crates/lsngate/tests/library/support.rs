//! Test helpers: gates on lsngate-cluster clusters, an insert-then-read loop that counts stale reads,
//! and a TCP forwarder that can stand in for a load balancer and counts network flights.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use lsngate::{Config, Gate, Read, ServedBy};
use lsngate_cluster::Cluster;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// A gate on `cluster` with a fast monitor, tweaked by `tweak`.
pub async fn gate(cluster: &Cluster, tweak: impl FnOnce(Config) -> Config) -> Gate {
    let config = Config::new(cluster.primary_url())
        .replicas(cluster.replica_urls())
        .poll_interval(Duration::from_millis(20));
    Gate::connect(tweak(config)).await.expect("gate")
}

/// Waits, polling every 20 ms for at most 30 s, until `check` says done (`Ok`); otherwise
/// panics naming `what` and the last state `check` described (`Err`). For what a gate learns in
/// the background (replica positions, lag, health), instead of a sleep that should be enough.
pub async fn until(what: &str, mut check: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state = match check() {
            Ok(()) => return,
            Err(state) => state,
        };
        assert!(
            Instant::now() < deadline,
            "waited 30 s for {what}; last seen: {state}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A fresh table `name (id bigint primary key, note text)` on the primary.
pub fn table(cluster: &Cluster, name: &str) {
    cluster
        .primary()
        .sql(&format!(
            "DROP TABLE IF EXISTS {name}; CREATE TABLE {name} (id bigint PRIMARY KEY, note text NOT NULL)"
        ))
        .unwrap();
}

/// What a run of insert-then-read operations saw.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    pub ops: usize,
    /// Reads that did not return the row just written, or returned it flagged stale.
    pub stale: usize,
    pub replica: usize,
    pub primary: usize,
    pub waited: usize,
    pub by_node: HashMap<String, usize>,
    pub fallbacks: HashMap<String, usize>,
    pub longest: Duration,
    pub errors: Vec<String>,
}

impl Tally {
    pub fn add(&mut self, other: &Tally) {
        self.ops += other.ops;
        self.stale += other.stale;
        self.replica += other.replica;
        self.primary += other.primary;
        self.waited += other.waited;
        self.longest = self.longest.max(other.longest);
        for (k, v) in &other.by_node {
            *self.by_node.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &other.fallbacks {
            *self.fallbacks.entry(k.clone()).or_default() += v;
        }
        self.errors.extend(other.errors.iter().cloned());
    }

    fn count(&mut self, read: &Read, id: i64) {
        let note = format!("note {id}");
        let fresh = read.rows.len() == 1 && read.rows[0].get::<_, String>(0) == note;
        if !fresh || read.served.stale {
            self.stale += 1;
        }
        match read.served.by {
            ServedBy::Replica(_) => self.replica += 1,
            ServedBy::Primary => self.primary += 1,
        }
        if read.served.waited {
            self.waited += 1;
        }
        *self.by_node.entry(read.served.node.clone()).or_default() += 1;
        if let Some(reason) = read.served.fallback {
            *self.fallbacks.entry(reason.to_string()).or_default() += 1;
        }
    }
}

/// `ops` times: insert a row on the primary, read it back with its token. Ids start at
/// `first_id`.
pub async fn insert_then_read(gate: &Gate, table: &str, first_id: i64, ops: usize) -> Tally {
    let insert = format!("INSERT INTO {table} (id, note) VALUES ($1, $2)");
    let select = format!("SELECT note FROM {table} WHERE id = $1");
    let mut tally = Tally::default();
    for id in first_id..first_id + ops as i64 {
        let began = Instant::now();
        let note = format!("note {id}");
        let written = match gate.write(&insert, &[&id, &note]).await {
            Ok(written) => written,
            Err(e) => {
                tally.errors.push(format!("write: {e}"));
                continue;
            }
        };
        match gate.query_after(&written.token, &select, &[&id]).await {
            Ok(read) => tally.count(&read, id),
            Err(e) => tally.errors.push(format!("read: {e}")),
        }
        tally.ops += 1;
        tally.longest = tally.longest.max(began.elapsed());
    }
    tally
}

/// `tasks` concurrent [`insert_then_read`] loops of `ops` each.
pub async fn concurrent(gate: &Gate, table: &str, tasks: usize, ops: usize) -> Tally {
    let mut handles = Vec::new();
    for task in 0..tasks {
        let gate = gate.clone();
        let table = table.to_string();
        let first = 1 + (task * ops) as i64 + next_id_block();
        handles.push(tokio::spawn(async move {
            insert_then_read(&gate, &table, first, ops).await
        }));
    }
    let mut total = Tally::default();
    for handle in handles {
        total.add(&handle.await.unwrap());
    }
    total
}

/// Distinct id ranges for successive runs on one table.
fn next_id_block() -> i64 {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    (NEXT.fetch_add(1, Ordering::Relaxed) as i64) * 10_000_000
}

/// A TCP forwarder on 127.0.0.1: each accepted connection goes to the next backend port in
/// turn (a round-robin load balancer). Counts client→server flights: a burst of client bytes
/// after the server last spoke.
pub struct Forwarder {
    pub port: u16,
    flights: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Forwarder {
    pub async fn start(backends: Vec<u16>) -> Forwarder {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let flights = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (counter, stopped) = (flights.clone(), stop.clone());
        tokio::spawn(async move {
            let mut turn = 0usize;
            while let Ok((client, _)) = listener.accept().await {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let backend = backends[turn % backends.len()];
                turn += 1;
                tokio::spawn(pipe(client, backend, counter.clone()));
            }
        });
        Forwarder {
            port,
            flights,
            stop,
        }
    }

    /// URL of the forwarder, as a replica or primary URL.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Client→server flights so far over all connections.
    pub fn flights(&self) -> u64 {
        self.flights.load(Ordering::SeqCst)
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

async fn pipe(client: TcpStream, backend: u16, flights: Arc<AtomicU64>) {
    let Ok(server) = TcpStream::connect(("127.0.0.1", backend)).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    // true while the last bytes moved server→client: the next client bytes start a flight.
    let server_spoke = Arc::new(AtomicBool::new(true));
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let spoke = server_spoke.clone();
    let upstream = async move {
        let mut buffer = vec![0u8; 64 * 1024];
        while let Ok(n) = client_read.read(&mut buffer).await {
            if n == 0 || server_write.write_all(&buffer[..n]).await.is_err() {
                break;
            }
            if spoke.swap(false, Ordering::SeqCst) {
                flights.fetch_add(1, Ordering::SeqCst);
            }
        }
        let _ = server_write.shutdown().await;
    };
    let downstream = async move {
        let mut buffer = vec![0u8; 64 * 1024];
        while let Ok(n) = server_read.read(&mut buffer).await {
            if n == 0 {
                break;
            }
            server_spoke.store(true, Ordering::SeqCst);
            if client_write.write_all(&buffer[..n]).await.is_err() {
                break;
            }
        }
        let _ = client_write.shutdown().await;
    };
    futures_util::join!(upstream, downstream);
}
