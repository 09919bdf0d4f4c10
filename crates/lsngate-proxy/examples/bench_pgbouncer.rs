//! Benchmark (not a test): `pgbench -S` and a mixed read/write script against the primary
//! directly, through Debian's PgBouncer (transaction mode) and through lsngate — primary only as
//! a plain pooler (consistency eventual, the like-for-like comparison), primary + replica with
//! plain read/write splitting, and primary + replica with causal reads (consistency session, the
//! default) — same clients, one run side by side. Prints a table with TPS and latency ratios,
//! then JSON.
//!
//! `cargo run --release -p lsngate-proxy --example bench_pgbouncer -- [seconds] [clients] [proxy threads]`
//! Needs pgbouncer (scripts/install/proxy.sh) and runs it as the testkit's server user.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use lsngate_proxy::{Config, FileConfig, Proxy};
use lsngate_testkit::{Cluster, ClusterConfig, SERVER_USER};

const MIXED: &str = "\\set aid random(1, 100000 * :scale)
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid + 1;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid + 2;
UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;
";

struct Measured {
    target: &'static str,
    workload: &'static str,
    tps: f64,
    latency_ms: f64,
}

fn pgbench(cluster: &Cluster, port: u16, args: &[&str]) -> (f64, f64) {
    let text = pgbench_output(cluster, port, args);
    let number = |prefix: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {prefix:?} in pgbench output:\n{text}"))
    };
    (number("tps = "), number("latency average = "))
}

fn pgbench_output(cluster: &Cluster, port: u16, args: &[&str]) -> String {
    let output = Command::new(cluster.pg_bin().tool("pgbench"))
        .args(args)
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "postgres",
            "postgres",
        ])
        .output()
        .expect("run pgbench");
    let text = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "pgbench {args:?} on port {port} failed:\n{text}"
    );
    text
}

