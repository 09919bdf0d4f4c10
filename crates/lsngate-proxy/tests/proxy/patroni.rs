//! The `patroni` topology on a real Patroni cluster (Debian's patroni 3.0.2 and etcd, from
//! lsngate-cluster's `PatroniCluster`, in `synchronous_mode`): the proxy starts from Patroni's
//! members, keeps read-your-writes exact and every write's fate named through a `patronictl
//! switchover` and a failover by kill -9 of the leader (0 stale, 0 non-monotonic reads, 0 lost
//! acknowledged writes; how long writes stopped is printed, not asserted), and a member that
//! joins gets reads while one that leaves is taken out of the node set, and one tagged
//! `noloadbalance` gets none.

#[path = "patroni/workload.rs"]
mod workload;

use std::time::{Duration, Instant};

use lsngate_cluster::{PatroniCluster, PatroniConfig};
use lsngate_proxy::FileConfig;

use crate::support::{TestProxy, connect, rt, server_port};

fn proxy_for(cluster: &PatroniCluster) -> TestProxy {
    TestProxy::with(FileConfig {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        // Only the login, database and TLS settings of this URL are used: hosts come from Patroni.
        primary: Some(cluster.primary_url().unwrap()),
        topology: Some("patroni".into()),
        patroni_urls: cluster.api_urls(),
        pool_size: Some(8),
        health_interval_ms: Some(200),
        ..Default::default()
    })
}

