//! [`Config`]: every knob of a [`crate::Gate`], each with a default that is right for a typical
//! web application, set builder-style.
//!
//! Only configuration: nothing here connects. Durations are wall-clock; sizes are connections.

use std::time::Duration;

use lsngate_core::{Fallback, GuardConfig, LagBound, TokenCodec, WhenGuarded};
use tokio_postgres::Socket;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};

use crate::pool::Connector;

/// How a replica is made to wait for a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WaitStrategy {
    /// Per server, from `server_version_num`: `WAIT FOR LSN` on PostgreSQL ≥ 19, polling below.
    #[default]
    Auto,
    /// Always `WAIT FOR LSN … WITH (MODE 'standby_replay', TIMEOUT …, NO_THROW)` (PostgreSQL ≥ 19).
    WaitFor,
    /// Always poll `pg_last_wal_replay_lsn()` with backoff (any version).
    Poll,
}

/// Settings of a [`crate::Gate`].
///
/// ```
/// use std::time::Duration;
/// let config = lsngate::Config::new("postgres://app@primary/db")
///     .replica("postgres://app@replica1/db")
///     .replica("postgres://app@replica2/db")
///     .budget(Duration::from_millis(200));
/// ```
#[derive(Debug, Clone)]
pub struct Config {
    pub(crate) primary_url: String,
    pub(crate) replica_urls: Vec<String>,
    pub(crate) budget: Duration,
    pub(crate) fallback: Fallback,
    pub(crate) when_guarded: WhenGuarded,
    pub(crate) guard: GuardConfig,
    pub(crate) guard_queue_timeout: Duration,
    pub(crate) lag_bound: LagBound,
    pub(crate) wait_strategy: WaitStrategy,
    pub(crate) pool_size: usize,
    pub(crate) connect_timeout: Duration,
    pub(crate) io_grace: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) token_codec: TokenCodec,
    pub(crate) connector: Connector,
}

impl Config {
    /// A gate on `primary_url` (libpq URL, `postgres://user:password@host:port/db`) with no
    /// replicas yet and these defaults: budget 500 ms, fallback to the primary, at most 32
    /// concurrent fallbacks, lag bound 16 MiB / 5 s for token-less reads, 16 connections per
    /// node, connect timeout 2 s, I/O grace 1 s, replica polling every 50 ms, unsigned tokens,
    /// TLS as each URL's `sslmode` says (libpq's default `prefer`: TLS when the server offers
    /// it), with lsngate's rustls connector.
    pub fn new(primary_url: impl Into<String>) -> Config {
        Config {
            primary_url: primary_url.into(),
            replica_urls: Vec::new(),
            budget: Duration::from_millis(500),
            fallback: Fallback::Primary,
            when_guarded: WhenGuarded::Wait,
            guard: GuardConfig::default(),
            guard_queue_timeout: Duration::from_secs(1),
            lag_bound: LagBound {
                max_bytes: Some(16 << 20),
                max_lag: Some(Duration::from_secs(5)),
            },
            wait_strategy: WaitStrategy::Auto,
            pool_size: 16,
            connect_timeout: Duration::from_secs(2),
            io_grace: Duration::from_secs(1),
            poll_interval: Duration::from_millis(50),
            token_codec: TokenCodec::unsigned(),
            connector: Connector::Rustls,
        }
    }

    /// Adds a replica URL. A URL may front several servers (a load balancer): positions are
    /// tracked per server reached, so that is safe.
    pub fn replica(mut self, url: impl Into<String>) -> Config {
        self.replica_urls.push(url.into());
        self
    }

    /// Adds several replica URLs.
    pub fn replicas<S: Into<String>>(mut self, urls: impl IntoIterator<Item = S>) -> Config {
        self.replica_urls.extend(urls.into_iter().map(Into::into));
        self
    }

    /// Default time a token read may wait for a replica before the fallback policy applies.
    /// A routing budget, not a correctness knob: correctness comes from the token. A waiting
    /// read holds a replica connection this long, so size pools with it.
    pub fn budget(mut self, budget: Duration) -> Config {
        self.budget = budget;
        self
    }

    /// What a token read does when its budget is spent or no replica can serve it.
    pub fn fallback(mut self, fallback: Fallback) -> Config {
        self.fallback = fallback;
        self
    }

    /// What a fallback does when the primary guard refuses it.
    pub fn when_guarded(mut self, behaviour: WhenGuarded) -> Config {
        self.when_guarded = behaviour;
        self
    }

    /// Concurrency cap and circuit breaker for fallbacks to the primary.
    pub fn guard(mut self, guard: GuardConfig) -> Config {
        self.guard = guard;
        self
    }

    /// With [`WhenGuarded::Wait`], how long a fallback may queue for a primary slot.
    pub fn guard_queue_timeout(mut self, timeout: Duration) -> Config {
        self.guard_queue_timeout = timeout;
        self
    }

    /// Lag bound for token-less reads (bytes behind the primary and time behind it).
    pub fn lag_bound(mut self, bound: LagBound) -> Config {
        self.lag_bound = bound;
        self
    }

    /// Overrides the per-server choice of wait strategy.
    pub fn wait_strategy(mut self, strategy: WaitStrategy) -> Config {
        self.wait_strategy = strategy;
        self
    }

    /// Connections per node (primary and each replica URL).
    pub fn pool_size(mut self, size: usize) -> Config {
        self.pool_size = size;
        self
    }

    /// Longest time to open one connection (TCP + startup + identity query).
    pub fn connect_timeout(mut self, timeout: Duration) -> Config {
        self.connect_timeout = timeout;
        self
    }

    /// How far past its budget a read may spend on replica I/O (checkout, the read itself)
    /// before the replica is declared unreachable: a token read takes at most budget + grace
    /// on replicas, then its fallback.
    pub fn io_grace(mut self, grace: Duration) -> Config {
        self.io_grace = grace;
        self
    }

    /// How often the background watcher asks each replica for its replay position and role,
    /// and the primary for its WAL position (the lag clock).
    pub fn poll_interval(mut self, interval: Duration) -> Config {
        self.poll_interval = interval;
        self
    }

    /// How [`crate::Gate::issue`] and [`crate::Gate::verify`] encode tokens for clients
    /// (signing key, TTL).
    pub fn token_codec(mut self, codec: TokenCodec) -> Config {
        self.token_codec = codec;
        self
    }

    /// Connects through `tls`, any tokio-postgres TLS connector (for example from
    /// `postgres-native-tls`), instead of lsngate's own rustls TLS. Each URL's `sslmode` then
    /// applies as tokio-postgres knows it (`prefer` by default; `require`, `verify-ca` and
    /// `verify-full` all insist on TLS and leave certificate checks to the connector), and
    /// `sslrootcert`, `sslcert` and `sslkey` are refused. Without this, lsngate's rustls TLS
    /// follows every libpq `sslmode` and those files.
    pub fn tls<T>(mut self, tls: T) -> Config
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + 'static,
        T::TlsConnect: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        self.connector = Connector::new(tls);
        self
    }
}
