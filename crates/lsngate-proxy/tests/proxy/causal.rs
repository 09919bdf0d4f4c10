//! Causal reads through the proxy: read-your-writes with real clients on real clusters, on both
//! server versions (WAIT FOR LSN on 19, replay checks and polling on 15).

use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::statements::{Wire, execute_unnamed, parse_unnamed};
use crate::support::*;
use lsngate_cluster::{Cluster, ClusterConfig, shared_cluster, shared_delayed_cluster};
use lsngate_proxy::net::FrontendMessage;

fn proxy_with(cluster: &Cluster, change: impl FnOnce(&mut lsngate_proxy::FileConfig)) -> TestProxy {
    let mut file = file_config(cluster);
    file.pool_size = Some(12);
    change(&mut file);
    TestProxy::with(file)
}

fn outcome(proxy: &TestProxy, name: &str) -> u64 {
    proxy.status()["causal"]["outcomes"][name]
        .as_u64()
        .unwrap_or(0)
}

/// `stale=S replica=R reads=N` from the psycopg script.
fn counts(line: &str) -> (u64, u64, u64) {
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
    };
    (field("stale"), field("replica"), field("reads"))
}

fn psycopg(
    scenario: &str,
    proxy: &TestProxy,
    table: &str,
    n: usize,
    workers: usize,
) -> (u64, u64, u64) {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients");
    let mut command = std::process::Command::new("python3");
    command.arg(dir.join("causal_psycopg.py")).args([
        scenario,
        &proxy.url(),
        table,
        &n.to_string(),
        &workers.to_string(),
    ]);
    let (stdout, _) = run_ok(&mut command);
    counts(stdout.trim())
}

fn create(cluster: &Cluster, table: &str) {
    cluster
        .primary()
        .sql(&format!(
            "CREATE TABLE {table} (id bigint PRIMARY KEY, v int)"
        ))
        .unwrap();
    caught_up(cluster);
}

#[test]
fn psycopg_8_workers_x_1000_insert_then_read_never_miss_their_row() {
    let cluster = shared_cluster();
    let proxy = proxy_with(cluster, |_| {});
    let t = unique("own");
    create(cluster, &t);
    let (stale, replica, reads) = psycopg("own", &proxy, &t, 1000, 8);
    println!(
        "session mode, 8 x 1000: stale={stale} replica={replica} reads={reads}; {}",
        proxy.status()["causal"]["outcomes"]
    );
    assert_eq!(reads, 8000);
    assert_eq!(stale, 0, "a read missed its own connection's insert");
    let outcomes = proxy.status()["causal"]["outcomes"].clone();
    let counted: u64 = outcomes
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    // Counted per flight: 8000 reads, plus the one Parse+Sync flight per connection with which
    // psycopg prepares the read after its fifth use.
    assert_eq!(counted, 8008, "every read flight counted once: {outcomes}");
    assert!(
        replica * 2 > reads,
        "most reads must be served by the replicas (else 0 stale proves nothing): {replica}/{reads}"
    );
}

#[test]
fn token_mode_carries_a_commit_across_connections_and_global_needs_no_token() {
    let cluster = shared_delayed_cluster();
    let proxy = proxy_with(cluster, |_| {});
    for (scenario, n) in [("token", 60), ("global", 60)] {
        let t = unique(scenario);
        create(cluster, &t);
        let (stale, replica, reads) = psycopg(scenario, &proxy, &t, n, 1);
        println!("{scenario}: stale={stale} replica={replica} reads={reads}");
        assert_eq!((stale, reads), (0, n as u64), "{scenario} mode");
        assert!(
            replica > 0,
            "{scenario}: the replica served reads after waiting"
        );
    }
    // The control: the same exchange with a plain read/write split misses the rows.
    let t = unique("naive");
    create(cluster, &t);
    let (stale, _, reads) = psycopg("naive", &proxy, &t, 20, 1);
    println!("eventual (control): stale={stale} reads={reads}");
    assert!(
        stale > 0,
        "the control must show the problem the modes solve"
    );
}

/// Inserts on the primary through the proxy, then reads the row, each in one flight (statements
/// prepared once); (stale, served by a replica).
async fn write_then_read(client: &tokio_postgres::Client, table: &str, n: i64) -> (usize, usize) {
    let insert = client
        .prepare(&format!("INSERT INTO {table} (id, v) VALUES ($1, 1)"))
        .await
        .unwrap();
    let select = client
        .prepare(&format!(
            "SELECT pg_is_in_recovery() FROM {table} WHERE id = $1"
        ))
        .await
        .unwrap();
    let (mut stale, mut replica) = (0, 0);
    for i in 0..n {
        client.execute(&insert, &[&i]).await.unwrap();
        let row = client.query_opt(&select, &[&i]).await.unwrap();
        match row {
            None => stale += 1,
            Some(row) if row.get::<_, bool>(0) => replica += 1,
            Some(_) => {}
        }
    }
    (stale, replica)
}

#[test]
fn the_budget_decides_who_serves_not_whether_the_read_is_fresh() {
    let cluster = shared_delayed_cluster();
    for (budget, expect_replica) in [(500, true), (20, false)] {
        let proxy = proxy_with(cluster, |f| f.wait_timeout_ms = Some(budget));
        let t = unique("budget");
        create(cluster, &t);
        let (stale, replica) = rt().block_on(async {
            let client = connect(&proxy.conninfo()).await;
            write_then_read(&client, &t, 20).await
        });
        let outcomes = &proxy.status()["causal"]["outcomes"];
        println!("budget {budget} ms: stale={stale} replica={replica}/20 {outcomes}");
        assert_eq!(stale, 0, "budget {budget} ms");
        if expect_replica {
            assert_eq!(replica, 20, "a 500 ms budget covers a 50 ms delay");
            assert!(outcomes["waited"].as_u64().unwrap() >= 20, "{outcomes}");
        } else {
            // A check that answers late on a loaded machine may still find the row replayed and
            // serve it (fresh, just late): the budget routes, it is not a correctness bound.
            assert!(
                replica < 10,
                "a 20 ms budget cannot cover a 50 ms delay: {replica}/20"
            );
            assert!(outcomes["fallback"].as_u64().unwrap() >= 10, "{outcomes}");
        }
    }
}

#[test]
fn error_fallback_gives_its_own_sqlstate_and_stale_fallback_says_so() {
    // A replica 2 s behind, not the shared 50 ms one: each read below must come before the
    // replica has its write, and on a loaded machine (the PostgreSQL 15 pass late in CI) 50 ms
    // between a write and the next read's check was once not enough.
    let cluster = &Cluster::start(
        &ClusterConfig::default()
            .replicas(1)
            .apply_delay(Duration::from_secs(2)),
    )
    .expect("a cluster with a 2 s replica");
    cluster.wait_streaming(Duration::from_secs(30)).unwrap();
    let t = unique("policy");
    create(cluster, &t);
    let proxy = proxy_with(cluster, |f| {
        f.wait_timeout_ms = Some(5);
        f.fallback = Some("error".into());
    });
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        client
            .execute(&format!("INSERT INTO {t} VALUES (1, 1)"), &[])
            .await
            .unwrap();
        let err = client
            .query(&format!("SELECT v FROM {t} WHERE id = 1"), &[])
            .await
            .unwrap_err();
        let db = err.as_db_error().expect("a server error");
        assert_eq!(db.code().code(), "LG001", "{db:?}");
        assert!(
            db.message().contains("floor") && db.message().contains("wait_timeout_ms"),
            "{}",
            db.message()
        );
        // The session goes on: once the replica has the row, the same read works.
        caught_up(cluster);
        let v: i32 = client
            .query_one(&format!("SELECT v FROM {t} WHERE id = 1"), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(v, 1);
    });
    let proxy = proxy_with(cluster, |f| {
        f.wait_timeout_ms = Some(5);
        f.fallback = Some("stale".into());
    });
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        client
            .execute(&format!("INSERT INTO {t} VALUES (2, 1)"), &[])
            .await
            .unwrap();
        let rows = client
            .query(&format!("SELECT v FROM {t} WHERE id = 2"), &[])
            .await
            .unwrap();
        assert!(rows.is_empty(), "served by the 2 s-late replica, as asked");
        let stale: String = client
            .query_one("SHOW lsngate.stale", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(stale, "on");
    });
    assert!(outcome(&proxy, "stale") >= 1, "the stale read was counted");
}

