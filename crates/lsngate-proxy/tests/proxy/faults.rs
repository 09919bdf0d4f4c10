//! Faults: a backend dying mid-query, a replica down, a promoted replica becoming the primary.

use std::time::{Duration, Instant};

use crate::support::*;
use lsngate_testkit::{Cluster, ClusterConfig, shared_cluster};

#[test]
fn a_backend_dying_mid_statement_gives_an_error_and_nothing_is_replayed() {
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    let t = unique("dies");
    cluster
        .primary()
        .sql(&format!("CREATE TABLE {t} (id int)"))
        .unwrap();
    // The application_name marks this proxy's server connections (settings are applied there).
    let conninfo = format!("{} application_name=lsngate_dying", proxy.conninfo());
    rt().block_on(async {
        let client = connect(&conninfo).await;
        let marker = format!("INSERT INTO {t} SELECT 1 FROM pg_sleep(3)");
        let killer = {
            let primary_sql = format!(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query = '{marker}' AND pid <> pg_backend_pid()"
            );
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(10);
                while Instant::now() < deadline {
                    if shared_cluster().primary().sql(&primary_sql).unwrap() == "1" {
                        return true;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                false
            })
        };
        let err = client.batch_execute(&marker).await.unwrap_err();
        assert!(killer.join().unwrap(), "the backend was found and terminated");
        let text = format!("{err:?}");
        assert!(text.contains("terminat") || text.contains("lost the server connection"), "{text}");
        // The session goes on with a fresh backend.
        client.batch_execute(&format!("INSERT INTO {t} VALUES (2)")).await.unwrap();
    });
    // The session went on past the killed insert, so a replay of it would have been sent by
    // now: it would be running (pg_sleep(3)) or done (its row). Neither may be seen (this was
    // a 3 s sleep, then the row check alone).
    let replaying = format!(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE query = 'INSERT INTO {t} SELECT 1 FROM pg_sleep(3)' AND pid <> pg_backend_pid()"
    );
    assert_eq!(
        cluster.primary().sql(&replaying).unwrap(),
        "0",
        "the killed insert is running again"
    );
    assert_eq!(
        cluster
            .primary()
            .sql(&format!("SELECT string_agg(id::text, ',') FROM {t}"))
            .unwrap(),
        "2",
        "the killed insert was not replayed"
    );
    // Idle pooled connections killed behind the proxy's back are noticed before reuse.
    let pids = cluster
        .primary()
        .sql("SELECT string_agg(pid::text, ',') FROM pg_stat_activity WHERE state = 'idle' AND application_name = 'lsngate_dying'")
        .unwrap();
    assert!(
        !pids.is_empty(),
        "there were idle pooled connections to terminate"
    );
    cluster
        .primary()
        .sql(&format!(
            "SELECT count(pg_terminate_backend(pid)) FROM unnest('{{{pids}}}'::int[]) AS pid"
        ))
        .unwrap();
    // Until those backends are gone (this was a 200 ms sleep).
    let left =
        format!("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY ('{{{pids}}}'::int[])");
    cluster
        .primary()
        .wait_until("terminated backends gone", Duration::from_secs(30), || {
            Ok(cluster.primary().sql(&left)? == "0")
        })
        .unwrap();
    // The pool probes a connection before reuse once it has been idle for PROBE_AFTER (1 s;
    // one back for less is taken as is, by design: see backend/pool.rs). Waiting that out is a
    // lower bound, not a guess; the test passed before only because of an unrelated 3 s sleep.
    std::thread::sleep(Duration::from_millis(1500));
    rt().block_on(async {
        let client = connect(&conninfo).await;
        client
            .batch_execute(&format!("INSERT INTO {t} VALUES (3)"))
            .await
            .expect("a fresh connection is used");
    });
}

#[test]
fn a_down_replica_is_skipped_and_a_promoted_replica_becomes_primary() {
    let cluster = Cluster::start(&ClusterConfig::default().replicas(2)).unwrap();
    cluster.wait_streaming(Duration::from_secs(30)).unwrap();
    let proxy = TestProxy::start(&cluster);
    cluster.primary().sql("CREATE TABLE ha (id int)").unwrap();
    cluster.replica(0).kill().unwrap();
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        for _ in 0..10 {
            let row = client
                .query_one("SELECT pg_is_in_recovery()", &[])
                .await
                .unwrap();
            assert!(row.get::<_, bool>(0), "served by the surviving replica");
        }
    });
    // The killed replica comes back and is used again once a health check sees it.
    cluster.replica(0).start().unwrap();
    let port0 = cluster.replica(0).port().to_string();
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let row = client
                .query_one("SELECT inet_server_port()::text", &[])
                .await
                .unwrap();
            if row.get::<_, String>(0) == port0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the restarted replica never served a read again; last served by {}; {}",
                row.get::<_, String>(0),
                proxy.http_get("/status")
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    cluster.primary().stop().unwrap();
    cluster.replica(1).promote().unwrap();
    rt().block_on(async {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let attempt = async {
                let client = connect_checked(&proxy.conninfo()).await?;
                client
                    .batch_execute("INSERT INTO ha VALUES (1)")
                    .await
                    .map_err(|e| e.to_string())
            };
            match attempt.await {
                Ok(()) => break,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("writes never reached the promoted replica: {e}"),
            }
        }
    });
    assert_eq!(
        cluster.replica(1).sql("SELECT count(*) FROM ha").unwrap(),
        "1"
    );
    let status = proxy.http_get("/status");
    assert!(status.contains("\"role\": \"primary\""), "{status}");
}

async fn connect_checked(conninfo: &str) -> Result<tokio_postgres::Client, String> {
    let (client, connection) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

#[test]
fn a_reload_that_changes_the_node_list_applies_without_a_restart() {
    let cluster = Cluster::start(&ClusterConfig::default().replicas(2)).unwrap();
    cluster.wait_streaming(Duration::from_secs(30)).unwrap();
    let mut file = file_config(&cluster);
    file.replicas = vec![cluster.replica_urls()[0].clone()];
    let proxy = TestProxy::with(file.clone());
    let (first, second) = (
        cluster.replica(0).port() as i32,
        cluster.replica(1).port() as i32,
    );
    let ports = |proxy: &TestProxy| {
        rt().block_on(async {
            let client = connect(&proxy.conninfo()).await;
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..20 {
                let row = client
                    .query_one("SELECT inet_server_port()", &[])
                    .await
                    .unwrap();
                seen.insert(row.get::<_, i32>(0));
            }
            seen
        })
    };
    assert_eq!(
        ports(&proxy),
        [first].into(),
        "only the configured replica serves"
    );
    file.replicas = vec![cluster.replica_urls()[1].clone()];
    let mut reloaded = lsngate_proxy::Config::build(file).unwrap();
    reloaded.listen = proxy.addr;
    proxy.proxy.reload(reloaded);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seen = ports(&proxy);
        if seen == [second].into() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "reads never moved to the added replica: {seen:?}; {}",
            proxy.http_get("/status")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = proxy.http_get("/status");
    assert!(
        status.contains(&format!(":{second}\"")) && !status.contains(&format!(":{first}\"")),
        "{status}"
    );
}
