//! Connection strings as libpq takes them — `postgres://user:pw@host1:5432,host2/db?sslmode=require`
//! or `host=db1 port=5432 user=app sslmode=require` — read into a `tokio_postgres::Config` (the
//! maintained parser does the URL and the quoting) plus what tokio-postgres 0.7 does not know:
//! libpq's six `sslmode`s, `sslrootcert`, `sslcert`, `sslkey` and `connect_timeout`.
//!
//! Those keys are taken out of the string before the rest goes to tokio-postgres, which would
//! refuse them. Only the parameter list is split here (the part after `?` on `&` and `=`, or the
//! key/value pairs with libpq's quoting); user, password, hosts, ports and database are left to
//! tokio-postgres. Every key is checked against the caller's supported list first, so a typo is an
//! error naming it, never a parameter silently dropped.

use std::path::PathBuf;
use std::time::Duration;

use crate::tls::{SslMode, TlsOptions};

/// Why a connection string cannot be used. Messages never contain the password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    /// A key the caller does not support (or that does not exist).
    #[error("unknown parameter {key:?}; supported: {supported}")]
    Unknown {
        /// The key as written.
        key: String,
        /// The supported keys, comma-separated.
        supported: String,
    },
    /// A value this crate checks is not one of the accepted ones.
    #[error("invalid {key}={value:?}: expected {expected}")]
    Invalid {
        /// The key.
        key: &'static str,
        /// The value as written.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// Settings that do not work together (e.g. `verify-full` without `sslrootcert`).
    #[error("{0}")]
    Conflict(String),
    /// The string is not a libpq URL or key/value list (tokio-postgres' reason, or ours).
    #[error("{0}")]
    Syntax(String),
}

/// Every parameter tokio-postgres 0.7 understands plus the ones this crate adds: what the
/// library accepts.
pub const ALL_PARAMETERS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "user",
    "password",
    "dbname",
    "options",
    "application_name",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "sslnegotiation",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "target_session_attrs",
    "channel_binding",
    "load_balance_hosts",
];

/// The keys taken out before tokio-postgres sees the string.
const OURS: &[&str] = &[
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "connect_timeout",
];

/// A parsed connection string.
#[derive(Debug, Clone)]
pub struct ConnString {
    /// Everything tokio-postgres understands; its `ssl_mode` is the nearest of its three
    /// (see [`SslMode::driver_mode`]); no connect timeout is set on it (see `connect_timeout`).
    pub config: tokio_postgres::Config,
    /// `sslmode` (default `prefer`, as libpq), `sslrootcert`, `sslcert`, `sslkey`.
    pub tls: TlsOptions,
    /// `connect_timeout`, per host attempt, as libpq: none when absent or ≤ 0, at least 2 s.
    pub connect_timeout: Option<Duration>,
    /// The keys written in the string, in order (URL form: only those after `?`).
    pub keys: Vec<String>,
}

