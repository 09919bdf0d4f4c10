//! The proxy's configuration: one TOML file whose every key has a default and a doc line,
//! overridden by command-line flags. Parsing and validation only; the running proxy receives a
//! finished `Config` (and a new one on SIGHUP) instead of reading globals.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::auth::{Credential, ScramVerifier, md5_stored};

mod causal;
mod pool;

pub use causal::{CausalConfig, Consistency, Level};
pub use pool::{PoolLimits, PoolMode};

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs)] // variant fields are described by the variant docs
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// The file is not valid TOML or has unknown keys.
    #[error("invalid config file {path}: {message}")]
    Parse { path: String, message: String },
    /// A node's connection string cannot be used (syntax, unknown parameter, TLS files).
    #[error("invalid URL of {node} {url:?}: {why}")]
    Url {
        node: String,
        url: String,
        why: String,
    },
    /// No primary was configured.
    #[error(
        "no primary configured: pass --primary postgres://user@host:port/db or set `primary` in the config file"
    )]
    NoPrimary,
    /// Flags-only mode would accept anyone on a non-loopback address.
    #[error(
        "the primary URL has no password and --listen {0} is not loopback: clients would log in without a password; add [[users]] to a config file or listen on 127.0.0.1"
    )]
    OpenTrust(SocketAddr),
    /// A user entry is unusable.
    #[error("user {user:?}: {why}")]
    User { user: String, why: String },
    /// A causal-read setting is invalid.
    #[error("invalid {key}: {why}")]
    Causal { key: &'static str, why: String },
    /// The TLS certificate or key cannot be used.
    #[error(
        "TLS setup failed: {0}; tls_cert must be a PEM certificate chain and tls_key a PEM private key"
    )]
    Tls(String),
}

/// Whether clients may, must or must not use TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// SSLRequest is answered 'N' (default without a certificate).
    Disable,
    /// TLS when the client asks (default with a certificate).
    Allow,
    /// Clients that do not start TLS are refused.
    Require,
}

/// The server side of TLS, ready to accept clients.
#[derive(Clone)]
pub struct TlsSettings {
    /// Acceptor built from tls_cert / tls_key.
    pub acceptor: tokio_rustls::TlsAcceptor,
    /// Refuse clients that do not upgrade.
    pub required: bool,
}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("required", &self.required)
            .finish_non_exhaustive()
    }
}

fn tls_settings(cert: &Path, key: &Path, required: bool) -> Result<TlsSettings, ConfigError> {
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let tls = |what: &str, e: &dyn std::fmt::Display| ConfigError::Tls(format!("{what}: {e}"));
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| tls(&cert.display().to_string(), &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls(&cert.display().to_string(), &e))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| tls(&key.display().to_string(), &e))?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls("protocol versions", &e))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| tls("certificate/key pair", &e))?;
    Ok(TlsSettings {
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        required,
    })
}

/// A user clients may log in as.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserEntry {
    /// Login name.
    pub name: String,
    /// Plain password (a SCRAM verifier is derived at load time).
    #[serde(default)]
    pub password: Option<String>,
    /// Stored verifier instead of a password: `SCRAM-SHA-256$...` or `md5...` as in pg_authid.
    #[serde(default)]
    pub verifier: Option<String>,
    /// `scram-sha-256` (default), `md5` or `trust`.
    #[serde(default = "default_auth")]
    pub auth: String,
    /// The role this user's statements run as on every node, with pools of its own; default:
    /// the node URL's user, shared by every client user.
    #[serde(default)]
    pub server_user: Option<String>,
    /// `server_user`'s password; default: `password` when `server_user` is the user's own name,
    /// else none (the server trusts the proxy).
    #[serde(default)]
    pub server_password: Option<String>,
}

impl UserEntry {
    /// A user who logs in with `password` and runs as the node URL's user.
    pub fn new(name: &str, password: Option<&str>, auth: &str) -> UserEntry {
        UserEntry {
            name: name.into(),
            password: password.map(Into::into),
            verifier: None,
            auth: auth.into(),
            server_user: None,
            server_password: None,
        }
    }
}

