//! A store of commit tokens by key, shared by the processes that need one floor per name:
//! lsngate-http keeps each user's latest token under their user id (a user who wrote on the phone
//! and reads on the laptop brings no cookie from the phone), and the proxy keeps each causal
//! scope's floor (`SET lsngate.scope`) so that several proxies behind one load balancer see each
//! other's writes. [`TokenStore`] is the seam; [`RedisTokenStore`] is the shared implementation
//! (one Redis for every process) and [`MemoryTokenStore`] the single-process one.
//!
//! Not a session store: it holds one token per key and nothing else, with a TTL. Saves merge by
//! max in one atomic step, so two processes saving concurrently never move a key's token
//! backwards.

#![warn(missing_docs)]

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lsngate_core::{Lsn, Token};

/// Prefix of the causal scopes' keys (`lsngate:scope:<name>`), shared by the lsngate proxy's
/// `scope_store` and the library's `Gate::scope`: give it to [`RedisTokenStore::with_prefix`].
pub const SCOPE_PREFIX: &str = "lsngate:scope:";

/// A boxed future, as the object-safe [`TokenStore`] returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why the token store could not load or save.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Redis refused or could not be reached.
    #[error("token store: Redis failed: {0}; check that Redis runs at the configured URL")]
    Redis(#[from] redis::RedisError),
    /// A stored value is not in the store's format (written by something else).
    #[error(
        "token store: key {key:?} holds {value:?}, not a token written by lsngate-http; delete the key or change the key prefix"
    )]
    Corrupt {
        /// The Redis key.
        key: String,
        /// What it held (cut to 40 characters).
        value: String,
    },
}

/// Keeps each key's (user's, scope's) latest commit token for a while.
pub trait TokenStore: Send + Sync + 'static {
    /// The key's token, `None` when there is none or it expired.
    fn load<'a>(&'a self, user: &'a str) -> BoxFuture<'a, Result<Option<Token>, StoreError>>;
    /// Merges `token` into the key's (max wins) and keeps it `ttl` from now.
    fn save<'a>(
        &'a self,
        user: &'a str,
        token: Token,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
}

/// In-process store: right for a single app server; tokens vanish on restart.
#[derive(Debug, Default)]
pub struct MemoryTokenStore {
    tokens: Mutex<HashMap<String, (Token, Instant)>>,
}

impl MemoryTokenStore {
    /// An empty store.
    pub fn new() -> MemoryTokenStore {
        MemoryTokenStore::default()
    }
}

impl TokenStore for MemoryTokenStore {
    fn load<'a>(&'a self, user: &'a str) -> BoxFuture<'a, Result<Option<Token>, StoreError>> {
        let mut tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        let found = match tokens.get(user) {
            Some((token, until)) if *until > Instant::now() => Some(*token),
            Some(_) => {
                tokens.remove(user);
                None
            }
            None => None,
        };
        Box::pin(async move { Ok(found) })
    }

    fn save<'a>(
        &'a self,
        user: &'a str,
        token: Token,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let mut tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let merged = match tokens.get(user) {
            Some((kept, until)) if *until > now => kept.merge(token),
            _ => token,
        };
        tokens.insert(user.to_owned(), (merged, now + ttl));
        Box::pin(async { Ok(()) })
    }
}

/// Compare-and-set by max in one round trip. Values are fixed-width upper-case hex (16 digits)
/// so Lua's byte-wise string comparison orders them as the 64-bit LSNs they are — Lua numbers are
/// doubles and would lose precision past 2^53.
const SAVE_MAX: &str = r#"
local kept = redis.call('GET', KEYS[1])
if (not kept) or kept < ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
"#;

/// Tokens in Redis under `<prefix><key>`, value `<16 hex digits of the LSN>[.t<timeline>]`,
/// expiring with Redis' own TTL.
#[derive(Clone)]
pub struct RedisTokenStore {
    connection: redis::aio::MultiplexedConnection,
    prefix: String,
    save_max: redis::Script,
}

impl std::fmt::Debug for RedisTokenStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTokenStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisTokenStore {
    /// Connects to `url` (`redis://127.0.0.1:6379/0`); keys are `lsngate:token:<user>`.
    pub async fn connect(url: &str) -> Result<RedisTokenStore, StoreError> {
        let client = redis::Client::open(url)?;
        let connection = client.get_multiplexed_async_connection().await?;
        Ok(RedisTokenStore::over(connection))
    }

