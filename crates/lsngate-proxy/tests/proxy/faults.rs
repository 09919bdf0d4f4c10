//! Faults: a backend dying mid-query, a replica down, a promoted replica becoming the primary.

use std::time::{Duration, Instant};

use crate::support::*;
use lsngate_cluster::{Cluster, ClusterConfig, shared_cluster};

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
        let killer = terminate_when_running(&marker);
        let err = client.batch_execute(&marker).await.unwrap_err();
        assert!(
            killer.join().unwrap(),
            "the backend was found and terminated"
        );
        let text = format!("{err:?}");
        assert!(
            text.contains("terminat") || text.contains("lost the server connection"),
            "{text}"
        );
        // The session goes on with a fresh backend.
        client
            .batch_execute(&format!("INSERT INTO {t} VALUES (2)"))
            .await
            .unwrap();
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

/// A proxy whose replica (or primary) is reached through a fault forwarder, so its network can
/// fail on command; health checks go through the forwarder too.
fn proxy_through(
    cluster: &Cluster,
    forwarded: &lsngate_cluster::Forwarder,
    replica: bool,
    change: impl FnOnce(&mut lsngate_proxy::FileConfig),
) -> TestProxy {
    let mut file = file_config(cluster);
    let via =
        |url: &str, port: u16| url.replace(&format!(":{}/", url_port(url)), &format!(":{port}/"));
    if replica {
        file.replicas = vec![via(&cluster.replica_urls()[0], forwarded.port())];
    } else {
        file.primary = Some(via(&cluster.primary_url(), forwarded.port()));
        file.replicas = Vec::new();
    }
    change(&mut file);
    TestProxy::with(file)
}

fn url_port(url: &str) -> u16 {
    let host_port = url.split('@').nth(1).unwrap().split('/').next().unwrap();
    host_port.rsplit(':').next().unwrap().parse().unwrap()
}

/// Issue #21: a replica killed while reads were opening connections to it gave two of them
/// `08006 connection … lost: Connection reset by peer`. Nothing of a read is sent on a connection
/// that never finished its login, so it runs elsewhere.
#[test]
fn a_replica_that_resets_new_connections_costs_reads_nothing() {
    let cluster = shared_cluster();
    let forwarder = lsngate_cluster::Forwarder::start(cluster.replica(0).port()).unwrap();
    // The monitor checks rarely: the reads meet the fault before it does.
    let proxy = proxy_through(cluster, &forwarder, true, |f| {
        f.health_interval_ms = Some(60_000)
    });
    forwarder.set(lsngate_cluster::Fault::Reset);
    rt().block_on(async {
        for mode in ["eventual", "session"] {
            let client = connect(&format!(
                "{} options='-c lsngate.consistency={mode}'",
                proxy.conninfo()
            ))
            .await;
            for i in 0..5 {
                let row = client
                    .query_one("SELECT pg_is_in_recovery()", &[])
                    .await
                    .unwrap_or_else(|e| panic!("{mode} read {i}: {e:?}"));
                assert!(!row.get::<_, bool>(0), "served by the primary");
            }
        }
    });
}

/// Found by `lsngate verify --faults kill --seed 7`: a read sent to a replica whose connection
/// died as it was attached got `08006 connection … lost`. The proxy first checks, in a round
/// trip of its own, the shape of a prepared statement the connection lacks (`recheck_moved`);
/// that round trip met the dead connection, and its error went to the client although nothing
/// of the read had been sent. The read runs on the primary instead. Here the connection goes
/// silent (a blackhole) rather than dead, which takes the same path every time.
#[test]
fn a_read_whose_replica_connection_failed_before_it_was_sent_runs_on_the_primary() {
    let cluster = shared_cluster();
    let t = unique("recheck");
    cluster
        .primary()
        .sql(&format!("CREATE TABLE {t} (id int)"))
        .unwrap();
    caught_up(cluster);
    let forwarder = lsngate_cluster::Forwarder::start(cluster.replica(0).port()).unwrap();
    // Without a floor (eventual), and with one (session, after a write): a proxy each, whose
    // monitor checks rarely, so the read meets the fault before it does.
    for mode in ["eventual", "session"] {
        let proxy = proxy_through(cluster, &forwarder, true, |f| {
            f.health_interval_ms = Some(60_000);
            f.connect_timeout_ms = Some(1000);
        });
        rt().block_on(async {
            let conninfo = format!(
                "{} options='-c lsngate.consistency={mode}'",
                proxy.conninfo()
            );
            let client = connect(&conninfo).await;
            let row = client
                .query_one("SELECT pg_is_in_recovery()", &[])
                .await
                .unwrap();
            assert!(
                row.get::<_, bool>(0),
                "{mode}: a pooled replica connection, open before the fault"
            );
            // Prepared on the primary: the replica connection lacks it.
            client
                .batch_execute("SET lsngate.route = primary")
                .await
                .unwrap();
            let statement = client
                .prepare(&format!("SELECT pg_is_in_recovery(), count(*) FROM {t}"))
                .await
                .unwrap();
            client.batch_execute("RESET lsngate.route").await.unwrap();
            if mode == "session" {
                client
                    .batch_execute(&format!("INSERT INTO {t} VALUES (1)"))
                    .await
                    .unwrap();
            }
            forwarder.set(lsngate_cluster::Fault::Blackhole);
            let row = client.query_one(&statement, &[]).await;
            forwarder.set(lsngate_cluster::Fault::None);
            let row = row.unwrap_or_else(|e| panic!("{mode}: the read runs elsewhere: {e:?}"));
            assert!(!row.get::<_, bool>(0), "{mode}: served by the primary");
            let expected = i64::from(mode == "session");
            assert_eq!(row.get::<_, i64>(1), expected, "{mode}: its own write seen");
        });
    }
}

