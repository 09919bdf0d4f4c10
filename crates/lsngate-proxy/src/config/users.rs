//! Who may log in and as whom they reach the servers: the `[[users]]` entries as written, and
//! what they become — a credential each client must present (a SCRAM verifier derived once at
//! load time, an MD5 hash or trust) and, with `server_user`, a role of its own on every node.
//! Without entries the primary URL's user is the one login (flags-only mode), trusted only on a
//! loopback address.

use std::net::SocketAddr;

use serde::Deserialize;

use super::{ConfigError, NodeUrl};
use crate::auth::{Credential, ScramVerifier, ServerSecret, md5_stored};

/// A user clients may log in as.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserEntry {
    /// Login name.
    pub name: String,
    /// Plain password (a SCRAM verifier is derived at load time).
    #[serde(default)]
    pub password: Option<String>,
    /// Stored verifier instead of a password: `SCRAM-SHA-256$...` or `md5...` as in pg_authid.
    #[serde(default)]
    pub verifier: Option<String>,
    /// `scram-sha-256` (default), `md5` or `trust`.
    #[serde(default = "default_auth")]
    pub auth: String,
    /// The role this user's statements run as on every node, with pools of its own; default:
    /// the node URL's user, shared by every client user.
    #[serde(default)]
    pub server_user: Option<String>,
    /// `server_user`'s password; default: `password` when `server_user` is the user's own name,
    /// else none (the server trusts the proxy).
    #[serde(default)]
    pub server_password: Option<String>,
}

impl UserEntry {
    /// A user who logs in with `password` and runs as the node URL's user.
    pub fn new(name: &str, password: Option<&str>, auth: &str) -> UserEntry {
        UserEntry {
            name: name.into(),
            password: password.map(Into::into),
            verifier: None,
            auth: auth.into(),
            server_user: None,
            server_password: None,
        }
    }
}

fn default_auth() -> String {
    "scram-sha-256".into()
}

/// A user clients may log in as.
#[derive(Debug, Clone)]
pub struct ClientUser {
    /// Login name.
    pub name: String,
    /// What the client must present.
    pub credential: Credential,
    /// The role the user's statements run as; None = each node URL's user.
    pub server_login: Option<ServerLogin>,
}

/// A role the proxy logs into servers as, instead of the node URL's user.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServerLogin {
    /// Role name.
    pub user: String,
    /// What proves it, if the server asks (Debug hides it).
    pub secret: ServerSecret,
}

/// The users of a config: its `[[users]]` entries, or without any the primary URL's user.
pub(super) fn client_users(
    entries: &[UserEntry],
    primary: &NodeUrl,
    listen: SocketAddr,
) -> Result<Vec<ClientUser>, ConfigError> {
    if entries.is_empty() {
        flags_only_users(primary, listen)
    } else {
        config_users(entries)
    }
}

fn flags_only_users(primary: &NodeUrl, listen: SocketAddr) -> Result<Vec<ClientUser>, ConfigError> {
    let credential = match &primary.password {
        Some(password) => Credential::Scram(ScramVerifier::from_password(password, 4096)),
        None if listen.ip().is_loopback() => Credential::Trust,
        None => return Err(ConfigError::OpenTrust(listen)),
    };
    Ok(vec![ClientUser {
        name: primary.user.clone(),
        credential,
        server_login: None,
    }])
}

fn config_users(entries: &[UserEntry]) -> Result<Vec<ClientUser>, ConfigError> {
    let mut users: Vec<ClientUser> = Vec::with_capacity(entries.len());
    for u in entries {
        if users.iter().any(|seen| seen.name == u.name) {
            return Err(ConfigError::User {
                user: u.name.clone(),
                why: "listed twice under [[users]]; keep one entry".into(),
            });
        }
        users.push(ClientUser {
            name: u.name.clone(),
            credential: user_credential(u)?,
            server_login: server_login(u)?,
        });
    }
    Ok(users)
}

