//! `lsngate lag`: where each replica's lag comes from.
//!
//! Gathers, per replica, what the primary says (`pg_stat_replication`: write / flush / replay
//! lag and positions) and what the replica says (received vs replayed position, replay paused,
//! apply delay, WAL receiver state, recovery conflicts), optionally a true lag measured with a
//! heartbeat row, and turns it into a one-line verdict. The verdict is a pure function of the
//! gathered facts ([`diagnose`]); gathering is the only part that talks to servers.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use tokio_postgres::Client;

use crate::duration;
use crate::pg;

#[derive(Debug, Args)]
pub struct LagArgs {
    /// Primary URL (libpq form). Without it, the local cluster in --dir is used.
    #[arg(long, env = "LSNGATE_PRIMARY_URL")]
    primary: Option<String>,
    /// Replica URL; repeat for several, or comma-separate.
    #[arg(long = "replica", env = "LSNGATE_REPLICA_URLS", value_delimiter = ',')]
    replicas: Vec<String>,
    /// Cluster directory of `lsngate cluster up`, used when --primary is not given.
    #[arg(long, default_value_os_t = lsngate_cluster::default_cluster_dir())]
    dir: PathBuf,
    /// Measure true lag with a heartbeat row (creates table lsngate_heartbeat on the primary).
    #[arg(long)]
    heartbeat: bool,
    /// Refresh every interval (e.g. 1s) until interrupted.
    #[arg(long, value_parser = duration::parse, num_args = 0..=1, default_missing_value = "1s")]
    watch: Option<Duration>,
    /// Print JSON (one object per refresh) instead of a table.
    #[arg(long)]
    json: bool,
    /// How long to sample the primary's WAL position for the WAL rate on a single run.
    #[arg(long, value_parser = duration::parse, default_value = "1s")]
    sample: Duration,
    /// Bytes received but not replayed above which replay is called the bottleneck.
    #[arg(long, default_value_t = 1024 * 1024)]
    replay_backlog_bytes: u64,
    #[command(flatten)]
    advise: crate::advise::AdviseArgs,
}

/// Everything known about one replica at one moment.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplicaFacts {
    pub url: String,
    pub reachable: bool,
    pub error: Option<String>,
    pub in_recovery: Option<bool>,
    /// The application_name this replica streams under, as pg_stat_replication lists it.
    pub sender_name: Option<String>,
    /// WAL receiver status on the replica (`streaming`, `waiting`, ...), `None` when no receiver.
    pub receiver_status: Option<String>,
    /// A row for this replica in the primary's pg_stat_replication.
    pub listed_by_primary: bool,
    pub replay_paused: bool,
    pub apply_delay_ms: u64,
    pub receive_lsn: Option<String>,
    pub replay_lsn: Option<String>,
    pub bytes_behind_primary: Option<u64>,
    pub bytes_received_not_replayed: Option<u64>,
    pub write_lag_ms: Option<f64>,
    pub flush_lag_ms: Option<f64>,
    pub replay_lag_ms: Option<f64>,
    pub conflicts: Conflicts,
    pub heartbeat_lag_ms: Option<f64>,
}

/// `pg_stat_database_conflicts` summed over databases: queries cancelled by replay.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Conflicts {
    pub snapshot: i64,
    pub lock: i64,
    pub bufferpin: i64,
    pub tablespace: i64,
    pub deadlock: i64,
}

impl Conflicts {
    fn total(&self) -> i64 {
        self.snapshot + self.lock + self.bufferpin + self.tablespace + self.deadlock
    }
}

/// Where the lag is.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Bottleneck {
    None,
    NetworkOrDisk,
    Replay,
    ReplayPaused,
    ApplyDelay,
    Conflicts,
    NotStreaming,
    Promoted,
    Down,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Verdict {
    pub bottleneck: Bottleneck,
    pub reason: String,
}

