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
//!   HTTP exchange, shared with `lsngate lag --advise --serve`), `socket` and `timer`, `notify`
//!   (systemd's readiness datagrams), `handover` (online restart's wire: control socket paths,
//!   listening sockets passed with `SCM_RIGHTS`, forwarded cancel keys), `auth` (SCRAM/MD5 for both sides of a
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
//!   database `lsngate`/`pgbouncer`), and beside them `control`, the control socket in
//!   `runtime_dir` (a takeover by a new process, cancels forwarded by it);
//! - `serve` (and this file): starting it all, and the drains (`Drain`).
//!
//! The public API is what the `lsngate` CLI, the tests and the fuzz targets use: [`Proxy`],
//! [`Drain`], [`run`], [`run_cli`], [`main`], [`runtime`], the config (`config`, [`Config`],
//! [`FileConfig`], [`ProxyArgs`]), the wire codec (`net`) and the what-if page (`whatif`). Every other module is
//! `pub(crate)`.

#![warn(missing_docs)]

pub(crate) mod admin;
pub(crate) mod auth;
pub(crate) mod backend;
pub(crate) mod causal;
pub(crate) mod clients;
pub mod config;
mod control;
pub(crate) mod frontend;
pub(crate) mod handover;
#[cfg(test)]
mod layers;
pub(crate) mod logins;
pub mod net;
pub(crate) mod notify;
pub(crate) mod proxy;
mod serve;
pub(crate) mod socket;
pub(crate) mod statement;
pub(crate) mod stats;
pub(crate) mod tally;
pub(crate) mod timer;
pub(crate) mod topology;
pub(crate) mod traffic;
pub mod whatif;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

pub use config::{Config, ConfigError, FileConfig, NodeUrl, PoolMode, ProxyArgs, TlsMode};
pub use proxy::{Drain, Proxy};

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

/// Binds (or takes the port over, with `--takeover`), serves, reloads the config on SIGHUP and
/// drains on SIGTERM/SIGINT. A reload cannot change `listen`, `threads` or `runtime_dir`.
///
/// Signals, in PgBouncer's terms: SIGTERM and SIGINT stop accepting and close each client once
/// its transaction is over (PgBouncer's SIGINT, `SHUTDOWN WAIT_FOR_SERVERS`); a takeover by a
/// new process or `SHUTDOWN WAIT_FOR_CLIENTS` stop accepting and wait for the clients to leave
/// (PgBouncer's `SHUTDOWN WAIT_FOR_CLIENTS`), and a SIGTERM/SIGINT during that wait closes them
/// as their transactions end. Every drain ends at `shutdown_timeout_ms`.
pub async fn run_cli(args: ProxyArgs, config: Config) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let port = config.listen.port();
    let taken = match (&config.runtime_dir, args.takeover) {
        (Some(dir), true) => {
            let (dir, timeout) = (dir.clone(), config.connect_timeout);
            tokio::task::spawn_blocking(move || handover::take_over(&dir, port, timeout)).await??
        }
        _ => None,
    };
    let listener = match &taken {
        Some(taken) => {
            let listener = inherit(&taken.sockets[0], config.listen)?;
            tracing::info!(listen = %config.listen, "took the listening socket over from the serving lsngate proxy");
            listener
        }
        None => {
            if args.takeover {
                tracing::info!(listen = %config.listen, "--takeover: no lsngate proxy serves this port; binding it");
            }
            TcpListener::bind(config.listen).await?
        }
    };
    let admin_socket = match (&taken, config.admin_listen) {
        (Some(taken), Some(admin)) => match taken.sockets.get(1) {
            Some(fd) => Some(inherit(fd, admin)?.into_std()?),
            None => None,
        },
        _ => None,
    };
    let control = match &config.runtime_dir {
        Some(dir) => Some(control::ControlSocket::bind(dir, port).map_err(|e| {
            anyhow::anyhow!(
                "cannot open the control socket in runtime_dir {}: {e}",
                dir.display()
            )
        })?),
        None => None,
    };
    tracing::info!(listen = %config.listen, nodes = config.nodes.len(), "lsngate proxy listening");
    let proxy = Proxy::new(config);
    if let Some(socket) = admin_socket {
        proxy.adopt_admin_listener(socket);
    }
    proxy.set_reload_source(Box::new(move || args.load()));
    let mut hangup = signal(SignalKind::hangup())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let signalled = Arc::clone(&proxy);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = hangup.recv() => if let Err(e) = signalled.reload_from_source() {
                    tracing::error!("SIGHUP: config not reloaded: {e}");
                },
                _ = terminate.recv() => { signalled.request_drain(Drain::WaitForServers); }
                _ = interrupt.recv() => { signalled.request_drain(Drain::WaitForServers); }
            };
        }
    });
    let (control_socket, control_listener) = control.unzip();
    if let Some(listener) = control_listener {
        tokio::spawn(control::serve(Arc::clone(&proxy), listener));
    }
    let ready = async {
        proxy.accepting().await;
        if let Some(taken) = taken {
            // The old process stops accepting now; connections in the queue meanwhile are ours.
            match tokio::task::spawn_blocking(move || taken.ready()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(
                    "takeover: could not tell the old process to stop accepting: {e}"
                ),
                Err(e) => tracing::warn!(
                    "takeover: could not tell the old process to stop accepting: {e}"
                ),
            }
        }
        if let Some(socket) = &control_socket
            && let Err(e) = socket.publish()
        {
            tracing::warn!(
                "control socket link not published (no --takeover will find this process): {e}"
            );
        }
        notify::tell(&format!("READY=1\nMAINPID={}", std::process::id()));
    };
    let serving = Arc::clone(&proxy).serve(listener, watch::channel(false).1);
    tokio::pin!(serving);
    tokio::select! {
        served = &mut serving => return served,
        () = ready => {}
    }
    let served = serving.await;
    drop(control_socket);
    served
}

/// A listening socket handed over by the previous process, checked against the address this
/// config listens on.
fn inherit(
    fd: &std::os::fd::OwnedFd,
    address: std::net::SocketAddr,
) -> anyhow::Result<TcpListener> {
    let socket = std::net::TcpListener::from(fd.try_clone()?);
    let local = socket.local_addr()?;
    if local != address {
        anyhow::bail!(
            "the serving lsngate proxy listens on {local} and this config on {address}: a takeover keeps the address; stop that proxy first to change it"
        );
    }
    socket.set_nonblocking(true)?;
    Ok(TcpListener::from_std(socket)?)
}
