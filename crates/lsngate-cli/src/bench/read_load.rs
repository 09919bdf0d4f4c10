//! The read-load experiment: how offloading reads to a replica stretches its replay.
//!
//! A fixed write rate runs on the primary while 0, then K clients run a select-only load
//! (`pgbench -S` style: point reads by random key) on the replica. A sampler polls the replica's
//! replay position; each write's lag is the time from its COMMIT returning to the first sample
//! at or past its LSN. Same writes, same clock, only the read load changes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lsngate_core::Lsn;
use serde::Serialize;

use super::report::{percentile, round};
use crate::pg;

/// One phase of the experiment; also the JSON `read_load[]` entry.
#[derive(Debug, Clone, Serialize)]
pub struct ReadLoadRow {
    pub readers: usize,
    pub writes_per_second: f64,
    pub reads_per_second: f64,
    pub replay_lag_p50_ms: f64,
    pub replay_lag_p95_ms: f64,
    pub replay_lag_p99_ms: f64,
    pub replay_lag_max_ms: f64,
}

const ROWS: i32 = 100_000;
const WRITERS: usize = 4;
/// Each writer commits once per tick: 4 writers × 200/s = 800 writes/s requested.
const WRITE_TICK: Duration = Duration::from_millis(5);

pub async fn run(
    primary_url: &str,
    replica_url: &str,
    reader_counts: &[usize],
    phase: Duration,
) -> anyhow::Result<Vec<ReadLoadRow>> {
    let primary = pg::connect(primary_url).await?;
    primary
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS lsngate_readload;
             CREATE TABLE lsngate_readload (id int PRIMARY KEY, v text NOT NULL);
             INSERT INTO lsngate_readload SELECT g, md5(g::text) FROM generate_series(1, {ROWS}) g;
             ANALYZE lsngate_readload;"
        ))
        .await?;
    let setup_lsn = current_lsn(&primary).await?;
    let replica = pg::connect(replica_url).await?;
    while replayed(&replica).await? < setup_lsn {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut rows = Vec::new();
    for &readers in reader_counts {
        rows.push(phase_with(primary_url, replica_url, readers, phase).await?);
    }
    primary.batch_execute("DROP TABLE lsngate_readload").await?;
    Ok(rows)
}

async fn phase_with(
    primary_url: &str,
    replica_url: &str,
    readers: usize,
    phase: Duration,
) -> anyhow::Result<ReadLoadRow> {
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let mut reader_tasks = Vec::new();
    for _ in 0..readers {
        let client = pg::connect(replica_url).await?;
        let (stop, reads) = (stop.clone(), reads.clone());
        reader_tasks.push(tokio::spawn(async move {
            let select = client
                .prepare("SELECT v FROM lsngate_readload WHERE id = $1")
                .await?;
            while !stop.load(Ordering::Relaxed) {
                let id = rand::random_range(1..=ROWS);
                client.query_opt(&select, &[&id]).await?;
                reads.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    let sampler_client = pg::connect(replica_url).await?;
    let sampler_stop = stop.clone();
    let sampler = tokio::spawn(async move {
        let mut samples = Vec::new();
        while !sampler_stop.load(Ordering::Relaxed) {
            let lsn = replayed(&sampler_client).await?;
            samples.push((Instant::now(), lsn));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        anyhow::Ok(samples)
    });
    let started = Instant::now();
    let mut writer_tasks = Vec::new();
    for _ in 0..WRITERS {
        let client = pg::connect(primary_url).await?;
        writer_tasks.push(tokio::spawn(async move {
            client
                .batch_execute("SET synchronous_commit = local")
                .await?;
            let update = client
                .prepare("UPDATE lsngate_readload SET v = md5(random()::text) WHERE id = $1")
                .await?;
            let position = client
                .prepare(lsngate_core::probe::INSERT_POSITION_SQL)
                .await?;
            let mut tick = tokio::time::interval(WRITE_TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut commits = Vec::new();
            while started.elapsed() < phase {
                tick.tick().await;
                client
                    .execute(&update, &[&rand::random_range(1..=ROWS)])
                    .await?;
                let committed = Instant::now();
                let text: String = client.query_one(&position, &[]).await?.get(0);
                commits.push((committed, Lsn::parse(&text)?));
            }
            anyhow::Ok(commits)
        }));
    }
    let mut commits = Vec::new();
    for task in writer_tasks {
        commits.extend(task.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    // Let replay finish the last writes before the sampler stops.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.await??;
    for task in reader_tasks {
        task.await??;
    }
    let mut lags: Vec<f64> = commits
        .iter()
        .filter_map(|(committed, lsn)| {
            let seen = samples
                .iter()
                .find(|(at, replayed)| at >= committed && replayed >= lsn)?;
            Some((seen.0 - *committed).as_secs_f64() * 1e3)
        })
        .collect();
    lags.sort_by(f64::total_cmp);
    Ok(ReadLoadRow {
        readers,
        writes_per_second: (commits.len() as f64 / elapsed).round(),
        reads_per_second: (reads.load(Ordering::Relaxed) as f64 / elapsed).round(),
        replay_lag_p50_ms: round(percentile(&lags, 50.0)),
        replay_lag_p95_ms: round(percentile(&lags, 95.0)),
        replay_lag_p99_ms: round(percentile(&lags, 99.0)),
        replay_lag_max_ms: round(lags.last().copied().unwrap_or(0.0)),
    })
}

async fn current_lsn(client: &tokio_postgres::Client) -> anyhow::Result<Lsn> {
    let text: String = client
        .query_one(lsngate_core::probe::INSERT_POSITION_SQL, &[])
        .await?
        .get(0);
    Ok(Lsn::parse(&text)?)
}

async fn replayed(client: &tokio_postgres::Client) -> anyhow::Result<Lsn> {
    let text: Option<String> = client
        .query_one("SELECT pg_last_wal_replay_lsn()::text", &[])
        .await?
        .get(0);
    Ok(text
        .as_deref()
        .map(Lsn::parse)
        .transpose()?
        .unwrap_or(Lsn::ZERO))
}

pub fn print(rows: &[ReadLoadRow]) {
    let mut table = crate::table::new([
        "replica read clients",
        "writes/s",
        "reads/s",
        "replay lag p50",
        "p95",
        "p99",
        "max",
    ]);
    for row in rows {
        table.add_row([
            row.readers.to_string(),
            format!("{}", row.writes_per_second),
            format!("{}", row.reads_per_second),
            format!("{:.2}ms", row.replay_lag_p50_ms),
            format!("{:.2}ms", row.replay_lag_p95_ms),
            format!("{:.2}ms", row.replay_lag_p99_ms),
            format!("{:.2}ms", row.replay_lag_max_ms),
        ]);
    }
    println!("{table}");
}