#[test]
fn universal_mode_sees_writes_that_bypassed_the_proxy_and_fast_mode_never_waits() {
    let cluster = shared_delayed_cluster();
    let t = unique("universal");
    create(cluster, &t);
    let proxy = proxy_with(cluster, |_| {});
    rt().block_on(async {
        let universal = connect(&format!(
            "{} options='-c lsngate.consistency=universal'",
            proxy.conninfo()
        ))
        .await;
        let eventual = connect(&format!(
            "{} options='-c lsngate.consistency=eventual'",
            proxy.conninfo()
        ))
        .await;
        let (mut fresh, mut missed) = (0, 0);
        for i in 0..10 {
            // Written past the proxy, straight on the primary.
            cluster
                .primary()
                .sql(&format!("INSERT INTO {t} VALUES ({i}, 1)"))
                .unwrap();
            let sql = format!("SELECT pg_is_in_recovery() FROM {t} WHERE id = {i}");
            let row = universal.query_opt(&sql, &[]).await.unwrap();
            assert!(row.is_some(), "universal read {i} missed a committed write");
            fresh += 1;
            cluster
                .primary()
                .sql(&format!("INSERT INTO {t} VALUES ({}, 1)", 100 + i))
                .unwrap();
            let sql = format!("SELECT 1 FROM {t} WHERE id = {}", 100 + i);
            if eventual.query_opt(&sql, &[]).await.unwrap().is_none() {
                missed += 1;
            }
        }
        println!("universal fresh={fresh}/10, eventual (control) missed={missed}/10");
        assert!(
            missed > 0,
            "the control must miss writes on a 50 ms-late replica"
        );
        let mode: String = universal
            .query_one("SHOW lsngate.consistency", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(mode, "universal");
    });
    let waited_before = outcome(&proxy, "waited");
    rt().block_on(async {
        let fast = connect(&format!(
            "{} options='-c lsngate.consistency=fast'",
            proxy.conninfo()
        ))
        .await;
        fast.batch_execute(&format!("INSERT INTO {t} VALUES (1000, 1)"))
            .await
            .unwrap();
        let on_replica: bool = fast
            .query_one(
                &format!("SELECT pg_is_in_recovery() FROM {t} WHERE id = 1000"),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(
            !on_replica,
            "fast mode does not wait: the primary served the fresh read"
        );
    });
    assert_eq!(
        outcome(&proxy, "waited"),
        waited_before,
        "fast mode never waited"
    );
}

#[test]
fn a_refused_floor_inside_a_block_fails_the_block_in_both_protocols() {
    // An error inside a transaction block fails the block: every statement up to ROLLBACK gets
    // 25P02. The simple protocol's refusal did that; over the extended protocol the proxy
    // answered ReadyForQuery `T` and the block went on as if nothing had failed.
    let cluster = shared_cluster();
    let proxy = proxy_with(cluster, |_| {});
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        for extended in [false, true] {
            client.batch_execute("BEGIN").await.unwrap();
            let bad = "/* lsngate_min_lsn='0/zz' */ SELECT 1";
            let err = if extended {
                client.query(bad, &[]).await.map(|_| ()).unwrap_err()
            } else {
                client.batch_execute(bad).await.unwrap_err()
            };
            assert_eq!(err.as_db_error().unwrap().code().code(), "22023", "{err:?}");
            let err = client.query("SELECT 1", &[]).await.unwrap_err();
            assert_eq!(
                err.as_db_error().map(|db| db.code().code()),
                Some("25P02"),
                "extended {extended}: {err:?}"
            );
            client.batch_execute("ROLLBACK").await.unwrap();
            let one: i32 = client.query_one("SELECT 1", &[]).await.unwrap().get(0);
            assert_eq!(one, 1);
        }
    });
}

#[test]
fn bad_floors_fail_only_their_statement_and_settings_work_in_both_protocols() {
    let cluster = shared_cluster();
    let proxy = proxy_with(cluster, |_| {});
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        for bad in [
            "SET lsngate.min_lsn = 'banana'",
            "/* lsngate_min_lsn='12' */ SELECT 1",
        ] {
            let err = client.batch_execute(bad).await.unwrap_err();
            let db = err.as_db_error().expect("server error");
            assert_eq!(db.code().code(), "22023", "{bad}: {db:?}");
            assert!(db.message().contains("min_lsn"), "{bad}: {}", db.message());
        }
        // Extended protocol: the same statements through prepare/execute.
        let err = client
            .execute("SET lsngate.min_lsn = 'not-an-lsn'", &[])
            .await
            .unwrap_err();
        assert_eq!(err.as_db_error().unwrap().code().code(), "22023");
        let err = client
            .query("/* lsngate_min_lsn='0/zz' */ SELECT 1", &[])
            .await
            .unwrap_err();
        assert_eq!(err.as_db_error().unwrap().code().code(), "22023");
        // The session goes on, and good values are taken over both protocols.
        client
            .execute("SET lsngate.min_lsn = '0/1'", &[])
            .await
            .unwrap();
        let shown: String = client
            .query_one("SHOW lsngate.min_lsn", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(shown, "0/00000001");
        client
            .batch_execute("SET lsngate.route = primary")
            .await
            .unwrap();
        client
            .execute("SET lsngate.route = replica", &[])
            .await
            .unwrap();
        let route: String = client
            .query_one("SHOW lsngate.route", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            route, "replica",
            "SET over the extended protocol is the proxy's"
        );
        let in_recovery: bool = client
            .query_one(
                "/* lsngate_min_lsn='0/1' */ SELECT pg_is_in_recovery()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(in_recovery);
        let err = client
            .batch_execute("SET lsngate.nonsense = 1")
            .await
            .unwrap_err();
        assert_eq!(err.as_db_error().unwrap().code().code(), "42704");
    });
    // A bad mode in the startup options refuses the login with the reason.
    let err = rt().block_on(async {
        tokio_postgres::connect(
            &format!(
                "{} options='-c lsngate.consistency=strong'",
                proxy.conninfo()
            ),
            tokio_postgres::NoTls,
        )
        .await
        .err()
        .expect("login refused")
    });
    assert!(format!("{err:?}").contains("strong"), "{err:?}");
}

#[test]
fn a_paused_replica_is_passed_over_and_a_killed_one_costs_no_stale_read() {
    let cluster = Cluster::start(&ClusterConfig::default().replicas(2)).unwrap();
    cluster.wait_streaming(Duration::from_secs(30)).unwrap();
    let t = unique("faults");
    create(&cluster, &t);
    // The first run asserts that replica1 serves every read: its proxy waits far longer than
    // replica1 takes to replay, however loaded the machine (one 300 ms proxy for both runs
    // sent a read to the primary when a replay was slow). The run across the kill keeps
    // 300 ms, as every read there waits out its budget on the paused replica.
    let patient = proxy_with(&cluster, |f| f.wait_timeout_ms = Some(5000));
    let budget = 300;
    // Every read after the kill falls back (replica0 paused, replica1 dead), which the primary
    // guard would rightly refuse after min_reads; this test is about staleness and survival.
    let proxy = proxy_with(&cluster, |f| {
        f.wait_timeout_ms = Some(budget);
        f.breaker_ratio = Some(1.0);
    });
    cluster.replica(0).pause_replay().unwrap();
    let port1 = cluster.replica(1).port() as i32;
    rt().block_on(async {
        let client = connect(&patient.conninfo()).await;
        for i in 0..30 {
            client
                .execute(&format!("INSERT INTO {t} VALUES ($1, 1)"), &[&(i as i64)])
                .await
                .unwrap();
            let row = client
                .query_one(
                    &format!("SELECT inet_server_port() FROM {t} WHERE id = $1"),
                    &[&(i as i64)],
                )
                .await
                .expect("fresh row");
            assert_eq!(
                row.get::<_, i32>(0),
                port1,
                "the replica that replays serves"
            );
        }
    });
    // Now the replica that serves dies in the middle of a run: the kill starts before read 110
    // and is over before read 120, so reads overlap it and follow it however fast they run (it
    // was a thread that slept 300 ms first, which a fast run could finish before).
    let doomed = cluster.replica(1).clone();
    let slowest = rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        let mut slowest = Duration::ZERO;
        let mut killer = None;
        for i in 100..140 {
            if i == 110 {
                let doomed = doomed.clone();
                killer = Some(std::thread::spawn(move || doomed.kill().unwrap()));
            }
            if i == 120 {
                killer.take().expect("started").join().unwrap();
            }
            client
                .execute(&format!("INSERT INTO {t} VALUES ($1, 1)"), &[&(i as i64)])
                .await
                .unwrap();
            let started = Instant::now();
            let rows = client
                .query(&format!("SELECT 1 FROM {t} WHERE id = $1"), &[&(i as i64)])
                .await
                .expect("the read survives the replica's death");
            slowest = slowest.max(started.elapsed());
            assert_eq!(rows.len(), 1, "read {i} missed its write");
        }
        slowest
    });
    println!(
        "slowest read across the kill: {slowest:?} (budget {budget} ms); {}",
        proxy.status()["causal"]["outcomes"]
    );
    // A hang detector, not a latency claim: a read costs its budget on the paused replica and
    // then the primary's answer, far below this on any machine.
    assert!(
        slowest < Duration::from_secs(30),
        "a read hung: {slowest:?} with a {budget} ms budget"
    );
    cluster.replica(0).resume_replay().unwrap();
}

