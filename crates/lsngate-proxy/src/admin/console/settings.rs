//! The settings as the admin console shows and changes them: `SHOW CONFIG` (every key with
//! its value, its default and whether `SET` can change it) and `SET key = value` for the keys a
//! running proxy can take without a restart. A SET swaps in a new config exactly as a reload
//! does (`Proxy::reload`), so it applies where a reload applies; the next RELOAD or SIGHUP reads
//! the file again and replaces it, as in PgBouncer. Other keys are refused with the reason,
//! never ignored.

use std::time::Duration;

use crate::config::{Config, defaults};
use crate::net::sqlstate;

/// A key SET can change, and how its text becomes the config's value.
struct Live {
    key: &'static str,
    apply: fn(&mut Config, u64),
    /// Smallest value accepted.
    min: u64,
}

fn ms(value: u64) -> Option<Duration> {
    (value > 0).then(|| Duration::from_millis(value))
}

const LIVE: &[Live] = &[
    Live {
        key: "pool_size",
        apply: |c, v| c.pool_size = v as usize,
        min: 1,
    },
    Live {
        key: "max_client_connections",
        apply: |c, v| c.max_client_connections = v as usize,
        min: 0,
    },
    Live {
        key: "max_db_connections",
        apply: |c, v| c.max_db_connections = v as usize,
        min: 0,
    },
    Live {
        key: "max_user_connections",
        apply: |c, v| c.max_user_connections = v as usize,
        min: 0,
    },
    Live {
        key: "max_db_client_connections",
        apply: |c, v| c.max_db_client_connections = v as usize,
        min: 0,
    },
    Live {
        key: "max_user_client_connections",
        apply: |c, v| c.max_user_client_connections = v as usize,
        min: 0,
    },
    Live {
        key: "reserve_pool_size",
        apply: |c, v| c.reserve_pool_size = v as usize,
        min: 0,
    },
    Live {
        key: "reserve_pool_timeout_ms",
        apply: |c, v| c.reserve_pool_timeout = Duration::from_millis(v),
        min: 0,
    },
    Live {
        key: "acquire_timeout_ms",
        apply: |c, v| c.acquire_timeout = Duration::from_millis(v),
        min: 0,
    },
    Live {
        key: "connect_timeout_ms",
        apply: |c, v| c.connect_timeout = Duration::from_millis(v),
        min: 1,
    },
    Live {
        key: "server_idle_timeout_ms",
        apply: |c, v| c.server_idle_timeout = ms(v),
        min: 0,
    },
    Live {
        key: "server_lifetime_ms",
        apply: |c, v| c.server_lifetime = ms(v),
        min: 0,
    },
];

