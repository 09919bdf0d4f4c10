//! The settings as a person writes them: the TOML file's keys, every one optional, unknown ones
//! refused — and the flags of `lsngate proxy`, which are the same fields (`clap::Args` on the
//! same struct), so a key is declared, named and documented once. Fields that are not flags are
//! `#[arg(skip)]`. The flags lie over the file with [`FileConfig::overlay`]. What a key means
//! once set or left out is decided where the finished `Config` is built (`mod.rs`), with the
//! defaults of `defaults`.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use super::{PoolMode, TlsMode, UserEntry};

/// Declares the settings struct and its [`FileConfig::overlay`] from one list of fields, so that
/// adding a key cannot forget the overlay (Rust has no reflection to walk a struct's fields).
macro_rules! layered_settings {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$field_meta:meta])* pub $field:ident: $ty:ty, )*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $( $(#[$field_meta])* pub $field: $ty, )*
        }

        impl $name {
            /// These settings with every key that `over` sets taken from `over`: the flags lie
            /// over the file. A key is set when it is `Some`, or for a list when it is not empty.
            pub fn overlay(mut self, over: $name) -> $name {
                $( Layer::lay(&mut self.$field, over.$field); )*
                self
            }
        }
    };
}

/// How a key's value is replaced by an upper layer's.
trait Layer {
    fn lay(&mut self, over: Self);
}

impl<T> Layer for Option<T> {
    fn lay(&mut self, over: Self) {
        if over.is_some() {
            *self = over;
        }
    }
}

impl<T> Layer for Vec<T> {
    fn lay(&mut self, over: Self) {
        if !over.is_empty() {
            *self = over;
        }
    }
}

