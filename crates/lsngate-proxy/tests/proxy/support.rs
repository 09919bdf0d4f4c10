//! Test support: an in-process proxy on 127.0.0.1:0 in front of a lsngate-cluster cluster, on its own
//! runtime thread so blocking clients (psql, pgbench, python, node) can talk to it.

use std::net::SocketAddr;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use lsngate_cluster::Cluster;
use lsngate_proxy::{Config, FileConfig, Proxy};
use tokio::sync::watch;

pub struct TestProxy {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub proxy: Arc<Proxy>,
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

pub fn file_config(cluster: &Cluster) -> FileConfig {
    FileConfig {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        primary: Some(cluster.primary_url()),
        replicas: cluster.replica_urls(),
        pool_size: Some(4),
        health_interval_ms: Some(200),
        ..Default::default()
    }
}

impl TestProxy {
    pub fn start(cluster: &Cluster) -> TestProxy {
        Self::with(file_config(cluster))
    }

    pub fn with(file: FileConfig) -> TestProxy {
        // The proxy's log on stderr when asked for: RUST_LOG=lsngate_proxy=trace ... --nocapture
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
        let mut config = Config::build(file).expect("valid test config");
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let admin_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = std_listener.local_addr().unwrap();
        let admin = admin_listener.local_addr().unwrap();
        config.listen = addr;
        config.admin_listen = Some(admin);
        std_listener.set_nonblocking(true).unwrap();
        let proxy = Proxy::new(config);
        // Served as bound: dropped and bound again by the proxy, the port was free for a
        // moment, and a test server started in parallel could take it — then `/status`
        // reached PostgreSQL, which reset the connection ("connection reset by peer").
        proxy.adopt_admin_listener(admin_listener);
        let (stop, stop_rx) = watch::channel(false);
        let serving = Arc::clone(&proxy);
        let thread = std::thread::spawn(move || {
            // The runtime `lsngate proxy --threads 2` runs on (no time driver: a proxy timer
            // made with tokio's own would panic here).
            let runtime = lsngate_proxy::runtime(2).unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
                serving.serve(listener, stop_rx).await.unwrap();
            });
        });
        let test_proxy = TestProxy {
            addr,
            admin,
            proxy,
            stop,
            thread: Some(thread),
        };
        test_proxy.wait_ready();
        test_proxy
    }

    fn wait_ready(&self) {
        for _ in 0..200 {
            if std::net::TcpStream::connect(self.addr).is_ok()
                && std::net::TcpStream::connect(self.admin).is_ok()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("proxy did not start listening");
    }

    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            self.addr.port()
        )
    }

    pub fn conninfo(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.addr.port()
        )
    }

    pub fn http_get(&self, path: &str) -> String {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(self.admin).unwrap();
        write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
    }

    /// The admin port's `/status` document.
    pub fn status(&self) -> serde_json::Value {
        let response = self.http_get("/status");
        let body = response.split("\r\n\r\n").nth(1).expect("HTTP body");
        serde_json::from_str(body).expect("JSON status")
    }

    /// Stops accepting and waits for sessions to drain.
    pub fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for TestProxy {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// Runs a command, returns (stdout, stderr); panics with both if it failed.
pub fn run_ok(command: &mut Command) -> (String, String) {
    let output = run(command);
    let (stdout, stderr) = texts(&output);
    assert!(
        output.status.success(),
        "{command:?} failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    (stdout, stderr)
}

pub fn run(command: &mut Command) -> Output {
    command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"))
}

pub fn texts(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `psql` (the binary at `psql`) running `SELECT current_user` through `proxy`, logged in with
/// the conninfo words `params` (user, dbname, ...) and `password`: (succeeded, what it printed).
pub fn psql_current_user(
    psql: &std::path::Path,
    proxy: &TestProxy,
    params: &str,
    password: &str,
) -> (bool, String) {
    let conninfo = format!("host=127.0.0.1 port={} {params}", proxy.addr.port());
    let mut command = Command::new(psql);
    command
        .args([
            "-X",
            "-A",
            "-t",
            "-w",
            "-d",
            &conninfo,
            "-c",
            "SELECT current_user",
        ])
        .env("PGPASSWORD", password);
    let output = run(&mut command);
    let (stdout, stderr) = texts(&output);
    (output.status.success(), format!("{stdout}{stderr}"))
}

/// A unique name for tables so tests sharing a cluster do not collide.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Waits (at most 30 s) until a statement containing `marker` runs on one of the cluster's
/// servers, so that a cancel sent now finds it there (a cancel sent after a fixed sleep could
/// arrive before the statement and be ignored, and the statement then ran to its end).
pub fn wait_running(nodes: &[lsngate_cluster::Node], marker: &str) {
    let sql = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' \
         AND query LIKE '%{marker}%' AND pid <> pg_backend_pid()"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !nodes.iter().any(|n| n.sql(&sql).is_ok_and(|c| c != "0")) {
        assert!(
            std::time::Instant::now() < deadline,
            "no server ran the statement marked {marker} within 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until every replica replayed the primary's current position.
pub fn caught_up(cluster: &Cluster) {
    cluster
        .wait_caught_up(Duration::from_secs(30))
        .expect("replicas catch up");
}

/// A tokio runtime for async client code in a sync test.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The port of the server that answers `client`'s next statement (`inet_server_port()`).
pub async fn server_port(client: &tokio_postgres::Client) -> i32 {
    client
        .query_one("SELECT inet_server_port()", &[])
        .await
        .unwrap()
        .get(0)
}

pub async fn connect(conninfo: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls)
        .await
        .expect("connect through the proxy");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// The first value of the first row `sql` returns as a simple query ("" for none): a simple
/// query, unlike `query_one`, can take the proxy's pass-through.
pub async fn show(client: &tokio_postgres::Client, sql: &str) -> String {
    first_value(&client.simple_query(sql).await.unwrap())
}

/// The first value of the first row of a simple query's answer ("" for none).
pub fn first_value(messages: &[tokio_postgres::SimpleQueryMessage]) -> String {
    messages
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .unwrap_or_default()
}

/// Runs `sql` until it succeeds (a failover in progress: no primary yet), at most 30 s.
pub async fn execute_once_a_primary_takes_it(client: &tokio_postgres::Client, sql: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match client.batch_execute(sql).await {
            Ok(()) => return,
            Err(e) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "writes never reached the new primary: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Waits (at most 30 s) until `proxy`'s monitors have seen the node on `port` as a healthy
/// primary: a client logging in before that is sent to the configured one. Looking at /status
/// does not speed the monitors up; they find a promotion at their next poll.
pub fn wait_primary_known(proxy: &TestProxy, port: u16) {
    let address = format!("127.0.0.1:{port}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let status = proxy.status();
        let known = status["nodes"].as_array().is_some_and(|nodes| {
            nodes.iter().any(|n| {
                n["address"] == address.as_str() && n["role"] == "primary" && n["healthy"] == true
            })
        });
        if known {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the proxy never saw {address} as its primary: {status:#}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A table with one row (`id` 1) whose `n` a thread counts up on the primary every 2 ms until
/// [`Counter::stop`]: what the monotonic-read tests read (a read showing a lower `n` than an
/// earlier one went back in time).
pub struct Counter {
    /// The table's name.
    pub table: String,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Counter {
    /// A cluster of a primary and two streaming replicas, counting, with replica0 held `behind`
    /// (its `recovery_min_apply_delay`): what a read moving between the replicas may go back by.
    pub fn on_two_replicas(behind: Duration) -> (Cluster, Counter) {
        let cluster =
            Cluster::start(&lsngate_cluster::ClusterConfig::default().replicas(2)).unwrap();
        cluster.wait_streaming(Duration::from_secs(30)).unwrap();
        let counter = Counter::start(&cluster);
        cluster.replica(0).set_apply_delay(behind).unwrap();
        (cluster, counter)
    }

    /// Creates the table (replicas caught up with it) and starts counting.
    pub fn start(cluster: &Cluster) -> Counter {
        let table = unique("counter");
        cluster
            .primary()
            .sql(&format!(
                "CREATE TABLE {table} (id int PRIMARY KEY, n bigint); INSERT INTO {table} VALUES (1, 0)"
            ))
            .unwrap();
        caught_up(cluster);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = {
            let (url, stop, sql) = (
                cluster.primary().conninfo(),
                stop.clone(),
                format!("UPDATE {table} SET n = n + 1 WHERE id = 1"),
            );
            std::thread::spawn(move || {
                rt().block_on(async {
                    let client = connect(&url).await;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        client.batch_execute(&sql).await.unwrap();
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                })
            })
        };
        Counter {
            table,
            stop,
            thread: Some(thread),
        }
    }

    /// Stops counting (a failed update fails the test here).
    pub fn stop(mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the counting thread failed");
        }
    }
}

/// Reads that showed a lower count than an earlier one, as `read I on port P: N after M`.
#[derive(Default)]
pub struct Backwards {
    last: i64,
    pub seen: Vec<String>,
}

impl Backwards {
    /// Read `i` on the server at `port` showed `n`.
    pub fn read(&mut self, i: usize, port: i32, n: i64) {
        if n < self.last {
            self.seen
                .push(format!("read {i} on port {port}: {n} after {}", self.last));
        }
        self.last = self.last.max(n);
    }
}

/// `lsngate_proxy_passthrough_total` from /metrics: simple Queries the pass-through sent.
pub fn passed_through(proxy: &TestProxy) -> u64 {
    proxy
        .http_get("/metrics")
        .lines()
        .find_map(|l| l.strip_prefix("lsngate_proxy_passthrough_total "))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// Terminates (`pg_terminate_backend`) the shared cluster's primary backend running exactly
/// `query`, once it shows up in `pg_stat_activity`: true when one was terminated within 10 s
/// (a bound, not a measurement).
pub fn terminate_when_running(query: &str) -> std::thread::JoinHandle<bool> {
    let sql = format!(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query = '{}' AND pid <> pg_backend_pid()",
        query.replace('\'', "''")
    );
    std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if lsngate_cluster::shared_cluster()
                .primary()
                .sql(&sql)
                .unwrap()
                == "1"
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    })
}
