//! Benchmark (not a test): `pgbench -S` and a mixed read/write script against the primary
//! directly, through Debian's PgBouncer (transaction mode), through Debian's pgpool-II — primary
//! only as a plain pooler (its connection cache on, a child process per client), and primary +
//! replica with load balancing and `disable_load_balance_on_write = transaction` — and through
//! lsngate — primary only as a plain pooler (consistency eventual, the like-for-like comparison),
//! primary + replica with plain read/write splitting, and primary + replica with causal reads
//! (consistency session, the default) — same clients, one run side by side. Prints a table with
//! TPS and latency ratios, then JSON.
//!
//! `cargo run --release -p lsngate-proxy --example bench_pgbouncer -- [seconds] [clients] [proxy threads] [rounds] [all|poolers] [simple|extended]`
//!
//! The last argument is pgbench's `-M`: `simple` (the default) sends each statement as a simple
//! Query; `extended` as Parse/Bind/Describe/Execute/Sync of the unnamed statement, as most drivers
//! do (JDBC, psycopg 3, asyncpg, pgx, node-postgres with parameters).
//!
//! Each round runs every target once, interleaved (every other round in reverse order, each run
//! after the replica caught up and both servers checkpointed); `poolers` runs only PgBouncer,
//! pgpool-II and lsngate as plain poolers and the byte relay, and prints each median ratio to
//! PgBouncer with a 95 % interval. The byte relay, in both modes, is the floor under any pooler: one thread
//! relaying bytes between each client and a server connection of its own, nothing parsed or
//! pooled. With
//! `LSNGATE_PGO_BIN=target/pgo/lsngate` (built by scripts/build-pgo.sh) the plain pooler also runs
//! as that profile-guided build, `lsngate PGO build (primary only)`, next to this program's own
//! build of the same code. The table shows medians over the rounds, ratios as medians of
//! per-round ratios to PgBouncer, and the CPU time the pooler itself used per transaction (from
//! /proc), which is far steadier than TPS on a machine where the pooler, pgbench and PostgreSQL
//! share two cores. pgpool-II is a parent and the children it forks, so its CPU is that of the
//! whole process tree (and of children that exited, which their parent's `cutime` holds).
//! Needs pgbouncer and pgpool-II (scripts/install/proxy.sh installs both; without either the
//! program says so and exits with status 2) and runs them as lsngate-cluster's server user;
//! pgpool is started by the test kit (`lsngate_cluster::Pgpool`), as `lsngate bench`'s pgpool
//! rows are.
//!
//! Every pooler runs as its own process in its own session, as a service would: PgBouncer,
//! pgpool-II, and each lsngate as this program re-run with `serve-proxy CONFIG` (the same code as `lsngate proxy
//! --config CONFIG`). The session matters: with the kernel's autogroup scheduling
//! (`/proc/sys/kernel/sched_autogroup_enabled`), a pooler started in pgbench's session shares one
//! CPU share with pgbench, and is preempted and kept waiting far more than one in its own.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use lsngate_cluster::{
    Cluster, ClusterConfig, Pgbouncer, PgbouncerConfig, Pgpool, PgpoolConfig, process_tree,
};

const MIXED: &str = "\\set aid random(1, 100000 * :scale)
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid + 1;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid + 2;
UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;
";

/// The comparison that has a target (issue #5): PgBouncer against lsngate as a plain pooler.
const PGBOUNCER: &str = "pgbouncer (transaction)";
const PLAIN_LSNGATE: &str = "lsngate (primary only)";
/// The same plain pooler run by the binary `LSNGATE_PGO_BIN` names (scripts/build-pgo.sh builds
/// it), when that is set.
const PGO_LSNGATE: &str = "lsngate PGO build (primary only)";
/// pgpool-II as a plain pooler in front of the primary: the like-for-like row beside PgBouncer.
const PGPOOL_PRIMARY: &str = "pgpool-II (primary only)";
/// pgpool-II balancing reads to the replica, its read-your-writes setting for transactions on:
/// the row to read beside lsngate's split and causal ones.
const PGPOOL_BALANCED: &str =
    "pgpool-II (load balancing, disable_load_balance_on_write = transaction)";
