//! PgBouncer in front of a cluster, for the comparisons that put it beside lsngate (`lsngate
//! bench`'s `pgbouncer` row, the proxy's `bench_pgbouncer` throughput table): Debian's pgbouncer
//! (scripts/install/proxy.sh installs it), started in a temporary directory on a free loopback
//! port, stopped when dropped. The one place that knows how to write its configuration and run
//! it, so every comparison runs the same PgBouncer.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::Error;
use crate::cluster::free_port;
use crate::pooler::{self, ServerAddress, login_of};
use crate::process::{self, RunAs};

/// Where Debian's pgbouncer puts its binary.
pub const PGBOUNCER: &str = "/usr/sbin/pgbouncer";

/// How long [`Pgbouncer::start`] waits for every database to answer through PgBouncer.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// When PgBouncer gives a server connection back to its pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// After each transaction: many clients share few server connections (PgBouncer's
    /// `transaction`). A client's named prepared statements do not follow it from one server
    /// connection to the next in PgBouncer before 1.21.
    Transaction,
    /// When the client disconnects: each client keeps one server connection, prepared
    /// statements and settings included (PgBouncer's `session`).
    Session,
}

impl PoolMode {
    fn name(self) -> &'static str {
        match self {
            PoolMode::Transaction => "transaction",
            PoolMode::Session => "session",
        }
    }
}

/// One database name clients connect to, and the server and login PgBouncer uses for it.
#[derive(Debug, Clone)]
struct Database {
    name: String,
    server: ServerAddress,
    login: tokio_postgres::Config,
}

/// What PgBouncer is put in front of, and how. Clients log in with the user of the database
/// URLs (trusted: PgBouncer listens on 127.0.0.1 only); PgBouncer logs in to each server with
/// that URL's user and password.
#[derive(Debug, Clone)]
pub struct PgbouncerConfig {
    databases: Vec<Database>,
    pool_mode: PoolMode,
    pool_size: usize,
    own_session: bool,
}

impl Default for PgbouncerConfig {
    fn default() -> Self {
        PgbouncerConfig {
            databases: Vec::new(),
            pool_mode: PoolMode::Transaction,
            pool_size: 20,
            own_session: false,
        }
    }
}

impl PgbouncerConfig {
    /// Clients connecting to database `name` reach the database of `url` (a libpq URL with a
    /// TCP host), logged in as its user.
    pub fn database(mut self, name: &str, url: &str) -> Result<Self, Error> {
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(Error::BadUrl {
                url: url.to_string(),
                why: format!(
                    "{name:?} cannot name a PgBouncer database here; use letters, digits and _"
                ),
            });
        }
        self.databases.retain(|d| d.name != name);
        self.databases.push(Database {
            name: name.to_string(),
            server: ServerAddress::from_url(url, "PgBouncer")?,
            login: login_of(url)?,
        });
        Ok(self)
    }

    /// Transaction (the default) or session pooling.
    pub fn pool_mode(mut self, mode: PoolMode) -> Self {
        self.pool_mode = mode;
        self
    }

    /// Server connections per database and user (`default_pool_size`, default 20).
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// Runs PgBouncer in a session of its own, as a service runs (see
    /// [`crate::PgpoolConfig::own_session`]).
    pub fn own_session(mut self) -> Self {
        self.own_session = true;
        self
    }

    /// `pgbouncer.ini` for PgBouncer on `port`, its files in `dir`.
    fn render(&self, dir: &Path, port: u16) -> String {
        let path = dir.display();
        let mut ini = String::from("[databases]\n");
        for database in &self.databases {
            let login = &database.login;
            ini.push_str(&format!(
                "{} = host={} port={} dbname={} user={}",
                database.name,
                database.server.host,
                database.server.port,
                quoted(login.get_dbname().unwrap_or("postgres")),
                quoted(login.get_user().unwrap_or("postgres")),
            ));
            if let Some(password) = login.get_password() {
                ini.push_str(&format!(
                    " password={}",
                    quoted(&String::from_utf8_lossy(password))
                ));
            }
            ini.push('\n');
        }
        ini.push_str(&format!(
            "\n[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {path}/userlist.txt\npool_mode = {}\n\
             default_pool_size = {}\nmax_client_conn = 1000\n\
             ignore_startup_parameters = extra_float_digits\n\
             logfile = {path}/pgbouncer.log\npidfile = {path}/pgbouncer.pid\n",
            self.pool_mode.name(),
            self.pool_size,
        ));
        ini
    }

    /// `userlist.txt`: the users clients log in as (trusted, so no passwords).
    fn users(&self) -> String {
        let mut users: Vec<&str> = self
            .databases
            .iter()
            .map(|d| d.login.get_user().unwrap_or("postgres"))
            .collect();
        users.sort_unstable();
        users.dedup();
        users
            .iter()
            .map(|user| format!("\"{}\" \"\"\n", user.replace('"', "\"\"")))
            .collect()
    }
}

