//! The lsngate proxy started in-process on 127.0.0.1:0 in front of a cluster's primary and
//! replica URLs (a local cluster or an existing one alike), for `lsngate bench`'s proxy
//! strategies and `lsngate verify`: its config, client connections in a chosen consistency mode,
//! the proxy's own count of how its causal reads ended, and a bounded shutdown. Not the
//! `lsngate proxy` command (that is `lsngate_proxy::main`, a process of its own).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use lsngate_proxy::{Config, FileConfig, Proxy};
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, NoTls};

/// How long the proxy may take to drain when its clients are done.
const DRAIN_LIMIT: Duration = Duration::from_secs(40);

/// How the in-process proxy's primary guard (`fallback_cap`, the breaker) is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// Fallbacks are measured, never refused: a cap of one per client and a breaker that never
    /// opens (the benchmark, like its library gate; verify's waiting modes).
    Open,
    /// The proxy's defaults, as a deployment runs it: verify's `fast` mode, whose reads the
    /// guard refuses the primary into a wait on a replica.
    Defaults,
}

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
        guard: Guard,
    ) -> anyhow::Result<ProxySetup> {
        let open = guard == Guard::Open;
        let file = FileConfig {
            // Loopback: clients log in as the primary URL's user (trust without a password).
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            primary: Some(primary_url.to_string()),
            replicas: replica_urls.to_vec(),
            // Every worker's proxy connections may hold a server connection at once.
            pool_size: Some(workers * 2 + 2),
            wait_timeout_ms: Some(budget.as_millis().max(1) as u64),
            fallback_cap: open.then_some(workers.max(1)),
            breaker_ratio: open.then_some(1.0),
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

/// The proxy as bench and verify run it: the benchmark starts one per proxy strategy and shuts it
/// down after it, so its background polling of the nodes does not weigh on the other strategies'
/// numbers; verify starts one for its whole run.
pub struct InProcessProxy {
    proxy: Arc<Proxy>,
    /// Where clients connect: the primary URL's user, password and database, the proxy's address.
    client: tokio_postgres::Config,
    stop: watch::Sender<bool>,
    serving: JoinHandle<anyhow::Result<()>>,
}

impl InProcessProxy {
    /// Starts a fresh proxy (its outcome counters at zero) on 127.0.0.1:0.
    pub async fn start(setup: &ProxySetup) -> anyhow::Result<InProcessProxy> {
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
        Ok(InProcessProxy {
            proxy,
            client,
            stop,
            serving,
        })
    }

    /// One client connection with `lsngate.consistency` set to `consistency` at login (see
    /// [`connect`]).
    pub async fn connect(&self, consistency: &str) -> anyhow::Result<Client> {
        connect(&self.client, consistency).await
    }

    /// Where clients log in: the primary URL's user, password and database, the proxy's address.
    pub fn client_config(&self) -> &tokio_postgres::Config {
        &self.client
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

    /// Fallback reads the proxy's primary guard refused a slot, and of those the reads a replica
    /// seen to have their floor took while they queued (`/status` `breaker.refused_reads`,
    /// `breaker.rescued_reads`).
    pub fn guard_counts(&self) -> (u64, u64) {
        let stats = &self.proxy.causal.stats;
        (stats.refused.count(), stats.rescued.count())
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

/// One client connection to a proxy (this process's or any lsngate proxy) with
/// `lsngate.consistency` set to `consistency` at login. Its writes commit with
/// `synchronous_commit = local` (the proxy applies startup settings on each server connection it
/// uses), so a synchronous standby, if any, does not hide replication lag.
pub async fn connect(config: &tokio_postgres::Config, consistency: &str) -> anyhow::Result<Client> {
    let mut config = config.clone();
    config.options(format!(
        "-c lsngate.consistency={consistency} -c synchronous_commit=local"
    ));
    let (client, connection) = tokio::time::timeout(Duration::from_secs(10), config.connect(NoTls))
        .await
        .context("connecting to the proxy: no answer within 10s")?
        .context("connecting to the proxy")?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("proxy connection closed: {e}");
        }
    });
    Ok(client)
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

impl ProxyOutcomes {
    /// Adds another run's counts (the bench's rounds, each with a fresh proxy).
    pub fn add(&mut self, other: ProxyOutcomes) {
        self.replica += other.replica;
        self.waited += other.waited;
        self.fallback += other.fallback;
        self.no_replica += other.no_replica;
        self.stale += other.stale;
        self.error += other.error;
    }
}
