//! `lsngate bench`: the problem and the fix side by side, on one cluster, in one run.
//!
//! Each strategy does the published workload — insert a row on the primary, then read it back
//! by id like the next web request would — and the table shows how many reads were stale, who
//! served them and how long the read path took, with every p50 as a ratio to `primary`'s from
//! the same run. Then a timeout sweep (the wait budget decides who serves, never correctness)
//! and the read-load experiment (reads on a replica stretch its replay).

mod chart;
mod pgbouncer;
mod pgpool;
mod profile;
mod proxy;
mod read_load;
mod report;
mod strategy;
mod target;
mod workload;

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use proxy::ProxyClients;
use report::{Document, Skipped};
use strategy::{Session, Strategy};
use target::Target;
use workload::Plan;

use crate::duration;
use crate::inproc_proxy::{InProcessProxy, ProxySetup};

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Primary URL of an existing cluster (libpq URL form). Without it a local cluster is started
    /// (PostgreSQL 19 when installed), used and removed.
    #[arg(long, requires = "replicas")]
    primary: Option<String>,
    /// Replica URL of an existing cluster; repeat or comma-separate. For sync-on/remote-apply the
    /// first one must be the synchronous standby.
    #[arg(long = "replica", value_delimiter = ',')]
    replicas: Vec<String>,
    /// Insert-then-read operations per strategy.
    #[arg(long, default_value_t = 1000)]
    ops: usize,
    /// The main table's strategies run in this many rounds of --ops/rounds operations each,
    /// every other round in reverse order, so a slow minute of the machine (a checkpoint, a
    /// neighbour) weighs on every row alike and ratios between rows mean something (pgpool rows
    /// run after the rounds, in one block each).
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Concurrent workers, each with its own connection to every node.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Strategies to run, comma-separated [default: every one the server supports]: primary,
    /// replica, sleep:<ms>, sync-on, remote-apply, waitfor, poll, lsngate, proxy-session,
    /// proxy-token, proxy-scope, proxy-global, proxy-eventual, proxy-fast (these six through an
    /// lsngate proxy the bench starts on 127.0.0.1; eventual is the proxy's hop without the
    /// guarantee, fast its mode that reads the primary rather than wait while the guard admits),
    /// floor (a tight poller on the replica: when the row first shows there, what the others
    /// compare to), pgbouncer (PgBouncer as a plain read/write split: a pooler's hop),
    /// pgpool-transaction, pgpool-always, pgpool-dml_adaptive, pgpool-delay_threshold.
    #[arg(long, value_delimiter = ',')]
    strategies: Vec<Strategy>,
    /// Wait budget per read for waitfor, poll, lsngate and the proxy in the main table (e.g. 1s,
    /// 500ms).
    #[arg(long, value_parser = duration::parse, default_value = "1s")]
    timeout: Duration,
    /// recovery_min_apply_delay on the local cluster's replicas for the main table and the sweep.
    #[arg(long, value_parser = duration::parse)]
    apply_delay: Option<Duration>,
    /// Timeout sweep budgets, comma-separated. Local cluster default: 500ms,20ms,5ms with the
    /// replicas held back by --apply-delay (50ms when not given). Existing cluster: only when set.
    #[arg(long, value_parser = duration::parse, value_delimiter = ',')]
    timeouts: Option<Vec<Duration>>,
    /// Operations per strategy and budget in the sweep.
    #[arg(long, default_value_t = 400)]
    sweep_ops: usize,
    /// Concurrent select-only clients on the replica for the read-load experiment; 0 skips it.
    #[arg(long, default_value_t = 16)]
    read_load: usize,
    /// Length of each read-load phase (with 0 and with --read-load clients).
    #[arg(long, value_parser = duration::parse, default_value = "3s")]
    read_load_phase: Duration,
    /// Replicas in the local cluster.
    #[arg(long = "local-replicas", default_value_t = 1)]
    local_replicas: usize,
    /// PostgreSQL bin dir for the local cluster [default: auto-detect, 19 first].
    #[arg(long, env = "LSNGATE_PG_BIN")]
    pg_bin: Option<PathBuf>,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also write a latency-distribution chart (SVG) to this file.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// No progress bars.
    #[arg(long)]
    quiet: bool,
    /// Instead of the strategies: where the library's write and read time goes, path by path
    /// on one connection (plain insert, insert + position query, the library's write; plain
    /// replica read, the library's read), --ops rounds, every path interleaved.
    #[arg(long)]
    profile: bool,
}

