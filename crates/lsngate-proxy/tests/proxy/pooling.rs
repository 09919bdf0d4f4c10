//! Pooling limits: idle server connections are closed after `server_idle_timeout_ms`, and
//! connections older than `server_lifetime_ms` are replaced instead of reused — seen from the
//! servers (pg_stat_activity) and from the proxy's /status, with queries working afterwards.
//! And the pass-through path (simple queries forwarded as they came) behaves like the general
//! one when clients with different settings share one server connection.

use std::time::Duration;

use crate::support::*;
use lsngate_cluster::{Node, shared_cluster};

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

#[test]
fn passed_through_queries_keep_each_clients_settings_errors_and_cancels() {
    let cluster = shared_cluster();
    let mut file = file_config(cluster);
    // Eventual consistency and no replica: reads and writes alike may be passed through.
    file.replicas = Vec::new();
    file.consistency = Some("eventual".into());
    file.pool_size = Some(1);
    // A breaker quick to open: reads no replica could serve must still not count as fallbacks.
    file.breaker_min_reads = Some(5);
    let proxy = TestProxy::with(file);
    let t = unique("passthrough");
    let before = passed_through(&proxy);
    let runtime = rt();
    runtime.block_on(async {
        // Two clients with different settings take turns on the one server connection.
        let alpha = connect(&format!("{} application_name=alpha_{t}", proxy.conninfo())).await;
        let beta = connect(&format!(
            "{} application_name=beta_{t} options='-c work_mem=8MB'",
            proxy.conninfo()
        ))
        .await;
        let setting = |messages: Vec<tokio_postgres::SimpleQueryMessage>| {
            messages
                .iter()
                .find_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(row) => {
                        Some(row.get(0).unwrap().to_string())
                    }
                    _ => None,
                })
                .expect("a row")
        };
        let show =
            "SELECT current_setting('application_name') || ' ' || current_setting('work_mem')";
        for _ in 0..3 {
            let a = setting(alpha.simple_query(show).await.unwrap());
            let b = setting(beta.simple_query(show).await.unwrap());
            assert_eq!(a, format!("alpha_{t} 4MB"));
            assert_eq!(b, format!("beta_{t} 8MB"));
        }
        // Writes, a multi-statement string, reads of them.
        alpha
            .simple_query(&format!("CREATE TABLE {t} (id int)"))
            .await
            .unwrap();
        alpha
            .simple_query(&format!(
                "INSERT INTO {t} VALUES (1); INSERT INTO {t} VALUES (2)"
            ))
            .await
            .unwrap();
        let count = format!("SELECT count(*) FROM {t}");
        assert_eq!(setting(beta.simple_query(&count).await.unwrap()), "2");
        // One client in a row: its settings are on the connection, nothing to add.
        for _ in 0..10 {
            assert_eq!(setting(beta.simple_query(&count).await.unwrap()), "2");
        }
        // An error ends that statement only.
        let e = alpha
            .simple_query("SELECT * FROM no_such_table_here")
            .await
            .unwrap_err();
        assert_eq!(e.code().unwrap().code(), "42P01");
        assert_eq!(setting(alpha.simple_query(&count).await.unwrap()), "2");
        // A transaction block still holds its server connection to the end.
        alpha.simple_query("BEGIN").await.unwrap();
        alpha
            .simple_query(&format!("INSERT INTO {t} VALUES (3)"))
            .await
            .unwrap();
        alpha.simple_query("COMMIT").await.unwrap();
        assert_eq!(setting(beta.simple_query(&count).await.unwrap()), "3");
        // A cancel reaches a passed-through statement.
        let cancel = alpha.cancel_token();
        let marker = unique("cancel_me");
        let (running, nodes) = (marker.clone(), vec![cluster.primary().clone()]);
        let sleeper = tokio::spawn(async move {
            tokio::task::spawn_blocking(move || wait_running(&nodes, &running))
                .await
                .unwrap();
            cancel.cancel_query(tokio_postgres::NoTls).await.unwrap();
        });
        let e = alpha
            .simple_query(&format!("SELECT pg_sleep(30) AS {marker}"))
            .await
            .unwrap_err();
        assert_eq!(e.code().unwrap().code(), "57014", "{e}");
        sleeper.await.unwrap();
        assert_eq!(setting(alpha.simple_query(&count).await.unwrap()), "3");
    });
    let passed = passed_through(&proxy) - before;
    assert!(
        passed >= 10,
        "most of these statements should have been passed through, were {passed}"
    );
    let response = proxy.http_get("/status");
    let status: serde_json::Value =
        serde_json::from_str(response.split("\r\n\r\n").nth(1).expect("HTTP body")).unwrap();
    let causal = &status["causal"];
    assert!(
        causal["outcomes"]["no_replica"].as_u64().unwrap() >= 10,
        "{causal}"
    );
    assert_eq!(
        causal["breaker"]["open"], false,
        "a primary-only proxy has no fallbacks to break: {causal}"
    );
}