/// Issue #21: a read sent to a replica just before its processes got SIGSTOP came back when the
/// freeze ended (12 s later). Once the health check times out the proxy gives up the replica's
/// connections, and the read, nothing of which reached the client, runs on the primary.
#[test]
fn a_read_in_flight_on_a_frozen_replica_runs_on_the_primary() {
    let cluster = Cluster::start(&ClusterConfig::default()).unwrap();
    cluster.wait_streaming(Duration::from_secs(30)).unwrap();
    let mut file = file_config(&cluster);
    file.connect_timeout_ms = Some(1000);
    let proxy = TestProxy::with(file);
    let replica = cluster.replica(0);
    let (done, outcome) = std::sync::mpsc::channel();
    let conninfo = proxy.conninfo();
    std::thread::spawn(move || {
        rt().block_on(async {
            let client = connect(&conninfo).await;
            let read = client
                .query_one(
                    "SELECT pg_is_in_recovery(), pg_sleep(0.3)::text AS frozen_read",
                    &[],
                )
                .await
                .map(|row| row.get::<_, bool>(0));
            let _ = done.send(read);
        })
    });
    // The read is running on the replica when it freezes.
    let running = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%AS frozen_read%' AND pid <> pg_backend_pid()";
    replica
        .wait_until(
            "the read runs on the replica",
            Duration::from_secs(30),
            || Ok(replica.sql(running)? == "1"),
        )
        .unwrap();
    replica.freeze();
    let outcome = outcome.recv_timeout(Duration::from_secs(30));
    replica.thaw();
    let in_recovery = outcome
        .expect("the read hung on the frozen replica")
        .expect("the read succeeds");
    assert!(!in_recovery, "re-run on the primary");
}

/// A statement in flight on a primary that stopped answering (a blackholed network) is given up
/// once the health check times out, and the client is told its outcome is unknown.
#[test]
fn a_write_on_a_primary_that_stopped_answering_is_reported_unknown_not_hung() {
    let cluster = shared_cluster();
    let t = unique("unknown");
    cluster
        .primary()
        .sql(&format!("CREATE TABLE {t} (id int)"))
        .unwrap();
    let forwarder = lsngate_cluster::Forwarder::start(cluster.primary().port()).unwrap();
    let proxy = proxy_through(cluster, &forwarder, false, |f| {
        f.connect_timeout_ms = Some(1000)
    });
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        client.batch_execute("SELECT 1").await.unwrap();
        forwarder.set(lsngate_cluster::Fault::Blackhole);
        let insert = format!("INSERT INTO {t} VALUES (1)");
        let outcome = tokio::time::timeout(Duration::from_secs(30), client.batch_execute(&insert))
            .await
            .expect("the write hung on the unanswering primary");
        let text = format!(
            "{:?}",
            outcome.expect_err("the write cannot have succeeded")
        );
        assert!(
            text.contains("08006") && text.contains("outcome is unknown"),
            "{text}"
        );
    });
    drop(forwarder);
}

