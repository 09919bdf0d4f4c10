//! `lsngate verify`: a Jepsen-style check of the guarantee on a deployment, under faults.
//! Concurrent clients read and write versioned registers through the target — an lsngate proxy
//! (one it is given, or an in-process one in front of a local cluster it starts) or the lsngate
//! library's `Gate` (over URLs it is given, or over the local cluster) — a seeded schedule
//! injects faults into the local cluster's replicas, every operation goes into a history, and
//! the checker says whether any read was stale or went back in time, whether any acknowledged
//! write was lost or applied twice, and whether anything hung. Exit status 1 on any violation,
//! 2 when the run itself could not be done.
//!
//! The pieces: [`workload`] (the clients), [`client`] (how they reach the target:
//! [`proxy_client`], [`library_client`]), [`faults`] (the schedule), [`history`] (the records and
//! `--history FILE`), [`checker`] (pure), [`report`] (the table and `--json`).

mod checker;
mod client;
mod faults;
mod history;
mod library_client;
mod proxy_client;
mod report;
mod target;
mod workload;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use checker::Rules;
use faults::{FaultKind, FaultList};
use report::{Facts, Summary};
use target::Target;
use workload::{Mode, Plan};

use crate::duration;

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// A running lsngate proxy to check (libpq URL, e.g. postgres://app:secret@10.0.0.5:6432/app).
    /// Without it (and without --primary) a local cluster (--local-replicas replicas) and an
    /// in-process proxy in front of it (or, with --library, the library) are started, used and
    /// removed. Faults need the local cluster. The run recreates the tables
    /// lsngate_verify_register and lsngate_verify_log and leaves them for inspection.
    #[arg(long, conflicts_with_all = ["library", "primary"])]
    proxy: Option<String>,
    /// Check the lsngate library instead of the proxy: the clients share one lsngate Gate over
    /// the primary and the replicas (the local cluster's, or --primary/--replica). No proxy runs.
    #[arg(long)]
    library: bool,
    /// The library over an existing deployment: its primary (libpq URL, e.g.
    /// postgres://app:secret@10.0.0.4:5432/app). Implies --library; needs --replica; no faults.
    #[arg(long, requires = "replica")]
    primary: Option<String>,
    /// A replica of --primary for the library (libpq URL); repeat for each replica.
    #[arg(long, requires = "primary")]
    replica: Vec<String>,
    /// Consistency mode of the clients: session, token (writes on one connection, reads on
    /// another with the commit position handed over, also between clients), global (proxy
    /// only: every write committed through the proxy before the read), universal (every write
    /// committed on the primary before the read), scope (clients in pairs share a causal scope:
    /// through the proxy `SET lsngate.scope`, each writing and reading on two connections; with
    /// the library `Gate::scope` over one shared store), fast (proxy only: held to what session
    /// is, through the proxy's `fast` mode, whose reads never wait while the primary guard admits
    /// them), or eventual (the self-test control: must show violations when a replica lags).
    #[arg(long, value_enum, default_value = "session")]
    mode: Mode,
    /// How long the clients run, in seconds (at least until every requested fault has been
    /// injected and healed once).
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Stop after this many operations in all (whichever of --seconds and --ops comes first).
    #[arg(long)]
    ops: Option<u64>,
    /// Concurrent clients, one operation at a time each.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Registers (keys) the clients share.
    #[arg(long, default_value_t = 8)]
    keys: usize,
    /// Faults to inject on the local cluster, comma-separated: pause, delay, stop, kill,
    /// net-delay, blackhole (on a replica), kill-primary, failover (not with --library), all or
    /// none [default: all locally (but failover with --library), none with --proxy or
    /// --primary]. With --proxy or --primary, only through --fault-hook.
    #[arg(long, value_parser = faults::parse_list)]
    faults: Option<FaultList>,
    /// With --proxy or --primary: a program that injects and heals the --faults on hosts you
    /// control, run as `PROGRAM inject KIND` and `PROGRAM heal KIND` with LSNGATE_FAULT,
    /// LSNGATE_FAULT_ACTION, LSNGATE_FAULT_REPLICA (0-based), LSNGATE_FAULT_AMOUNT_MS and
    /// LSNGATE_FAULT_SEED set. Exit 0 when done (within 60 s); the first line it prints is the
    /// fault's detail in the history.
    #[arg(long)]
    fault_hook: Option<PathBuf>,
    /// Length of one fault period: each period holds one fault for 40–70 % of it.
    #[arg(long, value_parser = duration::parse, default_value = "2s")]
    fault_period: Duration,
    /// Seed of the fault schedule and the clients' choices [default: random, printed].
    #[arg(long)]
    seed: Option<u64>,
    /// The wait budget per read of the in-process proxy (wait_timeout_ms) or of the library's
    /// Gate, e.g. 500ms.
    #[arg(long, value_parser = duration::parse, default_value = "500ms")]
    budget: Duration,
    /// An operation taking longer than the budget plus this grace hung (and its connection is
    /// given up). The default leaves room for the proxy's documented worst case for a server
    /// that goes silent: health_interval_ms + connect_timeout_ms, 6 s by default.
    #[arg(long, value_parser = duration::parse, default_value = "10s")]
    grace: Duration,
    /// recovery_min_apply_delay of the local cluster's replicas outside `delay` faults.
    #[arg(long, value_parser = duration::parse)]
    apply_delay: Option<Duration>,
    /// Replicas in the local cluster.
    #[arg(long = "local-replicas", default_value_t = 1)]
    local_replicas: usize,
    /// PostgreSQL bin dir for the local cluster [default: auto-detect, 19 first].
    #[arg(long, env = "LSNGATE_PG_BIN")]
    pg_bin: Option<PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Write every operation and fault as JSON lines to this file.
    #[arg(long)]
    history: Option<PathBuf>,
}