fn default_auth() -> String {
    "scram-sha-256".into()
}

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

/// The connection parameters a node URL may carry; anything else is refused at startup.
pub const NODE_URL_PARAMETERS: &[&str] = &[
    "host",
    "port",
    "user",
    "password",
    "dbname",
    "application_name",
    "options",
    "connect_timeout",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
];

/// One node's connection string (libpq URL or key/value form), parsed by tokio-postgres with
/// libpq's TLS keys added (see `lsngate_pgconn`).
#[derive(Clone, PartialEq, Eq)]
pub struct NodeUrl {
    /// Host names or addresses with their ports, tried in order (as libpq).
    pub hosts: Vec<(String, u16)>,
    /// Backend user.
    pub user: String,
    /// Backend password, if any.
    pub password: Option<String>,
    /// Default database.
    pub database: String,
    /// `application_name` sent at startup, if the URL sets one.
    pub application_name: Option<String>,
    /// `options` sent at startup (`-c name=value ...`), if the URL sets them.
    pub options: Option<String>,
    /// `connect_timeout`: replaces `connect_timeout_ms` for this node, per host.
    pub connect_timeout: Option<Duration>,
    /// `sslmode`, `sslrootcert`, `sslcert`, `sslkey`, with the files read.
    pub tls: lsngate_pgconn::ServerTls,
}

impl std::fmt::Debug for NodeUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeUrl")
            .field("hosts", &self.hosts)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "…"))
            .field("database", &self.database)
            .field("tls", self.tls.options())
            .finish_non_exhaustive()
    }
}

impl NodeUrl {
    /// Parses `postgres://user[:password]@host[:port][,host2[:port2]...][/database][?params]`
    /// or `host=... user=... ...`, with the parameters in [`NODE_URL_PARAMETERS`].
    pub fn parse(url: &str) -> Result<NodeUrl, ConfigError> {
        Self::parse_for(url, "a node")
    }

    /// [`NodeUrl::parse`], naming the node (`the primary`, `replica 2`) in errors.
    pub fn parse_for(url: &str, node: &str) -> Result<NodeUrl, ConfigError> {
        let bad = |why: String| ConfigError::Url {
            node: node.to_string(),
            url: lsngate_pgconn::redact(url),
            why,
        };
        let parsed = lsngate_pgconn::ConnString::parse(url, NODE_URL_PARAMETERS).map_err(|e| {
            match e {
                lsngate_pgconn::ParamError::Syntax(why) => bad(format!(
                    "{why}; expected postgres://user[:password]@host[:port]/database[?sslmode=...] or host=... user=..."
                )),
                other => bad(other.to_string()),
            }
        })?;
        let hosts = parsed.tcp_hosts().map_err(|e| bad(e.to_string()))?;
        let config = &parsed.config;
        let user = config
            .get_user()
            .filter(|u| !u.is_empty())
            .ok_or_else(|| bad("no user given; write postgres://user@host/database".into()))?
            .to_string();
        let password = match config.get_password() {
            None => None,
            Some(bytes) => Some(
                String::from_utf8(bytes.to_vec())
                    .map_err(|_| bad("the password is not UTF-8 once percent-decoded".into()))?,
            ),
        };
        let tls = lsngate_pgconn::ServerTls::new(parsed.tls.clone()).map_err(|e| bad(e.0))?;
        Ok(NodeUrl {
            hosts,
            database: config.get_dbname().unwrap_or(&user).to_string(),
            user,
            password,
            application_name: config.get_application_name().map(Into::into),
            options: config.get_options().map(Into::into),
            connect_timeout: parsed.connect_timeout,
            tls,
        })
    }

