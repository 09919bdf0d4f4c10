//! lsngate-cluster: real PostgreSQL clusters — one primary and N streaming replicas on
//! 127.0.0.1. A product crate first: the `lsngate cluster` command and `lsngate bench` ship it;
//! every test in the workspace runs against its servers too, and its fault helpers (pause
//! replay, SIGSTOP, kill, promote, the `Forwarder` that delays, resets or blackholes a
//! connection) serve both, and so do [`Pgpool`] and [`Pgbouncer`], the one place each that
//! knows how to run pgpool-II and PgBouncer for the comparisons that put them beside lsngate. Never a mock: every helper here
//! starts, stops, pauses or promotes an actual server. (It was `lsngate-testkit` until 2026-12-04.)
//!
//! ```no_run
//! use lsngate_cluster::{Cluster, ClusterConfig};
//! let cluster = Cluster::start(&ClusterConfig::default().replicas(2)).unwrap();
//! cluster.primary().sql("CREATE TABLE t (id int)").unwrap();
//! cluster.replica(0).pause_replay().unwrap();
//! // dropped here: every server stopped, data dir removed
//! ```

#![warn(missing_docs)]

mod cluster;
mod dir;
mod forwarder;
mod node;
mod patroni;
mod pgbin;
mod pgbouncer;
mod pgpool;
mod pooler;
mod process;
mod redis;
mod tls;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

pub use cluster::{Cluster, ClusterConfig, MANIFEST, Manifest, SyncMode, free_port};
pub use dir::default_cluster_dir;
pub use forwarder::{Fault, Forwarder};
pub use node::{Node, NodeSpec};
pub use patroni::{
    ClusterMember, MemberSpec, PATRONI_MANIFEST, PatroniCluster, PatroniConfig, RestTls, TTL_S,
};
pub use pgbin::{BUNDLE_BIN, PG_BIN_ENV, PgBin};
pub use pgbouncer::{PGBOUNCER, Pgbouncer, PgbouncerConfig, PoolMode};
pub use pgpool::{PGPOOL, Pgpool, PgpoolConfig};
pub use process::{SERVER_USER, in_own_session, process_tree};
pub use redis::RedisServer;
pub use tls::{ClusterTls, Issued, TestCa};

/// Everything lsngate-cluster can fail with; each message says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "no PostgreSQL found (looked at {BUNDLE_BIN}, pg_config --bindir, /usr/lib/postgresql/*/bin); run scripts/install-postgres.sh or pass --pg-bin"
    )]
    /// No PostgreSQL installation was found.
    NoPostgres,
    #[error("{dir} is not a usable PostgreSQL bin dir: {why}")]
    /// The given bin dir does not hold a usable PostgreSQL.
    BadPgBin {
        /// The directory.
        dir: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    #[error(
        "running as root but there is no `{SERVER_USER}` user to run PostgreSQL as; run scripts/install-postgres.sh, which creates it"
    )]
    /// Running as root without the `lsngate` user to run servers as.
    NoServerUser,
    #[error("{} already holds a cluster; stop it with `lsngate cluster down --dir {}` or pick another --dir", .0.display(), .0.display())]
    /// The requested cluster directory already holds a cluster.
    DirInUse(PathBuf),
    #[error(
        "cannot use {} as the cluster directory: PostgreSQL runs as user `{SERVER_USER}` when lsngate runs as root (initdb refuses root), and `{SERVER_USER}` {why}; choose another --dir whose parents `{SERVER_USER}` can enter, such as one under /tmp",
        .dir.display()
    )]
    /// The server user cannot reach the requested cluster directory.
    DirUnreachable {
        /// The directory.
        dir: PathBuf,
        /// Which parent blocks the server user, and how.
        why: String,
    },
    #[error(
        "{} already exists and belongs to {}, neither you nor `{SERVER_USER}`; lsngate cluster would hand it to `{SERVER_USER}`, so it does not use it: remove it or choose another --dir",
        .dir.display(),
        dir::user_name(*.owner)
    )]
    /// The requested cluster directory exists and belongs to another user.
    DirNotOurs {
        /// The directory.
        dir: PathBuf,
        /// Its owner's uid.
        owner: u32,
    },
    #[error(
        "pgpool-II is not installed ({}); run scripts/install/proxy.sh, which installs Debian's pgpool2",
        pgpool::PGPOOL
    )]
    /// pgpool-II, which the comparisons with it start, is not installed.
    NoPgpool,
    #[error(
        "PgBouncer is not installed ({}); run scripts/install/proxy.sh, which installs Debian's pgbouncer",
        pgbouncer::PGBOUNCER
    )]
    /// PgBouncer, which the comparisons with it start, is not installed.
    NoPgbouncer,
    #[error("{url}: {why}")]
    /// A server URL that cannot be used as asked.
    BadUrl {
        /// The URL.
        url: String,
        /// What is wrong with it, and what would do.
        why: String,
    },
    #[error("{what}: {source}")]
    /// A file or process operation failed.
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        source: std::io::Error,
    },
    #[error("{what} failed ({status}):\n{output}")]
    /// A server program (initdb, pg_ctl, pg_basebackup) failed.
    Command {
        /// What was being done.
        what: String,
        /// Its exit status.
        status: String,
        /// What it printed: standard error, then standard output, each on lines of its own.
        output: String,
    },
    #[error("SQL on {node} failed: {message}\n  statement: {sql}")]
    /// A statement run with psql failed.
    Sql {
        /// The node it ran on.
        node: String,
        /// The statement.
        sql: String,
        /// psql's error output.
        message: String,
    },
    #[error("cannot connect to {node}: {message}")]
    /// A driver connection could not be opened.
    Connect {
        /// The node.
        node: String,
        /// The driver's error.
        message: String,
    },
    #[error("timed out after {waited:?} waiting for {what}{}", last_error.as_ref().map(|e| format!(" (last error: {e})")).unwrap_or_default())]
    /// A condition did not become true in time.
    Timeout {
        /// The condition.
        what: String,
        /// How long it was waited for.
        waited: Duration,
        /// The last error seen while checking it, if any.
        last_error: Option<String>,
    },
}

impl Error {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}

/// One cluster with a single replica held 50 ms behind (`recovery_min_apply_delay`), shared by
/// the tests of this test binary that need a replica a read right after a write always finds
/// behind; streaming and caught up with the primary's setup when it is handed out, stopped when
/// the binary exits. The proxy's, the library's and the CLI's tests use this one.
pub fn shared_delayed_cluster() -> &'static Cluster {
    static DELAYED: OnceLock<&'static Cluster> = OnceLock::new();
    DELAYED.get_or_init(|| {
        let cluster = Cluster::start(
            &ClusterConfig::default()
                .replicas(1)
                .apply_delay(Duration::from_millis(50)),
        )
        .expect("start the shared delayed test cluster")
        .leak_until_exit();
        cluster
            .wait_streaming(Duration::from_secs(30))
            .expect("the delayed replica streams");
        cluster
            .wait_caught_up(Duration::from_secs(30))
            .expect("the delayed replica catches up");
        cluster
    })
}

/// One cluster (primary + 2 replicas, no delay) shared by every test in this test binary that
/// only reads and writes data; stopped when the binary exits. Tests that pause, kill or promote
/// nodes start their own.
pub fn shared_cluster() -> &'static Cluster {
    static SHARED: OnceLock<&'static Cluster> = OnceLock::new();
    SHARED.get_or_init(|| {
        Cluster::start(&ClusterConfig::default().replicas(2))
            .expect("start the shared test cluster")
            .leak_until_exit()
    })
}
