//! Pooling limits: idle server connections are closed after `server_idle_timeout_ms`, and
//! connections older than `server_lifetime_ms` are replaced instead of reused — seen from the
//! servers (pg_stat_activity) and from the proxy's /status, with queries working afterwards.

use std::time::Duration;

use crate::support::*;
use lsngate_testkit::{Node, shared_cluster};

/// How many server connections carry `application_name` on `node`.
fn sessions_named(node: &Node, application_name: &str) -> usize {
    node.sql(&format!(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{application_name}'"
    ))
    .unwrap()
    .parse()
    .unwrap()
}

/// Server connections the proxy counts as open, over every node and pool (from /status).
fn open_in_proxy(proxy: &TestProxy) -> u64 {
    let status = proxy.http_get("/status");
    let body = status.split("\r\n\r\n").nth(1).unwrap();
    let json: serde_json::Value = serde_json::from_str(body).unwrap();
    json["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|n| n["pools"].as_array().unwrap())
        .map(|p| p["open"].as_u64().unwrap())
        .sum()
}

async fn text(client: &tokio_postgres::Client, sql: &str) -> String {
    client.query_one(sql, &[]).await.unwrap().get(0)
}

#[test]
fn idle_server_connections_are_closed_after_the_idle_timeout() {
    let cluster = shared_cluster();
    let mut file = file_config(cluster);
    file.server_idle_timeout_ms = Some(300);
    let proxy = TestProxy::with(file);
    let t = unique("idle");
    cluster
        .primary()
        .sql(&format!("CREATE TABLE {t} (id int)"))
        .unwrap();
    caught_up(cluster);
    // The application_name marks this client's server connections (it is SET on each of them).
    let conninfo = format!("{} application_name={t}", proxy.conninfo());
    let runtime = rt();
    let client = runtime.block_on(async {
        let client = connect(&conninfo).await;
        for i in 0..5 {
            client
                .execute(&format!("INSERT INTO {t} VALUES ($1)"), &[&i])
                .await
                .unwrap();
            text(&client, &format!("SELECT count(*)::text FROM {t}")).await;
        }
        client.batch_execute("BEGIN").await.unwrap();
        text(&client, &format!("SELECT count(*)::text FROM {t}")).await;
        client
    });
    // A connection lent to an open transaction is not idle: it stays.
    assert!(
        sessions_named(cluster.primary(), &t) >= 1,
        "the transaction's server connection is open on the primary"
    );
    runtime.block_on(async { client.batch_execute("COMMIT").await.unwrap() });
    cluster
        .primary()
        .wait_until(
            "the proxy's idle server connections are closed",
            Duration::from_secs(30),
            || Ok(cluster.nodes().all(|node| sessions_named(node, &t) == 0)),
        )
        .unwrap_or_else(|e| panic!("{e}; {}", proxy.http_get("/status")));
    cluster
        .primary()
        .wait_until(
            "the proxy counts no open server connection",
            Duration::from_secs(30),
            || Ok(open_in_proxy(&proxy) == 0),
        )
        .unwrap_or_else(|e| panic!("{e}; {}", proxy.http_get("/status")));
    // The same client goes on, on fresh server connections.
    runtime.block_on(async {
        client
            .execute(&format!("INSERT INTO {t} VALUES (5)"), &[])
            .await
            .unwrap();
        client.batch_execute("BEGIN").await.unwrap();
        assert_eq!(
            text(&client, &format!("SELECT count(*)::text FROM {t}")).await,
            "6"
        );
        client.batch_execute("COMMIT").await.unwrap();
    });
}

#[test]
fn server_connections_older_than_the_lifetime_are_replaced() {
    let cluster = shared_cluster();
    let mut file = file_config(cluster);
    file.pool_size = Some(1);
    file.server_lifetime_ms = Some(500);
    let proxy = TestProxy::with(file);
    let pid_sql = "/* lsngate:route=primary */ SELECT pg_backend_pid()::text";
    let (first, replaced_by) = rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        let first = text(&client, pid_sql).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let pid = text(&client, pid_sql).await;
            if pid != first {
                return (first, pid);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "server connection {first} was still reused 30 s after its 500 ms lifetime"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    assert_ne!(first, replaced_by);
    cluster
        .primary()
        .wait_until(
            "the expired server connection is gone",
            Duration::from_secs(30),
            || {
                Ok(cluster.primary().sql(&format!(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = {first}"
                ))? == "0")
            },
        )
        .unwrap();
}