fn start_pgbouncer(dir: &Path, primary_port: u16, port: u16, pool: usize) -> Child {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("userlist.txt"), "\"postgres\" \"\"\n").unwrap();
    let ini = format!(
        "[databases]\npostgres = host=127.0.0.1 port={primary_port} dbname=postgres\n\n[pgbouncer]\n\
         listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\nauth_type = trust\n\
         auth_file = {dir}/userlist.txt\npool_mode = transaction\ndefault_pool_size = {pool}\n\
         max_client_conn = 1000\nlogfile = {dir}/pgbouncer.log\npidfile = {dir}/pgbouncer.pid\n",
        dir = dir.display()
    );
    std::fs::write(dir.join("pgbouncer.ini"), ini).unwrap();
    let _ = Command::new("chown")
        .args(["-R", SERVER_USER])
        .arg(dir)
        .status();
    let mut command = Command::new("pgbouncer");
    if unsafe { libc_geteuid() } == 0 {
        command.args(["-u", SERVER_USER]);
    }
    let mut child = command
        .arg(dir.join("pgbouncer.ini"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start pgbouncer");
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return child;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!(
        "pgbouncer did not start; see {}/pgbouncer.log",
        dir.display()
    );
}

unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_lsngate(
    cluster: &Cluster,
    with_replica: bool,
    consistency: &str,
    pool: usize,
    threads: usize,
) -> (u16, tokio::sync::watch::Sender<bool>) {
    let file = FileConfig {
        consistency: Some(consistency.into()),
        listen: Some("127.0.0.1:0".parse().unwrap()),
        primary: Some(cluster.primary_url()),
        replicas: if with_replica {
            cluster.replica_urls()
        } else {
            Vec::new()
        },
        pool_size: Some(pool),
        ..Default::default()
    };
    let config = Config::build(file).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            Proxy::new(config).serve(listener, stop_rx).await.unwrap();
        });
    });
    std::thread::sleep(Duration::from_millis(500));
    (port, stop)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(10);
    let clients: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(8);
    let threads: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(2);
    let pool = clients.min(16);
    let cluster = Cluster::start(&ClusterConfig::default().replicas(1)).expect("start cluster");
    cluster.wait_streaming(Duration::from_secs(30)).unwrap();
    let primary_port = cluster.primary().port();
    pgbench_output(&cluster, primary_port, &["-i", "-s", "10", "-q"]);
    cluster.wait_caught_up(Duration::from_secs(60)).unwrap();
    let script = std::env::temp_dir().join(format!("lsngate-mixed-{}.sql", std::process::id()));
    std::fs::write(&script, MIXED).unwrap();
    let bouncer_dir =
        std::env::temp_dir().join(format!("lsngate-pgbouncer-{}", std::process::id()));
    let bouncer_port = free_port();
    let mut bouncer = start_pgbouncer(&bouncer_dir, primary_port, bouncer_port, pool);
    let (lsn_primary_port, stop_a) = start_lsngate(&cluster, false, "eventual", pool, threads);
    let (lsn_split_port, stop_b) = start_lsngate(&cluster, true, "eventual", pool, threads);
    let (lsn_causal_port, stop_c) = start_lsngate(&cluster, true, "session", pool, threads);
    let targets: [(&'static str, u16); 5] = [
        ("direct (primary)", primary_port),
        ("pgbouncer (transaction)", bouncer_port),
        ("lsngate (primary only)", lsn_primary_port),
        ("lsngate (primary + replica)", lsn_split_port),
        ("lsngate (replica, causal)", lsn_causal_port),
    ];
    let (c, t) = (clients.to_string(), seconds.to_string());
    let script_arg = format!("-f{}", script.display());
    let workloads: [(&'static str, Vec<&str>); 2] = [
        (
            "select-only (-S)",
            vec!["-n", "-S", "-M", "simple", "-c", &c, "-j", "2", "-T", &t],
        ),
        (
            "mixed 3 reads + 1 update",
            vec![
                "-n",
                &script_arg,
                "-M",
                "simple",
                "-c",
                &c,
                "-j",
                "2",
                "-T",
                &t,
            ],
        ),
    ];
    let mut results = Vec::new();
    for (workload, wargs) in &workloads {
        for (target, port) in targets {
            let (tps, latency_ms) = pgbench(&cluster, port, wargs);
            eprintln!("{workload:28} {target:30} tps {tps:10.1}  latency {latency_ms:7.3} ms");
            results.push(Measured {
                target,
                workload,
                tps,
                latency_ms,
            });
        }
    }
    let _ = bouncer.kill();
    let _ = bouncer.wait();
    let _ = stop_a.send(true);
    let _ = stop_b.send(true);
    let _ = stop_c.send(true);
    print_table(&results, clients, seconds, threads);
}

fn print_table(results: &[Measured], clients: usize, seconds: u64, threads: usize) {
    println!(
        "\npgbench, {clients} clients, {seconds} s per run, scale 10, -M simple, loopback, 2 cores shared by everything, lsngate on {threads} runtime thread(s)\n"
    );
    println!("| workload | target | TPS | avg latency | TPS vs pgbouncer | latency vs pgbouncer |");
    println!("|---|---|---:|---:|---:|---:|");
    let mut json = Vec::new();
    for m in results {
        let bouncer = results
            .iter()
            .find(|b| b.workload == m.workload && b.target.starts_with("pgbouncer"))
            .expect("pgbouncer row");
        println!(
            "| {} | {} | {:.0} | {:.3} ms | {:.2}x | {:.2}x |",
            m.workload,
            m.target,
            m.tps,
            m.latency_ms,
            m.tps / bouncer.tps,
            m.latency_ms / bouncer.latency_ms
        );
        json.push(format!(
            "{{\"workload\":\"{}\",\"target\":\"{}\",\"tps\":{:.1},\"latency_ms\":{:.3}}}",
            m.workload, m.target, m.tps, m.latency_ms
        ));
    }
    println!("\n[{}]", json.join(","));
}