    /// `host:port` (several comma-separated for a host list), for logs and status.
    pub fn address(&self) -> String {
        self.hosts
            .iter()
            .map(|(host, port)| host_port(host, *port))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// `host:port`, with brackets around an IPv6 address.
pub fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Decodes `%XX` escapes (sqlcommenter values); invalid escapes stay as written.
pub(crate) fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The finished configuration the proxy runs with.
#[derive(Debug, Clone)]
pub struct Config {
    /// Client listen address.
    pub listen: SocketAddr,
    /// Admin HTTP address.
    pub admin_listen: Option<SocketAddr>,
    /// Every node: index 0 is the configured primary, then replicas. Roles are re-detected.
    pub nodes: Vec<NodeUrl>,
    /// Pooling mode.
    pub pool_mode: PoolMode,
    /// Max backend connections per (node, database, role).
    pub pool_size: usize,
    /// Max client connections.
    pub max_client_connections: usize,
    /// Threads serving clients: 1 = one event loop on one thread, like PgBouncer.
    pub threads: usize,
    /// How long a client waits for a backend.
    pub acquire_timeout: Duration,
    /// How long opening a backend may take.
    pub connect_timeout: Duration,
    /// Interval of health/role checks.
    pub health_interval: Duration,
    /// How long an idle pooled server connection may stay unused; None = forever.
    pub server_idle_timeout: Option<Duration>,
    /// How long a server connection may stay open; None = forever.
    pub server_lifetime: Option<Duration>,
    /// Largest client message.
    pub max_message_size: usize,
    /// Replica reply bytes held back for a transparent 25006 re-run.
    pub retry_buffer_size: usize,
    /// Functions that force the primary.
    pub write_functions: Vec<String>,
    /// Who may log in, with what, and as whom they reach the servers.
    pub users: Vec<ClientUser>,
    /// Client TLS, when configured.
    pub tls: Option<TlsSettings>,
    /// Causal-read settings.
    pub causal: CausalConfig,
}

impl Config {
    /// Builds the final config from a file (already parsed) with flag overrides applied on top.
    pub fn build(file: FileConfig) -> Result<Config, ConfigError> {
        let listen = file
            .listen
            .unwrap_or_else(|| "127.0.0.1:6432".parse().expect("valid address"));
        let primary = NodeUrl::parse_for(
            file.primary.as_deref().ok_or(ConfigError::NoPrimary)?,
            "the primary",
        )?;
        let mut nodes = vec![primary.clone()];
        for (i, r) in file.replicas.iter().enumerate() {
            nodes.push(NodeUrl::parse_for(r, &format!("replica {}", i + 1))?);
        }
        let mode = file.tls_mode.unwrap_or(if file.tls_cert.is_some() {
            TlsMode::Allow
        } else {
            TlsMode::Disable
        });
        let tls = match (mode, &file.tls_cert, &file.tls_key) {
            (TlsMode::Disable, _, _) => None,
            (_, Some(cert), Some(key)) => Some(tls_settings(cert, key, mode == TlsMode::Require)?),
            _ => {
                return Err(ConfigError::Tls(format!(
                    "tls_mode {mode:?} needs both tls_cert and tls_key"
                )));
            }
        };
        let users = if file.users.is_empty() {
            flags_only_users(&primary, listen)?
        } else {
            config_users(&file.users)?
        };
        Ok(Config {
            listen,
            admin_listen: file.admin_listen,
            nodes,
            pool_mode: file.pool_mode.unwrap_or_default(),
            pool_size: file.pool_size.unwrap_or(20).max(1),
            max_client_connections: file.max_client_connections.unwrap_or(1000),
            threads: file.threads.unwrap_or(1).max(1),
            acquire_timeout: Duration::from_millis(file.acquire_timeout_ms.unwrap_or(5000)),
            connect_timeout: Duration::from_millis(file.connect_timeout_ms.unwrap_or(5000)),
            health_interval: Duration::from_millis(file.health_interval_ms.unwrap_or(1000).max(10)),
            server_idle_timeout: limit_ms(file.server_idle_timeout_ms.unwrap_or(600_000)),
            server_lifetime: limit_ms(file.server_lifetime_ms.unwrap_or(3_600_000)),
            max_message_size: file
                .max_message_size
                .unwrap_or(crate::net::DEFAULT_MAX_MESSAGE_LEN)
                .max(1024),
            retry_buffer_size: file.retry_buffer_size.unwrap_or(1 << 20),
            write_functions: file
                .write_functions
                .iter()
                .map(|f| f.to_lowercase())
                .collect(),
            users,
            tls,
            causal: causal_config(&file)?,
        })
    }

    /// Reads and parses a TOML file.
    pub fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.display().to_string(),
            message: e.to_string(),
        })
    }

    /// Size, idle timeout and lifetime of the server connection pools.
    pub fn pool_limits(&self) -> PoolLimits {
        PoolLimits {
            size: self.pool_size,
            idle_timeout: self.server_idle_timeout,
            lifetime: self.server_lifetime,
        }
    }

    /// The user with this login name, if there is one.
    pub fn user(&self, name: &str) -> Option<&ClientUser> {
        self.users.iter().find(|u| u.name == name)
    }

    /// The credential a login name must present, if the user exists.
    pub fn credential(&self, user: &str) -> Option<&Credential> {
        self.user(user).map(|u| &u.credential)
    }
}

