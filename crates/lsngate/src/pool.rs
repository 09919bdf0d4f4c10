//! Connections to one node, and the identity of the server each one actually reached.
//!
//! A node is a libpq URL; what answers it may be one server or, behind a load balancer or DNS
//! round robin, several. Everything lsngate knows about replay positions is keyed by
//! `lsngate_core::ServerId` — learned once per connection, when it is opened — never by the URL,
//! so "replica 1 has replayed X" is only ever applied to the server that said so.
//!
//! This is a thin [`deadpool`] manager over `tokio_postgres` connections (TLS as each URL's
//! `sslmode` says, through lsngate-pgconn's rustls connector, or the caller's own connector), with
//! a per-connection prepared-statement cache so a read sent after a wait costs no prepare round
//! trip. It is not a general pool: checkout and connect are always bounded by a timeout, because a
//! frozen server accepts TCP and then never answers.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool::managed::{self, Metrics, RecycleError, RecycleResult};
use futures_util::future::BoxFuture;
use lsngate_core::ServerFacts;
use tokio::time::Instant;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{Client, SimpleQueryMessage, Socket, Statement};

type Connect = dyn Fn(tokio_postgres::Config) -> BoxFuture<'static, Result<Client, tokio_postgres::Error>>
    + Send
    + Sync;

/// Opens one driver connection (spawning its connection task): lsngate's rustls TLS following
/// each URL's `sslmode`, `sslrootcert`, `sslcert` and `sslkey`, or the caller's connector.
#[derive(Clone)]
pub(crate) enum Connector {
    /// lsngate-pgconn's rustls connector (the default).
    Rustls,
    /// The caller's tokio-postgres TLS connector.
    Custom(Arc<Connect>),
}

impl Connector {
    /// Connections through `tls` (any tokio-postgres TLS connector, e.g. postgres-native-tls
    /// or tokio-postgres-rustls), which then follow each URL's `sslmode` (`verify-ca` and
    /// `verify-full` mean `require`: certificates are the connector's to check).
    pub fn new<T>(tls: T) -> Connector
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + 'static,
        T::TlsConnect: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        Connector::Custom(Arc::new(move |config: tokio_postgres::Config| {
            let tls = tls.clone();
            Box::pin(async move {
                let (client, connection) = config.connect(tls).await?;
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                Ok(client)
            })
        }))
    }
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Connector")
    }
}

/// One pooled connection and what was learned about its server when it was opened.
pub(crate) struct Conn {
    pub client: Client,
    /// Who the server is, its version and WAL layout, and its timeline when it was a primary
    /// at connect time (`lsngate_core::server`).
    pub facts: ServerFacts,
    statements: HashMap<String, Statement>,
}

impl Conn {
    /// The cached prepared statement for `sql`, if this connection prepared it before.
    pub fn cached(&self, sql: &str) -> Option<Statement> {
        self.statements.get(sql).cloned()
    }

    /// Remembers a statement prepared on this connection. The cache is bounded so an
    /// application building SQL text dynamically does not grow it without end.
    pub fn remember(&mut self, sql: &str, statement: Statement) {
        if self.statements.len() >= 256 {
            self.statements.clear();
        }
        self.statements.insert(sql.to_string(), statement);
    }
}

/// Why a connection could not be opened.
#[derive(Debug, Clone)]
pub(crate) struct ConnectError(pub String);

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Opens connections to one URL.
pub(crate) struct NodeManager {
    config: tokio_postgres::Config,
    tls: lsngate_pgconn::ServerTls,
    connect_timeout: Duration,
    connector: Connector,
}

impl managed::Manager for NodeManager {
    type Type = Conn;
    type Error = ConnectError;

    async fn create(&self) -> Result<Conn, ConnectError> {
        let open = async {
            let client = match &self.connector {
                Connector::Rustls => lsngate_pgconn::connect(&self.config, &self.tls)
                    .await
                    .map_err(ConnectError)?,
                Connector::Custom(connect) => connect(self.config.clone())
                    .await
                    .map_err(|e| ConnectError(lsngate_pgconn::describe(&e)))?,
            };
            let rows = client
                .simple_query(lsngate_core::server::IDENTITY_SQL)
                .await
                .map_err(|e| ConnectError(format!("learning the server identity: {e}")))?;
            identify(client, &rows)
        };
        match tokio::time::timeout(self.connect_timeout, open).await {
            Ok(result) => result,
            Err(_) => Err(ConnectError(format!(
                "no answer within {:?} (server down, frozen or overloaded)",
                self.connect_timeout
            ))),
        }
    }

