//! The connections each benchmark worker opens through the in-process proxy
//! ([`crate::inproc_proxy`]) for `proxy-session` and `proxy-token`, and their statements.

use lsngate_core::Lsn;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, SimpleQueryMessage, Statement};

use super::strategy::INSERT;
use crate::inproc_proxy::InProcessProxy;

/// The read through the proxy: the row, and whether a replica served it (the proxy decides).
const READ_WHERE_SERVED: &str =
    "SELECT payload, pg_is_in_recovery() FROM lsngate_bench WHERE id = $1";

/// One worker's connections through the proxy, statements prepared once.
pub struct ProxyClients {
    /// `proxy-session`: one connection in session mode; the read sees the write it follows.
    session: Client,
    session_insert: Statement,
    session_read: Statement,
    /// `proxy-token`: writes on A, …
    writer: Client,
    writer_insert: Statement,
    /// … reads on B with A's commit position as the floor.
    reader: Client,
}

/// A read through the proxy: the value seen and whether a replica served it.
pub struct ProxyRead {
    pub seen: Option<String>,
    pub on_replica: bool,
}

impl ProxyClients {
    /// Opens the worker's three proxy connections and prepares their statements.
    pub async fn open(proxy: &InProcessProxy) -> anyhow::Result<ProxyClients> {
        let session = proxy.connect("session").await?;
        let writer = proxy.connect("token").await?;
        let reader = proxy.connect("token").await?;
        Ok(ProxyClients {
            session_insert: session.prepare(INSERT).await?,
            session_read: session.prepare(READ_WHERE_SERVED).await?,
            writer_insert: writer.prepare(INSERT).await?,
            session,
            writer,
            reader,
        })
    }

    /// `proxy-session`'s write.
    pub async fn session_insert(&self, payload: &str) -> anyhow::Result<i64> {
        Ok(self
            .session
            .query_one(&self.session_insert, &[&payload])
            .await?
            .get(0))
    }

    /// `proxy-session`'s read, on the connection that wrote.
    pub async fn session_read(&self, id: i64) -> anyhow::Result<ProxyRead> {
        let row = self.session.query_opt(&self.session_read, &[&id]).await?;
        Ok(served(row))
    }

    /// `proxy-token`'s write, on connection A.
    pub async fn token_insert(&self, payload: &str) -> anyhow::Result<i64> {
        Ok(self
            .writer
            .query_one(&self.writer_insert, &[&payload])
            .await?
            .get(0))
    }

    /// `SHOW lsngate.commit_lsn` on A: the position of A's last commit, answered by the proxy.
    pub async fn commit_lsn(&self) -> anyhow::Result<Lsn> {
        let messages = self.writer.simple_query("SHOW lsngate.commit_lsn").await?;
        let text = messages
            .iter()
            .find_map(|m| match m {
                SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
                _ => None,
            })
            .unwrap_or_default();
        anyhow::ensure!(
            !text.is_empty(),
            "the proxy reported no lsngate.commit_lsn after an INSERT on the same connection"
        );
        Ok(Lsn::parse(&text)?)
    }

    /// `proxy-token`'s read on connection B, the floor in a comment: parse, bind and execute in
    /// one flight (the statement text changes with every floor, so it is not prepared).
    pub async fn token_read(&self, floor: Lsn, id: i64) -> anyhow::Result<ProxyRead> {
        let sql = format!("/* lsngate_min_lsn='{floor}' */ {READ_WHERE_SERVED}");
        let row = self
            .reader
            .query_typed_opt(&sql, &[(&id, Type::INT8)])
            .await?;
        Ok(served(row))
    }
}

fn served(row: Option<tokio_postgres::Row>) -> ProxyRead {
    match row {
        Some(row) => ProxyRead {
            seen: Some(row.get(0)),
            on_replica: row.get(1),
        },
        // A missing row is stale; only a replica can miss it.
        None => ProxyRead {
            seen: None,
            on_replica: true,
        },
    }
}
