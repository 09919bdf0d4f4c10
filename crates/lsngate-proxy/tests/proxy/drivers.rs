//! Compatibility with the two most used drivers the Python/Node sessions do not cover: pgjdbc
//! (Java) and pgx v4 (Go), from Debian's packages (scripts/install/drivers.sh). Each runs a
//! realistic session (clients/PgjdbcSession.java, clients/pgx_session.go: the settings those
//! drivers are deployed with, COPY, cancels, LISTEN/NOTIFY, read-after-write) twice: straight
//! against the primary — the control, proving the program right — and through a proxy in its
//! default causal mode, where reads served by a replica must still see the connection's writes.
//! The programs are compiled here, into the target directory, once per test process.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::support::*;
use lsngate_cluster::{Cluster, shared_cluster};

const PGJDBC_JAR: &str = "/usr/share/java/postgresql.jar";
/// Debian's Go sources (golang-github-jackc-pgx-v4-dev and its dependencies), built in GOPATH
/// mode: no module download.
const DEBIAN_GOPATH: &str = "/usr/share/gocode";
/// A whole session, cancels included, takes seconds; this only stops a hung one.
const SESSION_LIMIT: Duration = Duration::from_secs(300);

fn clients_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients")
}

fn build_dir(what: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("drivers")
        .join(what);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn missing(tool: &str) -> String {
    format!("{tool} not found: run scripts/install/drivers.sh (installs the Debian packages)")
}

/// The directory holding the compiled PgjdbcSession class.
fn pgjdbc_classes() -> &'static Path {
    static CLASSES: OnceLock<PathBuf> = OnceLock::new();
    CLASSES.get_or_init(|| {
        assert!(Path::new(PGJDBC_JAR).exists(), "{}", missing(PGJDBC_JAR));
        assert!(which("javac").is_some(), "{}", missing("javac"));
        let dir = build_dir("pgjdbc");
        let mut javac = Command::new("javac");
        javac
            .args(["-d", dir.to_str().unwrap(), "-cp", PGJDBC_JAR])
            .arg(clients_dir().join("PgjdbcSession.java"));
        run_ok(&mut javac);
        dir
    })
}

/// The built pgx_session program.
fn pgx_program() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| build_pgx_program("pgx_session"))
}

/// Builds `clients/NAME.go` against Debian's pgx v4 (GOPATH mode, the compiled packages cached
/// for every program) into the target directory; returns the program.
pub fn build_pgx_program(name: &str) -> PathBuf {
    assert!(
        Path::new(DEBIAN_GOPATH)
            .join("src/github.com/jackc/pgx/v4")
            .exists(),
        "{}",
        missing("pgx v4 under /usr/share/gocode")
    );
    assert!(which("go").is_some(), "{}", missing("go"));
    let dir = build_dir("pgx");
    let program = dir.join(name);
    let mut go = Command::new("go");
    go.args([
        "build",
        "-o",
        program.to_str().unwrap(),
        &format!("{name}.go"),
    ])
    .current_dir(clients_dir())
    .env("GO111MODULE", "off")
    .env("GOPATH", DEBIAN_GOPATH)
    .env("GOCACHE", dir.join("cache"))
    .env("GOFLAGS", "");
    run_ok(&mut go);
    program
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
}

/// Runs a session program with `url` (the proxy or the primary), a table name and every node's
/// URL (asked directly whether a cancelled statement still runs); panics with its output when it
/// fails or runs past [`SESSION_LIMIT`]. Returns its stdout.
fn session(mut command: Command, cluster: &Cluster, url: &str, table: &str) -> String {
    command
        .arg(url)
        .arg(table)
        .arg(cluster.primary_url())
        .args(cluster.replica_urls())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            let _ = pipe.read_to_end(&mut text);
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > SESSION_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    match status {
        Some(status) if status.success() => stdout,
        Some(status) => {
            panic!("{command:?} failed ({status})\nstdout:\n{stdout}\nstderr:\n{stderr}")
        }
        None => panic!(
            "{command:?} still running after {SESSION_LIMIT:?}, killed\nstdout:\n{stdout}\nstderr:\n{stderr}"
        ),
    }
}

fn pgjdbc(cluster: &Cluster, url: &str, table: &str) -> String {
    let mut java = Command::new("java");
    java.arg("-cp")
        .arg(format!("{}:{PGJDBC_JAR}", pgjdbc_classes().display()))
        .arg("PgjdbcSession");
    session(java, cluster, url, table)
}

fn pgx(cluster: &Cluster, url: &str, table: &str) -> String {
    session(Command::new(pgx_program()), cluster, url, table)
}

/// (reads, served by a replica) from the program's closing `OK ... reads=N replica=R` line.
fn read_counts(stdout: &str, driver: &str) -> (u64, u64) {
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.starts_with(&format!("OK {driver}")), "{stdout}");
    let field = |name: &str| -> u64 {
        last.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name}= in {last:?}"))
    };
    (field("reads"), field("replica"))
}

fn rows(cluster: &Cluster, table: &str) -> String {
    cluster
        .primary()
        .sql(&format!("SELECT count(*) FROM {table}"))
        .unwrap()
}

/// Rows the pgjdbc session leaves: 40 read-after-write, 5 + 10 prepareThreshold 1 and 0, 137
/// rewritten batch, 20 plain batch, 500 fetch size, 200 COPY, 2 autosave=always, 1
/// autosave=conservative.
const PGJDBC_ROWS: &str = "915";
/// Rows the pgx session leaves: 40 read-after-write, 10 statement cache, 30 batches, 502 COPY,
/// 168 pool.
const PGX_ROWS: &str = "750";

#[test]
fn pgjdbc_session_direct_on_the_primary() {
    let cluster = shared_cluster();
    let t = unique("pgjdbc_direct");
    let stdout = pgjdbc(cluster, &cluster.primary_url(), &t);
    println!("{stdout}");
    let (reads, replica) = read_counts(&stdout, "pgjdbc");
    assert!(reads > 0, "{stdout}");
    assert_eq!(replica, 0, "the primary is not in recovery");
    assert_eq!(rows(cluster, &t), PGJDBC_ROWS);
}

#[test]
fn pgjdbc_session_through_the_proxy() {
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    let t = unique("pgjdbc_proxy");
    let stdout = pgjdbc(cluster, &proxy.url(), &t);
    println!("{stdout}");
    let (reads, replica) = read_counts(&stdout, "pgjdbc");
    assert!(
        replica > 0,
        "no read-after-write was served by a replica ({replica}/{reads}), so none tested causal reads"
    );
    assert_eq!(rows(cluster, &t), PGJDBC_ROWS);
}

#[test]
fn pgx_v4_session_direct_on_the_primary() {
    let cluster = shared_cluster();
    let t = unique("pgx_direct");
    let stdout = pgx(cluster, &cluster.primary_url(), &t);
    println!("{stdout}");
    let (reads, replica) = read_counts(&stdout, "pgx");
    assert!(reads > 0, "{stdout}");
    assert_eq!(replica, 0, "the primary is not in recovery");
    assert_eq!(rows(cluster, &t), PGX_ROWS);
}

#[test]
fn pgx_v4_session_through_the_proxy() {
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    let t = unique("pgx_proxy");
    let stdout = pgx(cluster, &proxy.url(), &t);
    println!("{stdout}");
    let (reads, replica) = read_counts(&stdout, "pgx");
    assert!(
        replica > 0,
        "no read-after-write was served by a replica ({replica}/{reads}), so none tested causal reads"
    );
    assert_eq!(rows(cluster, &t), PGX_ROWS);
}
