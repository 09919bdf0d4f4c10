//! What a verify run checks and what it owns: a proxy it was given (`--proxy`), the library over
//! URLs it was given (`--primary`/`--replica`), or a local cluster it starts with, in front of
//! each replica, a fault forwarder — and either an in-process proxy or the library's `Gate`
//! reaching the replicas through those forwarders (where the network faults are made). Also
//! where the tables are made and the log is read back: through the proxy, or on the primary
//! through the gate. Not the workload and not the fault schedule.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use lsngate_cluster::{Cluster, Forwarder};

use super::checker::FinalState;
use super::client::Via;
use super::faults::{self, FaultKind};
use super::library_client::LibraryTarget;
use super::workload::{self, LOG_TABLE, Mode, REGISTER_TABLE};
use super::{VerifyArgs, bounded};
use crate::inproc_proxy::{self, Guard, InProcessProxy, ProxySetup};

/// The target the clients talk to, and the local cluster behind it when there is one.
pub struct Target {
    pub via: Via,
    pub describe: String,
    proxy: Option<InProcessProxy>,
    /// The local cluster and the forwarders the proxy or the gate reaches it through.
    local: Option<Local>,
    baseline_delay: Duration,
}

/// The local cluster and, per server, the forwarder the proxy or the gate reaches it through
/// (where the network faults are made, and what lets a failover swap the roles behind the same
/// addresses).
struct Local {
    cluster: Cluster,
    primary_forwarder: Arc<Forwarder>,
    forwarders: Vec<Arc<Forwarder>>,
}

