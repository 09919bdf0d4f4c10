//! One PostgreSQL server of a test cluster, and everything a test does to it: SQL, replay
//! control, apply delay, stop / kill / freeze, promotion.
//!
//! SQL here goes through `psql` so these helpers work without an async runtime (including from
//! `Drop`); tests that want a real driver use [`Node::connect`].

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::Error;
use crate::pgbin::PgBin;
use crate::process::{self, RunAs};

/// How long [`Node::hand_over_to`] waits for the replica to stream from the primary (a
/// restarted replica's WAL receiver retries every `wal_retrieve_retry_interval`, 5 s).
pub const STREAMING_LIMIT: Duration = Duration::from_secs(15);

/// Everything node helpers need besides the node itself.
#[derive(Debug)]
pub(crate) struct Tools {
    pub bin: PgBin,
    pub run_as: RunAs,
}

/// A node as written to the cluster manifest.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeSpec {
    /// `primary`, `replica1`, `replica2`, ... (also its `application_name` when streaming).
    pub name: String,
    /// TCP port on 127.0.0.1.
    pub port: u16,
    /// Data directory (also holds the Unix socket).
    pub data_dir: PathBuf,
}

/// One server of a cluster.
#[derive(Debug, Clone)]
pub struct Node {
    spec: NodeSpec,
    tools: Arc<Tools>,
}

impl Node {
    pub(crate) fn new(spec: NodeSpec, tools: Arc<Tools>) -> Node {
        Node { spec, tools }
    }