/// The one-line verdict for a replica. Order matters: a replica that is down or promoted has no
/// lag to explain; a paused or delayed replay explains any backlog; then the numbers.
pub fn diagnose(facts: &ReplicaFacts, replay_backlog_bytes: u64) -> Verdict {
    let verdict = |bottleneck, reason: String| Verdict { bottleneck, reason };
    if !facts.reachable {
        let why = facts.error.clone().unwrap_or_default();
        return verdict(
            Bottleneck::Down,
            format!("not streaming: the replica is down or unreachable ({why})"),
        );
    }
    if facts.in_recovery == Some(false) {
        return verdict(
            Bottleneck::Promoted,
            "not in recovery: this node was promoted and is a primary now; stop routing replica reads to it".into(),
        );
    }
    if facts.receiver_status.as_deref() != Some("streaming") || !facts.listed_by_primary {
        let status = facts
            .receiver_status
            .as_deref()
            .unwrap_or("no WAL receiver");
        return verdict(
            Bottleneck::NotStreaming,
            format!(
                "not streaming from the primary (WAL receiver: {status}{}); it only replays what it already has",
                if facts.listed_by_primary {
                    ""
                } else {
                    ", absent from pg_stat_replication"
                }
            ),
        );
    }
    let backlog = facts.bytes_received_not_replayed.unwrap_or(0);
    if facts.replay_paused {
        return verdict(
            Bottleneck::ReplayPaused,
            format!(
                "replay is paused (pg_wal_replay_pause): {backlog} bytes received but not applied; resume with pg_wal_replay_resume()"
            ),
        );
    }
    if facts.apply_delay_ms > 0 {
        return verdict(
            Bottleneck::ApplyDelay,
            format!(
                "replay held back on purpose by recovery_min_apply_delay = {}ms",
                facts.apply_delay_ms
            ),
        );
    }
    let conflicts = facts.conflicts;
    if backlog > replay_backlog_bytes {
        let why = if conflicts.total() > 0 {
            format!(
                "; {} queries were cancelled by replay conflicts, so long queries on this replica are holding replay back",
                conflicts.total()
            )
        } else {
            "; the startup process applies WAL slower than it arrives (heavy WAL, or read load on the replica competing for CPU/IO)".into()
        };
        return verdict(
            Bottleneck::Replay,
            format!("replay: {backlog} bytes received but not yet applied{why}"),
        );
    }
    let behind = facts.bytes_behind_primary.unwrap_or(0);
    if behind > replay_backlog_bytes {
        return verdict(
            Bottleneck::NetworkOrDisk,
            format!(
                "network/disk: {behind} bytes behind the primary but only {backlog} waiting for replay; WAL arrives slowly (write lag {}, flush lag {})",
                show_ms(facts.write_lag_ms),
                show_ms(facts.flush_lag_ms)
            ),
        );
    }
    if conflicts.total() > 0 {
        return verdict(
            Bottleneck::Conflicts,
            format!(
                "caught up, but {} queries were cancelled by replay (snapshot {}, lock {}, bufferpin {}); move long reports to a dedicated replica",
                conflicts.total(),
                conflicts.snapshot,
                conflicts.lock,
                conflicts.bufferpin
            ),
        );
    }
    verdict(
        Bottleneck::None,
        format!(
            "caught up: {behind} bytes behind, replay lag {}",
            show_ms(facts.heartbeat_lag_ms.or(facts.replay_lag_ms))
        ),
    )
}

fn show_ms(ms: Option<f64>) -> String {
    ms.map_or("n/a".into(), |ms| format!("{ms:.1}ms"))
}

#[derive(Debug, Serialize)]
struct Report {
    primary_url: String,
    primary_version: String,
    primary_lsn: String,
    wal_bytes_per_minute: Option<f64>,
    replicas: Vec<ReplicaReport>,
}

#[derive(Debug, Serialize)]
struct ReplicaReport {
    #[serde(flatten)]
    facts: ReplicaFacts,
    verdict: Verdict,
}

pub async fn run(args: LagArgs) -> anyhow::Result<()> {
    let (primary_url, replica_urls) = match &args.primary {
        Some(url) => (url.clone(), args.replicas.clone()),
        None => {
            let cluster = lsngate_cluster::Cluster::open(&args.dir)?;
            (cluster.primary_url(), cluster.replica_urls())
        }
    };
    anyhow::ensure!(
        !replica_urls.is_empty(),
        "no replicas given: pass --replica URL (repeatable) or start a cluster with `lsngate cluster up`"
    );
    if args.advise.advise {
        return crate::advise::run(&args.advise, &primary_url, &replica_urls, args.json).await;
    }
    let primary = pg::connect(&primary_url).await?;
    let mut last_position: Option<(Instant, u64)> = None;
    loop {
        let wal_rate = match (args.watch, last_position) {
            (Some(_), Some(previous)) => wal_rate(&primary, previous).await?,
            _ => sample_wal_rate(&primary, args.sample).await?,
        };
        last_position = Some((Instant::now(), current_lsn(&primary).await?));
        let report = gather(&args, &primary_url, &primary, &replica_urls, wal_rate.1).await?;
        if args.json {
            println!("{}", serde_json::to_string(&report)?);
        } else {
            if args.watch.is_some() {
                print!("\x1b[2J\x1b[H");
            }
            print_report(&report);
        }
        match args.watch {
            Some(every) => tokio::time::sleep(every).await,
            None => return Ok(()),
        }
    }
}

