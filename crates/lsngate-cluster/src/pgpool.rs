//! pgpool-II in front of a cluster, for the comparisons that put it beside lsngate (`lsngate
//! bench`'s `pgpool-<setting>` rows, the proxy's `bench_pgbouncer` throughput table): Debian's
//! pgpool2 (scripts/install/proxy.sh installs it) in streaming-replication mode, started in a
//! temporary directory on free loopback ports, stopped when dropped. The one place that knows
//! how to write its configuration and run it, so every comparison runs the same pgpool.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::Error;
use crate::cluster::free_port;
use crate::pooler::{self, ServerAddress, login_of};
use crate::process::{self, RunAs};

/// Where Debian's pgpool2 puts the server binary.
pub const PGPOOL: &str = "/usr/sbin/pgpool";

/// Child processes started beyond the configured clients: room for the readiness check and for
/// a statistics connection (`SHOW pool_nodes`) while every client is connected.
const SPARE_CHILDREN: usize = 4;

/// How long [`Pgpool::start`] waits for pgpool to answer and know the primary.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// What pgpool is put in front of, and how.
///
/// With replicas, load balancing is on and the primary's weight is 0: pgpool sends the reads it
/// balances to the standbys only, as lsngate's read/write splitting does, so the two are
/// compared doing the same thing. Without replicas pgpool is a plain connection pooler in front
/// of the primary (each child process keeps its server connection between clients).
#[derive(Debug, Clone)]
pub struct PgpoolConfig {
    primary: ServerAddress,
    replicas: Vec<ServerAddress>,
    /// The primary URL's user, database and password: what clients log in with, and what
    /// pgpool's own streaming-replication check uses.
    login: tokio_postgres::Config,
    clients: usize,
    settings: Vec<(String, String)>,
    own_session: bool,
}

impl PgpoolConfig {
    /// pgpool in front of the server at `primary_url` and the standbys at `replica_urls`
    /// (libpq URLs with a TCP host); clients log in with the primary URL's user, database and
    /// password.
    pub fn new(primary_url: &str, replica_urls: &[String]) -> Result<PgpoolConfig, Error> {
        let primary = ServerAddress::from_url(primary_url, "pgpool-II")?;
        let replicas = replica_urls
            .iter()
            .map(|url| ServerAddress::from_url(url, "pgpool-II"))
            .collect::<Result<Vec<_>, _>>()?;
        let login = login_of(primary_url)?;
        Ok(PgpoolConfig {
            primary,
            replicas,
            login,
            clients: 8,
            settings: Vec::new(),
            own_session: false,
        })
    }

    /// How many clients may be connected at once (default 8). pgpool serves each client with a
    /// child process of its own, forked at start (`num_init_children`); a client beyond them
    /// waits for one to be free.
    pub fn clients(mut self, clients: usize) -> Self {
        self.clients = clients;
        self
    }

    /// Sets a `pgpool.conf` parameter, `value` as the file spells it (strings in single
    /// quotes), in place of this module's default for it if it has one.
    pub fn setting(mut self, name: &str, value: &str) -> Self {
        self.settings.retain(|(n, _)| n != name);
        self.settings.push((name.to_string(), value.to_string()));
        self
    }

    /// Runs pgpool in a session of its own, as a service runs. With the kernel's autogroup
    /// scheduling a process started in its caller's session shares the caller's CPU share; a
    /// benchmark that measures pgpool next to poolers in sessions of their own needs this.
    /// Without it, pgpool stays in the caller's session and a Ctrl-C at the terminal stops it
    /// with the caller.
    pub fn own_session(mut self) -> Self {
        self.own_session = true;
        self
    }