#[test]
fn signed_tokens_from_the_http_helpers_are_accepted_where_configured() {
    let cluster = shared_delayed_cluster();
    let t = unique("signed");
    create(cluster, &t);
    let secret = "shared-hmac-key";
    let proxy = proxy_with(cluster, |f| {
        f.token_secret = Some(secret.into());
        f.consistency = Some("token".into());
    });
    rt().block_on(async {
        let a = connect(&proxy.conninfo()).await;
        let b = connect(&proxy.conninfo()).await;
        a.batch_execute(&format!("INSERT INTO {t} VALUES (1, 7)"))
            .await
            .unwrap();
        let token: String = a
            .query_one("SHOW lsngate.commit_token", &[])
            .await
            .unwrap()
            .get(0);
        // The HTTP helpers' codec with the same key verifies what the proxy issued.
        let verified = lsngate_core::TokenCodec::signed(secret.as_bytes().to_vec())
            .verify(&token, std::time::SystemTime::now())
            .expect("the proxy's token verifies with the helpers' codec");
        let commit_lsn: String = a
            .query_one("SHOW lsngate.commit_lsn", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(verified.lsn.to_string(), commit_lsn);
        b.batch_execute(&format!("SET lsngate.min_lsn = '{token}'"))
            .await
            .unwrap();
        let v: i32 = b
            .query_one(&format!("SELECT v FROM {t} WHERE id = 1"), &[])
            .await
            .expect("the token's floor makes the read wait for the row")
            .get(0);
        assert_eq!(v, 7);
        let forged = format!("{}AAAA", &token[..token.len() - 4]);
        let err = b
            .batch_execute(&format!("SET lsngate.min_lsn = '{forged}'"))
            .await
            .unwrap_err();
        let db = err.as_db_error().unwrap();
        assert_eq!(db.code().code(), "22023");
        assert!(db.message().contains("signature"), "{}", db.message());
    });
    let strict = proxy_with(cluster, |f| {
        f.token_secret = Some(secret.into());
        f.require_signed_tokens = Some(true);
    });
    rt().block_on(async {
        let c = connect(&strict.conninfo()).await;
        let err = c
            .batch_execute("SET lsngate.min_lsn = '0/1'")
            .await
            .unwrap_err();
        assert_eq!(err.as_db_error().unwrap().code().code(), "22023", "{err:?}");
    });
}

#[test]
fn the_breaker_stops_a_fallback_flood_with_its_own_sqlstate() {
    let cluster = shared_delayed_cluster();
    let t = unique("breaker");
    create(cluster, &t);
    let proxy = proxy_with(cluster, |f| {
        f.wait_timeout_ms = Some(1);
        f.breaker_min_reads = Some(5);
        f.breaker_ratio = Some(0.5);
        f.breaker_open_ms = Some(60_000);
        f.when_guarded = Some("fail".into());
    });
    let (mut served, mut guarded) = (0, 0);
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        let insert = client
            .prepare(&format!("INSERT INTO {t} VALUES ($1, 1)"))
            .await
            .unwrap();
        let select = client
            .prepare(&format!("SELECT v FROM {t} WHERE id = $1"))
            .await
            .unwrap();
        for i in 0..12i64 {
            client.execute(&insert, &[&i]).await.unwrap();
            match client.query(&select, &[&i]).await {
                Ok(rows) => {
                    assert_eq!(rows.len(), 1, "a served read is never stale");
                    served += 1;
                }
                Err(e) => {
                    let db = e.as_db_error().expect("server error");
                    assert_eq!(db.code().code(), "LG002", "{db:?}");
                    assert!(db.message().contains("breaker"), "{}", db.message());
                    guarded += 1;
                }
            }
        }
    });
    let causal = &proxy.status()["causal"];
    println!(
        "breaker: served={served} guarded={guarded} {}",
        causal["breaker"]
    );
    assert!(
        served >= 1 && served + guarded == 12,
        "fallbacks are admitted until the breaker has a verdict (5 reads, counting the prepare)"
    );
    assert!(guarded > 0, "the breaker opened and refused the flood");
    assert_eq!(causal["breaker"]["open"], true);
    let metrics = proxy.http_get("/metrics");
    assert!(
        metrics.contains("lsngate_proxy_breaker_open 1"),
        "{metrics}"
    );
}

/// `fast` reads the primary where no replica is known to have the floor. Once the breaker has
/// opened on those reads, a fast read after a write waited for a primary slot it could not get and
/// failed LG002 after the budget, though the replica replayed the write 50 ms later (pgbench's
/// write-then-read script through a fast proxy: 28 transactions a second, then an abort). Refused
/// the primary, it now waits on the replica as `session` does.
#[test]
fn a_fast_read_refused_the_primary_waits_on_the_replica_instead_of_failing() {
    let cluster = shared_delayed_cluster();
    let t = unique("fast_guard");
    create(cluster, &t);
    let proxy = proxy_with(cluster, |f| {
        f.consistency = Some("fast".into());
        f.breaker_min_reads = Some(1);
        f.breaker_ratio = Some(0.5);
        f.breaker_open_ms = Some(60_000);
    });
    let served_by = rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        let mut served_by = Vec::new();
        for i in 0..3i64 {
            client
                .execute(&format!("INSERT INTO {t} VALUES ($1, 1)"), &[&i])
                .await
                .unwrap();
            let sql = format!("SELECT pg_is_in_recovery() FROM {t} WHERE id = {i}");
            // The extended protocol, then the simple one.
            let on_replica = if i % 2 == 0 {
                let row = client.query_opt(&sql, &[]).await;
                row.map(|row| row.map(|r| r.get::<_, bool>(0)))
            } else {
                let messages = client.simple_query(&sql).await;
                messages.map(|messages| {
                    messages.iter().find_map(|m| match m {
                        tokio_postgres::SimpleQueryMessage::Row(r) => Some(r.get(0) == Some("t")),
                        _ => None,
                    })
                })
            };
            let on_replica = on_replica
                .unwrap_or_else(|e| panic!("fast read {i} after its write failed: {e:?}"))
                .unwrap_or_else(|| panic!("fast read {i} missed its own write"));
            served_by.push(on_replica);
        }
        served_by
    });
    let breaker = &proxy.status()["causal"]["breaker"];
    println!("on a replica: {served_by:?}, breaker {breaker}");
    // The first read's prepare (Parse/Describe, a read with the INSERT's floor) fell back to
    // the primary and opened the breaker; everything after waited on the replica.
    assert_eq!(outcome(&proxy, "fallback"), 1);
    assert_eq!(breaker["open"], true);
    assert_eq!(served_by, [true, true, true]);
    assert_eq!(outcome(&proxy, "error"), 0);
    // With `when_guarded = "fail"` the client asked for the refusal itself: LG002 at once.
    let failing = proxy_with(cluster, |f| {
        f.consistency = Some("fast".into());
        f.breaker_min_reads = Some(1);
        f.breaker_ratio = Some(0.5);
        f.breaker_open_ms = Some(60_000);
        f.when_guarded = Some("fail".into());
    });
    rt().block_on(async {
        let client = connect(&failing.conninfo()).await;
        for i in 10..12i64 {
            client
                .batch_execute(&format!("INSERT INTO {t} VALUES ({i}, 1)"))
                .await
                .unwrap();
            let read = client
                .simple_query(&format!("SELECT 1 FROM {t} WHERE id = {i}"))
                .await;
            match (i, read) {
                // The first read falls back and opens the breaker.
                (10, Ok(_)) => {}
                (11, Err(e)) => {
                    let code = e.as_db_error().map(|d| d.code().code().to_string());
                    assert_eq!(code.as_deref(), Some("LG002"), "{e:?}");
                }
                (i, read) => panic!("read {i}: {read:?}"),
            }
        }
    });
    assert_eq!(
        outcome(&failing, "waited"),
        0,
        "a refused read did not wait"
    );
}

/// A lag event: the replica stops replaying, reads fall back until the breaker opens, and the
/// next read, refused a primary slot, queues for one. When the replica catches up meanwhile,
/// the queued read is served there. It used to stay in the queue, blind to the replica, and
/// fail LG002 at its deadline: the replicas' recovery reached only the reads that came after.
/// In `session` and in `fast` (whose refused read first waits on the replica itself).
#[test]
fn a_read_queued_by_the_primary_guard_is_served_by_a_replica_that_catches_up() {
    let cluster = Cluster::start(&ClusterConfig::default().replicas(1)).unwrap();
    cluster.wait_streaming(Duration::from_secs(30)).unwrap();
    let t = unique("rescue");
    create(&cluster, &t);
    for (n, mode) in ["session", "fast"].into_iter().enumerate() {
        let proxy = proxy_with(&cluster, |f| {
            f.consistency = Some(mode.into());
            f.wait_timeout_ms = Some(3000);
            f.breaker_min_reads = Some(1);
            f.breaker_ratio = Some(0.5);
            f.breaker_open_ms = Some(600_000);
        });
        let replica = cluster.replica(0);
        replica.pause_replay().unwrap();
        let (first, second) = (n as i64 * 10, n as i64 * 10 + 1);
        let conninfo = proxy.conninfo();
        // Opens the breaker: the first write's read falls back (the replica is paused).
        rt().block_on(async {
            let client = connect(&conninfo).await;
            client
                .batch_execute(&format!("INSERT INTO {t} VALUES ({first}, 1)"))
                .await
                .unwrap();
            // The simple protocol: one flight, one fallback.
            let messages = client
                .simple_query(&format!("SELECT 1 FROM {t} WHERE id = {first}"))
                .await
                .unwrap();
            let rows = messages
                .iter()
                .filter(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_)))
                .count();
            assert_eq!(rows, 1, "{mode}: the fallback read sees its write");
        });
        assert_eq!(outcome(&proxy, "fallback"), 1, "{mode}");
        assert_eq!(proxy.status()["causal"]["breaker"]["open"], true, "{mode}");
        // The next read waits out its budget on the paused replica, is refused the primary,
        // and queues; only then does the replica catch up.
        let table = t.clone();
        let reader = std::thread::spawn(move || {
            let t = table;
            rt().block_on(async {
                let client = connect(&conninfo).await;
                client
                    .batch_execute(&format!("INSERT INTO {t} VALUES ({second}, 1)"))
                    .await
                    .unwrap();
                client
                    .query_opt(
                        &format!("SELECT pg_is_in_recovery() FROM {t} WHERE id = {second}"),
                        &[],
                    )
                    .await
                    .map(|row| row.map(|r| r.get::<_, bool>(0)))
            })
        });
        let refused = || proxy.status()["causal"]["breaker"]["refused_reads"].as_u64();
        let deadline = Instant::now() + Duration::from_secs(60);
        while refused() != Some(1) && !reader.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        replica.resume_replay().unwrap();
        let read = reader.join().unwrap();
        let breaker = &proxy.status()["causal"]["breaker"];
        println!("{mode}: {read:?}, breaker {breaker}");
        let on_replica = read
            .unwrap_or_else(|e| panic!("{mode}: the queued read failed: {e:?}"))
            .unwrap_or_else(|| panic!("{mode}: the queued read missed its write"));
        assert!(on_replica, "{mode}: the replica that caught up served it");
        assert_eq!(breaker["refused_reads"], 1, "{mode}");
        assert_eq!(breaker["rescued_reads"], 1, "{mode}");
        assert_eq!(outcome(&proxy, "error"), 0, "{mode}");
    }
}

