//! `lsngate proxy`: a PostgreSQL wire-protocol proxy that pools backend connections and splits
//! reads from writes across a primary and its streaming replicas. This crate is the proxy as a
//! library — `run(config, listener, shutdown)` serves clients in-process (tests use
//! 127.0.0.1:0) and `run_cli` is what the `lsngate proxy` command calls. Read-your-writes
//! (causal reads) rides in the same backend flights as the client's statements (`causal/`).
//!
//! Layers, bottom to top; a module imports only from its own layer or below (`layers.rs` is
//! the test that keeps it so):
//! - leaves: `net/` the pure message codec (with `TxStatus` and `sqlstate`), `runtime`, `tally`
//!   (counters for /metrics), `traffic` (queries and bytes per database for SHOW STATS), `whatif` (the budget what-if page, its document and the one-request
//!   HTTP exchange, shared with `lsngate lag --advise --serve`), `socket` and `timer`, `auth` (SCRAM/MD5 for both sides of a
//!   login), `config/` (the TOML file and the flags, every default in `config/defaults.rs`);
//! - `statement/`: what a statement's text tells — class, proxy commands, route hints, cache;
//! - `backend/`: server connections, pools, the health/role monitor, timelines, and what each
//!   server replayed (`backend::replay`, fed to `lsngate_core`'s replay book);
//! - `causal/`: what sessions share for causal reads — guard, statistics, commit floors, the
//!   probe statements as frames;
//! - `proxy`: `Proxy`, the state every session shares, and `clients`, the clients connected now
//!   (for the admin console), and `topology/`, which follows Patroni (or the primary's
//!   `pg_stat_replication`) into its node set;
//! - `frontend/`: one client — handshake, session loop, the routing `plan`, flights, replies;
//! - `admin/`: the HTTP port (/metrics, /status, /dashboard, /budget, /history) and the admin console (the virtual
//!   database `lsngate`/`pgbouncer`);
//! - `serve` (and this file): starting it all.
//!
//! The public API is what the `lsngate` CLI, the tests and the fuzz targets use: [`Proxy`],
//! [`run`], [`run_cli`], [`main`], [`runtime`], the config (`config`, [`Config`],
//! [`FileConfig`], [`ProxyArgs`]), the wire codec (`net`) and the what-if page (`whatif`). Every other module is
//! `pub(crate)`.

#![warn(missing_docs)]

pub(crate) mod admin;
pub(crate) mod auth;
pub(crate) mod backend;
pub(crate) mod causal;
pub(crate) mod clients;
pub mod config;
pub(crate) mod frontend;
#[cfg(test)]
mod layers;
pub(crate) mod logins;
pub mod net;
pub(crate) mod proxy;
mod serve;
pub(crate) mod socket;
pub(crate) mod statement;
pub(crate) mod tally;
pub(crate) mod timer;
pub(crate) mod topology;
pub(crate) mod traffic;
pub mod whatif;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

pub use config::{Config, ConfigError, FileConfig, NodeUrl, PoolMode, ProxyArgs, TlsMode};
pub use proxy::Proxy;

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
    proxy.set_reload_source(Box::new(move || args.load()));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut hangup = signal(SignalKind::hangup())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let reloader = Arc::clone(&proxy);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = hangup.recv() => if let Err(e) = reloader.reload_from_source() {
                    tracing::error!("SIGHUP: config not reloaded: {e}");
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