    /// `pgpool.conf` for pgpool on `port`, its files in `dir`.
    fn render(&self, dir: &Path, port: u16, pcp_port: u16) -> String {
        let path = dir.display();
        let user = self.login.get_user().unwrap_or("postgres");
        let load_balance = if self.replicas.is_empty() {
            "off"
        } else {
            "on"
        };
        let mut settings: Vec<(String, String)> = [
            ("backend_clustering_mode", "'streaming_replication'".into()),
            ("listen_addresses", "'127.0.0.1'".into()),
            ("port", port.to_string()),
            ("socket_dir", format!("'{path}'")),
            ("pcp_listen_addresses", "''".into()),
            ("pcp_port", pcp_port.to_string()),
            ("pcp_socket_dir", format!("'{path}'")),
            ("pid_file_name", format!("'{path}/pgpool.pid'")),
            ("logdir", format!("'{path}'")),
            ("log_destination", "'stderr'".into()),
            (
                "num_init_children",
                (self.clients + SPARE_CHILDREN).to_string(),
            ),
            // One user and one database: one cached server connection per backend and child.
            ("max_pool", "1".into()),
            ("connection_cache", "on".into()),
            ("enable_pool_hba", "off".into()),
            ("load_balance_mode", load_balance.into()),
            ("statement_level_load_balance", "off".into()),
            ("sr_check_user", quoted(user)),
            // No periodic replication check or health check unless a caller asks for one: both
            // are work (and connections) no other pooler in the comparisons does.
            ("sr_check_period", "0".into()),
            ("health_check_period", "0".into()),
            ("failover_on_backend_error", "off".into()),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_string(), value))
        .collect();
        if let Some(password) = self.login.get_password() {
            settings.push((
                "sr_check_password".into(),
                quoted(&String::from_utf8_lossy(password)),
            ));
        }
        settings.retain(|(name, _)| !self.settings.iter().any(|(n, _)| n == name));
        settings.extend(self.settings.iter().cloned());
        let mut conf: String = settings
            .iter()
            .map(|(name, value)| format!("{name} = {value}\n"))
            .collect();
        let weights =
            std::iter::once((&self.primary, 0)).chain(self.replicas.iter().map(|r| (r, 1)));
        for (i, (backend, weight)) in weights.enumerate() {
            // Without standbys the primary is the only node and takes every query.
            let weight = if self.replicas.is_empty() { 1 } else { weight };
            conf.push_str(&format!(
                "backend_hostname{i} = {}\nbackend_port{i} = {}\nbackend_weight{i} = {weight}\n\
                 backend_flag{i} = 'DISALLOW_TO_FAILOVER'\n",
                quoted(&backend.host),
                backend.port
            ));
        }
        conf
    }
}

/// `text` as a single-quoted pgpool.conf string.
fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// A running pgpool-II; stopped, with every process it forked, when dropped.
pub struct Pgpool {
    child: Child,
    port: u16,
    login: tokio_postgres::Config,
    dir: tempfile::TempDir,
}

impl Pgpool {
    /// Whether pgpool-II is installed here: [`Error::NoPgpool`] if not.
    pub fn check_installed() -> Result<(), Error> {
        if Path::new(PGPOOL).exists() {
            Ok(())
        } else {
            Err(Error::NoPgpool)
        }
    }

    /// Starts pgpool as `config` says and returns once it answers and has found the primary
    /// (at most 30 s).
    ///
    /// Run as root, pgpool runs as the server user ([`crate::SERVER_USER`]) when there is one,
    /// as PostgreSQL does, so that it is not a root service in a comparison with poolers that
    /// are not; pgpool itself does not require it. Blocks the calling thread; from async code
    /// call it through `spawn_blocking`.
    pub fn start(config: &PgpoolConfig) -> Result<Pgpool, Error> {
        Pgpool::check_installed()?;
        let dir = tempfile::Builder::new()
            .prefix("lsngate-pgpool-")
            .tempdir()
            .map_err(|e| Error::io("create pgpool-II's directory", e))?;
        let port = free_port()?;
        // pcp, pgpool's administration interface, is unused but needs a port of its own.
        let pcp_port = free_port()?;
        let conf_path = dir.path().join("pgpool.conf");
        let pcp_path = dir.path().join("pcp.conf");
        let log_path = dir.path().join("pgpool.log");
        std::fs::write(&conf_path, config.render(dir.path(), port, pcp_port))
            .map_err(|e| Error::io(format!("write {}", conf_path.display()), e))?;
        std::fs::write(&pcp_path, "")
            .map_err(|e| Error::io(format!("write {}", pcp_path.display()), e))?;
        let log = std::fs::File::create(&log_path)
            .map_err(|e| Error::io(format!("create {}", log_path.display()), e))?;
        let mut command = match RunAs::detect() {
            Ok(run_as) => {
                // pgpool writes its pid and status files into the directory.
                run_as.own(dir.path())?;
                run_as.command(Path::new(PGPOOL))
            }
            Err(Error::NoServerUser) => Command::new(PGPOOL),
            Err(other) => return Err(other),
        };
        command
            .arg("-n")
            .arg("-f")
            .arg(&conf_path)
            .arg("-F")
            .arg(&pcp_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if config.own_session {
            process::in_own_session(&mut command);
        }
        let child = command
            .spawn()
            .map_err(|e| Error::io(format!("start {PGPOOL}"), e))?;
        let mut login = config.login.clone();
        login.host("127.0.0.1").port(port);
        let mut pgpool = Pgpool {
            child,
            port,
            login,
            dir,
        };
        pgpool.wait_answering()?;
        Ok(pgpool)
    }

    /// Polls with `SHOW pool_nodes` until pgpool answers and names a primary, it exits, or
    /// [`START_TIMEOUT`] passes. Not a TCP connect, nor any query: pgpool forks the children
    /// that serve clients before it looks for the primary, and until it has found one it calls
    /// every node a standby.
    fn wait_answering(&mut self) -> Result<(), Error> {
        let login = self.login.clone();
        process::wait_ready(&mut self.child, START_TIMEOUT, || primary_found(&login)).map_err(
            |why| Error::Command {
                what: format!("start pgpool-II on port {}", self.port),
                status: why,
                output: format!(
                    "last lines of its log {}:\n{}",
                    self.log_path().display(),
                    self.log_tail(20)
                ),
            },
        )
    }

    /// The port clients connect to, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The pgpool parent process; the children it forked are its descendants.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Connection settings for a client of this pgpool: its address, and the primary URL's
    /// user, database and password.
    pub fn login(&self) -> &tokio_postgres::Config {
        &self.login
    }

    /// A tokio-postgres client through pgpool (10 s to connect); the connection task is
    /// spawned on the current runtime.
    pub async fn connect(&self) -> Result<tokio_postgres::Client, Error> {
        let node = format!("pgpool-II on port {}", self.port);
        pooler::connect_through(&self.login, node, &self.log_path()).await
    }

    /// pgpool's log (its standard error); removed with its directory when pgpool is dropped.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("pgpool.log")
    }