#[test]
fn after_a_failover_old_floors_read_the_new_primary_and_an_orphaned_replica_serves_nothing() {
    let cluster = Cluster::start(&ClusterConfig::default().replicas(2)).unwrap();
    cluster.wait_streaming(Duration::from_secs(30)).unwrap();
    let t = unique("failover");
    create(&cluster, &t);
    let proxy = proxy_with(&cluster, |f| f.wait_timeout_ms = Some(300));
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        for i in 0..5 {
            client
                .batch_execute(&format!("INSERT INTO {t} VALUES ({i}, 1)"))
                .await
                .unwrap();
        }
        caught_up(&cluster);
        cluster.primary().stop_immediate().unwrap();
        cluster.replica(1).promote().unwrap();
        // Replica 0 is orphaned: still in recovery on timeline 1, following nobody.
        execute_once_a_primary_takes_it(&client, &format!("INSERT INTO {t} VALUES (100, 2)")).await;
        let orphan = cluster.replica(0).port() as i32;
        for i in [0, 4, 100] {
            let row = client
                .query_opt(
                    &format!("SELECT inet_server_port() FROM {t} WHERE id = {i}"),
                    &[],
                )
                .await
                .unwrap();
            let port: i32 = row
                .unwrap_or_else(|| panic!("row {i} missing after failover"))
                .get(0);
            assert_ne!(
                port, orphan,
                "the orphaned replica served a read with a floor from the new timeline"
            );
        }
    });
    let causal = &proxy.status()["causal"];
    println!("after failover: {}", causal);
    assert_eq!(causal["primary"]["timeline"], 2);
}

#[test]
fn reads_never_go_backwards_across_replicas_with_different_lag() {
    let (cluster, counter) = Counter::on_two_replicas(Duration::from_millis(150));
    let proxy = proxy_with(&cluster, |_| {});
    let backwards = |mode: &'static str| {
        let conninfo = format!(
            "{} options='-c lsngate.consistency={mode}'",
            proxy.conninfo()
        );
        let t = counter.table.clone();
        rt().block_on(async move {
            let client = connect(&conninfo).await;
            let select = client
                .prepare(&format!(
                    "SELECT n, inet_server_port() FROM {t} WHERE id = 1"
                ))
                .await
                .unwrap();
            let mut backwards = Backwards::default();
            for i in 0..300 {
                let row = client.query_one(&select, &[]).await.unwrap();
                backwards.read(i, row.get(1), row.get(0));
                // Over 3 s: a session's reads stay on one replica for a second at most, then
                // move with the replay position taken behind one read (`STICKY_FOR`).
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            backwards.seen.len()
        })
    };
    let control = backwards("eventual");
    let session = backwards("session");
    counter.stop();
    println!("reads that went backwards: eventual {control}/300, session {session}/300");
    assert_eq!(session, 0, "session mode keeps reads monotonic");
    cluster.replica(0).set_apply_delay(Duration::ZERO).unwrap();
}

/// No position is taken behind a replica read: the session's reads stay on that server, and a
/// read that must move (the server died) first raises the session's floor to the primary's
/// position. Here the session reads the up-to-date replica1 while a writer counts up, replica1
/// is killed, and every read after it lands on replica0, 2 s behind: none may show a lower
/// count than the reads before the kill. Without the floor taken on the move, the reads on
/// replica0 went back up to 2 s of counts.
#[test]
fn a_read_that_must_leave_its_replica_sees_no_less_than_the_reads_before() {
    // Far longer than the proxy takes to notice the kill and move: the moved reads come while
    // replica0 is still well behind what replica1 had shown.
    let (cluster, counter) = Counter::on_two_replicas(Duration::from_secs(2));
    // A budget no replay of 2 s exceeds, so the moved reads wait on replica0 (a fallback to the
    // primary would pass too, and prove less).
    let proxy = proxy_with(&cluster, |f| f.wait_timeout_ms = Some(20_000));
    let (port0, port1) = (
        cluster.replica(0).port() as i32,
        cluster.replica(1).port() as i32,
    );
    let conninfo = format!(
        "{} options='-c lsngate.consistency=session'",
        proxy.conninfo()
    );
    let read_sql = format!(
        "SELECT n, inet_server_port() FROM {} WHERE id = 1",
        counter.table
    );
    let (before, after, backwards) = rt().block_on(async {
        // A session whose reads run on replica1 (the first replica a session reads on is a
        // random pick; a session keeps it).
        let mut client = None;
        for _ in 0..40 {
            let c = connect(&conninfo).await;
            let row = c.query_one(&read_sql, &[]).await.unwrap();
            if row.get::<_, i32>(1) == port1 {
                client = Some(c);
                break;
            }
        }
        let client = client.expect("no session of 40 read on replica1");
        let (mut backwards, mut before, mut after) = (Backwards::default(), 0, 0);
        for i in 0..200 {
            if i == 100 {
                cluster.replica(1).kill().unwrap();
            }
            let row = client
                .query_one(&read_sql, &[])
                .await
                .expect("the read survives the replica's death");
            let (n, port): (i64, i32) = (row.get(0), row.get(1));
            backwards.read(i, port, n);
            match port {
                p if p == port1 => before += 1,
                p if p == port0 => after += 1,
                _ => {}
            }
        }
        (before, after, backwards.seen)
    });
    counter.stop();
    println!(
        "reads on replica1 {before}, on replica0 {after}, backwards {}: {:?}; {}",
        backwards.len(),
        backwards.first(),
        proxy.status()["causal"]["outcomes"]
    );
    assert!(
        before >= 100,
        "the session left replica1 before it died ({before} reads there)"
    );
    assert!(after > 0, "no read reached replica0 after the kill");
    assert!(backwards.is_empty(), "reads went backwards: {backwards:?}");
    cluster.replica(0).set_apply_delay(Duration::ZERO).unwrap();
}

#[test]
fn reads_without_a_floor_skip_replicas_over_the_lag_bound() {
    let cluster = Cluster::start(&ClusterConfig::default().replicas(2)).unwrap();
    cluster.wait_streaming(Duration::from_secs(30)).unwrap();
    let proxy = proxy_with(&cluster, |f| {
        f.consistency = Some("eventual".into());
        f.max_replica_lag_bytes = Some(64 * 1024);
    });
    cluster.replica(0).pause_replay().unwrap();
    cluster
        .primary()
        .sql("CREATE TABLE lagging AS SELECT g AS id, repeat('x', 100) AS pad FROM generate_series(1, 20000) g")
        .unwrap();
    // The watcher learns the lag from its polls.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !proxy.status()["causal"]["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["lag_bytes"].as_u64().unwrap_or(0) > 64 * 1024)
    {
        assert!(
            Instant::now() < deadline,
            "the paused replica's lag never showed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let paused = cluster.replica(0).port() as i32;
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        for _ in 0..30 {
            assert_ne!(
                server_port(&client).await,
                paused,
                "a replica over the lag bound served a read"
            );
        }
    });
    cluster.replica(0).resume_replay().unwrap();
}

/// Every node's `poll_period_ms` in /status, once the monitors all agree on `want`.
fn wait_for_poll_period(proxy: &TestProxy, want: u64, why: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let nodes = proxy.status()["nodes"].clone();
        let periods: Vec<_> = nodes
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["poll_period_ms"].as_u64().unwrap())
            .collect();
        if periods.iter().all(|p| *p == want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{why}: periods {periods:?}, want {want}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn monitors_poll_positions_fast_only_while_reads_use_them() {
    let cluster = shared_cluster();
    let t = unique("demand");
    create(cluster, &t);
    let proxy = proxy_with(cluster, |f| {
        f.consistency = Some("eventual".into());
        f.health_interval_ms = Some(700);
        f.replay_poll_ms = Some(20);
    });
    // Eventual reads and writes need no positions: health-check pace.
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        for i in 0..20 {
            client
                .batch_execute(&format!("INSERT INTO {t} VALUES ({i}, 0)"))
                .await
                .unwrap();
            client
                .simple_query(&format!("SELECT v FROM {t} WHERE id = {i}"))
                .await
                .unwrap();
        }
    });
    wait_for_poll_period(
        &proxy,
        700,
        "an eventual proxy polls at the health interval",
    );
    let before: u64 = proxy.status()["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["polls"].as_u64().unwrap())
        .sum();
    assert!(before > 0, "the monitors poll");
    // A read with a floor (session mode, after a write) uses them: every monitor speeds up.
    rt().block_on(async {
        let client = connect(&format!(
            "{} options='-c lsngate.consistency=session'",
            proxy.conninfo()
        ))
        .await;
        client
            .batch_execute(&format!("INSERT INTO {t} VALUES (100, 1)"))
            .await
            .unwrap();
        let row = client
            .query_one(&format!("SELECT v FROM {t} WHERE id = 100"), &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, i32>(0), 1, "read your write");
    });
    wait_for_poll_period(
        &proxy,
        20,
        "a floor read wakes the monitors into replay_poll pace",
    );
}