    /// `primary`, `replica1`, ...
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.spec.port
    }

    /// Data directory.
    pub fn data_dir(&self) -> &Path {
        &self.spec.data_dir
    }

    /// Name, port and data directory, as in the manifest.
    pub fn spec(&self) -> &NodeSpec {
        &self.spec
    }

    /// libpq URL for this node, superuser `postgres`, database `postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.spec.port)
    }

    /// The same, as a key/value conninfo string.
    pub fn conninfo(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.spec.port
        )
    }

    /// Runs `sql` with psql and returns its unaligned, tuples-only output, trimmed.
    pub fn sql(&self, sql: &str) -> Result<String, Error> {
        let mut command = Command::new(self.tools.bin.tool("psql"));
        command
            .args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-d"])
            .arg(self.conninfo())
            .args(["-c", sql])
            .env("PGCONNECT_TIMEOUT", "5");
        let output = command.output().map_err(|e| Error::io("run psql", e))?;
        if !output.status.success() {
            return Err(Error::Sql {
                node: self.spec.name.clone(),
                sql: sql.to_string(),
                message: String::from_utf8_lossy(&output.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    }

    /// A tokio-postgres client; the connection task is spawned on the current runtime.
    pub async fn connect(&self) -> Result<tokio_postgres::Client, Error> {
        let (client, connection) = tokio_postgres::connect(&self.conninfo(), tokio_postgres::NoTls)
            .await
            .map_err(|e| Error::Connect {
                node: self.spec.name.clone(),
                message: e.to_string(),
            })?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }

    /// `pg_is_in_recovery()`.
    pub fn is_in_recovery(&self) -> Result<bool, Error> {
        Ok(self.sql("SELECT pg_is_in_recovery()")? == "t")
    }

    /// The replica's replayed position as text (`X/Y`), or the primary's insert position.
    pub fn position(&self) -> Result<String, Error> {
        self.sql(
            "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() \
             ELSE pg_current_wal_insert_lsn() END",
        )
    }

    /// `SELECT version()`'s short form, `server_version`.
    pub fn server_version(&self) -> Result<String, Error> {
        self.sql("SHOW server_version")
    }

    /// Stops applying WAL (it keeps being received), and waits until recovery says paused.
    pub fn pause_replay(&self) -> Result<(), Error> {
        self.sql("SELECT pg_wal_replay_pause()")?;
        self.wait_until("replay paused", Duration::from_secs(10), || {
            Ok(self.sql("SELECT pg_get_wal_replay_pause_state()")? == "paused")
        })
    }

    /// Resumes replay after [`Node::pause_replay`].
    pub fn resume_replay(&self) -> Result<(), Error> {
        self.sql("SELECT pg_wal_replay_resume()").map(drop)
    }

    /// Changes `recovery_min_apply_delay` on a running replica (a reload, no restart).
    pub fn set_apply_delay(&self, delay: Duration) -> Result<(), Error> {
        self.sql(&format!(
            "ALTER SYSTEM SET recovery_min_apply_delay = '{}ms'",
            delay.as_millis()
        ))?;
        self.sql("SELECT pg_reload_conf()").map(drop)
    }

    /// Sets a setting with ALTER SYSTEM and reloads. `value` is a trusted literal from the test.
    pub fn set(&self, setting: &str, value: &str) -> Result<(), Error> {
        self.sql(&format!("ALTER SYSTEM SET {setting} = '{value}'"))?;
        self.sql("SELECT pg_reload_conf()").map(drop)
    }

    /// Starts the server (after [`Node::stop`] or [`Node::kill`]).
    pub fn start(&self) -> Result<(), Error> {
        let mut command = self.tools.run_as.command(&self.tools.bin.tool("pg_ctl"));
        command
            .args(["start", "-w", "-t", "60", "-D"])
            .arg(&self.spec.data_dir)
            .arg("-l")
            .arg(self.log_file());
        process::run(command, &format!("start {}", self.spec.name)).map(drop)
    }

    /// Clean shutdown (`pg_ctl stop -m fast`).
    pub fn stop(&self) -> Result<(), Error> {
        self.pg_ctl_stop("fast")
    }

    /// Immediate shutdown; what the Drop guard uses.
    pub fn stop_immediate(&self) -> Result<(), Error> {
        self.thaw();
        self.pg_ctl_stop("immediate")
    }

    fn pg_ctl_stop(&self, mode: &str) -> Result<(), Error> {
        if process::postmaster_pid(&self.spec.data_dir).is_none() {
            return Ok(());
        }
        let mut command = self.tools.run_as.command(&self.tools.bin.tool("pg_ctl"));
        command
            .args(["stop", "-w", "-t", "30", "-m", mode, "-D"])
            .arg(&self.spec.data_dir);
        process::run(command, &format!("stop {}", self.spec.name)).map(drop)
    }

    /// `kill -9` of the postmaster and every child: a crash, no shutdown work at all.
    pub fn kill(&self) -> Result<(), Error> {
        self.thaw();
        process::signal_server(&self.spec.data_dir, libc::SIGKILL);
        self.wait_until("killed", Duration::from_secs(10), || {
            Ok(process::postmaster_pid(&self.spec.data_dir).is_none())
        })?;
        // A crashed postmaster leaves its pid file; pg_ctl start copes with a stale one.
        Ok(())
    }

    /// SIGSTOP every process of the server: it holds its connections and answers nothing, like a
    /// host that hangs.
    pub fn freeze(&self) {
        process::signal_server(&self.spec.data_dir, libc::SIGSTOP);
    }

    /// SIGCONT after [`Node::freeze`]; harmless otherwise.
    pub fn thaw(&self) {
        process::signal_server(&self.spec.data_dir, libc::SIGCONT);
    }

    /// Promotes a replica to a primary and waits until it accepts writes.
    pub fn promote(&self) -> Result<(), Error> {
        let mut command = self.tools.run_as.command(&self.tools.bin.tool("pg_ctl"));
        command
            .args(["promote", "-w", "-t", "60", "-D"])
            .arg(&self.spec.data_dir);
        process::run(command, &format!("promote {}", self.spec.name))?;
        self.wait_until("promoted", Duration::from_secs(30), || {
            Ok(!self.is_in_recovery()?)
        })
    }

    /// Follows `primary` as a streaming replica. A running replica is repointed
    /// (`primary_conninfo` reloaded; it follows the new timeline). A stopped server is started as
    /// one: what a switchover does with the old primary, which can follow the promoted replica
    /// without a rewind when it was shut down cleanly and the replica had received all of its
    /// WAL (see [`Node::hand_over_to`]).
    pub fn follow(&self, primary: &Node) -> Result<(), Error> {
        let conninfo = format!("{} application_name={}", primary.conninfo(), self.spec.name);
        if process::postmaster_pid(&self.spec.data_dir).is_some() {
            return self.set("primary_conninfo", &conninfo);
        }
        let signal = self.spec.data_dir.join("standby.signal");
        std::fs::write(&signal, b"")
            .map_err(|e| Error::io(format!("create {}", signal.display()), e))?;
        self.tools.run_as.own(&signal)?;
        // After everything else in the configuration, so it wins.
        let auto = self.spec.data_dir.join("postgresql.auto.conf");
        let mut conf = std::fs::read_to_string(&auto)
            .map_err(|e| Error::io(format!("read {}", auto.display()), e))?;
        conf.push_str(&format!(
            "primary_conninfo = '{}'\n",
            conninfo.replace('\'', "''")
        ));
        std::fs::write(&auto, conf)
            .map_err(|e| Error::io(format!("write {}", auto.display()), e))?;
        self.start()
    }

    /// A clean failover from this primary to `replica`: a wait until `replica` streams from
    /// here, a fast shutdown here (which sends every WAL record, the shutdown checkpoint
    /// included, to the replicas streaming from it), a wait until `replica` has received it all,
    /// and `replica`'s promotion. No acknowledged write is lost, and this server can then
    /// [`Node::follow`] the new primary as it is. A replica that does not stream within
    /// [`STREAMING_LIMIT`] is refused before anything stops: this server stays the primary.
    pub fn hand_over_to(&self, replica: &Node) -> Result<(), Error> {
        // A fast shutdown sends its WAL only to the walsenders it has then: a replica still
        // reconnecting (just restarted, or repointed) would never get the tail.
        let streaming = format!(
            "SELECT count(*) FROM pg_stat_replication WHERE application_name = '{}' AND state = 'streaming'",
            replica.name().replace('\'', "")
        );
        self.wait_until(
            &format!("{} streaming from it before the hand-over", replica.name()),
            STREAMING_LIMIT,
            || Ok(self.sql(&streaming)? == "1"),
        )?;
        self.stop()?;
        let last = self.checkpoint_location()?;
        replica.wait_until(
            &format!("received the old primary's shutdown checkpoint {last}"),
            Duration::from_secs(30),
            || {
                Ok(replica.sql(&format!(
                    "SELECT pg_last_wal_receive_lsn() > '{last}'::pg_lsn"
                ))? == "t")
            },
        )?;
        replica.promote()
    }

    /// `Latest checkpoint location` from `pg_controldata` (text `X/Y`): a stopped server's last
    /// WAL record after a clean shutdown.
    fn checkpoint_location(&self) -> Result<String, Error> {
        let mut command = self
            .tools
            .run_as
            .command(&self.tools.bin.tool("pg_controldata"));
        command.arg("-D").arg(&self.spec.data_dir);
        let output = process::run(command, &format!("pg_controldata {}", self.spec.name))?;
        let text = String::from_utf8_lossy(&output.stdout);
        text.lines()
            .find_map(|line| line.strip_prefix("Latest checkpoint location:"))
            .map(|lsn| lsn.trim().to_string())
            .ok_or_else(|| Error::Sql {
                node: self.spec.name.clone(),
                sql: "pg_controldata".into(),
                message: format!("no \"Latest checkpoint location\" in: {text}"),
            })
    }

    /// Waits until this replica has replayed `lsn` (text `X/Y`).
    pub fn wait_replayed(&self, lsn: &str, timeout: Duration) -> Result<(), Error> {
        let check = format!(
            "SELECT pg_last_wal_replay_lsn() >= '{}'::pg_lsn",
            lsn.replace('\'', "")
        );
        self.wait_until(&format!("replayed {lsn}"), timeout, || {
            Ok(self.sql(&check)? == "t")
        })
    }

    /// The server log, beside the data directory.
    pub fn log_file(&self) -> PathBuf {
        self.spec
            .data_dir
            .parent()
            .unwrap_or(&self.spec.data_dir)
            .join(format!("{}.log", self.spec.name))
    }

    /// Polls `check` every 20 ms until it is true or `timeout` passes.
    pub fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut() -> Result<bool, Error>,
    ) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        let mut last_error = None;
        loop {
            match check() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => last_error = Some(e.to_string()),
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: format!("{}: {what}", self.spec.name),
                    waited: timeout,
                    last_error,
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
