//! Causal scopes (`SET lsngate.scope`, `/* lsngate_scope='…' */`, `-c lsngate.scope=…`): a
//! write under a scope is seen by every later read under it, on any connection of any client of
//! the proxy — with a replica held 50 ms behind, on both server versions. The headline is Go's
//! pgxpool writing on one pooled connection and reading on another, against the same program
//! without a scope (the control, which must show stale reads). A scope the proxy does not hold
//! (evicted by a tiny `scope_capacity`, expired by a short `scope_ttl_ms`) reads as `universal`:
//! shown by a read that sees a write made under no scope at all.

use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::support::*;
use lsngate_cluster::{Cluster, shared_delayed_cluster};

fn proxy_with(cluster: &Cluster, change: impl FnOnce(&mut lsngate_proxy::FileConfig)) -> TestProxy {
    let mut file = file_config(cluster);
    file.pool_size = Some(12);
    change(&mut file);
    TestProxy::with(file)
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

fn scopes_status(proxy: &TestProxy) -> serde_json::Value {
    proxy.status()["causal"]["scopes"].clone()
}

fn count(value: &serde_json::Value, path: &[&str]) -> u64 {
    let mut v = value;
    for key in path {
        v = &v[*key];
    }
    v.as_u64()
        .unwrap_or_else(|| panic!("no count at {path:?} in {value}"))
}

/// `stale=S replica=R reads=N` from the pgxpool program, run in `mode` (set, comment, none).
fn pgxpool(proxy: &TestProxy, table: &str, ops: usize, workers: usize, mode: &str) -> [u64; 3] {
    static PROGRAM: OnceLock<std::path::PathBuf> = OnceLock::new();
    let program = PROGRAM.get_or_init(|| crate::drivers::build_pgx_program("scopes_pgxpool"));
    let (stdout, _) = run_ok(Command::new(program).args([
        &proxy.url(),
        table,
        &ops.to_string(),
        &workers.to_string(),
        mode,
    ]));
    let line = stdout.trim();
    ["stale", "replica", "reads"].map(|name| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
    })
}