impl ConnString {
    /// Parses `text`, refusing any key not in `supported` (use [`ALL_PARAMETERS`] for all).
    pub fn parse(text: &str, supported: &[&str]) -> Result<ConnString, ParamError> {
        let (rest, pairs) = if is_url(text) {
            split_url(text)?
        } else {
            split_conninfo(text)?
        };
        let keys: Vec<String> = pairs.iter().map(|(k, _)| k.clone()).collect();
        if let Some(key) = keys.iter().find(|k| !supported.contains(&k.as_str())) {
            return Err(ParamError::Unknown {
                key: key.clone(),
                supported: supported.join(", "),
            });
        }
        let value = |key: &str| {
            pairs
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        let root_cert = non_empty("sslrootcert", value("sslrootcert"))?;
        let mode = match value("sslmode") {
            Some(text) => SslMode::parse(&text).ok_or(ParamError::Invalid {
                key: "sslmode",
                value: text,
                expected: "disable, allow, prefer, require, verify-ca or verify-full",
            })?,
            // libpq: sslrootcert=system makes verify-full the default.
            None if root_cert.as_deref() == Some("system") => SslMode::VerifyFull,
            None => SslMode::Prefer,
        };
        let tls = TlsOptions {
            mode,
            root_cert,
            cert: non_empty("sslcert", value("sslcert"))?.map(PathBuf::from),
            key: non_empty("sslkey", value("sslkey"))?.map(PathBuf::from),
        };
        let connect_timeout = match value("connect_timeout") {
            None => None,
            Some(text) => match text.trim().parse::<i64>() {
                Ok(s) if s <= 0 => None,
                // libpq's floor: a 1 s timeout would fire on an ordinary slow start.
                Ok(s) => Some(Duration::from_secs(s.max(2) as u64)),
                Err(_) => {
                    return Err(ParamError::Invalid {
                        key: "connect_timeout",
                        value: text,
                        expected: "a whole number of seconds",
                    });
                }
            },
        };
        let mut config: tokio_postgres::Config = rest
            .parse()
            .map_err(|e: tokio_postgres::Error| ParamError::Syntax(crate::client::describe(&e)))?;
        config.ssl_mode(mode.driver_mode());
        Ok(ConnString {
            config,
            tls,
            connect_timeout,
            keys,
        })
    }

    /// The TCP hosts with their ports, in the order to try them (tokio-postgres: one port for
    /// all hosts, or one per host; 5432 when none is given). Unix-domain socket hosts are
    /// refused: the proxy speaks TCP only.
    pub fn tcp_hosts(&self) -> Result<Vec<(String, u16)>, ParamError> {
        let hosts = self.config.get_hosts();
        let ports = self.config.get_ports();
        if hosts.is_empty() {
            return Err(ParamError::Conflict(
                "no host given; write postgres://user@host:port/db or host=... port=...".into(),
            ));
        }
        if !self.config.get_hostaddrs().is_empty() {
            return Err(ParamError::Conflict(
                "hostaddr is not supported here; put the address in host".into(),
            ));
        }
        hosts
            .iter()
            .enumerate()
            .map(|(i, host)| {
                let port = match ports.len() {
                    0 => 5432,
                    1 => ports[0],
                    _ => ports[i],
                };
                match host {
                    tokio_postgres::config::Host::Tcp(name) => Ok((name.clone(), port)),
                    #[cfg(unix)]
                    tokio_postgres::config::Host::Unix(path) => Err(ParamError::Conflict(format!(
                        "host {} is a Unix-domain socket directory, which is not supported here; use a TCP host name or address",
                        path.display()
                    ))),
                }
            })
            .collect()
    }
}

fn non_empty(key: &'static str, value: Option<String>) -> Result<Option<String>, ParamError> {
    match value {
        Some(v) if v.is_empty() => Err(ParamError::Invalid {
            key,
            value: v,
            expected: "a file path",
        }),
        other => Ok(other),
    }
}

fn is_url(text: &str) -> bool {
    text.starts_with("postgres://") || text.starts_with("postgresql://")
}

/// Where the parameter list of a URL starts: at the first `?` after the credentials (which
/// tokio-postgres takes up to the first `@`).
fn query_start(text: &str) -> Option<usize> {
    let after_scheme = text.find("://").map_or(0, |i| i + 3);
    let after_credentials = text[after_scheme..]
        .find('@')
        .map_or(after_scheme, |i| after_scheme + i + 1);
    text[after_credentials..]
        .find('?')
        .map(|i| after_credentials + i)
}

fn decode(text: &str) -> Result<String, ParamError> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| ParamError::Syntax(format!("{text:?} is not UTF-8 once percent-decoded")))
}

/// The URL without this crate's keys, and every `(key, value)` of its parameter list, decoded.
fn split_url(text: &str) -> Result<(String, Vec<(String, String)>), ParamError> {
    let Some(q) = query_start(text) else {
        return Ok((text.to_string(), Vec::new()));
    };
    let mut kept = Vec::new();
    let mut pairs = Vec::new();
    for raw in text[q + 1..].split('&').filter(|p| !p.is_empty()) {
        let Some((raw_key, raw_value)) = raw.split_once('=') else {
            return Err(ParamError::Syntax(format!(
                "parameter {:?} has no value; write key=value",
                decode(raw).unwrap_or_else(|_| raw.to_string())
            )));
        };
        let key = decode(raw_key)?;
        let value = if key == "password" {
            String::new() // never kept here: only tokio-postgres reads it
        } else {
            decode(raw_value)?
        };
        if !OURS.contains(&key.as_str()) {
            kept.push(raw);
        }
        pairs.push((key, value));
    }
    let mut rest = text[..q].to_string();
    if !kept.is_empty() {
        rest.push('?');
        rest.push_str(&kept.join("&"));
    }
    Ok((rest, pairs))
}