/// The floor under every pooler: bytes relayed, nothing parsed or pooled (see [`serve_relay`]).
const RELAY: &str = "byte relay (the floor)";

struct Measured {
    round: usize,
    target: &'static str,
    workload: &'static str,
    tps: f64,
    latency_ms: f64,
    /// CPU the pooler itself spent per transaction (user + system), in microseconds.
    cpu_us: Option<f64>,
}

/// User + system CPU ticks of one `/proc/.../stat` file: the process's own, and those of its
/// children that exited and were waited for (a pgpool child that ends takes its CPU time with
/// it, into its parent's `cutime` and `cstime`).
fn stat_ticks(path: &Path) -> u64 {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    // Fields after the parenthesised command name (the first is field 3); utime, stime, cutime
    // and cstime are fields 14 to 17.
    let rest = text.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12) + field(13) + field(14)
}

/// CPU seconds used so far by a pooler: its process, all threads together, and every process
/// descended from it (pgpool-II's children; none for the others); 0 for no pooler.
fn pooler_cpu(pooler: Option<u32>) -> f64 {
    let Some(pid) = pooler else {
        return 0.0;
    };
    let ticks: u64 = process_tree(pid as i32)
        .into_iter()
        .map(|pid| stat_ticks(Path::new(&format!("/proc/{pid}/stat"))))
        .sum();
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
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

/// Files and directories the benchmark writes, removed when it ends (or panics).
struct Scratch(Vec<PathBuf>);

impl Drop for Scratch {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_dir_all(path).or_else(|_| std::fs::remove_file(path));
        }
    }
}

/// A pooler process, killed when dropped: in a session of its own it would outlive a benchmark
/// that panics.
struct Pooler(Child);

impl Drop for Pooler {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a pooler as its own process in its own session (see the top of this file), its
/// standard error to `stderr`, and waits until it accepts connections on `port`.
fn start_pooler(mut command: Command, port: u16, what: &str, stderr: Stdio) -> Pooler {
    lsngate_cluster::in_own_session(&mut command);
    let child = command
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"));
    let pooler = Pooler(child);
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return pooler;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what} did not start");
}

fn free_port() -> u16 {
    lsngate_cluster::free_port().unwrap()
}

/// An lsngate proxy, with a config file written to `dir`: this program re-run as `serve-proxy
/// CONFIG`, or `binary proxy --config CONFIG` when an lsngate binary is given.
fn start_lsngate(
    cluster: &Cluster,
    dir: &Path,
    with_replica: bool,
    consistency: &str,
    pool: usize,
    threads: usize,
    binary: Option<&Path>,
) -> (u16, Pooler) {
    let port = free_port();
    let replicas = if with_replica {
        cluster.replica_urls()
    } else {
        Vec::new()
    };
    let config = format!(
        "listen = \"127.0.0.1:{port}\"\nprimary = {:?}\nreplicas = {replicas:?}\n\
         consistency = {consistency:?}\npool_size = {pool}\nthreads = {threads}\n",
        cluster.primary_url()
    );
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(format!("lsngate-{port}.toml"));
    std::fs::write(&path, config).unwrap();
    let (program, args): (PathBuf, &[&str]) = match binary {
        Some(binary) => (binary.into(), &["proxy", "--config"]),
        None => (std::env::current_exe().unwrap(), &["serve-proxy"]),
    };
    let mut command = Command::new(program);
    command.args(args).arg(&path);
    let what = format!("lsngate ({})", path.display());
    let pooler = start_pooler(command, port, &what, Stdio::null());
    (port, pooler)
}

