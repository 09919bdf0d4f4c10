//! The proxy's configuration: one TOML file whose every key has a default and a doc line,
//! overridden by command-line flags. Parsing and validation only; the running proxy receives a
//! finished `Config` (and a new one on SIGHUP) instead of reading globals.
//!
//! A leaf: it imports `auth` (verifiers) and `net` (the message-size default) and nothing else of
//! the crate, so every layer may read its settings. This file holds the finished [`Config`] and
//! how a [`FileConfig`] and the flags of [`ProxyArgs`] become it; each idea it draws on has a file of its own — the keys as
//! written (`file`), node URLs (`node_url`), users and server logins (`users`), client TLS
//! (`tls`), pooling (`pool`) and causal reads (`causal`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::auth::Credential;

mod auth_file;
mod auth_query;
mod causal;
mod console;
pub mod defaults;
mod file;
mod hba;
mod node_url;
mod pool;
mod tls;
mod topology;
mod users;

pub use auth_query::{AuthQuery, AuthServerLogin};
pub use causal::{CausalConfig, Consistency, Level};
pub use console::{CONSOLE_DATABASES, ConsoleAccess, is_console_database};
pub use file::FileConfig;
pub use hba::{Hba, HbaLogin, HbaMethod};
pub(crate) use node_url::percent_decode;
pub use node_url::{NODE_URL_PARAMETERS, NodeUrl, host_port};
pub use pool::{PoolLimits, PoolMode};
pub use tls::{TlsMode, TlsSettings};
pub use topology::{DnsConfig, PatroniUrl, TopologyConfig, TopologySource};
pub use users::{ClientUser, ServerLogin, UserEntry};

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
    /// The auth_query settings cannot work.
    #[error("auth_query: {0}")]
    AuthQuery(String),
    /// The auth_hba_file cannot be used.
    #[error("auth_hba_file {path}: {why}")]
    HbaFile { path: String, why: String },
    /// The auth file cannot be used.
    #[error("auth_file {path}: {why}")]
    AuthFile { path: String, why: String },
    /// A user entry is unusable.
    #[error("user {user:?}: {why}")]
    User { user: String, why: String },
    /// A causal-read setting is invalid.
    #[error("invalid {key}: {why}")]
    Causal { key: &'static str, why: String },
    /// Another setting is out of its range.
    #[error("invalid {key}: {why}")]
    Setting { key: &'static str, why: String },
    /// The topology keys are unusable.
    #[error("invalid topology settings: {0}")]
    Topology(String),
    /// --takeover without a runtime_dir to find the serving proxy in.
    #[error(
        "--takeover needs runtime_dir (--runtime-dir DIR): the directory where the serving proxy keeps its control socket"
    )]
    Takeover,
    /// The TLS certificate or key cannot be used.
    #[error(
        "TLS setup failed: {0}; tls_cert must be a PEM certificate chain and tls_key a PEM private key"
    )]
    Tls(String),
}

/// Options of `lsngate proxy`. Flags override the config file; the file overrides defaults. The
/// flags are the file's keys ([`FileConfig`] is also their `clap::Args`), declared once.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ProxyArgs {
    /// TOML config file (see the README for every key); re-read on SIGHUP.
    #[arg(long, env = "LSNGATE_PROXY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Take the listening sockets over from the proxy serving this port (found through
    /// runtime_dir), which then stops accepting and exits once its clients have left; without
    /// one, bind the port as usual.
    #[arg(long)]
    pub takeover: bool,
    /// The keys given as flags.
    #[command(flatten)]
    pub flags: FileConfig,
}

impl ProxyArgs {
    /// The config file (if any) with these flags applied on top, validated.
    pub fn load(&self) -> Result<Config, ConfigError> {
        let file = match &self.config {
            Some(path) => Config::read_file(path)?,
            None => FileConfig::default(),
        };
        let config = Config::build(file.overlay(self.flags.clone()))?;
        if self.takeover && config.runtime_dir.is_none() {
            return Err(ConfigError::Takeover);
        }
        Ok(config)
    }
}

