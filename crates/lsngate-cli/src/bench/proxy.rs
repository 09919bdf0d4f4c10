//! The connections each benchmark worker opens through the in-process proxy
//! ([`crate::inproc_proxy`]) for `proxy-session`, `proxy-token`, `proxy-scope`,
//! `proxy-global`, `proxy-eventual` and `proxy-fast`, and their statements.

use std::sync::atomic::{AtomicUsize, Ordering};

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
    /// `proxy-scope`: writes on one connection and reads on another, both under the worker's
    /// causal scope (as an app's pool hands a request two connections in turn).
    scope_writer: Client,
    scope_writer_insert: Statement,
    scope_reader: Client,
    scope_reader_read: Statement,
    /// `proxy-global`: writes on one connection, reads on another in `global` mode.
    global_writer: Client,
    global_writer_insert: Statement,
    global_reader: Client,
    global_reader_read: Statement,
    /// `proxy-eventual`: one connection in eventual mode, the proxy as a plain read/write split.
    eventual: Client,
    eventual_insert: Statement,
    eventual_read: Statement,
    /// `proxy-fast`: one connection in fast mode.
    fast: Client,
    fast_insert: Statement,
    fast_read: Statement,
}

/// A read through the proxy: the value seen and whether a replica served it.
pub struct ProxyRead {
    pub seen: Option<String>,
    pub on_replica: bool,
}

impl ProxyClients {
    /// Opens the worker's proxy connections and prepares their statements.
    pub async fn open(proxy: &InProcessProxy) -> anyhow::Result<ProxyClients> {
        static WORKERS: AtomicUsize = AtomicUsize::new(0);
        let session = proxy.connect("session").await?;
        let writer = proxy.connect("token").await?;
        let reader = proxy.connect("token").await?;
        let scope = format!("bench:{}", WORKERS.fetch_add(1, Ordering::Relaxed));
        let scope_writer = proxy.connect("session").await?;
        let scope_reader = proxy.connect("session").await?;
        for client in [&scope_writer, &scope_reader] {
            client
                .batch_execute(&format!("SET lsngate.scope = '{scope}'"))
                .await?;
        }
        let global_writer = proxy.connect("global").await?;
        let global_reader = proxy.connect("global").await?;
        let eventual = proxy.connect("eventual").await?;
        let fast = proxy.connect("fast").await?;
        Ok(ProxyClients {
            fast_insert: fast.prepare(INSERT).await?,
            fast_read: fast.prepare(READ_WHERE_SERVED).await?,
            fast,
            eventual_insert: eventual.prepare(INSERT).await?,
            eventual_read: eventual.prepare(READ_WHERE_SERVED).await?,
            eventual,
            scope_writer_insert: scope_writer.prepare(INSERT).await?,
            scope_reader_read: scope_reader.prepare(READ_WHERE_SERVED).await?,
            global_writer_insert: global_writer.prepare(INSERT).await?,
            global_reader_read: global_reader.prepare(READ_WHERE_SERVED).await?,
            scope_writer,
            scope_reader,
            global_writer,
            global_reader,
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

impl ProxyClients {
    /// `proxy-scope`'s write, on the scope's first connection.
    pub async fn scope_insert(&self, payload: &str) -> anyhow::Result<i64> {
        insert(&self.scope_writer, &self.scope_writer_insert, payload).await
    }

    /// `proxy-scope`'s read, on the scope's other connection.
    pub async fn scope_read(&self, id: i64) -> anyhow::Result<ProxyRead> {
        let row = self
            .scope_reader
            .query_opt(&self.scope_reader_read, &[&id])
            .await?;
        Ok(served(row))
    }

    /// `proxy-global`'s write.
    pub async fn global_insert(&self, payload: &str) -> anyhow::Result<i64> {
        insert(&self.global_writer, &self.global_writer_insert, payload).await
    }

    /// `proxy-eventual`'s write.
    pub async fn eventual_insert(&self, payload: &str) -> anyhow::Result<i64> {
        insert(&self.eventual, &self.eventual_insert, payload).await
    }

    /// `proxy-eventual`'s read, at once on the connection that wrote: the replica the proxy
    /// picks, with nothing waited for.
    pub async fn eventual_read(&self, id: i64) -> anyhow::Result<ProxyRead> {
        let row = self.eventual.query_opt(&self.eventual_read, &[&id]).await?;
        Ok(served(row))
    }

    /// `proxy-fast`'s write.
    pub async fn fast_insert(&self, payload: &str) -> anyhow::Result<i64> {
        insert(&self.fast, &self.fast_insert, payload).await
    }

    /// `proxy-fast`'s read, at once on the connection that wrote.
    pub async fn fast_read(&self, id: i64) -> anyhow::Result<ProxyRead> {
        let row = self.fast.query_opt(&self.fast_read, &[&id]).await?;
        Ok(served(row))
    }

    /// `proxy-global`'s read, on another connection than the write.
    pub async fn global_read(&self, id: i64) -> anyhow::Result<ProxyRead> {
        let row = self
            .global_reader
            .query_opt(&self.global_reader_read, &[&id])
            .await?;
        Ok(served(row))
    }
}

async fn insert(client: &Client, statement: &Statement, payload: &str) -> anyhow::Result<i64> {
    Ok(client.query_one(statement, &[&payload]).await?.get(0))
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