#[test]
fn a_cancel_stops_a_read_waiting_for_its_floor() {
    let cluster = Cluster::start(&ClusterConfig::default().replicas(1)).unwrap();
    cluster.wait_streaming(Duration::from_secs(30)).unwrap();
    let t = unique("cancel");
    create(&cluster, &t);
    let proxy = proxy_with(&cluster, |f| f.wait_timeout_ms = Some(20_000));
    cluster.replica(0).pause_replay().unwrap();
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        let select = client
            .prepare(&format!("SELECT v FROM {t} WHERE id = 1"))
            .await
            .unwrap();
        client
            .batch_execute(&format!("INSERT INTO {t} VALUES (1, 1)"))
            .await
            .unwrap();
        // The wait happens inside the proxy, where no server shows it, so the cancel is sent
        // every 100 ms until the read ends: one that arrives before the wait finds nothing to
        // cancel, the first one during it ends it (a single cancel after a 500 ms sleep could
        // come too early on a loaded machine, and the read waited its full 20 s).
        let token = client.cancel_token();
        let ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let canceller = tokio::spawn({
            let ended = ended.clone();
            async move {
                let deadline = Instant::now() + Duration::from_secs(30);
                while !ended.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    token.cancel_query(tokio_postgres::NoTls).await.unwrap();
                }
            }
        });
        let started = Instant::now();
        let err = client.query(&select, &[]).await.unwrap_err();
        let waited = started.elapsed();
        ended.store(true, std::sync::atomic::Ordering::Relaxed);
        canceller.await.unwrap();
        let db = err.as_db_error().expect("a server error");
        assert_eq!(db.code().code(), "57014", "{db:?}");
        assert!(
            waited < Duration::from_secs(10),
            "the cancel did not stop the wait: {waited:?}"
        );
        // Not a fallback: nothing was read for the cancelled statement.
        assert_eq!(proxy.status()["causal"]["outcomes"]["fallback"], 0);
    });
    cluster.replica(0).resume_replay().unwrap();
}

/// A `BEGIN READ ONLY` sent to a replica that has not replayed the client's write runs there
/// while its wait is decided; when the wait fails, the proxy throws that answer away and runs the
/// BEGIN elsewhere. The block it opened on the replica must end there too: it was left open, and
/// the replica's connection went back to the pool inside a transaction nobody owned (seed 777504
/// on 15, where a poll that then passed ran the BEGIN again on that connection: `WARNING 25001
/// there is already a transaction in progress`).
#[test]
fn a_read_only_block_whose_wait_failed_leaves_no_transaction_open_on_the_replica() {
    let cluster = Cluster::start(&ClusterConfig::default().replicas(1)).unwrap();
    cluster.wait_streaming(Duration::from_secs(30)).unwrap();
    let t = unique("discarded_block");
    create(&cluster, &t);
    let proxy = proxy_with(&cluster, |f| {
        f.wait_timeout_ms = Some(200);
        f.breaker_ratio = Some(1.0);
    });
    cluster.replica(0).pause_replay().unwrap();
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        for i in 0..3i64 {
            client
                .execute(&format!("INSERT INTO {t} VALUES ($1, 1)"), &[&i])
                .await
                .unwrap();
            client.batch_execute("BEGIN READ ONLY").await.unwrap();
            let rows = client
                .query(&format!("SELECT v FROM {t} WHERE id = $1"), &[&i])
                .await
                .unwrap();
            assert_eq!(rows.len(), 1, "the block sees the client's write {i}");
            client.batch_execute("COMMIT").await.unwrap();
        }
    });
    // The same with a Sync and the block's statements pipelined behind the BEGIN, in one write:
    // they wait for its verdict (they went to the replica behind it, the Sync's ReadyForQuery
    // was thrown away with the BEGIN's answer, and the client waited for it forever).
    let mut wire = Wire::connect(&proxy);
    let insert = wire.flight(&[FrontendMessage::Query(format!(
        "INSERT INTO {t} VALUES (10, 1)"
    ))]);
    assert!(insert.errors.is_empty(), "{insert:?}");
    let block = wire.flight(&[
        FrontendMessage::Query("BEGIN READ ONLY".into()),
        FrontendMessage::Sync,
        FrontendMessage::Query(format!("SELECT v FROM {t} WHERE id = 10")),
        FrontendMessage::Query("COMMIT".into()),
    ]);
    assert!(block.errors.is_empty(), "{block:?}");
    assert_eq!(block.rows, vec![vec![Some("1".to_string())]], "{block:?}");
    assert_eq!(block.tags, b"CZZTDCZCZ".to_vec(), "{block:?}");
    assert!(
        outcome(&proxy, "fallback") >= 1,
        "the paused replica made the wait fail: {}",
        proxy.status()["causal"]["outcomes"]
    );
    let open = cluster
        .replica(0)
        .sql(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE backend_type = 'client backend' AND state LIKE 'idle in transaction%'",
        )
        .unwrap();
    cluster.replica(0).resume_replay().unwrap();
    assert_eq!(
        open.trim(),
        "0",
        "a replica connection was left inside the discarded BEGIN's block"
    );
}

/// A read whose string also sets a setting (`SHOW work_mem; SET work_mem = '7MB'`, a read by its
/// first statement) runs whole on the replica even when its wait fails, and only its answer is
/// thrown away: the SET stays on that server connection, which must not reach the next client
/// there with it. Written for seed 777478 of the differential checker (a new client saw an earlier
/// one's `work_mem` on 15, once): this path was not its cause (the test passed before any change),
/// and it keeps that path covered.
#[test]
fn a_setting_in_a_read_whose_wait_failed_does_not_reach_the_next_client() {
    let cluster = Cluster::start(&ClusterConfig::default().replicas(1)).unwrap();
    cluster.wait_streaming(Duration::from_secs(30)).unwrap();
    let t = unique("discarded_set");
    create(&cluster, &t);
    // One server connection per node, so the next client gets the one the read used.
    let proxy = proxy_with(&cluster, |f| {
        f.pool_size = Some(1);
        f.wait_timeout_ms = Some(200);
        f.breaker_ratio = Some(1.0);
    });
    cluster.replica(0).pause_replay().unwrap();
    let (first, next, port) = rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        client
            .execute(&format!("INSERT INTO {t} VALUES (1, 1)"), &[])
            .await
            .unwrap();
        client
            .batch_execute("SHOW work_mem; SET work_mem = '7MB'")
            .await
            .unwrap();
        let first = show(&client, "SHOW work_mem").await;
        drop(client);
        let client = connect(&proxy.conninfo()).await;
        let next = show(&client, "SHOW work_mem").await;
        let port = server_port(&client).await;
        (first, next, port)
    });
    cluster.replica(0).resume_replay().unwrap();
    assert!(
        outcome(&proxy, "fallback") >= 1,
        "the paused replica made the wait fail: {}",
        proxy.status()["causal"]["outcomes"]
    );
    assert_eq!(first, "7MB", "the client's own SET holds for it");
    assert_eq!(
        port,
        cluster.replica(0).port() as i32,
        "the next client's read is served by the replica"
    );
    assert_eq!(
        next, "4MB",
        "the next client sees the server default, not the first client's SET"
    );
}

/// Reads pipelined behind a write, in the same network write, see it on a replica 50 ms behind:
/// the write's position is known before they are routed. With the default budget they wait on
/// the replica; with a 5 ms one they fall back to the primary, and the replies still come in
/// order, one ReadyForQuery per flight.
#[test]
fn reads_pipelined_behind_a_write_see_it() {
    let settings = [(None, None), (Some(5), None)];
    pipelined_reads_get_their_own_answers("pipelined_reads", &["", ""], 1, 20, &settings);
}

/// Distinct reads pipelined behind a write each get their own answer, in order, whether they
/// wait on the replica or fall back to the primary (a fallback re-runs its own read, not the
/// one queued behind it).
#[test]
fn distinct_pipelined_reads_get_their_own_answers() {
    let settings = [(None, None), (Some(5), None)];
    pipelined_reads_get_their_own_answers("pipelined_distinct", &["a", "b", "c"], 1, 10, &settings);
}

/// The same without the retry buffer (which alone would keep a read from having company on its
/// server connection) and with reads of two statements each (never buffered for a retry): a
/// routed read is still sent only on a connection with nothing else due, so each gets its own
/// answers, in order, waiting or falling back.
#[test]
fn pipelined_reads_without_a_retry_buffer_get_their_own_answers() {
    let settings = [
        (None, Some(0)),
        (Some(5), Some(0)),
        (None, Some(1 << 20)),
        (Some(5), Some(1 << 20)),
    ];
    pipelined_reads_get_their_own_answers(
        "pipelined_unbuffered",
        &["a", "b", "c"],
        2,
        10,
        &settings,
    );
}

/// Found by the differential checker (seed 20261206836, PostgreSQL 15): an INSERT left unsynced,
/// then a proxy command as a simple Query. PostgreSQL 15 to 18 commit the batch's implicit
/// transaction at a Query, so the proxy's stand-in for the command committed the INSERT, and no
/// commit position was taken behind it: the next read went to the replica held 50 ms behind and
/// missed the row. (On 19 the proxy sends no stand-in there: the batch stays open, and the read
/// runs in it on the primary.)
#[test]
fn a_write_committed_by_a_proxy_commands_stand_in_is_read_back() {
    let cluster = shared_delayed_cluster();
    let table = unique("stand_in_commit");
    create(cluster, &table);
    let proxy = proxy_with(cluster, |_| {});
    let mut wire = Wire::connect(&proxy);
    for round in 1..=10 {
        let mut messages = vec![parse_unnamed(&format!(
            "INSERT INTO {table} VALUES ($1::bigint, 1)"
        ))];
        let mut execute = execute_unnamed(&round.to_string());
        execute.pop(); // no Sync: the INSERT stays unsynced behind the Query
        messages.extend(execute);
        messages.push(FrontendMessage::Query("RESET lsngate.route".into()));
        messages.push(FrontendMessage::Query(format!(
            "SELECT count(*) FROM {table}"
        )));
        let reply = wire.flight(&messages);
        assert!(reply.errors.is_empty(), "round {round}: {reply:?}");
        assert_eq!(
            reply.rows.last(),
            Some(&vec![Some(round.to_string())]),
            "round {round}: the read saw every insert: {reply:?}"
        );
        if reply.statuses.last() == Some(&b'T') {
            // 19: the batch's implicit transaction is still open; the client ends it.
            wire.flight(&[FrontendMessage::Sync]);
        }
    }
}

