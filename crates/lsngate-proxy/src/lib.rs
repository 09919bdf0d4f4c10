//! `lsngate proxy`: a PostgreSQL wire-protocol proxy that pools backend connections and splits
//! reads from writes across a primary and its streaming replicas. This crate is the proxy as a
//! library — `run(config, listener, shutdown)` serves clients in-process (tests use
//! 127.0.0.1:0) and `run_cli` is what the `lsngate proxy` command calls. Read-your-writes
//! (causal reads) rides in the same backend flights as the client's statements (`causal/`).
//!
//! Layout: `net/` the pure message codec, `statement/` what a statement's text tells (its class,
//! the proxy's own commands, route hints, the classification cache; pure), `frontend/` client
//! sessions, auth and routing, `backend/` server connections, pools and the health/role monitor,
//! `causal/` floors, waits and the replay-position watcher, `admin/` HTTP metrics and status,
//! `config` the TOML file and flags, `socket` plain TCP reads and writes on tokio's readiness,
//! `timer` the timer thread.

#![warn(missing_docs)]

pub mod admin;
pub mod backend;
pub mod causal;
pub mod config;
pub mod frontend;
pub mod net;
pub mod socket;
pub(crate) mod statement;
pub mod timer;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

pub use config::{Config, ConfigError, FileConfig, NodeUrl, PoolMode, TlsMode};
pub use frontend::Proxy;

/// Options of `lsngate proxy`. Flags override the config file; the file overrides defaults.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ProxyArgs {
    /// Address clients connect to [default: 127.0.0.1:6432].
    #[arg(long, env = "LSNGATE_PROXY_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// libpq URL of the primary, with the credentials the proxy uses towards it,
    /// e.g. postgres://app:secret@10.0.0.1:5432/app.
    #[arg(long, env = "LSNGATE_PROXY_PRIMARY")]
    pub primary: Option<String>,
    /// libpq URL of a replica (repeat the flag for several).
    #[arg(long = "replica")]
    pub replicas: Vec<String>,
    /// TOML config file (see the README for every key); re-read on SIGHUP.
    #[arg(long, env = "LSNGATE_PROXY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Admin HTTP address serving /metrics (Prometheus) and /status (JSON) [default: off].
    #[arg(long)]
    pub admin_listen: Option<SocketAddr>,
    /// Pooling mode [default: transaction].
    #[arg(long, value_enum)]
    pub pool_mode: Option<PoolMode>,
    /// Max backend connections per (node, database, role) [default: 20].
    #[arg(long)]
    pub pool_size: Option<usize>,
    /// Max client connections [default: 1000].
    #[arg(long)]
    pub max_client_connections: Option<usize>,
    /// Threads serving clients; 1 runs one event loop on one thread, like PgBouncer, which is
    /// the cheapest per statement [default: 1].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Milliseconds a client waits for a free backend connection [default: 5000].
    #[arg(long)]
    pub acquire_timeout_ms: Option<u64>,
    /// Milliseconds allowed to open a backend connection [default: 5000].
    #[arg(long)]
    pub connect_timeout_ms: Option<u64>,
    /// Milliseconds between health and role checks of each node [default: 1000].
    #[arg(long)]
    pub health_interval_ms: Option<u64>,
    /// Milliseconds an idle pooled server connection may stay unused before it is closed;
    /// 0 = never [default: 600000].
    #[arg(long)]
    pub server_idle_timeout_ms: Option<u64>,
    /// Milliseconds a server connection may stay open; older ones are closed when they return to
    /// the pool; 0 = never [default: 3600000].
    #[arg(long)]
    pub server_lifetime_ms: Option<u64>,
    /// Largest message accepted from a client, in bytes [default: 67108864].
    #[arg(long)]
    pub max_message_size: Option<usize>,
    /// PEM certificate chain offered to clients that ask for TLS [default: none].
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// Client TLS policy [default: allow with a certificate, disable without].
    #[arg(long, value_enum)]
    pub tls_mode: Option<TlsMode>,
    /// Causal-read mode of new clients: session, token, global, universal, fast, fast_token,
    /// fast_global, fast_universal or eventual [default: session].
    #[arg(long)]
    pub consistency: Option<String>,
    /// Milliseconds a read may wait on a replica for its floor [default: 500].
    #[arg(long)]
    pub wait_timeout_ms: Option<u64>,
    /// When the wait budget is spent: primary, error or stale [default: primary].
    #[arg(long)]
    pub fallback: Option<String>,
}

impl ProxyArgs {
    /// The config file (if any) with these flags applied on top, validated.
    pub fn load(&self) -> Result<Config, ConfigError> {
        let mut file = match &self.config {
            Some(path) => Config::read_file(path)?,
            None => FileConfig::default(),
        };
        macro_rules! over {
            ($($field:ident),*) => { $( if self.$field.is_some() { file.$field = self.$field.clone(); } )* };
        }
        over!(
            listen,
            primary,
            admin_listen,
            pool_mode,
            pool_size,
            max_client_connections,
            threads
        );
        over!(
            acquire_timeout_ms,
            connect_timeout_ms,
            health_interval_ms,
            max_message_size,
            consistency,
            wait_timeout_ms,
            fallback
        );
        over!(tls_cert, tls_key, tls_mode);
        over!(server_idle_timeout_ms, server_lifetime_ms);
        if !self.replicas.is_empty() {
            file.replicas = self.replicas.clone();
        }
        Config::build(file)
    }
}

/// Runs the proxy on an already bound listener until `shutdown` turns true, then drains: stops
/// accepting, lets open transactions finish, and returns.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let proxy = Proxy::new(config);
    proxy.serve(listener, shutdown).await
}

/// The runtime `lsngate proxy` runs on: one thread (tokio's current-thread scheduler, no
/// cross-thread wake-ups) or `threads` worker threads.
pub fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    runtime_builder(threads).build()
}

/// The builder of [`runtime`], for callers that add to it (thread names). I/O and signals only:
/// the proxy's timers run on their own thread (see [`timer`]), so parking, about once per
/// statement, does not also tend a timer wheel.
pub fn runtime_builder(threads: usize) -> tokio::runtime::Builder {
    let mut builder = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(threads);
        builder
    };
    builder.enable_io();
    builder
}

/// `lsngate proxy`: loads the config, then serves on a runtime with the configured threads
/// (see [`run_cli`]).
pub fn main(args: ProxyArgs) -> anyhow::Result<()> {
    let config = args.load()?;
    runtime(config.threads)?.block_on(run_cli(args, config))
}

/// Binds, serves, reloads the config on SIGHUP and drains on SIGTERM/Ctrl-C. A reload cannot
/// change `listen` or `threads`.
pub async fn run_cli(args: ProxyArgs, config: Config) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let listener = TcpListener::bind(config.listen).await?;
    tracing::info!(listen = %config.listen, nodes = config.nodes.len(), "lsngate proxy listening");
    let proxy = Proxy::new(config);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut hangup = signal(SignalKind::hangup())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let reloader = Arc::clone(&proxy);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = hangup.recv() => match args.load() {
                    Ok(config) => reloader.reload(config),
                    Err(e) => tracing::error!("SIGHUP: config not reloaded: {e}"),
                },
                _ = terminate.recv() => break,
                _ = tokio::signal::ctrl_c() => break,
            }
        }
        tracing::info!("draining: no new clients, waiting for open transactions");
        let _ = stop_tx.send(true);
    });
    proxy.serve(listener, stop_rx).await
}