/// A key/value connection string without this crate's keys (values re-quoted), and every pair.
fn split_conninfo(text: &str) -> Result<(String, Vec<(String, String)>), ParamError> {
    let pairs = conninfo_pairs(text)?;
    let rest = pairs
        .iter()
        .filter(|(k, _)| !OURS.contains(&k.as_str()))
        .map(|(k, v)| format!("{k}='{}'", v.replace('\\', "\\\\").replace('\'', "\\'")))
        .collect::<Vec<_>>()
        .join(" ");
    Ok((rest, pairs))
}

/// libpq's key/value syntax: `key = value` pairs separated by white space, a value either
/// bare (up to white space) or in single quotes, `\` escaping the next character in both.
fn conninfo_pairs(text: &str) -> Result<Vec<(String, String)>, ParamError> {
    let mut chars = text.chars().peekable();
    let mut pairs = Vec::new();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(pairs);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(ParamError::Syntax(format!(
                "missing \"=\" after {key:?} in the connection string; write key=value pairs"
            )));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    Some('\'') => break,
                    Some('\\') => value.extend(chars.next()),
                    Some(c) => value.push(c),
                    None => {
                        return Err(ParamError::Syntax(format!(
                            "unterminated quoted value of {key:?} in the connection string"
                        )));
                    }
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        pairs.push((key, value));
    }
}

