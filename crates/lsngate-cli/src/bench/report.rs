//! Turning samples into the numbers the benchmark prints: percentiles, the main table, the
//! timeout sweep table, and the JSON document (`--json`).

use serde::Serialize;

use super::workload::Sample;
use crate::inproc_proxy::ProxyOutcomes;

/// One row of the main table; also the JSON `results[]` entry.
#[derive(Debug, Clone, Serialize)]
pub struct ResultRow {
    pub strategy: String,
    pub ops: usize,
    pub stale: usize,
    pub served_by_replica: usize,
    pub fallbacks: usize,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub e2e_p50_ms: f64,
    /// The write alone (with the library, the token it brings back included).
    pub write_p50_ms: f64,
    /// For the proxy strategies: the proxy's own count of how its causal reads ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_outcomes: Option<ProxyOutcomes>,
}

/// One row of the timeout sweep; also the JSON `sweep[]` entry.
#[derive(Debug, Clone, Serialize)]
pub struct SweepRow {
    pub strategy: String,
    pub timeout_ms: f64,
    pub apply_delay_ms: f64,
    pub ops: usize,
    pub stale: usize,
    pub served_by_replica: usize,
    pub fallbacks: usize,
    pub p50_ms: f64,
}

/// What the run was measured on, printed above the tables and saved in the JSON.
#[derive(Debug, Clone, Serialize)]
pub struct Environment {
    pub server_version: String,
    pub cluster: String,
    pub replicas: usize,
    pub apply_delay_ms: f64,
    pub synchronous_standby: bool,
    pub cores: usize,
    pub workers: usize,
    pub ops: usize,
    /// The main table's rounds (`--rounds`): each strategy's ops in this many slices,
    /// interleaved with the other strategies'.
    pub rounds: usize,
    pub budget_ms: f64,
    pub lsngate_version: String,
}

/// A strategy that was asked for (or is a default) but cannot run here, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    pub strategy: String,
    pub reason: String,
}

/// `lsngate bench --json` output.
#[derive(Debug, Clone, Serialize)]
pub struct Document {
    pub environment: Environment,
    pub results: Vec<ResultRow>,
    pub sweep: Vec<SweepRow>,
    pub skipped: Vec<Skipped>,
    pub read_load: Vec<super::read_load::ReadLoadRow>,
}

/// Nearest-rank percentile of sorted values; 0 for none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn sorted_ms(samples: &[Sample], pick: impl Fn(&Sample) -> std::time::Duration) -> Vec<f64> {
    let mut values: Vec<f64> = samples
        .iter()
        .map(|s| pick(s).as_secs_f64() * 1e3)
        .collect();
    values.sort_by(f64::total_cmp);
    values
}

pub fn summarize(strategy: &str, samples: &[Sample]) -> ResultRow {
    let read = sorted_ms(samples, |s| s.read_path);
    let e2e = sorted_ms(samples, |s| s.end_to_end);
    let write = sorted_ms(samples, |s| s.write);
    ResultRow {
        strategy: strategy.to_string(),
        ops: samples.len(),
        stale: samples.iter().filter(|s| s.result.stale).count(),
        served_by_replica: samples
            .iter()
            .filter(|s| s.result.served_by_replica)
            .count(),
        fallbacks: samples.iter().filter(|s| s.result.fallback).count(),
        p50_ms: round(percentile(&read, 50.0)),
        p95_ms: round(percentile(&read, 95.0)),
        p99_ms: round(percentile(&read, 99.0)),
        e2e_p50_ms: round(percentile(&e2e, 50.0)),
        write_p50_ms: round(percentile(&write, 50.0)),
        proxy_outcomes: None,
    }
}

pub fn sweep_row(
    strategy: &str,
    timeout_ms: f64,
    apply_delay_ms: f64,
    samples: &[Sample],
) -> SweepRow {
    let row = summarize(strategy, samples);
    SweepRow {
        strategy: row.strategy,
        timeout_ms,
        apply_delay_ms,
        ops: row.ops,
        stale: row.stale,
        served_by_replica: row.served_by_replica,
        fallbacks: row.fallbacks,
        p50_ms: row.p50_ms,
    }
}

/// Milliseconds to two decimals, as printed and saved.
/// To the microsecond: the exact strategies' reads take tens of microseconds with few workers,
/// where rounding to 10 µs moved a ratio to the floor by up to a quarter.
pub fn round(ms: f64) -> f64 {
    (ms * 1000.0).round() / 1000.0
}

pub fn print_environment(env: &Environment) {
    println!(
        "PostgreSQL {} · {} · {} replica(s){} · apply delay {}ms · {} cores · {} workers · {} ops in {} rounds · wait budget {}ms",
        env.server_version,
        env.cluster,
        env.replicas,
        if env.synchronous_standby {
            " (replica1 synchronous standby for sync-on/remote-apply)"
        } else {
            ""
        },
        env.apply_delay_ms,
        env.cores,
        env.workers,
        env.ops,
        env.rounds,
        env.budget_ms,
    );
}

