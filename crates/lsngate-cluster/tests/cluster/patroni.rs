//! The Patroni test kit on both server versions: etcd and Patroni members start, a switchover
//! and a failover by kill -9 each leave a new leader with every write, the killed leader
//! rejoins as a replica, and a member added later streams.

use std::time::{Duration, Instant};

use lsngate_cluster::{PatroniCluster, PatroniConfig};

const PG15: &str = "/usr/lib/postgresql/15/bin";
const PG19: &str = "/opt/lsngate/pg19/bin";

fn switchover_failover_rejoin_and_add(pg_bin: &str) {
    let cluster = PatroniCluster::start(&PatroniConfig {
        members: 2,
        pg_bin: Some(pg_bin.into()),
        ..Default::default()
    })
    .unwrap();
    let first = cluster.leader().unwrap().expect("a leader");
    let leader = cluster.node(&first);
    leader
        .sql("CREATE TABLE kit (id int PRIMARY KEY); INSERT INTO kit VALUES (1)")
        .unwrap();

    let second = cluster.switchover(None).unwrap();
    assert_ne!(second, first);
    let node = cluster.node(&second);
    node.sql("INSERT INTO kit VALUES (2)").unwrap();
    cluster.wait_healthy(2, Duration::from_secs(60)).unwrap();
    assert!(
        cluster.node(&first).is_in_recovery().unwrap(),
        "old leader follows"
    );

    let killed_at = Instant::now();
    assert_eq!(cluster.kill_leader().unwrap(), second);
    let third = cluster
        .wait_new_leader(&second, Duration::from_secs(90))
        .unwrap();
    println!(
        "PostgreSQL {}: failover by kill -9 took {:.1}s (Patroni ttl {} s)",
        cluster.pg_bin().version,
        killed_at.elapsed().as_secs_f64(),
        lsngate_cluster::TTL_S
    );
    assert_eq!(third, first);
    assert_eq!(
        cluster
            .node(&third)
            .sql("SELECT count(*) FROM kit")
            .unwrap(),
        "2"
    );

    cluster.restart_member(&second).unwrap();
    // pg_rewind brings the killed leader back (it fails without full_page_writes).
    cluster.wait_healthy(2, Duration::from_secs(90)).unwrap();
    let added = cluster.add_member().unwrap();
    cluster.wait_healthy(3, Duration::from_secs(90)).unwrap();
    assert_eq!(
        cluster
            .node(&added)
            .sql("SELECT count(*) FROM kit")
            .unwrap(),
        "2"
    );
    cluster.stop_member(&added).unwrap();
    cluster.wait_healthy(2, Duration::from_secs(60)).unwrap();
    assert_eq!(
        cluster.api_urls().len(),
        3,
        "stopped members stay known to the kit"
    );
}

#[test]
fn patroni_manages_postgresql_19() {
    switchover_failover_rejoin_and_add(PG19);
}

#[test]
fn patroni_manages_postgresql_15() {
    switchover_failover_rejoin_and_add(PG15);
}