/// Differential seed 20261213921 (19rc1 and 15.18, 2 replicas, `session`, under load): a simple
/// Query whose first statement is `SET` was classified as session state by that statement, and
/// no commit position was taken behind it though its `INSERT` committed; the next read went to a
/// replica that had not replayed it and missed the row. So for every statement that leads a
/// string as session state or a pin: the read after it sees the write, and `SHOW
/// lsngate.commit_lsn` names the commit (the replica is held 50 ms behind).
#[test]
fn a_write_behind_a_leading_set_or_pin_in_one_query_is_read_back() {
    let cluster = shared_delayed_cluster();
    let table = unique("leading_set");
    create(cluster, &table);
    let proxy = proxy_with(cluster, |_| {});
    let leads = [
        "SET application_name = 'r{n}'",
        "SET work_mem = '5MB'",
        "RESET work_mem",
        "DISCARD TEMP",
        "SELECT set_config('application_name', 'c{n}', false)",
    ];
    let mut inserted = 0;
    for (i, lead) in leads.iter().enumerate() {
        let mut wire = Wire::connect(&proxy);
        for round in 1..=3 {
            inserted += 1;
            let lead = lead.replace("{n}", &round.to_string());
            let write = wire.flight(&[FrontendMessage::Query(format!(
                "{lead}; INSERT INTO {table} VALUES ({inserted}, 1)"
            ))]);
            assert!(write.errors.is_empty(), "{lead}: {write:?}");
            let shown = wire.flight(&[FrontendMessage::Query("SHOW lsngate.commit_lsn".into())]);
            let commit = shown
                .rows
                .last()
                .and_then(|row| row.first().cloned())
                .flatten();
            assert!(
                commit.as_ref().is_some_and(|c| c.contains('/')),
                "{lead} (lead {i}, round {round}): no commit position was taken: {shown:?}"
            );
            let read = wire.flight(&[FrontendMessage::Query(format!(
                "SELECT count(*) FROM {table}"
            ))]);
            assert_eq!(
                read.rows.last(),
                Some(&vec![Some(inserted.to_string())]),
                "{lead} (round {round}): the read missed the write: {read:?}"
            );
        }
    }
    // A pin (SQL PREPARE) leading the string: its reads stay on the primary, but the commit's
    // position is the client's token and every `global` reader's floor.
    let mut wire = Wire::connect(&proxy);
    inserted += 1;
    let pinned = wire.flight(&[FrontendMessage::Query(format!(
        "PREPARE w AS INSERT INTO {table} VALUES ({inserted}, 1); EXECUTE w"
    ))]);
    assert!(pinned.errors.is_empty(), "{pinned:?}");
    let shown = wire.flight(&[FrontendMessage::Query("SHOW lsngate.commit_lsn".into())]);
    assert!(
        shown
            .rows
            .last()
            .and_then(|row| row.first().cloned())
            .flatten()
            .is_some_and(|c| c.contains('/')),
        "PREPARE …; EXECUTE: no commit position was taken: {shown:?}"
    );
}

/// Differential seed 20261213607 (15.18, 2 replicas, `session`, under load): a Query reading
/// the replica behind a write, then `RESET application_name` (a startup setting, so sent as its
/// `set_config` with the answer relayed as RESET's), pipelined in one network write. On 15–18
/// the read's replay check failed while the replica was behind, so the read waited to run
/// again; the RESET's rewrite was noted before the proxy drained what was due, the read's re-run
/// took it, and the client got `RESET` tags for its SELECT and the replies out of order. The
/// replica is held 50 ms behind here, so on 15–18 every round's read waits (on 19, `WAIT FOR
/// LSN` runs in the read's own flight, and this checks the same order).
#[test]
fn a_reset_pipelined_behind_a_read_that_waits_is_answered_in_order() {
    let cluster = shared_delayed_cluster();
    let table = unique("reset_behind_read");
    create(cluster, &table);
    let proxy = proxy_with(cluster, |_| {});
    let settings = [("application_name", "diff-start")];
    let round = |wire: &mut Wire, n: usize| {
        let insert = wire.flight(&[FrontendMessage::Query(format!(
            "INSERT INTO {table} VALUES ({n}, 1)"
        ))]);
        assert!(insert.errors.is_empty(), "{insert:?}");
        wire.flight(&[
            FrontendMessage::Query(format!("SELECT count(*) FROM {table}")),
            FrontendMessage::Query("RESET application_name".into()),
        ])
    };
    let primary: std::net::SocketAddr = format!("127.0.0.1:{}", cluster.primary().port())
        .parse()
        .unwrap();
    let expected = round(&mut Wire::connect_to_with(primary, &settings), 1);
    let mut wire = Wire::connect_to_with(proxy.addr, &settings);
    for n in 2..=6 {
        let got = round(&mut wire, n);
        assert_eq!(
            got.tags, expected.tags,
            "round {n}: the replies' order differs from PostgreSQL's: {got:?} against {expected:?}"
        );
        assert_eq!(
            got.rows,
            vec![vec![Some(n.to_string())]],
            "round {n}: {got:?}"
        );
    }
}

/// Per (wait budget in ms, retry buffer size) setting, `rounds` rounds of one read per label in
/// `reads`, each of `statements` statements, pipelined behind an INSERT in one network write on
/// the replica held 50 ms behind: every statement answers its own label and the count with the
/// insert, in order. The default budget waits, a 5 ms one falls back to the primary.
fn pipelined_reads_get_their_own_answers(
    name: &str,
    reads: &[&str],
    statements: usize,
    rounds: usize,
    settings: &[(Option<u64>, Option<usize>)],
) {
    let cluster = shared_delayed_cluster();
    let table = unique(name);
    cluster
        .primary()
        .sql(&format!("CREATE TABLE {table} (id int)"))
        .unwrap();
    caught_up(cluster);
    let mut inserted = 0;
    for &(budget, buffer) in settings {
        let proxy = proxy_with(cluster, |f| {
            f.wait_timeout_ms = budget;
            f.retry_buffer_size = buffer;
        });
        let mut wire = Wire::connect(&proxy);
        for round in 1..=rounds {
            inserted += 1;
            let mut messages = vec![parse_unnamed(&format!(
                "INSERT INTO {table} VALUES ($1::int)"
            ))];
            messages.extend(execute_unnamed(&inserted.to_string()));
            let mut want: Vec<Vec<Option<String>>> = Vec::new();
            for read in reads {
                let texts: Vec<String> = (1..=statements)
                    .map(|s| format!("SELECT '{read}{s}:' || count(*) FROM {table}"))
                    .collect();
                messages.push(FrontendMessage::Query(texts.join("; ")));
                want.extend((1..=statements).map(|s| vec![Some(format!("{read}{s}:{inserted}"))]));
            }
            let reply = wire.flight(&messages);
            let context = format!("budget {budget:?}, buffer {buffer:?}, round {round}");
            assert!(reply.errors.is_empty(), "{context}: {reply:?}");
            assert_eq!(reply.rows, want, "{context}");
        }
        let expected = if budget.is_some() {
            "fallback"
        } else {
            "waited"
        };
        assert!(outcome(&proxy, expected) > 0, "{}", proxy.status());
    }
}

/// A COPY FROM STDIN is a write like any other: its rows are read back on the replica held
/// 50 ms behind. Over the simple protocol its position is taken behind the client's CopyDone
/// (never inside the COPY, where the server would take the proxy's statement for COPY data);
/// over the extended protocol behind the Sync the client sends after CopyDone (one sent behind
/// the Execute is ignored in COPY mode and gets no ReadyForQuery); an extended INSERT ending in
/// Flush has its position taken behind the flight whose Sync commits it.
#[test]
fn copy_from_stdin_over_either_protocol_is_read_back_on_a_replica() {
    let cluster = shared_delayed_cluster();
    let table = unique("copy_read_back");
    create(cluster, &table);
    let proxy = proxy_with(cluster, |_| {});
    let mut wire = Wire::connect(&proxy);
    let copy = format!("COPY {table} (id, v) FROM STDIN");
    let rows = |first: u32| {
        FrontendMessage::CopyData(Bytes::from(format!("{first}\t1\n{}\t2\n", first + 1)))
    };
    let bind = FrontendMessage::Bind {
        portal: String::new(),
        statement: String::new(),
        // no parameter formats, no parameters, no result formats
        rest: Bytes::from_static(&[0, 0, 0, 0, 0, 0]),
    };
    let execute = FrontendMessage::Execute {
        portal: String::new(),
        max_rows: 0,
    };
    use FrontendMessage::{CopyDone, Flush, Query, Sync};
    // (what, flights with the ReadyForQuerys each gets)
    let writes = [
        (
            "a simple COPY",
            vec![(vec![Query(copy.clone()), rows(1), CopyDone], 1)],
        ),
        (
            "an extended COPY",
            vec![(
                vec![
                    parse_unnamed(&copy),
                    bind.clone(),
                    execute.clone(),
                    rows(3),
                    CopyDone,
                    Sync,
                ],
                1,
            )],
        ),
        (
            "an extended COPY with a Sync before its data",
            vec![(
                vec![
                    parse_unnamed(&copy),
                    bind.clone(),
                    execute.clone(),
                    Sync,
                    rows(5),
                    CopyDone,
                    Sync,
                ],
                1,
            )],
        ),
        (
            "an extended INSERT ending in Flush, then a Sync",
            vec![
                (
                    vec![
                        parse_unnamed(&format!("INSERT INTO {table} VALUES (7, 1), (8, 2)")),
                        bind,
                        execute,
                        Flush,
                    ],
                    0,
                ),
                (vec![Sync], 1),
            ],
        ),
    ];
    let mut count = 0;
    for (what, flights) in writes {
        for (messages, readies) in flights {
            let reply = wire.flight_with(&messages, readies);
            assert!(reply.errors.is_empty(), "{what}: {reply:?}");
        }
        count += 2;
        let read = format!("SELECT count(*), pg_is_in_recovery() FROM {table}");
        let reply = wire.flight(&[Query(read)]);
        assert!(reply.errors.is_empty(), "{what}: {reply:?}");
        assert_eq!(
            reply.rows[0][0].as_deref(),
            Some(count.to_string().as_str()),
            "the read after {what} missed its rows (on a replica: {:?}); {}",
            reply.rows[0][1],
            proxy.status()["causal"]["outcomes"]
        );
    }
}

