//! The `dns` topology against a real DNS server (Debian's dnsmasq, on a free loopback port):
//! SRV records name the members with their ports; a member added to the records gets reads, one
//! removed leaves the node set and gets none, and while the server is down the node set stays.
//! A/AAAA records with `dns_port` give members on one port.

use std::net::UdpSocket;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lsngate_cluster::{Cluster, shared_cluster};
use lsngate_proxy::FileConfig;

use crate::discover::wait_read_served_by;
use crate::patroni::wait_in_node_set;
use crate::support::{TestProxy, connect, file_config, rt, unique};

const SERVICE: &str = "_postgresql._tcp.lsngate.test";

/// A dnsmasq answering only from `records` (dnsmasq config lines) on 127.0.0.1:`port`, as the
/// authority for lsngate.test (a question it has no record for gets "no such record", as from a
/// cluster's DNS, not REFUSED for want of an upstream server).
struct Dns {
    child: Child,
}

impl Dns {
    fn start(port: u16, records: &[String], dir: &Path) -> Dns {
        let conf = dir.join(format!("dnsmasq-{}.conf", unique("records")));
        let mut lines = vec!["local=/lsngate.test/".to_string()];
        lines.extend_from_slice(records);
        std::fs::write(&conf, lines.join("\n") + "\n").unwrap();
        let child = Command::new("/usr/sbin/dnsmasq")
            .args([
                "--keep-in-foreground",
                "--no-resolv",
                "--no-hosts",
                "--no-poll",
                "--bind-interfaces",
                "--listen-address=127.0.0.1",
                "--pid-file=",
                "--user=root",
                &format!("--port={port}"),
                &format!("--conf-file={}", conf.display()),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("dnsmasq (scripts/install/dns.sh installs it)");
        let mut dns = Dns { child };
        // Ready once it accepts on its TCP port (it serves DNS over TCP too), at most 10 s.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = dns.child.try_wait().unwrap() {
                panic!("dnsmasq on port {port} exited at start: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "dnsmasq on port {port} is not up in 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        dns
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port free for both UDP and TCP on 127.0.0.1 (dnsmasq binds both).
fn free_udp_port() -> u16 {
    loop {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = tcp.local_addr().unwrap().port();
        if UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// SRV records for the members on `ports`, all on host db.lsngate.test (127.0.0.1).
fn srv_records(ports: &[u16]) -> Vec<String> {
    let mut lines = vec!["host-record=db.lsngate.test,127.0.0.1".to_string()];
    lines.extend(
        ports
            .iter()
            .map(|port| format!("srv-host={SERVICE},db.lsngate.test,{port}")),
    );
    lines
}

fn dns_proxy(cluster: &Cluster, name: &str, dns_port: u16, member_port: Option<u16>) -> TestProxy {
    TestProxy::with(FileConfig {
        topology: Some("dns".into()),
        dns_name: Some(name.into()),
        dns_server: Some(format!("127.0.0.1:{dns_port}")),
        dns_port: member_port,
        topology_poll_ms: Some(100),
        topology_settle_polls: Some(2),
        replicas: Vec::new(),
        ..file_config(cluster)
    })
}

/// Ports that served `reads` reads on fresh connections.
fn served_ports(proxy: &TestProxy, reads: usize) -> Vec<u16> {
    rt().block_on(async {
        let mut ports = Vec::new();
        for _ in 0..reads {
            let client = connect(&proxy.conninfo()).await;
            let port: i32 = client
                .query_one("SELECT inet_server_port()", &[])
                .await
                .unwrap()
                .get(0);
            ports.push(port as u16);
        }
        ports
    })
}

#[test]
fn dns_srv_records_are_the_node_set_followed_as_they_change() {
    let cluster = shared_cluster();
    let dir = tempfile::tempdir().unwrap();
    let primary = cluster.primary().port();
    let replicas: Vec<u16> = cluster.replicas().iter().map(|r| r.port()).collect();
    let port = free_udp_port();
    let dns = Dns::start(port, &srv_records(&[primary, replicas[0]]), dir.path());
    let proxy = dns_proxy(cluster, SERVICE, port, None);
    wait_in_node_set(&proxy, primary, true, Duration::from_secs(30));
    wait_in_node_set(&proxy, replicas[0], true, Duration::from_secs(30));
    assert_eq!(proxy.status()["topology"]["source"], "dns");
    wait_read_served_by(&proxy, replicas[0]);
    assert!(
        !served_ports(&proxy, 10).contains(&replicas[1]),
        "a replica not in the records gets no reads"
    );

    // The server goes away: the node set stays as it was, and says why.
    dns.stop();
    let deadline = Instant::now() + Duration::from_secs(30);
    while proxy.status()["topology"]["last_error"].is_null() {
        assert!(Instant::now() < deadline, "a failed lookup is reported");
        std::thread::sleep(Duration::from_millis(50));
    }
    wait_in_node_set(&proxy, replicas[0], true, Duration::from_secs(1));

    // replica2 is published: it joins and gets reads.
    let dns = Dns::start(
        port,
        &srv_records(&[primary, replicas[0], replicas[1]]),
        dir.path(),
    );
    wait_in_node_set(&proxy, replicas[1], true, Duration::from_secs(30));
    wait_read_served_by(&proxy, replicas[1]);
    dns.stop();

    // replica1 is withdrawn: it leaves, and no read reaches it.
    let _dns = Dns::start(port, &srv_records(&[primary, replicas[1]]), dir.path());
    wait_in_node_set(&proxy, replicas[0], false, Duration::from_secs(30));
    let served = served_ports(&proxy, 20);
    assert!(!served.contains(&replicas[0]), "{served:?}");
    // Writes reach the primary the monitors detect among the members.
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        let table = unique("dns_t");
        client
            .batch_execute(&format!("CREATE TABLE {table} (id int)"))
            .await
            .unwrap();
        let port: i32 = client
            .query_one(
                &format!("INSERT INTO {table} VALUES (1) RETURNING inet_server_port()"),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(port, i32::from(primary));
    });
    proxy.shutdown();
}

#[test]
fn dns_address_records_place_every_member_on_dns_port() {
    let cluster = shared_cluster();
    let dir = tempfile::tempdir().unwrap();
    let primary = cluster.primary().port();
    let port = free_udp_port();
    let _dns = Dns::start(
        port,
        &["host-record=members.lsngate.test,127.0.0.1".to_string()],
        dir.path(),
    );
    let proxy = dns_proxy(cluster, "members.lsngate.test", port, Some(primary));
    let deadline = Instant::now() + Duration::from_secs(30);
    let members = loop {
        let topology = proxy.status()["topology"].clone();
        let members = topology["members"].as_array().cloned().unwrap_or_default();
        if !members.is_empty() {
            break members;
        }
        assert!(
            Instant::now() < deadline,
            "no member resolved: {topology:#}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(members.len(), 1, "one A record, one member: {members:?}");
    assert_eq!(members[0]["address"], format!("127.0.0.1:{primary}"));
    assert_eq!(served_ports(&proxy, 3), vec![primary; 3]);
    proxy.shutdown();
}
