//! pgpool-II beside lsngate in the benchmark (`pgpool-<setting>` rows): Debian's pgpool2 in
//! streaming-replication mode with load balancing, started for one row in a temporary directory
//! on free loopback ports, in front of the same primary and replicas, with the setting that
//! aims at read-your-writes. Each worker writes and reads back on one pgpool connection, as an
//! application would. pgpool decides who serves each read and does not say so in the answer,
//! so "served by replica" is pgpool's own count of the SELECTs its standbys ran during the row
//! (`SHOW pool_nodes`, `select_cnt`).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls, SimpleQueryMessage, Statement};

use super::strategy::{INSERT, READ};

/// Where Debian's pgpool2 puts the binary (scripts/install/proxy.sh installs it).
pub const PGPOOL: &str = "/usr/sbin/pgpool";

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

    fn settings(self) -> String {
        let (on_write, delay, check) = match self {
            PgpoolMode::DelayThreshold => ("off", 1, 1),
            other => (other.name(), 0, 0),
        };
        format!(
            "disable_load_balance_on_write = '{on_write}'\ndelay_threshold = {delay}\n\
             sr_check_period = {check}\n"
        )
    }
}

/// Whether pgpool-II is installed here; the reason it cannot run otherwise.
pub fn missing() -> Option<String> {
    (!Path::new(PGPOOL).exists()).then(|| {
        format!("pgpool-II is not installed ({PGPOOL}); scripts/install/proxy.sh installs Debian's pgpool2")
    })
}

/// One node as pgpool's backend list names it.
#[derive(Debug, Clone)]
pub struct Backend {
    pub host: String,
    pub port: u16,
}

/// A running pgpool-II, stopped when dropped.
pub struct Pgpool {
    child: Child,
    port: u16,
    /// The primary URL's login, database and password, for clients and SHOW pool_nodes.
    login: tokio_postgres::Config,
    _dir: tempfile::TempDir,
}

impl Pgpool {
    /// Starts pgpool in `mode` before `primary` and `replicas` (the primary gets weight 0: load
    /// balancing sends reads to the standbys only), with room for `workers` clients; returns
    /// once it answers (at most 30 s).
    pub async fn start(
        mode: PgpoolMode,
        primary_url: &str,
        primary: &Backend,
        replicas: &[Backend],
        workers: usize,
    ) -> anyhow::Result<Pgpool> {
        let dir = tempfile::tempdir()?;
        let port = free_port()?;
        let pcp_port = free_port()?;
        let primary_login: tokio_postgres::Config = primary_url.parse()?;
        let user = primary_login.get_user().unwrap_or("postgres").to_string();
        // The primary URL's login and database, at pgpool's address (`host()` on the parsed URL
        // would add a host after the primary's, and clients would reach the primary).
        let mut login = tokio_postgres::Config::new();
        login
            .user(&user)
            .dbname(primary_login.get_dbname().unwrap_or("postgres"))
            .host("127.0.0.1")
            .port(port);
        if let Some(password) = primary_login.get_password() {
            login.password(password);
        }
        let path = dir.path().display().to_string();
        let mut conf = format!(
            "backend_clustering_mode = 'streaming_replication'\n\
             listen_addresses = '127.0.0.1'\nport = {port}\nsocket_dir = '{path}'\n\
             pcp_listen_addresses = ''\npcp_port = {pcp_port}\npcp_socket_dir = '{path}'\n\
             pid_file_name = '{path}/pgpool.pid'\nlogdir = '{path}'\nlog_destination = 'stderr'\n\
             num_init_children = {}\nmax_pool = 1\nenable_pool_hba = off\n\
             load_balance_mode = on\nstatement_level_load_balance = off\n\
             sr_check_user = '{user}'\nhealth_check_period = 0\n\
             failover_on_backend_error = off\n{}",
            workers + 4,
            mode.settings()
        );
        if let Some(password) = login.get_password() {
            conf.push_str(&format!(
                "sr_check_password = '{}'\n",
                String::from_utf8_lossy(password).replace('\'', "''")
            ));
        }
        for (i, (node, weight)) in std::iter::once((primary, 0))
            .chain(replicas.iter().map(|r| (r, 1)))
            .enumerate()
        {
            conf.push_str(&format!(
                "backend_hostname{i} = '{}'\nbackend_port{i} = {}\nbackend_weight{i} = {weight}\n\
                 backend_flag{i} = 'DISALLOW_TO_FAILOVER'\n",
                node.host, node.port
            ));
        }
        let conf_path = dir.path().join("pgpool.conf");
        std::fs::write(&conf_path, conf)?;
        let pcp = dir.path().join("pcp.conf");
        std::fs::write(&pcp, "")?;
        let log = std::fs::File::create(dir.path().join("pgpool.log"))?;
        let child = Command::new(PGPOOL)
            .arg("-n")
            .arg("-f")
            .arg(&conf_path)
            .arg("-F")
            .arg(&pcp)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        let mut pgpool = Pgpool {
            child,
            port,
            login,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = pgpool.child.try_wait()? {
                anyhow::bail!(
                    "pgpool-II exited at start ({status}): {}",
                    pgpool.log_tail()
                );
            }
            if let Ok(client) = pgpool.connect().await
                && client.simple_query("SELECT 1").await.is_ok()
            {
                return Ok(pgpool);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "pgpool-II on port {} did not answer within 30 s: {}",
                pgpool.port,
                pgpool.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self._dir.path().join("pgpool.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    async fn connect(&self) -> anyhow::Result<Client> {
        let (client, connection) =
            tokio::time::timeout(Duration::from_secs(10), self.login.connect(NoTls))
                .await
                .map_err(|_| anyhow::anyhow!("no answer from pgpool-II within 10 s"))??;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }

    /// A worker's connection, its statements prepared.
    pub async fn client(&self) -> anyhow::Result<PgpoolClient> {
        let client = self.connect().await?;
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
        let client = self.connect().await?;
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

impl Drop for Pgpool {
    fn drop(&mut self) {
        // SIGTERM ("smart" would wait for clients): pgpool's children go with their parent.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
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

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
