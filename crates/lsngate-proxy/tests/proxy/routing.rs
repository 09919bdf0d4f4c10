//! Read/write splitting, hints, 25006 re-runs, prepared statements across backends.

use crate::support::*;
use lsngate_cluster::shared_cluster;

async fn on_replica(client: &tokio_postgres::Client, sql: &str) -> bool {
    let row = client
        .query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    row.get::<_, bool>(0)
}

#[test]
fn reads_go_to_replicas_writes_and_transactions_to_the_primary() {
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    let seq = unique("seq");
    cluster
        .primary()
        .sql(&format!("CREATE SEQUENCE {seq}"))
        .unwrap();
    caught_up(cluster);
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        assert!(
            on_replica(&client, "SELECT pg_is_in_recovery()").await,
            "plain read → replica"
        );
        assert!(
            !on_replica(
                &client,
                &format!("SELECT pg_is_in_recovery() FROM nextval('{seq}')")
            )
            .await,
            "nextval → primary"
        );
        assert!(
            !on_replica(
                &client,
                "SELECT pg_is_in_recovery() FROM pg_class LIMIT 1 FOR SHARE"
            )
            .await
        );
        assert!(
            !on_replica(
                &client,
                "/* lsngate:route=primary */ SELECT pg_is_in_recovery()"
            )
            .await,
            "hint"
        );
        client.batch_execute("BEGIN").await.unwrap();
        assert!(
            !on_replica(&client, "SELECT pg_is_in_recovery()").await,
            "explicit transaction → primary"
        );
        client.batch_execute("COMMIT").await.unwrap();
        client.batch_execute("BEGIN READ ONLY").await.unwrap();
        assert!(
            on_replica(&client, "SELECT pg_is_in_recovery()").await,
            "BEGIN READ ONLY → replica"
        );
        client.batch_execute("COMMIT").await.unwrap();
        client
            .batch_execute("SET lsngate.route = primary")
            .await
            .unwrap();
        let shown = client.simple_query("SHOW lsngate.route").await.unwrap();
        let value = shown.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        });
        assert_eq!(value.as_deref(), Some("primary"));
        assert!(
            !on_replica(&client, "SELECT pg_is_in_recovery()").await,
            "SET lsngate.route = primary"
        );
        client.batch_execute("RESET lsngate.route").await.unwrap();
        assert!(
            on_replica(&client, "SELECT pg_is_in_recovery()").await,
            "back to auto"
        );
        let err = client
            .batch_execute("SET lsngate.route = sideways")
            .await
            .unwrap_err();
        let message = err
            .as_db_error()
            .map(|e| e.message().to_string())
            .unwrap_or_default();
        assert!(message.contains("primary, replica or auto"), "{err:?}");
        assert!(
            on_replica(&client, "SELECT pg_is_in_recovery()").await,
            "session goes on after the error"
        );
    });
}

#[test]
fn a_reload_reclassifies_a_statement_the_session_parsed_before() {
    // A session keeps its last few statement definitions (class included) for the next Parse of
    // the same text: a reload that names the function as a write must still route it to the
    // primary, in the same session, over the extended protocol.
    let cluster = shared_cluster();
    let file = file_config(cluster);
    let proxy = TestProxy::with(file.clone());
    let f = unique("marks");
    cluster
        .primary()
        .sql(&format!(
            "CREATE FUNCTION {f}() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$"
        ))
        .unwrap();
    caught_up(cluster);
    let sql = format!("SELECT pg_is_in_recovery() FROM {f}()");
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        for _ in 0..3 {
            assert!(on_replica(&client, &sql).await, "a plain read → replica");
        }
        let mut reloaded = file.clone();
        reloaded.write_functions = vec![f.clone()];
        proxy
            .proxy
            .reload(lsngate_proxy::Config::build(reloaded).unwrap());
        for _ in 0..3 {
            assert!(
                !on_replica(&client, &sql).await,
                "named in write_functions since the reload → primary"
            );
        }
    });
}

/// A fresh table `(id int PRIMARY KEY, v int)` holding (1, 10), replayed on every replica.
fn one_row_table(cluster: &lsngate_cluster::Cluster, prefix: &str) -> String {
    let t = unique(prefix);
    cluster
        .primary()
        .sql(&format!(
            "CREATE TABLE {t} (id int PRIMARY KEY, v int); INSERT INTO {t} VALUES (1, 10)"
        ))
        .unwrap();
    caught_up(cluster);
    t
}

