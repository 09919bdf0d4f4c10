//! `auth_user` + `auth_query`, as in PgBouncer: a client whose name is neither under
//! [[users]] nor in the `auth_file` logs in against the password secret the server itself
//! stores for that role, fetched by running `auth_query` as `auth_user`, so that roles need not
//! be listed in the proxy's config. The secret is cached for `auth_cache_ttl_ms`. With
//! `auth_server_login = "client_role"` (the default, PgBouncer's behaviour) the proxy then logs
//! in to the servers as the client's own role, with the keys the client proved; with
//! `node_user` as the node URL's user, as every other client.

use std::time::Duration;

use super::{ConfigError, FileConfig, NodeUrl, UserEntry, defaults};
use crate::auth::ServerSecret;

/// The settled `auth_query` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct AuthQuery {
    /// The role that runs the query, and what proves it.
    pub user: String,
    /// `auth_user`'s secret: a plain password from its [[users]]/auth_file entry, or the node
    /// URL's when it is the URL's user; else none (the server must trust it).
    pub secret: ServerSecret,
    /// The query: `$1` is the client's login name; it returns the name and the secret.
    pub query: String,
    /// The database it runs in; None = the one the client asked for.
    pub dbname: Option<String>,
    /// How long a fetched secret is reused before it is fetched again.
    pub cache_ttl: Duration,
    /// As whom clients found this way reach the servers.
    pub server_login: AuthServerLogin,
}

/// As whom a client logged in through `auth_query` reaches the servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthServerLogin {
    /// As its own role, proved with the keys of its login (PgBouncer's behaviour).
    ClientRole,
    /// As the node URL's user, like the clients under [[users]] without `server_user`.
    NodeUser,
}

/// The `auth_query` settings of a config file: None without `auth_user`.
pub(super) fn auth_query(
    file: &FileConfig,
    entries: &[UserEntry],
    primary: &NodeUrl,
) -> Result<Option<AuthQuery>, ConfigError> {
    let invalid = |why: String| ConfigError::AuthQuery(why);
    let Some(user) = file.auth_user.clone() else {
        let stray = [
            ("auth_query", file.auth_query.is_some()),
            ("auth_dbname", file.auth_dbname.is_some()),
            ("auth_cache_ttl_ms", file.auth_cache_ttl_ms.is_some()),
            ("auth_server_login", file.auth_server_login.is_some()),
        ];
        if let Some((key, _)) = stray.iter().find(|(_, set)| *set) {
            return Err(invalid(format!(
                "{key} is set but auth_user is not; set auth_user to the role that runs auth_query"
            )));
        }
        return Ok(None);
    };
    if user.is_empty() || user.contains('\0') {
        return Err(invalid(format!("auth_user {user:?} is not a role name")));
    }
    let query = file
        .auth_query
        .clone()
        .unwrap_or_else(|| defaults::AUTH_QUERY.to_string());
    if !query.contains("$1") {
        return Err(invalid(format!(
            "auth_query {query:?} does not use $1, the client's login name; write e.g. {:?}",
            defaults::AUTH_QUERY
        )));
    }
    let server_login = match file.auth_server_login.as_deref() {
        None | Some("client_role") => AuthServerLogin::ClientRole,
        Some("node_user") => AuthServerLogin::NodeUser,
        Some(other) => {
            return Err(invalid(format!(
                "auth_server_login {other:?}: use client_role or node_user"
            )));
        }
    };
    let listed = entries
        .iter()
        .find(|e| e.name == user)
        .and_then(|e| e.password.clone());
    let from_url = (primary.user == user)
        .then(|| primary.password.clone())
        .flatten();
    let secret = listed
        .or(from_url)
        .map_or(ServerSecret::None, ServerSecret::Password);
    Ok(Some(AuthQuery {
        user,
        secret,
        query,
        dbname: file.auth_dbname.clone(),
        cache_ttl: Duration::from_millis(
            file.auth_cache_ttl_ms
                .unwrap_or(defaults::AUTH_CACHE_TTL_MS),
        ),
        server_login,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn build(keys: &str) -> Result<Config, ConfigError> {
        let text = format!("primary = \"postgres://app:pw@db:5432/app\"\n{keys}");
        Config::build(toml::from_str(&text).unwrap())
    }

    #[test]
    fn auth_user_turns_it_on_with_pgbouncers_query_and_the_urls_password() {
        assert_eq!(build("").unwrap().auth_query, None);
        let on = build("auth_user = \"app\"").unwrap().auth_query.unwrap();
        assert_eq!(on.query, defaults::AUTH_QUERY);
        assert_eq!(on.secret, ServerSecret::Password("pw".into()));
        assert_eq!(on.server_login, AuthServerLogin::ClientRole);
        assert_eq!(on.dbname, None);
        let listed = build(
            "auth_user = \"lookup\"\nauth_server_login = \"node_user\"\nauth_dbname = \"postgres\"\n\
             [[users]]\nname = \"lookup\"\npassword = \"lk\"",
        )
        .unwrap()
        .auth_query
        .unwrap();
        assert_eq!(listed.secret, ServerSecret::Password("lk".into()));
        assert_eq!(listed.server_login, AuthServerLogin::NodeUser);
        assert_eq!(listed.dbname.as_deref(), Some("postgres"));
        let trusted = build("auth_user = \"other\"").unwrap().auth_query.unwrap();
        assert_eq!(trusted.secret, ServerSecret::None);
    }

    #[test]
    fn settings_that_cannot_work_are_refused_with_the_fix() {
        for (keys, expected) in [
            ("auth_query = \"SELECT 1\"", "auth_user is not"),
            (
                "auth_user = \"app\"\nauth_query = \"SELECT usename, passwd FROM pg_shadow\"",
                "does not use $1",
            ),
            (
                "auth_user = \"app\"\nauth_server_login = \"mine\"",
                "use client_role or node_user",
            ),
            ("auth_user = \"\"", "is not a role name"),
        ] {
            let error = build(keys).unwrap_err().to_string();
            assert!(error.contains(expected), "{keys}: {error}");
        }
    }
}