layered_settings! {
/// The settings as written by a person, in the TOML file or as flags: every field optional.
#[derive(Debug, Clone, Deserialize, Default, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Address clients connect to [default: 127.0.0.1:6432].
    #[arg(long, env = "LSNGATE_PROXY_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// libpq URL of the primary, with the credentials the proxy uses towards it,
    /// e.g. postgres://app:secret@10.0.0.1:5432/app.
    #[arg(long, env = "LSNGATE_PROXY_PRIMARY")]
    pub primary: Option<String>,
    /// libpq URL of a replica (repeat the flag for several).
    #[serde(default)]
    #[arg(long = "replica")]
    pub replicas: Vec<String>,
    /// Where the node set comes from: static (primary and replicas as configured), patroni
    /// (the members Patroni's REST API lists, followed live), discover (the replicas streaming
    /// from the primary, placed by discover_replicas / discover_template), dns (the records of
    /// dns_name, re-resolved at every poll) [default: static].
    #[arg(long)]
    pub topology: Option<String>,
    /// A Patroni REST API URL, http://host:port (repeat for each member; tried in order until
    /// one answers). With topology = patroni the primary URL gives only the login, database and
    /// TLS settings; hosts and ports come from Patroni.
    #[serde(default)]
    #[arg(long = "patroni-url")]
    pub patroni_urls: Vec<String>,
    /// With https:// Patroni URLs: the PEM file of the CA that signed the REST API's
    /// certificate, checked for the URL's host name [default: the system's CA bundle].
    #[arg(long)]
    pub patroni_ca_file: Option<std::path::PathBuf>,
    /// With https:// Patroni URLs: a client certificate (PEM) for a REST API that verifies
    /// clients (Patroni's restapi.verify_client) [default: none].
    #[arg(long)]
    pub patroni_cert_file: Option<std::path::PathBuf>,
    /// patroni_cert_file's private key (PEM) [default: none].
    #[arg(long)]
    pub patroni_key_file: Option<std::path::PathBuf>,
    /// With topology = discover: where the replica streaming as APPLICATION_NAME listens,
    /// APPLICATION_NAME=HOST:PORT (repeat for each replica).
    #[serde(default)]
    #[arg(long = "discover-replica")]
    pub discover_replicas: Vec<String>,
    /// With topology = discover: HOST[:PORT] of a replica not in discover_replicas, with
    /// {application_name} replaced by its application_name, e.g. {application_name}.db:5432.
    #[arg(long)]
    pub discover_template: Option<String>,
    /// With topology = dns: the name whose records are the members — A/AAAA records (each
    /// address on dns_port), or SRV records (host and port each) for a name starting with `_`
    /// such as _postgresql._tcp.pg.default.svc.cluster.local.
    #[arg(long)]
    pub dns_name: Option<String>,
    /// With topology = dns and A/AAAA records: the members' PostgreSQL port [default: the
    /// primary URL's port].
    #[arg(long)]
    pub dns_port: Option<u16>,
    /// With topology = dns: the DNS server asked, IP[:PORT] [default: the system's resolver for
    /// A/AAAA; the first nameserver of /etc/resolv.conf for SRV].
    #[arg(long)]
    pub dns_server: Option<String>,
    /// Milliseconds between two polls of Patroni's /cluster (or the primary's
    /// pg_stat_replication, or dns_name's records) [default: 500].
    #[arg(long)]
    pub topology_poll_ms: Option<u64>,
    /// Consecutive polls a member must show a changed state (joined, left, tags) in before the
    /// proxy's node set follows; damps a flapping member [default: 3].
    #[arg(long)]
    pub topology_settle_polls: Option<u32>,
    /// Milliseconds a stopping proxy waits for its clients (SIGTERM, SHUTDOWN, a takeover by a
    /// new process); past it the clients left get 57P01 and the process exits [default: 30000].
    #[arg(long)]
    pub shutdown_timeout_ms: Option<u64>,
    /// Milliseconds over which SHOW STATS and SHOW STATS_AVERAGES average (PgBouncer's
    /// stats_period): each avg_* column is the last complete period's; until the first one
    /// ends, the time since the proxy started [default: 60000].
    #[arg(long)]
    pub stats_period_ms: Option<u64>,
    /// Directory of the proxy's control socket (`lsngate-PORT.PID.sock`, with the link
    /// `lsngate-PORT.sock` to the one taking new clients): a new process started with --takeover
    /// takes the listening sockets over through it, and cancel requests reach the process
    /// owning the session. Without it there is no online restart [default: none].
    #[arg(long)]
    pub runtime_dir: Option<PathBuf>,
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
    /// Max server connections to one database on one node, the pools of every role together
    /// (PgBouncer's max_db_connections); a checkout over it waits as for a full pool; 0 =
    /// unlimited [default: 0].
    #[arg(long)]
    pub max_db_connections: Option<usize>,
    /// Max server connections as one role on one node, the pools of every database together
    /// (PgBouncer's max_user_connections); 0 = unlimited [default: 0].
    #[arg(long)]
    pub max_user_connections: Option<usize>,
    /// Max clients logged in to one database; one more is refused with SQLSTATE 53300
    /// (PgBouncer's max_db_client_connections); 0 = unlimited [default: 0].
    #[arg(long)]
    pub max_db_client_connections: Option<usize>,
    /// Max clients logged in as one user; one more is refused with SQLSTATE 53300 (PgBouncer's
    /// max_user_client_connections); 0 = unlimited [default: 0].
    #[arg(long)]
    pub max_user_client_connections: Option<usize>,
    /// Server connections a pool may open beyond pool_size for a checkout that has waited
    /// reserve_pool_timeout_ms (PgBouncer's reserve_pool_size); 0 = none [default: 0].
    #[arg(long)]
    pub reserve_pool_size: Option<usize>,
    /// Milliseconds a checkout waits for a pool's connection before it may use the reserve pool
    /// (PgBouncer's reserve_pool_timeout, in ms) [default: 5000].
    #[arg(long)]
    pub reserve_pool_timeout_ms: Option<u64>,
    /// Threads serving clients; 1 runs one event loop on one thread, like PgBouncer, which is
    /// the cheapest per statement [default: 1].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Milliseconds a client waits for a free backend connection, then gets an error
    /// (PgBouncer's query_wait_timeout, in ms) [default: 5000].
    #[arg(long)]
    pub acquire_timeout_ms: Option<u64>,
    /// Milliseconds a client has from connecting to being logged in (TLS handshake, startup
    /// message, password exchange); past it the connection is closed [default: 60000].
    #[arg(long)]
    pub client_login_timeout_ms: Option<u64>,
    /// Milliseconds allowed to open a backend connection [default: 5000].
    #[arg(long)]
    pub connect_timeout_ms: Option<u64>,
    /// Milliseconds between health and role checks of each node [default: 1000].
    #[arg(long)]
    pub health_interval_ms: Option<u64>,
    /// Milliseconds a client may sit idle inside a transaction block (its turn, nothing in
    /// flight) before it is disconnected and the transaction rolled back; 0 = never
    /// [default: 0].
    #[arg(long)]
    pub idle_transaction_timeout_ms: Option<u64>,
    /// Milliseconds a client may sit idle outside a transaction block before it is
    /// disconnected; 0 = never [default: 0].
    #[arg(long)]
    pub client_idle_timeout_ms: Option<u64>,
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
    /// Bytes of a replica reply held back so a 25006 error can be re-run on the primary. Default
    /// [`RETRY_BUFFER_SIZE`](super::defaults::RETRY_BUFFER_SIZE).
    #[arg(skip)]
    pub retry_buffer_size: Option<usize>,
    /// Functions (lower case, no schema) whose presence sends a statement to the primary.
    #[serde(default)]
    #[arg(skip)]
    pub write_functions: Vec<String>,
    /// PEM certificate chain offered to clients that ask for TLS [default: none].
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// Client TLS policy [default: allow with a certificate, disable without].
    #[arg(long, value_enum)]
    pub tls_mode: Option<TlsMode>,
    /// A user who may run every command of the admin console (database `lsngate` or
    /// `pgbouncer`); repeat for several. It must be a user clients may log in as.
    #[serde(default)]
    #[arg(long = "admin-user")]
    pub admin_users: Vec<String>,
    /// A user who may run the admin console's SHOW commands; repeat for several.
    #[serde(default)]
    #[arg(long = "stats-user")]
    pub stats_users: Vec<String>,
    /// PgBouncer's userlist.txt: `"user" "password"` lines (plain, `md5…` or `SCRAM-SHA-256$…`),
    /// users besides those under [[users]]; re-read at every reload [default: none].
    #[arg(long)]
    pub auth_file: Option<std::path::PathBuf>,
    /// A file in pg_hba.conf format: the first rule matching a login's connection type,
    /// database, user and address decides its method (trust, reject, md5, scram-sha-256,
    /// password); no matching rule refuses it; re-read at every reload [default: none].
    #[arg(long)]
    pub auth_hba_file: Option<std::path::PathBuf>,
    /// The role that runs auth_query: a client not under [[users]] nor in auth_file logs in
    /// against the secret the server stores for its role [default: none, auth_query off].
    #[arg(long)]
    pub auth_user: Option<String>,
    /// The query auth_user runs to fetch a login's secret; `$1` is the login name, it returns
    /// the name and the secret (or a SECURITY DEFINER function's row)
    /// [default: SELECT usename, passwd FROM pg_shadow WHERE usename=$1].
    #[arg(long)]
    pub auth_query: Option<String>,
    /// The database auth_query runs in [default: the client's database].
    #[arg(long)]
    pub auth_dbname: Option<String>,
    /// Milliseconds a secret auth_query fetched is reused [default: 60000].
    #[arg(long)]
    pub auth_cache_ttl_ms: Option<u64>,
    /// As whom clients logged in through auth_query reach the servers: client_role (their own
    /// role, with the keys they proved) or node_user (the node URL's user)
    /// [default: client_role].
    #[arg(long)]
    pub auth_server_login: Option<String>,
    /// Users clients may log in as. Without any, clients log in as the primary URL's user.
    #[serde(default)]
    #[arg(skip)]
    pub users: Vec<UserEntry>,
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
    /// Most fallback reads running on the primary at once. Default: `GuardConfig::default()`.
    #[arg(skip)]
    pub fallback_cap: Option<usize>,
    /// Fallback share (0–1) over the breaker window above which the breaker opens. Default:
    /// `GuardConfig::default()`.
    #[arg(skip)]
    pub breaker_ratio: Option<f64>,
    /// Fewest reads in the breaker window before it may open. Default: `GuardConfig::default()`.
    #[arg(skip)]
    pub breaker_min_reads: Option<u32>,
    /// Milliseconds of one breaker rate window (the rate spans two). Default:
    /// `GuardConfig::default()`.
    #[arg(skip)]
    pub breaker_window_ms: Option<u64>,
    /// Milliseconds the breaker stays open. Default: `GuardConfig::default()`.
    #[arg(skip)]
    pub breaker_open_ms: Option<u64>,
    /// A fallback the guard refuses: wait (default; queue up to wait_timeout_ms) or fail
    /// (SQLSTATE LG002 at once).
    #[arg(skip)]
    pub when_guarded: Option<String>,
    /// HMAC key of the HTTP helpers' signed tokens: `SET lsngate.min_lsn` then accepts them and
    /// the proxy reports `lsngate.commit_token`. Default: none (plain LSNs only).
    #[arg(skip)]
    pub token_secret: Option<String>,
    /// With token_secret: refuse plain `X/Y` floors, accept only signed tokens. Default
    /// [`REQUIRE_SIGNED_TOKENS`](super::defaults::REQUIRE_SIGNED_TOKENS).
    #[arg(skip)]
    pub require_signed_tokens: Option<bool>,
    /// With token_secret: a scope (`SET lsngate.scope`, its comment, the startup options) must be
    /// signed with it (`<name>~s<signature>`, issued by the application server), so a client
    /// cannot work under a scope it was not given. Default
    /// [`REQUIRE_SIGNED_SCOPES`](super::defaults::REQUIRE_SIGNED_SCOPES).
    #[arg(skip)]
    pub require_signed_scopes: Option<bool>,
    /// Seconds a signed token issued by the proxy stays valid. Default: no expiry.
    #[arg(skip)]
    pub token_ttl_s: Option<u64>,
    /// Milliseconds between position polls of every node (also role and health) while reads use
    /// positions (health_interval_ms otherwise).
    /// Default [`REPLAY_POLL_MS`](super::defaults::REPLAY_POLL_MS).
    #[arg(skip)]
    pub replay_poll_ms: Option<u64>,
    /// Most causal scopes (`SET lsngate.scope`) whose floor is kept; the least recently used
    /// leaves first and its next read waits for the primary's position [default: 100000].
    #[arg(long)]
    pub scope_capacity: Option<usize>,
    /// Milliseconds a scope's floor is kept after its last write; later reads under it wait for
    /// the primary's position [default: 60000].
    #[arg(long)]
    pub scope_ttl_ms: Option<u64>,
    /// Redis shared by several proxies for the causal scopes' floors (`redis://host:port/db`):
    /// a read under a scope sees the scope's writes made through any of them [default: none,
    /// each proxy keeps its own].
    #[arg(long)]
    pub scope_store: Option<String>,
    /// Reads without a floor skip replicas lagging more than this many ms. Default: no bound.
    #[arg(skip)]
    pub max_replica_lag_ms: Option<u64>,
    /// Reads without a floor skip replicas more than this many bytes behind. Default: no bound.
    #[arg(skip)]
    pub max_replica_lag_bytes: Option<u64>,
}
}