/// What the checker holds each mode to, on the proxy or the library.
fn rules(mode: Mode, library: bool, hang_after: Duration) -> Rules {
    Rules {
        own_writes: mode != Mode::Token,
        all_acknowledged: matches!(mode, Mode::Global | Mode::Universal),
        token_floors: mode == Mode::Token,
        scope_floors: mode == Mode::Scope,
        // The library's bare token reads remember nothing (see library_client).
        monotonic: !(library && mode == Mode::Token),
        hang_after_ms: hang_after.as_secs_f64() * 1e3,
    }
}

/// Runs the command; `Ok(false)` when the checker found a violation (exit status 1).
pub async fn run(args: VerifyArgs) -> anyhow::Result<bool> {
    anyhow::ensure!(
        args.workers > 0 && args.keys > 0 && args.seconds > 0.0,
        "--workers, --keys and --seconds must be above 0"
    );
    let library = args.library || args.primary.is_some();
    if library && let Some(why) = library_client::refusal(args.mode) {
        anyhow::bail!("{why}");
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    let elsewhere = args.proxy.is_some() || args.primary.is_some();
    let kinds = match (&args.faults, elsewhere) {
        (Some(FaultList(kinds)), true) if !kinds.is_empty() && args.fault_hook.is_none() => {
            anyhow::bail!(
                "--faults needs the local cluster or a --fault-hook: with --proxy or --primary the hosts are not lsngate's to fault; give --fault-hook PROGRAM that injects and heals them, drop --faults, or drop --proxy/--primary to verify a local cluster"
            )
        }
        (Some(FaultList(kinds)), _) => kinds.clone(),
        (None, true) => Vec::new(),
        // The library does not follow a failover (its primary URL is fixed).
        (None, false) if library => faults::ALL
            .into_iter()
            .filter(|k| *k != FaultKind::Failover)
            .collect(),
        (None, false) => faults::ALL.to_vec(),
    };
    if library && args.fault_hook.is_none() && kinds.contains(&FaultKind::Failover) {
        anyhow::bail!(
            "--faults failover with --library: the library's Gate has a fixed primary URL and does not follow a promoted replica (issue #26); verify failover through the proxy (drop --library), or drop failover from --faults"
        );
    }
    if let Some(program) = &args.fault_hook {
        anyhow::ensure!(
            elsewhere,
            "--fault-hook is for hosts you control (--proxy or --primary); on the local cluster lsngate injects the faults itself: drop --fault-hook"
        );
        anyhow::ensure!(
            !kinds.is_empty(),
            "--fault-hook {} needs --faults LIST: the kinds your hook injects (e.g. --faults pause,stop)",
            program.display()
        );
    }
    let target = Target::open(&args, library).await?;
    let server_version = target.prepare_schema(args.keys).await?;
    if !args.json {
        eprintln!(
            "verifying mode {} on {} (PostgreSQL {server_version}), seed {seed}, faults: {}",
            args.mode.name(),
            target.describe,
            if kinds.is_empty() {
                "none".to_string()
            } else {
                kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join(",")
            }
        );
    }

    let start = Instant::now();
    let hang_after = args.budget + args.grace;
    let hook = args.fault_hook.clone().map(|program| faults::Hook {
        program,
        replicas: args.replica.len().max(1),
        seed,
    });
    let fault_targets = target.fault_targets(&kinds, hook);
    let faults_covered = Arc::new(AtomicBool::new(fault_targets.is_none()));
    let faults_failed = Arc::new(AtomicBool::new(false));
    let plan = Arc::new(Plan {
        mode: args.mode,
        via: target.via.clone(),
        keys: args.keys,
        // The library reads one statement at a time: no transactions on replicas.
        transactions: !library,
        start,
        deadline: start + Duration::from_secs_f64(args.seconds),
        faults_covered: Arc::clone(&faults_covered),
        faults_failed: Arc::clone(&faults_failed),
        max_ops: args.ops,
        hang_after,
        seed,
    });
    let stop = Arc::new(AtomicBool::new(false));
    let schedule = fault_targets.map(|targets| {
        let schedule =
            faults::Schedule::new(seed, &kinds, targets.replica_count(), args.fault_period);
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let ran = faults::run(schedule, targets, start, &stop, &faults_covered);
            // The clients stop too: the cluster is no longer what the schedule says.
            faults_failed.store(ran.is_err(), Ordering::SeqCst);
            ran
        })
    });
    let done = Arc::new(AtomicU64::new(0));
    let bar = progress(&args, start, Arc::clone(&done));
    let ops = workload::run(plan, args.workers, done).await;
    bar.finish_and_clear();
    let seconds = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::SeqCst);
    let fault_windows = match schedule {
        Some(thread) => tokio::task::spawn_blocking(move || thread.join())
            .await?
            .map_err(|_| anyhow::anyhow!("the fault schedule panicked"))?
            .context("injecting or healing a fault")?,
        None => Vec::new(),
    };

    let final_state = target.final_state().await?;
    let verdict = checker::check(
        &ops,
        &fault_windows,
        &final_state,
        &rules(args.mode, library, hang_after),
    );
    if let Some(path) = &args.history {
        history::write(path, &ops, &fault_windows, &final_state.committed)
            .with_context(|| format!("writing the history to {}", path.display()))?;
    }
    let mut summary = Summary {
        mode: args.mode.name().into(),
        seed,
        target: target.describe.clone(),
        server_version,
        seconds,
        workers: args.workers,
        fallbacks: target.fallbacks(),
        guard: target.guard(),
        ..Summary::default()
    };
    Facts {
        ops: &ops,
        faults: &fault_windows,
        verdict: &verdict,
    }
    .fill(&mut summary);
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        report::print(&summary);
    }
    if let Some(path) = &args.history {
        eprintln!("wrote {}", path.display());
    }
    target.shutdown().await?;
    Ok(summary.violations == 0)
}