/// What a pooler's hop costs on this machine and what the proxy rows cost over it: the
/// `pgbouncer` row's read p50 against `replica`'s (the same read without the hop), and each proxy
/// row's read p50 over `pgbouncer`'s. `None` without a `pgbouncer` row.
pub fn pooler_hop(rows: &[ResultRow]) -> Option<String> {
    let pooler = rows.iter().find(|r| r.strategy == "pgbouncer")?;
    if pooler.p50_ms <= 0.0 {
        return None;
    }
    let mut line = format!(
        "A pooler's hop here: pgbouncer's replica read p50 {:.3} ms",
        pooler.p50_ms
    );
    if let Some(direct) = rows.iter().find(|r| r.strategy == "replica") {
        line.push_str(&format!(
            " against {:.3} ms without it ({:.2}×)",
            direct.p50_ms,
            pooler.p50_ms / direct.p50_ms
        ));
    }
    let proxies: Vec<String> = rows
        .iter()
        .filter(|r| r.strategy.starts_with("proxy-"))
        .map(|r| format!("{} {:.2}×", r.strategy, r.p50_ms / pooler.p50_ms))
        .collect();
    if !proxies.is_empty() {
        line.push_str(&format!(
            "; read p50 over pgbouncer's, for the same hop plus read-your-writes: {}",
            proxies.join(", ")
        ));
    }
    Some(line)
}

pub fn print_results(rows: &[ResultRow]) {
    let baseline = rows.iter().find(|r| r.strategy == "primary");
    let floor = rows.iter().find(|r| r.strategy == "floor");
    let ratio = |value: f64, base: Option<f64>| match base {
        Some(base) if base > 0.0 => format!("{:.2}×", value / base),
        _ => "-".to_string(),
    };
    let mut table = crate::table::new([
        "strategy",
        "stale",
        "served by replica",
        "fallbacks",
        "read p50",
        "read p95",
        "read p99",
        "write p50",
        "e2e p50",
        "read p50 / primary",
        "read p50 / floor",
        "e2e p50 / primary",
    ]);
    for row in rows {
        table.add_row([
            row.strategy.clone(),
            format!("{}/{}", row.stale, row.ops),
            row.served_by_replica.to_string(),
            row.fallbacks.to_string(),
            format!("{:.3}ms", row.p50_ms),
            format!("{:.3}ms", row.p95_ms),
            format!("{:.3}ms", row.p99_ms),
            format!("{:.3}ms", row.write_p50_ms),
            format!("{:.3}ms", row.e2e_p50_ms),
            ratio(row.p50_ms, baseline.map(|b| b.p50_ms)),
            ratio(row.p50_ms, floor.map(|f| f.p50_ms)),
            ratio(row.e2e_p50_ms, baseline.map(|b| b.e2e_p50_ms)),
        ]);
    }
    println!("{table}");
    for row in rows {
        if let Some(o) = &row.proxy_outcomes {
            println!(
                "{}: the proxy's causal reads (its /status outcomes, warm-up reads included): replica {}, waited {}, fallback {}, no_replica {}, stale {}, error {}",
                row.strategy, o.replica, o.waited, o.fallback, o.no_replica, o.stale, o.error
            );
        }
    }
}

pub fn print_sweep(rows: &[SweepRow]) {
    let mut table = crate::table::new([
        "strategy",
        "timeout",
        "apply delay",
        "stale",
        "served by replica",
        "fell back",
        "read p50",
    ]);
    for row in rows {
        table.add_row([
            row.strategy.clone(),
            format!("{}ms", row.timeout_ms),
            format!("{}ms", row.apply_delay_ms),
            format!("{}/{}", row.stale, row.ops),
            row.served_by_replica.to_string(),
            row.fallbacks.to_string(),
            format!("{:.3}ms", row.p50_ms),
        ]);
    }
    println!("{table}");
}

pub fn print_skipped(skipped: &[Skipped]) {
    for skip in skipped {
        println!("skipped {}: {}", skip.strategy, skip.reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(strategy: &str, p50_ms: f64) -> ResultRow {
        ResultRow {
            strategy: strategy.to_string(),
            ops: 1,
            stale: 0,
            served_by_replica: 1,
            fallbacks: 0,
            p50_ms,
            p95_ms: p50_ms,
            p99_ms: p50_ms,
            e2e_p50_ms: p50_ms,
            write_p50_ms: p50_ms,
            proxy_outcomes: None,
        }
    }

    #[test]
    fn the_pooler_hop_line_compares_the_proxy_rows_with_pgbouncer() {
        let rows = [
            row("replica", 0.1),
            row("pgbouncer", 0.2),
            row("proxy-session", 0.25),
            row("lsngate", 0.12),
        ];
        assert_eq!(
            pooler_hop(&rows).unwrap(),
            "A pooler's hop here: pgbouncer's replica read p50 0.200 ms against 0.100 ms without it \
             (2.00×); read p50 over pgbouncer's, for the same hop plus read-your-writes: \
             proxy-session 1.25×"
        );
        assert_eq!(pooler_hop(&rows[..1]), None);
    }

    #[test]
    fn latencies_keep_the_microsecond() {
        assert_eq!(round(0.0456), 0.046);
        assert_eq!(round(1.2344), 1.234);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 50.0), 50.0);
        assert_eq!(percentile(&values, 95.0), 95.0);
        assert_eq!(percentile(&values, 99.0), 99.0);
        assert_eq!(percentile(&values, 100.0), 100.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }
}
