//! The lsngate proxy in front of the benchmark's cluster, for `proxy-session` and `proxy-token`:
//! started in-process on 127.0.0.1:0 with the cluster's primary and replica URLs (a local cluster
//! or an existing one alike), the connections each worker opens through it, and the proxy's own
//! count of how its causal reads ended.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use lsngate_core::Lsn;
use lsngate_proxy::{Config, FileConfig, Proxy};
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage, Statement};

use super::strategy::INSERT;

/// The read through the proxy: the row, and whether a replica served it (the proxy decides).
const READ_WHERE_SERVED: &str =
    "SELECT payload, pg_is_in_recovery() FROM lsngate_bench WHERE id = $1";

/// How long the proxy may take to drain when the benchmark is done.
const DRAIN_LIMIT: Duration = Duration::from_secs(40);

/// What the proxy is started with for each proxy strategy: its config and where clients log in.
#[derive(Debug, Clone)]
pub struct ProxySetup {
    config: Config,
    /// The primary URL's user, password and database (the proxy's address is added at start).
    client: tokio_postgres::Config,
}

impl ProxySetup {
    /// The proxy's config for this cluster; the error says why the proxy cannot run here (it
    /// needs libpq URLs, for example).
    pub fn new(
        primary_url: &str,
        replica_urls: &[String],
        workers: usize,
        budget: Duration,
    ) -> anyhow::Result<ProxySetup> {
        let file = FileConfig {
            // Loopback: clients log in as the primary URL's user (trust without a password).
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            primary: Some(primary_url.to_string()),
            replicas: replica_urls.to_vec(),
            // Every worker's proxy connections may hold a server connection at once.
            pool_size: Some(workers * 2 + 2),
            wait_timeout_ms: Some(budget.as_millis().max(1) as u64),
            // Like the library's gate in this benchmark: fallbacks are measured, never refused.
            fallback_cap: Some(workers.max(1)),
            breaker_ratio: Some(1.0),
            ..FileConfig::default()
        };
        let config = Config::build(file)
            .map_err(|e| anyhow::anyhow!("the proxy cannot be configured for these URLs: {e}"))?;
        Ok(ProxySetup {
            config,
            client: client_config(primary_url)?,
        })
    }
}

/// The proxy as the benchmark runs it: started for one proxy strategy and shut down after it, so
/// its background polling of the nodes does not weigh on the other strategies' numbers.
pub struct BenchProxy {
    proxy: Arc<Proxy>,
    /// Where clients connect: the primary URL's user, password and database, the proxy's address.
    client: tokio_postgres::Config,
    stop: watch::Sender<bool>,
    serving: JoinHandle<anyhow::Result<()>>,
}

impl BenchProxy {
    /// Starts a fresh proxy (its outcome counters at zero) on 127.0.0.1:0.
    pub async fn start(setup: &ProxySetup) -> anyhow::Result<BenchProxy> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the proxy's listener on 127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let mut config = setup.config.clone();
        config.listen = addr;
        let mut client = setup.client.clone();
        client.host(addr.ip().to_string()).port(addr.port());
        let proxy = Proxy::new(config);
        let (stop, stop_rx) = watch::channel(false);
        let serving = tokio::spawn(Arc::clone(&proxy).serve(listener, stop_rx));
        Ok(BenchProxy {
            proxy,
            client,
            stop,
            serving,
        })
    }

    /// One client connection with `lsngate.consistency` set to `consistency` at login. Its
    /// writes commit with `synchronous_commit = local` like every non-synchronous strategy's
    /// (the proxy applies startup settings on each server connection it uses).
    pub async fn connect(&self, consistency: &str) -> anyhow::Result<Client> {
        let mut config = self.client.clone();
        config.options(format!(
            "-c lsngate.consistency={consistency} -c synchronous_commit=local"
        ));
        let (client, connection) =
            tokio::time::timeout(Duration::from_secs(10), config.connect(NoTls))
                .await
                .context("connecting to the in-process proxy: no answer within 10s")?
                .context("connecting to the in-process proxy")?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("proxy connection closed: {e}");
            }
        });
        Ok(client)
    }

    /// The proxy's causal read outcomes so far (what its `/status` reports).
    pub fn outcomes(&self) -> ProxyOutcomes {
        let mut outcomes = ProxyOutcomes::default();
        for (name, count) in self.proxy.causal.stats.outcomes() {
            match name {
                "replica" => outcomes.replica = count,
                "waited" => outcomes.waited = count,
                "fallback" => outcomes.fallback = count,
                "no_replica" => outcomes.no_replica = count,
                "stale" => outcomes.stale = count,
                "error" => outcomes.error = count,
                _ => {}
            }
        }
        outcomes
    }

    /// Stops accepting and waits for the proxy to drain (its clients must be gone first).
    pub async fn shutdown(self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        match tokio::time::timeout(DRAIN_LIMIT, self.serving).await {
            Ok(served) => served.context("the proxy task failed")?,
            Err(_) => anyhow::bail!("the proxy did not drain within {DRAIN_LIMIT:?}"),
        }
    }
}

