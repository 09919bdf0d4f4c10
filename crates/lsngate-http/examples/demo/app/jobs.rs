//! The demo's job worker: claims one job at a time from the `jobs` table on the primary with
//! `FOR UPDATE SKIP LOCKED` (so several workers never take the same job), reads the item the job
//! names through `lsngate_http::JobContext` (after the payload's token), and records what it
//! found and who served it.

use std::sync::Arc;
use std::time::Duration;

use lsngate_http::{JobContext, JobPayload};
use tokio::sync::watch;
use tokio_postgres::{Client, NoTls};

use super::Demo;
use super::data::{ITEM_SQL, ItemJob, served};

/// Runs until `stop` turns true. Errors are logged and retried after a pause: a worker outlives
/// a restart of its database.
pub async fn run(demo: Arc<Demo>, primary_url: String, mut stop: watch::Receiver<bool>) {
    let mut client = None;
    loop {
        if *stop.borrow() {
            return;
        }
        let worked = match work_one(&demo, &primary_url, &mut client).await {
            Ok(worked) => worked,
            Err(error) => {
                tracing::warn!(%error, "job worker failed; reconnecting");
                client = None;
                false
            }
        };
        if !worked {
            // Idle (or failing): poll again shortly, or stop.
            let _ = tokio::time::timeout(Duration::from_millis(50), stop.changed()).await;
        }
    }
}

/// Claims and runs one job; `false` when the queue was empty.
async fn work_one(
    demo: &Demo,
    primary_url: &str,
    client: &mut Option<Client>,
) -> Result<bool, Box<dyn std::error::Error + Send + Sync>> {
    if client.is_none() {
        let (connected, connection) = tokio_postgres::connect(primary_url, NoTls).await?;
        tokio::spawn(connection);
        *client = Some(connected);
    }
    let client = client.as_mut().expect("connected above");
    let transaction = client.transaction().await?;
    let claimed = transaction
        .query_opt(
            "SELECT id, payload::text FROM jobs WHERE done_at IS NULL ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED",
            &[],
        )
        .await?;
    let Some(row) = claimed else {
        return Ok(false);
    };
    let id: i64 = row.get(0);
    let payload: JobPayload<ItemJob> = serde_json::from_str(row.get::<_, &str>(1))?;
    // The job's first read honours the payload's token: a replica that replayed it (waiting
    // within the budget), else the primary. Without a token it is the naive replica read.
    let job = JobContext::new(&demo.db.gate, payload);
    let read = job.query(ITEM_SQL, &[&job.job().item_id]).await?;
    let (item, served) = (read.rows.first(), served(&read.served));
    transaction
        .execute(
            "UPDATE jobs SET done_at = now(), found = $2, served_by = $3, wait_ms = $4 WHERE id = $1",
            &[&id, &item.is_some(), &served.node, &(served.wait.as_secs_f64() * 1000.0)],
        )
        .await?;
    transaction.commit().await?;
    Ok(true)
}
