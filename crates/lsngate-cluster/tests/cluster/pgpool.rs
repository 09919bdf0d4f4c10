//! The kit's pgpool-II on real servers: in front of a primary and its standbys it answers,
//! knows every node and sends a session's reads to a standby; it is a process tree (a parent
//! and the children it forks), and dropping it stops the whole tree. It is started only once it
//! knows which node is the primary.

use std::time::{Duration, Instant};

use lsngate_cluster::{Pgpool, PgpoolConfig, process_tree, shared_cluster};
use tokio_postgres::SimpleQueryMessage;

#[tokio::test]
async fn pgpool_balances_reads_to_a_standby_and_stops_with_all_its_children() {
    let cluster = shared_cluster();
    let config = PgpoolConfig::new(&cluster.primary_url(), &cluster.replica_urls())
        .unwrap()
        .clients(2);
    let pgpool = tokio::task::spawn_blocking(move || Pgpool::start(&config))
        .await
        .unwrap()
        .unwrap();
    let client = pgpool.connect().await.unwrap();
    // current_setting is a stable function, so pgpool balances the SELECT.
    let rows = client
        .simple_query("SELECT current_setting('port')")
        .await
        .unwrap();
    let port = rows.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
        _ => None,
    });
    let standbys: Vec<String> = cluster
        .replicas()
        .iter()
        .map(|r| r.port().to_string())
        .collect();
    assert!(
        port.as_ref().is_some_and(|p| standbys.contains(p)),
        "the primary's weight is 0: a balanced read runs on a standby ({port:?}, standbys {standbys:?})"
    );
    let roles = roles(&client).await;
    assert_eq!(roles, ["primary", "standby", "standby"], "{roles:?}");
    drop(client);

    let pid = pgpool.pid() as i32;
    let tree = process_tree(pid);
    // The parent, a child for each of the 2 clients and the spare ones, and pgpool's helpers.
    assert!(tree.len() > 3, "{tree:?}");
    drop(pgpool);
    let deadline = Instant::now() + Duration::from_secs(10);
    let alive = |pid: &i32| std::path::Path::new(&format!("/proc/{pid}")).exists();
    while tree.iter().any(alive) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left: Vec<&i32> = tree.iter().filter(|p| alive(p)).collect();
    assert!(left.is_empty(), "pgpool processes left running: {left:?}");
}

/// Each node's role as pgpool sees it (`SHOW pool_nodes`), in node order.
async fn roles(client: &tokio_postgres::Client) -> Vec<String> {
    let nodes = client.simple_query("SHOW pool_nodes").await.unwrap();
    nodes
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(row) => row.get("role").map(str::to_string),
            _ => None,
        })
        .collect()
}

/// pgpool forks the children that serve clients before it looks for the primary, so it answers
/// queries while it still calls every node a standby; a CI run once saw `SHOW pool_nodes` with
/// no primary right after `Pgpool::start` returned. Here pgpool's search cannot succeed until
/// the database it searches with exists, created 2 s after the start began: `start` must not
/// return before pgpool has found the primary.
#[tokio::test]
async fn start_returns_only_once_pgpool_has_found_the_primary() {
    let cluster = shared_cluster();
    let database = "pgpool_search_created_late";
    cluster
        .primary()
        .sql(&format!("DROP DATABASE IF EXISTS {database}"))
        .unwrap();
    let config = PgpoolConfig::new(&cluster.primary_url(), &cluster.replica_urls())
        .unwrap()
        .clients(1)
        .setting("sr_check_database", &format!("'{database}'"));
    let starting = tokio::task::spawn_blocking(move || Pgpool::start(&config));
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster
        .primary()
        .sql(&format!("CREATE DATABASE {database}"))
        .unwrap();
    let pgpool = starting.await.unwrap().unwrap();
    let client = pgpool.connect().await.unwrap();
    let roles = roles(&client).await;
    assert_eq!(roles, ["primary", "standby", "standby"], "{roles:?}");
    drop(client);
    drop(pgpool);
    cluster
        .primary()
        .sql(&format!("DROP DATABASE {database}"))
        .unwrap();
}

/// Without standbys pgpool is a pooler in front of the primary alone, which it knows as the
/// primary: the readiness `start` waits for holds there too.
#[tokio::test]
async fn without_standbys_pgpool_knows_the_primary_alone() {
    let cluster = shared_cluster();
    let config = PgpoolConfig::new(&cluster.primary_url(), &[])
        .unwrap()
        .clients(1);
    let pgpool = tokio::task::spawn_blocking(move || Pgpool::start(&config))
        .await
        .unwrap()
        .unwrap();
    let client = pgpool.connect().await.unwrap();
    assert_eq!(roles(&client).await, ["primary"]);
}