/// The finished configuration the proxy runs with.
#[derive(Debug, Clone)]
pub struct Config {
    /// Client listen address.
    pub listen: SocketAddr,
    /// Admin HTTP address.
    pub admin_listen: Option<SocketAddr>,
    /// Every node: index 0 is the configured primary, then replicas. Roles are re-detected.
    /// With a `patroni` topology, the node set follows Patroni and index 0 is the login template.
    pub nodes: Vec<NodeUrl>,
    /// Where the node set comes from.
    pub topology: TopologyConfig,
    /// Pooling mode.
    pub pool_mode: PoolMode,
    /// Max backend connections per (node, database, role).
    pub pool_size: usize,
    /// Max client connections.
    pub max_client_connections: usize,
    /// Max server connections per (node, database), all roles together; 0 = unlimited.
    pub max_db_connections: usize,
    /// Max server connections per (node, role), all databases together; 0 = unlimited.
    pub max_user_connections: usize,
    /// Max clients logged in to one database; 0 = unlimited.
    pub max_db_client_connections: usize,
    /// Max clients logged in as one user; 0 = unlimited.
    pub max_user_client_connections: usize,
    /// Extra server connections per pool for checkouts that waited `reserve_pool_timeout`.
    pub reserve_pool_size: usize,
    /// How long a checkout waits before it may use the reserve pool.
    pub reserve_pool_timeout: Duration,
    /// Threads serving clients: 1 = one event loop on one thread, like PgBouncer.
    pub threads: usize,
    /// How long a client waits for a backend.
    pub acquire_timeout: Duration,
    /// How long a client may take from connecting to being logged in.
    pub client_login_timeout: Duration,
    /// How long opening a backend may take.
    pub connect_timeout: Duration,
    /// Interval of health/role checks.
    pub health_interval: Duration,
    /// How long a client may idle inside a transaction block; None = forever.
    pub idle_transaction_timeout: Option<Duration>,
    /// How long a client may idle outside a transaction block; None = forever.
    pub client_idle_timeout: Option<Duration>,
    /// How long an idle pooled server connection may stay unused; None = forever.
    pub server_idle_timeout: Option<Duration>,
    /// How long a server connection may stay open; None = forever.
    pub server_lifetime: Option<Duration>,
    /// Largest client message.
    pub max_message_size: usize,
    /// How long a stopping proxy waits for its clients.
    pub shutdown_timeout: Duration,
    /// The period SHOW STATS averages over.
    pub stats_period: Duration,
    /// Where the control socket is (online restart, cancel forwarding); None = no control socket.
    pub runtime_dir: Option<PathBuf>,
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
    /// Users who may run every admin-console command.
    pub admin_users: Vec<String>,
    /// Users who may run the admin console's SHOW commands.
    pub stats_users: Vec<String>,
    /// Logins checked against the servers' own secrets, when `auth_user` is set.
    pub auth_query: Option<AuthQuery>,
    /// Which clients may log in and how, when `auth_hba_file` is set.
    pub hba: Option<Hba>,
}

