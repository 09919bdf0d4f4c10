//! The configuration files of the Patroni test kit: one Patroni YAML per member and the etcd
//! command line. Text only; starting the programs is `mod.rs`'s.

use std::path::Path;

/// Loop timing of the test kit's Patroni: `ttl` is the leader key's lifetime, so a leader killed
/// with its Patroni is replaced about `ttl` seconds later. Patroni 3.0 refuses a ttl under 20
/// and wants `loop_wait + 2 * retry_timeout <= ttl`.
pub const TTL_S: u64 = 20;
/// Seconds between two runs of each member's HA loop.
pub(crate) const LOOP_WAIT_S: u64 = 1;
/// Seconds Patroni retries the DCS and PostgreSQL before it demotes itself.
pub(crate) const RETRY_TIMEOUT_S: u64 = 5;

/// Where one member listens and keeps its files.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemberSpec {
    /// `member1`, `member2`, ... (Patroni's member name, also its `application_name`).
    pub name: String,
    /// PostgreSQL's port on 127.0.0.1.
    pub pg_port: u16,
    /// Patroni's REST API port on 127.0.0.1.
    pub api_port: u16,
    /// Its directory: `data/` (PGDATA), the Unix socket, `patroni.yml`, `patroni.log`.
    pub dir: std::path::PathBuf,
    /// HTTPS on the REST API, when the cluster was started with `rest_tls`.
    #[serde(default)]
    pub rest_tls: Option<RestTls>,
}

/// The REST API's TLS files: its certificate (for `localhost`) and key, and the CA that signed
/// it, which clients trust.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RestTls {
    /// The CA certificate (PEM): what `--patroni-ca-file` names.
    pub ca: std::path::PathBuf,
    /// The API's certificate (PEM), for `localhost`.
    pub cert: std::path::PathBuf,
    /// Its private key (PEM), readable by the server user only.
    pub key: std::path::PathBuf,
}

impl MemberSpec {
    /// The member's YAML file.
    pub fn yaml_path(&self) -> std::path::PathBuf {
        self.dir.join("patroni.yml")
    }
    /// `http://127.0.0.1:<api_port>`, or `https://localhost:<api_port>` (the name its
    /// certificate is for) with `rest_tls`.
    pub fn api_url(&self) -> String {
        match self.rest_tls {
            None => format!("http://127.0.0.1:{}", self.api_port),
            Some(_) => format!("https://localhost:{}", self.api_port),
        }
    }
}

/// Patroni's YAML for `member`, sharing etcd at `etcd_port`, running PostgreSQL from `pg_bin`.
/// Trust on loopback (like the plain test kit), superuser `postgres`; `full_page_writes` stays
/// on and `wal_log_hints` is on, which `pg_rewind` needs to bring a killed leader back as a
/// replica (with `full_page_writes = off` it refuses, and the old leader never streams again);
/// `synchronous_mode` makes
/// Patroni keep one synchronous standby and fail over only to it.
pub fn member_yaml(
    member: &MemberSpec,
    etcd_port: u16,
    pg_bin: &Path,
    synchronous_mode: bool,
) -> String {
    let MemberSpec {
        name,
        pg_port,
        api_port,
        dir,
        rest_tls,
    } = member;
    let dir = dir.display();
    let bin = pg_bin.display();
    // HTTPS on the API, and patronictl (which calls it) trusting its CA.
    let tls = match rest_tls {
        None => String::new(),
        Some(RestTls { ca, cert, key }) => format!(
            "  certfile: {}\n  keyfile: {}\nctl:\n  cacert: {}\n",
            cert.display(),
            key.display(),
            ca.display()
        ),
    };
    format!(
        "scope: lsngate
name: {name}
log:
  level: INFO
  dir: {dir}
restapi:
  listen: 127.0.0.1:{api_port}
  connect_address: 127.0.0.1:{api_port}
{tls}etcd3:
  hosts: 127.0.0.1:{etcd_port}
bootstrap:
  dcs:
    ttl: {TTL_S}
    loop_wait: {LOOP_WAIT_S}
    retry_timeout: {RETRY_TIMEOUT_S}
    maximum_lag_on_failover: 1048576
    synchronous_mode: {synchronous_mode}
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_level: replica
        hot_standby: 'on'
        wal_log_hints: 'on'
        max_wal_senders: 16
        max_replication_slots: 16
        max_connections: 300
        wal_keep_size: 512MB
        fsync: 'off'
        wal_receiver_status_interval: 1s
  initdb:
  - encoding: UTF8
  - no-locale
  pg_hba:
  - local all all trust
  - host replication all 127.0.0.1/32 trust
  - host all all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:{pg_port}
  connect_address: 127.0.0.1:{pg_port}
  data_dir: {dir}/data
  bin_dir: {bin}
  pgpass: {dir}/pgpass
  authentication:
    replication:
      username: postgres
    superuser:
      username: postgres
  parameters:
    unix_socket_directories: {dir}
    log_min_messages: warning
"
    )
}
