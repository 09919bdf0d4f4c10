//! The TOML file as a person writes it: every key optional, unknown keys refused. What a key
//! means once it is set or left out is decided where the finished `Config` is built (`mod.rs`).

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use super::{PoolMode, TlsMode, UserEntry};

/// The TOML file as written by a person: every field optional.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Address clients connect to. Default 127.0.0.1:6432.
    pub listen: Option<SocketAddr>,
    /// Admin HTTP address (/metrics, /status). Default: off.
    pub admin_listen: Option<SocketAddr>,
    /// libpq URL of the primary (backend credentials included).
    pub primary: Option<String>,
    /// libpq URLs of the replicas.
    #[serde(default)]
    pub replicas: Vec<String>,
    /// transaction (default) or session.
    pub pool_mode: Option<PoolMode>,
    /// Max backend connections per (node, database, role). Default 20.
    pub pool_size: Option<usize>,
    /// Max client connections. Default 1000.
    pub max_client_connections: Option<usize>,
    /// Threads serving clients (`lsngate proxy` only). Default 1.
    pub threads: Option<usize>,
    /// Milliseconds a client waits for a free backend. Default 5000.
    pub acquire_timeout_ms: Option<u64>,
    /// Milliseconds to open a backend connection. Default 5000.
    pub connect_timeout_ms: Option<u64>,
    /// Milliseconds between health/role checks of every node. Default 1000.
    pub health_interval_ms: Option<u64>,
    /// Milliseconds an idle pooled server connection may stay unused before it is closed.
    /// Default 600000 (10 min); 0 = never.
    pub server_idle_timeout_ms: Option<u64>,
    /// Milliseconds a server connection may stay open; older ones are closed when they return
    /// to the pool. Default 3600000 (1 h); 0 = never.
    pub server_lifetime_ms: Option<u64>,
    /// Largest message accepted from a client, bytes. Default 67108864 (64 MiB).
    pub max_message_size: Option<usize>,
    /// Bytes of a replica reply held back so a 25006 error can be re-run on the primary. Default 1048576.
    pub retry_buffer_size: Option<usize>,
    /// Functions (lower case, no schema) whose presence sends a statement to the primary.
    #[serde(default)]
    pub write_functions: Vec<String>,
    /// PEM certificate chain for client TLS. Default: none (TLS off).
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for tls_cert.
    pub tls_key: Option<PathBuf>,
    /// disable, allow (default when tls_cert is set) or require.
    pub tls_mode: Option<TlsMode>,
    /// Users clients may log in as. Without any, clients log in as the primary URL's user.
    #[serde(default)]
    pub users: Vec<UserEntry>,
    /// Causal reads: session (default), token, global, universal, fast, fast_token, fast_global,
    /// fast_universal or eventual (plain read/write split). Clients override it per session.
    pub consistency: Option<String>,
    /// Milliseconds a read may wait on a replica for its floor before the fallback. Default 500.
    pub wait_timeout_ms: Option<u64>,
    /// When the budget is spent: primary (default), error (SQLSTATE LG001) or stale.
    pub fallback: Option<String>,
    /// Most fallback reads running on the primary at once. Default 32.
    pub fallback_cap: Option<usize>,
    /// Fallback share (0–1) over the breaker window above which the breaker opens. Default 0.5.
    pub breaker_ratio: Option<f64>,
    /// Fewest reads in the breaker window before it may open. Default 50.
    pub breaker_min_reads: Option<u32>,
    /// Milliseconds of one breaker rate window (the rate spans two). Default 10000.
    pub breaker_window_ms: Option<u64>,
    /// Milliseconds the breaker stays open. Default 5000.
    pub breaker_open_ms: Option<u64>,
    /// A fallback the guard refuses: wait (default; queue up to wait_timeout_ms) or fail
    /// (SQLSTATE LG002 at once).
    pub when_guarded: Option<String>,
    /// HMAC key of the HTTP helpers' signed tokens: `SET lsngate.min_lsn` then accepts them and
    /// the proxy reports `lsngate.commit_token`. Default: none (plain LSNs only).
    pub token_secret: Option<String>,
    /// With token_secret: refuse plain `X/Y` floors, accept only signed tokens. Default false.
    pub require_signed_tokens: Option<bool>,
    /// Seconds a signed token issued by the proxy stays valid. Default: no expiry.
    pub token_ttl_s: Option<u64>,
    /// Milliseconds between position polls of every node (also role and health) while reads use
    /// positions (health_interval_ms otherwise). Default 20.
    pub replay_poll_ms: Option<u64>,
    /// Reads without a floor skip replicas lagging more than this many ms. Default: no bound.
    pub max_replica_lag_ms: Option<u64>,
    /// Reads without a floor skip replicas more than this many bytes behind. Default: no bound.
    pub max_replica_lag_bytes: Option<u64>,
}