/// The sweep's apply delay on a local cluster when --apply-delay is not given (the published
/// budget table used 50 ms).
const DEFAULT_SWEEP_DELAY: Duration = Duration::from_millis(50);

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.ops > 0 && args.workers > 0,
        "--ops and --workers must be at least 1"
    );
    anyhow::ensure!(
        (1..=args.ops).contains(&args.rounds),
        "--rounds must be between 1 and --ops ({}); it splits every strategy's operations",
        args.ops
    );
    let requested = if args.strategies.is_empty() {
        default_strategies()
    } else {
        args.strategies.clone()
    };
    let wants_sync = requested.iter().any(Strategy::needs_sync_standby);
    let target = Target::open(&args, wants_sync).await?;
    let (runnable, mut skipped) = target.check(&requested);
    let environment = target.environment(&args);
    report::print_environment(&environment);

    let (runnable, proxy_setup) = proxy_setup(&target, &args, runnable, &mut skipped);
    target.prepare_schema().await?;
    if args.profile {
        let sessions = target.sessions(1, args.timeout).await?;
        println!(
            "\nThe library's paths taken apart ({} rounds, one connection each, every path interleaved):",
            args.ops
        );
        profile::print(&profile::run(&sessions[0], args.ops).await?);
        target.drop_schema().await?;
        drop(sessions);
        target.shutdown();
        return Ok(());
    }
    let mut sessions = target.sessions(args.workers, args.timeout).await?;
    let mut results = Vec::new();
    let mut chart_series = Vec::new();
    let plan = Plan {
        ops: args.ops,
        budget: args.timeout,
        warmup_per_worker: 3,
    };
    let (peers, mut own): (Vec<&Strategy>, Vec<&Strategy>) = runnable
        .iter()
        .partition(|s| matches!(s, Strategy::Pgpool(_)));
    // PgBouncer runs for the whole of the rounds, its row interleaved with the others.
    let pgbouncer = if own.contains(&&Strategy::Pgbouncer) {
        match attach_pgbouncer(&target, &mut sessions).await {
            Ok(pgbouncer) => Some(pgbouncer),
            Err(e) => {
                own.retain(|s| **s != Strategy::Pgbouncer);
                skipped.push(Skipped {
                    strategy: Strategy::Pgbouncer.to_string(),
                    reason: format!("PgBouncer: {e:#}"),
                });
                None
            }
        }
    } else {
        None
    };
    let mut measured: Vec<Measured> = own.iter().map(|_| Measured::default()).collect();
    for round in 0..args.rounds {
        let slice = Plan {
            ops: round_ops(args.ops, args.rounds, round),
            ..plan
        };
        let mut order: Vec<usize> = (0..own.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for index in order {
            let strategy = own[index];
            let label = format!("{strategy} {}/{}", round + 1, args.rounds);
            let bar = progress(&args, &label, slice.ops);
            let proxy = match (&proxy_setup, strategy.uses_proxy()) {
                (Some(setup), true) => Some(attach_proxy(setup, &mut sessions).await?),
                _ => None,
            };
            let samples = workload::run(strategy, &sessions, slice, &bar).await?;
            bar.finish_and_clear();
            let into = &mut measured[index];
            into.samples.extend(samples);
            if let Some(proxy) = proxy {
                into.proxy_outcomes
                    .get_or_insert_with(Default::default)
                    .add(proxy.outcomes());
                for session in &mut sessions {
                    session.proxy = None;
                }
                proxy.shutdown().await?;
            }
        }
    }
    if let Some(pgbouncer) = pgbouncer {
        for session in &mut sessions {
            session.pgbouncer = None;
        }
        drop(pgbouncer);
    }
    for (strategy, measured) in own.iter().zip(measured) {
        let mut row = report::summarize(&strategy.to_string(), &measured.samples);
        row.proxy_outcomes = measured.proxy_outcomes;
        chart_series.push(read_path_series(&row, &measured.samples));
        results.push(row);
    }
    for strategy in peers {
        let Strategy::Pgpool(mode) = strategy else {
            continue;
        };
        let label = strategy.to_string();
        let bar = progress(&args, &label, plan.ops);
        match pgpool_row(*mode, &target, &mut sessions, plan, &bar).await {
            Ok((samples, standby_selects)) => {
                bar.finish_and_clear();
                let mut row = report::summarize(&label, &samples);
                row.served_by_replica = standby_selects.min(row.ops);
                chart_series.push(read_path_series(&row, &samples));
                results.push(row);
            }
            Err(e) => {
                bar.finish_and_clear();
                skipped.push(Skipped {
                    strategy: label,
                    reason: format!("pgpool-II: {e:#}"),
                });
            }
        }
    }
    report::print_results(&results);
    if let Some(line) = report::pooler_hop(&results) {
        println!("{line}");
    }
    report::print_skipped(&skipped);

    let sweep = run_sweep(&args, &target, &sessions, &runnable, &mut skipped).await?;
    if !sweep.is_empty() {
        println!(
            "\nWait budget sweep (correctness comes from the token; the budget only decides who serves):"
        );
        report::print_sweep(&sweep);
    }

    let read_load = if args.read_load > 0 {
        let rows = read_load::run(
            target.primary_url(),
            &target.replica_urls()[0],
            &[0, args.read_load],
            args.read_load_phase,
        )
        .await?;
        println!("\nRead load on the replica stretches its replay (same write rate, replica1):");
        read_load::print(&rows);
        rows
    } else {
        Vec::new()
    };

    target.drop_schema().await?;
    // The gate's monitor stops with the last session, before the cluster goes away.
    drop(sessions);
    let document = Document {
        environment,
        results,
        sweep,
        skipped,
        read_load,
    };
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&document)?)?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.svg {
        let title = format!(
            "Read after write, PostgreSQL {}: {} ops, {} workers",
            document.environment.server_version, args.ops, args.workers
        );
        std::fs::write(path, chart::render(&title, &chart_series))?;
        eprintln!("wrote {}", path.display());
    }
    target.shutdown();
    Ok(())
}