fn server_login(u: &UserEntry) -> Result<Option<ServerLogin>, ConfigError> {
    match (&u.server_user, &u.server_password) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(ConfigError::User {
            user: u.name.clone(),
            why: "server_password without server_user; name the role it belongs to".into(),
        }),
        (Some(role), _) if role.is_empty() || role.contains('\0') => Err(ConfigError::User {
            user: u.name.clone(),
            why: format!("server_user {role:?} is not a role name"),
        }),
        (Some(role), password) => Ok(Some(ServerLogin {
            user: role.clone(),
            secret: password
                .clone()
                .or_else(|| (*role == u.name).then(|| u.password.clone()).flatten())
                .map_or(ServerSecret::None, ServerSecret::Password),
        })),
    }
}

fn user_credential(u: &UserEntry) -> Result<Credential, ConfigError> {
    let err = |why: &str| ConfigError::User {
        user: u.name.clone(),
        why: why.to_string(),
    };
    match (u.auth.as_str(), &u.password, &u.verifier) {
        ("trust", _, _) => Ok(Credential::Trust),
        ("scram-sha-256", Some(p), None) => {
            Ok(Credential::Scram(ScramVerifier::from_password(p, 4096)))
        }
        ("scram-sha-256", None, Some(v)) => ScramVerifier::parse(&u.name, v)
            .map(Credential::Scram)
            .map_err(|e| err(&e.to_string())),
        ("md5", Some(p), None) => Ok(Credential::Md5 {
            hash: md5_stored(&u.name, p),
        }),
        ("md5", None, Some(v)) if v.starts_with("md5") && v.len() == 35 => {
            Ok(Credential::Md5 { hash: v.clone() })
        }
        ("scram-sha-256" | "md5", _, _) => Err(err(
            "set exactly one of `password` or a matching `verifier`",
        )),
        (other, _, _) => Err(err(&format!(
            "unknown auth {other:?}; use scram-sha-256, md5 or trust"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, FileConfig};

    #[test]
    fn flags_only_mode_is_trust_on_loopback_only() {
        let file = FileConfig {
            primary: Some("postgres://postgres@127.0.0.1:5432/postgres".into()),
            ..Default::default()
        };
        let config = Config::build(file.clone()).unwrap();
        assert_eq!(config.credential("postgres"), Some(&Credential::Trust));
        let open = FileConfig {
            listen: Some("0.0.0.0:6432".parse().unwrap()),
            ..file
        };
        assert!(matches!(
            Config::build(open),
            Err(ConfigError::OpenTrust(_))
        ));
    }

    fn users(entries: &str) -> Result<Config, ConfigError> {
        let text = format!("primary = \"postgres://app:pw@db:5432/app\"\n{entries}");
        Config::build(toml::from_str(&text).unwrap())
    }

    #[test]
    fn server_logins_default_to_the_node_url_and_to_the_users_own_password() {
        let config = users(
            r#"
            [[users]]
            name = "app"
            password = "a"
            [[users]]
            name = "reporting"
            password = "r"
            server_user = "reporting"
            [[users]]
            name = "etl"
            password = "e"
            server_user = "loader"
            [[users]]
            name = "ops"
            verifier = "md5aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
            auth = "md5"
            server_user = "loader"
            server_password = "l"
        "#,
        )
        .unwrap();
        let login = |name: &str| config.user(name).unwrap().server_login.clone();
        let role = |user: &str, password: Option<&str>| {
            Some(ServerLogin {
                user: user.into(),
                secret: password.map_or(ServerSecret::None, |p| ServerSecret::Password(p.into())),
            })
        };
        assert_eq!(login("app"), None, "the node URL's user");
        assert_eq!(login("reporting"), role("reporting", Some("r")));
        assert_eq!(
            login("etl"),
            role("loader", None),
            "another role's password is not guessed"
        );
        assert_eq!(login("ops"), role("loader", Some("l")));
        assert!(
            !format!("{:?}", login("ops")).contains("\"l\""),
            "Debug hides the password"
        );
    }

    #[test]
    fn bad_server_logins_and_duplicate_users_are_refused() {
        let error = users("[[users]]\nname = \"a\"\npassword = \"x\"\nserver_password = \"y\"")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("server_password without server_user"),
            "{error}"
        );
        let error = users("[[users]]\nname = \"a\"\npassword = \"x\"\nserver_user = \"\"")
            .unwrap_err()
            .to_string();
        assert!(error.contains("is not a role name"), "{error}");
        let error = users(
            "[[users]]\nname = \"a\"\npassword = \"x\"\n[[users]]\nname = \"a\"\npassword = \"y\"",
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("listed twice"), "{error}");
    }
}