impl Target {
    pub async fn open(args: &VerifyArgs, library: bool) -> anyhow::Result<Target> {
        if let Some(url) = &args.proxy {
            let mut endpoint: tokio_postgres::Config = url.parse().with_context(|| {
                format!("invalid --proxy {url:?}: expected postgres://user:password@host:port/db")
            })?;
            endpoint.application_name("lsngate-verify");
            return Ok(Target {
                describe: format!("proxy {}", describe_url(url)),
                via: Via::Proxy(Box::new(endpoint)),
                proxy: None,
                local: None,
                baseline_delay: Duration::ZERO,
            });
        }
        if let Some(primary) = &args.primary {
            anyhow::ensure!(
                !args.replica.is_empty(),
                "--primary needs at least one --replica URL: without replicas the library reads the primary and nothing can be proved"
            );
            let gate = connect_gate(primary, &args.replica, args).await?;
            return Ok(Target {
                describe: format!(
                    "lsngate library over primary {} and {} replica(s)",
                    describe_url(primary),
                    args.replica.len()
                ),
                via: Via::Library(Arc::new(LibraryTarget::new(gate))),
                proxy: None,
                local: None,
                baseline_delay: Duration::ZERO,
            });
        }
        let front = if library {
            "the lsngate library"
        } else {
            "an in-process proxy"
        };
        let config = crate::cluster::local_config(
            args.local_replicas,
            args.apply_delay,
            args.pg_bin.clone(),
        )?;
        if !args.json {
            eprintln!(
                "starting a local cluster (1 primary, {} replica(s)) and {front}…",
                args.local_replicas
            );
        }
        let cluster = crate::cluster::start_local(config).await?;
        // The primary too is reached through a forwarder: after a failover it is a replica.
        let primary_forwarder = Arc::new(Forwarder::start(cluster.primary().port())?);
        let primary_url = format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            primary_forwarder.port()
        );
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
        let described = format!(
            "local cluster (1 primary, {} replica(s))",
            args.local_replicas
        );
        let (via, proxy, describe) = if library {
            let gate = connect_gate(&primary_url, &replica_urls, args).await?;
            let via = Via::Library(Arc::new(LibraryTarget::new(gate)));
            (via, None, format!("{described} + lsngate library"))
        } else {
            // The fast mode's refused reads wait on a replica: the guard that refuses them is
            // part of what is checked.
            let guard = match args.mode {
                Mode::Fast => Guard::Defaults,
                _ => Guard::Open,
            };
            let setup = ProxySetup::new(
                &primary_url,
                &replica_urls,
                args.workers * 2,
                args.budget,
                guard,
            )?;
            let proxy = InProcessProxy::start(&setup).await?;
            let mut endpoint = proxy.client_config().clone();
            endpoint.application_name("lsngate-verify");
            let describe = format!("{described} + in-process proxy");
            (Via::Proxy(Box::new(endpoint)), Some(proxy), describe)
        };
        Ok(Target {
            via,
            describe,
            proxy,
            local: Some(Local {
                cluster,
                primary_forwarder,
                forwarders,
            }),
            baseline_delay: args.apply_delay.unwrap_or(Duration::ZERO),
        })
    }

    /// What the fault schedule acts on: the local cluster, or the user's hook (`hook`, with the
    /// deployment's replica count) on hosts lsngate does not own. None without faults.
    pub fn fault_targets(
        &self,
        kinds: &[FaultKind],
        hook: Option<faults::Hook>,
    ) -> Option<faults::Targets> {
        if kinds.is_empty() {
            return None;
        }
        if let Some(hook) = hook {
            return Some(faults::Targets::Hook(hook));
        }
        let local = self.local.as_ref()?;
        Some(faults::Targets::Local(faults::LocalTargets {
            primary: local.cluster.primary().clone(),
            primary_forwarder: Arc::clone(&local.primary_forwarder),
            replicas: local.cluster.replicas().to_vec(),
            forwarders: local.forwarders.clone(),
            baseline_delay: self.baseline_delay,
        }))
    }

    /// Reads sent to the primary because no replica could serve them: the in-process proxy's
    /// count, or the library's (`Served::by`); unknown through `--proxy`.
    pub fn fallbacks(&self) -> Option<u64> {
        if let Some(proxy) = &self.proxy {
            let outcomes = proxy.outcomes();
            return Some(outcomes.fallback + outcomes.no_replica);
        }
        match &self.via {
            Via::Library(target) => Some(target.fallbacks.load(Ordering::Relaxed)),
            Via::Proxy(_) => None,
        }
    }

    /// The in-process proxy's primary guard: reads refused a slot, reads then served by a
    /// replica that caught up ([`crate::inproc_proxy::InProcessProxy::guard_counts`]).
    pub fn guard(&self) -> Option<super::report::GuardCounts> {
        self.proxy.as_ref().map(|proxy| {
            let (refused_reads, rescued_reads) = proxy.guard_counts();
            super::report::GuardCounts {
                refused_reads,
                rescued_reads,
            }
        })
    }

    /// Recreates the tables on the primary (through the proxy or the gate) and waits until the
    /// replicas have them, so no read fails on a missing table; returns the server version.
    pub async fn prepare_schema(&self, keys: usize) -> anyhow::Result<String> {
        let setup = async {
            let (position, version) = match &self.via {
                Via::Proxy(endpoint) => schema_through_proxy(endpoint, keys).await?,
                Via::Library(target) => schema_through_gate(target, keys).await?,
            };
            match (&self.local, &self.via) {
                (Some(local), _) => {
                    let replicas = local.cluster.replicas().to_vec();
                    tokio::task::spawn_blocking(move || {
                        for replica in replicas {
                            replica.wait_replayed(&position, Duration::from_secs(30))?;
                        }
                        anyhow::Ok(())
                    })
                    .await??;
                }
                (None, Via::Proxy(endpoint)) => tables_on_a_replica(endpoint).await?,
                (None, Via::Library(target)) => replicas_replayed(target, &position).await?,
            }
            anyhow::Ok(version)
        };
        bounded("creating the verify tables", setup).await
    }

    /// How many times each op id is in the log on the primary. Asked until it answers: right
    /// after the last fault heals, the proxy may not have found the primary yet (a failover's
    /// promoted replica passes its next health check a few seconds later; seed 20261207805 once
    /// ended with "no primary is reachable" instead of a verdict).
    pub async fn final_state(&self) -> anyhow::Result<FinalState> {
        let sql = format!("SELECT op_id, count(*)::int FROM {LOG_TABLE} GROUP BY op_id");
        let rows = until_answered(FINAL_STATE_PATIENCE, || self.read_log(&sql))
            .await
            .context("reading the log on the primary")?;
        let committed: HashMap<String, u32> = rows
            .iter()
            .map(|row| (row.get::<_, String>(0), row.get::<_, i32>(1) as u32))
            .collect();
        Ok(FinalState { committed })
    }

    /// One attempt at the log's rows, on the primary.
    async fn read_log(&self, sql: &str) -> anyhow::Result<Vec<tokio_postgres::Row>> {
        match &self.via {
            Via::Proxy(endpoint) => {
                let client = inproc_proxy::connect(endpoint, "session").await?;
                let routed = format!("/* lsngate:route=primary */ {sql}");
                Ok(client.query(&routed, &[]).await?)
            }
            Via::Library(target) => {
                let sql = sql.to_string();
                let (rows, _) = target
                    .gate
                    .transaction(|c| Box::pin(async move { c.query(&sql, &[]).await }))
                    .await?;
                Ok(rows)
            }
        }
    }

    /// Drains the in-process proxy, then stops and removes the local cluster.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        if let Some(proxy) = self.proxy {
            proxy.shutdown().await?;
        }
        drop(self.via);
        if let Some(local) = self.local {
            drop(local.forwarders);
            drop(local.primary_forwarder);
            tokio::task::block_in_place(|| drop(local.cluster));
        }
        Ok(())
    }
}