/// A read pipelined behind the end of a COPY FROM STDIN and a Query holding a RESET, on the
/// replica held 50 ms behind, reads the copied rows (differential seed 20261214754). The read
/// arrived while the COPY's answer was still to come, so it was planned to stay on the COPY's
/// connection; the RESET's read-back was then heard first, which ended the COPY, the connection
/// was let go, and the read went to a replica with no floor (a stale read). Each round: the
/// COPY's data sent after its CopyInResponse or in the same write, and a Query between the
/// COPY and the read that resets a setting, alone or behind a write.
#[test]
fn a_read_pipelined_behind_a_copy_and_a_reset_reads_the_copied_rows() {
    let cluster = shared_delayed_cluster();
    let table = unique("copy_reset_read");
    create(cluster, &table);
    let proxy = proxy_with(cluster, |_| {});
    let mut wire = Wire::connect(&proxy);
    use FrontendMessage::{CopyData, CopyDone, Query};
    let mut count = 0;
    let mut round = 0;
    for between in [
        "RESET work_mem",
        "INSERT INTO {t} (id, v) VALUES ({n}, 0); RESET work_mem",
        "COMMIT; INSERT INTO {t} (id, v) VALUES ({n}, 0); RESET work_mem",
        "SET work_mem = '8MB'",
    ] {
        for copy_in_first in [true, false] {
            round += 1;
            let first = round * 10;
            let copy = Query(format!("COPY {table} (id, v) FROM STDIN"));
            let between = between
                .replace("{t}", &table)
                .replace("{n}", &(first + 5).to_string());
            count += 2 + usize::from(between.contains("INSERT"));
            let read = format!("SELECT count(*), pg_is_in_recovery() FROM {table}");
            let mut messages = vec![
                CopyData(Bytes::from(format!("{first}\t1\n{}\t2\n", first + 1))),
                CopyDone,
                Query(between.clone()),
                Query(read),
            ];
            if copy_in_first {
                wire.send(&[copy]);
                let started = wire.until(b'G');
                assert!(started.errors.is_empty(), "{started:?}");
            } else {
                messages.insert(0, copy);
            }
            let reply = wire.flight_with(&messages, 3);
            let context =
                format!("round {round} ({between:?}, CopyInResponse first: {copy_in_first})");
            assert!(reply.errors.is_empty(), "{context}: {reply:?}");
            assert_eq!(
                reply.rows.last().and_then(|r| r[0].as_deref()),
                Some(count.to_string().as_str()),
                "{context}: the read missed rows (on a replica: {:?}); {}",
                reply.rows.last().map(|r| r[1].clone()),
                proxy.status()["causal"]["outcomes"]
            );
        }
    }
}

