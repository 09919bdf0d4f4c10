//! pgpool-II beside lsngate in the benchmark (`pgpool-<setting>` rows): Debian's pgpool2 in
//! streaming-replication mode with load balancing, started for one row by the test kit
//! (`lsngate_cluster::Pgpool`, which the proxy's throughput benchmark runs too) in front of the
//! same primary and replicas, with the setting that aims at read-your-writes. Each worker writes and reads back on one pgpool connection, as an
//! application would. pgpool decides who serves each read and does not say so in the answer,
//! so "served by replica" is pgpool's own count of the SELECTs its standbys ran during the row
//! (`SHOW pool_nodes`, `select_cnt`).

use lsngate_cluster::{Pgpool, PgpoolConfig};
use tokio_postgres::{Client, SimpleQueryMessage, Statement};

use super::strategy::{INSERT, READ};

/// pgpool-II's settings that aim at read-your-writes, one row each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgpoolMode {
    /// `disable_load_balance_on_write = 'transaction'`: after a write, the rest of its
    /// transaction reads the primary.
    Transaction,
    /// `disable_load_balance_on_write = 'always'`: after a write, the session reads the primary.
    Always,
    /// `disable_load_balance_on_write = 'dml_adaptive'`: reads of tables written in the
    /// transaction read the primary.
    DmlAdaptive,
    /// `delay_threshold = 1` (bytes, checked every `sr_check_period` = 1 s): reads avoid a
    /// standby pgpool last saw behind.
    DelayThreshold,
}

impl PgpoolMode {
    /// Every row, in the order the table shows them.
    pub const ALL: [PgpoolMode; 4] = [
        PgpoolMode::Transaction,
        PgpoolMode::Always,
        PgpoolMode::DmlAdaptive,
        PgpoolMode::DelayThreshold,
    ];

    /// The part after `pgpool-` in the strategy's name.
    pub fn name(self) -> &'static str {
        match self {
            PgpoolMode::Transaction => "transaction",
            PgpoolMode::Always => "always",
            PgpoolMode::DmlAdaptive => "dml_adaptive",
            PgpoolMode::DelayThreshold => "delay_threshold",
        }
    }

    /// The mode named `name` (the part after `pgpool-`).
    pub fn parse(name: &str) -> Option<PgpoolMode> {
        PgpoolMode::ALL.into_iter().find(|m| m.name() == name)
    }

    /// `config` with this mode's setting.
    fn configure(self, config: PgpoolConfig) -> PgpoolConfig {
        match self {
            PgpoolMode::DelayThreshold => config
                .setting("disable_load_balance_on_write", "'off'")
                .setting("delay_threshold", "1")
                .setting("sr_check_period", "1"),
            other => config
                .setting(
                    "disable_load_balance_on_write",
                    &format!("'{}'", other.name()),
                )
                .setting("delay_threshold", "0"),
        }
    }
}

/// Why pgpool-II cannot run here, if it cannot.
pub fn missing() -> Option<String> {
    Pgpool::check_installed().err().map(|e| e.to_string())
}

/// A pgpool-II started for one row (the test kit's, which knows how to run it), stopped when
/// dropped.
pub struct PgpoolRow {
    pgpool: Pgpool,
}

impl PgpoolRow {
    /// Starts pgpool in `mode` before `primary_url` and `replica_urls` (load balancing sends
    /// reads to the standbys only), with room for `workers` clients; returns once it answers.
    pub async fn start(
        mode: PgpoolMode,
        primary_url: &str,
        replica_urls: &[String],
        workers: usize,
    ) -> anyhow::Result<PgpoolRow> {
        let config = mode.configure(PgpoolConfig::new(primary_url, replica_urls)?.clients(workers));
        let pgpool = tokio::task::spawn_blocking(move || Pgpool::start(&config)).await??;
        Ok(PgpoolRow { pgpool })
    }

    /// A worker's connection, its statements prepared.
    pub async fn client(&self) -> anyhow::Result<PgpoolClient> {
        let client = self.pgpool.connect().await?;
        client
            .batch_execute("SET synchronous_commit = local")
            .await?;
        Ok(PgpoolClient {
            insert: client.prepare(INSERT).await?,
            read: client.prepare(READ).await?,
            client,
        })
    }

    /// SELECTs the standbys have run through pgpool so far (`SHOW pool_nodes`, `select_cnt`).
    pub async fn standby_selects(&self) -> anyhow::Result<u64> {
        let client = self.pgpool.connect().await?;
        let messages = client.simple_query("SHOW pool_nodes").await?;
        let mut total = 0;
        for message in &messages {
            if let SimpleQueryMessage::Row(row) = message
                && row.get("role") == Some("standby")
            {
                total += row
                    .get("select_cnt")
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
        Ok(total)
    }
}

/// One worker's pgpool connection.
pub struct PgpoolClient {
    client: Client,
    insert: Statement,
    read: Statement,
}

impl PgpoolClient {
    pub async fn insert(&self, payload: &str) -> anyhow::Result<i64> {
        Ok(self
            .client
            .query_one(&self.insert, &[&payload])
            .await?
            .get(0))
    }

    pub async fn read(&self, id: i64) -> anyhow::Result<Option<String>> {
        let row = self.client.query_opt(&self.read, &[&id]).await?;
        Ok(row.map(|r| r.get(0)))
    }
}
