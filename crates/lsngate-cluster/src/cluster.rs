//! A primary and N streaming replicas on 127.0.0.1, in one directory, stopped by a Drop guard.
//!
//! Layout of the cluster directory: `primary/`, `replica1/`, ... data directories (each also
//! holds the node's Unix socket), `<node>.log` server logs, and `cluster.json`, the manifest that
//! lets `lsngate cluster status|down` find a cluster started by an earlier command.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::Error;
use crate::node::{Node, NodeSpec, Tools};
use crate::pgbin::PgBin;
use crate::process::{self, RunAs};
use crate::tls::ClusterTls;

/// `synchronous_commit` with one synchronous standby (`replica1`), or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncMode {
    /// Asynchronous replication, no synchronous standby.
    #[default]
    Off,
    /// Commit waits for replica1 to flush the WAL (not to replay it).
    On,
    /// Commit waits for replica1 to replay the WAL.
    RemoteApply,
}

impl std::str::FromStr for SyncMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(SyncMode::Off),
            "on" => Ok(SyncMode::On),
            "remote_apply" | "remote-apply" => Ok(SyncMode::RemoteApply),
            other => Err(format!(
                "unknown sync mode {other:?}; expected off, on or remote_apply"
            )),
        }
    }
}

/// How to build a cluster. `ClusterConfig::default()` is one primary and one replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Number of streaming replicas.
    pub replicas: usize,
    /// `recovery_min_apply_delay` on every replica.
    pub apply_delay: Option<Duration>,
    /// Synchronous standby (`replica1`) and `synchronous_commit`, or asynchronous replication.
    pub sync: SyncMode,
    /// `hot_standby_feedback` on every replica.
    pub hot_standby_feedback: bool,
    /// PostgreSQL bin dir; `None` finds one (see [`PgBin::find`]).
    pub pg_bin: Option<PathBuf>,
    /// Where to put the cluster; `None` is a fresh temp dir. Must not exist or be empty.
    pub dir: Option<PathBuf>,
    /// Extra `postgresql.conf` lines for every node, `(name, value)`.
    pub settings: Vec<(String, String)>,
    /// `pg_hba.conf` rules put above initdb's `trust` rules on every node, so they win.
    pub hba: Vec<String>,
    /// TLS on every node with a certificate from a test CA, and TCP without TLS refused.
    pub tls_only: bool,
    /// TLS on every node as with `tls_only`, and TCP without TLS still accepted.
    pub tls_offered: bool,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            replicas: 1,
            apply_delay: None,
            sync: SyncMode::Off,
            hot_standby_feedback: false,
            pg_bin: None,
            dir: None,
            settings: Vec::new(),
            hba: Vec::new(),
            tls_only: false,
            tls_offered: false,
        }
    }
}

impl ClusterConfig {
    /// `n` streaming replicas.
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n;
        self
    }
    /// Replicas apply WAL `delay` after the commit (`recovery_min_apply_delay`).
    pub fn apply_delay(mut self, delay: Duration) -> Self {
        self.apply_delay = Some(delay);
        self
    }
    /// Synchronous replication mode.
    pub fn sync(mut self, sync: SyncMode) -> Self {
        self.sync = sync;
        self
    }
    /// Turns `hot_standby_feedback` on or off.
    pub fn hot_standby_feedback(mut self, on: bool) -> Self {
        self.hot_standby_feedback = on;
        self
    }
    /// Runs PostgreSQL from this bin dir instead of the detected one.
    pub fn pg_bin(mut self, dir: impl Into<PathBuf>) -> Self {
        self.pg_bin = Some(dir.into());
        self
    }
    /// Puts the cluster in `dir` (must not exist or be empty) instead of a temp dir.
    pub fn dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }
    /// Adds `name = 'value'` to every node's `postgresql.conf`.
    pub fn setting(mut self, name: &str, value: &str) -> Self {
        self.settings.push((name.to_string(), value.to_string()));
        self
    }
    /// Puts the rule `line` (e.g. `host all app 127.0.0.1/32 scram-sha-256`) at the top of every
    /// node's `pg_hba.conf`, above initdb's `trust` rules: the first matching rule wins, so the
    /// role, database or address it names must authenticate as it says. Rules keep their order.
    pub fn hba(mut self, line: &str) -> Self {
        self.hba.push(line.to_string());
        self
    }
    /// Every node serves TLS (`ssl = on`) with a certificate for `localhost` signed by a CA the
    /// test kit makes (see [`Cluster::tls`]), checks client certificates against that CA when a
    /// rule says `cert`, and refuses TCP connections without TLS (`hostnossl ... reject` for
    /// every database and replication, IPv4 and IPv6, above the [`ClusterConfig::hba`] rules).
    /// Unix-socket connections stay trusted.
    pub fn tls_only(mut self) -> Self {
        self.tls_only = true;
        self
    }
    /// Every node serves TLS as with [`ClusterConfig::tls_only`], and still accepts TCP without
    /// it: one client can use TLS and another not (the proxy's differential checker compares a
    /// plaintext direct connection with a proxy that reaches the server over TLS).
    pub fn tls(mut self) -> Self {
        self.tls_offered = true;
        self
    }
}

