//! What the benchmark runs against: a local cluster it starts (and configures per strategy), or
//! an existing one given by URLs (where it only says what it cannot run, and why).

use std::time::Duration;

use lsngate_cluster::{Cluster, SyncMode};
use tokio_postgres::Client;

use super::BenchArgs;
use super::report::{Environment, Skipped};
use super::strategy::{Session, Strategy};
use crate::pg;

pub struct Target {
    local: Option<Cluster>,
    primary_url: String,
    replica_urls: Vec<String>,
    server_version: String,
    /// Major version of each replica.
    replica_majors: Vec<u32>,
    /// The primary has a synchronous standby (needed by sync-on and remote-apply).
    sync_standby: bool,
    /// Apply delay the replicas run with outside the sweep.
    apply_delay: Duration,
}

impl Target {
    pub async fn open(args: &BenchArgs, wants_sync: bool) -> anyhow::Result<Target> {
        let (local, primary_url, replica_urls) = match &args.primary {
            Some(primary) => {
                anyhow::ensure!(
                    !args.replicas.is_empty(),
                    "--primary needs at least one --replica URL"
                );
                (None, primary.clone(), args.replicas.clone())
            }
            None => {
                let mut config = crate::cluster::local_config(
                    args.local_replicas,
                    args.apply_delay,
                    args.pg_bin.clone(),
                )?;
                if wants_sync {
                    // replica1 becomes the synchronous standby; every other strategy's sessions
                    // commit with synchronous_commit = local, as fast as plain async replication.
                    config.sync = SyncMode::On;
                }
                eprintln!(
                    "starting a local cluster (1 primary, {} replica(s))…",
                    args.local_replicas
                );
                let cluster = crate::cluster::start_local(config).await?;
                let (primary, replicas) = (cluster.primary_url(), cluster.replica_urls());
                (Some(cluster), primary, replicas)
            }
        };
        let primary = pg::connect(&primary_url).await?;
        let server_version = pg::server_version(&primary).await?;
        let mut replica_majors = Vec::new();
        let mut apply_delay = Duration::ZERO;
        for (i, url) in replica_urls.iter().enumerate() {
            let replica = pg::connect(url).await?;
            let in_recovery: bool = replica
                .query_one("SELECT pg_is_in_recovery()", &[])
                .await?
                .get(0);
            anyhow::ensure!(
                in_recovery,
                "{url} is not a replica (pg_is_in_recovery() is false)"
            );
            replica_majors.push(pg::server_major(&replica).await?);
            if i == 0 {
                apply_delay = current_apply_delay(&replica).await?;
            }
        }
        let sync_standby = has_sync_standby(&primary).await?;
        Ok(Target {
            local,
            primary_url,
            replica_urls,
            server_version,
            replica_majors,
            sync_standby,
            apply_delay,
        })
    }

    pub fn is_local(&self) -> bool {
        self.local.is_some()
    }

    pub fn primary_url(&self) -> &str {
        &self.primary_url
    }

    pub fn replica_urls(&self) -> &[String] {
        &self.replica_urls
    }

    /// Splits the requested strategies into those that can run here and those that cannot.
    pub fn check(&self, requested: &[Strategy]) -> (Vec<Strategy>, Vec<Skipped>) {
        let mut runnable = Vec::new();
        let mut skipped = Vec::new();
        for strategy in requested {
            let reason = match strategy {
                Strategy::WaitFor => self
                    .replica_majors
                    .iter()
                    .find(|&&major| major < 19)
                    .map(|major| format!("WAIT FOR LSN needs PostgreSQL 19 or later on every replica (found {major}); use poll")),
                Strategy::Pgpool(_) => super::pgpool::missing(),
                Strategy::Pgbouncer => super::pgbouncer::missing(),
                s if s.needs_sync_standby() && !self.sync_standby => Some(
                    "the primary has no synchronous standby (synchronous_standby_names is empty or none is connected); configure one and pass it as the first --replica".to_string(),
                ),
                _ => None,
            };
            match reason {
                Some(reason) => skipped.push(Skipped {
                    strategy: strategy.to_string(),
                    reason,
                }),
                None => runnable.push(strategy.clone()),
            }
        }
        (runnable, skipped)
    }