/// `text` with its password replaced by `***`, for errors, logs and status pages.
pub fn redact(text: &str) -> String {
    if is_url(text) {
        let end = query_start(text).unwrap_or(text.len());
        let mut out = match (text.find("://"), text[..end].find('@')) {
            (Some(s), Some(at)) if text[s + 3..at].contains(':') => {
                let colon = s + 3 + text[s + 3..at].find(':').unwrap_or(0);
                format!("{}:***{}", &text[..colon], &text[at..end])
            }
            _ => text[..end].to_string(),
        };
        if end < text.len() {
            let params: Vec<String> = text[end + 1..]
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some((k, _)) if decode(k).is_ok_and(|k| k == "password") => format!("{k}=***"),
                    _ => p.to_string(),
                })
                .collect();
            out.push('?');
            out.push_str(&params.join("&"));
        }
        out
    } else {
        match conninfo_pairs(text) {
            Ok(pairs) => pairs
                .iter()
                .map(|(k, v)| {
                    if k == "password" {
                        format!("{k}=***")
                    } else if v.is_empty() || v.contains(|c: char| c.is_whitespace() || c == '\'') {
                        format!("{k}='{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
                    } else {
                        format!("{k}={v}")
                    }
                })
                .collect::<Vec<_>>()
                .join(" "),
            // Unparsable: nothing of it is shown, since where the password ends is unknown.
            Err(_) => "(unparsable connection string)".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ConnString, ParamError> {
        ConnString::parse(text, ALL_PARAMETERS)
    }

    #[test]
    fn urls_keep_percent_decoding_and_give_the_tls_keys_to_us() {
        let c = parse(
            "postgres://app:p%40ss%26w%3Fd@db1:5433,db2/shop?sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem&application_name=x&connect_timeout=7",
        )
        .unwrap();
        assert_eq!(c.config.get_password(), Some(&b"p@ss&w?d"[..]));
        assert_eq!(c.config.get_user(), Some("app"));
        assert_eq!(c.config.get_dbname(), Some("shop"));
        assert_eq!(c.config.get_application_name(), Some("x"));
        assert_eq!(
            c.tcp_hosts().unwrap(),
            vec![("db1".to_string(), 5433), ("db2".to_string(), 5432)]
        );
        assert_eq!(c.tls.mode, SslMode::VerifyFull);
        assert_eq!(c.tls.root_cert.as_deref(), Some("/tmp/ca.pem"));
        assert_eq!(c.connect_timeout, Some(Duration::from_secs(7)));
        assert_eq!(
            c.config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
        assert_eq!(
            c.keys,
            vec![
                "sslmode",
                "sslrootcert",
                "application_name",
                "connect_timeout"
            ]
        );
    }

    #[test]
    fn key_value_strings_parse_with_quotes() {
        let c = parse(
            r"host=db1 port=5433 user=app password='it''s\' x' dbname = shop sslmode=require sslcert='/a b/c.pem' sslkey=/k.pem options='-c search_path=s'",
        );
        // '' is not an escape in libpq (\' is): the first value ends at the second quote.
        assert!(c.is_err(), "{c:?}");
        let c = parse(
            r"host=db1 port=5433 user=app password='it\'s x' dbname = shop sslmode=require sslcert='/a b/c.pem' sslkey=/k.pem options='-c search_path=s'",
        )
        .unwrap();
        assert_eq!(c.config.get_password(), Some(&b"it's x"[..]));
        assert_eq!(c.config.get_dbname(), Some("shop"));
        assert_eq!(c.config.get_options(), Some("-c search_path=s"));
        assert_eq!(c.tls.mode, SslMode::Require);
        assert_eq!(c.tls.cert, Some(PathBuf::from("/a b/c.pem")));
        assert_eq!(c.tcp_hosts().unwrap(), vec![("db1".to_string(), 5433)]);
    }

    #[test]
    fn defaults_are_libpqs() {
        let c = parse("postgres://app@db").unwrap();
        assert_eq!(c.tls.mode, SslMode::Prefer);
        assert_eq!(c.connect_timeout, None);
        let c = parse("postgres://app@db?connect_timeout=1").unwrap();
        assert_eq!(c.connect_timeout, Some(Duration::from_secs(2)));
        let c = parse("postgres://app@db?sslrootcert=system").unwrap();
        assert_eq!(c.tls.mode, SslMode::VerifyFull);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let supported = &["sslmode", "application_name"];
        let e = ConnString::parse("postgres://a@h/d?sslmdoe=require", supported).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown parameter \"sslmdoe\"; supported: sslmode, application_name"
        );
        let e = ConnString::parse("host=h keepalives=1", ALL_PARAMETERS);
        assert!(e.is_ok(), "{e:?}");
        let e = parse("host=h bogus=1").unwrap_err();
        assert!(e.to_string().contains("\"bogus\""), "{e}");
        let e = parse("postgres://a@h/d?sslmode=verify_full").unwrap_err();
        assert!(e.to_string().contains("verify-ca or verify-full"), "{e}");
        let tls = |text: &str| crate::ServerTls::new(parse(text).unwrap().tls).unwrap_err();
        let e = tls("postgres://a@h/d?sslmode=verify-ca");
        assert!(e.to_string().contains("needs sslrootcert"), "{e}");
        let e = tls("postgres://a@h/d?sslcert=/c.pem");
        assert!(e.to_string().contains("sslkey"), "{e}");
        let e = tls("postgres://a@h/d?sslmode=require&sslrootcert=system");
        assert!(e.to_string().contains("verify-full"), "{e}");
        let e = parse("postgres://a@h/d?connect_timeout=soon").unwrap_err();
        assert!(e.to_string().contains("whole number"), "{e}");
        let e = parse("postgres://a@h:port/d").unwrap_err();
        assert!(e.to_string().contains("port"), "{e}");
        let e = parse("host=h port").unwrap_err();
        assert!(e.to_string().contains("missing \"=\""), "{e}");
    }

    #[test]
    fn unix_sockets_and_missing_hosts_are_refused_for_tcp() {
        let c = parse("host=/run/postgresql user=a").unwrap();
        assert!(
            c.tcp_hosts()
                .unwrap_err()
                .to_string()
                .contains("Unix-domain")
        );
        let c = parse("postgres://a@/d").unwrap();
        assert!(c.tcp_hosts().unwrap_err().to_string().contains("no host"));
    }

    #[test]
    fn redaction_hides_every_password() {
        assert_eq!(
            redact("postgres://app:s3cr%40t@db:5432/x?sslmode=require&password=two"),
            "postgres://app:***@db:5432/x?sslmode=require&password=***"
        );
        assert_eq!(redact("postgres://app@db/x"), "postgres://app@db/x");
        assert_eq!(
            redact("host=db password='a b' sslmode=require"),
            "host=db password=*** sslmode=require"
        );
        assert!(!redact("host=db password='unterminated").contains("unterminated"));
    }
}