/// A user clients may log in as.
#[derive(Debug, Clone)]
pub struct ClientUser {
    /// Login name.
    pub name: String,
    /// What the client must present.
    pub credential: Credential,
    /// The role the user's statements run as; None = each node URL's user.
    pub server_login: Option<ServerLogin>,
}

/// A role the proxy logs into servers as, instead of the node URL's user.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ServerLogin {
    /// Role name.
    pub user: String,
    /// Its password, if the server asks for one.
    pub password: Option<String>,
}

impl std::fmt::Debug for ServerLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerLogin")
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "…"))
            .finish()
    }
}

fn causal_config(file: &FileConfig) -> Result<CausalConfig, ConfigError> {
    use lsngate_core::{Fallback, TokenCodec, WhenGuarded};
    let bad = |key: &'static str, why: String| ConfigError::Causal { key, why };
    let defaults = CausalConfig::default();
    let consistency = match &file.consistency {
        Some(text) => Consistency::parse(text).map_err(|e| bad("consistency", e))?,
        None => defaults.consistency,
    };
    let fallback = match file
        .fallback
        .as_deref()
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None | Some("primary") => Fallback::Primary,
        Some("error") => Fallback::Error,
        Some("stale") => Fallback::Stale,
        Some(other) => {
            return Err(bad(
                "fallback",
                format!("{other:?}; use primary, error or stale"),
            ));
        }
    };
    let when_guarded = match file
        .when_guarded
        .as_deref()
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None | Some("wait") => WhenGuarded::Wait,
        Some("fail") => WhenGuarded::FailFast,
        Some(other) => return Err(bad("when_guarded", format!("{other:?}; use wait or fail"))),
    };
    let ratio = file
        .breaker_ratio
        .unwrap_or(defaults.guard.max_fallback_ratio);
    if !(0.0..=1.0).contains(&ratio) {
        return Err(bad(
            "breaker_ratio",
            format!("{ratio} is not between 0 and 1"),
        ));
    }
    let guard = lsngate_core::GuardConfig {
        max_concurrent: file
            .fallback_cap
            .unwrap_or(defaults.guard.max_concurrent)
            .max(1),
        window: file
            .breaker_window_ms
            .map(Duration::from_millis)
            .unwrap_or(defaults.guard.window),
        min_reads: file.breaker_min_reads.unwrap_or(defaults.guard.min_reads),
        max_fallback_ratio: ratio,
        open_for: file
            .breaker_open_ms
            .map(Duration::from_millis)
            .unwrap_or(defaults.guard.open_for),
    };
    let (tokens, signed) = match (
        &file.token_secret,
        file.require_signed_tokens.unwrap_or(false),
    ) {
        (Some(secret), require) if !secret.is_empty() => {
            let mut codec =
                TokenCodec::signed(secret.as_bytes().to_vec()).accept_unsigned(!require);
            if let Some(ttl) = file.token_ttl_s {
                codec = codec.with_ttl(Duration::from_secs(ttl));
            }
            (codec, true)
        }
        (_, true) => {
            return Err(bad(
                "require_signed_tokens",
                "needs token_secret (the HTTP helpers' HMAC key)".into(),
            ));
        }
        _ => (TokenCodec::unsigned(), false),
    };
    Ok(CausalConfig {
        consistency,
        wait_timeout: file
            .wait_timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(defaults.wait_timeout),
        fallback,
        guard,
        when_guarded,
        tokens,
        signed,
        replay_poll: Duration::from_millis(file.replay_poll_ms.unwrap_or(20).max(1)),
        lag_bound: lsngate_core::LagBound {
            max_bytes: file.max_replica_lag_bytes,
            max_lag: file.max_replica_lag_ms.map(Duration::from_millis),
        },
    })
}