/// pgpool-II before the cluster's primary, and its replica too when `balanced`, for `clients`
/// pgbench clients, in a session of its own like the other poolers. Exits the program with
/// pgpool's error (and its log's last lines) when it cannot start.
fn start_pgpool(cluster: &Cluster, balanced: bool, clients: usize) -> Pgpool {
    let replicas = if balanced {
        cluster.replica_urls()
    } else {
        Vec::new()
    };
    let mut config = PgpoolConfig::new(&cluster.primary_url(), &replicas)
        .map(|config| config.clients(clients).own_session())
        .unwrap_or_else(|e| panic!("pgpool-II configuration: {e}"));
    if balanced {
        config = config.setting("disable_load_balance_on_write", "'transaction'");
    }
    Pgpool::start(&config).unwrap_or_else(|e| panic!("{e}"))
}

/// The byte relay in front of the primary: this program re-run as `serve-relay PORT
/// BACKEND_PORT`, what it reports on its standard error passed on to the benchmark's.
fn start_relay(primary_port: u16) -> (u16, Pooler) {
    let port = free_port();
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.args(["serve-relay", &port.to_string(), &primary_port.to_string()]);
    (
        port,
        start_pooler(command, port, "byte relay", Stdio::inherit()),
    )
}

/// `serve-proxy CONFIG`: what `lsngate proxy --config CONFIG` runs.
fn serve_proxy(config: &str) {
    let args = lsngate_proxy::ProxyArgs {
        config: Some(config.into()),
        ..Default::default()
    };
    lsngate_proxy::main(args).expect("lsngate proxy");
}

