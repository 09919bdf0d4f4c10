//! Online restart of the proxy as processes (the proxy_cli example, what `lsngate proxy` runs):
//! a new process started with `--takeover` takes the listening socket over while the old one
//! serves its clients until they leave; `SHUTDOWN WAIT_FOR_CLIENTS`; the drain's bound
//! (`shutdown_timeout_ms`, then 57P01); a cancel request reaching the old process through the
//! new one; the systemd readiness datagrams (`NOTIFY_SOCKET`) every step here waits on.
//! `cargo test -p lsngate-proxy` builds the example; `--test proxy` alone does not, so build it
//! first (`cargo build -p lsngate-proxy --example proxy_cli`) or these run a stale one.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use lsngate_cluster::shared_cluster;

/// A runtime whose tasks run while the test thread waits on processes.
fn threaded() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A free TCP port on the loopback.
fn free_port() -> u16 {
    lsngate_cluster::free_port().unwrap()
}

/// A config file for a proxy on `port` with its control socket in `runtime`: one login `app`
/// (also the console admin), `extra` appended as written.
fn write_config(dir: &Path, port: u16, runtime: &Path, extra: &str) -> PathBuf {
    let cluster = shared_cluster();
    let path = dir.join(format!("lsngate-{}.toml", unique("config")));
    let text = format!(
        "listen = \"127.0.0.1:{port}\"\nprimary = \"{}\"\nreplicas = {:?}\n\
         runtime_dir = {:?}\nhealth_interval_ms = 200\nadmin_users = [\"app\"]\n{extra}\n\
         [[users]]\nname = \"app\"\npassword = \"app-pw\"\n",
        cluster.primary_url(),
        cluster.replica_urls(),
        runtime.display().to_string(),
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// One proxy process, with the datagram socket it notifies (as systemd's `NOTIFY_SOCKET`).
struct ProxyProcess {
    child: Child,
    notified: UnixDatagram,
    log: PathBuf,
}

impl ProxyProcess {
    /// Starts the proxy with `config` and `args`, and waits (at most 60 s) for its `READY=1`.
    fn start(config: &Path, args: &[&str], port: u16) -> ProxyProcess {
        let dir = config.parent().unwrap();
        let name = unique("proxy");
        let socket = dir.join(format!("{name}.notify"));
        let notified = UnixDatagram::bind(&socket).unwrap();
        notified
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let log = dir.join(format!("{name}.log"));
        let child = Command::new(crate::signals::example_binary())
            .arg("--config")
            .arg(config)
            .args(args)
            .env("NOTIFY_SOCKET", &socket)
            .env("RUST_LOG", "lsngate_proxy=info")
            .stderr(std::fs::File::create(&log).unwrap())
            .stdout(Stdio::null())
            .spawn()
            .expect("the proxy_cli example is built by cargo test");
        let mut process = ProxyProcess {
            child,
            notified,
            log,
        };
        let ready = process.next_notice();
        assert_eq!(
            ready,
            format!("READY=1\nMAINPID={}", process.child.id()),
            "{}",
            process.log_text()
        );
        // Ready means accepting: a login succeeds at once.
        assert!(
            psql_at(port, "postgres", &["SELECT 1"]).0,
            "{}",
            process.log_text()
        );
        process
    }

    /// The next datagram it sent the service manager (at most 60 s).
    fn next_notice(&mut self) -> String {
        let mut buf = [0u8; 512];
        match self.notified.recv(&mut buf) {
            Ok(n) => String::from_utf8_lossy(&buf[..n]).into_owned(),
            Err(e) => panic!("no notification within 60 s: {e}\n{}", self.log_text()),
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, signal: &str) {
        run_ok(Command::new("kill").args([signal, &self.child.id().to_string()]));
    }

    /// Its exit status, waiting at most `limit`.
    fn exit_within(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the proxy did not exit within {limit:?}\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// psql as `app` on `database` through `port`; (succeeded, stdout, stderr).
fn psql_at(port: u16, database: &str, commands: &[&str]) -> (bool, String, String) {
    let conninfo = format!("host=127.0.0.1 port={port} user=app dbname={database}");
    let mut command = Command::new(shared_cluster().pg_bin().tool("psql"));
    command
        .args([
            "-X",
            "-w",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            &conninfo,
        ])
        .env("PGPASSWORD", "app-pw");
    for c in commands {
        command.args(["-c", c]);
    }
    let output = run(&mut command);
    let (stdout, stderr) = texts(&output);
    (output.status.success(), stdout, stderr)
}

/// Waits (at most 30 s) until nothing accepts on `port`.
fn wait_refused(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
        assert!(
            Instant::now() < deadline,
            "port {port} still accepts 30 s after the drain began"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn conninfo(port: u16, database: &str) -> String {
    format!("host=127.0.0.1 port={port} user=app password=app-pw dbname={database}")
}

/// A database of its own with pgbench's tables, replayed on the replicas.
fn pgbench_database() -> String {
    let cluster = shared_cluster();
    let database = unique("bench");
    cluster
        .primary()
        .sql(&format!("CREATE DATABASE {database}"))
        .unwrap();
    run_ok(Command::new(cluster.pg_bin().tool("pgbench")).args([
        "-i",
        "-q",
        "-s",
        "1",
        "-h",
        "127.0.0.1",
        "-p",
        &cluster.primary().port().to_string(),
        "-U",
        "postgres",
        &database,
    ]));
    caught_up(cluster);
    database
}

/// pgbench's count on the line starting with `label` ("number of failed transactions: 0 (0.000%)").
fn pgbench_count(output: &str, label: &str) -> u64 {
    let line = output
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("pgbench printed no {label:?}:\n{output}"));
    line[label.len()..]
        .split_whitespace()
        .next()
        .and_then(|n| n.split('/').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unreadable pgbench line {line:?}"))
}

/// Runs pgbench through the proxy at `port` while a second process takes the port over, and
/// checks that no transaction failed, the old process left once its clients did and the new
/// one serves.
fn takeover_under_pgbench(connection_per_transaction: bool) {
    let cluster = shared_cluster();
    let dir = tempfile::tempdir().unwrap();
    let runtime = dir.path().join("run");
    std::fs::create_dir(&runtime).unwrap();
    let port = free_port();
    let config = write_config(dir.path(), port, &runtime, "shutdown_timeout_ms = 120000");
    let mut old = ProxyProcess::start(&config, &["--takeover"], port);
    let database = pgbench_database();
    let mut bench = Command::new(cluster.pg_bin().tool("pgbench"));
    bench
        .args(["-c", "4", "-j", "2", "-T", "8", "-n"])
        .args(connection_per_transaction.then_some("-C"))
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "app"])
        .arg(&database)
        .env("PGPASSWORD", "app-pw")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let bench = bench.spawn().unwrap();
    // The takeover happens while pgbench runs: once its transactions reach the primary.
    let deadline = Instant::now() + Duration::from_secs(30);
    let primary_port = cluster.primary().port().to_string();
    let mut psql_primary = Command::new(cluster.pg_bin().tool("psql"));
    psql_primary.args([
        "-X",
        "-A",
        "-t",
        "-h",
        "127.0.0.1",
        "-p",
        &primary_port,
        "-U",
        "postgres",
    ]);
    psql_primary.args([
        "-d",
        &database,
        "-c",
        "SELECT count(*) FROM pgbench_history",
    ]);
    while run(&mut psql_primary).stdout == b"0\n" {
        assert!(Instant::now() < deadline, "pgbench wrote nothing in 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut new = ProxyProcess::start(&config, &["--takeover"], port);
    assert_eq!(old.next_notice(), "STOPPING=1", "{}", old.log_text());
    let output = bench.wait_with_output().unwrap();
    let (stdout, stderr) = texts(&output);
    let report = format!("{stdout}{stderr}");
    assert!(output.status.success(), "pgbench failed:\n{report}");
    assert_eq!(
        pgbench_count(&report, "number of failed transactions: "),
        0,
        "{report}"
    );
    assert!(
        pgbench_count(&report, "number of transactions actually processed: ") > 0,
        "{report}"
    );
    assert!(
        !stderr.contains("connection"),
        "connection errors:\n{report}"
    );
    // The old process leaves once pgbench's connections have, well before its bound.
    let status = old.exit_within(Duration::from_secs(60));
    assert!(
        status.success(),
        "old process: {status}\n{}",
        old.log_text()
    );
    assert!(new.running());
    let (ok, stdout, stderr) = psql_at(
        port,
        &database,
        &["SELECT count(*) > 0 FROM pgbench_history"],
    );
    assert!(ok && stdout.trim() == "t", "{stderr}");
    if connection_per_transaction {
        // Connections opened after the takeover ran their transactions on the new process.
        let (ok, stats, stderr) = psql_at(port, "lsngate", &["SHOW STATS"]);
        assert!(ok, "{stderr}");
        let assigned: u64 = stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{database}|")))
            .and_then(|rest| rest.split('|').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no SHOW STATS row of {database}:\n{stats}"));
        assert!(assigned > 1, "{stats}");
    }
    new.signal("-TERM");
    assert!(new.exit_within(Duration::from_secs(60)).success());
}

#[test]
fn a_takeover_under_pgbench_fails_no_transaction() {
    takeover_under_pgbench(false);
}

#[test]
fn a_takeover_under_pgbench_with_a_connection_per_transaction_fails_none() {
    takeover_under_pgbench(true);
}

#[test]
fn ready_is_notified_once_accepting_and_stopping_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(dir.path(), port, dir.path(), "");
    // `start` checks READY=1 with the process's PID and a login right after it.
    let mut proxy = ProxyProcess::start(&config, &[], port);
    let link = dir.path().join(format!("lsngate-{port}.sock"));
    assert!(
        std::fs::read_link(&link).is_ok(),
        "the serving link is published once ready"
    );
    proxy.signal("-TERM");
    assert_eq!(proxy.next_notice(), "STOPPING=1");
    assert!(proxy.exit_within(Duration::from_secs(60)).success());
    assert!(
        std::fs::read_link(&link).is_err()
            && std::fs::read_dir(dir.path())
                .unwrap()
                .all(|e| { !e.unwrap().file_name().to_string_lossy().ends_with(".sock") }),
        "the control socket and its link are removed at exit"
    );
}

#[test]
fn shutdown_wait_for_clients_serves_open_sessions_until_they_leave() {
    let cluster = shared_cluster();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(dir.path(), port, dir.path(), "shutdown_timeout_ms = 120000");
    let mut proxy = ProxyProcess::start(&config, &[], port);
    let t = unique("stay");
    cluster
        .primary()
        .sql(&format!("CREATE TABLE {t} (id int)"))
        .unwrap();
    let runtime = rt();
    let client = runtime.block_on(connect(&conninfo(port, "postgres")));
    let (ok, _, stderr) = psql_at(port, "lsngate", &["SHUTDOWN WAIT_FOR_CLIENTS"]);
    assert!(ok, "{stderr}");
    assert_eq!(proxy.next_notice(), "STOPPING=1");
    wait_refused(port);
    // A new process finds this one stopping (its socket closed) and binds the port itself.
    let mut new = ProxyProcess::start(&config, &["--takeover"], port);
    // The open session goes on: transactions, reads, as many as it likes.
    runtime.block_on(async {
        for i in 0..3 {
            client
                .batch_execute(&format!("BEGIN; INSERT INTO {t} VALUES ({i}); COMMIT"))
                .await
                .unwrap();
            let count: i64 = client
                .query_one(&format!("SELECT count(*) FROM {t}"), &[])
                .await
                .unwrap()
                .get(0);
            assert_eq!(count, i + 1);
        }
    });
    assert!(proxy.running(), "a client is still connected");
    drop(client);
    drop(runtime);
    let status = proxy.exit_within(Duration::from_secs(60));
    assert!(status.success(), "{status}\n{}", proxy.log_text());
    assert!(new.running());
    new.signal("-TERM");
    assert!(new.exit_within(Duration::from_secs(60)).success());
}

#[test]
fn a_client_still_there_at_shutdown_timeout_gets_57p01_and_the_proxy_exits() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(dir.path(), port, dir.path(), "shutdown_timeout_ms = 1500");
    let mut proxy = ProxyProcess::start(&config, &[], port);
    let runtime = threaded();
    let (idle, idle_connection) = runtime
        .block_on(tokio_postgres::connect(
            &conninfo(port, "postgres"),
            tokio_postgres::NoTls,
        ))
        .unwrap();
    let idle_connection = runtime.spawn(idle_connection);
    let busy = runtime.block_on(connect(&conninfo(port, "postgres")));
    let marker = unique("stays");
    let sleep = format!("SELECT pg_sleep(60) /* {marker} */");
    let sleeping = runtime.spawn(async move { busy.batch_execute(&sleep).await });
    wait_running(
        &shared_cluster().nodes().cloned().collect::<Vec<_>>(),
        &marker,
    );
    let (ok, _, stderr) = psql_at(port, "lsngate", &["SHUTDOWN WAIT_FOR_CLIENTS"]);
    assert!(ok, "{stderr}");
    let status = proxy.exit_within(Duration::from_secs(30));
    assert!(status.success(), "{status}\n{}", proxy.log_text());
    let slept = runtime.block_on(sleeping).unwrap().unwrap_err();
    assert_eq!(
        slept.code(),
        Some(&tokio_postgres::error::SqlState::ADMIN_SHUTDOWN),
        "{slept}"
    );
    let ended = runtime.block_on(idle_connection).unwrap().unwrap_err();
    assert_eq!(
        ended.code(),
        Some(&tokio_postgres::error::SqlState::ADMIN_SHUTDOWN),
        "{ended}"
    );
    let message = ended.as_db_error().map(|e| e.message().to_string());
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains("shutdown_timeout_ms")),
        "{message:?}"
    );
    drop(idle);
}

#[test]
fn a_cancel_sent_to_the_new_process_reaches_the_old_ones_session() {
    let cluster = shared_cluster();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(dir.path(), port, dir.path(), "shutdown_timeout_ms = 120000");
    let mut old = ProxyProcess::start(&config, &[], port);
    let runtime = threaded();
    let client = runtime.block_on(connect(&conninfo(port, "postgres")));
    let cancel = client.cancel_token();
    let marker = unique("cancel_me");
    let sleep = format!("SELECT pg_sleep(30) /* {marker} */");
    let sleeping = runtime.spawn(async move {
        let result = client.batch_execute(&sleep).await;
        (client, result)
    });
    let nodes: Vec<_> = cluster.nodes().cloned().collect();
    wait_running(&nodes, &marker);
    let mut new = ProxyProcess::start(&config, &["--takeover"], port);
    // The old process no longer accepts: the cancel request can only reach the new one.
    assert_eq!(old.next_notice(), "STOPPING=1");
    runtime
        .block_on(cancel.cancel_query(tokio_postgres::NoTls))
        .unwrap();
    let (client, result) = runtime.block_on(sleeping).unwrap();
    let error = result.unwrap_err();
    assert_eq!(
        error.code(),
        Some(&tokio_postgres::error::SqlState::QUERY_CANCELED),
        "{error}"
    );
    // The session is fine afterwards, on the old process, which leaves once it does.
    runtime.block_on(client.batch_execute("SELECT 1")).unwrap();
    assert!(old.running());
    drop(client);
    drop(runtime);
    assert!(old.exit_within(Duration::from_secs(60)).success());
    new.signal("-TERM");
    assert!(new.exit_within(Duration::from_secs(60)).success());
}

#[test]
fn sigterm_during_wait_for_clients_closes_the_clients_as_their_transactions_end() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(dir.path(), port, dir.path(), "shutdown_timeout_ms = 120000");
    let mut proxy = ProxyProcess::start(&config, &[], port);
    let runtime = threaded();
    let (client, connection) = runtime
        .block_on(tokio_postgres::connect(
            &conninfo(port, "postgres"),
            tokio_postgres::NoTls,
        ))
        .unwrap();
    let connection = runtime.spawn(connection);
    runtime.block_on(client.batch_execute("BEGIN")).unwrap();
    let (ok, _, stderr) = psql_at(port, "lsngate", &["SHUTDOWN WAIT_FOR_CLIENTS"]);
    assert!(ok, "{stderr}");
    assert_eq!(proxy.next_notice(), "STOPPING=1");
    // Escalated: the client's open transaction still finishes, then the client is closed.
    proxy.signal("-TERM");
    runtime
        .block_on(client.batch_execute("SELECT 1; COMMIT"))
        .unwrap();
    let ended = runtime.block_on(connection).unwrap().unwrap_err();
    assert_eq!(
        ended.code(),
        Some(&tokio_postgres::error::SqlState::ADMIN_SHUTDOWN),
        "{ended}"
    );
    // Well before the 120 s bound.
    assert!(proxy.exit_within(Duration::from_secs(60)).success());
}