    async fn recycle(&self, conn: &mut Conn, _: &Metrics) -> RecycleResult<ConnectError> {
        // A closed connection is the only thing checked here: an extra query per checkout would
        // cost the round trip lsngate exists to avoid. Dead servers surface on use.
        if conn.client.is_closed() {
            Err(RecycleError::message("connection closed"))
        } else {
            Ok(())
        }
    }
}

fn identify(client: Client, rows: &[SimpleQueryMessage]) -> Result<Conn, ConnectError> {
    let row = crate::flight::columns(rows)
        .ok_or_else(|| ConnectError("identity query returned no row".into()))?;
    Ok(Conn {
        client,
        facts: ServerFacts::from_row(&row),
        statements: HashMap::new(),
    })
}

/// A pooled connection.
pub(crate) type Pooled = managed::Object<NodeManager>;

/// Why a checkout failed.
#[derive(Debug, Clone)]
pub(crate) enum CheckoutError {
    /// Nothing within the deadline (pool exhausted or server not answering).
    Timeout,
    /// The server refused or failed the connection.
    Connect(String),
}

impl fmt::Display for CheckoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckoutError::Timeout => f.write_str("no connection within the deadline"),
            CheckoutError::Connect(message) => f.write_str(message),
        }
    }
}

/// The pool of one node.
pub(crate) struct NodePool {
    /// `primary`, `replica0`, `replica1`, ...
    pub name: String,
    /// host:port list, for messages (never the password).
    pub address: String,
    pool: managed::Pool<NodeManager>,
}

impl NodePool {
    pub fn new(
        name: String,
        url: &str,
        size: usize,
        connect_timeout: Duration,
        connector: Connector,
    ) -> Result<NodePool, String> {
        let parsed = lsngate_pgconn::ConnString::parse(url, lsngate_pgconn::ALL_PARAMETERS)
            .map_err(|e| e.to_string())?;
        let mut config = parsed.config;
        // The URL's connect_timeout is per host attempt; the pool's bounds the whole opening.
        config.connect_timeout(parsed.connect_timeout.unwrap_or(connect_timeout));
        if let Connector::Custom(_) = connector {
            let tls = &parsed.tls;
            if let Some(key) = [
                tls.root_cert.as_ref().map(|_| "sslrootcert"),
                tls.cert.as_ref().map(|_| "sslcert"),
                tls.key.as_ref().map(|_| "sslkey"),
            ]
            .into_iter()
            .flatten()
            .next()
            {
                return Err(format!(
                    "{key} is read by lsngate's own TLS, but Config::tls was given a connector of its own, which checks certificates itself; remove {key} from the URL or drop Config::tls"
                ));
            }
        }
        let tls = match connector {
            Connector::Rustls => parsed.tls,
            // Unused: the caller's connector does TLS.
            Connector::Custom(_) => lsngate_pgconn::TlsOptions::default(),
        };
        let tls = lsngate_pgconn::ServerTls::new(tls).map_err(|e| e.0)?;
        if config.get_application_name().is_none() {
            config.application_name("lsngate");
        }
        let address = describe(&config);
        let manager = NodeManager {
            config,
            tls,
            connect_timeout,
            connector,
        };
        let pool = managed::Pool::builder(manager)
            .max_size(size.max(1))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(NodePool {
            name,
            address,
            pool,
        })
    }

    /// Connections in use plus checkouts waiting for one: the load reads are balanced by.
    pub fn busy(&self) -> usize {
        let status = self.pool.status();
        status.size.saturating_sub(status.available) + status.waiting
    }

    /// A connection, or an error by `deadline` at the latest.
    pub async fn checkout(&self, deadline: Instant) -> Result<Pooled, CheckoutError> {
        match tokio::time::timeout_at(deadline, self.pool.get()).await {
            Err(_) => Err(CheckoutError::Timeout),
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(managed::PoolError::Backend(ConnectError(message)))) => {
                Err(CheckoutError::Connect(message))
            }
            Ok(Err(other)) => Err(CheckoutError::Connect(other.to_string())),
        }
    }
}

/// Drops a connection instead of returning it to the pool (after a timeout or error left it in
/// an unknown state).
pub(crate) fn discard(conn: Pooled) {
    drop(managed::Object::take(conn));
}

fn describe(config: &tokio_postgres::Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("{}:{port}", hosts.join(","))
}