#[test]
fn pgxpool_8_workers_writing_and_reading_on_different_pooled_connections_under_a_scope() {
    let cluster = shared_delayed_cluster();
    let proxy = proxy_with(cluster, |_| {});
    // The control: the read's connection knows nothing of the write made on another.
    let t = unique("scope_control");
    create(cluster, &t);
    let [stale, replica, reads] = pgxpool(&proxy, &t, 1200, 8, "none");
    println!("no scope (control), 8 workers: stale={stale} replica={replica} reads={reads}");
    assert_eq!(reads, 1200);
    assert!(
        stale > 0,
        "the control must show stale reads, or 0 stale under a scope proves nothing"
    );
    for mode in ["set", "comment"] {
        let t = unique(&format!("scope_{mode}"));
        create(cluster, &t);
        let [stale, replica, reads] = pgxpool(&proxy, &t, 1200, 8, mode);
        println!("scope by {mode}, 8 workers: stale={stale} replica={replica} reads={reads}");
        assert_eq!(reads, 1200);
        assert_eq!(
            stale, 0,
            "a read under the scope missed the scope's write ({mode})"
        );
        assert!(
            replica * 2 > reads,
            "most reads must be served by the replica: {replica}/{reads} ({mode})"
        );
    }
    let scopes = scopes_status(&proxy);
    println!("/status causal.scopes: {scopes}");
    assert_eq!(count(&scopes, &["tracked"]), 8, "one scope per worker");
    assert!(count(&scopes, &["raises"]) >= 2400);
    assert!(count(&scopes, &["reads", "known_floor"]) >= 2400 - 16);
    assert_eq!(
        count(&scopes, &["reads", "outcomes", "stale"]),
        0,
        "fallback = primary never serves stale"
    );
    let metrics = proxy.http_get("/metrics");
    // Other tests' proxies in this process report to the same registry: the gauge is there,
    // its value is whichever proxy was scraped last.
    assert!(
        metrics.contains("lsngate_proxy_scopes_tracked"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("user:"),
        "no scope name may appear in the metrics"
    );
}

/// (rows with `id`, served by a replica) read on `client`.
async fn read_row(
    client: &tokio_postgres::Client,
    sql_prefix: &str,
    table: &str,
    id: i64,
) -> (i64, bool) {
    let row = client
        .query_one(
            &format!("{sql_prefix}SELECT count(*), pg_is_in_recovery() FROM {table} WHERE id = $1"),
            &[&id],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[test]
fn set_reset_comment_and_startup_options_carry_a_scope_across_connections() {
    let cluster = shared_delayed_cluster();
    let proxy = proxy_with(cluster, |_| {});
    let t = unique("scope_ways");
    create(cluster, &t);
    rt().block_on(async {
        // The writer in `eventual` mode: no floor of its own, but its scope's writes count.
        let writer = connect(&format!(
            "{} options='-c lsngate.consistency=eventual'",
            proxy.conninfo()
        ))
        .await;
        assert_eq!(show(&writer, "SHOW lsngate.scope").await, "");
        writer
            .batch_execute("SET lsngate.scope = 'tenant:acme/eu'")
            .await
            .unwrap();
        assert_eq!(show(&writer, "SHOW lsngate.scope").await, "tenant:acme/eu");
        // A reader that set the scope in its startup options, one that names it per statement,
        // and one that set it over the extended protocol.
        let by_options = connect(&format!(
            "{} options='-c lsngate.scope=tenant:acme/eu'",
            proxy.conninfo()
        ))
        .await;
        assert_eq!(
            show(&by_options, "SHOW lsngate.scope").await,
            "tenant:acme/eu"
        );
        let by_comment = connect(&proxy.conninfo()).await;
        let by_extended = connect(&proxy.conninfo()).await;
        by_extended
            .batch_execute("SET lsngate.consistency = eventual")
            .await
            .unwrap();
        by_extended
            .execute("SET lsngate.scope TO 'tenant:acme/eu'", &[])
            .await
            .unwrap();
        let comment = "/* lsngate_scope='tenant%3Aacme%2Feu' */ ";
        let (mut stale, mut replica) = (0, 0);
        for id in 0..60i64 {
            if id % 3 == 0 {
                // A write inside a transaction block, committed by its COMMIT.
                writer
                    .batch_execute(&format!("BEGIN; INSERT INTO {t} VALUES ({id}, 1); COMMIT"))
                    .await
                    .unwrap();
            } else {
                writer
                    .execute(&format!("INSERT INTO {t} VALUES ($1, 1)"), &[&id])
                    .await
                    .unwrap();
            }
            let (reader, prefix) = match id % 3 {
                0 => (&by_options, ""),
                1 => (&by_comment, comment),
                _ => (&by_extended, ""),
            };
            let (rows, on_replica) = read_row(reader, prefix, &t, id).await;
            stale += usize::from(rows == 0);
            replica += usize::from(on_replica);
        }
        println!("60 writes, reads on three other connections: stale={stale} replica={replica}");
        assert_eq!(stale, 0, "a read under the scope missed its write");
        assert!(replica > 30, "most reads on the replica: {replica}/60");
        // The comment applied to its statement only; RESET clears a scope SET in the session,
        // and RESET or SET TO DEFAULT return one from the startup options to that login value,
        // as on a direct connection.
        assert_eq!(show(&by_comment, "SHOW lsngate.scope").await, "");
        writer.batch_execute("RESET lsngate.scope").await.unwrap();
        assert_eq!(show(&writer, "SHOW lsngate.scope").await, "");
        by_options
            .batch_execute("SET lsngate.scope = 'user:1'")
            .await
            .unwrap();
        by_options
            .batch_execute("SET lsngate.scope TO DEFAULT")
            .await
            .unwrap();
        assert_eq!(
            show(&by_options, "SHOW lsngate.scope").await,
            "tenant:acme/eu"
        );
    });
}

#[test]
fn bad_scope_names_are_refused_for_that_statement_and_the_session_goes_on() {
    let cluster = shared_delayed_cluster();
    let proxy = proxy_with(cluster, |_| {});
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        client
            .batch_execute("SET lsngate.scope = 'user:1'")
            .await
            .unwrap();
        let long = format!("'{}'", "a".repeat(129));
        let refused = [
            (
                "SET lsngate.scope = 'user 42'".to_string(),
                "letters, digits",
            ),
            (
                "SET lsngate.scope = 'a'';DROP TABLE x;--'".to_string(),
                "letters, digits",
            ),
            (format!("SET lsngate.scope = {long}"), "at most 128 bytes"),
            ("SET lsngate.scope = ''".to_string(), "RESET lsngate.scope"),
            (
                "/* lsngate_scope='naïve' */ SELECT 1".to_string(),
                "lsngate_scope comment",
            ),
        ];
        for (sql, says) in &refused {
            // Over the simple and the extended protocol.
            for extended in [false, true] {
                let error = if extended {
                    client.execute(sql.as_str(), &[]).await.unwrap_err()
                } else {
                    client.batch_execute(sql).await.unwrap_err()
                };
                let db = error
                    .as_db_error()
                    .unwrap_or_else(|| panic!("{sql}: {error}"));
                println!("{sql} -> ERROR {}: {}", db.code().code(), db.message());
                assert_eq!(db.code().code(), "22023", "{sql}");
                assert!(db.message().contains(says), "{sql}: {}", db.message());
                assert_eq!(
                    show(&client, "SELECT 41 + 1").await,
                    "42",
                    "the session goes on"
                );
                assert_eq!(
                    show(&client, "SHOW lsngate.scope").await,
                    "user:1",
                    "a refused name changes nothing"
                );
            }
        }
    });
    // In the startup options: the login is refused, naming the rule.
    let error = rt().block_on(async {
        let conninfo = format!("{} options='-c lsngate.scope=user%42'", proxy.conninfo());
        tokio_postgres::connect(&conninfo, tokio_postgres::NoTls)
            .await
            .err()
            .expect("a bad scope in the startup options refuses the login")
    });
    let message = error
        .as_db_error()
        .map(|e| e.message().to_string())
        .unwrap_or_default();
    assert!(
        message.contains("startup options") && message.contains("letters, digits"),
        "{error}"
    );
}

#[test]
fn with_require_signed_scopes_only_scopes_signed_with_the_secret_are_taken() {
    // The client signs in Python, from the format the README documents: a bare name, a forged
    // signature and an expired scope are refused; a signed scope carries read-your-writes from
    // one psycopg connection to another (the replica held 50 ms behind).
    let cluster = shared_delayed_cluster();
    let secret = "scope-secret-7";
    let proxy = proxy_with(cluster, |f| {
        f.token_secret = Some(secret.into());
        f.require_signed_scopes = Some(true);
    });
    let t = unique("scope_signed");
    create(cluster, &t);
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients");
    let (stdout, _) = run_ok(
        Command::new("python3")
            .arg(dir.join("signed_scope_psycopg.py"))
            .args([&proxy.url(), secret, &t, "200"]),
    );
    let line = stdout.trim();
    println!("{line}");
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
            .to_string()
    };
    for refused in ["unsigned", "forged", "expired"] {
        assert_eq!(field(refused), "22023", "{refused}: {line}");
    }
    assert_eq!(field("reads"), "200", "{line}");
    assert_eq!(field("stale"), "0", "{line}");
    assert_ne!(field("replica"), "0", "the replica served reads: {line}");
}