/// A time limit in milliseconds where 0 means none.
fn limit_ms(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

fn flags_only_users(primary: &NodeUrl, listen: SocketAddr) -> Result<Vec<ClientUser>, ConfigError> {
    let credential = match &primary.password {
        Some(password) => Credential::Scram(ScramVerifier::from_password(password, 4096)),
        None if listen.ip().is_loopback() => Credential::Trust,
        None => return Err(ConfigError::OpenTrust(listen)),
    };
    Ok(vec![ClientUser {
        name: primary.user.clone(),
        credential,
        server_login: None,
    }])
}

fn config_users(entries: &[UserEntry]) -> Result<Vec<ClientUser>, ConfigError> {
    let mut users: Vec<ClientUser> = Vec::with_capacity(entries.len());
    for u in entries {
        if users.iter().any(|seen| seen.name == u.name) {
            return Err(ConfigError::User {
                user: u.name.clone(),
                why: "listed twice under [[users]]; keep one entry".into(),
            });
        }
        users.push(ClientUser {
            name: u.name.clone(),
            credential: user_credential(u)?,
            server_login: server_login(u)?,
        });
    }
    Ok(users)
}

fn server_login(u: &UserEntry) -> Result<Option<ServerLogin>, ConfigError> {
    match (&u.server_user, &u.server_password) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(ConfigError::User {
            user: u.name.clone(),
            why: "server_password without server_user; name the role it belongs to".into(),
        }),
        (Some(role), _) if role.is_empty() || role.contains('\0') => Err(ConfigError::User {
            user: u.name.clone(),
            why: format!("server_user {role:?} is not a role name"),
        }),
        (Some(role), password) => Ok(Some(ServerLogin {
            user: role.clone(),
            password: password
                .clone()
                .or_else(|| (*role == u.name).then(|| u.password.clone()).flatten()),
        })),
    }
}