/// One gate for every process, sized so that no read waits for a pool slot and no fallback is
/// refused (a refused fallback is an error, not a verdict on the guarantee).
async fn connect_gate(
    primary: &str,
    replicas: &[String],
    args: &VerifyArgs,
) -> anyhow::Result<lsngate::Gate> {
    let config = lsngate::Config::new(primary)
        .replicas(replicas.iter().cloned())
        .budget(args.budget)
        .pool_size(args.workers * 2 + 2)
        .guard(lsngate::GuardConfig {
            max_concurrent: args.workers.max(1),
            max_fallback_ratio: 1.0,
            ..lsngate::GuardConfig::default()
        });
    lsngate::Gate::connect(config)
        .await
        .context("starting the lsngate library's Gate")
}

/// The statement that says where the primary is and what it runs.
const POSITION_SQL: &str =
    "SELECT pg_current_wal_insert_lsn()::text, current_setting('server_version')";

/// The tables through the proxy (DDL goes to the primary); the primary's position after them
/// and the server version.
async fn schema_through_proxy(
    endpoint: &tokio_postgres::Config,
    keys: usize,
) -> anyhow::Result<(String, String)> {
    let client = inproc_proxy::connect(endpoint, "session").await?;
    client.batch_execute(&workload::schema_sql(keys)).await?;
    let routed = format!("/* lsngate:route=primary */ {POSITION_SQL}");
    let row = client.query_one(&routed, &[]).await?;
    Ok((row.get(0), row.get(1)))
}

/// The tables in a transaction of the gate's on the primary (its TLS and URL parameters apply).
async fn schema_through_gate(
    target: &LibraryTarget,
    keys: usize,
) -> anyhow::Result<(String, String)> {
    // A synchronous standby, if any, must not hide replication lag from the run.
    let sql = format!(
        "SET LOCAL synchronous_commit = local; {}",
        workload::schema_sql(keys)
    );
    let (row, _) = target
        .gate
        .transaction(|c| {
            Box::pin(async move {
                c.batch_execute(&sql).await?;
                c.query_one(POSITION_SQL, &[]).await
            })
        })
        .await?;
    let version: String = row.get(1);
    // The position after COMMIT, not the one inside the transaction.
    let position = target.gate.primary_position().await?.lsn.to_string();
    Ok((position, version))
}

/// Another deployment's replicas are not ours to ask: read the table on a replica through the
/// proxy until it is there a few times in a row.
async fn tables_on_a_replica(endpoint: &tokio_postgres::Config) -> anyhow::Result<()> {
    let client = inproc_proxy::connect(endpoint, "session").await?;
    let probe = format!("/* lsngate:route=replica */ SELECT count(*) FROM {REGISTER_TABLE}");
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
    Ok(())
}

/// Waits until the gate's watcher has seen every replica replay `position`.
async fn replicas_replayed(target: &LibraryTarget, position: &str) -> anyhow::Result<()> {
    let position = lsngate::Lsn::parse(position)
        .map_err(|e| anyhow::anyhow!("the primary's position {position:?}: {e}"))?;
    let give_up = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let behind: Vec<String> = target
            .gate
            .replicas()
            .into_iter()
            .filter(|r| r.replayed.is_none_or(|at| at < position))
            .map(|r| format!("{} ({})", r.name, r.address))
            .collect();
        if behind.is_empty() {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < give_up,
            "{} did not replay the verify tables (primary position {position}) within 30 s; is each streaming from --primary? (lsngate lag)",
            behind.join(", ")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `user@host:port/db` of a libpq URL, without its password.
fn describe_url(url: &str) -> String {
    let Ok(config) = url.parse::<tokio_postgres::Config>() else {
        return "(URL not shown)".into();
    };
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

/// How long the final read of the log is tried before the run ends without a verdict.
const FINAL_STATE_PATIENCE: Duration = Duration::from_secs(30);

/// `attempt` run until it succeeds, a quarter of a second apart, each within `patience`; the
/// last error once `patience` has passed. For reads only: running one again changes nothing.
async fn until_answered<T, F, Fut>(patience: Duration, mut attempt: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let error = match tokio::time::timeout(left, attempt()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) => e,
            Err(_) => anyhow::anyhow!("no answer within {patience:?}"),
        };
        if tokio::time::Instant::now() + Duration::from_millis(250) >= deadline {
            return Err(error.context(format!("still failing after {patience:?}")));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// A read that fails until the third attempt answers; one that never answers reports its
    /// last error once the patience is spent.
    #[tokio::test]
    async fn the_final_read_is_tried_until_it_answers_within_its_patience() {
        let tries = AtomicU32::new(0);
        let answer = until_answered(Duration::from_secs(30), || async {
            match tries.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => anyhow::bail!("no primary is reachable"),
                n => Ok(n),
            }
        })
        .await
        .unwrap();
        assert_eq!(answer, 2);

        let error = until_answered(Duration::from_secs(1), || async {
            anyhow::bail!("no primary is reachable") as anyhow::Result<()>
        })
        .await
        .unwrap_err();
        assert!(
            format!("{error:#}").contains("no primary is reachable"),
            "{error:#}"
        );
        assert!(
            format!("{error:#}").contains("still failing after 1s"),
            "{error:#}"
        );
    }
}