/// Writes row `id` under `scope` on `writer`, then a row under no scope on `other`, then reads
/// under `scope` on `reader`: (saw its own row, saw the row written under no scope).
async fn write_then_read_elsewhere(
    [writer, other, reader]: [&tokio_postgres::Client; 3],
    table: &str,
    scope: &str,
    id: i64,
    before_read: impl std::future::Future<Output = ()>,
) -> (bool, bool) {
    let comment = format!("/* lsngate_scope='{scope}' */ ");
    writer
        .execute(
            &format!("{comment}INSERT INTO {table} VALUES ($1, 1)"),
            &[&id],
        )
        .await
        .unwrap();
    before_read.await;
    other
        .execute(&format!("INSERT INTO {table} VALUES ($1, 2)"), &[&-id])
        .await
        .unwrap();
    let (own, _) = read_row(reader, &comment, table, id).await;
    let (unscoped, _) = read_row(reader, &comment, table, -id).await;
    (own == 1, unscoped == 1)
}

#[test]
fn a_scope_pushed_out_by_a_tiny_capacity_reads_as_universal_never_stale() {
    let cluster = shared_delayed_cluster();
    let proxy = proxy_with(cluster, |f| f.scope_capacity = Some(2));
    let t = unique("scope_evicted");
    create(cluster, &t);
    rt().block_on(async {
        let writer = connect(&proxy.conninfo()).await;
        let other = connect(&proxy.conninfo()).await;
        let reader = connect(&proxy.conninfo()).await;
        let mut missed = 0;
        for id in 1..=30i64 {
            let scope = format!("user:{id}");
            // Two writes under other scopes push this one out of a book of 2.
            let push_out = async {
                for other_scope in ["filler:a", "filler:b"] {
                    writer
                        .batch_execute(&format!(
                            "/* lsngate_scope='{other_scope}' */ UPDATE {t} SET v = v WHERE id = 0"
                        ))
                        .await
                        .unwrap();
                }
            };
            let (own, unscoped) =
                write_then_read_elsewhere([&writer, &other, &reader], &t, &scope, id, push_out)
                    .await;
            assert!(own, "read under evicted scope {scope} missed its write");
            missed += usize::from(!unscoped);
        }
        assert_eq!(
            missed, 0,
            "an evicted scope reads as universal: it sees even writes made under no scope"
        );
    });
    let scopes = scopes_status(&proxy);
    println!("/status causal.scopes: {scopes}");
    assert!(count(&scopes, &["evictions", "capacity"]) >= 30, "{scopes}");
    assert!(
        count(&scopes, &["reads", "unknown_floor"]) >= 30,
        "{scopes}"
    );
    assert!(count(&scopes, &["tracked"]) <= 2);
    let metrics = proxy.http_get("/metrics");
    assert!(
        metrics.contains("lsngate_proxy_scope_evictions_total{reason=\"capacity\"}"),
        "{metrics}"
    );
}

