//! Whom a login name is, and what it must prove: a user of the config ([[users]], `auth_file`),
//! or — with `auth_user` set — a role whose secret the server stores, fetched with `auth_query`
//! and cached for `auth_cache_ttl_ms`. Only secrets are cached: a role created on the server
//! after the proxy started logs in at its first try, and a cached secret that a login failed
//! against is dropped, so a changed password costs at most one failed login.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use crate::auth::{Credential, ScramVerifier};
use crate::backend::auth_lookup::{self, Looked};
use crate::backend::{BackendError, Nodes};
use crate::config::{AuthQuery, Config};

/// What a login name is.
#[derive(Debug, Clone)]
pub enum Login {
    /// A user of the config.
    Listed(Credential),
    /// A role auth_query found a secret for.
    Queried(Queried),
    /// Nobody: not in the config, and auth_query is off.
    Unlisted,
    /// auth_query found no secret for it (no such role, or no password): the login must fail
    /// the way a wrong password does, so a client cannot tell which it was.
    NoSecret,
}

/// A role's secret as auth_query returned it.
#[derive(Debug, Clone)]
pub struct Queried {
    /// What the client must prove.
    pub credential: Credential,
    /// The secret in plain text, when the query returned one (a SECURITY DEFINER function may).
    pub plain: Option<String>,
}

impl Queried {
    fn from_secret(user: &str, secret: &str) -> Queried {
        if secret.starts_with("SCRAM-SHA-256$")
            && let Ok(verifier) = ScramVerifier::parse(user, secret)
        {
            return Queried {
                credential: Credential::Scram(verifier),
                plain: None,
            };
        }
        let is_md5 = secret.len() == 35
            && secret.starts_with("md5")
            && secret[3..].bytes().all(|b| b.is_ascii_hexdigit());
        if is_md5 {
            return Queried {
                credential: Credential::Md5 {
                    hash: secret.to_string(),
                },
                plain: None,
            };
        }
        Queried {
            credential: Credential::Scram(ScramVerifier::from_password(secret, 4096)),
            plain: Some(secret.to_string()),
        }
    }
}

/// The secrets auth_query fetched, by (login name, database the query ran in).
#[derive(Debug, Default)]
pub struct Logins {
    cache: Mutex<HashMap<(String, String), (Instant, Queried)>>,
}

impl Logins {
    /// What `user`, connecting to `database`, must prove; asks the server when the config does
    /// not list it and auth_query is on.
    pub async fn find(
        &self,
        config: &Config,
        nodes: &Nodes,
        user: &str,
        database: &str,
    ) -> Result<Login, BackendError> {
        if let Some(listed) = config.user(user) {
            return Ok(Login::Listed(listed.credential.clone()));
        }
        let Some(auth) = &config.auth_query else {
            return Ok(Login::Unlisted);
        };
        let key = cache_key(auth, user, database);
        if let Some((fetched, queried)) = self.cache.lock().expect("logins").get(&key)
            && fetched.elapsed() < auth.cache_ttl
        {
            return Ok(Login::Queried(queried.clone()));
        }
        let node = nodes
            .primary()
            .or_else(|| nodes.all().iter().find(|n| n.healthy()).cloned())
            .ok_or_else(|| BackendError::Connect {
                node: "any node".into(),
                why: "no server is reachable to run auth_query".into(),
            })?;
        let looked = auth_lookup::look_up(
            node.index,
            &node.url,
            auth,
            database,
            user,
            config.connect_timeout,
        )
        .await?;
        Ok(match looked {
            Looked::NoSecret => {
                self.cache.lock().expect("logins").remove(&key);
                Login::NoSecret
            }
            Looked::Secret(secret) => {
                let queried = Queried::from_secret(user, &secret);
                self.cache
                    .lock()
                    .expect("logins")
                    .insert(key, (Instant::now(), queried.clone()));
                Login::Queried(queried)
            }
        })
    }

    /// Drops `user`'s cached secret after a failed login: the password may have changed.
    pub fn forget(&self, config: &Config, user: &str, database: &str) {
        if let Some(auth) = &config.auth_query {
            let key = cache_key(auth, user, database);
            self.cache.lock().expect("logins").remove(&key);
        }
    }
}

fn cache_key(auth: &AuthQuery, user: &str, database: &str) -> (String, String) {
    let database = auth.dbname.as_deref().unwrap_or(database);
    (user.to_string(), database.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::md5_stored;

    #[test]
    fn secrets_become_credentials_as_the_server_stored_them() {
        let scram = "SCRAM-SHA-256$4096:MDEyMzQ1Njc4OWFiY2RlZg==$\
                     AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=:\
                     AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
        assert!(matches!(
            Queried::from_secret("u", scram).credential,
            Credential::Scram(_)
        ));
        let md5 = md5_stored("u", "pw");
        let queried = Queried::from_secret("u", &md5);
        assert_eq!(queried.credential, Credential::Md5 { hash: md5 });
        assert_eq!(queried.plain, None);
        let plain = Queried::from_secret("u", "pw");
        assert!(matches!(plain.credential, Credential::Scram(_)));
        assert_eq!(plain.plain.as_deref(), Some("pw"));
    }
}