impl Config {
    /// Builds the final config from a file (already parsed) with flag overrides applied on top.
    pub fn build(file: FileConfig) -> Result<Config, ConfigError> {
        let listen = file.listen.unwrap_or(defaults::LISTEN);
        let primary = NodeUrl::parse_for(
            file.primary.as_deref().ok_or(ConfigError::NoPrimary)?,
            "the primary",
        )?;
        let mut nodes = vec![primary.clone()];
        for (i, r) in file.replicas.iter().enumerate() {
            nodes.push(NodeUrl::parse_for(r, &format!("replica {}", i + 1))?);
        }
        let tls = tls::client_tls(&file)?;
        let mut entries = file.users.clone();
        if let Some(path) = &file.auth_file {
            for entry in auth_file::read(path)? {
                if file.users.iter().any(|u| u.name == entry.name) {
                    return Err(ConfigError::User {
                        user: entry.name,
                        why: format!(
                            "both under [[users]] and in auth_file {}; keep one",
                            path.display()
                        ),
                    });
                }
                entries.push(entry);
            }
        }
        let auth_query = auth_query::auth_query(&file, &entries, &primary)?;
        let hba = file.auth_hba_file.as_deref().map(Hba::read).transpose()?;
        let users = users::client_users(&entries, &primary, listen)?;
        console::check_console_users(&users, &file.admin_users, &file.stats_users)?;
        Ok(Config {
            listen,
            admin_listen: file.admin_listen,
            topology: topology::topology_config(&file, primary.hosts[0].1)?,
            nodes,
            pool_mode: file.pool_mode.unwrap_or_default(),
            pool_size: file.pool_size.unwrap_or(defaults::POOL_SIZE).max(1),
            max_client_connections: file
                .max_client_connections
                .unwrap_or(defaults::MAX_CLIENT_CONNECTIONS),
            max_db_connections: file
                .max_db_connections
                .unwrap_or(defaults::MAX_DB_CONNECTIONS),
            max_user_connections: file
                .max_user_connections
                .unwrap_or(defaults::MAX_USER_CONNECTIONS),
            max_db_client_connections: file
                .max_db_client_connections
                .unwrap_or(defaults::MAX_DB_CLIENT_CONNECTIONS),
            max_user_client_connections: file
                .max_user_client_connections
                .unwrap_or(defaults::MAX_USER_CLIENT_CONNECTIONS),
            reserve_pool_size: file
                .reserve_pool_size
                .unwrap_or(defaults::RESERVE_POOL_SIZE),
            reserve_pool_timeout: Duration::from_millis(
                file.reserve_pool_timeout_ms
                    .unwrap_or(defaults::RESERVE_POOL_TIMEOUT_MS),
            ),
            threads: file.threads.unwrap_or(defaults::THREADS).max(1),
            acquire_timeout: Duration::from_millis(
                file.acquire_timeout_ms
                    .unwrap_or(defaults::ACQUIRE_TIMEOUT_MS),
            ),
            client_login_timeout: Duration::from_millis(
                file.client_login_timeout_ms
                    .unwrap_or(defaults::CLIENT_LOGIN_TIMEOUT_MS)
                    .max(1),
            ),
            connect_timeout: Duration::from_millis(
                file.connect_timeout_ms
                    .unwrap_or(defaults::CONNECT_TIMEOUT_MS),
            ),
            health_interval: Duration::from_millis(
                file.health_interval_ms
                    .unwrap_or(defaults::HEALTH_INTERVAL_MS)
                    .max(10),
            ),
            idle_transaction_timeout: limit_ms(
                file.idle_transaction_timeout_ms
                    .unwrap_or(defaults::IDLE_TRANSACTION_TIMEOUT_MS),
            ),
            client_idle_timeout: limit_ms(
                file.client_idle_timeout_ms
                    .unwrap_or(defaults::CLIENT_IDLE_TIMEOUT_MS),
            ),
            server_idle_timeout: limit_ms(
                file.server_idle_timeout_ms
                    .unwrap_or(defaults::SERVER_IDLE_TIMEOUT_MS),
            ),
            server_lifetime: limit_ms(
                file.server_lifetime_ms
                    .unwrap_or(defaults::SERVER_LIFETIME_MS),
            ),
            max_message_size: file
                .max_message_size
                .unwrap_or(defaults::MAX_MESSAGE_SIZE)
                .max(1024),
            shutdown_timeout: Duration::from_millis(
                file.shutdown_timeout_ms
                    .unwrap_or(defaults::SHUTDOWN_TIMEOUT_MS),
            ),
            stats_period: match file.stats_period_ms.unwrap_or(defaults::STATS_PERIOD_MS) {
                0 => {
                    return Err(ConfigError::Setting {
                        key: "stats_period_ms",
                        why: "must be at least 1 (milliseconds); PgBouncer's default is 60000"
                            .into(),
                    });
                }
                ms => Duration::from_millis(ms),
            },
            runtime_dir: file.runtime_dir.clone(),
            retry_buffer_size: file
                .retry_buffer_size
                .unwrap_or(defaults::RETRY_BUFFER_SIZE),
            write_functions: file
                .write_functions
                .iter()
                .map(|f| f.to_lowercase())
                .collect(),
            users,
            tls,
            causal: causal::causal_config(&file)?,
            admin_users: file.admin_users,
            stats_users: file.stats_users,
            auth_query,
            hba,
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
            reserve_size: self.reserve_pool_size,
            reserve_timeout: self.reserve_pool_timeout,
            max_db_connections: self.max_db_connections,
            max_user_connections: self.max_user_connections,
        }
    }

    /// The user with this login name, if there is one.
    pub fn user(&self, name: &str) -> Option<&ClientUser> {
        self.users.iter().find(|u| u.name == name)
    }

    /// What `user` may run on the admin console, if anything (admin wins over stats).
    pub fn console_access(&self, user: &str) -> Option<ConsoleAccess> {
        if self.admin_users.iter().any(|u| u == user) {
            Some(ConsoleAccess::Admin)
        } else if self.stats_users.iter().any(|u| u == user) {
            Some(ConsoleAccess::Stats)
        } else {
            None
        }
    }

    /// The credential a login name must present, if the user exists.
    pub fn credential(&self, user: &str) -> Option<&Credential> {
        self.user(user).map(|u| &u.credential)
    }
}

/// A time limit in milliseconds where 0 means none.
fn limit_ms(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_node_url_is_named_by_its_place() {
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

    #[test]
    fn console_users_come_from_repeated_flags_and_must_be_login_users() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: ProxyArgs,
        }
        let cli = Cli::try_parse_from([
            "proxy",
            "--primary",
            "postgres://app@db1/app",
            "--admin-user",
            "app",
            "--stats-user",
            "app",
        ])
        .unwrap();
        let config = cli.args.load().unwrap();
        assert_eq!(config.console_access("app"), Some(ConsoleAccess::Admin));
        assert_eq!(config.console_access("other"), None);
        let file = FileConfig {
            primary: Some("postgres://app@db1/app".into()),
            stats_users: vec!["exporter".into()],
            ..Default::default()
        };
        let error = Config::build(file).unwrap_err().to_string();
        assert!(
            error.starts_with("user \"exporter\": listed in stats_users but no client may log in as it; add it under [[users]]"),
            "{error}"
        );
    }