    /// The last `lines` lines of pgpool's log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        pooler::log_tail(&self.log_path(), lines)
    }
}

impl Drop for Pgpool {
    fn drop(&mut self) {
        // SIGINT is pgpool's fast shutdown: it ends its clients' sessions instead of waiting for
        // them (SIGTERM, the smart one, would), then stops its children and exits.
        let pid = self.child.id() as i32;
        if pooler::stop(&mut self.child, libc::SIGINT, Duration::from_secs(10)) {
            return;
        }
        // Stuck: children first (once the parent is gone they would be orphans no one finds).
        for descendant in process::process_tree(pid).into_iter().skip(1) {
            // SAFETY: as above; a vanished pid only yields ESRCH.
            unsafe { libc::kill(descendant, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Connects to pgpool and asks which nodes it knows (`SHOW pool_nodes`): ready once one of
/// them is the primary.
async fn primary_found(login: &tokio_postgres::Config) -> Result<(), String> {
    let connect = login.connect(tokio_postgres::NoTls);
    let (client, connection) = tokio::time::timeout(Duration::from_secs(5), connect)
        .await
        .map_err(|_| "no answer within 5 s".to_string())?
        .map_err(|e| e.to_string())?;
    let connection = tokio::spawn(connection);
    let result = client.simple_query("SHOW pool_nodes").await;
    drop(client);
    let _ = connection.await;
    let roles: Vec<String> = result
        .map_err(|e| e.to_string())?
        .iter()
        .filter_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get("role").map(str::to_string),
            _ => None,
        })
        .collect();
    if roles.iter().any(|role| role == "primary") {
        Ok(())
    } else {
        Err(format!(
            "it answers but has not found the primary yet (SHOW pool_nodes roles: {}); it \
             searches with sr_check_user and sr_check_database, which must be able to log in \
             to every node",
            roles.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_replicas_reads_go_to_the_standbys_and_a_caller_s_setting_replaces_the_default() {
        let config = PgpoolConfig::new(
            "postgres://app:it's@127.0.0.1:5432/shop",
            &["postgres://app@127.0.0.1:5433/shop".to_string()],
        )
        .unwrap()
        .clients(3)
        .setting("sr_check_period", "1");
        let conf = config.render(Path::new("/run/p"), 9999, 9998);
        for line in [
            "port = 9999\n",
            "num_init_children = 7\n",
            "load_balance_mode = on\n",
            "sr_check_user = 'app'\n",
            "sr_check_password = 'it''s'\n",
            "backend_port0 = 5432\nbackend_weight0 = 0\n",
            "backend_port1 = 5433\nbackend_weight1 = 1\n",
            "sr_check_period = 1\n",
        ] {
            assert!(conf.contains(line), "{line:?} missing from:\n{conf}");
        }
        assert_eq!(conf.matches("sr_check_period").count(), 1, "{conf}");
    }

    #[test]
    fn without_replicas_pgpool_pools_for_the_primary_alone() {
        let config = PgpoolConfig::new("postgres://postgres@127.0.0.1:5432/postgres", &[]).unwrap();
        let conf = config.render(Path::new("/run/p"), 9999, 9998);
        assert!(conf.contains("load_balance_mode = off\n"), "{conf}");
        assert!(conf.contains("backend_weight0 = 1\n"), "{conf}");
        assert!(!conf.contains("backend_port1"), "{conf}");
    }

    #[test]
    fn a_backend_must_be_reached_over_tcp() {
        let error = PgpoolConfig::new("postgres://postgres@%2Ftmp/postgres", &[]).unwrap_err();
        assert!(error.to_string().contains("over TCP"), "{error}");
    }
}
