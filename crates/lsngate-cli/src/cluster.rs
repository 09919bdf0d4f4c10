//! `lsngate cluster up|status|down`: a local primary + streaming replicas that outlive the
//! command, for trying lsngate by hand. Built on the same lsngate-cluster crate the tests use.
//! Also the throwaway local cluster `bench` and `verify` start when no deployment is given.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use lsngate_cluster::{Cluster, ClusterConfig, PATRONI_MANIFEST, PatroniCluster, SyncMode};

/// The throwaway cluster of `bench` and `verify`: `replicas` streaming replicas (from
/// `--local-replicas`) held back by `apply_delay`, from `pg_bin` (auto-detected when None).
pub fn local_config(
    replicas: usize,
    apply_delay: Option<Duration>,
    pg_bin: Option<PathBuf>,
) -> anyhow::Result<ClusterConfig> {
    anyhow::ensure!(replicas > 0, "--local-replicas must be at least 1");
    let mut config = ClusterConfig::default().replicas(replicas);
    config.apply_delay = apply_delay;
    config.pg_bin = pg_bin;
    Ok(config)
}

/// Starts it off the runtime's worker threads (initdb and base backups take seconds).
pub async fn start_local(config: ClusterConfig) -> anyhow::Result<Cluster> {
    Ok(tokio::task::spawn_blocking(move || Cluster::start(&config)).await??)
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Start a cluster and print LSNGATE_PRIMARY_URL / LSNGATE_REPLICA_URLS lines to source.
    Up(UpArgs),
    /// Show each node's role, version, port and WAL position.
    Status(DirArgs),
    /// Stop every node and remove the cluster directory.
    Down(DirArgs),
    /// Fault a Patroni cluster (`up --patroni`) as `lsngate verify --fault-hook` asks:
    /// `inject failover` runs patronictl switchover, `inject kill-primary` kills -9 the leader's
    /// Patroni and PostgreSQL; `heal KIND` restarts killed members and waits (at most 55 s) until
    /// there is a leader with every member streaming from it.
    PatroniFault(PatroniFaultArgs),
}

#[derive(Debug, Args)]
pub struct UpArgs {
    /// Number of streaming replicas.
    #[arg(long, default_value_t = 2)]
    replicas: usize,
    /// recovery_min_apply_delay on every replica (e.g. 50ms, 0.2s); makes lag visible.
    #[arg(long, value_parser = crate::duration::parse)]
    apply_delay: Option<Duration>,
    /// Synchronous standby (replica1) with synchronous_commit = off (async), on or remote_apply.
    #[arg(long, default_value = "off")]
    sync: SyncMode,
    /// Turn hot_standby_feedback on for the replicas.
    #[arg(long)]
    hot_standby_feedback: bool,
    /// A Patroni cluster instead (Debian's patroni and etcd-server, scripts/install/patroni.sh):
    /// etcd and 1 + --replicas Patroni members on loopback ports; prints LSNGATE_PATRONI_URLS
    /// (their REST APIs) and the patronictl command line too. Patroni 3.0 manages both the 19
    /// bundle and Debian's 15. With --sync on or remote_apply: Patroni's synchronous_mode.
    #[arg(long)]
    patroni: bool,
    /// With --patroni: HTTPS on the members' REST APIs, with a certificate for localhost from a
    /// CA made for the cluster; prints LSNGATE_PATRONI_CA (the proxy's --patroni-ca-file).
    #[arg(long, requires = "patroni")]
    patroni_https: bool,
    /// PostgreSQL bin dir [default: the 19 bundle, then pg_config --bindir, then
    /// /usr/lib/postgresql/*/bin, highest version first].
    #[arg(long, env = "LSNGATE_PG_BIN")]
    pg_bin: Option<PathBuf>,
    #[command(flatten)]
    dir: DirArgs,
}

#[derive(Debug, Args)]
pub struct PatroniFaultArgs {
    /// inject or heal.
    action: String,
    /// failover or kill-primary.
    kind: String,
    #[command(flatten)]
    dir: DirArgs,
}

#[derive(Debug, Args)]
pub struct DirArgs {
    /// Cluster directory (data dirs, logs, cluster.json): $TMPDIR/lsngate-cluster-<user> unless
    /// given. As root, PostgreSQL runs as user `lsngate`, which must be able to enter every
    /// parent of it (so not under /root).
    #[arg(long, default_value_os_t = lsngate_cluster::default_cluster_dir())]
    dir: PathBuf,
}

pub fn run(command: ClusterCommand) -> anyhow::Result<()> {
    match command {
        ClusterCommand::Up(args) => up(args),
        ClusterCommand::Down(args) if args.dir.join(PATRONI_MANIFEST).exists() => {
            PatroniCluster::open(&args.dir)?.destroy()?;
            eprintln!("stopped and removed {}", args.dir.display());
            Ok(())
        }
        ClusterCommand::Status(args) if args.dir.join(PATRONI_MANIFEST).exists() => {
            patroni_status(&args)
        }
        ClusterCommand::Status(args) => status(args),
        ClusterCommand::PatroniFault(args) => patroni_fault(args),
        ClusterCommand::Down(args) => {
            let cluster = Cluster::open(&args.dir)?;
            cluster.destroy()?;
            eprintln!("stopped and removed {}", args.dir.display());
            Ok(())
        }
    }
}