#[test]
fn a_scope_expired_by_its_ttl_reads_as_universal_never_stale() {
    let cluster = shared_delayed_cluster();
    let ttl = Duration::from_millis(300);
    let proxy = proxy_with(cluster, |f| f.scope_ttl_ms = Some(ttl.as_millis() as u64));
    let t = unique("scope_expired");
    create(cluster, &t);
    rt().block_on(async {
        let writer = connect(&proxy.conninfo()).await;
        let other = connect(&proxy.conninfo()).await;
        let reader = connect(&proxy.conninfo()).await;
        for id in 1..=10i64 {
            let scope = format!("device:{id}");
            let outlive_ttl = tokio::time::sleep(ttl + Duration::from_millis(100));
            let (own, unscoped) =
                write_then_read_elsewhere([&writer, &other, &reader], &t, &scope, id, outlive_ttl)
                    .await;
            assert!(own, "read under expired scope {scope} missed its write");
            assert!(
                unscoped,
                "an expired scope reads as universal: it sees even writes made under no scope"
            );
        }
    });
    let scopes = scopes_status(&proxy);
    println!("/status causal.scopes: {scopes}");
    assert!(count(&scopes, &["evictions", "ttl"]) >= 10, "{scopes}");
    assert!(
        count(&scopes, &["reads", "unknown_floor"]) >= 10,
        "{scopes}"
    );
}

