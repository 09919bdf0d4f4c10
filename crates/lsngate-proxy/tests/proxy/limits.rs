//! PgBouncer's connection limits, seen from the servers and from real clients:
//! `max_db_connections` and `max_user_connections` hold on every server while pgbench floods the
//! proxy (backends counted in pg_stat_activity as it runs), the per-database and per-user client
//! limits refuse one client too many with SQLSTATE 53300 and nobody else, and the reserve pool
//! serves a checkout that the full pool would have kept waiting.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use lsngate_cluster::{Cluster, Node, shared_cluster};
use lsngate_proxy::config::UserEntry;
use tokio_postgres::error::SqlState;

/// Backends on `node` that match `filter`, besides the one counting.
fn backends(node: &Node, filter: &str) -> usize {
    node.sql(&format!(
        "SELECT count(*) FROM pg_stat_activity WHERE {filter} AND pid <> pg_backend_pid()"
    ))
    .unwrap()
    .parse()
    .unwrap()
}

/// Creates `database` on the primary with pgbench's tables (scale 1), readable by `reader`, and
/// waits until the replicas have it too.
fn pgbench_database(cluster: &Cluster, database: &str, reader: Option<&str>) {
    let primary = cluster.primary();
    primary.sql(&format!("CREATE DATABASE {database}")).unwrap();
    let mut init = Command::new(cluster.pg_bin().tool("pgbench"));
    init.args(["-i", "-s", "1", "-q", "-h", "127.0.0.1", "-p"])
        .arg(primary.port().to_string())
        .args(["-U", "postgres", database]);
    run_ok(&mut init);
    if let Some(reader) = reader {
        let mut grant = Command::new(cluster.pg_bin().tool("psql"));
        grant
            .args(["-X", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p"])
            .arg(primary.port().to_string())
            .args(["-U", "postgres", "-d", database, "-c"])
            .arg(format!(
                "GRANT SELECT ON ALL TABLES IN SCHEMA public TO {reader}"
            ));
        run_ok(&mut grant);
    }
    caught_up(cluster);
}

/// Runs one select-only pgbench of `clients` clients per (user, database) of `runs` through the
/// proxy at `port`, all at once, and counts the backends matching `filter` on every node until they end. Returns
/// each pgbench's output and the most backends seen on one node at one time.
fn flood(
    cluster: &Cluster,
    port: u16,
    clients: usize,
    runs: &[(&str, &str)],
    filter: &str,
) -> (Vec<String>, usize) {
    let children: Vec<_> = runs
        .iter()
        .map(|(user, database)| {
            Command::new(cluster.pg_bin().tool("pgbench"))
                .args(["-n", "-S", "-j", "2", "-T", "3", "-h", "127.0.0.1"])
                .args(["-c", &clients.to_string()])
                .args(["-p", &port.to_string(), "-U", user, database])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("pgbench runs")
        })
        .collect();
    let mut children: Vec<_> = children.into_iter().map(Some).collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut most = 0;
    let mut outputs = vec![String::new(); children.len()];
    while children.iter().any(Option::is_some) {
        for node in cluster.nodes() {
            most = most.max(backends(node, filter));
        }
        for (slot, output) in children.iter_mut().zip(outputs.iter_mut()) {
            let done = slot
                .as_mut()
                .is_some_and(|child| child.try_wait().unwrap().is_some());
            if done || Instant::now() > deadline {
                let mut child = slot.take().unwrap();
                if !done {
                    let _ = child.kill();
                }
                let result = child.wait_with_output().unwrap();
                let (stdout, stderr) = texts(&result);
                assert!(
                    done && result.status.success(),
                    "pgbench failed or ran past 120 s: {stdout}{stderr}"
                );
                *output = format!("{stdout}{stderr}");
            }
        }
    }
    (outputs, most)
}

/// Whether pgbench ran transactions and none failed.
fn no_failures(output: &str) -> bool {
    output.contains("number of failed transactions: 0 ")
        && !output.contains("number of transactions actually processed: 0/")
}

#[test]
fn max_db_connections_holds_on_every_server_under_a_pgbench_flood() {
    let cluster = shared_cluster();
    let database = unique("limdb");
    pgbench_database(cluster, &database, None);
    let mut file = file_config(cluster);
    file.pool_size = Some(10);
    file.max_db_connections = Some(3);
    file.acquire_timeout_ms = Some(60_000);
    let proxy = TestProxy::with(file);
    let (outputs, most) = flood(
        cluster,
        proxy.addr.port(),
        20,
        &[("postgres", &database)],
        &format!("datname = '{database}'"),
    );
    assert!(no_failures(&outputs[0]), "{}", outputs[0]);
    assert!(
        (1..=3).contains(&most),
        "at most max_db_connections = 3 backends of {database} on any node while 20 clients \
         ran (pool_size 10), seen {most}"
    );
}

#[test]
fn max_user_connections_holds_across_databases_under_a_pgbench_flood() {
    let cluster = shared_cluster();
    let role = unique("limrole");
    cluster
        .primary()
        .sql(&format!("CREATE ROLE {role} LOGIN"))
        .unwrap();
    let databases = [unique("limudb"), unique("limudb")];
    for database in &databases {
        pgbench_database(cluster, database, Some(&role));
    }
    let mut file = file_config(cluster);
    let mut user = UserEntry::new("limited", None, "trust");
    user.server_user = Some(role.clone());
    file.users = vec![user];
    file.pool_size = Some(10);
    file.max_user_connections = Some(3);
    file.acquire_timeout_ms = Some(60_000);
    let proxy = TestProxy::with(file);
    // Two databases: two pools per node share the role's limit.
    let (outputs, most) = flood(
        cluster,
        proxy.addr.port(),
        10,
        &[("limited", &databases[0]), ("limited", &databases[1])],
        &format!("usename = '{role}'"),
    );
    for output in &outputs {
        assert!(no_failures(output), "{output}");
    }
    assert!(
        (1..=3).contains(&most),
        "at most max_user_connections = 3 backends of {role} on any node while 2 × 10 clients \
         ran on two databases (pool_size 10), seen {most}"
    );
}

async fn try_connect(conninfo: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// The refusal of a client over a limit: its SQLSTATE and message.
async fn refusal(conninfo: &str) -> (SqlState, String) {
    let Err(error) = try_connect(conninfo).await else {
        panic!("{conninfo}: let in over the limit");
    };
    let db_error = error.as_db_error().expect("a server error");
    (db_error.code().clone(), db_error.message().to_string())
}

#[test]
fn client_limits_refuse_one_client_too_many_with_53300_and_nobody_else() {
    let cluster = shared_cluster();
    let (one, two) = (unique("limcla"), unique("limclb"));
    for database in [&one, &two] {
        cluster
            .primary()
            .sql(&format!("CREATE DATABASE {database}"))
            .unwrap();
    }
    caught_up(cluster);
    let mut file = file_config(cluster);
    file.users = ["ann", "bob"]
        .iter()
        .map(|name| UserEntry::new(name, None, "trust"))
        .collect();
    file.max_db_client_connections = Some(2);
    file.max_user_client_connections = Some(3);
    let proxy = TestProxy::with(file);
    let port = proxy.addr.port();
    let at = |user: &str, database: &str| {
        format!("host=127.0.0.1 port={port} user={user} dbname={database}")
    };
    let runtime = rt();
    runtime.block_on(async {
        // Database limit: two clients of `postgres`, the third refused.
        let first = try_connect(&at("ann", "postgres")).await.unwrap();
        let _bob = try_connect(&at("bob", "postgres")).await.unwrap();
        let (code, message) = refusal(&at("bob", "postgres")).await;
        assert_eq!(code, SqlState::TOO_MANY_CONNECTIONS, "{message}");
        assert_eq!(
            message,
            "too many connections for database \"postgres\": max_db_client_connections = 2 \
             reached on lsngate"
        );
        // Nobody else is affected: the connected clients work, another database takes clients.
        let answer: i32 = first.query_one("SELECT 1", &[]).await.unwrap().get(0);
        assert_eq!(answer, 1);
        let _ann_one = try_connect(&at("ann", &one)).await.unwrap();
        // User limit: ann's third client gets in, her fourth is refused (its database has room),
        // bob still gets in there.
        let _ann_two = try_connect(&at("ann", &two)).await.unwrap();
        let (code, message) = refusal(&at("ann", &two)).await;
        assert_eq!(code, SqlState::TOO_MANY_CONNECTIONS, "{message}");
        assert_eq!(
            message,
            "too many connections for role \"ann\": max_user_client_connections = 3 reached \
             on lsngate"
        );
        let bob_two = try_connect(&at("bob", &two)).await.unwrap();
        let answer: i32 = bob_two.query_one("SELECT 2", &[]).await.unwrap().get(0);
        assert_eq!(answer, 2);
        // One leaves: its place is free again (for the database and for ann).
        drop(first);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match try_connect(&at("ann", "postgres")).await {
                Ok(client) => {
                    let answer: i32 = client.query_one("SELECT 3", &[]).await.unwrap().get(0);
                    assert_eq!(answer, 3);
                    break;
                }
                // The proxy sees the client leave once its socket closes.
                Err(e) if Instant::now() < deadline => {
                    assert_eq!(e.code(), Some(&SqlState::TOO_MANY_CONNECTIONS), "{e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("the place of a client that left stayed taken: {e}"),
            }
        }
    });
}

#[test]
fn the_reserve_pool_serves_a_checkout_the_full_pool_keeps_waiting() {
    let cluster = shared_cluster();
    let marker = unique("reserve");
    let filter = format!("application_name = '{marker}'");
    let mut file = file_config(cluster);
    // The primary alone: both transactions share one pool.
    file.replicas = Vec::new();
    file.pool_size = Some(1);
    file.acquire_timeout_ms = Some(60_000);
    let conninfo = |proxy: &TestProxy| format!("{} application_name={marker}", proxy.conninfo());
    let runtime = rt();

    // Without a reserve: the second transaction's BEGIN-and-statement waits while the first
    // holds the pool's one connection.
    let proxy = TestProxy::with(file.clone());
    runtime.block_on(async {
        let first = connect(&conninfo(&proxy)).await;
        first.batch_execute("BEGIN; SELECT 1").await.unwrap();
        let second = connect(&conninfo(&proxy)).await;
        let waiting = tokio::spawn(async move {
            second.batch_execute("BEGIN; SELECT 1").await.unwrap();
            second
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while proxy
            .proxy
            .nodes
            .pools_of(None)
            .iter()
            .map(|p| p.activity().waiting)
            .sum::<usize>()
            == 0
        {
            assert!(
                Instant::now() < deadline,
                "the second checkout never queued"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            !waiting.is_finished(),
            "no reserve: the second transaction waits"
        );
        assert_eq!(backends(cluster.primary(), &filter), 1);
        first.batch_execute("COMMIT").await.unwrap();
        let second = waiting.await.unwrap();
        second.batch_execute("COMMIT").await.unwrap();
    });
    proxy.shutdown();

    // With a reserve of 1 after 100 ms: both transactions hold a connection at once.
    file.reserve_pool_size = Some(1);
    file.reserve_pool_timeout_ms = Some(100);
    let proxy = TestProxy::with(file);
    runtime.block_on(async {
        let first = connect(&conninfo(&proxy)).await;
        first.batch_execute("BEGIN; SELECT 1").await.unwrap();
        let second = connect(&conninfo(&proxy)).await;
        second.batch_execute("BEGIN; SELECT 1").await.unwrap();
        assert_eq!(
            backends(
                cluster.primary(),
                &format!("{filter} AND state = 'idle in transaction'")
            ),
            2,
            "the reserve connection serves the second transaction while the first is open"
        );
        first.batch_execute("COMMIT").await.unwrap();
        second.batch_execute("COMMIT").await.unwrap();
    });
}