async fn current_lsn(primary: &Client) -> anyhow::Result<u64> {
    let row = primary
        .query_one(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8",
            &[],
        )
        .await?;
    Ok(row.get::<_, f64>(0) as u64)
}

async fn sample_wal_rate(primary: &Client, over: Duration) -> anyhow::Result<(u64, Option<f64>)> {
    let start = (Instant::now(), current_lsn(primary).await?);
    tokio::time::sleep(over).await;
    wal_rate(primary, start).await
}

async fn wal_rate(
    primary: &Client,
    (t0, lsn0): (Instant, u64),
) -> anyhow::Result<(u64, Option<f64>)> {
    let lsn1 = current_lsn(primary).await?;
    let seconds = t0.elapsed().as_secs_f64();
    let rate = (seconds > 0.0).then(|| lsn1.saturating_sub(lsn0) as f64 / seconds * 60.0);
    Ok((lsn1, rate))
}

async fn gather(
    args: &LagArgs,
    primary_url: &str,
    primary: &Client,
    replica_urls: &[String],
    wal_bytes_per_minute: Option<f64>,
) -> anyhow::Result<Report> {
    let senders = primary
        .query(
            "SELECT application_name,
                    pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::float8,
                    extract(epoch FROM write_lag)::float8 * 1000,
                    extract(epoch FROM flush_lag)::float8 * 1000,
                    extract(epoch FROM replay_lag)::float8 * 1000
             FROM pg_stat_replication",
            &[],
        )
        .await?;
    let mut replicas = Vec::new();
    let mut clients = Vec::new();
    for url in replica_urls {
        let (facts, client) = match pg::connect(url).await {
            Ok(client) => match replica_facts(url, &client).await {
                Ok(facts) => (facts, Some(client)),
                Err(e) => (unreachable(url, e), None),
            },
            Err(e) => (unreachable(url, e), None),
        };
        replicas.push(facts);
        clients.push(client);
    }
    if args.heartbeat {
        // Connections are open before the beat, so the measured time is replay, not connecting.
        let heartbeat = Heartbeat::beat(primary).await?;
        let lags = futures_util::future::join_all(clients.iter().map(|client| async {
            match client {
                Some(client) => heartbeat.lag_on(client).await.ok(),
                None => None,
            }
        }))
        .await;
        for (facts, lag) in replicas.iter_mut().zip(lags) {
            facts.heartbeat_lag_ms = lag;
        }
    }
    let replicas = replicas
        .into_iter()
        .map(|mut facts| {
            let sender = facts.sender_name.as_deref().and_then(|name| {
                senders
                    .iter()
                    .find(|row| row.get::<_, Option<String>>(0).as_deref() == Some(name))
            });
            if let Some(row) = sender {
                facts.listed_by_primary = true;
                facts.bytes_behind_primary =
                    row.get::<_, Option<f64>>(1).map(|b| b.max(0.0) as u64);
                facts.write_lag_ms = row.get(2);
                facts.flush_lag_ms = row.get(3);
                facts.replay_lag_ms = row.get(4);
            }
            let verdict = diagnose(&facts, args.replay_backlog_bytes);
            ReplicaReport { facts, verdict }
        })
        .collect();
    Ok(Report {
        primary_url: primary_url.to_string(),
        primary_version: pg::server_version(primary).await?,
        primary_lsn: primary
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await?
            .get(0),
        wal_bytes_per_minute,
        replicas,
    })
}

fn unreachable(url: &str, e: anyhow::Error) -> ReplicaFacts {
    ReplicaFacts {
        url: url.to_string(),
        error: Some(format!("{e:#}")),
        ..ReplicaFacts::default()
    }
}

