//! `lsngate verify`: a Jepsen-style check of the guarantee on a deployment, under faults.
//! Concurrent clients read and write versioned registers through an lsngate proxy (one it is
//! given, or an in-process one in front of a local cluster it starts), a seeded schedule injects
//! faults into the local cluster's replicas, every operation goes into a history, and the checker
//! says whether any read was stale or went back in time, whether any acknowledged write was lost
//! or applied twice, and whether anything hung. Exit status 1 on any violation.
//!
//! The pieces: [`workload`] (the clients), [`faults`] (the schedule), [`history`] (the records
//! and `--history FILE`), [`checker`] (pure), [`report`] (the table and `--json`).

mod checker;
mod faults;
mod history;
mod report;
mod workload;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use lsngate_cluster::{Cluster, Forwarder};

use checker::{FinalState, Rules};
use faults::{FaultKind, FaultList};
use report::{Facts, Summary};
use workload::{LOG_TABLE, Mode, Plan, REGISTER_TABLE};

use crate::duration;
use crate::inproc_proxy::{self, InProcessProxy, ProxySetup};

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// A running lsngate proxy to check (libpq URL, e.g. postgres://app:secret@10.0.0.5:6432/app).
    /// Without it a local cluster (--local-replicas replicas) and an in-process proxy in front of
    /// it are started, used and removed. Faults need the local cluster. The run recreates the
    /// tables lsngate_verify_register and lsngate_verify_log and leaves them for inspection.
    #[arg(long)]
    proxy: Option<String>,
    /// Consistency mode the clients ask the proxy for: session, token (writes on one connection,
    /// reads on another with the commit position handed over, also between clients), global, or
    /// eventual (the self-test control: must show violations when a replica lags).
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
    /// net-delay, blackhole, all or none [default: all locally, none with --proxy].
    #[arg(long, value_parser = faults::parse_list)]
    faults: Option<FaultList>,
    /// Length of one fault period: each period holds one fault for 40–70 % of it.
    #[arg(long, value_parser = duration::parse, default_value = "2s")]
    fault_period: Duration,
    /// Seed of the fault schedule and the clients' choices [default: random, printed].
    #[arg(long)]
    seed: Option<u64>,
    /// The in-process proxy's wait budget per read (wait_timeout_ms), e.g. 500ms.
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

/// What the checker holds each mode to.
fn rules(mode: Mode, hang_after: Duration) -> Rules {
    Rules {
        own_writes: mode != Mode::Token,
        all_acknowledged: mode == Mode::Global,
        token_floors: mode == Mode::Token,
        hang_after_ms: hang_after.as_secs_f64() * 1e3,
    }
}

