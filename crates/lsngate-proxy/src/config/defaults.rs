//! Every key's default, each written once. `Config::build` fills a key that neither the file nor
//! the flags set from here; nothing else states a default in code. The flags' `--help` text and
//! the README cannot name a constant, so the tests below read both and check that they say what
//! these constants say.
//!
//! Defaults that belong to a type are that type's `Default`: `pool_mode` is
//! `PoolMode::default()`, `consistency` `Consistency::default()`, `fallback` and `when_guarded`
//! lsngate-core's `Fallback::default()` and `WhenGuarded::default()`, and the fallback guard's
//! keys (`fallback_cap`, `breaker_*`) `lsngate_core::GuardConfig::default()`. Keys not listed
//! have no value by default (`admin_listen`, TLS, tokens, lag bounds: off).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

/// `listen`: loopback only, PgBouncer's port.
pub const LISTEN: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 6432));
/// `pool_size`: server connections per (node, database, role).
pub const POOL_SIZE: usize = 20;
/// `max_client_connections`.
pub const MAX_CLIENT_CONNECTIONS: usize = 1000;
/// `max_db_connections`: unlimited, as PgBouncer's.
pub const MAX_DB_CONNECTIONS: usize = 0;
/// `max_user_connections`: unlimited, as PgBouncer's.
pub const MAX_USER_CONNECTIONS: usize = 0;
/// `max_db_client_connections`: unlimited, as PgBouncer's.
pub const MAX_DB_CLIENT_CONNECTIONS: usize = 0;
/// `max_user_client_connections`: unlimited, as PgBouncer's.
pub const MAX_USER_CLIENT_CONNECTIONS: usize = 0;
/// `reserve_pool_size`: no reserve, as PgBouncer's.
pub const RESERVE_POOL_SIZE: usize = 0;
/// `reserve_pool_timeout_ms`: PgBouncer's `reserve_pool_timeout` (5 s).
pub const RESERVE_POOL_TIMEOUT_MS: u64 = 5000;
/// `threads`: one event loop on one thread, the least CPU per statement.
pub const THREADS: usize = 1;
/// `acquire_timeout_ms`.
pub const ACQUIRE_TIMEOUT_MS: u64 = 5000;
/// `client_login_timeout_ms`: PgBouncer's `client_login_timeout` (60 s), PostgreSQL's
/// `authentication_timeout` (1 min).
pub const CLIENT_LOGIN_TIMEOUT_MS: u64 = 60_000;
/// `connect_timeout_ms`.
pub const CONNECT_TIMEOUT_MS: u64 = 5000;
/// `health_interval_ms`.
pub const HEALTH_INTERVAL_MS: u64 = 1000;
/// `idle_transaction_timeout_ms`: off, as PgBouncer's `idle_transaction_timeout`.
pub const IDLE_TRANSACTION_TIMEOUT_MS: u64 = 0;
/// `client_idle_timeout_ms`: off, as PgBouncer's `client_idle_timeout`.
pub const CLIENT_IDLE_TIMEOUT_MS: u64 = 0;
/// `server_idle_timeout_ms`: 10 minutes.
pub const SERVER_IDLE_TIMEOUT_MS: u64 = 600_000;
/// `server_lifetime_ms`: 1 hour.
pub const SERVER_LIFETIME_MS: u64 = 3_600_000;
/// `shutdown_timeout_ms`: how long a stopping proxy waits for its clients (PgBouncer waits
/// without a bound; systemd's default stop timeout is 90 s).
pub const SHUTDOWN_TIMEOUT_MS: u64 = 30_000;
/// `stats_period_ms`: PgBouncer's `stats_period` (60 s).
pub const STATS_PERIOD_MS: u64 = 60_000;
/// `max_message_size`: the codec's own ceiling.
pub const MAX_MESSAGE_SIZE: usize = crate::net::DEFAULT_MAX_MESSAGE_LEN;
/// `retry_buffer_size`: 1 MiB.
pub const RETRY_BUFFER_SIZE: usize = 1 << 20;
/// `wait_timeout_ms`: a read's budget for waiting on a replica.
pub const WAIT_TIMEOUT_MS: u64 = 500;
/// `replay_poll_ms`.
pub const REPLAY_POLL_MS: u64 = 20;
/// `topology_poll_ms`: how often the proxy asks Patroni's `/cluster`.
pub const TOPOLOGY_POLL_MS: u64 = 500;
/// `topology_settle_polls`: a member's changed state applies once seen in this many consecutive
/// polls (3 polls of 500 ms: a change applies 1–1.5 s after Patroni shows it; a member flapping
/// faster than that never moves the node set).
pub const TOPOLOGY_SETTLE_POLLS: u32 = 3;
/// Bound of one request to a Patroni REST API (connect, send, read the answer), per URL.
pub const PATRONI_TIMEOUT_MS: u64 = 1000;
/// `require_signed_tokens`.
pub const REQUIRE_SIGNED_TOKENS: bool = false;
/// `require_signed_scopes`.
pub const REQUIRE_SIGNED_SCOPES: bool = false;
/// `scope_capacity`: causal scopes whose floor the proxy keeps (about 200 bytes each).
pub const SCOPE_CAPACITY: usize = 100_000;
/// `scope_ttl_ms`: a scope's floor is forgotten this long after its last write (1 minute).
pub const SCOPE_TTL_MS: u64 = 60_000;
/// `auth_query`: PgBouncer's default.
pub const AUTH_QUERY: &str = "SELECT usename, passwd FROM pg_shadow WHERE usename=$1";
/// `auth_cache_ttl_ms`: a secret `auth_query` fetched is reused for a minute.
pub const AUTH_CACHE_TTL_MS: u64 = 60_000;

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use clap::{CommandFactory, ValueEnum};
    use lsngate_core::{Fallback, GuardConfig, WhenGuarded};
    use serde::Deserialize;

    use super::*;
    use crate::config::{Consistency, FileConfig, PoolMode, ProxyArgs};

    /// Every key whose default is a value, as the help text, the README and TOML write it.
    fn defaults_as_written() -> BTreeMap<&'static str, String> {
        let guard = GuardConfig::default();
        let name = |value: clap::builder::PossibleValue| value.get_name().to_string();
        let lower = |debug: String| debug.to_lowercase();
        BTreeMap::from([
            ("listen", LISTEN.to_string()),
            (
                "pool_mode",
                name(PoolMode::default().to_possible_value().unwrap()),
            ),
            ("pool_size", POOL_SIZE.to_string()),
            ("max_client_connections", MAX_CLIENT_CONNECTIONS.to_string()),
            ("max_db_connections", MAX_DB_CONNECTIONS.to_string()),
            ("max_user_connections", MAX_USER_CONNECTIONS.to_string()),
            (
                "max_db_client_connections",
                MAX_DB_CLIENT_CONNECTIONS.to_string(),
            ),
            (
                "max_user_client_connections",
                MAX_USER_CLIENT_CONNECTIONS.to_string(),
            ),
            ("reserve_pool_size", RESERVE_POOL_SIZE.to_string()),
            (
                "reserve_pool_timeout_ms",
                RESERVE_POOL_TIMEOUT_MS.to_string(),
            ),
            ("threads", THREADS.to_string()),
            ("acquire_timeout_ms", ACQUIRE_TIMEOUT_MS.to_string()),
            (
                "client_login_timeout_ms",
                CLIENT_LOGIN_TIMEOUT_MS.to_string(),
            ),
            ("connect_timeout_ms", CONNECT_TIMEOUT_MS.to_string()),
            ("health_interval_ms", HEALTH_INTERVAL_MS.to_string()),
            (
                "idle_transaction_timeout_ms",
                IDLE_TRANSACTION_TIMEOUT_MS.to_string(),
            ),
            ("client_idle_timeout_ms", CLIENT_IDLE_TIMEOUT_MS.to_string()),
            ("server_idle_timeout_ms", SERVER_IDLE_TIMEOUT_MS.to_string()),
            ("server_lifetime_ms", SERVER_LIFETIME_MS.to_string()),
            ("max_message_size", MAX_MESSAGE_SIZE.to_string()),
            ("shutdown_timeout_ms", SHUTDOWN_TIMEOUT_MS.to_string()),
            ("stats_period_ms", STATS_PERIOD_MS.to_string()),
            ("retry_buffer_size", RETRY_BUFFER_SIZE.to_string()),
            ("consistency", Consistency::default().to_string()),
            ("wait_timeout_ms", WAIT_TIMEOUT_MS.to_string()),
            ("fallback", lower(format!("{:?}", Fallback::default()))),
            ("fallback_cap", guard.max_concurrent.to_string()),
            ("breaker_ratio", guard.max_fallback_ratio.to_string()),
            ("breaker_min_reads", guard.min_reads.to_string()),
            ("breaker_window_ms", guard.window.as_millis().to_string()),
            ("breaker_open_ms", guard.open_for.as_millis().to_string()),
            (
                "when_guarded",
                lower(format!("{:?}", WhenGuarded::default())),
            ),
            ("require_signed_tokens", REQUIRE_SIGNED_TOKENS.to_string()),
            ("replay_poll_ms", REPLAY_POLL_MS.to_string()),
            ("require_signed_scopes", REQUIRE_SIGNED_SCOPES.to_string()),
            ("scope_capacity", SCOPE_CAPACITY.to_string()),
            ("scope_ttl_ms", SCOPE_TTL_MS.to_string()),
            ("topology", "static".to_string()),
            ("topology_poll_ms", TOPOLOGY_POLL_MS.to_string()),
            ("topology_settle_polls", TOPOLOGY_SETTLE_POLLS.to_string()),
            ("auth_query", AUTH_QUERY.to_string()),
            ("auth_cache_ttl_ms", AUTH_CACHE_TTL_MS.to_string()),
            ("auth_server_login", "client_role".to_string()),
        ])
    }

    /// What a `[default: …]` in a help text says.
    fn bracketed_default(help: &str) -> Option<&str> {
        let start = help.find("[default: ")? + "[default: ".len();
        Some(&help[start..start + help[start..].find(']')?])
    }

    #[test]
    fn flag_help_states_the_real_defaults() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: ProxyArgs,
        }
        let defaults = defaults_as_written();
        let command = Cli::command();
        let mut checked = 0;
        for arg in command.get_arguments() {
            let key = arg.get_id().as_str();
            let help = arg.get_long_help().or(arg.get_help()).unwrap().to_string();
            if let Some(default) = defaults.get(key) {
                assert_eq!(
                    bracketed_default(&help),
                    Some(default.as_str()),
                    "--{key}: {help}"
                );
                checked += 1;
            }
        }
        assert_eq!(checked, 33, "every flag with a value default is checked");
    }

    /// The README's `### Config file` example, as TOML.
    fn readme_config_file() -> &'static str {
        let readme = include_str!("../../README.md");
        let section = &readme[readme
            .find("### Config file")
            .expect("README config section")..];
        let start = section.find("```toml\n").expect("a toml block") + "```toml\n".len();
        &section[start..start + section[start..].find("```").unwrap()]
    }

    /// The keys of the TOML file, as serde knows them.
    fn file_keys() -> &'static [&'static str] {
        struct Keys(Option<&'static [&'static str]>);
        impl<'de> serde::Deserializer<'de> for &mut Keys {
            type Error = serde::de::value::Error;
            fn deserialize_any<V: serde::de::Visitor<'de>>(
                self,
                _: V,
            ) -> Result<V::Value, Self::Error> {
                Err(serde::de::Error::custom("not a struct"))
            }
            fn deserialize_struct<V: serde::de::Visitor<'de>>(
                self,
                _: &'static str,
                fields: &'static [&'static str],
                _: V,
            ) -> Result<V::Value, Self::Error> {
                self.0 = Some(fields);
                Err(serde::de::Error::custom("keys noted"))
            }
            serde::forward_to_deserialize_any! {
                bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
                option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
                ignored_any
            }
        }
        let mut keys = Keys(None);
        let _ = FileConfig::deserialize(&mut keys);
        keys.0.expect("FileConfig deserializes as a struct")
    }

    #[test]
    fn readme_config_file_lists_every_key_with_its_real_default() {
        let text = readme_config_file();
        toml::from_str::<FileConfig>(text).expect("the README's example is a valid config file");
        let table: toml::Table = toml::from_str(text).unwrap();
        for key in file_keys() {
            assert!(
                table.contains_key(*key),
                "the README's config file lacks `{key}`"
            );
        }
        for (key, default) in defaults_as_written() {
            let written = match &table[key] {
                toml::Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            assert_eq!(written, default, "README: {key} = {written}");
        }
    }

    #[test]
    fn readme_flag_table_states_the_real_defaults() {
        let readme = include_str!("../../README.md");
        let section = &readme[readme.find("### Flags").expect("README flags section")..];
        let table = &section[..section.find("### Config file").unwrap()];
        let defaults = defaults_as_written();
        let mut checked = 0;
        for row in table.lines().filter(|line| line.starts_with("| `--")) {
            let cells: Vec<&str> = row.split(" | ").collect();
            let flag = cells[0].trim_start_matches("| `--");
            let key = flag[..flag.find([' ', '`']).unwrap()].replace('-', "_");
            if let Some(default) = defaults.get(key.as_str()) {
                assert_eq!(cells[1].trim_matches('`'), default, "README: {row}");
                checked += 1;
            }
        }
        assert_eq!(
            checked, 33,
            "every flag with a value default is in the README's table"
        );
    }
}
