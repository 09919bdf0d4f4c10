//! The demo's data access: items and jobs in PostgreSQL, through the `lsngate` gate. Writes go
//! to the primary and return the commit token; reads carry the token (or none, in naive mode)
//! and the gate picks the replica, waits, or falls back to the primary.

use std::time::Duration;

use lsngate::{Config, Gate, Token};
use lsngate_http::JobPayload;
use tokio_postgres::{Client, NoTls, Row};

use super::log::Served;

/// The wait budget: past it, the primary serves the read.
pub const BUDGET: Duration = Duration::from_secs(2);

type DbResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Debug, Clone)]
pub struct Item {
    pub id: i64,
    pub title: String,
    pub value: String,
}

impl Item {
    fn from_row(row: &Row) -> Item {
        Item {
            id: row.get(0),
            title: row.get(1),
            value: row.get(2),
        }
    }
}

/// The job the create handler enqueues: "read the item I just created".
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ItemJob {
    pub item_id: i64,
}

/// A job row as the jobs page shows it.
#[derive(Debug, Clone)]
pub struct JobRow {
    pub id: i64,
    pub payload: String,
    pub found: Option<bool>,
    pub served_by: Option<String>,
    pub wait_ms: Option<f64>,
}

pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS items (id bigserial PRIMARY KEY, title text NOT NULL, value text NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS jobs (id bigserial PRIMARY KEY, payload jsonb NOT NULL,
  done_at timestamptz, found boolean, served_by text, wait_ms float8);";

pub const ITEM_SQL: &str = "SELECT id, title, value FROM items WHERE id = $1";

pub struct Db {
    pub gate: Gate,
    /// For the jobs page only: the queue lives on the primary.
    monitor: Client,
}

/// How the gate served a read, as the demo's pages show it.
pub fn served(read: &lsngate::Served) -> Served {
    Served {
        node: read.node.clone(),
        wait: read.wait_time,
        fallback: read.fallback.map(|why| why.to_string()),
    }
}

impl Db {
    pub async fn connect(primary_url: &str, replica_urls: &[String]) -> DbResult<Db> {
        let config = Config::new(primary_url)
            .replicas(replica_urls.iter().cloned())
            .budget(BUDGET);
        let gate = Gate::connect(config).await?;
        gate.transaction(|tx| Box::pin(tx.batch_execute(SCHEMA)))
            .await?;
        let (monitor, connection) = tokio_postgres::connect(primary_url, NoTls).await?;
        tokio::spawn(connection);
        Ok(Db { gate, monitor })
    }

    pub async fn create_item(&self, title: &str) -> DbResult<(i64, Token)> {
        let title = title.to_owned();
        let (id, token) = self
            .gate
            .transaction(move |tx| {
                Box::pin(async move {
                    let sql = "INSERT INTO items (title) VALUES ($1) RETURNING id";
                    Ok(tx.query_one(sql, &[&title]).await?.get::<_, i64>(0))
                })
            })
            .await?;
        Ok((id, token))
    }

    pub async fn update_item(&self, id: i64, value: &str) -> DbResult<Token> {
        let sql = "UPDATE items SET value = $2 WHERE id = $1";
        Ok(self.gate.write(sql, &[&id, &value]).await?.token)
    }

    pub async fn enqueue(&self, payload: &JobPayload<ItemJob>) -> DbResult<Token> {
        let json = serde_json::to_string(payload)?;
        let sql = "INSERT INTO jobs (payload) VALUES ($1::text::jsonb)";
        Ok(self.gate.write(sql, &[&json]).await?.token)
    }

    pub async fn item(&self, id: i64, token: Option<Token>) -> DbResult<(Option<Item>, Served)> {
        let read = self
            .gate
            .read()
            .after(token)
            .query(ITEM_SQL, &[&id])
            .await?;
        Ok((read.rows.first().map(Item::from_row), served(&read.served)))
    }

    pub async fn items(&self, token: Option<Token>) -> DbResult<(Vec<Item>, Served)> {
        let sql = "SELECT id, title, value FROM items ORDER BY id DESC LIMIT 50";
        let read = self.gate.read().after(token).query(sql, &[]).await?;
        Ok((
            read.rows.iter().map(Item::from_row).collect(),
            served(&read.served),
        ))
    }

    pub async fn jobs(&self) -> DbResult<Vec<JobRow>> {
        let sql = "SELECT id, payload::text, found, served_by, wait_ms FROM jobs ORDER BY id DESC LIMIT 100";
        let rows = self.monitor.query(sql, &[]).await?;
        Ok(rows
            .iter()
            .map(|r| JobRow {
                id: r.get(0),
                payload: r.get(1),
                found: r.get(2),
                served_by: r.get(3),
                wait_ms: r.get(4),
            })
            .collect())
    }
}
