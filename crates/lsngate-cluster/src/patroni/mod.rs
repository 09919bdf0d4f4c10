//! A Patroni cluster on this machine: one etcd and N Patroni members, each managing one
//! PostgreSQL, every program on free loopback ports, every file in one directory, stopped by a
//! Drop guard. Debian's `patroni` (3.0) and `etcd-server` (3.4), installed by
//! `scripts/install/patroni.sh`. As root, etcd, Patroni and PostgreSQL run as the `lsngate` user
//! (initdb refuses root), like the plain test kit's servers.
//!
//! Layout: `etcd/` (etcd's data), `etcd.log`, `member1/` ... (`data/` is PGDATA, the Unix
//! socket, `patroni.yml`, `patroni.log`), and `patroni.json`, the manifest that lets
//! `lsngate cluster down` find and stop a cluster an earlier command started.
//!
//! Faults are Patroni's own: [`PatroniCluster::switchover`] runs `patronictl switchover`,
//! [`PatroniCluster::kill_leader`] is `kill -9` of the leader's Patroni and PostgreSQL (a host
//! that died: the leader key expires after [`TTL_S`] seconds and a replica is promoted).

mod rest;
mod yaml;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use rest::ClusterMember;
pub use yaml::{MemberSpec, RestTls, TTL_S};

use crate::Error;
use crate::node::{Node, NodeSpec, Tools};
use crate::pgbin::PgBin;
use crate::process::{self, RunAs};

/// The manifest's file name inside a Patroni cluster's directory.
pub const PATRONI_MANIFEST: &str = "patroni.json";

const PATRONI: &str = "/usr/bin/patroni";
const PATRONICTL: &str = "/usr/bin/patronictl";
const ETCD: &str = "/usr/bin/etcd";

/// How to build a Patroni cluster.
#[derive(Debug, Clone, Default)]
pub struct PatroniConfig {
    /// Members: one becomes the leader, the others replicas.
    pub members: usize,
    /// PostgreSQL bin dir; `None` finds one like the plain test kit ([`PgBin::find`]).
    pub pg_bin: Option<PathBuf>,
    /// Where to put the cluster; `None` is a fresh temp dir.
    pub dir: Option<PathBuf>,
    /// Patroni's `synchronous_mode`: one synchronous standby, failover only to it.
    pub synchronous_mode: bool,
    /// HTTPS on every member's REST API, with a certificate for `localhost` from a CA the kit
    /// makes ([`PatroniCluster::rest_ca`]); `api_urls` are then `https://localhost:<port>`.
    pub rest_tls: bool,
}

/// What `patroni.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Manifest {
    pg_bin: PathBuf,
    etcd_port: u16,
    etcd_pid: i32,
    synchronous_mode: bool,
    members: Vec<(MemberSpec, i32)>,
}

#[derive(Debug)]
struct Member {
    spec: MemberSpec,
    pid: i32,
    /// The child when this process started it (reaped on stop, so a dead one reads as dead).
    child: Option<Child>,
}

/// A running Patroni cluster; dropping it stops everything and removes its directory, unless
/// [`PatroniCluster::detach`] was called.
#[derive(Debug)]
pub struct PatroniCluster {
    dir: PathBuf,
    tools: Arc<Tools>,
    etcd_port: u16,
    etcd: (i32, Option<Child>),
    members: Mutex<Vec<Member>>,
    synchronous_mode: bool,
    rest_tls: Option<RestTls>,
    detached: bool,
}