/// `text` as a value in a `[databases]` connection string (single-quoted when it needs to be).
fn quoted(text: &str) -> String {
    if !text.is_empty() && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"))
    }
}

/// A running PgBouncer; stopped when dropped.
pub struct Pgbouncer {
    child: Child,
    port: u16,
    config: PgbouncerConfig,
    dir: tempfile::TempDir,
}

impl Pgbouncer {
    /// Whether PgBouncer is installed here: [`Error::NoPgbouncer`] if not.
    pub fn check_installed() -> Result<(), Error> {
        if Path::new(PGBOUNCER).exists() {
            Ok(())
        } else {
            Err(Error::NoPgbouncer)
        }
    }

    /// Starts PgBouncer as `config` says and returns once every database answers `SELECT 1`
    /// through it (at most 30 s).
    ///
    /// PgBouncer refuses to run as root: run as root, it runs as the server user
    /// ([`crate::SERVER_USER`]), as PostgreSQL does. Blocks the calling thread; from async code
    /// call it through `spawn_blocking`.
    pub fn start(config: &PgbouncerConfig) -> Result<Pgbouncer, Error> {
        Pgbouncer::check_installed()?;
        if config.databases.is_empty() {
            return Err(Error::BadUrl {
                url: String::new(),
                why: "PgBouncer needs at least one database (PgbouncerConfig::database)".into(),
            });
        }
        let dir = tempfile::Builder::new()
            .prefix("lsngate-pgbouncer-")
            .tempdir()
            .map_err(|e| Error::io("create PgBouncer's directory", e))?;
        let port = free_port()?;
        let ini_path = dir.path().join("pgbouncer.ini");
        let users_path = dir.path().join("userlist.txt");
        std::fs::write(&ini_path, config.render(dir.path(), port))
            .map_err(|e| Error::io(format!("write {}", ini_path.display()), e))?;
        std::fs::write(&users_path, config.users())
            .map_err(|e| Error::io(format!("write {}", users_path.display()), e))?;
        let mut command = match RunAs::detect() {
            Ok(run_as) => {
                // PgBouncer writes its log and pid file into the directory.
                run_as.own(dir.path())?;
                run_as.command(Path::new(PGBOUNCER))
            }
            Err(Error::NoServerUser) => Command::new(PGBOUNCER),
            Err(other) => return Err(other),
        };
        command
            .arg(&ini_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if config.own_session {
            process::in_own_session(&mut command);
        }
        let child = command
            .spawn()
            .map_err(|e| Error::io(format!("start {PGBOUNCER}"), e))?;
        let mut pgbouncer = Pgbouncer {
            child,
            port,
            config: config.clone(),
            dir,
        };
        pgbouncer.wait_answering()?;
        Ok(pgbouncer)
    }

    /// Polls until every database answers `SELECT 1` through PgBouncer: it listens before it
    /// has logged in to any server, and a server it cannot log in to shows only then.
    fn wait_answering(&mut self) -> Result<(), Error> {
        let logins: Vec<tokio_postgres::Config> = self
            .config
            .databases
            .iter()
            .map(|d| self.login(&d.name))
            .collect();
        process::wait_ready(&mut self.child, START_TIMEOUT, || {
            let logins = logins.clone();
            async move {
                for login in &logins {
                    select_one(login).await?;
                }
                Ok(())
            }
        })
        .map_err(|why| Error::Command {
            what: format!("start PgBouncer on port {}", self.port),
            status: why,
            output: format!(
                "last lines of its log {}:\n{}",
                self.log_path().display(),
                self.log_tail(20)
            ),
        })
    }

    /// The port clients connect to, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The PgBouncer process.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Connection settings for a client of `database` through this PgBouncer: its address and
    /// the user the database's URL named.
    pub fn login(&self, database: &str) -> tokio_postgres::Config {
        let user = self
            .config
            .databases
            .iter()
            .find(|d| d.name == database)
            .and_then(|d| d.login.get_user())
            .unwrap_or("postgres");
        let mut login = tokio_postgres::Config::new();
        login
            .host("127.0.0.1")
            .port(self.port)
            .user(user)
            .dbname(database)
            .connect_timeout(Duration::from_secs(10));
        login
    }

    /// A tokio-postgres client of `database` through PgBouncer (10 s to connect); the
    /// connection task is spawned on the current runtime.
    pub async fn connect(&self, database: &str) -> Result<tokio_postgres::Client, Error> {
        let node = format!("PgBouncer on port {} (database {database})", self.port);
        pooler::connect_through(&self.login(database), node, &self.log_path()).await
    }

    /// PgBouncer's log; removed with its directory when PgBouncer is dropped.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("pgbouncer.log")
    }

