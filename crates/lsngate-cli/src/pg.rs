//! Connections for the CLI: libpq URLs in, tokio-postgres clients out, with a connect timeout
//! so a hung server makes a command fail instead of hang.

use std::time::Duration;

use anyhow::Context as _;
use tokio_postgres::{Client, NoTls};

/// Connects to `url` (libpq URL or key/value form) and drives the connection in the background.
pub async fn connect(url: &str) -> anyhow::Result<Client> {
    let mut config: tokio_postgres::Config = url.parse().with_context(|| {
        format!("invalid connection string {url:?}: expected postgres://user@host:port/db")
    })?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(5));
    }
    if config.get_application_name().is_none() {
        config.application_name("lsngate");
    }
    let (client, connection) = tokio::time::timeout(Duration::from_secs(10), config.connect(NoTls))
        .await
        .with_context(|| format!("connecting to {url}: no answer within 10s"))?
        .with_context(|| format!("connecting to {url}"))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("connection closed: {e}");
        }
    });
    Ok(client)
}

/// `server_version_num / 10000`: 19 for 19rc1, 15 for 15.18.
pub async fn server_major(client: &Client) -> anyhow::Result<u32> {
    let row = client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await?;
    Ok(row.get::<_, i32>(0) as u32 / 10000)
}

/// `SHOW server_version`.
pub async fn server_version(client: &Client) -> anyhow::Result<String> {
    let row = client.query_one("SHOW server_version", &[]).await?;
    Ok(row.get(0))
}