    /// [`RedisTokenStore::connect`] for a runtime without tokio's time driver (the proxy's, whose
    /// timers run on a thread of their own): the connection sets no timeouts of its own — the
    /// Redis client's default ones would need that driver — so the caller bounds every call,
    /// connecting included.
    pub async fn connect_without_timers(url: &str) -> Result<RedisTokenStore, StoreError> {
        let client = redis::Client::open(url)?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(None)
            .set_response_timeout(None);
        let connection = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        Ok(RedisTokenStore::over(connection))
    }

    fn over(connection: redis::aio::MultiplexedConnection) -> RedisTokenStore {
        RedisTokenStore {
            connection,
            prefix: "lsngate:token:".to_owned(),
            save_max: redis::Script::new(SAVE_MAX),
        }
    }

    /// Uses `prefix` before the key instead of `lsngate:token:`.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> RedisTokenStore {
        self.prefix = prefix.into();
        self
    }

    fn key(&self, user: &str) -> String {
        format!("{}{user}", self.prefix)
    }

    /// Drops the key's token: readers then find none, as after its TTL.
    pub async fn remove(&self, key: &str) -> Result<(), StoreError> {
        let mut connection = self.connection.clone();
        let _: i64 = redis::cmd("DEL")
            .arg(self.key(key))
            .query_async(&mut connection)
            .await?;
        Ok(())
    }
}

/// The stored form: fixed-width hex so it sorts as a number.
pub fn stored_form(token: &Token) -> String {
    match token.timeline {
        Some(timeline) => format!("{:016X}.t{timeline}", token.lsn.as_u64()),
        None => format!("{:016X}", token.lsn.as_u64()),
    }
}

/// A token from its [`stored_form`]; `None` for anything else.
pub fn parse_stored(value: &str) -> Option<Token> {
    let (hex, timeline) = match value.split_once(".t") {
        Some((hex, timeline)) => (hex, Some(timeline.parse().ok()?)),
        None => (value, None),
    };
    if hex.len() != 16 {
        return None;
    }
    let mut token = Token::new(Lsn::new(u64::from_str_radix(hex, 16).ok()?));
    token.timeline = timeline;
    Some(token)
}

impl TokenStore for RedisTokenStore {
    fn load<'a>(&'a self, user: &'a str) -> BoxFuture<'a, Result<Option<Token>, StoreError>> {
        Box::pin(async move {
            let key = self.key(user);
            let mut connection = self.connection.clone();
            let value: Option<String> = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut connection)
                .await?;
            match value {
                None => Ok(None),
                Some(value) => match parse_stored(&value) {
                    Some(token) => Ok(Some(token)),
                    None => Err(StoreError::Corrupt {
                        key,
                        value: value.chars().take(40).collect(),
                    }),
                },
            }
        })
    }

    fn save<'a>(
        &'a self,
        user: &'a str,
        token: Token,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut connection = self.connection.clone();
            let millis = ttl.as_millis().max(1) as u64;
            let _: i64 = self
                .save_max
                .key(self.key(user))
                .arg(stored_form(&token))
                .arg(millis)
                .invoke_async(&mut connection)
                .await?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_form_sorts_as_the_number() {
        let small = stored_form(&Token::new(Lsn::new(0xFFFF_FFFF)));
        let large = stored_form(&Token::new(Lsn::new(0x1_0000_0000)).with_timeline(2));
        assert!(small < large, "{small} vs {large}");
        assert_eq!(
            parse_stored(&large),
            Some(Token::new(Lsn::new(0x1_0000_0000)).with_timeline(2))
        );
        assert_eq!(parse_stored("0/10"), None);
        assert_eq!(parse_stored("zzzzzzzzzzzzzzzz"), None);
    }

    #[tokio::test]
    async fn memory_store_merges_by_max_and_expires() {
        let store = MemoryTokenStore::new();
        let ttl = Duration::from_secs(30);
        store
            .save("ann", Token::new(Lsn::new(20)), ttl)
            .await
            .unwrap();
        store
            .save("ann", Token::new(Lsn::new(10)), ttl)
            .await
            .unwrap();
        assert_eq!(
            store.load("ann").await.unwrap().map(|t| t.lsn),
            Some(Lsn::new(20))
        );
        assert_eq!(store.load("bob").await.unwrap(), None);
        store
            .save("bob", Token::new(Lsn::new(5)), Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(store.load("bob").await.unwrap(), None);
    }
}