    /// The last `lines` lines of PgBouncer's log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        pooler::log_tail(&self.log_path(), lines)
    }
}

impl Drop for Pgbouncer {
    fn drop(&mut self) {
        // SIGTERM shuts PgBouncer down at once before 1.23 and once its clients have left from
        // 1.23 on: the clients are gone when a comparison drops it, and a stuck one is killed.
        if pooler::stop(&mut self.child, libc::SIGTERM, Duration::from_secs(5)) {
            return;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Logs in with `login` and runs `SELECT 1`.
async fn select_one(login: &tokio_postgres::Config) -> Result<(), String> {
    let database = login.get_dbname().unwrap_or("?").to_string();
    let connect = login.connect(tokio_postgres::NoTls);
    let (client, connection) = tokio::time::timeout(Duration::from_secs(5), connect)
        .await
        .map_err(|_| format!("database {database}: no answer within 5 s"))?
        .map_err(|e| format!("database {database}: {e}"))?;
    let connection = tokio::spawn(connection);
    let result = client.simple_query("SELECT 1").await;
    drop(client);
    let _ = connection.await;
    result
        .map(|_| ())
        .map_err(|e| format!("database {database}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_database_names_its_server_and_login() {
        let config = PgbouncerConfig::default()
            .database("primary", "postgres://app:it's@127.0.0.1:5432/shop")
            .unwrap()
            .database("replica0", "postgres://app@10.0.0.2:5433/shop")
            .unwrap()
            .pool_mode(PoolMode::Session)
            .pool_size(3);
        let ini = config.render(Path::new("/run/b"), 6400);
        for line in [
            "primary = host=127.0.0.1 port=5432 dbname=shop user=app password='it\\'s'\n",
            "replica0 = host=10.0.0.2 port=5433 dbname=shop user=app\n",
            "listen_port = 6400\n",
            "pool_mode = session\n",
            "default_pool_size = 3\n",
            "auth_file = /run/b/userlist.txt\n",
        ] {
            assert!(ini.contains(line), "{line:?} missing from:\n{ini}");
        }
        assert_eq!(config.users(), "\"app\" \"\"\n");
    }

    #[test]
    fn a_database_name_that_would_break_the_ini_is_refused() {
        let error = PgbouncerConfig::default()
            .database("a b", "postgres://postgres@127.0.0.1:5432/postgres")
            .unwrap_err();
        assert!(
            error.to_string().contains("letters, digits and _"),
            "{error}"
        );
    }
}