/// `n` requests, each writing under `scope` through one proxy and reading through the other
/// (the direction alternating): (stale, served by a replica).
async fn across_proxies(
    [a, b]: [&TestProxy; 2],
    table: &str,
    scope: &str,
    ids: std::ops::Range<i64>,
) -> (usize, usize) {
    let through = |p: &TestProxy| format!("{} options='-c lsngate.scope={scope}'", p.conninfo());
    let (a_client, b_client) = (connect(&through(a)).await, connect(&through(b)).await);
    let (mut stale, mut replica) = (0, 0);
    for id in ids {
        let (writer, reader) = if id % 2 == 0 {
            (&a_client, &b_client)
        } else {
            (&b_client, &a_client)
        };
        writer
            .execute(&format!("INSERT INTO {table} VALUES ($1, 1)"), &[&id])
            .await
            .unwrap();
        let (rows, on_replica) = read_row(reader, "", table, id).await;
        stale += usize::from(rows == 0);
        replica += usize::from(on_replica);
    }
    (stale, replica)
}

fn store_calls(proxy: &TestProxy, op: &str, what: &str) -> u64 {
    count(&scopes_status(proxy), &["store", "calls", op, what])
}

#[test]
fn two_proxies_sharing_a_redis_scope_store_see_each_others_writes() {
    let cluster = shared_delayed_cluster();
    let t = unique("scope_shared");
    create(cluster, &t);
    // The control: two proxies, each with its own book, miss each other's writes.
    let (a, b) = (proxy_with(cluster, |_| {}), proxy_with(cluster, |_| {}));
    let (stale, _) = rt().block_on(across_proxies([&a, &b], &t, "user:1", 0..40));
    println!("two proxies, no scope store (control): stale={stale}/40");
    assert!(
        stale > 0,
        "the control must miss writes made through the other proxy"
    );
    drop((a, b));

    let redis = lsngate_cluster::RedisServer::start();
    let shared = |f: &mut lsngate_proxy::FileConfig| f.scope_store = Some(redis.url());
    let (a, b) = (proxy_with(cluster, shared), proxy_with(cluster, shared));
    let (stale, replica) = rt().block_on(async {
        let mut totals = (0, 0);
        for (i, scope) in ["user:1", "user:2", "tenant:acme"].iter().enumerate() {
            let start = 1000 * (i as i64 + 1);
            let (s, r) = across_proxies([&a, &b], &t, scope, start..start + 100).await;
            totals = (totals.0 + s, totals.1 + r);
        }
        totals
    });
    println!("two proxies sharing Redis: stale={stale}/300 replica={replica}/300");
    assert_eq!(
        stale, 0,
        "a read through one proxy missed a write made through the other"
    );
    assert!(replica > 150, "most reads on the replica: {replica}/300");
    for p in [&a, &b] {
        let status = scopes_status(p);
        println!("/status causal.scopes.store: {}", status["store"]);
        assert!(store_calls(p, "save", "calls") >= 150, "{status}");
        assert!(store_calls(p, "load", "calls") >= 150, "{status}");
        for op in ["load", "save", "remove"] {
            assert_eq!(store_calls(p, op, "errors"), 0, "{status}");
        }
    }
    let (stored, _) = run_ok(Command::new("redis-cli").args([
        "-p",
        &redis.port.to_string(),
        "GET",
        "lsngate:scope:user:1",
    ]));
    assert_eq!(
        stored.trim().len(),
        16 + ".t1".len(),
        "fixed-width hex and timeline: {stored}"
    );

    // A universal read already waits for the primary's position: no round trip to Redis.
    let loads = store_calls(&b, "load", "calls");
    rt().block_on(async {
        let client = connect(&format!(
            "{} options='-c lsngate.scope=user:1 -c lsngate.consistency=universal'",
            b.conninfo()
        ))
        .await;
        assert_eq!(read_row(&client, "", &t, 1000).await.0, 1);
    });
    assert_eq!(store_calls(&b, "load", "calls"), loads);

    // Redis gone: a commit under a scope says it could not be shared; reads under the scope
    // wait for the primary's position instead (never stale), and the session goes on.
    drop(redis);
    let psql = |p: &TestProxy, sql: &str| {
        let output = run(Command::new("psql").args([
            &format!("{} options='-c lsngate.scope=user:1'", p.conninfo()),
            "-X",
            "-At",
            "-c",
            sql,
        ]));
        assert!(output.status.success(), "{:?}", texts(&output));
        texts(&output)
    };
    let (_, notice) = psql(&a, &format!("INSERT INTO {t} VALUES (5000, 1)"));
    println!("{}", notice.trim());
    assert!(
        notice.contains("NOTICE") && notice.contains("could not be shared for scope user:1"),
        "{notice}"
    );
    let (count_seen, _) = psql(&b, &format!("SELECT count(*) FROM {t} WHERE id = 5000"));
    assert_eq!(
        count_seen.trim(),
        "1",
        "Redis down: the read waited for the primary"
    );
    assert!(store_calls(&b, "load", "errors") >= 1);
    assert!(count(&scopes_status(&b), &["reads", "unknown_floor"]) >= 1);
}