    #[test]
    fn flags_lie_over_the_file_and_the_file_over_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lsngate.toml");
        let text = "primary = \"postgres://app@db1/app\"\nreplicas = [\"postgres://app@db2/app\"]\n\
                    pool_size = 7\nthreads = 3\nwrite_functions = [\"audit\"]\n";
        std::fs::write(&path, text).unwrap();
        let mut args = ProxyArgs {
            config: Some(path),
            ..Default::default()
        };
        let config = args.load().unwrap();
        assert_eq!(
            (config.pool_size, config.threads, config.nodes.len()),
            (7, 3, 2)
        );
        assert_eq!(
            config.acquire_timeout,
            Duration::from_millis(defaults::ACQUIRE_TIMEOUT_MS)
        );
        args.flags.pool_size = Some(9);
        args.flags.replicas = vec![
            "postgres://app@db3/app".into(),
            "postgres://app@db4/app".into(),
        ];
        let config = args.load().unwrap();
        assert_eq!(
            (config.pool_size, config.threads, config.nodes.len()),
            (9, 3, 3),
            "a flag replaces its key, the file's other keys stay"
        );
        assert_eq!(config.nodes[1].address(), "db3:5432");
        assert_eq!(config.write_functions, vec!["audit"], "not a flag: kept");
    }
}