async fn replica_facts(url: &str, replica: &Client) -> anyhow::Result<ReplicaFacts> {
    let row = replica
        .query_one(
            "SELECT pg_is_in_recovery(),
                    pg_last_wal_receive_lsn()::text,
                    pg_last_wal_replay_lsn()::text,
                    pg_wal_lsn_diff(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn())::float8,
                    CASE WHEN pg_is_in_recovery() THEN pg_get_wal_replay_pause_state() <> 'not paused' ELSE false END,
                    (SELECT setting::bigint FROM pg_settings WHERE name = 'recovery_min_apply_delay'),
                    (SELECT status FROM pg_stat_wal_receiver),
                    (SELECT substring(conninfo FROM 'application_name=([^ ]+)') FROM pg_stat_wal_receiver),
                    (SELECT coalesce(sum(confl_snapshot), 0)::bigint FROM pg_stat_database_conflicts),
                    (SELECT coalesce(sum(confl_lock), 0)::bigint FROM pg_stat_database_conflicts),
                    (SELECT coalesce(sum(confl_bufferpin), 0)::bigint FROM pg_stat_database_conflicts),
                    (SELECT coalesce(sum(confl_tablespace), 0)::bigint FROM pg_stat_database_conflicts),
                    (SELECT coalesce(sum(confl_deadlock), 0)::bigint FROM pg_stat_database_conflicts),
                    current_setting('cluster_name')",
            &[],
        )
        .await?;
    let application_name: Option<String> = row.get(7);
    let cluster_name: String = row.get(13);
    // What the walreceiver reports as application_name: the conninfo's, else cluster_name,
    // else "walreceiver".
    let name = application_name
        .or((!cluster_name.is_empty()).then_some(cluster_name))
        .unwrap_or_else(|| "walreceiver".into());
    Ok(ReplicaFacts {
        url: url.to_string(),
        reachable: true,
        error: None,
        in_recovery: Some(row.get(0)),
        sender_name: Some(name),
        receive_lsn: row.get(1),
        replay_lsn: row.get(2),
        bytes_received_not_replayed: row.get::<_, Option<f64>>(3).map(|b| b.max(0.0) as u64),
        replay_paused: row.get(4),
        apply_delay_ms: row.get::<_, Option<i64>>(5).unwrap_or(0).max(0) as u64,
        receiver_status: row.get(6),
        conflicts: Conflicts {
            snapshot: row.get(8),
            lock: row.get(9),
            bufferpin: row.get(10),
            tablespace: row.get(11),
            deadlock: row.get(12),
        },
        ..ReplicaFacts::default()
    })
}

/// A heartbeat row: the primary writes a new beat, each replica is polled until it shows that
/// beat. The time between is the true lag as a reader feels it, measured with one clock (this
/// process's), so server clock skew does not enter. `pg_last_xact_replay_timestamp()` is not
/// used: it grows while the primary is idle.
pub(crate) struct Heartbeat {
    beat: i64,
    written_at: Instant,
}

impl Heartbeat {
    const TABLE: &'static str = "lsngate_heartbeat";
    pub(crate) const GIVE_UP: Duration = Duration::from_secs(10);

