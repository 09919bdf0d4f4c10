//! The demo's data access: items and jobs in PostgreSQL.
//!
//! STAND-IN: until the `lsngate` library's gate lands, this module does the token pattern by hand
//! (token after COMMIT; on the replica `WAIT FOR LSN` on PostgreSQL 19, replay-position polling
//! before; the primary once the budget is spent) with one connection per node. It is replaced by
//! the library's gate without changing the handlers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lsngate_core::{Lsn, Token};
use lsngate_http::JobPayload;
use tokio_postgres::{Client, NoTls};

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

pub struct Db {
    primary: Client,
    replicas: Vec<(String, Client, bool)>,
    next: AtomicUsize,
}

async fn connect(url: &str) -> DbResult<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

impl Db {
    pub async fn connect(primary_url: &str, replica_urls: &[String]) -> DbResult<Db> {
        let primary = connect(primary_url).await?;
        primary.batch_execute(SCHEMA).await?;
        let mut replicas = Vec::new();
        for (index, url) in replica_urls.iter().enumerate() {
            let client = connect(url).await?;
            let version: i32 = client
                .query_one("SELECT current_setting('server_version_num')::int", &[])
                .await?
                .get(0);
            replicas.push((format!("replica{index}"), client, version >= 190000));
        }
        Ok(Db {
            primary,
            replicas,
            next: AtomicUsize::new(0),
        })
    }

    /// The token of everything committed so far on the primary. Read after COMMIT returned.
    async fn commit_token(&self) -> DbResult<Token> {
        let row = self
            .primary
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .await?;
        Ok(Token::new(Lsn::parse(row.get::<_, &str>(0))?))
    }

    pub async fn create_item(&self, title: &str) -> DbResult<(i64, Token)> {
        let row = self
            .primary
            .query_one(
                "INSERT INTO items (title) VALUES ($1) RETURNING id",
                &[&title],
            )
            .await?;
        Ok((row.get(0), self.commit_token().await?))
    }

    pub async fn update_item(&self, id: i64, value: &str) -> DbResult<Token> {
        self.primary
            .execute("UPDATE items SET value = $2 WHERE id = $1", &[&id, &value])
            .await?;
        self.commit_token().await
    }

    pub async fn enqueue(&self, payload: &JobPayload<ItemJob>) -> DbResult<Token> {
        let json = serde_json::to_string(payload)?;
        self.primary
            .execute(
                "INSERT INTO jobs (payload) VALUES ($1::text::jsonb)",
                &[&json],
            )
            .await?;
        self.commit_token().await
    }

    /// A replica that has replayed `token` within the budget, or the primary.
    async fn reader(&self, token: Option<Token>) -> DbResult<(&Client, Served)> {
        let (name, client, has_wait_for) =
            &self.replicas[self.next.fetch_add(1, Ordering::Relaxed) % self.replicas.len()];
        let started = Instant::now();
        let Some(token) = token else {
            return Ok((
                client,
                Served {
                    node: name.clone(),
                    wait: Duration::ZERO,
                    fallback: None,
                },
            ));
        };
        // SQL text from `Lsn`'s Display only: a number, never client text.
        let caught_up = if *has_wait_for {
            let sql = format!(
                "WAIT FOR LSN '{}' WITH (MODE 'standby_replay', TIMEOUT '{}ms', NO_THROW)",
                token.lsn,
                BUDGET.as_millis()
            );
            let messages = client.simple_query(&sql).await?;
            messages.iter().any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(r) if r.get(0) == Some("success")))
        } else {
            let sql = format!(
                "SELECT pg_last_wal_replay_lsn() >= {}",
                token.lsn.to_sql_literal()
            );
            loop {
                if client.query_one(&sql, &[]).await?.get::<_, Option<bool>>(0) == Some(true) {
                    break true;
                }
                if started.elapsed() > BUDGET {
                    break false;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        let wait = started.elapsed();
        Ok(if caught_up {
            (
                client,
                Served {
                    node: name.clone(),
                    wait,
                    fallback: None,
                },
            )
        } else {
            (
                &self.primary,
                Served {
                    node: "primary".into(),
                    wait,
                    fallback: Some("budget spent".into()),
                },
            )
        })
    }

    pub async fn item(&self, id: i64, token: Option<Token>) -> DbResult<(Option<Item>, Served)> {
        let (client, served) = self.reader(token).await?;
        let row = client
            .query_opt("SELECT id, title, value FROM items WHERE id = $1", &[&id])
            .await?;
        Ok((
            row.map(|r| Item {
                id: r.get(0),
                title: r.get(1),
                value: r.get(2),
            }),
            served,
        ))
    }

    pub async fn items(&self, token: Option<Token>) -> DbResult<(Vec<Item>, Served)> {
        let (client, served) = self.reader(token).await?;
        let rows = client
            .query(
                "SELECT id, title, value FROM items ORDER BY id DESC LIMIT 50",
                &[],
            )
            .await?;
        let items = rows
            .iter()
            .map(|r| Item {
                id: r.get(0),
                title: r.get(1),
                value: r.get(2),
            })
            .collect();
        Ok((items, served))
    }

    pub async fn jobs(&self) -> DbResult<Vec<JobRow>> {
        let rows = self.primary.query("SELECT id, payload::text, found, served_by, wait_ms FROM jobs ORDER BY id DESC LIMIT 100", &[]).await?;
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
