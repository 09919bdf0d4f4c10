//! `lsngate bench --profile`: where the library's write and read time goes, on one connection
//! at a time with nothing else running. Each path is the same statement taken apart: the plain
//! insert on the worker's own connection, the insert with the position query one after the
//! other and pipelined in one flight (the library's token), and the library's whole
//! `write_returning` (pool checkout, cached statements, the pipelined pair, the token); a plain
//! replica read, and the library's read after a token the replica has replayed (and without a
//! token). Rounds interleave the paths, so a noisy neighbour weighs on all of them alike, in an
//! order shuffled every round (seeded, so a run can be repeated): a path measured always right
//! after the same other path was measured with that path's after-effects (its connection task
//! just woken on another thread, its cache lines warm), which moved a p50 by up to 20 µs.

use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use super::report::percentile;
use super::strategy::{INSERT, READ, Session};

/// One measured path.
pub struct ProfileRow {
    pub path: &'static str,
    /// Rounds measured (the two rows of the library's read after a token share theirs).
    pub samples: usize,
    /// NaN without samples.
    pub p50_ms: f64,
    pub p95_ms: f64,
    /// p50 over the plain insert's (writes) or the plain replica read's (reads).
    pub ratio: f64,
}

/// The rows. The library's read after a token is one path in two rows: whether the gate
/// already knew the replica had the token (read + position) or proved it with a wait (or
/// replay check) in the read's flight — the gate learns replay positions from its own reads
/// and its monitor, not from the profile's check that the replica has replayed.
const PATHS: [&str; 9] = [
    "insert (own connection)",
    "insert, then position (2 round trips)",
    "insert + position, pipelined (own connection)",
    "library write_returning",
    "replica read (own connection)",
    "replica read + replay position, pipelined",
    "library read after a token, known replayed",
    "library read, no token",
    "library read after a token, proved in flight",
];

/// Paths run each round (the last row is filled by path 6).
const RUN: usize = 8;

/// The row of a library read after a token that waited.
const PROVED: usize = 8;

/// The first read path: paths before it are writes, measured against the plain insert; the
/// rest against the plain replica read.
const FIRST_READ: usize = 4;

/// The order of the paths in each round comes from this seed.
const SEED: u64 = 28;

/// Runs `rounds` rounds of every path on `session` (its gate, its own connections).
pub async fn run(session: &Session, rounds: usize) -> anyhow::Result<Vec<ProfileRow>> {
    same_commit_wait(session).await?;
    let mut rng = StdRng::seed_from_u64(SEED);
    let mut order: Vec<usize> = (0..RUN).collect();
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
        order.shuffle(&mut rng);
        for &path in &order {
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
                    session.read_replica_with_position(0, last_id).await?;
                }
                6 => {
                    let read = session
                        .gate
                        .read()
                        .after(last_token)
                        .query(READ, &[&last_id])
                        .await?;
                    anyhow::ensure!(!read.rows.is_empty(), "the library's read missed its row");
                    if read.served.waited {
                        samples[PROVED].push(ms(started));
                        continue;
                    }
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
        if values.is_empty() {
            return (f64::NAN, f64::NAN);
        }
        (percentile(values, 50.0), percentile(values, 95.0))
    };
    let counts: Vec<usize> = samples.iter().map(Vec::len).collect();
    let stats: Vec<(f64, f64)> = samples.iter_mut().map(p50).collect();
    Ok(PATHS
        .iter()
        .enumerate()
        .map(|(i, path)| {
            let base = if i < FIRST_READ {
                stats[0].0
            } else {
                stats[FIRST_READ].0
            };
            ProfileRow {
                path,
                samples: counts[i],
                p50_ms: stats[i].0,
                p95_ms: stats[i].1,
                ratio: stats[i].0 / base,
            }
        })
        .collect())
}

/// Makes the worker's own primary connection commit as the gate's do (`synchronous_commit =
/// local` unless the URL's `options` say otherwise, see `target::local_commit`) and checks both
/// then say the same: with a synchronous standby configured, an insert left at the server's `on`
/// waits for the standby, and the comparison with the library's writes is void (it once showed
/// the library 15 % *faster* than a plain insert).
async fn same_commit_wait(session: &Session) -> anyhow::Result<()> {
    let (wanted, _) = session
        .gate
        .transaction(|tx| {
            Box::pin(async move {
                let row = tx.query_one("SHOW synchronous_commit", &[]).await?;
                Ok(row.get::<_, String>(0))
            })
        })
        .await?;
    session.set_synchronous_commit(&wanted).await?;
    let own = session.synchronous_commit().await?;
    anyhow::ensure!(
        own == wanted,
        "the worker's connection commits with synchronous_commit = {own}, the gate's with {wanted}: the write paths would not be comparable"
    );
    println!("Every write path commits with synchronous_commit = {own}.");
    Ok(())
}

/// Prints the rows as the profile table.
pub fn print(rows: &[ProfileRow]) {
    let mut table = crate::table::new(["path", "rounds", "p50", "p95", "p50 / own connection's"]);
    let or_dash = |value: f64, text: String| {
        if value.is_nan() {
            "—".to_string()
        } else {
            text
        }
    };
    for row in rows {
        table.add_row([
            row.path.to_string(),
            row.samples.to_string(),
            or_dash(row.p50_ms, format!("{:.3}ms", row.p50_ms)),
            or_dash(row.p95_ms, format!("{:.3}ms", row.p95_ms)),
            or_dash(row.ratio, format!("{:.2}×", row.ratio)),
        ]);
    }
    println!("{table}");
    // The library sends exactly the pipelined statements: the difference is the library itself
    // (pool checkout, statement cache, bookkeeping, its wake-ups).
    let over = |library: usize, pair: usize| {
        let (library, pair) = (&rows[library], &rows[pair]);
        if library.samples == 0 {
            return;
        }
        println!(
            "{} over {}: {:+.1} µs ({:.2}×)",
            library.path,
            pair.path,
            (library.p50_ms - pair.p50_ms) * 1e3,
            library.p50_ms / pair.p50_ms
        );
    };
    if rows.len() == PATHS.len() {
        over(3, 2);
        over(6, 5);
    }
}