/// `serve-relay PORT BACKEND_PORT`: the least any pooler can do, as a reference point. One
/// thread, level-triggered epoll; every client gets a server connection of its own, and whatever
/// one side sends is read once and written to the other — no parsing, no pooling, no routing.
/// That is the four socket calls per statement (two reads, two writes) plus the shared epoll
/// waits that every pooler pays in the kernel, and next to nothing in user space. A write waits
/// when the peer's buffer is full, which pgbench's small replies never do.
fn serve_relay(port: &str, backend_port: &str) {
    use std::collections::HashMap;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    let listener = TcpListener::bind(("127.0.0.1", port.parse::<u16>().unwrap())).unwrap();
    let backend: u16 = backend_port.parse().unwrap();
    // SAFETY: a plain call; the result is checked.
    let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    assert!(
        epoll >= 0,
        "epoll_create1: {}",
        std::io::Error::last_os_error()
    );
    // Events carry a token, never reused, not the descriptor: a descriptor closed while handling
    // one event of a batch may be reused by an accept before a later, stale event of the same
    // batch for the old socket is handled, and reading the new socket then would block.
    let watch = |fd: i32, token: u64| {
        let mut event = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        // SAFETY: `event` is valid for the call; `fd` is an open socket.
        let rc = unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, fd, &mut event) };
        assert_eq!(rc, 0, "epoll_ctl: {}", std::io::Error::last_os_error());
    };
    const LISTENER: u64 = 0;
    watch(listener.as_raw_fd(), LISTENER);
    // Each socket by its token, with its peer's token.
    let mut sockets: HashMap<u64, (TcpStream, u64)> = HashMap::new();
    let mut next_token = 1;
    let mut buf = vec![0u8; 64 * 1024];
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
    loop {
        // SAFETY: `events` has room for 64 entries.
        let n = unsafe { libc::epoll_wait(epoll, events.as_mut_ptr(), 64, -1) };
        for event in &events[..n.max(0) as usize] {
            let token = event.u64;
            if token == LISTENER {
                let Ok((client, _)) = listener.accept() else {
                    continue;
                };
                let server = match TcpStream::connect(("127.0.0.1", backend)) {
                    Ok(server) => server,
                    Err(e) => {
                        eprintln!("byte relay: connect to port {backend}: {e}");
                        continue;
                    }
                };
                let (c, s) = (next_token, next_token + 1);
                next_token += 2;
                for (stream, token) in [(&client, c), (&server, s)] {
                    let _ = stream.set_nodelay(true);
                    watch(stream.as_raw_fd(), token);
                }
                sockets.insert(c, (client, s));
                sockets.insert(s, (server, c));
                continue;
            }
            let Some((stream, peer)) = sockets.get_mut(&token) else {
                continue;
            };
            let peer = *peer;
            let got = stream.read(&mut buf).unwrap_or(0);
            let sent = got > 0
                && sockets
                    .get_mut(&peer)
                    .is_some_and(|(other, _)| other.write_all(&buf[..got]).is_ok());
            if !sent {
                // Closing both sockets also takes them out of the epoll set.
                sockets.remove(&token);
                sockets.remove(&peer);
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("serve-proxy") => return serve_proxy(&args[2]),
        Some("serve-relay") => return serve_relay(&args[2], &args[3]),
        _ => {}
    }
    let seconds: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(10);
    let clients: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(8);
    let threads: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1);
    let rounds: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(3);
    // `poolers`: only PgBouncer, pgpool-II and lsngate as plain poolers, for many rounds of the
    // comparison that has a target.
    let only_poolers = match args.get(5).map(String::as_str) {
        None | Some("all") => false,
        Some("poolers") => true,
        Some(other) => panic!("targets {other:?}: use `all` (the default) or `poolers`"),
    };
    let protocol = match args.get(6).map(String::as_str) {
        None | Some("simple") => "simple",
        Some("extended") => "extended",
        Some(other) => panic!("protocol {other:?}: use `simple` (the default) or `extended`"),
    };
    let pgo_bin = std::env::var_os("LSNGATE_PGO_BIN").map(PathBuf::from);
    if let Some(bin) = &pgo_bin {
        assert!(
            bin.is_file(),
            "LSNGATE_PGO_BIN={}: no such file; build it with scripts/build-pgo.sh",
            bin.display()
        );
    }
    // pgpool-II's rows are part of the comparison: without it the table would silently lack them.
    if let Err(e) = Pgpool::check_installed().and_then(|()| Pgbouncer::check_installed()) {
        eprintln!("bench_pgbouncer: {e}");
        std::process::exit(2);
    }
    let pool = clients.min(16);
    let cluster = Cluster::start(&ClusterConfig::default().replicas(1)).expect("start cluster");
    cluster.wait_streaming(Duration::from_secs(30)).unwrap();
    let primary_port = cluster.primary().port();
    pgbench_output(&cluster, primary_port, &["-i", "-s", "10", "-q"]);
    cluster.wait_caught_up(Duration::from_secs(60)).unwrap();
    let script = std::env::temp_dir().join(format!("lsngate-mixed-{}.sql", std::process::id()));
    let dir = std::env::temp_dir().join(format!("lsngate-bench-poolers-{}", std::process::id()));
    let _scratch = Scratch(vec![script.clone(), dir.clone()]);
    std::fs::write(&script, MIXED).unwrap();
    let bouncer = Pgbouncer::start(
        &PgbouncerConfig::default()
            .database("postgres", &cluster.primary_url())
            .expect("the cluster's primary URL")
            .pool_size(pool)
            .own_session(),
    )
    .expect("start PgBouncer");
    let bouncer_port = bouncer.port();
    let (lsn_primary_port, lsn_primary) =
        start_lsngate(&cluster, &dir, false, "eventual", pool, threads, None);
    let lsn_pgo = pgo_bin
        .as_deref()
        .map(|bin| start_lsngate(&cluster, &dir, false, "eventual", pool, threads, Some(bin)));
    let (lsn_split_port, lsn_split) =
        start_lsngate(&cluster, &dir, true, "eventual", pool, threads, None);
    let (lsn_causal_port, lsn_causal) =
        start_lsngate(&cluster, &dir, true, "session", pool, threads, None);
    let pgpool_primary = start_pgpool(&cluster, false, clients);
    // Not started for `poolers`, which leaves it out.
    let pgpool_balanced = (!only_poolers).then(|| start_pgpool(&cluster, true, clients));
    let (relay_port, relay) = start_relay(primary_port);
    let pgo_target = lsn_pgo
        .as_ref()
        .map(|(port, pooler)| (PGO_LSNGATE, *port, Some(pooler.0.id())));
    let all_targets: Vec<(&'static str, u16, Option<u32>)> = [
        ("direct (primary)", primary_port, None),
        (PGBOUNCER, bouncer_port, Some(bouncer.pid())),
        (
            PGPOOL_PRIMARY,
            pgpool_primary.port(),
            Some(pgpool_primary.pid()),
        ),
        (PLAIN_LSNGATE, lsn_primary_port, Some(lsn_primary.0.id())),
    ]
    .into_iter()
    .chain(pgo_target)
    .chain([
        (
            "lsngate (primary + replica)",
            lsn_split_port,
            Some(lsn_split.0.id()),
        ),
        (
            "lsngate (replica, causal)",
            lsn_causal_port,
            Some(lsn_causal.0.id()),
        ),
    ])
    .chain(
        pgpool_balanced
            .as_ref()
            .map(|pgpool| (PGPOOL_BALANCED, pgpool.port(), Some(pgpool.pid()))),
    )
    .chain([(RELAY, relay_port, Some(relay.0.id()))])
    .collect();
    // The targets whose ratios to PgBouncer get an interval: the plain pooler in each build,
    // pgpool-II's, and the floor that bounds what any pooler could gain.
    let against_pgbouncer: Vec<&str> = [PGPOOL_PRIMARY, PLAIN_LSNGATE]
        .into_iter()
        .chain(lsn_pgo.as_ref().map(|_| PGO_LSNGATE))
        .chain([RELAY])
        .collect();
    let targets: Vec<_> = all_targets
        .into_iter()
        .filter(|(target, ..)| {
            !only_poolers || *target == PGBOUNCER || against_pgbouncer.contains(target)
        })
        .collect();
    let (c, t) = (clients.to_string(), seconds.to_string());
    let script_arg = format!("-f{}", script.display());
    let workloads: [(&'static str, Vec<&str>); 2] = [
        (
            "select-only (-S)",
            vec!["-n", "-S", "-M", protocol, "-c", &c, "-j", "2", "-T", &t],
        ),
        (
            "mixed 3 reads + 1 update",
            vec![
                "-n",
                &script_arg,
                "-M",
                protocol,
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
            // Every other round runs the targets in reverse, so no target always follows the
            // same one (and inherits its replay, checkpoint or vacuum work).
            let mut order = targets.clone();
            if round % 2 == 0 {
                order.reverse();
            }
            for (target, port, pooler) in order {
                quiesce(&cluster);
                let cpu_before = pooler_cpu(pooler);
                let (tps, latency_ms) = pgbench(&cluster, port, wargs);
                let cpu = pooler_cpu(pooler) - cpu_before;
                let cpu_us = pooler.map(|_| cpu * 1e6 / (tps * seconds as f64));
                eprintln!(
                    "round {round} {workload:28} {target:40} tps {tps:10.1}  latency {latency_ms:7.3} ms  pooler CPU {:6.1} us/txn",
                    cpu_us.unwrap_or(0.0)
                );
                runs.push(Measured {
                    round,
                    target,
                    workload,
                    tps,
                    latency_ms,
                    cpu_us,
                });
            }
        }
    }
    for ((workload, _), target) in workloads
        .iter()
        .flat_map(|w| against_pgbouncer.iter().map(move |p| (w, p)))
    {
        let tps = paired_ratios(&runs, workload, target, |m| Some(m.tps));
        let latency = paired_ratios(&runs, workload, target, |m| Some(m.latency_ms));
        let per_round: Vec<String> = tps.iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "per round, {target} / pgbouncer TPS, {workload}: {}",
            per_round.join(", ")
        );
        for (measure, ratios) in [("TPS", tps), ("latency", latency)] {
            let (low, high) = median_interval(&ratios);
            println!(
                "  {measure} ratio: median {:.3}, 95 % interval of the median {low:.3}–{high:.3} ({} rounds)",
                median(ratios.clone()),
                ratios.len()
            );
        }
    }
    let results = medians(&runs);
    drop((bouncer, lsn_primary, lsn_pgo, lsn_split, lsn_causal, relay));
    drop((pgpool_primary, pgpool_balanced));
    print_table(&runs, &results, clients, seconds, threads, rounds, protocol);
}

/// Lets the replica replay everything and checkpoints both servers, so each run starts from the
/// same quiet state instead of paying for the previous run's work.
fn quiesce(cluster: &Cluster) {
    cluster.wait_caught_up(Duration::from_secs(120)).unwrap();
    cluster.primary().sql("CHECKPOINT").unwrap();
    cluster.wait_caught_up(Duration::from_secs(120)).unwrap();
    cluster.replica(0).sql("CHECKPOINT").unwrap();
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// A distribution-free interval holding the median of what `values` sample with at least 95 %
/// confidence (order statistics of the sign test); the whole range for fewer than 6 values.
fn median_interval(values: &[f64]) -> (f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    // The largest k with P(Binomial(n, 1/2) < k) <= 2.5 %.
    let choose = |n: usize, k: usize| (0..k).fold(1.0, |c, i| c * (n - i) as f64 / (i + 1) as f64);
    let mut below = 0.0;
    let mut k = 0;
    while k < n / 2 {
        below += choose(n, k) / 2f64.powi(n as i32);
        if below > 0.025 {
            break;
        }
        k += 1;
    }
    let k = k.max(1);
    (sorted[k - 1], sorted[n - k])
}

/// Per round, `target`'s measure over PgBouncer's in the same round and workload (runs next to
/// each other in time, so slow drift of the machine cancels out).
fn paired_ratios(
    runs: &[Measured],
    workload: &str,
    target: &str,
    measure: impl Fn(&Measured) -> Option<f64>,
) -> Vec<f64> {
    let find = |round: usize, target: &str| {
        runs.iter()
            .find(|m| m.round == round && m.workload == workload && m.target == target)
            .and_then(&measure)
    };
    let rounds = runs.iter().map(|m| m.round).max().unwrap_or(0);
    (1..=rounds)
        .filter_map(|round| Some(find(round, target)? / find(round, PGBOUNCER)?))
        .collect()
}

/// Per workload and target, the median of each measure over the rounds.
fn medians(runs: &[Measured]) -> Vec<Measured> {
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
            round: 0,
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

fn print_table(
    runs: &[Measured],
    results: &[Measured],
    clients: usize,
    seconds: u64,
    threads: usize,
    rounds: usize,
    protocol: &str,
) {
    println!(
        "\npgbench, {clients} clients, {seconds} s per run, medians of {rounds} interleaved rounds (every other one in reverse order, the replica caught up and both servers checkpointed before each run), scale 10, -M {protocol}, loopback, 2 cores shared by everything, each pooler a process in its own session, lsngate on {threads} runtime thread(s); ratios are medians of the per-round ratios to PgBouncer's run of the same round\n"
    );
    println!(
        "| workload | target | TPS | avg latency | pooler CPU per txn | TPS vs pgbouncer | latency vs pgbouncer | CPU vs pgbouncer |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    let mut json = Vec::new();
    for m in results {
        // Empty for a measure one side lacks (the direct target uses no pooler CPU).
        let ratio = |measure: fn(&Measured) -> Option<f64>| {
            let ratios = paired_ratios(runs, m.workload, m.target, measure);
            (!ratios.is_empty()).then(|| median(ratios))
        };
        let cpu = m.cpu_us.map_or("–".to_string(), |c| format!("{c:.1} µs"));
        let cpu_ratio = ratio(|r| r.cpu_us).map_or("–".into(), |r| format!("{r:.2}x"));
        println!(
            "| {} | {} | {:.0} | {:.3} ms | {cpu} | {:.2}x | {:.2}x | {cpu_ratio} |",
            m.workload,
            m.target,
            m.tps,
            m.latency_ms,
            ratio(|r| Some(r.tps)).unwrap_or(f64::NAN),
            ratio(|r| Some(r.latency_ms)).unwrap_or(f64::NAN),
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
