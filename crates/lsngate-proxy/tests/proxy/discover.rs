//! The `discover` topology on a plain cluster: the node set is the primary and the replicas
//! streaming from it (its `pg_stat_replication`), placed by `discover_replicas`. A replica that
//! stops streaming leaves the node set, one that streams again joins it and gets reads, and
//! after a failover the promoted replica is the primary asked and the old one leaves.

use std::time::{Duration, Instant};

use lsngate_cluster::{Cluster, ClusterConfig};
use lsngate_proxy::FileConfig;

use crate::patroni::wait_in_node_set;
use crate::support::{TestProxy, connect, execute_once_a_primary_takes_it, rt};

/// Reads on fresh connections until one is served by `port` (at most 30 s).
pub(crate) fn wait_read_served_by(proxy: &TestProxy, port: u16) {
    rt().block_on(async {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let client = connect(&proxy.conninfo()).await;
            let served: i32 = client
                .query_one("SELECT inet_server_port()", &[])
                .await
                .unwrap()
                .get(0);
            if served == i32::from(port) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no read was served by {port}: {:#}",
                proxy.status()["topology"]
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

#[test]
fn discover_follows_the_replicas_streaming_from_the_primary() {
    let cluster = Cluster::start(&ClusterConfig::default().replicas(2)).unwrap();
    let ports: Vec<u16> = cluster.replicas().iter().map(|r| r.port()).collect();
    let proxy = TestProxy::with(FileConfig {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        primary: Some(cluster.primary_url()),
        topology: Some("discover".into()),
        discover_replicas: cluster
            .replicas()
            .iter()
            .map(|r| format!("{}=127.0.0.1:{}", r.name(), r.port()))
            .collect(),
        health_interval_ms: Some(200),
        ..Default::default()
    });
    for port in &ports {
        wait_in_node_set(&proxy, *port, true, Duration::from_secs(30));
    }
    wait_read_served_by(&proxy, ports[1]);
    assert_eq!(proxy.status()["topology"]["source"], "discover");

    // replica2 stops streaming: it leaves the node set; streaming again, it is back with reads.
    cluster.replica(1).stop().unwrap();
    wait_in_node_set(&proxy, ports[1], false, Duration::from_secs(30));
    cluster.replica(1).start().unwrap();
    cluster.wait_streaming(Duration::from_secs(60)).unwrap();
    wait_in_node_set(&proxy, ports[1], true, Duration::from_secs(30));
    wait_read_served_by(&proxy, ports[1]);

    // Failover: replica1 promoted, the old primary gone; writes reach replica1, whose
    // pg_stat_replication (empty: replica2 still follows the old primary) is asked from now on.
    cluster.primary().stop().unwrap();
    cluster.replica(0).promote().unwrap();
    rt().block_on(async {
        let client = connect(&format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            proxy.addr.port()
        ))
        .await;
        execute_once_a_primary_takes_it(&client, "CREATE TABLE discovered (id int)").await;
    });
    wait_in_node_set(
        &proxy,
        cluster.primary().port(),
        false,
        Duration::from_secs(30),
    );
    wait_in_node_set(&proxy, ports[1], false, Duration::from_secs(30));
    wait_in_node_set(&proxy, ports[0], true, Duration::from_secs(1));
}
