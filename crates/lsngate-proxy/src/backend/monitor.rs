//! The health and role monitor: on every node, every `health_interval`, ask
//! `SELECT pg_is_in_recovery()` over a dedicated connection. A failed check marks the node down
//! (the router skips it; the next check may bring it back); a replica that answers `false` has
//! been promoted and becomes the primary without a restart. It routes nothing itself.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{NodeState, Role};
use crate::config::NodeUrl;

fn pg_config(url: &NodeUrl, connect_timeout: Duration) -> tokio_postgres::Config {
    let mut config = tokio_postgres::Config::new();
    config
        .host(&url.host)
        .port(url.port)
        .user(&url.user)
        .dbname(&url.database);
    config
        .application_name("lsngate-proxy-monitor")
        .connect_timeout(connect_timeout);
    if let Some(password) = &url.password {
        config.password(password);
    }
    config
}

/// Checks one node once and records the result.
pub async fn check(
    node: &NodeState,
    client: &mut Option<tokio_postgres::Client>,
    timeout: Duration,
) {
    let result = tokio::time::timeout(timeout, check_inner(node, client, timeout)).await;
    let outcome = match result {
        Ok(Ok(in_recovery)) => Ok(if in_recovery {
            Role::Replica
        } else {
            Role::Primary
        }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(format!("health check timed out after {timeout:?}")),
    };
    match outcome {
        Ok(role) => node.set_health(Some(role), None),
        Err(e) => {
            if node.healthy() {
                tracing::warn!(node = %node.url.address(), "node failed its health check: {e}");
            }
            *client = None;
            node.set_health(None, Some(e));
        }
    }
}

async fn check_inner(
    node: &NodeState,
    client: &mut Option<tokio_postgres::Client>,
    timeout: Duration,
) -> Result<bool, String> {
    if client.as_ref().is_none_or(|c| c.is_closed()) {
        let (new_client, connection) = pg_config(&node.url, timeout)
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(|e| describe(&e))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        *client = Some(new_client);
    }
    let row = client
        .as_ref()
        .expect("connected above")
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await
        .map_err(|e| describe(&e))?;
    Ok(row.get(0))
}

/// The error with its causes: tokio-postgres says only "db error" and keeps the server's
/// message (e.g. `FATAL: password authentication failed ...`) in the source.
fn describe(e: &tokio_postgres::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Runs checks on `node` until `shutdown` turns true.
pub async fn watch_node(
    node: Arc<NodeState>,
    interval: Duration,
    timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut client = None;
    loop {
        check(&node, &mut client, timeout).await;
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.changed() => {}
        }
        if *shutdown.borrow() {
            return;
        }
    }
}