#[test]
fn a_query_that_ends_a_replica_block_and_then_writes_is_refused_with_the_fix() {
    // Found by the differential checker (seed 20261206466): the whole Query ran on the replica
    // holding the read-only block, and its write failed with 25006, which PostgreSQL runs.
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    let t = one_row_table(cluster, "blockend");
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        client.batch_execute("BEGIN READ ONLY").await.unwrap();
        assert!(on_replica(&client, "SELECT pg_is_in_recovery()").await);
        let e = client
            .batch_execute(&format!(
                "SELECT 1; COMMIT; UPDATE {t} SET v = 11 WHERE id = 1"
            ))
            .await
            .unwrap_err();
        let db = e.as_db_error().expect("the proxy's error");
        assert_eq!(db.code().code(), "0A000", "{db:?}");
        assert!(db.message().contains("as a Query of their own"), "{db:?}");
        // Nothing ran: the block is failed by the error, as any error fails it.
        client.batch_execute("ROLLBACK").await.unwrap();
        client
            .batch_execute(&format!("UPDATE {t} SET v = 11 WHERE id = 1"))
            .await
            .unwrap();
        let v: i32 = client
            .query_one(
                &format!("/* lsngate:route=primary */ SELECT v FROM {t} WHERE id = 1"),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(v, 11);
        // Reads after the block's end stay where the block was: allowed.
        client.batch_execute("BEGIN READ ONLY").await.unwrap();
        client
            .batch_execute(&format!("SELECT 1; COMMIT; SELECT v FROM {t}"))
            .await
            .unwrap();
    });
}

#[test]
fn a_pipeline_that_ends_a_replica_block_and_then_writes_before_its_sync_is_refused_with_the_fix() {
    // The extended protocol's form of the test above, from psycopg's pipeline mode: a read,
    // COMMIT and an UPDATE queued before one Sync inside `BEGIN READ ONLY`. The flight went whole
    // to the replica holding the block, where the UPDATE failed with 25006; on a direct
    // connection it runs after the block.
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    let t = one_row_table(cluster, "pipeend");
    let run = |url: &str| {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("clients")
            .join("psycopg_pipeline_block_end.py");
        run_ok(
            std::process::Command::new("python3")
                .arg(script)
                .arg(url)
                .arg(&t),
        )
        .0
    };
    let direct = run(&cluster.primary().url());
    assert!(
        direct.contains("pipeline ok") && direct.contains("v 11"),
        "{direct}"
    );
    cluster
        .primary()
        .sql(&format!("UPDATE {t} SET v = 10 WHERE id = 1"))
        .unwrap();
    let proxied = run(&proxy.url());
    assert!(
        proxied.contains("in_recovery True"),
        "the block ran on a replica: {proxied}"
    );
    assert!(
        proxied.contains("pipeline error 0A000")
            && proxied.contains("send a Sync after the statement that ends the block"),
        "{proxied}"
    );
    // Nothing ran, and the error failed the block, as any error does.
    assert!(proxied.contains("status INERROR"), "{proxied}");
    assert!(proxied.contains("v 10"), "{proxied}");
}

#[test]
fn a_block_end_sent_before_the_read_only_blocks_answer_is_refused_like_one_sent_after() {
    // Found by the differential checker (seed 20261452796): `BEGIN READ ONLY`, and before its
    // answer came, `ROLLBACK; UPDATE …`. The block was not known yet when the second arrived,
    // so the refusal above did not apply, and the UPDATE ran on the replica holding the block:
    // 25006, where PostgreSQL runs it after the block.
    use lsngate_proxy::net::FrontendMessage::{self, Sync};
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    let t = one_row_table(cluster, "earlyend");
    // The Query form, from tokio-postgres: requests polled together go out in one write.
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        let update = format!("ROLLBACK; UPDATE {t} SET v = 11 WHERE id = 1");
        let (begin, end) = tokio::join!(
            client.batch_execute("BEGIN READ ONLY"),
            client.batch_execute(&update),
        );
        begin.unwrap();
        let e = end.unwrap_err();
        let db = e.as_db_error().expect("the proxy's error");
        assert_eq!(db.code().code(), "0A000", "{db:?}");
        assert!(db.message().contains("as a Query of their own"), "{db:?}");
        client.batch_execute("ROLLBACK").await.unwrap();
    });
    // The extended form: the BEGIN's batch and one that commits, then updates, in one write.
    let run = crate::statements::run_unnamed;
    let mut messages = run("BEGIN READ ONLY").to_vec();
    messages.push(Sync);
    messages.extend(run("COMMIT"));
    messages.extend(run(&format!("UPDATE {t} SET v = 12 WHERE id = 1")));
    messages.push(Sync);
    let mut wire = crate::statements::Wire::connect(&proxy);
    let reply = wire.flight(&messages);
    assert_eq!(reply.statuses, b"TE", "{reply:?}");
    assert!(
        reply
            .errors
            .iter()
            .any(|e| e.contains("send a Sync after the statement that ends the block")),
        "{reply:?}"
    );
    let ended = wire.flight(&[FrontendMessage::Query("ROLLBACK".into())]);
    assert!(ended.errors.is_empty(), "{ended:?}");
    // Neither UPDATE ran.
    let v = cluster
        .primary()
        .sql(&format!("SELECT v FROM {t} WHERE id = 1"))
        .unwrap();
    assert_eq!(v.trim(), "10");
}