fn up(args: UpArgs) -> anyhow::Result<()> {
    if args.patroni {
        return up_patroni(args);
    }
    let mut config = ClusterConfig::default()
        .replicas(args.replicas)
        .sync(args.sync)
        .hot_standby_feedback(args.hot_standby_feedback)
        .dir(&args.dir.dir);
    config.apply_delay = args.apply_delay;
    config.pg_bin = args.pg_bin;
    let started = std::time::Instant::now();
    let cluster = Cluster::start(&config)?;
    eprintln!(
        "PostgreSQL {} cluster with {} replica(s) up in {:.1}s at {}",
        cluster.pg_bin().version,
        cluster.replicas().len(),
        started.elapsed().as_secs_f64(),
        cluster.dir().display()
    );
    println!("LSNGATE_PRIMARY_URL={}", cluster.primary_url());
    println!("LSNGATE_REPLICA_URLS={}", cluster.replica_urls().join(","));
    eprintln!(
        "stop it with: lsngate cluster down --dir {}",
        args.dir.dir.display()
    );
    cluster.detach();
    Ok(())
}

fn status(args: DirArgs) -> anyhow::Result<()> {
    let cluster = Cluster::open(&args.dir)?;
    let mut table = crate::table::new(["node", "role", "version", "port", "position", "url"]);
    for node in cluster.nodes() {
        let (role, version, position) = match (
            node.is_in_recovery(),
            node.server_version(),
            node.position(),
        ) {
            (Ok(recovery), Ok(version), Ok(position)) => (
                if recovery { "replica" } else { "primary" }.to_string(),
                version,
                position,
            ),
            (Err(e), ..) | (_, Err(e), _) | (.., Err(e)) => {
                let why = e.to_string();
                let first = why.lines().next().unwrap_or_default().to_string();
                ("down".to_string(), "-".to_string(), first)
            }
        };
        table.add_row([
            node.name().to_string(),
            role,
            version,
            node.port().to_string(),
            position,
            node.url(),
        ]);
    }
    println!("{table}");
    Ok(())
}

fn up_patroni(args: UpArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.apply_delay.is_none() && !args.hot_standby_feedback,
        "--apply-delay and --hot-standby-feedback are not offered with --patroni (Patroni owns \
         the replicas' settings); leave them out, or set them with patronictl edit-config"
    );
    let config = lsngate_cluster::PatroniConfig {
        members: args.replicas + 1,
        pg_bin: args.pg_bin,
        dir: Some(args.dir.dir.clone()),
        synchronous_mode: args.sync != SyncMode::Off,
        rest_tls: args.patroni_https,
    };
    let started = std::time::Instant::now();
    let cluster = PatroniCluster::start(&config)?;
    eprintln!(
        "Patroni cluster (PostgreSQL {}, {} member(s), etcd) up in {:.1}s at {}",
        cluster.pg_bin().version,
        cluster.members().len(),
        started.elapsed().as_secs_f64(),
        cluster.dir().display()
    );
    println!("LSNGATE_PRIMARY_URL={}", cluster.primary_url()?);
    println!("LSNGATE_REPLICA_URLS={}", cluster.replica_urls()?.join(","));
    println!("LSNGATE_PATRONI_URLS={}", cluster.api_urls().join(","));
    if let Some(ca) = cluster.rest_ca() {
        println!("LSNGATE_PATRONI_CA={}", ca.display());
    }
    eprintln!("patronictl: {}", cluster.patronictl());
    eprintln!(
        "stop it with: lsngate cluster down --dir {}",
        args.dir.dir.display()
    );
    cluster.detach();
    Ok(())
}

fn patroni_status(args: &DirArgs) -> anyhow::Result<()> {
    let cluster = PatroniCluster::open(&args.dir)?;
    let mut table = crate::table::new(["member", "role", "state", "timeline", "port", "api"]);
    let listed = cluster.cluster_members()?;
    for member in cluster.members() {
        let (role, state, timeline) = match listed.iter().find(|m| m.name == member.name) {
            Some(m) => (
                m.role.clone(),
                m.state.clone(),
                m.timeline.map_or("-".into(), |t| t.to_string()),
            ),
            None => ("-".into(), "not listed".into(), "-".into()),
        };
        table.add_row([
            member.name.clone(),
            role,
            state,
            timeline,
            member.pg_port.to_string(),
            member.api_url(),
        ]);
    }
    println!("{table}");
    eprintln!("patronictl: {}", cluster.patronictl());
    Ok(())
}

fn patroni_fault(args: PatroniFaultArgs) -> anyhow::Result<()> {
    let cluster = PatroniCluster::open(&args.dir.dir)?;
    let members = cluster.members().len();
    match (args.action.as_str(), args.kind.as_str()) {
        ("inject", "failover") => {
            let old = cluster.leader()?.unwrap_or_default();
            let new = cluster.switchover(None)?;
            println!("patronictl switchover {old} -> {new}");
        }
        ("inject", "kill-primary") => println!("kill -9 of leader {}", cluster.kill_leader()?),
        ("heal", "failover" | "kill-primary") => {
            let restarted = cluster.restart_stopped()?;
            cluster.wait_healthy(members, Duration::from_secs(55))?;
            println!(
                "leader {} with {} replica(s); restarted {restarted:?}",
                cluster.leader()?.unwrap_or_default(),
                members - 1
            );
        }
        (action, kind) => anyhow::bail!(
            "lsngate cluster patroni-fault {action} {kind}: expected inject or heal, and failover \
             or kill-primary (run lsngate verify with --faults failover,kill-primary)"
        ),
    }
    Ok(())
}
