//! How one verify process reaches the database: through an lsngate proxy ([`proxy_client`]) or
//! through the lsngate library's `Gate` ([`library_client`]). Both answer the same four
//! questions — write this op id, read this key (with this floor), run these reads in one
//! read-only transaction — with what PostgreSQL itself said, so the workload, the history and the
//! checker are one for both targets. Not the workload: nothing here chooses an operation,
//! keeps a floor between operations or records anything.

use std::sync::Arc;

use lsngate_core::Lsn;

use super::history::Server;
use super::library_client::{self, LibraryClient, LibraryTarget};
use super::proxy_client::ProxyClient;
use super::workload::Mode;

/// Raises the key's version and logs the op id in one statement: one transaction, so the log
/// holds an op id exactly when its register change committed.
pub const WRITE_SQL: &str = "WITH changed AS (
        UPDATE lsngate_verify_register SET version = version + 1, last_op = $1
        WHERE key = $2 RETURNING version)
    INSERT INTO lsngate_verify_log (op_id, key, version, process)
    SELECT $1, $2, version, $3 FROM changed RETURNING version";

/// The read, and who served it in the server's own words.
pub const READ_SQL: &str = "SELECT version, pg_is_in_recovery(), inet_server_port()
    FROM lsngate_verify_register WHERE key = $1";

/// What the clients talk to.
#[derive(Clone)]
pub enum Via {
    /// An lsngate proxy: where clients log in, without the consistency option.
    Proxy(Box<tokio_postgres::Config>),
    /// The lsngate library: one `Gate` over the primary and the replicas, shared by every
    /// process as an application shares it.
    Library(Arc<LibraryTarget>),
}

/// An acknowledged write.
pub struct Written {
    /// The version the write created.
    pub version: i64,
    /// Token mode: the commit position the target reported (proxy: `lsngate.commit_lsn`,
    /// library: the write's token).
    pub commit: Option<Lsn>,
}

/// A read's answer: the version (None when the row was not there) and who served it.
pub struct Seen {
    pub version: Option<i64>,
    pub server: Option<Server>,
}

/// Why an operation failed, for the history.
#[derive(Debug)]
pub struct Failure {
    /// The SQLSTATE, `connection` when the connection broke without one, or the library's
    /// error class (`primary-unavailable`, `not-replayed`, `guarded`, ...).
    pub sqlstate: String,
    pub message: String,
    /// What a write that failed this way did (see [`effect_of`]); a write said to have had no
    /// effect that committed anyway is a violation.
    pub effect: Effect,
}

/// What a failed write did to the database, in the target's own words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Certainly nothing: an `ERROR` (its transaction rolled back), the proxy's 08001 ("not
    /// sent"), or a call refused before anything was sent.
    Nothing,
    /// May or may not have committed.
    Unknown,
    /// Committed, though the call failed after the commit: the library's `TokenUnavailable`
    /// ("the transaction COMMITTED, but reading its WAL position failed").
    Committed,
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Failure {
        Failure {
            sqlstate: sqlstate(&e),
            effect: effect_of(&e),
            // The server's (or the proxy's) message, not tokio-postgres's bare "db error".
            message: match e.as_db_error() {
                Some(db) => db.message().to_string(),
                None => e.to_string(),
            },
        }
    }
}

/// What a statement that ended with `e` did. An `ERROR` (from PostgreSQL or
/// from the proxy speaking for it) rolls the statement's transaction back: certainly not
/// committed. Unknown are a connection that broke without an answer, a `FATAL`/`PANIC` (a
/// server ending the session — after `SIGTERM` that can come after the commit record), and
/// class 08 (connection exception: the proxy's 08006 "lost the server connection while it ran
/// your statement") — except 08001, the proxy's "no server connection could be had, the
/// statement was not sent".
pub fn effect_of(e: &tokio_postgres::Error) -> Effect {
    let unknown = match e.as_db_error() {
        None => true,
        Some(db) => {
            let code = db.code().code();
            (code.starts_with("08") && code != "08001")
                || matches!(db.severity(), "FATAL" | "PANIC")
        }
    };
    if unknown {
        Effect::Unknown
    } else {
        Effect::Nothing
    }
}

/// The SQLSTATE, or `connection` for an error without one (the connection broke).
pub fn sqlstate(e: &tokio_postgres::Error) -> String {
    match e.code() {
        Some(code) => code.code().to_string(),
        None => "connection".to_string(),
    }
}

/// One process's way in.
pub enum Client {
    Proxy(Box<ProxyClient>),
    Library(LibraryClient),
}

impl Client {
    /// `scope`: the causal scope of scope mode.
    pub async fn open(via: &Via, mode: Mode, scope: Option<&str>) -> anyhow::Result<Client> {
        Ok(match via {
            Via::Proxy(endpoint) => {
                Client::Proxy(Box::new(ProxyClient::open(endpoint, mode, scope).await?))
            }
            Via::Library(target) => Client::Library(LibraryClient::open(target, mode, scope)?),
        })
    }

    /// Whether a connection of it broke (a library client pools its connections: never).
    pub fn is_closed(&self) -> bool {
        match self {
            Client::Proxy(client) => client.is_closed(),
            Client::Library(_) => false,
        }
    }

    pub async fn write(&mut self, op_id: &str, key: i32, process: i32) -> Result<Written, Failure> {
        match self {
            Client::Proxy(client) => client.write(op_id, key, process).await,
            Client::Library(client) => client.write(op_id, key, process).await,
        }
    }

    /// Reads `key`; `floor` is the token-mode floor handed over (ignored in other modes).
    pub async fn read(&mut self, key: i32, floor: Option<Lsn>) -> Result<Seen, Failure> {
        match self {
            Client::Proxy(client) => client.read(key, floor).await,
            Client::Library(client) => client.read(key, floor).await,
        }
    }

    /// Opens a read-only transaction with `floor` (token mode).
    pub async fn begin_read_only(&mut self, floor: Option<Lsn>) -> Result<(), Failure> {
        match self {
            Client::Proxy(client) => client.begin_read_only(floor).await,
            Client::Library(_) => Err(library_client::no_read_only_transactions()),
        }
    }

    /// A read inside the open read-only transaction.
    pub async fn read_in_transaction(&mut self, key: i32) -> Result<Seen, Failure> {
        match self {
            Client::Proxy(client) => client.read_in_transaction(key).await,
            Client::Library(_) => Err(library_client::no_read_only_transactions()),
        }
    }

    pub async fn commit(&mut self) -> Result<(), Failure> {
        match self {
            Client::Proxy(client) => client.commit().await,
            Client::Library(_) => Err(library_client::no_read_only_transactions()),
        }
    }
}

/// A read's row: `READ_SQL`'s three columns.
pub fn seen(row: Option<&tokio_postgres::Row>) -> Seen {
    match row {
        Some(row) => Seen {
            version: Some(row.get(0)),
            server: Some(Server {
                in_recovery: row.get(1),
                port: row.get(2),
            }),
        },
        // The registers exist from the start: no row means the table was not there.
        None => Seen {
            version: None,
            server: None,
        },
    }
}
