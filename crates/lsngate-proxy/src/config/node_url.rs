//! Node URLs: a server's connection string (libpq URL or key/value form) read into what the
//! proxy needs to reach it — hosts, login, database, startup parameters and TLS — refusing any
//! parameter the proxy would not honour, so a typo fails at startup instead of being ignored.
//! Also the small text helpers that go with addresses and URLs (`host_port`, `percent_decode`).

use std::time::Duration;

use super::ConfigError;

/// The connection parameters a node URL may carry; anything else is refused at startup.
pub const NODE_URL_PARAMETERS: &[&str] = &[
    "host",
    "port",
    "user",
    "password",
    "dbname",
    "application_name",
    "options",
    "connect_timeout",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
];

/// One node's connection string (libpq URL or key/value form), parsed by tokio-postgres with
/// libpq's TLS keys added (see `lsngate_pgconn`).
#[derive(Clone, PartialEq, Eq)]
pub struct NodeUrl {
    /// Host names or addresses with their ports, tried in order (as libpq).
    pub hosts: Vec<(String, u16)>,
    /// Backend user.
    pub user: String,
    /// Backend password, if any.
    pub password: Option<String>,
    /// Default database.
    pub database: String,
    /// `application_name` sent at startup, if the URL sets one.
    pub application_name: Option<String>,
    /// `options` sent at startup (`-c name=value ...`), if the URL sets them.
    pub options: Option<String>,
    /// `connect_timeout`: replaces `connect_timeout_ms` for this node, per host.
    pub connect_timeout: Option<Duration>,
    /// `sslmode`, `sslrootcert`, `sslcert`, `sslkey`, with the files read.
    pub tls: lsngate_pgconn::ServerTls,
}

impl std::fmt::Debug for NodeUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeUrl")
            .field("hosts", &self.hosts)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "…"))
            .field("database", &self.database)
            .field("tls", self.tls.options())
            .finish_non_exhaustive()
    }
}

impl NodeUrl {
    /// Parses `postgres://user[:password]@host[:port][,host2[:port2]...][/database][?params]`
    /// or `host=... user=... ...`, with the parameters in [`NODE_URL_PARAMETERS`].
    pub fn parse(url: &str) -> Result<NodeUrl, ConfigError> {
        Self::parse_for(url, "a node")
    }

    /// [`NodeUrl::parse`], naming the node (`the primary`, `replica 2`) in errors.
    pub fn parse_for(url: &str, node: &str) -> Result<NodeUrl, ConfigError> {
        let bad = |why: String| ConfigError::Url {
            node: node.to_string(),
            url: lsngate_pgconn::redact(url),
            why,
        };
        let parsed = lsngate_pgconn::ConnString::parse(url, NODE_URL_PARAMETERS).map_err(|e| {
            match e {
                lsngate_pgconn::ParamError::Syntax(why) => bad(format!(
                    "{why}; expected postgres://user[:password]@host[:port]/database[?sslmode=...] or host=... user=..."
                )),
                other => bad(other.to_string()),
            }
        })?;
        let hosts = parsed.tcp_hosts().map_err(|e| bad(e.to_string()))?;
        let config = &parsed.config;
        let user = config
            .get_user()
            .filter(|u| !u.is_empty())
            .ok_or_else(|| bad("no user given; write postgres://user@host/database".into()))?
            .to_string();
        let password = match config.get_password() {
            None => None,
            Some(bytes) => Some(
                String::from_utf8(bytes.to_vec())
                    .map_err(|_| bad("the password is not UTF-8 once percent-decoded".into()))?,
            ),
        };
        let tls = lsngate_pgconn::ServerTls::new(parsed.tls.clone()).map_err(|e| bad(e.0))?;
        Ok(NodeUrl {
            hosts,
            database: config.get_dbname().unwrap_or(&user).to_string(),
            user,
            password,
            application_name: config.get_application_name().map(Into::into),
            options: config.get_options().map(Into::into),
            connect_timeout: parsed.connect_timeout,
            tls,
        })
    }

    /// `host:port` (several comma-separated for a host list), for logs and status.
    pub fn address(&self) -> String {
        self.hosts
            .iter()
            .map(|(host, port)| host_port(host, *port))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// `host:port`, with brackets around an IPv6 address.
pub fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Decodes `%XX` escapes (sqlcommenter values); invalid escapes stay as written.
pub(crate) fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_defaults() {
        let u = NodeUrl::parse("postgres://app:p%40ss@db1:5433/shop").unwrap();
        assert_eq!(
            (u.address(), u.user.as_str(), u.database.as_str()),
            ("db1:5433".to_string(), "app", "shop")
        );
        assert_eq!(u.password.as_deref(), Some("p@ss"));
        assert_eq!(
            u.tls.mode(),
            lsngate_pgconn::SslMode::Prefer,
            "libpq's default"
        );
        let u = NodeUrl::parse("postgresql://postgres@127.0.0.1").unwrap();
        assert_eq!(
            (u.hosts[0].1, u.database.as_str(), u.password),
            (5432, "postgres", None)
        );
        assert!(NodeUrl::parse("mysql://x@y").is_err());
        assert!(NodeUrl::parse("postgres://host-only").is_err());
    }

    #[test]
    fn url_parameters_are_read_or_refused_by_name() {
        let u = NodeUrl::parse(
            "postgres://app:pw@db1:5433,[::1]:5434/shop?sslmode=require&application_name=web&options=-c%20search_path%3Ds&connect_timeout=3",
        )
        .unwrap();
        assert_eq!(u.address(), "db1:5433,[::1]:5434");
        assert_eq!(u.tls.mode(), lsngate_pgconn::SslMode::Require);
        assert_eq!(u.application_name.as_deref(), Some("web"));
        assert_eq!(u.options.as_deref(), Some("-c search_path=s"));
        assert_eq!(u.connect_timeout, Some(Duration::from_secs(3)));
        let u =
            NodeUrl::parse("host=db1 port=5433 user=app password='a b' sslmode=disable").unwrap();
        assert_eq!(
            (u.address(), u.password.as_deref()),
            ("db1:5433".into(), Some("a b"))
        );
        for (url, expected) in [
            (
                "postgres://app:secret@db/x?sslmode=verify-full",
                "needs sslrootcert",
            ),
            (
                "postgres://app:secret@db/x?sslmode=verify-ca&sslrootcert=/nonexistent.pem",
                "sslrootcert=/nonexistent.pem",
            ),
            (
                "postgres://app:secret@db/x?sslmode=sometimes",
                "sslmode=\"sometimes\"",
            ),
            (
                "postgres://app:secret@db/x?keepalives=1",
                "unknown parameter \"keepalives\"",
            ),
            (
                "postgres://app:secret@db/x?hostaddr=10.0.0.1",
                "unknown parameter \"hostaddr\"",
            ),
            (
                "host=/run/postgresql user=app password=secret",
                "Unix-domain",
            ),
            ("postgres://app:secret@db:five/x", "port"),
        ] {
            let error = NodeUrl::parse_for(url, "the primary")
                .unwrap_err()
                .to_string();
            assert!(
                error.contains(expected) && !error.contains("secret"),
                "{url}: {error}"
            );
        }
        assert!(
            !format!("{:?}", NodeUrl::parse("postgres://a:secret@h/d").unwrap()).contains("secret")
        );
    }
}
