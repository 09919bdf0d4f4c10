//! The read-after-write strategies the benchmark compares, and how each performs one read.
//!
//! Every strategy does the same write (an insert on the primary) and then reads the row back by
//! id "like the next web request would". They differ only in what happens between the COMMIT
//! returning and the read: nothing, a sleep, a synchronous commit, or a wait for the commit's
//! LSN on the replica.

use std::time::{Duration, Instant};

use lsngate_core::probe::{INSERT_POSITION_SQL, REPLAY_SQL};
use lsngate_core::{Lsn, Verdict};
use tokio_postgres::{Client, SimpleQueryMessage, Statement};

use super::pgbouncer::PgbouncerClient;
use super::pgpool::{PgpoolClient, PgpoolMode};
use super::proxy::ProxyClients;

/// One strategy, as named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Strategy {
    /// Read the primary: never stale, spares no load.
    Primary,
    /// Read a replica right away: what naive read/write splitting does.
    Replica,
    /// Sleep, then read a replica.
    Sleep(Duration),
    /// Synchronous standby with `synchronous_commit = on`: waits for flush, not replay.
    SyncOn,
    /// `synchronous_commit = remote_apply`: every commit waits for replay on the standby.
    RemoteApply,
    /// The published pattern: a separate LSN query after commit, `WAIT FOR LSN` on the replica,
    /// then the read (two extra round trips). PostgreSQL ≥ 19.
    WaitFor,
    /// LSN query after commit, then poll `pg_last_wal_replay_lsn()` on the replica, then read.
    Poll,
    /// The lsngate library: the token comes back with the write (same flight), the read goes
    /// straight to a replica known to have it, or waits and reads in one flight.
    Lsngate,
    /// The lsngate proxy in session mode: write, then read on the same proxy connection; the
    /// proxy makes the read see the write.
    ProxySession,
    /// The lsngate proxy in token mode: write on one connection, `SHOW lsngate.commit_lsn` there
    /// (answered by the proxy), read on another with the position as a comment floor.
    ProxyToken,
    /// The lsngate proxy with a causal scope per worker (`SET lsngate.scope` on both
    /// connections): write on one connection, read on another; the scope carries the write.
    ProxyScope,
    /// The lsngate proxy in global mode: write on one connection, read on another, which waits
    /// for every write made through the proxy.
    ProxyGlobal,
    /// The lsngate proxy in eventual mode: write, then read at once on the same connection, the
    /// read on a replica with nothing waited for. No guarantee (stale like `replica`): the
    /// proxy's own hop, what the other proxy rows add their guarantee to.
    ProxyEventual,
    /// The lsngate proxy in fast mode: write, then read at once on the same connection. The read
    /// goes to a replica the proxy already knows has the write, else to the primary while the
    /// primary guard admits it, else it waits on a replica. Never stale; it shows how much of a
    /// read-after-write load the replicas take without waiting.
    ProxyFast,
    /// Not something an application could do: a tight poller reads the row on the replica again
    /// and again until it is there. Its read p50 is how long after COMMIT returned the replica
    /// first shows the row — the floor every exact strategy is measured against.
    Floor,
    /// pgpool-II with load balancing and one of its read-your-writes settings: write, then read
    /// on the same pgpool connection.
    Pgpool(PgpoolMode),
    /// PgBouncer as a plain read/write split: write through its primary database, read at once
    /// through the replica's. No guarantee; its read p50 is a pooler's hop on this machine, what
    /// the proxy rows pay for the same hop before they add the guarantee.
    Pgbouncer,
}