/// What `cluster.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    /// The PostgreSQL bin dir the cluster runs from.
    pub pg_bin: PathBuf,
    /// The primary first, then the replicas.
    pub nodes: Vec<NodeSpec>,
}

/// The manifest's file name inside the cluster directory.
pub const MANIFEST: &str = "cluster.json";

/// A running cluster. Dropping it stops every node and removes its directory, unless
/// [`Cluster::detach`] was called.
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    primary: Node,
    replicas: Vec<Node>,
    bin: PgBin,
    tls: Option<ClusterTls>,
    detached: bool,
}

impl Cluster {
    /// Builds and starts a cluster, and returns once every replica is streaming.
    pub fn start(config: &ClusterConfig) -> Result<Cluster, Error> {
        let bin = PgBin::find(config.pg_bin.as_deref())?;
        let run_as = RunAs::detect()?;
        let dir = crate::dir::make_dir(config.dir.as_deref(), &run_as, &bin)?;
        let tools = Arc::new(Tools {
            bin: bin.clone(),
            run_as,
        });
        let spec = |name: &str| -> Result<NodeSpec, Error> {
            Ok(NodeSpec {
                name: name.to_string(),
                port: free_port()?,
                data_dir: dir.join(name),
            })
        };
        let primary = Node::new(spec("primary")?, tools.clone());
        // From here on the guard owns the directory, so a failure below cleans up after itself.
        let mut cluster = Cluster {
            dir: dir.clone(),
            primary,
            replicas: Vec::new(),
            bin: bin.clone(),
            tls: None,
            detached: false,
        };
        if config.tls_only || config.tls_offered {
            cluster.tls = Some(ClusterTls::create(&dir.join("tls"))?);
        }
        init_primary(&cluster.primary, &tools, config, cluster.tls.as_ref())?;
        cluster.primary.start()?;
        for i in 1..=config.replicas {
            let replica = Node::new(spec(&format!("replica{i}"))?, tools.clone());
            clone_replica(&cluster.primary, &replica, &tools, config)?;
            cluster.replicas.push(replica.clone());
            replica.start()?;
        }
        cluster.wait_streaming(Duration::from_secs(60))?;
        match config.sync {
            SyncMode::Off => {}
            SyncMode::On => {
                cluster
                    .primary
                    .set("synchronous_standby_names", "replica1")?;
                cluster.primary.set("synchronous_commit", "on")?;
            }
            SyncMode::RemoteApply => {
                cluster
                    .primary
                    .set("synchronous_standby_names", "replica1")?;
                cluster.primary.set("synchronous_commit", "remote_apply")?;
            }
        }
        cluster.write_manifest()?;
        Ok(cluster)
    }

