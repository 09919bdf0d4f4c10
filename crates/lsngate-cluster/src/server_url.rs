//! What a pooler started in front of the cluster (pgpool-II, PgBouncer) needs from a libpq URL:
//! the server's TCP address, and the login (user, database, password) that its clients and the
//! pooler itself use.

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