impl std::str::FromStr for Strategy {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(match text {
            "primary" => Strategy::Primary,
            "replica" => Strategy::Replica,
            "sync-on" => Strategy::SyncOn,
            "remote-apply" => Strategy::RemoteApply,
            "waitfor" => Strategy::WaitFor,
            "poll" => Strategy::Poll,
            "lsngate" => Strategy::Lsngate,
            "proxy-session" => Strategy::ProxySession,
            "proxy-token" => Strategy::ProxyToken,
            "proxy-scope" => Strategy::ProxyScope,
            "proxy-global" => Strategy::ProxyGlobal,
            "proxy-eventual" => Strategy::ProxyEventual,
            "proxy-fast" => Strategy::ProxyFast,
            "floor" => Strategy::Floor,
            "pgbouncer" => Strategy::Pgbouncer,
            other => match other.strip_prefix("sleep:") {
                Some(delay) => Strategy::Sleep(crate::duration::parse(delay)?),
                None if other.starts_with("pgpool-") => {
                    match PgpoolMode::parse(&other["pgpool-".len()..]) {
                        Some(mode) => Strategy::Pgpool(mode),
                        None => {
                            return Err(format!(
                                "unknown pgpool setting {other:?}; expected pgpool-transaction, \
                                 pgpool-always, pgpool-dml_adaptive or pgpool-delay_threshold"
                            ));
                        }
                    }
                }
                None => {
                    return Err(format!(
                        "unknown strategy {other:?}; expected one of: {}",
                        Strategy::NAMES
                    ));
                }
            },
        })
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Strategy::Primary => write!(f, "primary"),
            Strategy::Replica => write!(f, "replica"),
            Strategy::Sleep(d) => write!(f, "sleep:{}ms", d.as_millis()),
            Strategy::SyncOn => write!(f, "sync-on"),
            Strategy::RemoteApply => write!(f, "remote-apply"),
            Strategy::WaitFor => write!(f, "waitfor"),
            Strategy::Poll => write!(f, "poll"),
            Strategy::Lsngate => write!(f, "lsngate"),
            Strategy::ProxySession => write!(f, "proxy-session"),
            Strategy::ProxyToken => write!(f, "proxy-token"),
            Strategy::ProxyScope => write!(f, "proxy-scope"),
            Strategy::ProxyGlobal => write!(f, "proxy-global"),
            Strategy::ProxyEventual => write!(f, "proxy-eventual"),
            Strategy::ProxyFast => write!(f, "proxy-fast"),
            Strategy::Floor => write!(f, "floor"),
            Strategy::Pgpool(mode) => write!(f, "pgpool-{}", mode.name()),
            Strategy::Pgbouncer => write!(f, "pgbouncer"),
        }
    }
}

impl Strategy {
    pub const NAMES: &'static str = "primary, replica, sleep:<ms>, sync-on, remote-apply, waitfor, poll, lsngate, proxy-session, proxy-token, proxy-scope, proxy-global, proxy-eventual, proxy-fast, floor, pgbouncer, pgpool-transaction, pgpool-always, pgpool-dml_adaptive, pgpool-delay_threshold";

    /// The `synchronous_commit` a worker's primary session uses for this strategy's writes.
    /// `local` keeps the others as fast as plain asynchronous replication when the cluster has a
    /// synchronous standby configured for the sync strategies.
    pub fn synchronous_commit(&self) -> &'static str {
        match self {
            Strategy::SyncOn => "on",
            Strategy::RemoteApply => "remote_apply",
            _ => "local",
        }
    }

    pub fn needs_sync_standby(&self) -> bool {
        matches!(self, Strategy::SyncOn | Strategy::RemoteApply)
    }

    /// Whether the strategy takes a wait budget (and so belongs in the timeout sweep).
    pub fn has_budget(&self) -> bool {
        matches!(self, Strategy::WaitFor | Strategy::Poll | Strategy::Lsngate)
    }

    /// Whether the strategy goes through the in-process lsngate proxy.
    pub fn uses_proxy(&self) -> bool {
        matches!(
            self,
            Strategy::ProxySession
                | Strategy::ProxyToken
                | Strategy::ProxyScope
                | Strategy::ProxyGlobal
                | Strategy::ProxyEventual
                | Strategy::ProxyFast
        )
    }
}