#[test]
fn a_write_hidden_late_in_a_long_replica_read_is_rerun_within_the_retry_buffer_and_reported_past_it()
 {
    // A replica read's replies are held back until it is known not to need its re-run on the
    // primary (25006, a write hidden in a function): up to `retry_buffer_size`, then handed to
    // the client as they come, and a 25006 after that reaches the client. The write here comes
    // at the 1500th of 2000 rows, after about 60 kB of them.
    let cluster = shared_cluster();
    let t = unique("late");
    cluster
        .primary()
        .sql(&format!(
            "CREATE TABLE {t} (g int);
             CREATE FUNCTION {t}_at(g int) RETURNS text LANGUAGE plpgsql AS $$
             BEGIN IF g = 1500 THEN INSERT INTO {t} VALUES (g); END IF; RETURN repeat('x', 20) || g; END $$;"
        ))
        .unwrap();
    caught_up(cluster);
    let sql = format!("SELECT {t}_at(g) FROM generate_series(1, 2000) g");
    let plain = "SELECT repeat('x', 20) || g FROM generate_series(1, 2000) g";
    let want: Vec<String> = (1..=2000)
        .map(|g| format!("{}{g}", "x".repeat(20)))
        .collect();
    for (buffer, rerun) in [(None, true), (Some(4096), false)] {
        let mut file = file_config(cluster);
        file.retry_buffer_size = buffer;
        let proxy = TestProxy::with(file);
        rt().block_on(async {
            let client = connect(&proxy.conninfo()).await;
            // Rows larger than the buffer stream through whole and in order either way.
            let rows = client.query(plain, &[]).await.unwrap();
            let got: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
            assert_eq!(got, want, "buffer {buffer:?}");
            let read = client.query(&sql, &[]).await;
            if rerun {
                let got: Vec<String> = read.unwrap().iter().map(|r| r.get(0)).collect();
                assert_eq!(got, want, "re-run on the primary");
            } else {
                let e = read.unwrap_err();
                assert_eq!(
                    e.as_db_error().map(|db| db.code().code()),
                    Some("25006"),
                    "past the buffer the replica's refusal reaches the client: {e:?}"
                );
            }
        });
    }
    // The re-run wrote once; the refused read wrote nothing.
    let written = cluster
        .primary()
        .sql(&format!("SELECT count(*) FROM {t}"))
        .unwrap();
    assert_eq!(written, "1");
}

#[test]
fn a_write_hidden_in_a_function_is_rerun_on_the_primary() {
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    let t = unique("hidden");
    cluster
        .primary()
        .sql(&format!(
            "CREATE TABLE {t} (id serial, note text);
             CREATE FUNCTION {t}_add(n text) RETURNS int LANGUAGE sql AS $$ INSERT INTO {t}(note) VALUES (n) RETURNING id $$;"
        ))
        .unwrap();
    caught_up(cluster);
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        for i in 0..3 {
            let row = client
                .query_one(&format!("SELECT {t}_add($1)"), &[&format!("n{i}")])
                .await
                .unwrap();
            assert_eq!(row.get::<_, i32>(0), i + 1);
        }
        client
            .simple_query(&format!("SELECT {t}_add('simple')"))
            .await
            .unwrap();
    });
    assert_eq!(
        cluster
            .primary()
            .sql(&format!("SELECT count(*) FROM {t}"))
            .unwrap(),
        "4",
        "each write ran exactly once"
    );
    let metrics = proxy.http_get("/metrics");
    assert!(metrics.contains("lsngate_proxy_retries_total"), "{metrics}");
}