/// Issue #21: psycopg raised `received 2 results from command 'BEGIN'` when the primary died.
/// A server that ends a connection sends FATAL first (relayed as ERROR); the loss noticed right
/// after must not answer the same statement with a second error.
#[test]
fn a_statement_whose_server_sent_fatal_gets_one_error_not_two() {
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    let marker = "SELECT pg_sleep(5) AS terminated_once";
    let killer = std::thread::spawn(move || {
        let sql = format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query = '{marker}'"
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if shared_cluster().primary().sql(&sql).unwrap() == "1" {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    });
    let mut wire = crate::statements::Wire::connect(&proxy);
    let route = "SET lsngate.route = 'primary'";
    wire.flight(&[lsngate_proxy::net::FrontendMessage::Query(route.into())]);
    let reply = wire.flight(&[lsngate_proxy::net::FrontendMessage::Query(marker.into())]);
    assert!(killer.join().unwrap(), "the backend was terminated");
    assert_eq!(reply.errors.len(), 1, "one statement, one error: {reply:?}");
    assert!(
        reply.errors[0].contains("terminating connection"),
        "the server's own reason: {reply:?}"
    );
    let reply = wire.flight(&[lsngate_proxy::net::FrontendMessage::Query(
        "SELECT 1".into(),
    )]);
    assert_eq!(reply.rows, vec![vec![Some("1".to_string())]], "{reply:?}");
}

/// A one-replica cluster with a fresh table `t (id int PRIMARY KEY)`, replayed, and a proxy
/// (in `mode`, else its default; 200 ms wait budget) that reaches the primary through a fault
/// forwarder: the monitor's polls are spared, only clients' connections meet its faults.
fn primary_behind_a_forwarder(
    prefix: &str,
    mode: Option<&str>,
) -> (Cluster, lsngate_cluster::Forwarder, TestProxy, String) {
    let cluster = Cluster::start(&ClusterConfig::default()).unwrap();
    cluster.wait_streaming(Duration::from_secs(30)).unwrap();
    let t = unique(prefix);
    cluster
        .primary()
        .sql(&format!("CREATE TABLE {t} (id int PRIMARY KEY)"))
        .unwrap();
    caught_up(&cluster);
    let forwarder = lsngate_cluster::Forwarder::start(cluster.primary().port()).unwrap();
    forwarder.spare("lsngate-proxy-monitor");
    let mut file = file_config(&cluster);
    file.primary = Some(format!(
        "postgres://postgres@127.0.0.1:{}/postgres",
        forwarder.port()
    ));
    file.consistency = mode.map(str::to_string);
    file.wait_timeout_ms = Some(200);
    let proxy = TestProxy::with(file);
    (cluster, forwarder, proxy, t)
}

/// `attempt` again every 100 ms until it succeeds, for at most 30 s: once a fault is healed, the
/// proxy's next connection to the primary answers.
async fn once_answered<T, F>(what: &str, mut attempt: impl FnMut() -> F) -> T
where
    F: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match attempt().await {
            Ok(answer) => return answer,
            Err(e) => {
                assert!(Instant::now() < deadline, "{what} never succeeded: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Issue #21, suspected from reading `backend_lost`: a commit whose own replies arrived, and
/// only its position was lost with the primary, released its ReadyForQuery without raising the
/// client's floor; with the primary unreachable to ask again, the next read went to a replica
/// that lacked the acknowledged write. Such a read must see the write or fail, never miss it.
#[test]
fn a_commit_whose_position_was_lost_with_the_primary_is_never_read_stale() {
    let (cluster, forwarder, proxy, t) = primary_behind_a_forwarder("lostpos", None);
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        client
            .batch_execute(&format!("INSERT INTO {t} VALUES (1)"))
            .await
            .unwrap();
        caught_up(&cluster);
        cluster.replica(0).pause_replay().unwrap();
        // The INSERT's CommandComplete and ReadyForQuery pass, its position does not, and the
        // primary can then not be reached at all.
        forwarder.set(lsngate_cluster::Fault::CutAfterReady);
        client
            .batch_execute(&format!("INSERT INTO {t} VALUES (2)"))
            .await
            .expect("the insert's own replies arrived: it is acknowledged");
        let read = format!("SELECT count(*) FROM {t} WHERE id = 2");
        match client.query_one(&read, &[]).await {
            Ok(row) => assert_eq!(row.get::<_, i64>(0), 1, "an acknowledged write was missed"),
            Err(e) => println!("read while the primary is unreachable: {e}"),
        }
        forwarder.set(lsngate_cluster::Fault::None);
        let row = once_answered("the read", || client.query_one(&read, &[])).await;
        assert_eq!(row.get::<_, i64>(0), 1, "an acknowledged write was missed");
    });
    cluster.replica(0).resume_replay().unwrap();
}

/// Found by `lsngate verify --mode global` (16 clients on 2 keys, a fault every second, seed
/// 20261206300 on 19: 1,974 violations in one run, not replayed since), then read in the code: a
/// commit whose position was lost with the primary made only its own client's reads go to the
/// primary. In `global` every client's read is owed every write acknowledged through the proxy
/// before it began, and the proxy-wide floor the other clients read after did not include that
/// commit, so another client read a replica that lacked it. Such a read must see the write or
/// fail, never miss it.
#[test]
fn in_global_mode_a_commit_whose_position_was_lost_is_never_read_stale_by_another_client() {
    let (cluster, forwarder, proxy, t) = primary_behind_a_forwarder("lostglobal", Some("global"));
    rt().block_on(async {
        let writer = connect(&proxy.conninfo()).await;
        let reader = connect(&proxy.conninfo()).await;
        writer
            .batch_execute(&format!("INSERT INTO {t} VALUES (1)"))
            .await
            .unwrap();
        caught_up(&cluster);
        let read = format!("SELECT count(*) FROM {t} WHERE id = 2");
        // The reader has read once on the replica: its next read needs nothing new of its own.
        let row = reader.query_one(&read, &[]).await.unwrap();
        assert_eq!(row.get::<_, i64>(0), 0);
        cluster.replica(0).pause_replay().unwrap();
        forwarder.set(lsngate_cluster::Fault::CutAfterReady);
        writer
            .batch_execute(&format!("INSERT INTO {t} VALUES (2)"))
            .await
            .expect("the insert's own replies arrived: it is acknowledged");
        match reader.query_one(&read, &[]).await {
            Ok(row) => assert_eq!(
                row.get::<_, i64>(0),
                1,
                "another client missed a write acknowledged before its read began"
            ),
            Err(e) => println!("read while the primary is unreachable: {e}"),
        }
        forwarder.set(lsngate_cluster::Fault::None);
        let row = once_answered("the read", || reader.query_one(&read, &[])).await;
        assert_eq!(
            row.get::<_, i64>(0),
            1,
            "another client missed a write acknowledged before its read began"
        );
    });
    cluster.replica(0).resume_replay().unwrap();
}

/// Read in the code after the global-mode finding above: after a commit whose position was lost
/// with the primary, `SHOW lsngate.commit_lsn` answered the client's *previous* commit's position,
/// a token that does not cover the commit just made. Handed to another connection, it let that
/// connection read a replica that lacked the write. The answer must be a position past the
/// commit, or an error saying it is unknown.
#[test]
fn after_a_commit_whose_position_was_lost_commit_lsn_never_names_the_previous_commit() {
    let (cluster, forwarder, proxy, t) = primary_behind_a_forwarder("losttoken", Some("token"));
    rt().block_on(async {
        let writer = connect(&proxy.conninfo()).await;
        writer
            .batch_execute(&format!("INSERT INTO {t} VALUES (1)"))
            .await
            .unwrap();
        let first = show(&writer, "SHOW lsngate.commit_lsn").await;
        caught_up(&cluster);
        cluster.replica(0).pause_replay().unwrap();
        forwarder.set(lsngate_cluster::Fault::CutAfterReady);
        writer
            .batch_execute(&format!("INSERT INTO {t} VALUES (2)"))
            .await
            .expect("the insert's own replies arrived: it is acknowledged");
        match writer.simple_query("SHOW lsngate.commit_lsn").await {
            Ok(messages) => assert_ne!(
                first_value(&messages),
                first,
                "the previous commit's position stands for a commit past it"
            ),
            Err(e) => println!("commit_lsn while the primary is unreachable: {e}"),
        }
        forwarder.set(lsngate_cluster::Fault::None);
        let token = first_value(
            &once_answered("commit_lsn", || {
                writer.simple_query("SHOW lsngate.commit_lsn")
            })
            .await,
        );
        assert_ne!(
            token, first,
            "the previous commit's position stands for a commit past it"
        );
        // Another connection reading after the token sees the write (the replica, paused
        // before it, cannot serve the read).
        let reader = connect(&proxy.conninfo()).await;
        reader
            .batch_execute(&format!("SET lsngate.min_lsn = '{token}'"))
            .await
            .unwrap();
        let row = reader
            .query_one(&format!("SELECT count(*) FROM {t} WHERE id = 2"), &[])
            .await
            .unwrap();
        assert_eq!(
            row.get::<_, i64>(0),
            1,
            "a read after the token missed the write"
        );
    });
    cluster.replica(0).resume_replay().unwrap();
}

/// The same hole as the SHOW above, through ParameterStatus: drivers keep the last
/// `lsngate.commit_lsn` the proxy reported (psycopg's `info.parameter_status`), and after a
/// commit whose position was lost the proxy reported nothing, so the driver still held the
/// previous commit's position. The commit's own replies now carry an empty `lsngate.commit_lsn`
/// and `lsngate.commit_token` (unknown), and the position once it is known.
#[test]
fn after_a_commit_whose_position_was_lost_the_reported_commit_lsn_is_cleared() {
    use crate::statements::Wire;
    use lsngate_proxy::net::FrontendMessage;
    let (cluster, forwarder, proxy, t) = primary_behind_a_forwarder("lostreport", Some("token"));
    let mut wire = Wire::connect(&proxy);
    let insert = |id: i32| {
        [FrontendMessage::Query(format!(
            "INSERT INTO {t} VALUES ({id})"
        ))]
    };
    let reported = |reply: &crate::statements::Reply, name: &str| {
        reply
            .parameters
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let first = wire.flight(&insert(1));
    assert!(first.errors.is_empty(), "{first:?}");
    let first_lsn = reported(&first, "lsngate.commit_lsn").expect("a commit position reported");
    caught_up(&cluster);
    forwarder.set(lsngate_cluster::Fault::CutAfterReady);
    let lost = wire.flight(&insert(2));
    assert!(
        lost.errors.is_empty(),
        "the insert is acknowledged: {lost:?}"
    );
    assert_eq!(
        reported(&lost, "lsngate.commit_lsn").as_deref(),
        Some(""),
        "the previous commit's position ({first_lsn}) must not stand for this commit: {lost:?}"
    );
    assert_eq!(reported(&lost, "lsngate.commit_token").as_deref(), Some(""));
    forwarder.set(lsngate_cluster::Fault::None);
    let shown = wire.flight(&[FrontendMessage::Query("SHOW lsngate.commit_lsn".into())]);
    if shown.errors.is_empty() {
        let known = reported(&shown, "lsngate.commit_lsn").expect("the position, once known");
        assert_eq!(shown.rows, vec![vec![Some(known.clone())]]);
        assert_ne!(known, first_lsn);
    }
}

/// The three lost-position fixes above, through psycopg 3, a driver nobody here wrote (checked by
/// hand on 2026-12-06 before it was kept here): after a commit whose position was lost, the
/// driver's `parameter_status` holds empty values, not the previous commit's; `SHOW` refuses with
/// 55000 while the primary is unreachable; once healed, the position shown and reported covers
/// the commit (another connection reading after it sees the row with the replica paused before
/// it); an empty `lsngate.min_lsn` is refused with 22023.
#[test]
fn psycopg_never_holds_the_previous_commit_position_after_one_was_lost() {
    use std::io::{BufRead, Write};
    use std::process::{Command, Stdio};
    let (cluster, forwarder, proxy, t) = primary_behind_a_forwarder("lostpsycopg", Some("token"));
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("clients")
        .join("lost_position_psycopg.py");
    let mut child = Command::new("python3")
        .arg(script)
        .args([&proxy.url(), &t])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut stdin = child.stdin.take().unwrap();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let (lines, said) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let mut next = || match said.recv_timeout(Duration::from_secs(60)) {
        Ok(line) => line,
        Err(e) => {
            let _ = child.kill();
            panic!("the psycopg script said nothing more within 60 s ({e}); its stderr is above");
        }
    };
    let first = next();
    let first = first.strip_prefix("first ").expect(&first).to_string();
    assert!(
        first.contains('/'),
        "a commit position after INSERT 1: {first:?}"
    );
    caught_up(&cluster);
    cluster.replica(0).pause_replay().unwrap();
    forwarder.set(lsngate_cluster::Fault::CutAfterReady);
    writeln!(stdin, "cut").unwrap();
    assert_eq!(
        next(),
        "lost '' ''",
        "psycopg must hold no commit position for the commit whose position was lost"
    );
    let shown = next();
    if let Some(value) = shown
        .strip_prefix("show ")
        .filter(|_| !shown.starts_with("show refused"))
    {
        assert_ne!(
            value, first,
            "the previous commit's position stands for a commit past it"
        );
    } else {
        assert_eq!(shown, "show refused 55000");
    }
    forwarder.set(lsngate_cluster::Fault::None);
    writeln!(stdin, "healed").unwrap();
    let known = next();
    let values: Vec<&str> = known.split_whitespace().collect();
    assert_eq!(values.len(), 3, "{known:?}");
    assert_eq!(values[0], "known");
    assert_eq!(
        values[1], values[2],
        "SHOW and ParameterStatus disagree: {known:?}"
    );
    assert_ne!(
        values[1], first,
        "the previous commit's position stands for a commit past it"
    );
    assert_eq!(
        next(),
        "read 1",
        "a read after the healed position missed the row"
    );
    assert_eq!(next(), "empty refused 22023");
    assert!(child.wait().unwrap().success(), "the psycopg script failed");
    cluster.replica(0).resume_replay().unwrap();
}

/// Found while making "nothing was sent" errors 08001: a statement in a transaction block whose
/// server connection died before the statement was sent (the proxy's own round trip to parse a
/// prepared statement the connection lacked met the dead connection) got an error and
/// ReadyForQuery 'T', though the block had died with the connection. A driver believed it was
/// still in the block, and its later statements and COMMIT ran outside any block. Now the
/// client is told the transaction is rolled back and the block ends ('I'), as when the loss comes
/// mid-statement.
#[test]
fn a_block_whose_connection_died_before_its_statement_was_sent_is_told_it_was_rolled_back() {
    use crate::statements::Wire;
    use lsngate_proxy::net::FrontendMessage;
    let cluster = shared_cluster();
    let t = unique("blocklost");
    cluster
        .primary()
        .sql(&format!("CREATE TABLE {t} (id int)"))
        .unwrap();
    let proxy = TestProxy::start(cluster);
    let mut x = Wire::connect(&proxy);
    // `s` is parsed and described on a primary connection, which goes back to the pool.
    let prepared = x.flight(&[
        FrontendMessage::Parse {
            statement: "s".into(),
            query: format!("INSERT INTO {t} VALUES (2)"),
            param_types: vec![],
        },
        FrontendMessage::Describe {
            kind: b'S',
            name: "s".into(),
        },
        FrontendMessage::Sync,
    ]);
    assert!(prepared.errors.is_empty(), "{prepared:?}");
    rt().block_on(async {
        // Another client holds that connection in a block, so x's block gets a new one, which
        // lacks `s`.
        let other = connect(&proxy.conninfo()).await;
        other
            .batch_execute(&format!("BEGIN; INSERT INTO {t} VALUES (0)"))
            .await
            .unwrap();
        let opened = x.flight(&[FrontendMessage::Query(format!(
            "BEGIN; INSERT INTO {t} VALUES (1); SELECT pg_backend_pid()"
        ))]);
        assert!(opened.errors.is_empty(), "{opened:?}");
        assert_eq!(opened.statuses, vec![b'T'], "{opened:?}");
        let pid = opened.rows[0][0].clone().expect("a pid");
        cluster
            .primary()
            .sql(&format!("SELECT pg_terminate_backend({pid})"))
            .unwrap();
        let gone = Instant::now() + Duration::from_secs(30);
        while cluster
            .primary()
            .sql(&format!(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}"
            ))
            .unwrap()
            != "0"
        {
            assert!(Instant::now() < gone, "backend {pid} did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
        let executed = x.flight(&[
            FrontendMessage::Bind {
                portal: String::new(),
                statement: "s".into(),
                rest: bytes::Bytes::from_static(&[0, 0, 0, 0, 0, 0]),
            },
            FrontendMessage::Execute {
                portal: String::new(),
                max_rows: 0,
            },
            FrontendMessage::Sync,
        ]);
        assert_eq!(executed.errors.len(), 1, "{executed:?}");
        assert!(executed.errors[0].contains("rolled back"), "{executed:?}");
        assert_eq!(
            executed.statuses,
            vec![b'I'],
            "the block died with its connection: {executed:?}"
        );
        other.batch_execute("ROLLBACK").await.unwrap();
    });
    assert_eq!(
        cluster
            .primary()
            .sql(&format!("SELECT count(*) FROM {t}"))
            .unwrap(),
        "0",
        "nothing of either block was committed"
    );
}

/// A pipeline that commits its block among its statements (`INSERT`, `COMMIT`, `SELECT
/// pg_sleep(3)`, one Sync) and loses its server connection (closed, no FATAL) after the COMMIT:
/// the rows are committed, so the client must hear the outcome is unknown, never "the open
/// transaction is rolled back". A guard for the rule that says which flights inside a block
/// may commit (`flight::may_end_block`, rewritten for CI's seed 20261394).
#[test]
fn a_block_whose_pipeline_commits_it_and_then_loses_the_connection_is_an_unknown_outcome() {
    use lsngate_proxy::net::FrontendMessage;
    let cluster = shared_cluster();
    let (t, forwarder, _proxy, mut x) = client_through_forwarder(cluster, "commitlost");
    for sql in ["BEGIN".to_string(), format!("INSERT INTO {t} VALUES (0)")] {
        let opened = x.flight(&[FrontendMessage::Query(sql)]);
        assert_eq!(opened.statuses, vec![b'T'], "{opened:?}");
    }
    let sleep = format!("SELECT pg_sleep(3) AS after_{t}");
    let pipeline = extended(&[
        format!("INSERT INTO {t} VALUES (1)"),
        "COMMIT".into(),
        sleep.clone(),
    ]);
    // Every relayed connection is closed while it sleeps: the proxy loses the block's
    // connection mid-pipeline.
    let lost = lose_while_sleeping(cluster, forwarder, &sleep, move || x.flight(&pipeline));
    assert_eq!(lost.errors.len(), 1, "{lost:?}");
    assert!(
        lost.errors[0].contains("outcome is unknown"),
        "the COMMIT ran before the connection was lost: {lost:?}"
    );
    assert_eq!(
        cluster
            .primary()
            .sql(&format!("SELECT count(*) FROM {t}"))
            .unwrap(),
        "2",
        "the block was committed"
    );
}

/// The other side of the rule above: once the flight that may have ended the block is
/// answered and the client is in a block again (`INSERT …; COMMIT; BEGIN`), a statement of the
/// new block lost with its connection is reported as rolled back, not as an unknown outcome.
/// Before, the flag saying "a flight here may commit" was reset only where the last reply of a
/// flight was handled on the slow path, not where it was relayed as is.
#[test]
fn a_statement_of_a_block_opened_after_a_commit_lost_with_its_connection_is_rolled_back() {
    let cluster = shared_cluster();
    let (t, forwarder, _proxy, mut x) = client_through_forwarder(cluster, "newblock");
    let opened = x.flight(&extended(&["BEGIN".into()]));
    assert_eq!(opened.statuses, vec![b'T'], "{opened:?}");
    let again = x.flight(&[lsngate_proxy::net::FrontendMessage::Query(format!(
        "INSERT INTO {t} VALUES (1); COMMIT; BEGIN"
    ))]);
    assert_eq!(again.statuses, vec![b'T'], "{again:?}");
    let sleep = format!("SELECT pg_sleep(3) AS after_{t}");
    let pipeline = extended(&[format!("INSERT INTO {t} VALUES (2)"), sleep.clone()]);
    let lost = lose_while_sleeping(cluster, forwarder, &sleep, move || x.flight(&pipeline));
    assert_eq!(lost.errors.len(), 1, "{lost:?}");
    assert!(
        lost.errors[0].contains("rolled back"),
        "nothing of the new block could commit: {lost:?}"
    );
    assert_eq!(
        cluster
            .primary()
            .sql(&format!("SELECT count(*) FROM {t}"))
            .unwrap(),
        "1",
        "the first block committed, the second did not"
    );
}

/// A table of its own (`id int`), and a client of a proxy that reaches the primary through a
/// forwarder (dropping it closes every relayed connection).
fn client_through_forwarder(
    cluster: &Cluster,
    prefix: &str,
) -> (
    String,
    lsngate_cluster::Forwarder,
    TestProxy,
    crate::statements::Wire,
) {
    let t = unique(prefix);
    cluster
        .primary()
        .sql(&format!("CREATE TABLE {t} (id int)"))
        .unwrap();
    let forwarder = lsngate_cluster::Forwarder::start(cluster.primary().port()).unwrap();
    let proxy = proxy_through(cluster, &forwarder, false, |_| {});
    let x = crate::statements::Wire::connect(&proxy);
    (t, forwarder, proxy, x)
}

/// Each statement as Parse "", Bind, Execute, then one Sync.
fn extended(statements: &[String]) -> Vec<lsngate_proxy::net::FrontendMessage> {
    use lsngate_proxy::net::FrontendMessage;
    let mut pipeline = Vec::new();
    for sql in statements {
        pipeline.extend(crate::statements::run_unnamed(sql));
    }
    pipeline.push(FrontendMessage::Sync);
    pipeline
}

/// Runs `send` (a client's flight ending in `sleep`) and, once the primary shows `sleep`
/// sleeping, closes every connection `forwarder` relays; the client's reply.
fn lose_while_sleeping<R: Send + 'static>(
    cluster: &Cluster,
    forwarder: lsngate_cluster::Forwarder,
    sleep: &str,
    send: impl FnOnce() -> R + Send + 'static,
) -> R {
    let sleeping = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE query = '{sleep}' AND wait_event = 'PgSleep'"
    );
    let client = std::thread::spawn(send);
    let primary = cluster.primary();
    primary
        .wait_until("the flight sleeps", Duration::from_secs(30), || {
            Ok(primary.sql(&sleeping)? == "1")
        })
        .unwrap();
    drop(forwarder);
    client.join().unwrap()
}

/// A write that found no server connection (the primary refusing connections) was never sent,
/// and the client is told so with its own code: 08001 and "not sent", where a write lost
/// mid-statement gets 08006 and "outcome unknown" (before, both got 08006, so an application
/// could not tell a write it may safely run again from one it must check first).
#[test]
fn a_write_that_could_not_reach_the_primary_is_reported_not_sent() {
    let cluster = shared_cluster();
    let t = unique("notsent");
    cluster
        .primary()
        .sql(&format!("CREATE TABLE {t} (id int)"))
        .unwrap();
    let forwarder = lsngate_cluster::Forwarder::start(cluster.primary().port()).unwrap();
    // Every server connection is closed when it goes back to the pool, so the write needs a
    // new one (the login's was opened while the primary still took connections).
    let proxy = proxy_through(cluster, &forwarder, false, |f| {
        f.connect_timeout_ms = Some(1000);
        f.server_lifetime_ms = Some(1);
    });
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        // The pool's clock is the coarse one (a tick of a few milliseconds): a connection given
        // back within the tick it opened in is not yet past a 1 ms lifetime, and the write
        // reused the login's (CI, 2026-12-05, on a fast machine). Past a few ticks, the checkout
        // closes it.
        tokio::time::sleep(Duration::from_millis(50)).await;
        forwarder.set(lsngate_cluster::Fault::Reset);
        let insert = format!("INSERT INTO {t} VALUES (1)");
        let refused = client
            .batch_execute(&insert)
            .await
            .expect_err("no server connection can be had");
        let db = refused.as_db_error().expect("an error from the proxy");
        assert_eq!(db.code().code(), "08001", "{db:?}");
        assert!(db.message().contains("not sent"), "{db:?}");
        forwarder.set(lsngate_cluster::Fault::None);
    });
    assert_eq!(
        cluster
            .primary()
            .sql(&format!("SELECT count(*) FROM {t}"))
            .unwrap(),
        "0"
    );
    drop(forwarder);
}