    /// A cluster started earlier (by `lsngate cluster up`) in `dir`. The returned guard is
    /// detached: dropping it leaves the cluster running; call [`Cluster::destroy`] to stop it.
    pub fn open(dir: &Path) -> Result<Cluster, Error> {
        let path = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            Error::io(
                format!(
                    "read {} (is there a cluster there? start one with `lsngate cluster up --dir {}`)",
                    path.display(),
                    dir.display()
                ),
                e,
            )
        })?;
        let manifest: Manifest = serde_json::from_str(&text)
            .map_err(|e| Error::io(format!("parse {}", path.display()), e.into()))?;
        let bin = PgBin::at(&manifest.pg_bin)?;
        let tools = Arc::new(Tools {
            bin: bin.clone(),
            run_as: RunAs::detect()?,
        });
        let mut nodes = manifest
            .nodes
            .into_iter()
            .map(|spec| Node::new(spec, tools.clone()));
        let primary = nodes.next().ok_or_else(|| Error::Command {
            what: format!("open {}", path.display()),
            status: "empty manifest".into(),
            output: String::new(),
        })?;
        Ok(Cluster {
            dir: dir.to_path_buf(),
            primary,
            replicas: nodes.collect(),
            bin,
            tls: None,
            detached: true,
        })
    }

    /// The primary.
    pub fn primary(&self) -> &Node {
        &self.primary
    }

    /// Every replica, `replica1` first.
    pub fn replicas(&self) -> &[Node] {
        &self.replicas
    }

    /// Replica `i`, counting from 0 (`replica1` is `replica(0)`).
    pub fn replica(&self, i: usize) -> &Node {
        &self.replicas[i]
    }

    /// The primary followed by every replica.
    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        std::iter::once(&self.primary).chain(self.replicas.iter())
    }

    /// The cluster directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The PostgreSQL installation the cluster runs.
    pub fn pg_bin(&self) -> &PgBin {
        &self.bin
    }

    /// The CA and server certificate of a [`ClusterConfig::tls_only`] or [`ClusterConfig::tls`]
    /// cluster.
    pub fn tls(&self) -> Option<&ClusterTls> {
        self.tls.as_ref()
    }

    /// The primary's libpq URL.
    pub fn primary_url(&self) -> String {
        self.primary.url()
    }

    /// Every replica's libpq URL.
    pub fn replica_urls(&self) -> Vec<String> {
        self.replicas.iter().map(Node::url).collect()
    }

    /// Waits until `pg_stat_replication` on the primary shows every replica streaming.
    pub fn wait_streaming(&self, timeout: Duration) -> Result<(), Error> {
        let want = self.replicas.len().to_string();
        self.primary
            .wait_until("all replicas streaming", timeout, || {
                Ok(self
                    .primary
                    .sql("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")?
                    == want)
            })
    }

    /// Waits until every running replica has replayed the primary's current position.
    pub fn wait_caught_up(&self, timeout: Duration) -> Result<(), Error> {
        let position = self.primary.sql("SELECT pg_current_wal_insert_lsn()")?;
        for replica in &self.replicas {
            replica.wait_replayed(&position, timeout)?;
        }
        Ok(())
    }

    /// A failover that leaves an orphan *ahead of the fork point*, the case that makes old
    /// positions dangerous: replica `promoted` stops receiving, the primary runs `tail_sql` (and
    /// writes a megabyte of WAL) which only replica `orphan` replays, the primary is killed and
    /// `promoted` is promoted. The orphan stays on the old timeline, its WAL receiver failing,
    /// with writes the new primary never had. Returns the orphan's replay position (text `X/Y`).
    /// Positions the new primary reaches first are numerically below it.
    pub fn fail_over_leaving_orphan(
        &self,
        promoted: usize,
        orphan: usize,
        tail_sql: &str,
    ) -> Result<String, Error> {
        let (promoted, orphan) = (&self.replicas[promoted], &self.replicas[orphan]);
        promoted.stop()?;
        self.primary.sql(&format!(
            "CREATE TABLE lsngate_orphan_tail AS SELECT g, repeat('x', 100) AS pad \
             FROM generate_series(1, 8000) g; {tail_sql}"
        ))?;
        let tail_end = self.primary.position()?;
        orphan.wait_replayed(&tail_end, Duration::from_secs(30))?;
        self.primary.kill()?;
        promoted.start()?;
        promoted.promote()?;
        orphan.sql("SELECT pg_last_wal_replay_lsn()")
    }

    /// Keeps the cluster running after this guard is dropped (for `lsngate cluster up`).
    pub fn detach(mut self) -> PathBuf {
        self.detached = true;
        self.dir.clone()
    }

    /// Stops every node now and removes the directory.
    pub fn destroy(mut self) -> Result<(), Error> {
        self.detached = false;
        self.teardown()
    }

    /// Keeps the cluster for the rest of the process and stops it at exit. For a cluster shared
    /// by all tests of one test binary (statics are never dropped, so an exit hook stops it).
    pub fn leak_until_exit(self) -> &'static Cluster {
        register_exit_teardown(self.dir.clone(), self.nodes().cloned().collect());
        let mut cluster = self;
        cluster.detached = true;
        Box::leak(Box::new(cluster))
    }

    fn teardown(&mut self) -> Result<(), Error> {
        let mut first_error = None;
        for node in self.replicas.iter().chain(std::iter::once(&self.primary)) {
            if let Err(e) = node.stop_immediate() {
                process::signal_server(node.data_dir(), libc::SIGKILL);
                first_error.get_or_insert(e);
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        first_error.map_or(Ok(()), Err)
    }

    fn write_manifest(&self) -> Result<(), Error> {
        let manifest = Manifest {
            pg_bin: self.bin.dir.clone(),
            nodes: self.nodes().map(|n| n.spec().clone()).collect(),
        };
        let text = serde_json::to_string_pretty(&manifest).expect("manifest serialises");
        std::fs::write(self.dir.join(MANIFEST), text)
            .map_err(|e| Error::io("write cluster manifest", e))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.detached
            && let Err(e) = self.teardown()
        {
            eprintln!(
                "lsngate-cluster: stopping cluster {}: {e}",
                self.dir.display()
            );
        }
    }
}

fn init_primary(
    primary: &Node,
    tools: &Tools,
    config: &ClusterConfig,
    tls: Option<&ClusterTls>,
) -> Result<(), Error> {
    let mut initdb = tools.run_as.command(&tools.bin.tool("initdb"));
    initdb
        .args([
            "--no-locale",
            "-E",
            "UTF8",
            "-U",
            "postgres",
            "-A",
            "trust",
            "-D",
        ])
        .arg(primary.data_dir())
        .arg("--no-sync");
    process::run(initdb, "initdb")?;
    let mut conf = vec![
        ("listen_addresses".to_string(), "127.0.0.1".to_string()),
        ("fsync".into(), "off".into()),
        ("full_page_writes".into(), "off".into()),
        ("wal_level".into(), "replica".into()),
        ("max_wal_senders".into(), "16".into()),
        ("max_replication_slots".into(), "16".into()),
        ("wal_keep_size".into(), "512MB".into()),
        ("max_connections".into(), "300".into()),
        ("shared_buffers".into(), "128MB".into()),
        ("hot_standby".into(), "on".into()),
        (
            "hot_standby_feedback".into(),
            on_off(config.hot_standby_feedback).into(),
        ),
        ("wal_receiver_status_interval".into(), "1s".into()),
        ("log_min_messages".into(), "warning".into()),
        ("log_line_prefix".into(), "%m [%p] %a ".into()),
    ];
    let mut hba = Vec::new();
    if let Some(tls) = tls {
        conf.extend(tls.settings());
        if config.tls_only {
            hba.extend(ClusterTls::hba());
        }
    }
    conf.extend(config.settings.iter().cloned());
    hba.extend(config.hba.iter().cloned());
    append_conf(primary, &conf)?;
    // Replicas get the primary's pg_hba.conf with their base backup.
    prepend_hba(primary, &hba)?;
    node_conf(primary)
}

/// Settings that differ per node: port and socket dir.
fn node_conf(node: &Node) -> Result<(), Error> {
    append_conf(
        node,
        &[
            ("port".into(), node.port().to_string()),
            (
                "unix_socket_directories".into(),
                node.data_dir().display().to_string(),
            ),
        ],
    )
}

fn clone_replica(
    primary: &Node,
    replica: &Node,
    tools: &Tools,
    config: &ClusterConfig,
) -> Result<(), Error> {
    let mut basebackup = tools.run_as.command(&tools.bin.tool("pg_basebackup"));
    basebackup
        .args(["-R", "-X", "stream", "-c", "fast", "--no-sync", "-d"])
        .arg(format!(
            "{} application_name={}",
            primary.conninfo(),
            replica.name()
        ))
        .arg("-D")
        .arg(replica.data_dir());
    process::run(basebackup, &format!("pg_basebackup for {}", replica.name()))?;
    node_conf(replica)?;
    // The application_name makes the replica addressable in synchronous_standby_names.
    let mut settings = vec![(
        "primary_conninfo".to_string(),
        format!("{} application_name={}", primary.conninfo(), replica.name()),
    )];
    if let Some(delay) = config.apply_delay {
        settings.push((
            "recovery_min_apply_delay".into(),
            format!("{}ms", delay.as_millis()),
        ));
    }
    append_conf(replica, &settings)
}

fn append_conf(node: &Node, settings: &[(String, String)]) -> Result<(), Error> {
    use std::io::Write;
    let path = node.data_dir().join("postgresql.conf");
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
    for (name, value) in settings {
        writeln!(file, "{name} = '{}'", value.replace('\'', "''"))
            .map_err(|e| Error::io("write postgresql.conf", e))?;
    }
    Ok(())
}

/// Puts `rules` above the rules already in the node's `pg_hba.conf`.
fn prepend_hba(node: &Node, rules: &[String]) -> Result<(), Error> {
    if rules.is_empty() {
        return Ok(());
    }
    let path = node.data_dir().join("pg_hba.conf");
    let existing = std::fs::read_to_string(&path)
        .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    let mut text = String::from("# lsngate-cluster: ClusterConfig::hba rules\n");
    for rule in rules {
        text.push_str(rule);
        text.push('\n');
    }
    text.push_str(&existing);
    std::fs::write(&path, text).map_err(|e| Error::io(format!("write {}", path.display()), e))
}

fn on_off(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}

/// A port free on 127.0.0.1 right now, never handed out twice by this process — also not to
/// the kit's own servers: a test that picks a port for a process of its own through this cannot
/// collide with a server another test in the same binary starts meanwhile (a port bound and
/// released with `bind(":0")` is free for a moment, and once was taken so).
pub fn free_port() -> Result<u16, Error> {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..50 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| Error::io("find a free port", e))?
            .port();
        if !given.contains(&port) {
            given.push(port);
            return Ok(port);
        }
    }
    Err(Error::io(
        "find a free port",
        std::io::Error::other("none left"),
    ))
}

type ExitTeardown = (PathBuf, Vec<Node>);

static AT_EXIT: Mutex<Vec<ExitTeardown>> = Mutex::new(Vec::new());

fn register_exit_teardown(dir: PathBuf, nodes: Vec<Node>) {
    let mut registered = AT_EXIT.lock().unwrap_or_else(|e| e.into_inner());
    if registered.is_empty() {
        // SAFETY: registering a plain extern "C" function with no captured state.
        unsafe { libc::atexit(teardown_at_exit) };
    }
    registered.push((dir, nodes));
}

extern "C" fn teardown_at_exit() {
    let registered = std::mem::take(&mut *AT_EXIT.lock().unwrap_or_else(|e| e.into_inner()));
    for (dir, nodes) in registered {
        for node in nodes.iter().rev() {
            if node.stop_immediate().is_err() {
                process::signal_server(node.data_dir(), libc::SIGKILL);
            }
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