/// One strategy's samples over the rounds, and its proxy's outcomes summed over them (a fresh
/// proxy each round).
#[derive(Default)]
struct Measured {
    samples: Vec<workload::Sample>,
    proxy_outcomes: Option<crate::inproc_proxy::ProxyOutcomes>,
}

/// Operations in round `round` of `rounds`: `ops` split as evenly as it goes, the first rounds
/// taking the remainder.
fn round_ops(ops: usize, rounds: usize, round: usize) -> usize {
    ops / rounds + usize::from(round < ops % rounds)
}

/// One `pgpool-<setting>` row: pgpool-II started for it, each worker on its own pgpool
/// connection, warmed up first; the samples and how many of the row's reads pgpool's standbys
/// served (its `select_cnt`, counted after the warm-up).
async fn pgpool_row(
    mode: pgpool::PgpoolMode,
    target: &Target,
    sessions: &mut [Session],
    plan: Plan,
    bar: &ProgressBar,
) -> anyhow::Result<(Vec<workload::Sample>, usize)> {
    let pgpool = pgpool::PgpoolRow::start(
        mode,
        target.primary_url(),
        target.replica_urls(),
        sessions.len(),
    )
    .await?;
    for session in sessions.iter_mut() {
        session.pgpool = Some(pgpool.client().await?);
    }
    let strategy = Strategy::Pgpool(mode);
    let warmup = Plan { ops: 0, ..plan };
    let measured = Plan {
        warmup_per_worker: 0,
        ..plan
    };
    let result = async {
        workload::run(&strategy, sessions, warmup, bar).await?;
        let before = pgpool.standby_selects().await?;
        let samples = workload::run(&strategy, sessions, measured, bar).await?;
        let served = pgpool.standby_selects().await?.saturating_sub(before);
        anyhow::Ok((samples, served as usize))
    }
    .await;
    for session in sessions.iter_mut() {
        session.pgpool = None;
    }
    drop(pgpool);
    result
}

/// A row's read-path latencies for the chart, labelled with its stale count.
fn read_path_series(row: &report::ResultRow, samples: &[workload::Sample]) -> chart::Series {
    chart::Series {
        label: format!("{}: {}/{} stale", row.strategy, row.stale, row.ops),
        latencies_ms: samples
            .iter()
            .map(|s| s.read_path.as_secs_f64() * 1e3)
            .collect(),
    }
}

fn default_strategies() -> Vec<Strategy> {
    vec![
        Strategy::Primary,
        Strategy::Replica,
        Strategy::Sleep(Duration::from_millis(50)),
        Strategy::SyncOn,
        Strategy::RemoteApply,
        Strategy::WaitFor,
        Strategy::Poll,
        Strategy::Lsngate,
        Strategy::ProxySession,
        Strategy::ProxyToken,
        Strategy::ProxyScope,
        Strategy::ProxyGlobal,
        Strategy::ProxyEventual,
        Strategy::ProxyFast,
        Strategy::Floor,
        Strategy::Pgbouncer,
        Strategy::Pgpool(pgpool::PgpoolMode::Transaction),
        Strategy::Pgpool(pgpool::PgpoolMode::Always),
        Strategy::Pgpool(pgpool::PgpoolMode::DmlAdaptive),
        Strategy::Pgpool(pgpool::PgpoolMode::DelayThreshold),
    ]
}