    pub fn environment(&self, args: &BenchArgs) -> Environment {
        Environment {
            server_version: self.server_version.clone(),
            cluster: if self.is_local() {
                "local cluster on 127.0.0.1"
            } else {
                "existing cluster"
            }
            .into(),
            replicas: self.replica_urls.len(),
            apply_delay_ms: self.apply_delay.as_secs_f64() * 1e3,
            synchronous_standby: self.sync_standby,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            workers: args.workers,
            ops: args.ops,
            rounds: args.rounds,
            budget_ms: args.timeout.as_secs_f64() * 1e3,
            lsngate_version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    /// Creates the benchmark table and waits until every replica has it.
    pub async fn prepare_schema(&self) -> anyhow::Result<()> {
        let primary = pg::connect(&self.primary_url).await?;
        primary
            .batch_execute(
                "SET synchronous_commit = local;
                 DROP TABLE IF EXISTS lsngate_bench;
                 CREATE TABLE lsngate_bench (
                     id bigserial PRIMARY KEY,
                     payload text NOT NULL,
                     written_at timestamptz NOT NULL DEFAULT now())",
            )
            .await?;
        let position: String = primary
            .query_one(lsngate_core::probe::INSERT_POSITION_SQL, &[])
            .await?
            .get(0);
        for url in &self.replica_urls {
            let replica = pg::connect(url).await?;
            let check = format!(
                "SELECT pg_last_wal_replay_lsn() >= {}",
                lsngate_core::Lsn::parse(&position)?.to_sql_literal()
            );
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60) + self.apply_delay;
            while !replica.query_one(&check, &[]).await?.get::<_, bool>(0) {
                anyhow::ensure!(
                    tokio::time::Instant::now() < deadline,
                    "{url} did not replay the benchmark table within 60s; is it streaming? (lsngate lag)"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(())
    }

    pub async fn drop_schema(&self) -> anyhow::Result<()> {
        let primary = pg::connect(&self.primary_url).await?;
        primary
            .batch_execute("SET synchronous_commit = local; DROP TABLE IF EXISTS lsngate_bench")
            .await?;
        Ok(())
    }

    /// One session (a connection to every node, statements prepared) per worker, all sharing
    /// one lsngate gate with a pool slot per worker.
    pub async fn sessions(&self, workers: usize, budget: Duration) -> anyhow::Result<Vec<Session>> {
        // The gate's writes commit like every other strategy's (synchronous_commit = local): with
        // a synchronous standby configured for sync-on/remote-apply, the server's default would
        // make each library write wait for the standby, and its write p50 would measure that.
        let config = lsngate::Config::new(local_commit(&self.primary_url))
            .replicas(self.replica_urls.iter().cloned())
            .budget(budget)
            .pool_size(workers + 2)
            // The sweep drives every read to the primary on purpose: measure that, do not trip.
            .guard(lsngate::GuardConfig {
                max_concurrent: workers.max(1),
                max_fallback_ratio: 1.0,
                ..lsngate::GuardConfig::default()
            });
        let gate = lsngate::Gate::connect(config).await?;
        let mut sessions = Vec::with_capacity(workers);
        for _ in 0..workers {
            let primary = pg::connect(&self.primary_url).await?;
            let mut replicas: Vec<Client> = Vec::new();
            for url in &self.replica_urls {
                replicas.push(pg::connect(url).await?);
            }
            sessions.push(Session::prepare(gate.clone(), primary, replicas).await?);
        }
        Ok(sessions)
    }

    /// For the sweep: on a local cluster, sets every replica's apply delay to `delay` and returns
    /// it; on an existing cluster, changes nothing and returns the delay replica1 runs with.
    pub async fn hold_back_replicas(&self, delay: Duration) -> anyhow::Result<Duration> {
        match &self.local {
            Some(cluster) => {
                set_apply_delay(cluster, delay)?;
                Ok(delay)
            }
            None => Ok(self.apply_delay),
        }
    }

    /// Back to the delay the main table ran with.
    pub async fn release_replicas(&self, original: Option<Duration>) -> anyhow::Result<()> {
        if let Some(cluster) = &self.local {
            set_apply_delay(cluster, original.unwrap_or(Duration::ZERO))?;
        }
        Ok(())
    }

    /// Stops and removes a local cluster (an existing one is left alone).
    pub fn shutdown(self) {
        if let Some(cluster) = self.local {
            tokio::task::block_in_place(|| drop(cluster));
        }
    }
}

fn set_apply_delay(cluster: &Cluster, delay: Duration) -> anyhow::Result<()> {
    let expected = format!("{}ms", delay.as_millis());
    tokio::task::block_in_place(|| {
        for replica in cluster.replicas() {
            replica.set_apply_delay(delay)?;
            replica.wait_until("apply delay applied", Duration::from_secs(10), || {
                let shown = replica.sql("SELECT setting || 'ms' FROM pg_settings WHERE name = 'recovery_min_apply_delay'")?;
                Ok(shown == expected)
            })?;
        }
        anyhow::Ok(())
    })
}

async fn current_apply_delay(replica: &Client) -> anyhow::Result<Duration> {
    let ms: String = replica
        .query_one(
            "SELECT setting FROM pg_settings WHERE name = 'recovery_min_apply_delay'",
            &[],
        )
        .await?
        .get(0);
    Ok(Duration::from_millis(ms.parse().unwrap_or(0)))
}

async fn has_sync_standby(primary: &Client) -> anyhow::Result<bool> {
    let row = primary
        .query_one(
            "SELECT current_setting('synchronous_standby_names') <> ''
                AND EXISTS (SELECT 1 FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// `url` with `options=-c synchronous_commit=local`, unless it sets `options` itself (then the
/// user's options stand, as written).
fn local_commit(url: &str) -> String {
    if url.contains("options=") {
        return url.to_string();
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}options=-c%20synchronous_commit%3Dlocal")
}

#[cfg(test)]
mod local_commit_tests {
    use super::local_commit;

    #[test]
    fn the_gate_commits_locally_unless_the_url_says_otherwise() {
        assert_eq!(
            local_commit("postgres://u@h:5/db"),
            "postgres://u@h:5/db?options=-c%20synchronous_commit%3Dlocal"
        );
        assert_eq!(
            local_commit("postgres://u@h:5/db?sslmode=disable"),
            "postgres://u@h:5/db?sslmode=disable&options=-c%20synchronous_commit%3Dlocal"
        );
        let own = "postgres://u@h:5/db?options=-c%20work_mem%3D1MB";
        assert_eq!(local_commit(own), own);
        let parsed: tokio_postgres::Config = local_commit("postgres://u@h:5/db").parse().unwrap();
        assert_eq!(parsed.get_options(), Some("-c synchronous_commit=local"));
    }
}