/// One worker's connections and prepared statements.
pub struct Session {
    /// The lsngate library's gate (shared by every worker; it has its own pools).
    pub gate: lsngate::Gate,
    pub primary: Client,
    pub replicas: Vec<Client>,
    /// Connections through the lsngate proxy, while a proxy strategy runs.
    pub proxy: Option<ProxyClients>,
    /// The worker's pgpool-II connection, while a pgpool strategy runs.
    pub pgpool: Option<PgpoolClient>,
    /// The worker's PgBouncer connections, while the pgbouncer row runs.
    pub pgbouncer: Option<PgbouncerClient>,
    insert: Statement,
    read_primary: Statement,
    read_replica: Vec<Statement>,
    current_lsn: Statement,
    replayed: Vec<Statement>,
    /// `lsngate_core::probe::REPLAY_SQL`, prepared on each replica connection.
    replay_position: Vec<Statement>,
}

pub const INSERT: &str = "INSERT INTO lsngate_bench (payload) VALUES ($1) RETURNING id";
pub const READ: &str = "SELECT payload FROM lsngate_bench WHERE id = $1";
const REPLAYED: &str = "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::text::pg_lsn, false)";

impl Session {
    /// Prepares every statement once, so each later query is one round trip.
    pub async fn prepare(
        gate: lsngate::Gate,
        primary: Client,
        replicas: Vec<Client>,
    ) -> anyhow::Result<Session> {
        let mut read_replica = Vec::new();
        let mut replayed = Vec::new();
        let mut replay_position = Vec::new();
        for replica in &replicas {
            read_replica.push(replica.prepare(READ).await?);
            replayed.push(replica.prepare(REPLAYED).await?);
            replay_position.push(replica.prepare(REPLAY_SQL).await?);
        }
        Ok(Session {
            gate,
            insert: primary.prepare(INSERT).await?,
            read_primary: primary.prepare(READ).await?,
            current_lsn: primary.prepare(INSERT_POSITION_SQL).await?,
            primary,
            replicas,
            proxy: None,
            pgpool: None,
            pgbouncer: None,
            read_replica,
            replayed,
            replay_position,
        })
    }

