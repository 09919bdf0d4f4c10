//! The proxy as a process (`run_cli`, via the proxy_cli example that `cargo test` builds):
//! SIGHUP re-reads the config file, SIGTERM drains and exits 0.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use lsngate_cluster::shared_cluster;

pub fn example_binary() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join("proxy_cli")
}

fn login(port: u16, user: &str, password: &str) -> bool {
    let cluster = shared_cluster();
    let conninfo = format!("host=127.0.0.1 port={port} user={user} dbname=postgres");
    let mut command = Command::new(cluster.pg_bin().tool("psql"));
    command
        .args(["-X", "-w", "-d", &conninfo, "-c", "SELECT 1"])
        .env("PGPASSWORD", password);
    run(&mut command).status.success()
}

#[test]
fn sighup_reloads_users_and_sigterm_exits_cleanly() {
    let cluster = shared_cluster();
    let dir = tempfile::tempdir().unwrap();
    let port = lsngate_cluster::free_port().unwrap();
    let config_path = dir.path().join("lsngate.toml");
    let write_config = |users: &[(&str, &str)]| {
        let mut text = format!(
            "listen = \"127.0.0.1:{port}\"\nprimary = \"{}\"\nreplicas = {:?}\n",
            cluster.primary_url(),
            cluster.replica_urls()
        );
        for (name, password) in users {
            text.push_str(&format!(
                "[[users]]\nname = \"{name}\"\npassword = \"{password}\"\n"
            ));
        }
        std::fs::write(&config_path, text).unwrap();
    };
    write_config(&[("first", "one")]);
    let mut child = Command::new(example_binary())
        .arg("--config")
        .arg(&config_path)
        .stderr(Stdio::null())
        .spawn()
        .expect("the proxy_cli example is built by cargo test");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "proxy_cli did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(login(port, "first", "one"));
    assert!(!login(port, "second", "two"));
    write_config(&[("first", "one"), ("second", "two")]);
    run_ok(Command::new("kill").args(["-HUP", &child.id().to_string()]));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !login(port, "second", "two") {
        assert!(Instant::now() < deadline, "SIGHUP did not reload the users");
        std::thread::sleep(Duration::from_millis(100));
    }
    run_ok(Command::new("kill").args(["-TERM", &child.id().to_string()]));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status}");
            break;
        }
        assert!(Instant::now() < deadline, "SIGTERM did not stop the proxy");
        std::thread::sleep(Duration::from_millis(50));
    }
}
