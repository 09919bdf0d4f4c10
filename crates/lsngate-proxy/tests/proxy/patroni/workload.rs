//! Clients that write and read their own rows through the proxy while Patroni switches over
//! and fails over: each client inserts (client, seq) and reads back its highest seq on the same
//! session (read-your-writes: never below its last acknowledged write; monotonic: never below
//! its last read). A failed write is never retried; its SQLSTATE says whether it may have
//! committed (08006, outcome unknown) or was not sent (08001). After a connection is lost the
//! client opens a new session, whose guarantee starts afresh.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lsngate_cluster::Node;

/// A bound on every client operation: a hang is reported, not waited out.
const OPERATION_LIMIT: Duration = Duration::from_secs(30);

/// SQLSTATEs a write may fail with while the leader changes, each naming what became of it.
const WRITE_NAMED: &[&str] = &[
    "08006", // lost mid-statement, or the server shut down under it: outcome unknown
    "08001", // not sent: no primary reachable
    "25006", // refused by a server just demoted: not committed
];

/// SQLSTATEs a read may fail with while the leader changes, each naming its cause.
const READ_NAMED: &[&str] = &[
    "08006", "08001", // lost, not sent
    "57P01", "57P02", "57P03", // the server shut down, crashed, is starting
    "LG001", "LG002", // lsngate's own: no replica could serve / the guard refused
];

#[derive(Debug, Default)]
pub struct Report {
    pub acknowledged: Vec<(i32, i32)>,
    pub reads: u64,
    pub stale: Vec<String>,
    pub non_monotonic: Vec<String>,
    pub errors: std::collections::BTreeMap<String, u64>,
    pub unnamed: Vec<String>,
    /// When each acknowledged write returned.
    write_times: Vec<Instant>,
}

impl Report {
    /// The longest stretch without an acknowledged write between `mark` and `until` (from the
    /// mark to the first one, then between consecutive ones): how long what happened at `mark`
    /// stopped writes.
    pub fn resumed_after(&self, mark: Instant, until: Instant) -> Duration {
        let mut times: Vec<Instant> = self
            .write_times
            .iter()
            .copied()
            .filter(|t| *t >= mark && *t < until)
            .collect();
        times.sort();
        // The longest gap between consecutive acknowledged writes after the mark, measured from
        // the mark for the first.
        let mut previous = mark;
        let mut longest = Duration::ZERO;
        for t in times {
            longest = longest.max(t - previous);
            previous = t;
        }
        longest
    }

    /// Writes acknowledged between `mark` and `until`.
    pub fn acknowledged_between(&self, mark: Instant, until: Instant) -> usize {
        self.write_times
            .iter()
            .filter(|t| **t >= mark && **t < until)
            .count()
    }

    /// Acknowledged writes the final leader does not have.
    pub fn lost_writes(&self, leader: &Node) -> Vec<(i32, i32)> {
        let text = leader
            .sql("SELECT string_agg(client || ':' || seq, ',') FROM ha_log")
            .unwrap();
        let present: std::collections::HashSet<&str> = text.split(',').collect();
        self.acknowledged
            .iter()
            .filter(|(c, s)| !present.contains(format!("{c}:{s}").as_str()))
            .copied()
            .collect()
    }
}

pub struct Workload {
    stop: Arc<AtomicBool>,
    report: Arc<Mutex<Report>>,
    thread: std::thread::JoinHandle<()>,
}

impl Workload {
    pub fn start(url: String, clients: i32) -> Workload {
        let stop = Arc::new(AtomicBool::new(false));
        let report = Arc::new(Mutex::new(Report::default()));
        let (stop2, report2) = (Arc::clone(&stop), Arc::clone(&report));
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let tasks: Vec<_> = (0..clients)
                    .map(|c| {
                        tokio::spawn(client(
                            c,
                            url.clone(),
                            Arc::clone(&stop2),
                            Arc::clone(&report2),
                        ))
                    })
                    .collect();
                for task in tasks {
                    task.await.unwrap();
                }
            });
        });
        Workload {
            stop,
            report,
            thread,
        }
    }

    pub fn mark(&self) -> Instant {
        Instant::now()
    }

    pub fn stop(self) -> Report {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        std::mem::take(&mut *self.report.lock().unwrap())
    }
}

fn note_error(report: &Mutex<Report>, what: &str, e: &tokio_postgres::Error) {
    let mut report = report.lock().unwrap();
    let named = if what == "write" {
        WRITE_NAMED
    } else {
        READ_NAMED
    };
    match e.as_db_error() {
        Some(db) if named.contains(&db.code().code()) => {
            *report
                .errors
                .entry(format!("{what} {}", db.code().code()))
                .or_default() += 1;
        }
        _ => report.unnamed.push(format!("{what}: {e:?}")),
    }
}

async fn session(url: &str) -> Option<tokio_postgres::Client> {
    let connected = tokio::time::timeout(
        OPERATION_LIMIT,
        tokio_postgres::connect(url, tokio_postgres::NoTls),
    )
    .await;
    match connected {
        Ok(Ok((client, connection))) => {
            tokio::spawn(connection);
            Some(client)
        }
        _ => None,
    }
}

async fn client(c: i32, url: String, stop: Arc<AtomicBool>, report: Arc<Mutex<Report>>) {
    let mut seq = 0;
    while !stop.load(Ordering::Relaxed) {
        let Some(db) = session(&url).await else {
            // A login fails while no primary is known; the proxy says why (kept in the error).
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        // This session's guarantee: its reads see its acknowledged writes, and never go back.
        let (mut floor, mut last_read) = (0, 0);
        while !stop.load(Ordering::Relaxed) && !db.is_closed() {
            seq += 1;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&c, &seq];
            let insert = db.execute("INSERT INTO ha_log (client, seq) VALUES ($1, $2)", &params);
            match tokio::time::timeout(OPERATION_LIMIT, insert).await {
                Ok(Ok(_)) => {
                    floor = seq;
                    let mut r = report.lock().unwrap();
                    r.acknowledged.push((c, seq));
                    r.write_times.push(Instant::now());
                }
                Ok(Err(e)) => {
                    note_error(&report, "write", &e);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(_) => {
                    report.lock().unwrap().unnamed.push("write hung".into());
                    break;
                }
            }
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&c];
            let read = db.query_one(
                "SELECT coalesce(max(seq), 0) FROM ha_log WHERE client = $1",
                &params,
            );
            match tokio::time::timeout(OPERATION_LIMIT, read).await {
                Ok(Ok(row)) => {
                    let seen: i32 = row.get(0);
                    let mut r = report.lock().unwrap();
                    r.reads += 1;
                    if seen < floor {
                        r.stale
                            .push(format!("client {c}: read {seen} after writing {floor}"));
                    }
                    if seen < last_read {
                        r.non_monotonic
                            .push(format!("client {c}: read {seen} after reading {last_read}"));
                    }
                    last_read = last_read.max(seen);
                }
                Ok(Err(e)) => note_error(&report, "read", &e),
                Err(_) => {
                    report.lock().unwrap().unnamed.push("read hung".into());
                    break;
                }
            }
        }
    }
}