/// A SET that was refused: SQLSTATE and message.
pub type Refusal = (&'static str, String);

/// The config with `key` set to `value`, or why not.
pub fn set(config: &Config, key: &str, value: &str) -> Result<Config, Refusal> {
    let Some(live) = LIVE.iter().find(|l| l.key == key) else {
        if rows(config).iter().any(|row| row[0] == key) {
            let how = if ["listen", "threads", "admin_listen"].contains(&key) {
                "in the config file and restart"
            } else {
                "in the config file and RELOAD"
            };
            let changeable: Vec<&str> = LIVE.iter().map(|l| l.key).collect();
            return Err((
                sqlstate::CANT_CHANGE_RUNTIME_PARAM,
                format!(
                    "SET cannot change \"{key}\" on a running lsngate; change it {how} (SET \
                     changes {})",
                    changeable.join(", ")
                ),
            ));
        }
        return Err((
            sqlstate::UNDEFINED_OBJECT,
            format!("unrecognized configuration parameter \"{key}\"; SHOW CONFIG lists them"),
        ));
    };
    let number: u64 = value.parse().map_err(|_| {
        (
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("invalid value for {key}: \"{value}\": expected a whole number"),
        )
    })?;
    if number < live.min {
        return Err((
            sqlstate::INVALID_PARAMETER_VALUE,
            format!(
                "invalid value for {key}: {number}: at least {} is needed",
                live.min
            ),
        ));
    }
    let mut changed = config.clone();
    (live.apply)(&mut changed, number);
    Ok(changed)
}

fn millis(d: Option<Duration>) -> String {
    d.map_or(0, |d| d.as_millis() as u64).to_string()
}

/// `SHOW CONFIG`: key, value, default, changeable (`yes` when SET can change it).
pub fn rows(config: &Config) -> Vec<[String; 4]> {
    let causal = &config.causal;
    let nodes = |from: usize| {
        config.nodes[from..]
            .iter()
            .map(|n| n.address())
            .collect::<Vec<_>>()
            .join(",")
    };
    let pairs: Vec<(&str, String, String)> = vec![
        (
            "listen",
            config.listen.to_string(),
            defaults::LISTEN.to_string(),
        ),
        (
            "admin_listen",
            config
                .admin_listen
                .map(|a| a.to_string())
                .unwrap_or_default(),
            String::new(),
        ),
        (
            "primary",
            nodes(0).split(',').next().unwrap_or_default().to_string(),
            String::new(),
        ),
        ("replicas", nodes(1), String::new()),
        (
            "pool_mode",
            format!("{:?}", config.pool_mode).to_lowercase(),
            "transaction".into(),
        ),
        (
            "pool_size",
            config.pool_size.to_string(),
            defaults::POOL_SIZE.to_string(),
        ),
        (
            "max_client_connections",
            config.max_client_connections.to_string(),
            defaults::MAX_CLIENT_CONNECTIONS.to_string(),
        ),
        (
            "max_db_connections",
            config.max_db_connections.to_string(),
            defaults::MAX_DB_CONNECTIONS.to_string(),
        ),
        (
            "max_user_connections",
            config.max_user_connections.to_string(),
            defaults::MAX_USER_CONNECTIONS.to_string(),
        ),
        (
            "max_db_client_connections",
            config.max_db_client_connections.to_string(),
            defaults::MAX_DB_CLIENT_CONNECTIONS.to_string(),
        ),
        (
            "max_user_client_connections",
            config.max_user_client_connections.to_string(),
            defaults::MAX_USER_CLIENT_CONNECTIONS.to_string(),
        ),
        (
            "reserve_pool_size",
            config.reserve_pool_size.to_string(),
            defaults::RESERVE_POOL_SIZE.to_string(),
        ),
        (
            "reserve_pool_timeout_ms",
            config.reserve_pool_timeout.as_millis().to_string(),
            defaults::RESERVE_POOL_TIMEOUT_MS.to_string(),
        ),
        (
            "threads",
            config.threads.to_string(),
            defaults::THREADS.to_string(),
        ),
        (
            "acquire_timeout_ms",
            config.acquire_timeout.as_millis().to_string(),
            defaults::ACQUIRE_TIMEOUT_MS.to_string(),
        ),
        (
            "connect_timeout_ms",
            config.connect_timeout.as_millis().to_string(),
            defaults::CONNECT_TIMEOUT_MS.to_string(),
        ),
        (
            "health_interval_ms",
            config.health_interval.as_millis().to_string(),
            defaults::HEALTH_INTERVAL_MS.to_string(),
        ),
        (
            "server_idle_timeout_ms",
            millis(config.server_idle_timeout),
            defaults::SERVER_IDLE_TIMEOUT_MS.to_string(),
        ),
        (
            "server_lifetime_ms",
            millis(config.server_lifetime),
            defaults::SERVER_LIFETIME_MS.to_string(),
        ),
        (
            "max_message_size",
            config.max_message_size.to_string(),
            defaults::MAX_MESSAGE_SIZE.to_string(),
        ),
        (
            "shutdown_timeout_ms",
            config.shutdown_timeout.as_millis().to_string(),
            defaults::SHUTDOWN_TIMEOUT_MS.to_string(),
        ),
        (
            "stats_period_ms",
            config.stats_period.as_millis().to_string(),
            defaults::STATS_PERIOD_MS.to_string(),
        ),
        (
            "runtime_dir",
            config
                .runtime_dir
                .as_ref()
                .map(|d| d.display().to_string())
                .unwrap_or_default(),
            String::new(),
        ),
        (
            "retry_buffer_size",
            config.retry_buffer_size.to_string(),
            defaults::RETRY_BUFFER_SIZE.to_string(),
        ),
        (
            "consistency",
            causal.consistency.to_string(),
            crate::config::Consistency::default().to_string(),
        ),
        (
            "wait_timeout_ms",
            causal.wait_timeout.as_millis().to_string(),
            defaults::WAIT_TIMEOUT_MS.to_string(),
        ),
        (
            "fallback",
            format!("{:?}", causal.fallback).to_lowercase(),
            format!("{:?}", lsngate_core::Fallback::default()).to_lowercase(),
        ),
        ("admin_users", config.admin_users.join(","), String::new()),
        ("stats_users", config.stats_users.join(","), String::new()),
    ];
    pairs
        .into_iter()
        .map(|(key, value, default)| {
            let changeable = if LIVE.iter().any(|l| l.key == key) {
                "yes"
            } else {
                "no"
            };
            [key.to_string(), value, default, changeable.to_string()]
        })
        .collect()
}