#[test]
fn named_statements_survive_backend_changes_and_name_collisions() {
    let cluster = shared_cluster();
    let mut file = file_config(cluster);
    file.pool_size = Some(1);
    let proxy = TestProxy::with(file);
    let t = unique("prep");
    cluster
        .primary()
        .sql(&format!("CREATE TABLE {t} (id int, who text)"))
        .unwrap();
    caught_up(cluster);
    rt().block_on(async {
        // Every tokio-postgres client names its first statement "s0": on a pool of one
        // connection per node they collide unless the proxy re-prepares.
        let a = connect(&proxy.conninfo()).await;
        let b = connect(&proxy.conninfo()).await;
        let read_a = a
            .prepare("SELECT 'a'::text, pg_is_in_recovery()")
            .await
            .unwrap();
        let read_b = b
            .prepare("SELECT 'b'::text, pg_is_in_recovery()")
            .await
            .unwrap();
        let insert_a = a
            .prepare(&format!("INSERT INTO {t} VALUES ($1, 'a')"))
            .await
            .unwrap();
        for i in 0..5 {
            let row = a.query_one(&read_a, &[]).await.unwrap();
            assert_eq!(row.get::<_, &str>(0), "a");
            let row = b.query_one(&read_b, &[]).await.unwrap();
            assert_eq!(row.get::<_, &str>(0), "b");
            a.execute(&insert_a, &[&i]).await.unwrap();
        }
        // The same read statement inside a transaction runs on the primary, prepared there on demand.
        a.batch_execute("BEGIN").await.unwrap();
        let row = a.query_one(&read_a, &[]).await.unwrap();
        assert!(!row.get::<_, bool>(1), "inside a transaction → primary");
        a.batch_execute("COMMIT").await.unwrap();
        let row = a.query_one(&read_a, &[]).await.unwrap();
        assert!(row.get::<_, bool>(1), "outside → replica again");
    });
    assert_eq!(
        cluster
            .primary()
            .sql(&format!("SELECT count(*) FROM {t} WHERE who = 'a'"))
            .unwrap(),
        "5"
    );
}

#[test]
fn an_error_in_the_middle_of_a_pipeline_fails_only_that_statement() {
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        for route in ["auto", "primary"] {
            client
                .batch_execute(&format!("SET lsngate.route = {route}"))
                .await
                .unwrap();
            // tokio-postgres pipelines queries polled together: Parse/Bind/Execute/Sync x3 in one write.
            let (a, b, c) = tokio::join!(
                client.query_one("SELECT 1::int", &[]),
                client.query_one("SELECT 1/0", &[]),
                client.query_one("SELECT 3::int", &[]),
            );
            assert_eq!(a.unwrap().get::<_, i32>(0), 1, "{route}");
            let err = b.unwrap_err();
            assert_eq!(
                err.code(),
                Some(&tokio_postgres::error::SqlState::DIVISION_BY_ZERO),
                "{route}"
            );
            assert_eq!(c.unwrap().get::<_, i32>(0), 3, "{route}");
        }
    });
}

/// The replica ports, once the proxy's monitor saw both replicas healthy.
fn replicas_serving(proxy: &TestProxy) -> Vec<i32> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let status = proxy.status();
        let ports: Vec<i32> = status["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["role"] == "replica" && n["healthy"] == true)
            .map(|n| {
                let address = n["address"].as_str().unwrap();
                address.rsplit(':').next().unwrap().parse().unwrap()
            })
            .collect();
        if ports.len() == 2 {
            return ports;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "both replicas never showed healthy: {status}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The busy count /status shows for the node on `port`.
fn busy_on(proxy: &TestProxy, port: i32) -> u64 {
    proxy.status()["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| {
            n["address"]
                .as_str()
                .unwrap()
                .ends_with(&format!(":{port}"))
        })
        .expect("the node in /status")["busy"]
        .as_u64()
        .unwrap()
}

/// While one replica holds a client's read-only transaction, every other read goes to the
/// other replica: reads go to the least busy replica, with or without causal reads.
#[test]
fn reads_go_to_the_least_busy_replica() {
    let cluster = shared_cluster();
    for consistency in ["eventual", "session"] {
        let mut file = file_config(cluster);
        file.consistency = Some(consistency.into());
        let proxy = TestProxy::with(file);
        let replicas = replicas_serving(&proxy);
        rt().block_on(async {
            let holder = connect(&proxy.conninfo()).await;
            holder.batch_execute("BEGIN READ ONLY").await.unwrap();
            let busy = server_port(&holder).await;
            assert!(replicas.contains(&busy), "{busy} is not a replica");
            assert_eq!(busy_on(&proxy, busy), 1, "{consistency}");
            let idle = *replicas.iter().find(|&&p| p != busy).unwrap();
            assert_eq!(busy_on(&proxy, idle), 0, "{consistency}");
            let reader = connect(&proxy.conninfo()).await;
            for _ in 0..10 {
                assert_eq!(
                    server_port(&reader).await,
                    idle,
                    "{consistency}: a read went to the replica busy with a transaction"
                );
            }
            holder.batch_execute("COMMIT").await.unwrap();
            assert_eq!(busy_on(&proxy, busy), 0, "{consistency}");
        });
    }
}