    pub(crate) async fn beat(primary: &Client) -> anyhow::Result<Heartbeat> {
        primary
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {} (id int PRIMARY KEY, beat bigint NOT NULL, at timestamptz NOT NULL)",
                Self::TABLE
            ))
            .await?;
        let row = primary
            .query_one(
                &format!(
                    "INSERT INTO {} VALUES (1, 1, clock_timestamp()) ON CONFLICT (id) DO UPDATE
                     SET beat = {0}.beat + 1, at = clock_timestamp() RETURNING beat",
                    Self::TABLE
                ),
                &[],
            )
            .await?;
        Ok(Heartbeat {
            beat: row.get(0),
            written_at: Instant::now(),
        })
    }

    pub(crate) async fn lag_on(&self, replica: &Client) -> anyhow::Result<f64> {
        let query = format!(
            "SELECT coalesce(max(beat), 0) FROM {} WHERE id = 1",
            Self::TABLE
        );
        loop {
            let seen: i64 = replica
                .query_one(&query, &[])
                .await
                .map(|row| row.get(0))
                .unwrap_or(0);
            if seen >= self.beat {
                return Ok(self.written_at.elapsed().as_secs_f64() * 1e3);
            }
            anyhow::ensure!(
                self.written_at.elapsed() < Self::GIVE_UP,
                "heartbeat not visible after {:?}",
                Self::GIVE_UP
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

fn print_report(report: &Report) {
    println!(
        "primary {} (PostgreSQL {}) at {}, WAL {}",
        report.primary_url,
        report.primary_version,
        report.primary_lsn,
        report
            .wal_bytes_per_minute
            .map_or("n/a".into(), |rate| format!("{}/min", bytes(rate as u64)))
    );
    let mut table = crate::table::new([
        "replica",
        "state",
        "write lag",
        "flush lag",
        "replay lag",
        "behind primary",
        "not replayed",
        "conflicts",
        "heartbeat lag",
        "verdict",
    ]);
    for replica in &report.replicas {
        let facts = &replica.facts;
        let state = match (facts.reachable, facts.in_recovery, &facts.receiver_status) {
            (false, ..) => "down".to_string(),
            (true, Some(false), _) => "primary".to_string(),
            (true, _, Some(status)) if facts.replay_paused => format!("{status}, paused"),
            (true, _, Some(status)) => status.clone(),
            (true, _, None) => "no receiver".to_string(),
        };
        table.add_row([
            host_port(&facts.url),
            state,
            show_ms(facts.write_lag_ms),
            show_ms(facts.flush_lag_ms),
            show_ms(facts.replay_lag_ms),
            facts.bytes_behind_primary.map_or("n/a".into(), bytes),
            facts
                .bytes_received_not_replayed
                .map_or("n/a".into(), bytes),
            facts.conflicts.total().to_string(),
            show_ms(facts.heartbeat_lag_ms),
            replica.verdict.reason.clone(),
        ]);
    }
    println!("{table}");
}

/// `host:port` of a URL, for a narrow column; the URL itself when it has no such part.
pub(crate) fn host_port(url: &str) -> String {
    url.parse::<tokio_postgres::Config>()
        .ok()
        .and_then(|config| {
            let host = match config.get_hosts().first()? {
                tokio_postgres::config::Host::Tcp(host) => host.clone(),
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            };
            let port = config.get_ports().first().copied().unwrap_or(5432);
            Some(format!("{host}:{port}"))
        })
        .unwrap_or_else(|| url.to_string())
}

fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streaming() -> ReplicaFacts {
        ReplicaFacts {
            url: "r".into(),
            reachable: true,
            in_recovery: Some(true),
            receiver_status: Some("streaming".into()),
            listed_by_primary: true,
            bytes_behind_primary: Some(0),
            bytes_received_not_replayed: Some(0),
            ..ReplicaFacts::default()
        }
    }

    #[test]
    fn verdicts_name_the_bottleneck() {
        assert_eq!(diagnose(&streaming(), 1024).bottleneck, Bottleneck::None);
        let mut paused = streaming();
        paused.replay_paused = true;
        assert_eq!(diagnose(&paused, 1024).bottleneck, Bottleneck::ReplayPaused);
        let mut backlog = streaming();
        backlog.bytes_received_not_replayed = Some(10_000);
        assert_eq!(diagnose(&backlog, 1024).bottleneck, Bottleneck::Replay);
        let mut slow_network = streaming();
        slow_network.bytes_behind_primary = Some(10_000);
        assert_eq!(
            diagnose(&slow_network, 1024).bottleneck,
            Bottleneck::NetworkOrDisk
        );
        let mut stopped = streaming();
        stopped.receiver_status = None;
        assert_eq!(
            diagnose(&stopped, 1024).bottleneck,
            Bottleneck::NotStreaming
        );
        let mut promoted = streaming();
        promoted.in_recovery = Some(false);
        assert_eq!(diagnose(&promoted, 1024).bottleneck, Bottleneck::Promoted);
        let mut conflicted = streaming();
        conflicted.conflicts.snapshot = 3;
        assert_eq!(
            diagnose(&conflicted, 1024).bottleneck,
            Bottleneck::Conflicts
        );
        let down = ReplicaFacts::default();
        assert_eq!(diagnose(&down, 1024).bottleneck, Bottleneck::Down);
    }
}