impl PatroniCluster {
    /// Starts etcd and `config.members` members, and returns once there is a leader and every
    /// other member runs as its replica (at most 120 s).
    pub fn start(config: &PatroniConfig) -> Result<PatroniCluster, Error> {
        let bin = PgBin::find(config.pg_bin.as_deref())?;
        let run_as = RunAs::detect()?;
        for program in [PATRONI, PATRONICTL, ETCD] {
            if !Path::new(program).exists() {
                return Err(Error::io(
                    format!("find {program}"),
                    std::io::Error::other("not installed: run scripts/install/patroni.sh"),
                ));
            }
        }
        let dir = crate::dir::make_dir(config.dir.as_deref(), &run_as, &bin)?;
        let tools = Arc::new(Tools { bin, run_as });
        let etcd_port = crate::cluster::free_port()?;
        let mut cluster = PatroniCluster {
            dir,
            tools,
            etcd_port,
            etcd: (0, None),
            members: Mutex::new(Vec::new()),
            synchronous_mode: config.synchronous_mode,
            rest_tls: None,
            detached: false,
        };
        if config.rest_tls {
            let ca = crate::TestCa::create(&cluster.dir.join("rest-tls"), "patroni-ca")?;
            let issued = ca.issue("patroni-rest", "localhost", &["localhost"])?;
            cluster.rest_tls = Some(RestTls {
                ca: ca.cert.clone(),
                cert: issued.cert,
                key: issued.key,
            });
        }
        cluster.start_etcd()?;
        // The first member bootstraps alone, so it is the leader; the others clone it.
        cluster.add_member()?;
        cluster.wait_healthy(1, Duration::from_secs(60))?;
        for _ in 1..config.members.max(1) {
            cluster.add_member()?;
        }
        cluster.wait_healthy(config.members.max(1), Duration::from_secs(120))?;
        cluster.write_manifest()?;
        Ok(cluster)
    }

    /// A cluster started earlier (by `lsngate cluster up --patroni`) in `dir`, detached:
    /// dropping it leaves it running; [`PatroniCluster::destroy`] stops it.
    pub fn open(dir: &Path) -> Result<PatroniCluster, Error> {
        let path = dir.join(PATRONI_MANIFEST);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
        let manifest: Manifest = serde_json::from_str(&text)
            .map_err(|e| Error::io(format!("parse {}", path.display()), e.into()))?;
        let tools = Arc::new(Tools {
            bin: PgBin::at(&manifest.pg_bin)?,
            run_as: RunAs::detect()?,
        });
        let members: Vec<Member> = manifest
            .members
            .into_iter()
            .map(|(spec, pid)| Member {
                spec,
                pid,
                child: None,
            })
            .collect();
        let rest_tls = members
            .iter()
            .find_map(|m: &Member| m.spec.rest_tls.clone());
        Ok(PatroniCluster {
            dir: dir.to_path_buf(),
            tools,
            etcd_port: manifest.etcd_port,
            etcd: (manifest.etcd_pid, None),
            members: Mutex::new(members),
            synchronous_mode: manifest.synchronous_mode,
            rest_tls,
            detached: true,
        })
    }

    /// The cluster directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The PostgreSQL installation the members run.
    pub fn pg_bin(&self) -> &PgBin {
        &self.tools.bin
    }

    /// Every member started so far (also stopped ones), `member1` first.
    pub fn members(&self) -> Vec<MemberSpec> {
        self.lock().iter().map(|m| m.spec.clone()).collect()
    }