/// Found by reading the pass-through against the general path (2026-12-06): a write passed
/// through was not marked as a statement that may commit, so its server's FATAL (57P01 from a
/// fast shutdown or `pg_terminate_backend`; in synchronous mode a commit waiting for its
/// standby is ended so after committing locally) reached the client as "terminating
/// connection", which reads as "not done". It may have committed: the client hears 08006,
/// outcome unknown, as it does for the same write on the general path.
#[test]
fn a_passed_through_write_ended_by_its_servers_fatal_is_an_unknown_outcome() {
    let cluster = shared_cluster();
    let mut file = file_config(cluster);
    file.replicas = Vec::new();
    file.consistency = Some("eventual".into());
    file.pool_size = Some(1);
    let proxy = TestProxy::with(file);
    let t = unique("fatal_write");
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        client
            .batch_execute(&format!("CREATE TABLE {t} (id int)"))
            .await
            .unwrap();
        let marker = format!("INSERT INTO {t} SELECT 1 FROM pg_sleep(3)");
        let killer = terminate_when_running(&marker);
        let before = passed_through(&proxy);
        let e = client.simple_query(&marker).await.unwrap_err();
        assert!(
            killer.join().unwrap(),
            "the backend was found and terminated"
        );
        assert_eq!(
            passed_through(&proxy),
            before + 1,
            "the insert took the pass-through"
        );
        let db = e.as_db_error().expect("an error the proxy answered");
        assert_eq!(db.code().code(), "08006", "{db:?}");
        assert!(
            db.message().contains("57P01") && db.message().contains("outcome is unknown"),
            "{db:?}"
        );
        // The session goes on, on another server connection.
        client
            .batch_execute(&format!("INSERT INTO {t} VALUES (2)"))
            .await
            .unwrap();
    });
}

#[test]
fn a_full_pool_queues_checkouts_and_times_them_out_without_losing_a_slot() {
    let cluster = shared_cluster();
    let mut file = file_config(cluster);
    file.replicas = Vec::new();
    file.consistency = Some("eventual".into());
    file.pool_size = Some(1);
    // Far above the 350 ms the queued checkouts below are staged over, so none of them times
    // out before the commit on a loaded machine (it was 1 s).
    file.acquire_timeout_ms = Some(5000);
    let proxy = TestProxy::with(file);
    let t = unique("fullpool");
    rt().block_on(async {
        let holder = connect(&proxy.conninfo()).await;
        holder
            .batch_execute(&format!("CREATE TABLE {t} (id int)"))
            .await
            .unwrap();
        // The one server connection stays with `holder` while its transaction is open.
        holder.batch_execute("BEGIN").await.unwrap();
        holder
            .batch_execute(&format!("INSERT INTO {t} VALUES (1)"))
            .await
            .unwrap();
        // Queued checkouts are served when the connection comes back: start three, then
        // commit. The simple queries take the pass-through, whose checkout without a future
        // must queue behind the others as theirs does, not take the slot when it comes back.
        let passed_before = passed_through(&proxy);
        let mut queued = Vec::new();
        for extended in [true, false, false] {
            let client = connect(&proxy.conninfo()).await;
            let count = format!("SELECT count(*)::text FROM {t}");
            queued.push(tokio::spawn(async move {
                if extended {
                    client
                        .query_one(&count, &[])
                        .await
                        .map(|r| r.get::<_, String>(0))
                } else {
                    Ok(show(&client, &count).await)
                }
            }));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        holder.batch_execute("COMMIT").await.unwrap();
        for waiter in queued {
            assert_eq!(
                waiter.await.unwrap().unwrap(),
                "1",
                "served after the commit"
            );
        }
        assert!(
            passed_through(&proxy) >= passed_before + 2,
            "the simple queries took the pass-through"
        );
        // A checkout that waits longer than acquire_timeout_ms fails with the fix in the error.
        holder.batch_execute("BEGIN").await.unwrap();
        let late = connect(&proxy.conninfo()).await;
        let e = late.simple_query("SELECT 1").await.unwrap_err();
        let db = e.as_db_error().expect("an error from the proxy");
        assert!(
            db.message().contains("stayed busy") && db.message().contains("raise pool_size"),
            "{db:?}"
        );
        holder.batch_execute("COMMIT").await.unwrap();
        // The timed-out checkout gave nothing away: the same client, and the holder, go on.
        assert_eq!(
            text(&late, &format!("SELECT count(*)::text FROM {t}")).await,
            "1"
        );
        assert_eq!(
            text(&holder, "SELECT 'still one connection'").await,
            "still one connection"
        );
    });
    assert_eq!(
        open_in_proxy(&proxy),
        1,
        "one server connection, as pool_size says"
    );
}