    /// The worker's pgpool connection; an error when pgpool was not started.
    fn pgpool(&self) -> anyhow::Result<&PgpoolClient> {
        self.pgpool
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("no pgpool connection: pgpool-II was not started"))
    }

    /// The worker's PgBouncer connections; an error when PgBouncer was not started.
    fn pgbouncer(&self) -> anyhow::Result<&PgbouncerClient> {
        self.pgbouncer
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("no PgBouncer connections: PgBouncer was not started"))
    }

    /// The worker's proxy connections; an error when the proxy was not started.
    fn proxy(&self) -> anyhow::Result<&ProxyClients> {
        self.proxy
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("no proxy connections: the proxy was not started"))
    }

    /// The primary connection's `synchronous_commit`.
    pub async fn synchronous_commit(&self) -> anyhow::Result<String> {
        Ok(self
            .primary
            .query_one("SHOW synchronous_commit", &[])
            .await?
            .get(0))
    }

    pub async fn set_synchronous_commit(&self, value: &str) -> anyhow::Result<()> {
        self.primary
            .batch_execute(&format!("SET synchronous_commit = {value}"))
            .await?;
        Ok(())
    }

    pub async fn insert(&self, payload: &str) -> anyhow::Result<i64> {
        Ok(self
            .primary
            .query_one(&self.insert, &[&payload])
            .await?
            .get(0))
    }

    pub async fn read_primary(&self, id: i64) -> anyhow::Result<Option<String>> {
        let row = self.primary.query_opt(&self.read_primary, &[&id]).await?;
        Ok(row.map(|r| r.get(0)))
    }

    pub async fn read_replica(&self, replica: usize, id: i64) -> anyhow::Result<Option<String>> {
        let row = self.replicas[replica]
            .query_opt(&self.read_replica[replica], &[&id])
            .await?;
        Ok(row.map(|r| r.get(0)))
    }

    /// The plain replica read and the replay position after it, sent together on the worker's
    /// own replica connection, as the library reads (the same two statements in one flight):
    /// what the library's trailing position costs without the library around it.
    pub async fn read_replica_with_position(
        &self,
        replica: usize,
        id: i64,
    ) -> anyhow::Result<(Option<String>, String)> {
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&id];
        let (row, position) = tokio::join!(
            self.replicas[replica].query_opt(&self.read_replica[replica], &params),
            self.replicas[replica].query_one(&self.replay_position[replica], &[])
        );
        Ok((row?.map(|r| r.get(0)), position?.get(1)))
    }

    /// The plain insert and the position query sent together on the worker's own primary
    /// connection, as the library sends them (both in one flight): the token's cost without the
    /// library around it.
    pub async fn insert_with_position(&self, payload: &str) -> anyhow::Result<(i64, String)> {
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&payload];
        let (row, position) = tokio::join!(
            self.primary.query_one(&self.insert, &params),
            self.primary.query_one(&self.current_lsn, &[])
        );
        Ok((row?.get(0), position?.get(0)))
    }

    /// The primary's WAL insert position, read after the commit returned (a separate round trip).
    pub async fn commit_lsn(&self) -> anyhow::Result<Lsn> {
        let text: String = self.primary.query_one(&self.current_lsn, &[]).await?.get(0);
        Ok(Lsn::parse(&text)?)
    }

    /// `WAIT FOR LSN` on a replica; true when it answered `success`.
    pub async fn wait_for(
        &self,
        replica: usize,
        lsn: Lsn,
        budget: Duration,
    ) -> anyhow::Result<bool> {
        // The LSN must be a literal (no bind parameters); its text comes from the number.
        let sql = lsngate_core::probe::wait_for_sql(lsn, budget);
        let messages = self.replicas[replica].simple_query(&sql).await?;
        let status = messages.iter().find_map(|m| match m {
            SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
            _ => None,
        });
        Ok(Verdict::of_wait(status.as_deref()) == Verdict::Passed)
    }

    /// Whether `replica` has replayed `lsn` (one round trip).
    pub async fn replayed_on(&self, replica: usize, lsn: Lsn) -> anyhow::Result<bool> {
        let row = self.replicas[replica]
            .query_one(&self.replayed[replica], &[&lsn.to_string()])
            .await?;
        Ok(row.get(0))
    }

    /// Polls the replica's replay position until it reaches `lsn` or the budget is spent.
    pub async fn poll_replayed(
        &self,
        replica: usize,
        lsn: Lsn,
        budget: Duration,
    ) -> anyhow::Result<bool> {
        let deadline = Instant::now() + budget;
        let mut pause = Duration::from_micros(500);
        loop {
            if self.replayed_on(replica, lsn).await? {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(pause.min(deadline - now)).await;
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }
}

/// The write every strategy does (through the proxy for the proxy strategies); `lsngate` also
/// gets its token from the same flight.
pub async fn write(
    strategy: &Strategy,
    session: &Session,
    payload: &str,
) -> anyhow::Result<(i64, Option<lsngate::Token>)> {
    if *strategy == Strategy::Lsngate {
        let (rows, token) = session.gate.write_returning(INSERT, &[&payload]).await?;
        let id = rows.first().map(|row| row.get(0));
        return Ok((
            id.ok_or_else(|| anyhow::anyhow!("INSERT returned no id"))?,
            Some(token),
        ));
    }
    let id = match strategy {
        Strategy::ProxySession => session.proxy()?.session_insert(payload).await?,
        Strategy::ProxyToken => session.proxy()?.token_insert(payload).await?,
        Strategy::ProxyScope => session.proxy()?.scope_insert(payload).await?,
        Strategy::ProxyGlobal => session.proxy()?.global_insert(payload).await?,
        Strategy::ProxyEventual => session.proxy()?.eventual_insert(payload).await?,
        Strategy::ProxyFast => session.proxy()?.fast_insert(payload).await?,
        Strategy::Pgpool(_) => session.pgpool()?.insert(payload).await?,
        Strategy::Pgbouncer => session.pgbouncer()?.insert(payload).await?,
        _ => session.insert(payload).await?,
    };
    Ok((id, None))
}

/// How long the floor poller looks for a row before the run fails.
const FLOOR_LIMIT: Duration = Duration::from_secs(30);

/// What one read-after-write gave.
#[derive(Debug, Clone, Copy)]
pub struct ReadResult {
    pub stale: bool,
    pub served_by_replica: bool,
    pub fallback: bool,
}

/// Reads row `id` (written with `payload`) back under `strategy`, on replica `replica` (the
/// library and the proxy pick their own replica).
pub async fn read_back(
    strategy: &Strategy,
    session: &Session,
    replica: usize,
    (id, token): (i64, Option<lsngate::Token>),
    payload: &str,
    budget: Duration,
) -> anyhow::Result<ReadResult> {
    let on_replica = |seen: Option<String>| ReadResult {
        stale: seen.as_deref() != Some(payload),
        served_by_replica: true,
        fallback: false,
    };
    let fallback = |seen: Option<String>| ReadResult {
        stale: seen.as_deref() != Some(payload),
        served_by_replica: false,
        fallback: true,
    };
    Ok(match strategy {
        Strategy::Pgpool(_) => {
            // pgpool does not tell who served a read: counted from its SHOW pool_nodes instead.
            let seen = session.pgpool()?.read(id).await?;
            ReadResult {
                stale: seen.as_deref() != Some(payload),
                served_by_replica: false,
                fallback: false,
            }
        }
        Strategy::Primary => {
            let seen = session.read_primary(id).await?;
            ReadResult {
                stale: seen.as_deref() != Some(payload),
                served_by_replica: false,
                fallback: false,
            }
        }
        Strategy::Replica | Strategy::SyncOn | Strategy::RemoteApply => {
            on_replica(session.read_replica(replica, id).await?)
        }
        Strategy::Pgbouncer => on_replica(session.pgbouncer()?.read(replica, id).await?),
        Strategy::Sleep(delay) => {
            tokio::time::sleep(*delay).await;
            on_replica(session.read_replica(replica, id).await?)
        }
        Strategy::Floor => {
            // Bounded: a replica that never shows the row fails the run instead of hanging it.
            let give_up = Instant::now() + FLOOR_LIMIT;
            loop {
                let seen = session.read_replica(replica, id).await?;
                if seen.is_some() {
                    break on_replica(seen);
                }
                anyhow::ensure!(
                    Instant::now() < give_up,
                    "the floor poller did not see row {id} on replica {} within {FLOOR_LIMIT:?}; is it streaming? (lsngate lag)",
                    replica + 1
                );
            }
        }
        Strategy::Lsngate => {
            let read = session
                .gate
                .read()
                .after(token)
                .budget(budget)
                .query(READ, &[&id])
                .await?;
            let seen = read.rows.first().map(|row| row.get::<_, String>(0));
            ReadResult {
                stale: seen.as_deref() != Some(payload),
                served_by_replica: matches!(read.served.by, lsngate::ServedBy::Replica(_)),
                fallback: read.served.fallback.is_some(),
            }
        }
        Strategy::ProxySession
        | Strategy::ProxyToken
        | Strategy::ProxyScope
        | Strategy::ProxyGlobal
        | Strategy::ProxyEventual
        | Strategy::ProxyFast => {
            let proxy = session.proxy()?;
            let read = match strategy {
                Strategy::ProxySession => proxy.session_read(id).await?,
                Strategy::ProxyEventual => proxy.eventual_read(id).await?,
                Strategy::ProxyFast => proxy.fast_read(id).await?,
                Strategy::ProxyScope => proxy.scope_read(id).await?,
                Strategy::ProxyGlobal => proxy.global_read(id).await?,
                _ => {
                    let floor = proxy.commit_lsn().await?;
                    proxy.token_read(floor, id).await?
                }
            };
            // The proxy sends the read to a replica; the primary serves it only as a fallback.
            ReadResult {
                stale: read.seen.as_deref() != Some(payload),
                served_by_replica: read.on_replica,
                fallback: !read.on_replica,
            }
        }
        Strategy::WaitFor | Strategy::Poll => {
            let lsn = session.commit_lsn().await?;
            let caught_up = if *strategy == Strategy::WaitFor {
                session.wait_for(replica, lsn, budget).await?
            } else {
                session.poll_replayed(replica, lsn, budget).await?
            };
            if caught_up {
                on_replica(session.read_replica(replica, id).await?)
            } else {
                fallback(session.read_primary(id).await?)
            }
        }
    })
}