/// A replica address that starts reaching another server (a load balancer or virtual IP moved)
/// while the node's monitor and a pooled connection still reach the old one: the session's last
/// read ran on the old server, and its next read gets a connection to the new one through the
/// same node. No position is taken behind a replica read, so the proxy must see, on the
/// connection itself, that the server changed, and take the primary's position as the floor
/// first. Here the new server is 2 s behind the old one and a writer counts up: no read may show
/// a lower count than the reads before the move. (Another client holds the connection to the
/// old server in a read-only block, and a third makes the pool open one to the new server.)
#[test]
fn a_replica_address_that_moves_to_a_server_behind_gives_no_read_that_goes_back() {
    let (cluster, counter) = Counter::on_two_replicas(Duration::from_secs(2));
    let forwarder = lsngate_cluster::Forwarder::start(cluster.replica(1).port()).unwrap();
    // The address is the proxy's only replica; its monitor does not look again during the run.
    let mut file = file_config(&cluster);
    let replica1 = &cluster.replica_urls()[1];
    file.replicas = vec![replica1.replace(
        &format!(":{}/", cluster.replica(1).port()),
        &format!(":{}/", forwarder.port()),
    )];
    file.health_interval_ms = Some(60_000);
    file.wait_timeout_ms = Some(20_000);
    let proxy = TestProxy::with(file);
    let (port0, port1) = (
        cluster.replica(0).port() as i32,
        cluster.replica(1).port() as i32,
    );
    let read_sql = format!(
        "SELECT n, inet_server_port() FROM {} WHERE id = 1",
        counter.table
    );
    let conninfo = format!(
        "{} options='-c lsngate.consistency=session'",
        proxy.conninfo()
    );
    let (ports, backwards) = rt().block_on(async {
        let client = connect(&conninfo).await;
        // Prepared once: each read is then one flight, the first on the new server included
        // (an unnamed statement's Parse would be a flight of its own there, ahead of the read).
        let read = client.prepare(&read_sql).await.unwrap();
        let (holder, opener) = (connect(&conninfo).await, connect(&conninfo).await);
        let (mut backwards, mut ports) = (Backwards::default(), Vec::new());
        for i in 0..200 {
            if i == 100 {
                forwarder.set_target(cluster.replica(0).port());
                holder.batch_execute("BEGIN READ ONLY").await.unwrap();
                let held: i32 = holder
                    .query_one("SELECT inet_server_port()", &[])
                    .await
                    .unwrap()
                    .get(0);
                assert_eq!(held, port1, "the idle connection to the old server is held");
                opener
                    .batch_execute("BEGIN READ ONLY; SELECT 1; COMMIT")
                    .await
                    .unwrap();
            }
            let row = client
                .query_one(&read, &[])
                .await
                .expect("the read survives the move");
            let (n, port): (i64, i32) = (row.get(0), row.get(1));
            backwards.read(i, port, n);
            ports.push(port);
        }
        holder.batch_execute("COMMIT").await.unwrap();
        (ports, backwards.seen)
    });
    counter.stop();
    let on = |port: i32, reads: &[i32]| reads.iter().filter(|&&p| p == port).count();
    println!(
        "before the move: {} on replica1; after: {} on replica0, {} elsewhere; backwards {}: {:?}; {}",
        on(port1, &ports[..100]),
        on(port0, &ports[100..]),
        100 - on(port0, &ports[100..]),
        backwards.len(),
        backwards.first(),
        proxy.status()["causal"]["outcomes"]
    );
    assert_eq!(
        on(port1, &ports[..100]),
        100,
        "replica1 served before the move"
    );
    assert!(
        on(port0, &ports[100..]) > 0,
        "no read reached the server behind"
    );
    assert!(backwards.is_empty(), "reads went backwards: {backwards:?}");
    cluster.replica(0).set_apply_delay(Duration::ZERO).unwrap();
}