/// Waits (at most `limit`) until the proxy's node set holds 127.0.0.1:`port`, or does not.
pub fn wait_in_node_set(proxy: &TestProxy, port: u16, wanted: bool, limit: Duration) {
    let deadline = Instant::now() + limit;
    let address = format!("127.0.0.1:{port}");
    loop {
        let status = proxy.status();
        let listed = status["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["address"] == address.as_str());
        if listed == wanted {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{address} in the node set never became {wanted} in {limit:?}: {:#}",
            status["topology"]
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn patroni_switchover_failover_and_membership_through_the_proxy() {
    let cluster = PatroniCluster::start(&PatroniConfig {
        members: 3,
        synchronous_mode: true,
        ..Default::default()
    })
    .unwrap();
    let version = cluster.pg_bin().version.clone();
    let proxy = proxy_for(&cluster);
    let status = proxy.status();
    assert_eq!(status["topology"]["source"], "patroni");
    assert_eq!(
        status["nodes"].as_array().unwrap().len(),
        3,
        "the node set is Patroni's three members: {status:#}"
    );
    let leader = cluster.leader().unwrap().unwrap();
    cluster
        .node(&leader)
        .sql("CREATE TABLE ha_log (client int, seq int, PRIMARY KEY (client, seq))")
        .unwrap();

    // Switchover, then failover by kill -9, under a workload through the proxy.
    let run = workload::Workload::start(proxy.url(), 4);
    std::thread::sleep(Duration::from_secs(2));
    let switched_at = run.mark();
    let new_leader = cluster.switchover(None).unwrap();
    println!("{version}: patronictl switchover {leader} -> {new_leader}");
    // The old leader rejoins and Patroni names a synchronous standby again: only that one may be
    // promoted in synchronous_mode.
    cluster.wait_healthy(3, Duration::from_secs(90)).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let killed_at = run.mark();
    let killed = cluster.kill_leader().unwrap();
    let after_kill = cluster
        .wait_new_leader(&killed, Duration::from_secs(90))
        .unwrap();
    println!("{version}: kill -9 of {killed}; Patroni promoted {after_kill}");
    std::thread::sleep(Duration::from_secs(4));
    let ended_at = run.mark();
    let report = run.stop();
    let final_leader = cluster.node(&after_kill);
    let lost = report.lost_writes(&final_leader);
    println!(
        "{version}: {} writes acknowledged, {} reads checked; writes resumed {:.2}s after the \
         switchover began and {:.2}s after kill -9 of the leader (Patroni ttl {} s); errors: {:?}",
        report.acknowledged.len(),
        report.reads,
        report.resumed_after(switched_at, killed_at).as_secs_f64(),
        report.resumed_after(killed_at, ended_at).as_secs_f64(),
        lsngate_cluster::TTL_S,
        report.errors
    );
    assert_eq!(report.stale, Vec::<String>::new(), "stale reads");
    assert_eq!(
        report.non_monotonic,
        Vec::<String>::new(),
        "non-monotonic reads"
    );
    assert_eq!(lost, Vec::<(i32, i32)>::new(), "acknowledged writes lost");
    assert_eq!(
        report.unnamed,
        Vec::<String>::new(),
        "errors without the cause named"
    );
    assert!(
        report.acknowledged_between(killed_at, ended_at) > 0,
        "writes never resumed after the failover"
    );

    // A member that joins gets reads; one that leaves is taken out of the node set.
    cluster.restart_member(&killed).unwrap();
    cluster.wait_healthy(3, Duration::from_secs(120)).unwrap();
    let added = cluster.add_member().unwrap();
    cluster.wait_healthy(4, Duration::from_secs(120)).unwrap();
    let port = cluster.node(&added).port();
    wait_in_node_set(&proxy, port, true, Duration::from_secs(60));
    let port = port as i32;
    rt().block_on(async {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let served = server_port(&connect(&proxy.conninfo()).await).await;
            if served == port {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the added member {added} never served a read"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    cluster.stop_member(&added).unwrap();
    wait_in_node_set(&proxy, port as u16, false, Duration::from_secs(60));
    // A member tagged noloadbalance joins the node set but gets no reads.
    let tagged = cluster
        .add_member_tagged(&[("noloadbalance", true)])
        .unwrap();
    cluster.wait_healthy(4, Duration::from_secs(120)).unwrap();
    let tagged_port = cluster.node(&tagged).port();
    wait_in_node_set(&proxy, tagged_port, true, Duration::from_secs(60));
    let status = proxy.status();
    let listed = status["topology"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == tagged.as_str())
        .cloned()
        .unwrap_or_default();
    assert_eq!(listed["noloadbalance"], true, "{:#}", status["topology"]);
    rt().block_on(async {
        for _ in 0..40 {
            let served = server_port(&connect(&proxy.conninfo()).await).await;
            assert_ne!(
                served,
                i32::from(tagged_port),
                "a read went to the noloadbalance member"
            );
        }
    });
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        for _ in 0..30 {
            let served: i32 = client
                .query_one("SELECT inet_server_port()", &[])
                .await
                .unwrap()
                .get(0);
            assert_ne!(served, port, "a read went to the removed member");
        }
    });
}

/// Patroni's REST API over HTTPS (`restapi.certfile`/`keyfile`, a certificate for localhost):
/// the proxy follows it with `patroni_ca_file`, and a proxy trusting another CA refuses the
/// certificate, says so in /status and keeps its node set.
#[test]
fn patroni_over_https_is_followed_with_its_ca_and_refused_with_another() {
    let cluster = PatroniCluster::start(&PatroniConfig {
        members: 2,
        rest_tls: true,
        ..Default::default()
    })
    .unwrap();
    let urls = cluster.api_urls();
    assert!(
        urls.iter().all(|u| u.starts_with("https://localhost:")),
        "{urls:?}"
    );
    let with_ca = |ca: &std::path::Path| {
        TestProxy::with(FileConfig {
            listen: Some("127.0.0.1:0".parse().unwrap()),
            admin_listen: Some("127.0.0.1:0".parse().unwrap()),
            primary: Some(cluster.primary_url().unwrap()),
            topology: Some("patroni".into()),
            patroni_urls: urls.clone(),
            patroni_ca_file: Some(ca.to_path_buf()),
            health_interval_ms: Some(200),
            ..Default::default()
        })
    };
    let members = cluster.members();
    let proxy = with_ca(cluster.rest_ca().expect("the kit's CA"));
    for member in &members {
        wait_in_node_set(&proxy, member.pg_port, true, Duration::from_secs(30));
    }
    let leader = cluster.leader().unwrap().unwrap();
    let replica = members.iter().find(|m| m.name != leader).unwrap().pg_port;
    crate::discover::wait_read_served_by(&proxy, replica);
    let topology = proxy.status()["topology"].clone();
    assert!(
        topology["answered_by"]
            .as_str()
            .is_some_and(|a| a.starts_with("https://localhost:")),
        "{topology:#}"
    );
    proxy.shutdown();

    let other = tempfile::tempdir().unwrap();
    let stranger = lsngate_cluster::TestCa::create(other.path(), "stranger").unwrap();
    let refused = with_ca(&stranger.cert);
    let deadline = Instant::now() + Duration::from_secs(30);
    let error = loop {
        let topology = refused.status()["topology"].clone();
        if let Some(error) = topology["last_error"].as_str() {
            break error.to_string();
        }
        assert!(Instant::now() < deadline, "no error reported: {topology:#}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(error.contains("certificate"), "{error}");
    let nodes = refused.status()["nodes"].as_array().unwrap().len();
    assert_eq!(nodes, 1, "the node set stays the configured primary");
    refused.shutdown();
}
