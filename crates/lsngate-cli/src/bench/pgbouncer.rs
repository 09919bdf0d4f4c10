//! PgBouncer beside lsngate in the benchmark (the `pgbouncer` row): Debian's pgbouncer, started
//! by the test kit (`lsngate_cluster::Pgbouncer`, which the proxy's throughput benchmark runs too)
//! with one database for the primary and one per replica, as a team splits reads from writes
//! with it today: each worker writes through the primary database and reads the row back at once
//! through its replica's. No read-your-writes (stale like `replica`): what the row shows is the
//! cost of a pooler's hop on this machine, the yardstick for the proxy rows, which make the same
//! hop and add the guarantee. Session pooling, so the workers' prepared statements stay on their
//! server connections (PgBouncer before 1.21 does not carry them in transaction pooling); the
//! hop is the same in either mode.

use lsngate_cluster::{Pgbouncer, PgbouncerConfig, PoolMode};
use tokio_postgres::{Client, Statement};

use super::strategy::{INSERT, READ};

/// The database name of replica `index` through PgBouncer.
fn replica_database(index: usize) -> String {
    format!("replica{index}")
}

/// Why PgBouncer cannot run here, if it cannot.
pub fn missing() -> Option<String> {
    Pgbouncer::check_installed().err().map(|e| e.to_string())
}

/// A PgBouncer started for the run, stopped when dropped.
pub struct PgbouncerRow {
    pgbouncer: Pgbouncer,
    replicas: usize,
}

impl PgbouncerRow {
    /// Starts PgBouncer before `primary_url` and `replica_urls`, with a server connection for
    /// each of `workers` per database; returns once every database answers through it.
    pub async fn start(
        primary_url: &str,
        replica_urls: &[String],
        workers: usize,
    ) -> anyhow::Result<PgbouncerRow> {
        let mut config = PgbouncerConfig::default()
            .database("primary", primary_url)?
            .pool_mode(PoolMode::Session)
            .pool_size(workers + 1);
        for (index, url) in replica_urls.iter().enumerate() {
            config = config.database(&replica_database(index), url)?;
        }
        let pgbouncer = tokio::task::spawn_blocking(move || Pgbouncer::start(&config)).await??;
        Ok(PgbouncerRow {
            pgbouncer,
            replicas: replica_urls.len(),
        })
    }

    /// A worker's connections (the primary's, and one per replica), their statements prepared.
    pub async fn client(&self) -> anyhow::Result<PgbouncerClient> {
        let primary = self.pgbouncer.connect("primary").await?;
        primary
            .batch_execute("SET synchronous_commit = local")
            .await?;
        let mut replicas = Vec::new();
        for index in 0..self.replicas {
            let replica = self.pgbouncer.connect(&replica_database(index)).await?;
            let read = replica.prepare(READ).await?;
            replicas.push((replica, read));
        }
        Ok(PgbouncerClient {
            insert: primary.prepare(INSERT).await?,
            primary,
            replicas,
        })
    }
}

/// One worker's connections through PgBouncer.
pub struct PgbouncerClient {
    primary: Client,
    insert: Statement,
    replicas: Vec<(Client, Statement)>,
}

impl PgbouncerClient {
    pub async fn insert(&self, payload: &str) -> anyhow::Result<i64> {
        Ok(self
            .primary
            .query_one(&self.insert, &[&payload])
            .await?
            .get(0))
    }

    /// Reads row `id` through replica `replica`'s database.
    pub async fn read(&self, replica: usize, id: i64) -> anyhow::Result<Option<String>> {
        let (client, read) = &self.replicas[replica];
        let row = client.query_opt(read, &[&id]).await?;
        Ok(row.map(|r| r.get(0)))
    }
}
