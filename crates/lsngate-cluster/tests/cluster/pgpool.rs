//! The kit's pgpool-II on real servers: in front of a primary and its standbys it answers,
//! knows every node and sends a session's reads to a standby; it is a process tree (a parent
//! and the children it forks), and dropping it stops the whole tree.

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
    let nodes = client.simple_query("SHOW pool_nodes").await.unwrap();
    let roles: Vec<String> = nodes
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(row) => row.get("role").map(str::to_string),
            _ => None,
        })
        .collect();
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