#[test]
fn the_library_and_a_proxy_share_a_scope_through_one_redis() {
    use lsngate_store::{RedisTokenStore, SCOPE_PREFIX, TokenStore};
    let cluster = shared_delayed_cluster();
    let redis = lsngate_cluster::RedisServer::start();
    let proxy = proxy_with(cluster, |f| f.scope_store = Some(redis.url()));
    let t = unique("scope_library");
    create(cluster, &t);
    let (control, stale, replica) = rt().block_on(async {
        let store: std::sync::Arc<dyn TokenStore> = std::sync::Arc::new(
            RedisTokenStore::connect(&redis.url())
                .await
                .unwrap()
                .with_prefix(SCOPE_PREFIX),
        );
        let gate = lsngate::Gate::connect(
            lsngate::Config::new(cluster.primary_url()).replicas(cluster.replica_urls()),
        )
        .await
        .unwrap();
        let scope = gate
            .scope("user:9", store, Duration::from_secs(60))
            .unwrap();
        let proxied = connect(&format!(
            "{} options='-c lsngate.scope=user:9'",
            proxy.conninfo()
        ))
        .await;
        let insert = format!("INSERT INTO {t} VALUES ($1, 1)");
        let select = format!("SELECT count(*), pg_is_in_recovery() FROM {t} WHERE id = $1");
        // The control: the library reading with no token misses rows written through the proxy.
        let mut control = 0;
        for id in 0..20i64 {
            proxied.execute(&insert, &[&id]).await.unwrap();
            let read = gate.read().query(&select, &[&id]).await.unwrap();
            control += usize::from(read.rows[0].get::<_, i64>(0) == 0);
        }
        let (mut stale, mut replica) = (0, 0);
        for id in 100..160i64 {
            let (rows, on_replica) = if id % 2 == 0 {
                // The library writes under the scope, a proxied client reads under it.
                scope.write(&insert, &[&id]).await.unwrap();
                read_row(&proxied, "", &t, id).await
            } else {
                // A proxied client writes, the library reads under the scope.
                proxied.execute(&insert, &[&id]).await.unwrap();
                let read = scope.query(&select, &[&id]).await.unwrap();
                (read.rows[0].get(0), read.rows[0].get(1))
            };
            stale += usize::from(rows == 0);
            replica += usize::from(on_replica);
        }
        (control, stale, replica)
    });
    println!(
        "library + proxy on one Redis: control {control}/20 stale; scope stale={stale}/60 replica={replica}/60"
    );
    assert!(
        control > 0,
        "the control must miss writes made through the proxy"
    );
    assert_eq!(
        stale, 0,
        "a read under the scope missed a write made under it by the other side"
    );
    assert!(replica > 30, "most reads on the replica: {replica}/60");
}