/// A transaction block on the primary ended by a flight whose first statement is not `COMMIT`
/// (a Query `COMMIT; RESET …`, `INSERT …; COMMIT`, an extended batch of `COMMIT` and another
/// statement) is read back on the replica held 50 ms behind: by a read pipelined behind it and by
/// the next read on its own. Such a flight is classified a write, and inside a block it took no
/// commit position: the next read went to a replica without the block's rows. And with a RESET
/// among the statements, the pipelined read, planned while the block was open to stay on its
/// connection, had the RESET's read-back heard first, which ended the block, and it went to a
/// replica with no floor at all.
#[test]
fn a_block_ended_by_a_flight_led_by_another_statement_is_read_back() {
    let cluster = shared_delayed_cluster();
    let table = unique("block_end_read");
    create(cluster, &table);
    let proxy = proxy_with(cluster, |_| {});
    let mut wire = Wire::connect(&proxy);
    use FrontendMessage::{Query, Sync};
    let execute = || FrontendMessage::Execute {
        portal: String::new(),
        max_rows: 0,
    };
    let bind = || FrontendMessage::Bind {
        portal: String::new(),
        statement: String::new(),
        // no parameter formats, no parameters, no result formats
        rest: Bytes::from_static(&[0, 0, 0, 0, 0, 0]),
    };
    let mut rows = 0;
    // Each round's end of its block, with the id an INSERT among its statements writes.
    let ends = |id: usize| -> [(&'static str, Vec<FrontendMessage>); 5] {
        [
            (
                "COMMIT, then RESET",
                vec![Query("COMMIT".into()), Query("RESET work_mem".into())],
            ),
            (
                "COMMIT; RESET",
                vec![Query("COMMIT; RESET work_mem".into())],
            ),
            (
                "INSERT; COMMIT",
                vec![Query(format!(
                    "INSERT INTO {table} VALUES ({id}, 1); COMMIT"
                ))],
            ),
            (
                "COMMIT; SET",
                vec![Query("COMMIT; SET work_mem = '8MB'".into())],
            ),
            (
                "an extended COMMIT and RESET",
                vec![
                    parse_unnamed("COMMIT"),
                    bind(),
                    execute(),
                    parse_unnamed("RESET work_mem"),
                    bind(),
                    execute(),
                    Sync,
                ],
            ),
        ]
    };
    for round in 0..5 {
        let id = round * 10;
        let (what, end) = ends(id + 2).into_iter().nth(round).expect("five ends");
        for messages in [
            vec![Query("BEGIN".into())],
            vec![Query(format!("INSERT INTO {table} VALUES ({}, 0)", id + 1))],
        ] {
            let reply = wire.flight(&messages);
            assert!(reply.errors.is_empty(), "{what}: {reply:?}");
        }
        rows += 1 + usize::from(what.contains("INSERT"));
        let read = || Query(format!("SELECT count(*), pg_is_in_recovery() FROM {table}"));
        let mut messages = end;
        messages.push(read());
        for (how, messages) in [
            ("pipelined behind it", messages),
            ("after it", vec![read()]),
        ] {
            let reply = wire.flight(&messages);
            assert!(reply.errors.is_empty(), "{what}, {how}: {reply:?}");
            assert_eq!(
                reply.rows.last().and_then(|r| r[0].as_deref()),
                Some(rows.to_string().as_str()),
                "a read {how} a block ended by {what} missed its rows (on a replica: {:?}); {}",
                reply.rows.last().map(|r| r[1].clone()),
                proxy.status()["causal"]["outcomes"]
            );
        }
    }
}

/// CI's differential seed 20261394 (15.18, the lagging setup; intermittent there): a write
/// pipelined right behind the `COMMIT` (or `ROLLBACK`) of its client's block runs outside any
/// block, but it was planned while the client's last ReadyForQuery still said "in a block", so
/// it took no position; the next read went to the replica without its row. Here the client
/// sends the block's end and the write in one network write, so both are planned before the
/// server has answered either; a read on its own follows each round.
#[test]
fn a_write_pipelined_behind_its_blocks_end_is_read_back() {
    let cluster = shared_delayed_cluster();
    let table = unique("write_behind_block_end");
    create(cluster, &table);
    let proxy = proxy_with(cluster, |_| {});
    let mut wire = Wire::connect(&proxy);
    use FrontendMessage::{Query, Sync};
    let insert_extended = |id: usize| {
        let mut messages =
            crate::statements::run_unnamed(&format!("INSERT INTO {table} VALUES ({id}, 2)"))
                .to_vec();
        messages.push(Sync);
        messages
    };
    let mut rows = 0;
    // (what, the block's end, whether its own INSERT survives, whether the block fails first)
    let rounds: [(&str, &str, bool, bool, bool); 5] = [
        ("COMMIT, then an INSERT", "COMMIT", true, false, false),
        ("ROLLBACK, then an INSERT", "ROLLBACK", false, false, false),
        (
            "COMMIT of a failed block, then an INSERT",
            "COMMIT",
            false,
            true,
            false,
        ),
        (
            "COMMIT, then an extended INSERT",
            "COMMIT",
            true,
            false,
            true,
        ),
        ("END, then an extended INSERT", "END", true, false, true),
    ];
    for (round, (what, end, kept, fail, extended)) in rounds.into_iter().enumerate() {
        let id = round * 10;
        for messages in [
            vec![Query("BEGIN".into())],
            vec![Query(format!("INSERT INTO {table} VALUES ({}, 0)", id + 1))],
        ] {
            let reply = wire.flight(&messages);
            assert!(reply.errors.is_empty(), "{what}: {reply:?}");
        }
        if fail {
            let reply = wire.flight(&[Query("SELECT 1/0".into())]);
            assert_eq!(reply.errors.len(), 1, "{what}: {reply:?}");
        }
        rows += usize::from(kept && !fail) + 1;
        let mut messages = vec![Query(end.into())];
        if extended {
            messages.extend(insert_extended(id + 2));
        } else {
            messages.push(Query(format!("INSERT INTO {table} VALUES ({}, 1)", id + 2)));
        }
        let reply = wire.flight(&messages);
        assert!(reply.errors.is_empty(), "{what}: {reply:?}");
        let reply = wire.flight(&[Query(format!(
            "SELECT count(*), pg_is_in_recovery() FROM {table}"
        ))]);
        assert!(reply.errors.is_empty(), "{what}: {reply:?}");
        assert_eq!(
            reply.rows.last().and_then(|r| r[0].as_deref()),
            Some(rows.to_string().as_str()),
            "a read after {what} missed a row (on a replica: {:?}); {}",
            reply.rows.last().map(|r| r[1].clone()),
            proxy.status()["causal"]["outcomes"]
        );
    }
}

/// Issue #21's failover: replica 1 stops receiving, the primary writes a long tail that only
/// replica 2 replays, the primary dies and replica 1 is promoted. Replica 2 is left on the old
/// timeline *ahead* of the fork point, its WAL receiver failing. A bare `X/Y` committed on the new
/// primary and handed to another connection is numerically below what the orphan replayed: the
/// orphan must serve neither that read nor any other, whether the proxy watched the failover or
/// started after it.
#[test]
fn an_orphan_ahead_of_the_fork_point_serves_no_read_with_a_bare_floor_or_without_one() {
    let cluster = Cluster::start(&ClusterConfig::default().replicas(2)).unwrap();
    cluster.wait_streaming(Duration::from_secs(30)).unwrap();
    let t = unique("fork");
    create(&cluster, &t);
    cluster
        .primary()
        .sql(&format!("INSERT INTO {t} VALUES (1, 0)"))
        .unwrap();
    caught_up(&cluster);
    let watching = proxy_with(&cluster, |f| f.wait_timeout_ms = Some(200));
    // The proxy has seen both replicas stream timeline 1.
    wait_for_replica_timelines(&watching, 2);
    let (promoted, orphan) = (cluster.replica(0), cluster.replica(1));
    // The tail only the orphan gets: a row version the new primary never has.
    let orphan_replayed = cluster
        .fail_over_leaving_orphan(0, 1, &format!("UPDATE {t} SET v = 1 WHERE id = 1"))
        .unwrap();
    let orphan_port = orphan.port() as i32;
    wait_primary_known(&watching, promoted.port());

    let writer = format!(
        "{} options='-c lsngate.consistency=token'",
        watching.conninfo()
    );
    let (floor, token) = rt().block_on(async {
        let client = connect(&writer).await;
        execute_once_a_primary_takes_it(&client, &format!("UPDATE {t} SET v = 2 WHERE id = 1"))
            .await;
        (
            show(&client, "SHOW lsngate.commit_lsn").await,
            show(&client, "SHOW lsngate.commit_token").await,
        )
    });
    assert_eq!(
        token,
        format!("{floor}.t2"),
        "the commit's timeline-carrying form"
    );
    let below = promoted
        .sql(&format!(
            "SELECT '{floor}'::pg_lsn < '{orphan_replayed}'::pg_lsn"
        ))
        .unwrap();
    assert_eq!(
        below, "t",
        "the test needs the new primary's commit {floor} below the orphan's replay position {orphan_replayed}"
    );
    let after = proxy_with(&cluster, |f| f.wait_timeout_ms = Some(200));
    let cases = [
        (&watching, "watched the failover", &floor),
        (&after, "started after it", &floor),
        (&after, "started after it (timeline token)", &token),
    ];
    for (proxy, which, floor) in cases {
        rt().block_on(async {
            let reader = connect(&proxy.conninfo()).await;
            reader
                .batch_execute(&format!("SET lsngate.min_lsn = '{floor}'"))
                .await
                .unwrap();
            let eventual = connect(&format!(
                "{} options='-c lsngate.consistency=eventual'",
                proxy.conninfo()
            ))
            .await;
            for _ in 0..20 {
                let row = reader
                    .query_one(
                        &format!("SELECT v, inet_server_port() FROM {t} WHERE id = 1"),
                        &[],
                    )
                    .await
                    .unwrap();
                let (v, port): (i32, i32) = (row.get(0), row.get(1));
                assert!(
                    v == 2 && port != orphan_port,
                    "proxy that {which}: a read with floor {floor} got v = {v} from port {port} (orphan {orphan_port})"
                );
                let port = server_port(&eventual).await;
                assert_ne!(
                    port, orphan_port,
                    "proxy that {which}: the orphan served a read without a floor"
                );
            }
        });
    }
    assert_eq!(watching.status()["causal"]["primary"]["timeline"], 2);
}

/// Waits until the proxy's status shows `n` replicas with a known timeline.
fn wait_for_replica_timelines(proxy: &TestProxy, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = proxy.status();
        let known = status["causal"]["replicas"]
            .as_array()
            .map_or(0, |r| r.iter().filter(|r| r["timeline"].is_u64()).count());
        if known >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the proxy never learned {n} replica timelines: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A read pipelined behind a batch whose SQL `PREPARE` the server skipped (an earlier Bind in it
/// failed) is still routed by its floor. The unconfirmed pin kept the read on the session's
/// connection; hearing the batch's answer undid the pin and let the connection go, and the
/// read, planned on the old state, went to a replica with no wait: a stale read (seed
/// 20261363 of the differential checker, under load). The replica's replay is paused here, so
/// a read served there without its wait misses the row.
#[test]
fn a_read_behind_a_skipped_prepare_still_waits_for_its_floor() {
    let cluster = Cluster::start(&ClusterConfig::default().replicas(1)).unwrap();
    cluster.wait_streaming(Duration::from_secs(30)).unwrap();
    let t = unique("skipped_pin");
    create(&cluster, &t);
    let proxy = proxy_with(&cluster, |f| f.wait_timeout_ms = Some(200));
    cluster.replica(0).pause_replay().unwrap();
    let mut wire = Wire::connect(&proxy);
    let wrote = wire.flight(&[FrontendMessage::Query(format!(
        "INSERT INTO {t} VALUES (1, 1)"
    ))]);
    assert!(wrote.errors.is_empty(), "{:?}", wrote.errors);
    let no_params = Bytes::from_static(&[0, 0, 0, 0, 0, 0]);
    let reply = wire.flight_with(
        &[
            FrontendMessage::Bind {
                portal: String::new(),
                statement: "missing".into(),
                rest: no_params.clone(),
            },
            FrontendMessage::Execute {
                portal: String::new(),
                max_rows: 0,
            },
            parse_unnamed("PREPARE skipped_q AS SELECT 1"),
            FrontendMessage::Bind {
                portal: String::new(),
                statement: String::new(),
                rest: no_params,
            },
            FrontendMessage::Execute {
                portal: String::new(),
                max_rows: 0,
            },
            FrontendMessage::Sync,
            FrontendMessage::Query(format!("SELECT count(*) FROM {t}")),
        ],
        2,
    );
    cluster.replica(0).resume_replay().unwrap();
    assert_eq!(
        reply.errors.len(),
        1,
        "only the missing statement fails: {:?}",
        reply.errors
    );
    assert!(
        reply.errors[0].contains("does not exist"),
        "{:?}",
        reply.errors
    );
    assert_eq!(
        reply.rows,
        vec![vec![Some("1".to_string())]],
        "the read behind the batch sees the client's own write"
    );
}

/// Reads that fail their wait and run again elsewhere, sent by libpq's pipeline mode (a driver
/// nobody here wrote), answer as PostgreSQL does on a direct connection: a `Describe S ""` ahead
/// of the flight's own `Parse ""`, a Parse of a name the client holds (42P05). Before
/// 885f13f a read run again was read against the record of the flight being assembled by then:
/// by hand on 2026-12-07 (15.18, one replica 50 ms behind) the Parse shape answered unlike
/// PostgreSQL in 23 of 30 rounds.
#[test]
fn reads_run_again_from_a_libpq_pipeline_answer_like_postgresql() {
    let cluster = shared_delayed_cluster();
    // A budget shorter than the replica's delay: the reads' waits fail and they run again (the
    // breaker never opens: every read may fall back).
    let proxy = proxy_with(cluster, |f| {
        f.wait_timeout_ms = Some(20);
        f.breaker_ratio = Some(1.0);
    });
    let t = unique("rerun");
    cluster
        .primary()
        .sql(&format!("CREATE TABLE {t} (id int)"))
        .unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("clients")
        .join("libpq_pipeline_reruns.py");
    let (stdout, stderr) = run_ok(std::process::Command::new("python3").arg(script).args([
        &cluster.primary().url(),
        &proxy.url(),
        &t,
        "20",
    ]));
    let fallback = outcome(&proxy, "fallback");
    println!("{stdout} (reads run again on the primary: {fallback})");
    assert!(
        stdout.contains("rounds 20, unlike PostgreSQL: describe 0, reparse 0"),
        "{stdout}\n{stderr}"
    );
    assert!(
        fallback > 0,
        "no read ran again, so the comparison proves nothing: {}",
        proxy.status()["causal"]["outcomes"]
    );
}