/// The primary URL's credentials and database, for logging in to the proxy.
fn client_config(primary_url: &str) -> anyhow::Result<tokio_postgres::Config> {
    let primary: tokio_postgres::Config = primary_url
        .parse()
        .with_context(|| format!("invalid primary URL {primary_url:?}"))?;
    let mut config = tokio_postgres::Config::new();
    config
        .application_name("lsngate-bench")
        .connect_timeout(Duration::from_secs(5));
    if let Some(user) = primary.get_user() {
        config.user(user);
    }
    if let Some(password) = primary.get_password() {
        config.password(password);
    }
    if let Some(dbname) = primary.get_dbname() {
        config.dbname(dbname);
    }
    Ok(config)
}

/// How the proxy's causal reads ended over one strategy's run (its `/status` `causal.outcomes`;
/// the proxy is fresh for each run), warm-up reads included; also the JSON
/// `results[].proxy_outcomes`.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ProxyOutcomes {
    /// A replica already known to have the floor served the read.
    pub replica: u64,
    /// A replica served it after waiting (or checking) for the floor.
    pub waited: u64,
    /// The primary served it: no replica had the floor within the budget.
    pub fallback: u64,
    /// The primary served it: no replica was up.
    pub no_replica: u64,
    /// A possibly stale replica answer was served, flagged (never with fallback = primary).
    pub stale: u64,
    /// The client got an error instead.
    pub error: u64,
}

/// One worker's connections through the proxy, statements prepared once.
pub struct ProxyClients {
    /// `proxy-session`: one connection in session mode; the read sees the write it follows.
    session: Client,
    session_insert: Statement,
    session_read: Statement,
    /// `proxy-token`: writes on A, …
    writer: Client,
    writer_insert: Statement,
    /// … reads on B with A's commit position as the floor.
    reader: Client,
}

/// A read through the proxy: the value seen and whether a replica served it.
pub struct ProxyRead {
    pub seen: Option<String>,
    pub on_replica: bool,
}

impl ProxyClients {
    /// Opens the worker's three proxy connections and prepares their statements.
    pub async fn open(proxy: &BenchProxy) -> anyhow::Result<ProxyClients> {
        let session = proxy.connect("session").await?;
        let writer = proxy.connect("token").await?;
        let reader = proxy.connect("token").await?;
        Ok(ProxyClients {
            session_insert: session.prepare(INSERT).await?,
            session_read: session.prepare(READ_WHERE_SERVED).await?,
            writer_insert: writer.prepare(INSERT).await?,
            session,
            writer,
            reader,
        })
    }

    /// `proxy-session`'s write.
    pub async fn session_insert(&self, payload: &str) -> anyhow::Result<i64> {
        Ok(self
            .session
            .query_one(&self.session_insert, &[&payload])
            .await?
            .get(0))
    }

    /// `proxy-session`'s read, on the connection that wrote.
    pub async fn session_read(&self, id: i64) -> anyhow::Result<ProxyRead> {
        let row = self.session.query_opt(&self.session_read, &[&id]).await?;
        Ok(served(row))
    }

    /// `proxy-token`'s write, on connection A.
    pub async fn token_insert(&self, payload: &str) -> anyhow::Result<i64> {
        Ok(self
            .writer
            .query_one(&self.writer_insert, &[&payload])
            .await?
            .get(0))
    }

    /// `SHOW lsngate.commit_lsn` on A: the position of A's last commit, answered by the proxy.
    pub async fn commit_lsn(&self) -> anyhow::Result<Lsn> {
        let messages = self.writer.simple_query("SHOW lsngate.commit_lsn").await?;
        let text = messages
            .iter()
            .find_map(|m| match m {
                SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
                _ => None,
            })
            .unwrap_or_default();
        anyhow::ensure!(
            !text.is_empty(),
            "the proxy reported no lsngate.commit_lsn after an INSERT on the same connection"
        );
        Ok(Lsn::parse(&text)?)
    }

    /// `proxy-token`'s read on connection B, the floor in a comment: parse, bind and execute in
    /// one flight (the statement text changes with every floor, so it is not prepared).
    pub async fn token_read(&self, floor: Lsn, id: i64) -> anyhow::Result<ProxyRead> {
        let sql = format!("/* lsngate_min_lsn='{floor}' */ {READ_WHERE_SERVED}");
        let row = self
            .reader
            .query_typed_opt(&sql, &[(&id, Type::INT8)])
            .await?;
        Ok(served(row))
    }
}

fn served(row: Option<tokio_postgres::Row>) -> ProxyRead {
    match row {
        Some(row) => ProxyRead {
            seen: Some(row.get(0)),
            on_replica: row.get(1),
        },
        // A missing row is stale; only a replica can miss it.
        None => ProxyRead {
            seen: None,
            on_replica: true,
        },
    }
}