/// Runs the command; `Ok(false)` when the checker found a violation (exit status 1).
pub async fn run(args: VerifyArgs) -> anyhow::Result<bool> {
    anyhow::ensure!(
        args.workers > 0 && args.keys > 0 && args.seconds > 0.0,
        "--workers, --keys and --seconds must be above 0"
    );
    let seed = args.seed.unwrap_or_else(rand::random);
    let kinds = match (&args.faults, &args.proxy) {
        (Some(FaultList(kinds)), Some(_)) if !kinds.is_empty() => anyhow::bail!(
            "--faults needs the local cluster: with --proxy the hosts are not lsngate's to fault; drop --faults or --proxy"
        ),
        (Some(FaultList(kinds)), _) => kinds.clone(),
        (None, Some(_)) => Vec::new(),
        (None, None) => faults::ALL.to_vec(),
    };
    let target = Target::open(&args).await?;
    let mut endpoint = target.endpoint.clone();
    endpoint.application_name("lsngate-verify");

    let server_version = prepare_schema(&endpoint, &target, args.keys).await?;
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
    let fault_targets = target.fault_targets(&kinds);
    let faults_covered = Arc::new(AtomicBool::new(fault_targets.is_none()));
    let plan = Arc::new(Plan {
        mode: args.mode,
        endpoint: endpoint.clone(),
        keys: args.keys,
        start,
        deadline: start + Duration::from_secs_f64(args.seconds),
        faults_covered: Arc::clone(&faults_covered),
        max_ops: args.ops,
        hang_after,
        seed,
    });
    let stop = Arc::new(AtomicBool::new(false));
    let schedule = fault_targets.map(|targets| {
        let schedule =
            faults::Schedule::new(seed, &kinds, targets.replicas.len(), args.fault_period);
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || faults::run(schedule, &targets, start, &stop, &faults_covered))
    });
    let ops = workload::run(plan, args.workers, progress(&args)).await;
    let seconds = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::SeqCst);
    let fault_windows = match schedule {
        Some(thread) => tokio::task::spawn_blocking(move || thread.join())
            .await?
            .map_err(|_| anyhow::anyhow!("the fault schedule panicked"))?
            .context("injecting or healing a fault")?,
        None => Vec::new(),
    };

    let final_state = final_state(&endpoint).await?;
    let verdict = checker::check(
        &ops,
        &fault_windows,
        &final_state,
        &rules(args.mode, hang_after),
    );
    if let Some(path) = &args.history {
        history::write(path, &ops, &fault_windows)
            .with_context(|| format!("writing the history to {}", path.display()))?;
    }
    let mut summary = Summary {
        mode: args.mode.name().into(),
        seed,
        target: target.describe.clone(),
        server_version,
        seconds,
        workers: args.workers,
        fallbacks: target.proxy.as_ref().map(|p| {
            let outcomes = p.outcomes();
            outcomes.fallback + outcomes.no_replica
        }),
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

/// The proxy the clients talk to, and the local cluster behind it when there is one.
struct Target {
    endpoint: tokio_postgres::Config,
    describe: String,
    proxy: Option<InProcessProxy>,
    /// The local cluster and, per replica, the forwarder the proxy reaches it through (where the
    /// network faults are made).
    local: Option<(Cluster, Vec<Arc<Forwarder>>)>,
    baseline_delay: Duration,
}

impl Target {
    async fn open(args: &VerifyArgs) -> anyhow::Result<Target> {
        if let Some(url) = &args.proxy {
            let endpoint: tokio_postgres::Config = url.parse().with_context(|| {
                format!("invalid --proxy {url:?}: expected postgres://user:password@host:port/db")
            })?;
            let mut shown = endpoint.clone();
            shown.password("");
            return Ok(Target {
                endpoint,
                describe: format!("proxy {}", describe_endpoint(&shown)),
                proxy: None,
                local: None,
                baseline_delay: Duration::ZERO,
            });
        }
        let config = crate::cluster::local_config(
            args.local_replicas,
            args.apply_delay,
            args.pg_bin.clone(),
        )?;
        if !args.json {
            eprintln!(
                "starting a local cluster (1 primary, {} replica(s)) and an in-process proxy…",
                args.local_replicas
            );
        }
        let cluster = crate::cluster::start_local(config).await?;
        let mut forwarders = Vec::new();
        let mut replica_urls = Vec::new();
        for replica in cluster.replicas() {
            let forwarder = Arc::new(Forwarder::start(replica.port())?);
            replica_urls.push(format!(
                "postgres://postgres@127.0.0.1:{}/postgres",
                forwarder.port()
            ));
            forwarders.push(forwarder);
        }
        let setup = ProxySetup::new(
            &cluster.primary_url(),
            &replica_urls,
            args.workers * 2,
            args.budget,
        )?;
        let proxy = InProcessProxy::start(&setup).await?;
        Ok(Target {
            endpoint: proxy.client_config().clone(),
            describe: format!(
                "local cluster (1 primary, {} replica(s)) + in-process proxy",
                args.local_replicas
            ),
            proxy: Some(proxy),
            local: Some((cluster, forwarders)),
            baseline_delay: args.apply_delay.unwrap_or(Duration::ZERO),
        })
    }

    /// What the fault schedule acts on (local cluster only).
    fn fault_targets(&self, kinds: &[FaultKind]) -> Option<faults::Targets> {
        let (cluster, forwarders) = self.local.as_ref()?;
        if kinds.is_empty() {
            return None;
        }
        Some(faults::Targets {
            replicas: cluster.replicas().to_vec(),
            forwarders: forwarders.clone(),
            baseline_delay: self.baseline_delay,
        })
    }

    /// Drains the in-process proxy, then stops and removes the local cluster.
    async fn shutdown(self) -> anyhow::Result<()> {
        if let Some(proxy) = self.proxy {
            proxy.shutdown().await?;
        }
        if let Some((cluster, forwarders)) = self.local {
            drop(forwarders);
            tokio::task::block_in_place(|| drop(cluster));
        }
        Ok(())
    }
}

fn describe_endpoint(config: &tokio_postgres::Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .unwrap_or_default();
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "{}@{host}:{port}/{}",
        config.get_user().unwrap_or(""),
        config.get_dbname().unwrap_or("")
    )
}

/// How long setting up and reading back the tables may take.
const SETUP_LIMIT: Duration = Duration::from_secs(60);

/// Recreates the tables through the proxy (DDL goes to the primary) and waits until the
/// replicas have them, so no read fails on a missing table; returns the server version.
async fn prepare_schema(
    endpoint: &tokio_postgres::Config,
    target: &Target,
    keys: usize,
) -> anyhow::Result<String> {
    let setup = async {
        let client = inproc_proxy::connect(endpoint, "session").await?;
        client.batch_execute(&workload::schema_sql(keys)).await?;
        let row = client
            .query_one(
                "/* lsngate:route=primary */ SELECT pg_current_wal_insert_lsn()::text, current_setting('server_version')",
                &[],
            )
            .await?;
        let (position, version): (String, String) = (row.get(0), row.get(1));
        match &target.local {
            Some((cluster, _)) => {
                let replicas = cluster.replicas().to_vec();
                tokio::task::spawn_blocking(move || {
                    for replica in replicas {
                        replica.wait_replayed(&position, Duration::from_secs(30))?;
                    }
                    anyhow::Ok(())
                })
                .await??;
            }
            // Another deployment's replicas are not ours to ask: read the table on a replica
            // through the proxy until it is there a few times in a row.
            None => {
                let probe =
                    format!("/* lsngate:route=replica */ SELECT count(*) FROM {REGISTER_TABLE}");
                let mut in_a_row = 0;
                while in_a_row < 5 {
                    match client.simple_query(&probe).await {
                        Ok(_) => in_a_row += 1,
                        Err(_) => {
                            in_a_row = 0;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            }
        }
        anyhow::Ok(version)
    };
    bounded("creating the verify tables through the proxy", setup).await
}

/// How many times each op id is in the log on the primary.
async fn final_state(endpoint: &tokio_postgres::Config) -> anyhow::Result<FinalState> {
    let read = async {
        let client = inproc_proxy::connect(endpoint, "session").await?;
        let rows = client
            .query(
                &format!("/* lsngate:route=primary */ SELECT op_id, count(*)::int FROM {LOG_TABLE} GROUP BY op_id"),
                &[],
            )
            .await?;
        let committed: HashMap<String, u32> = rows
            .iter()
            .map(|row| (row.get::<_, String>(0), row.get::<_, i32>(1) as u32))
            .collect();
        anyhow::Ok(FinalState { committed })
    };
    bounded("reading the log on the primary through the proxy", read).await
}

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

fn progress(args: &VerifyArgs) -> ProgressBar {
    if args.json {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {pos} operations {elapsed}")
            .expect("valid template"),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}