/// How long setting up and reading back the tables may take.
const SETUP_LIMIT: Duration = Duration::from_secs(60);

/// `work` within [`SETUP_LIMIT`], its error or the timeout saying what was being done.
async fn bounded<T>(
    what: &str,
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::time::timeout(SETUP_LIMIT, work)
        .await
        .with_context(|| format!("{what}: not finished within {SETUP_LIMIT:?}"))?
        .context(what.to_string())
}

/// The progress bar while the clients run (hidden with `--json`): over `--ops` when that is
/// the limit, else over `--seconds`, with the operations so far, their rate and the time left.
/// A run waiting for the first round of faults to finish goes past 100 % of its seconds.
fn progress(args: &VerifyArgs, start: Instant, done: Arc<AtomicU64>) -> ProgressBar {
    if args.json {
        return ProgressBar::hidden();
    }
    let by_ops = args.ops.filter(|&ops| ops > 0);
    let total = by_ops.unwrap_or((args.seconds * 1e3) as u64).max(1);
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{bar:30}] {percent:>3}% {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let ticking = bar.clone();
    tokio::spawn(async move {
        while !ticking.is_finished() {
            let elapsed = start.elapsed();
            let ops = done.load(Ordering::Relaxed);
            ticking.set_position(match by_ops {
                Some(_) => ops,
                None => (elapsed.as_millis() as u64).min(total),
            });
            ticking.set_message(format!(
                "{ops} operations, {:.0}/s, {:.0} s",
                ops as f64 / elapsed.as_secs_f64().max(1e-3),
                elapsed.as_secs_f64()
            ));
            ticking.tick();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    bar
}