fn user_credential(u: &UserEntry) -> Result<Credential, ConfigError> {
    let err = |why: &str| ConfigError::User {
        user: u.name.clone(),
        why: why.to_string(),
    };
    match (u.auth.as_str(), &u.password, &u.verifier) {
        ("trust", _, _) => Ok(Credential::Trust),
        ("scram-sha-256", Some(p), None) => {
            Ok(Credential::Scram(ScramVerifier::from_password(p, 4096)))
        }
        ("scram-sha-256", None, Some(v)) => ScramVerifier::parse(&u.name, v)
            .map(Credential::Scram)
            .map_err(|e| err(&e.to_string())),
        ("md5", Some(p), None) => Ok(Credential::Md5 {
            hash: md5_stored(&u.name, p),
        }),
        ("md5", None, Some(v)) if v.starts_with("md5") && v.len() == 35 => {
            Ok(Credential::Md5 { hash: v.clone() })
        }
        ("scram-sha-256" | "md5", _, _) => Err(err(
            "set exactly one of `password` or a matching `verifier`",
        )),
        (other, _, _) => Err(err(&format!(
            "unknown auth {other:?}; use scram-sha-256, md5 or trust"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_defaults() {
        let u = NodeUrl::parse("postgres://app:p%40ss@db1:5433/shop").unwrap();
        assert_eq!(
            (u.address(), u.user.as_str(), u.database.as_str()),
            ("db1:5433".to_string(), "app", "shop")
        );
        assert_eq!(u.password.as_deref(), Some("p@ss"));
        assert_eq!(
            u.tls.mode(),
            lsngate_pgconn::SslMode::Prefer,
            "libpq's default"
        );
        let u = NodeUrl::parse("postgresql://postgres@127.0.0.1").unwrap();
        assert_eq!(
            (u.hosts[0].1, u.database.as_str(), u.password),
            (5432, "postgres", None)
        );
        assert!(NodeUrl::parse("mysql://x@y").is_err());
        assert!(NodeUrl::parse("postgres://host-only").is_err());
    }

    #[test]
    fn url_parameters_are_read_or_refused_by_name() {
        let u = NodeUrl::parse(
            "postgres://app:pw@db1:5433,[::1]:5434/shop?sslmode=require&application_name=web&options=-c%20search_path%3Ds&connect_timeout=3",
        )
        .unwrap();
        assert_eq!(u.address(), "db1:5433,[::1]:5434");
        assert_eq!(u.tls.mode(), lsngate_pgconn::SslMode::Require);
        assert_eq!(u.application_name.as_deref(), Some("web"));
        assert_eq!(u.options.as_deref(), Some("-c search_path=s"));
        assert_eq!(u.connect_timeout, Some(Duration::from_secs(3)));
        let u =
            NodeUrl::parse("host=db1 port=5433 user=app password='a b' sslmode=disable").unwrap();
        assert_eq!(
            (u.address(), u.password.as_deref()),
            ("db1:5433".into(), Some("a b"))
        );
        let file = FileConfig {
            primary: Some("postgres://app:secret@db/x".into()),
            replicas: vec![
                "postgres://app:secret@db2/x".into(),
                "postgres://app:secret@db3/x?sslmdoe=require".into(),
            ],
            ..Default::default()
        };
        let error = Config::build(file).unwrap_err().to_string();
        assert!(
            error.starts_with("invalid URL of replica 2 ")
                && error.contains("unknown parameter \"sslmdoe\"; supported: host, port")
                && !error.contains("secret"),
            "{error}"
        );
        for (url, expected) in [
            (
                "postgres://app:secret@db/x?sslmode=verify-full",
                "needs sslrootcert",
            ),
            (
                "postgres://app:secret@db/x?sslmode=verify-ca&sslrootcert=/nonexistent.pem",
                "sslrootcert=/nonexistent.pem",
            ),
            (
                "postgres://app:secret@db/x?sslmode=sometimes",
                "sslmode=\"sometimes\"",
            ),
            (
                "postgres://app:secret@db/x?keepalives=1",
                "unknown parameter \"keepalives\"",
            ),
            (
                "postgres://app:secret@db/x?hostaddr=10.0.0.1",
                "unknown parameter \"hostaddr\"",
            ),
            (
                "host=/run/postgresql user=app password=secret",
                "Unix-domain",
            ),
            ("postgres://app:secret@db:five/x", "port"),
        ] {
            let error = NodeUrl::parse_for(url, "the primary")
                .unwrap_err()
                .to_string();
            assert!(
                error.contains(expected) && !error.contains("secret"),
                "{url}: {error}"
            );
        }
        assert!(
            !format!("{:?}", NodeUrl::parse("postgres://a:secret@h/d").unwrap()).contains("secret")
        );
    }

    #[test]
    fn flags_only_mode_is_trust_on_loopback_only() {
        let file = FileConfig {
            primary: Some("postgres://postgres@127.0.0.1:5432/postgres".into()),
            ..Default::default()
        };
        let config = Config::build(file.clone()).unwrap();
        assert_eq!(config.credential("postgres"), Some(&Credential::Trust));
        let open = FileConfig {
            listen: Some("0.0.0.0:6432".parse().unwrap()),
            ..file
        };
        assert!(matches!(
            Config::build(open),
            Err(ConfigError::OpenTrust(_))
        ));
    }

    #[test]
    fn toml_file_parses_and_rejects_unknown_keys() {
        let text = r#"
            listen = "127.0.0.1:7000"
            primary = "postgres://postgres@127.0.0.1:5432/postgres"
            replicas = ["postgres://postgres@127.0.0.1:5433/postgres"]
            pool_mode = "session"
            write_functions = ["Audit_Log"]
            [[users]]
            name = "app"
            password = "secret"
            auth = "md5"
        "#;
        let config = Config::build(toml::from_str(text).unwrap()).unwrap();
        assert_eq!(config.nodes.len(), 2);
        assert_eq!(config.pool_mode, PoolMode::Session);
        assert_eq!(config.write_functions, vec!["audit_log"]);
        assert!(matches!(
            config.credential("app"),
            Some(Credential::Md5 { .. })
        ));
        assert!(toml::from_str::<FileConfig>("bogus_key = 1").is_err());
    }

    #[test]
    fn server_connection_limits_default_and_zero_means_never() {
        let primary = "postgres://postgres@127.0.0.1:5432/postgres";
        let file = FileConfig {
            primary: Some(primary.into()),
            ..Default::default()
        };
        let limits = Config::build(file).unwrap().pool_limits();
        assert_eq!(limits.size, 20);
        assert_eq!(limits.idle_timeout, Some(Duration::from_secs(600)));
        assert_eq!(limits.lifetime, Some(Duration::from_secs(3600)));
        let text =
            format!("primary = {primary:?}\nserver_idle_timeout_ms = 0\nserver_lifetime_ms = 1500");
        let limits = Config::build(toml::from_str(&text).unwrap())
            .unwrap()
            .pool_limits();
        assert_eq!(limits.idle_timeout, None);
        assert_eq!(limits.lifetime, Some(Duration::from_millis(1500)));
    }

    fn users(entries: &str) -> Result<Config, ConfigError> {
        let text = format!("primary = \"postgres://app:pw@db:5432/app\"\n{entries}");
        Config::build(toml::from_str(&text).unwrap())
    }

    #[test]
    fn server_logins_default_to_the_node_url_and_to_the_users_own_password() {
        let config = users(
            r#"
            [[users]]
            name = "app"
            password = "a"
            [[users]]
            name = "reporting"
            password = "r"
            server_user = "reporting"
            [[users]]
            name = "etl"
            password = "e"
            server_user = "loader"
            [[users]]
            name = "ops"
            verifier = "md5aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
            auth = "md5"
            server_user = "loader"
            server_password = "l"
        "#,
        )
        .unwrap();
        let login = |name: &str| config.user(name).unwrap().server_login.clone();
        let role = |user: &str, password: Option<&str>| {
            Some(ServerLogin {
                user: user.into(),
                password: password.map(Into::into),
            })
        };
        assert_eq!(login("app"), None, "the node URL's user");
        assert_eq!(login("reporting"), role("reporting", Some("r")));
        assert_eq!(
            login("etl"),
            role("loader", None),
            "another role's password is not guessed"
        );
        assert_eq!(login("ops"), role("loader", Some("l")));
        assert!(
            !format!("{:?}", login("ops")).contains("\"l\""),
            "Debug hides the password"
        );
    }

    #[test]
    fn bad_server_logins_and_duplicate_users_are_refused() {
        let error = users("[[users]]\nname = \"a\"\npassword = \"x\"\nserver_password = \"y\"")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("server_password without server_user"),
            "{error}"
        );
        let error = users("[[users]]\nname = \"a\"\npassword = \"x\"\nserver_user = \"\"")
            .unwrap_err()
            .to_string();
        assert!(error.contains("is not a role name"), "{error}");
        let error = users(
            "[[users]]\nname = \"a\"\npassword = \"x\"\n[[users]]\nname = \"a\"\npassword = \"y\"",
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("listed twice"), "{error}");
    }
}