/// The proxy's setup when a proxy strategy is to run. When the proxy cannot be configured for
/// these URLs, the proxy strategies are skipped with the reason and the rest runs.
fn proxy_setup(
    target: &Target,
    args: &BenchArgs,
    runnable: Vec<Strategy>,
    skipped: &mut Vec<Skipped>,
) -> (Vec<Strategy>, Option<ProxySetup>) {
    if !runnable.iter().any(Strategy::uses_proxy) {
        return (runnable, None);
    }
    let setup = ProxySetup::new(
        target.primary_url(),
        target.replica_urls(),
        args.workers,
        args.timeout,
        crate::inproc_proxy::Guard::Open,
    );
    match setup {
        Ok(setup) => (runnable, Some(setup)),
        Err(e) => {
            let (proxied, rest): (Vec<_>, Vec<_>) =
                runnable.into_iter().partition(Strategy::uses_proxy);
            for strategy in proxied {
                skipped.push(Skipped {
                    strategy: strategy.to_string(),
                    reason: format!("{e:#}"),
                });
            }
            (rest, None)
        }
    }
}

/// Starts PgBouncer for the `pgbouncer` row and gives every worker its connections through it.
async fn attach_pgbouncer(
    target: &Target,
    sessions: &mut [Session],
) -> anyhow::Result<pgbouncer::PgbouncerRow> {
    let pgbouncer =
        pgbouncer::PgbouncerRow::start(target.primary_url(), target.replica_urls(), sessions.len())
            .await?;
    for session in sessions.iter_mut() {
        session.pgbouncer = Some(pgbouncer.client().await?);
    }
    Ok(pgbouncer)
}

/// Starts a fresh proxy for one proxy strategy and gives every worker its connections through it.
async fn attach_proxy(
    setup: &ProxySetup,
    sessions: &mut [Session],
) -> anyhow::Result<InProcessProxy> {
    let proxy = InProcessProxy::start(setup).await?;
    for session in sessions.iter_mut() {
        session.proxy = Some(ProxyClients::open(&proxy).await?);
    }
    Ok(proxy)
}

async fn run_sweep(
    args: &BenchArgs,
    target: &Target,
    sessions: &[Session],
    runnable: &[Strategy],
    skipped: &mut Vec<Skipped>,
) -> anyhow::Result<Vec<report::SweepRow>> {
    let budgets = match (&args.timeouts, target.is_local()) {
        (Some(budgets), _) => budgets.clone(),
        (None, true) => vec![
            Duration::from_millis(500),
            Duration::from_millis(20),
            Duration::from_millis(5),
        ],
        (None, false) => return Ok(Vec::new()),
    };
    let strategies: Vec<&Strategy> = runnable.iter().filter(|s| s.has_budget()).collect();
    if strategies.is_empty() {
        skipped.push(Skipped {
            strategy: "sweep".into(),
            reason: "no strategy with a wait budget (waitfor, poll) was run".into(),
        });
        return Ok(Vec::new());
    }
    let delay = target
        .hold_back_replicas(args.apply_delay.unwrap_or(DEFAULT_SWEEP_DELAY))
        .await?;
    let mut rows = Vec::new();
    for budget in budgets {
        for strategy in &strategies {
            let plan = Plan {
                ops: args.sweep_ops,
                budget,
                warmup_per_worker: 1,
            };
            let label = format!("{strategy} {}ms", budget.as_millis());
            let bar = progress(args, &label, plan.ops);
            let samples = workload::run(strategy, sessions, plan, &bar).await?;
            bar.finish_and_clear();
            rows.push(report::sweep_row(
                &strategy.to_string(),
                budget.as_secs_f64() * 1e3,
                delay.as_secs_f64() * 1e3,
                &samples,
            ));
        }
    }
    target.release_replicas(args.apply_delay).await?;
    Ok(rows)
}

fn progress(args: &BenchArgs, label: &str, ops: usize) -> ProgressBar {
    if args.quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(ops as u64);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>18} [{bar:40}] {pos}/{len} {elapsed}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(label.to_string());
    bar
}

#[cfg(test)]
mod round_tests {
    use super::round_ops;

    #[test]
    fn rounds_split_every_operation_once() {
        for (ops, rounds) in [(1000, 4), (60, 4), (7, 3), (5, 5), (1, 1)] {
            let slices: Vec<usize> = (0..rounds).map(|r| round_ops(ops, rounds, r)).collect();
            assert_eq!(
                slices.iter().sum::<usize>(),
                ops,
                "{ops} in {rounds}: {slices:?}"
            );
            assert!(slices.iter().max().unwrap() - slices.iter().min().unwrap() <= 1);
        }
    }
}