    /// The PostgreSQL server of member `name`, for SQL and position helpers.
    pub fn node(&self, name: &str) -> Node {
        let spec = self
            .members()
            .into_iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("no member {name}"));
        Node::new(
            NodeSpec {
                name: spec.name.clone(),
                port: spec.pg_port,
                data_dir: spec.dir.join("data"),
            },
            Arc::clone(&self.tools),
        )
    }

    /// The CA that signed the REST API's certificate, with `rest_tls`: for the proxy's
    /// `--patroni-ca-file`.
    pub fn rest_ca(&self) -> Option<&Path> {
        self.rest_tls.as_ref().map(|tls| tls.ca.as_path())
    }

    /// Every member's REST API URL (`http://127.0.0.1:<port>`, or `https://localhost:<port>`
    /// with `rest_tls`), for the proxy's `--patroni-url`.
    pub fn api_urls(&self) -> Vec<String> {
        self.members().iter().map(MemberSpec::api_url).collect()
    }

    /// The `patronictl` command line for this cluster (any member's YAML names the DCS).
    pub fn patronictl(&self) -> String {
        let first = self.members().into_iter().next().expect("a member");
        format!("{PATRONICTL} -c {}", first.yaml_path().display())
    }

    /// `/cluster` as the first member whose API answers lists it.
    pub fn cluster_members(&self) -> Result<Vec<ClusterMember>, Error> {
        let mut last = None;
        for member in self.members() {
            let ca = member.rest_tls.as_ref().map(|tls| tls.ca.as_path());
            match rest::cluster_members(member.api_port, ca) {
                Ok(members) => return Ok(members),
                Err(e) => last = Some(e),
            }
        }
        Err(Error::io(
            "GET /cluster on every Patroni member",
            last.unwrap_or_else(|| std::io::Error::other("no members")),
        ))
    }

    /// The leader's name, if there is one now.
    pub fn leader(&self) -> Result<Option<String>, Error> {
        Ok(self
            .cluster_members()?
            .into_iter()
            .find(|m| m.role == "leader" && m.state == "running")
            .map(|m| m.name))
    }

    /// The leader's libpq URL (superuser `postgres`, database `postgres`).
    pub fn primary_url(&self) -> Result<String, Error> {
        let leader = self.leader()?.ok_or_else(|| no_leader(self))?;
        Ok(self.node(&leader).url())
    }

    /// Every other running member's libpq URL.
    pub fn replica_urls(&self) -> Result<Vec<String>, Error> {
        Ok(self
            .cluster_members()?
            .into_iter()
            .filter(|m| m.role != "leader")
            .map(|m| self.node(&m.name).url())
            .collect())
    }

    /// Waits until `/cluster` lists a running leader and `members - 1` running replicas, each of
    /// them streaming from it (in `pg_stat_replication` of the leader), one of them the
    /// synchronous standby in `synchronous_mode`.
    pub fn wait_healthy(&self, members: usize, timeout: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        let mut last;
        loop {
            match self.healthy_now(members) {
                Ok(true) => return Ok(()),
                Ok(false) => last = format!("{:?}", self.cluster_members().ok()),
                Err(e) => last = e.to_string(),
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: format!("a Patroni leader and {} replica(s)", members - 1),
                    waited: timeout,
                    last_error: Some(format!("{last}{}", self.log_tails())),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The last lines of every member's Patroni log, for an error that must say why.
    fn log_tails(&self) -> String {
        let mut text = String::new();
        for member in self.members() {
            let log = std::fs::read_to_string(member.dir.join("patroni.log")).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(6)..].join("\n  ");
            text.push_str(&format!("\n{} patroni.log:\n  {tail}", member.name));
        }
        text
    }

    fn healthy_now(&self, members: usize) -> Result<bool, Error> {
        let listed = self.cluster_members()?;
        let Some(leader) = listed
            .iter()
            .find(|m| m.role == "leader" && m.state == "running")
        else {
            return Ok(false);
        };
        let replicas = listed
            .iter()
            .filter(|m| m.role != "leader" && m.state == "running")
            .count();
        // Not the replicas' `timeline`: Patroni reads it from their last restartpoint, which
        // lags a timeline switch by up to checkpoint_timeout. Streaming from the leader (below)
        // is what proves a replica follows the new timeline.
        if listed.len() != members || replicas != members - 1 {
            return Ok(false);
        }
        // In synchronous_mode Patroni promotes only the synchronous standby: until it named one,
        // a killed leader is never replaced.
        if self.synchronous_mode && members > 1 && !listed.iter().any(|m| m.role == "sync_standby")
        {
            return Ok(false);
        }
        let streaming = self
            .node(&leader.name)
            .sql("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")?;
        Ok(streaming == (members - 1).to_string())
    }

    /// `patronictl switchover` to `candidate` (any replica when None); returns the new leader
    /// once it runs as one (at most 60 s).
    pub fn switchover(&self, candidate: Option<&str>) -> Result<String, Error> {
        let old = self.leader()?.ok_or_else(|| no_leader(self))?;
        let mut command = Command::new(PATRONICTL);
        let first = self.members().into_iter().next().expect("a member");
        command
            .arg("-c")
            .arg(first.yaml_path())
            .args(["switchover", "--leader", &old, "--force"]);
        if let Some(candidate) = candidate {
            command.args(["--candidate", candidate]);
        }
        process::run(command, "patronictl switchover")?;
        self.wait_new_leader(&old, Duration::from_secs(60))
    }

    /// `kill -9` of the leader's Patroni and every process of its PostgreSQL; returns its name.
    /// Patroni elects a new leader once the old one's key expires ([`TTL_S`]).
    pub fn kill_leader(&self) -> Result<String, Error> {
        let leader = self.leader()?.ok_or_else(|| no_leader(self))?;
        self.kill_member(&leader)?;
        Ok(leader)
    }

    /// `kill -9` of member `name`'s Patroni and PostgreSQL.
    pub fn kill_member(&self, name: &str) -> Result<(), Error> {
        let node = self.node(name);
        let mut members = self.lock();
        let member = members
            .iter_mut()
            .find(|m| m.spec.name == name)
            .expect("member");
        // Patroni first, so it cannot restart the server it sees die.
        kill(member.pid, libc::SIGKILL);
        if let Some(child) = &mut member.child {
            let _ = child.wait();
        }
        drop(members);
        node.kill()
    }

    /// Waits until a member other than `old` runs as the leader; returns its name.
    pub fn wait_new_leader(&self, old: &str, timeout: Duration) -> Result<String, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(leader)) = self.leader()
                && leader != old
                && !self.node(&leader).is_in_recovery().unwrap_or(true)
            {
                return Ok(leader);
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: format!("a Patroni leader other than {old}"),
                    waited: timeout,
                    last_error: self.cluster_members().err().map(|e| e.to_string()),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts a new member; Patroni clones it from the leader (`pg_basebackup`). Returns its
    /// name; [`PatroniCluster::wait_healthy`] waits until it streams.
    pub fn add_member(&self) -> Result<String, Error> {
        self.add_member_tagged(&[])
    }

    /// [`PatroniCluster::add_member`] with Patroni tags, e.g. `("noloadbalance", true)` or
    /// `("nofailover", true)`.
    pub fn add_member_tagged(&self, tags: &[(&str, bool)]) -> Result<String, Error> {
        let number = self.lock().len() + 1;
        let name = format!("member{number}");
        let spec = MemberSpec {
            name: name.clone(),
            pg_port: crate::cluster::free_port()?,
            api_port: crate::cluster::free_port()?,
            dir: self.dir.join(&name),
            rest_tls: self.rest_tls.clone(),
        };
        std::fs::create_dir_all(&spec.dir).map_err(|e| Error::io("create member dir", e))?;
        self.tools.run_as.own(&spec.dir)?;
        let mut text = yaml::member_yaml(
            &spec,
            self.etcd_port,
            &self.tools.bin.dir,
            self.synchronous_mode,
        );
        if !tags.is_empty() {
            text.push_str("tags:\n");
            for (tag, on) in tags {
                text.push_str(&format!("  {tag}: {on}\n"));
            }
        }
        std::fs::write(spec.yaml_path(), text).map_err(|e| Error::io("write patroni.yml", e))?;
        self.tools.run_as.own(&spec.yaml_path())?;
        let mut command = self.tools.run_as.command(Path::new(PATRONI));
        command.arg(spec.yaml_path());
        let child = spawn_logged(command, &spec.dir.join("patroni.out"))?;
        self.lock().push(Member {
            spec,
            pid: child.id() as i32,
            child: Some(child),
        });
        self.write_manifest()?;
        Ok(name)
    }

    /// Starts member `name`'s Patroni again after [`PatroniCluster::kill_member`] or
    /// [`PatroniCluster::stop_member`]: it rejoins (rewinding if it was the old leader).
    pub fn restart_member(&self, name: &str) -> Result<(), Error> {
        let mut members = self.lock();
        let member = members
            .iter_mut()
            .find(|m| m.spec.name == name)
            .expect("member");
        let mut command = self.tools.run_as.command(Path::new(PATRONI));
        command.arg(member.spec.yaml_path());
        let child = spawn_logged(command, &member.spec.dir.join("patroni.out"))?;
        member.pid = child.id() as i32;
        member.child = Some(child);
        drop(members);
        self.write_manifest()
    }

    /// Starts the Patroni of every member whose Patroni is not running (killed by
    /// [`PatroniCluster::kill_member`] here or by an earlier command); returns their names.
    pub fn restart_stopped(&self) -> Result<Vec<String>, Error> {
        let stopped: Vec<String> = self
            .lock()
            .iter_mut()
            .filter_map(|m| (!alive(m)).then(|| m.spec.name.clone()))
            .collect();
        for name in &stopped {
            self.restart_member(name)?;
        }
        Ok(stopped)
    }

    /// Stops member `name` the way an operator removes one: SIGTERM to its Patroni, which stops
    /// PostgreSQL and deletes its member key, so `/cluster` no longer lists it (at most 30 s).
    pub fn stop_member(&self, name: &str) -> Result<(), Error> {
        let mut members = self.lock();
        let member = members
            .iter_mut()
            .find(|m| m.spec.name == name)
            .expect("member");
        stop_process(member, Duration::from_secs(30));
        drop(members);
        let node = self.node(name);
        if process::postmaster_pid(node.data_dir()).is_some() {
            node.kill()?;
        }
        Ok(())
    }

    /// Keeps the cluster running after this guard is dropped (for `lsngate cluster up`).
    pub fn detach(mut self) -> PathBuf {
        self.detached = true;
        self.dir.clone()
    }

    /// Stops everything now and removes the directory.
    pub fn destroy(mut self) -> Result<(), Error> {
        self.detached = false;
        self.teardown();
        Ok(())
    }

    fn teardown(&mut self) {
        let data_dirs: Vec<PathBuf> = {
            let mut members = self.lock();
            for member in members.iter_mut() {
                stop_process(member, Duration::from_secs(20));
            }
            members.iter().map(|m| m.spec.dir.join("data")).collect()
        };
        for data in data_dirs {
            process::signal_server(&data, libc::SIGKILL);
        }
        kill(self.etcd.0, libc::SIGKILL);
        if let Some(child) = &mut self.etcd.1 {
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    fn start_etcd(&mut self) -> Result<(), Error> {
        let peer_port = crate::cluster::free_port()?;
        let client = format!("http://127.0.0.1:{}", self.etcd_port);
        let peer = format!("http://127.0.0.1:{peer_port}");
        let mut command = self.tools.run_as.command(Path::new(ETCD));
        command
            .args(["--name", "etcd", "--data-dir"])
            .arg(self.dir.join("etcd"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("etcd={peer}")]);
        let child = spawn_logged(command, &self.dir.join("etcd.log"))?;
        self.etcd = (child.id() as i32, Some(child));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok((200, _)) = rest::get(self.etcd_port, "/health", Duration::from_secs(1), None)
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: format!("etcd on 127.0.0.1:{} (see etcd.log)", self.etcd_port),
                    waited: Duration::from_secs(20),
                    last_error: None,
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn write_manifest(&self) -> Result<(), Error> {
        let manifest = Manifest {
            pg_bin: self.tools.bin.dir.clone(),
            etcd_port: self.etcd_port,
            etcd_pid: self.etcd.0,
            synchronous_mode: self.synchronous_mode,
            members: self
                .lock()
                .iter()
                .map(|m| (m.spec.clone(), m.pid))
                .collect(),
        };
        let text = serde_json::to_string_pretty(&manifest).expect("manifest serialises");
        std::fs::write(self.dir.join(PATRONI_MANIFEST), text)
            .map_err(|e| Error::io("write patroni manifest", e))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Member>> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for PatroniCluster {
    fn drop(&mut self) {
        if !self.detached {
            self.teardown();
        }
    }
}

fn no_leader(cluster: &PatroniCluster) -> Error {
    Error::io(
        "find the Patroni leader",
        std::io::Error::other(format!(
            "no member runs as leader now: {:?}",
            cluster.cluster_members().ok()
        )),
    )
}

/// Starts `command` with its output appended to `log`, in its own process group (a Ctrl-C
/// meant for `lsngate cluster up` does not reach the servers it leaves running).
fn spawn_logged(mut command: Command, log: &Path) -> Result<Child, Error> {
    use std::os::unix::process::CommandExt;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| Error::io(format!("open {}", log.display()), e))?;
    let err = file
        .try_clone()
        .map_err(|e| Error::io("clone log handle", e))?;
    command
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .process_group(0);
    command
        .spawn()
        .map_err(|e| Error::io(format!("start {:?}", command.get_program()), e))
}

/// SIGTERM, then SIGKILL after `grace`: Patroni stops its PostgreSQL on SIGTERM.
fn stop_process(member: &mut Member, grace: Duration) {
    if !alive(member) {
        return;
    }
    kill(member.pid, libc::SIGTERM);
    let deadline = Instant::now() + grace;
    while alive(member) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if alive(member) {
        kill(member.pid, libc::SIGKILL);
    }
    if let Some(child) = &mut member.child {
        let _ = child.wait();
    }
}

fn alive(member: &mut Member) -> bool {
    match &mut member.child {
        Some(child) => matches!(child.try_wait(), Ok(None)),
        // SAFETY: signal 0 only checks that the process exists.
        None => member.pid > 0 && unsafe { libc::kill(member.pid, 0) } == 0,
    }
}

fn kill(pid: i32, signal: i32) {
    if pid > 0 {
        // SAFETY: plain kill(2) of a pid this kit started.
        unsafe { libc::kill(pid, signal) };
    }
}
