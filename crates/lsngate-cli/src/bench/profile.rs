//! `lsngate bench --profile`: where the library's write and read time goes, on one connection
//! at a time with nothing else running. Each path is the same statement taken apart: the plain
//! insert on the worker's own connection, the insert with the position query one after the
//! other and pipelined in one flight (the library's token), and the library's whole
//! `write_returning` (pool checkout, cached statements, the pipelined pair, the token); a plain
//! replica read, and the library's read after a token the replica has replayed (and without a
//! token). Rounds interleave the paths, so a noisy neighbour weighs on all of them alike.

use std::time::{Duration, Instant};

use super::report::percentile;
use super::strategy::{INSERT, READ, Session};

/// One measured path.
pub struct ProfileRow {
    pub path: &'static str,
    pub p50_ms: f64,
    pub p95_ms: f64,
    /// p50 over the plain insert's (writes) or the plain replica read's (reads).
    pub ratio: f64,
}

const PATHS: [&str; 7] = [
    "insert (own connection)",
    "insert, then position (2 round trips)",
    "insert + position, pipelined (own connection)",
    "library write_returning",
    "replica read (own connection)",
    "library read after a replayed token",
    "library read, no token",
];

/// Runs `rounds` rounds of every path on `session` (its gate, its own connections).
pub async fn run(session: &Session, rounds: usize) -> anyhow::Result<Vec<ProfileRow>> {
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); PATHS.len()];
    let ms = |started: Instant| started.elapsed().as_secs_f64() * 1e3;
    let (mut last_id, mut last_token) = session.gate.write_returning(INSERT, &[&"warm"]).await?;
    let mut last_id: i64 = last_id.remove(0).get(0);
    for round in 0..rounds {
        let payload = format!("profile {round}");
        // The read paths read a row written a round ago, replayed by now: no wait is measured.
        let replayed = Instant::now() + Duration::from_secs(5);
        while !session.replayed_on(0, last_token.lsn).await? {
            anyhow::ensure!(
                Instant::now() < replayed,
                "the replica did not replay the profile's writes within 5 s"
            );
        }
        for path in 0..PATHS.len() {
            // Rotate the order so no path always runs first after the wait above.
            let path = (path + round) % PATHS.len();
            let started = Instant::now();
            match path {
                0 => {
                    session.insert(&payload).await?;
                }
                1 => {
                    session.insert(&payload).await?;
                    session.commit_lsn().await?;
                }
                2 => {
                    session.insert_with_position(&payload).await?;
                }
                3 => {
                    let (rows, token) = session.gate.write_returning(INSERT, &[&payload]).await?;
                    samples[path].push(ms(started));
                    last_id = rows.first().map(|r| r.get(0)).unwrap_or(last_id);
                    last_token = token;
                    continue;
                }
                4 => {
                    session.read_replica(0, last_id).await?;
                }
                5 => {
                    let read = session
                        .gate
                        .read()
                        .after(last_token)
                        .query(READ, &[&last_id])
                        .await?;
                    anyhow::ensure!(!read.rows.is_empty(), "the library's read missed its row");
                }
                _ => {
                    session.gate.read().query(READ, &[&last_id]).await?;
                }
            }
            samples[path].push(ms(started));
        }
    }
    let p50 = |values: &mut Vec<f64>| {
        values.sort_by(f64::total_cmp);
        (percentile(values, 50.0), percentile(values, 95.0))
    };
    let stats: Vec<(f64, f64)> = samples.iter_mut().map(p50).collect();
    Ok(PATHS
        .iter()
        .enumerate()
        .map(|(i, path)| {
            let base = if i < 4 { stats[0].0 } else { stats[4].0 };
            ProfileRow {
                path,
                p50_ms: stats[i].0,
                p95_ms: stats[i].1,
                ratio: stats[i].0 / base,
            }
        })
        .collect())
}

/// Prints the rows as the profile table.
pub fn print(rows: &[ProfileRow]) {
    let mut table = crate::table::new(["path", "p50", "p95", "p50 / own connection's"]);
    for row in rows {
        table.add_row([
            row.path.to_string(),
            format!("{:.3}ms", row.p50_ms),
            format!("{:.3}ms", row.p95_ms),
            format!("{:.2}×", row.ratio),
        ]);
    }
    println!("{table}");
}
