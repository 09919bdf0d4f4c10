//! Benchmark (not a test): `pgbench -S` and a mixed read/write script against the primary
//! directly, through Debian's PgBouncer (transaction mode) and through lsngate — primary only as
//! a plain pooler (consistency eventual, the like-for-like comparison), primary + replica with
//! plain read/write splitting, and primary + replica with causal reads (consistency session, the
//! default) — same clients, one run side by side. Prints a table with TPS and latency ratios,
//! then JSON.
//!
//! `cargo run --release -p lsngate-proxy --example bench_pgbouncer -- [seconds] [clients] [proxy threads] [rounds]`
//!
//! Each round runs every target once, interleaved; the table shows medians over the rounds and
//! the CPU time the pooler itself used per transaction (from /proc), which is far steadier than
//! TPS on a machine where the pooler, pgbench and PostgreSQL share two cores.
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
    /// CPU the pooler itself spent per transaction (user + system), in microseconds.
    cpu_us: Option<f64>,
}

unsafe extern "C" {
    fn sysconf(name: i32) -> i64;
}

/// User + system CPU ticks of one `/proc/.../stat` file.
fn stat_ticks(path: &Path) -> u64 {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = text.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}

/// CPU seconds used so far by a pooler: a process, or this process's threads with one name plus
/// the proxies' shared timer thread (`lsngate-timer`; what it does during a run — that proxy's
/// timers and the idle proxies' health checks — is charged to the proxy measured).
fn pooler_cpu(pooler: &Pooler) -> f64 {
    const SC_CLK_TCK: i32 = 2;
    let ticks = match pooler {
        Pooler::None => return 0.0,
        Pooler::Process(pid) => stat_ticks(Path::new(&format!("/proc/{pid}/stat"))),
        Pooler::Threads(name) => std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .filter(|task| {
                std::fs::read_to_string(task.path().join("comm"))
                    .is_ok_and(|comm| comm.trim() == *name || comm.trim() == "lsngate-timer")
            })
            .map(|task| stat_ticks(&task.path().join("stat")))
            .sum(),
    };
    ticks as f64 / unsafe { sysconf(SC_CLK_TCK) } as f64
}

/// Whose CPU a run is charged to.
#[derive(Clone, Copy)]
enum Pooler {
    None,
    Process(u32),
    Threads(&'static str),
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
    name: &'static str,
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
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            // As `lsngate proxy --threads N` runs it (1 = tokio's current-thread scheduler), with
            // the worker threads named so their CPU time can be read from /proc.
            let runtime = lsngate_proxy::runtime_builder(threads)
                .thread_name(name)
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                Proxy::new(config).serve(listener, stop_rx).await.unwrap();
            });
        })
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    (port, stop)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(10);
    let clients: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(8);
    let threads: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1);
    let rounds: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(3);
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
    let (lsn_primary_port, stop_a) =
        start_lsngate(&cluster, false, "eventual", pool, threads, "lsn-primary");
    let (lsn_split_port, stop_b) =
        start_lsngate(&cluster, true, "eventual", pool, threads, "lsn-split");
    let (lsn_causal_port, stop_c) =
        start_lsngate(&cluster, true, "session", pool, threads, "lsn-causal");
    let targets: [(&'static str, u16, Pooler); 5] = [
        ("direct (primary)", primary_port, Pooler::None),
        (
            "pgbouncer (transaction)",
            bouncer_port,
            Pooler::Process(bouncer.id()),
        ),
        (
            "lsngate (primary only)",
            lsn_primary_port,
            Pooler::Threads("lsn-primary"),
        ),
        (
            "lsngate (primary + replica)",
            lsn_split_port,
            Pooler::Threads("lsn-split"),
        ),
        (
            "lsngate (replica, causal)",
            lsn_causal_port,
            Pooler::Threads("lsn-causal"),
        ),
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
    let mut runs = Vec::new();
    for round in 1..=rounds {
        for (workload, wargs) in &workloads {
            for (target, port, pooler) in targets {
                let cpu_before = pooler_cpu(&pooler);
                let (tps, latency_ms) = pgbench(&cluster, port, wargs);
                let cpu = pooler_cpu(&pooler) - cpu_before;
                let cpu_us = match pooler {
                    Pooler::None => None,
                    _ => Some(cpu * 1e6 / (tps * seconds as f64)),
                };
                eprintln!(
                    "round {round} {workload:28} {target:30} tps {tps:10.1}  latency {latency_ms:7.3} ms  pooler CPU {:6.1} us/txn",
                    cpu_us.unwrap_or(0.0)
                );
                runs.push(Measured {
                    target,
                    workload,
                    tps,
                    latency_ms,
                    cpu_us,
                });
            }
        }
    }
    let results = medians(&runs);
    let _ = bouncer.kill();
    let _ = bouncer.wait();
    let _ = stop_a.send(true);
    let _ = stop_b.send(true);
    let _ = stop_c.send(true);
    print_table(&results, clients, seconds, threads, rounds);
}

/// Per workload and target, the median of each measure over the rounds.
fn medians(runs: &[Measured]) -> Vec<Measured> {
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let mut results: Vec<Measured> = Vec::new();
    for run in runs {
        if results
            .iter()
            .any(|m| m.workload == run.workload && m.target == run.target)
        {
            continue;
        }
        let same: Vec<&Measured> = runs
            .iter()
            .filter(|m| m.workload == run.workload && m.target == run.target)
            .collect();
        results.push(Measured {
            target: run.target,
            workload: run.workload,
            tps: median(same.iter().map(|m| m.tps).collect()),
            latency_ms: median(same.iter().map(|m| m.latency_ms).collect()),
            cpu_us: run
                .cpu_us
                .map(|_| median(same.iter().filter_map(|m| m.cpu_us).collect())),
        });
    }
    results
}

fn print_table(results: &[Measured], clients: usize, seconds: u64, threads: usize, rounds: usize) {
    println!(
        "\npgbench, {clients} clients, {seconds} s per run, medians of {rounds} interleaved rounds, scale 10, -M simple, loopback, 2 cores shared by everything, lsngate on {threads} runtime thread(s)\n"
    );
    println!(
        "| workload | target | TPS | avg latency | pooler CPU per txn | TPS vs pgbouncer | latency vs pgbouncer | CPU vs pgbouncer |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    let mut json = Vec::new();
    for m in results {
        let bouncer = results
            .iter()
            .find(|b| b.workload == m.workload && b.target.starts_with("pgbouncer"))
            .expect("pgbouncer row");
        let (cpu, cpu_ratio) = match (m.cpu_us, bouncer.cpu_us) {
            (Some(c), Some(b)) => (format!("{c:.1} µs"), format!("{:.2}x", c / b)),
            _ => ("–".to_string(), "–".to_string()),
        };
        println!(
            "| {} | {} | {:.0} | {:.3} ms | {cpu} | {:.2}x | {:.2}x | {cpu_ratio} |",
            m.workload,
            m.target,
            m.tps,
            m.latency_ms,
            m.tps / bouncer.tps,
            m.latency_ms / bouncer.latency_ms
        );
        json.push(format!(
            "{{\"workload\":\"{}\",\"target\":\"{}\",\"tps\":{:.1},\"latency_ms\":{:.3},\"pooler_cpu_us\":{}}}",
            m.workload,
            m.target,
            m.tps,
            m.latency_ms,
            m.cpu_us.map_or("null".to_string(), |c| format!("{c:.2}"))
        ));
    }
    println!("\n[{}]", json.join(","));
}
