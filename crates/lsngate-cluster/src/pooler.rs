//! What the poolers the kit starts in front of a cluster (pgpool-II, PgBouncer) share: the
//! server's TCP address and the login (user, database, password) taken from a libpq URL, a
//! client connection through the pooler, and the pooler's log for error messages.

use std::path::Path;
use std::time::Duration;

use crate::Error;

/// One PostgreSQL server a pooler reaches over TCP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerAddress {
    pub host: String,
    pub port: u16,
}

impl ServerAddress {
    /// The TCP address of `url`; `pooler` names who needs it, for the error.
    pub fn from_url(url: &str, pooler: &str) -> Result<ServerAddress, Error> {
        let config = parse(url)?;
        let host = match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
            _ => {
                return Err(Error::BadUrl {
                    url: url.to_string(),
                    why: format!(
                        "{pooler} reaches its servers over TCP; give a host name or address"
                    ),
                });
            }
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        Ok(ServerAddress { host, port })
    }
}

/// The user (default `postgres`), database (default `postgres`) and password of `url`, in a
/// fresh config: the parsed URL's host would stay first in the list and clients would reach the
/// server instead of the pooler.
pub(crate) fn login_of(url: &str) -> Result<tokio_postgres::Config, Error> {
    let parsed = parse(url)?;
    let mut login = tokio_postgres::Config::new();
    login
        .user(parsed.get_user().unwrap_or("postgres"))
        .dbname(parsed.get_dbname().unwrap_or("postgres"));
    if let Some(password) = parsed.get_password() {
        login.password(password);
    }
    Ok(login)
}

fn parse(url: &str) -> Result<tokio_postgres::Config, Error> {
    url.parse().map_err(|e| Error::BadUrl {
        url: url.to_string(),
        why: format!("{e}"),
    })
}

/// A tokio-postgres client through a pooler (`node` names it in errors, `log` is its log), 10 s
/// to connect; the connection task is spawned on the current runtime.
pub(crate) async fn connect_through(
    login: &tokio_postgres::Config,
    node: String,
    log: &Path,
) -> Result<tokio_postgres::Client, Error> {
    let connect = login.connect(tokio_postgres::NoTls);
    let (client, connection) = match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(pair)) => pair,
        Ok(Err(e)) => {
            return Err(Error::Connect {
                node,
                message: format!("{e} (log: {})", log.display()),
            });
        }
        Err(_) => {
            return Err(Error::Connect {
                node,
                message: format!("no answer within 10 s (log: {})", log.display()),
            });
        }
    };
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// The last `lines` lines of the log at `path`, for error messages.
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Sends `signal` to the pooler `child` and waits up to `grace` for it to exit: whether it did
/// (reaped). When not, the caller kills what is left.
pub(crate) fn stop(child: &mut std::process::Child, signal: i32, grace: Duration) -> bool {
    // SAFETY: plain kill(2) on our own child, not yet reaped.
    unsafe { libc::kill(child.id() as i32, signal) };
    let deadline = std::time::Instant::now() + grace;
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}
