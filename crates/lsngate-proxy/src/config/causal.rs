//! Causal-read settings: the consistency modes (which writes a client's read must see) and the
//! budget, fallback, guard, token and polling settings every session starts from. Pure values,
//! here with the rest of the config so that config imports nothing above it; what the proxy does
//! with them — issuing and verifying tokens, merging floors (`lsngate_core::Floor`), deciding
//! where a read goes — is `causal` and `frontend::causal`.

use std::fmt;
use std::time::Duration;

use lsngate_core::{Fallback, GuardConfig, LagBound, ScopeLimits, TokenCodec, WhenGuarded};

use super::{ConfigError, FileConfig, defaults};

/// Causal-read settings, from the config file and flags.
#[derive(Debug, Clone)]
pub struct CausalConfig {
    /// Default mode of new clients.
    pub consistency: Consistency,
    /// Budget a read may wait on a replica for its floor.
    pub wait_timeout: Duration,
    /// What a read does when its budget is spent.
    pub fallback: Fallback,
    /// Limits of the fallback cap and breaker.
    pub guard: GuardConfig,
    /// What a fallback read does when the guard refuses it (`wait` or `fail`).
    pub when_guarded: WhenGuarded,
    /// Verifies (and, with a key, issues) the tokens of `SET lsngate.min_lsn`.
    pub tokens: TokenCodec,
    /// Whether tokens are signed (`lsngate.commit_token` carries a signature).
    pub signed: bool,
    /// How often every node's replay / insert position is polled.
    pub replay_poll: Duration,
    /// Lag bound for reads without a floor (none by default).
    pub lag_bound: LagBound,
    /// Bounds of the causal scopes' floors (`scope_capacity`, `scope_ttl_ms`).
    pub scopes: ScopeLimits,
    /// Redis URL where the scopes' floors are shared with other proxies (`scope_store`).
    pub scope_store: Option<String>,
    /// Scopes must be signed with the token secret (`require_signed_scopes`).
    pub require_signed_scopes: bool,
}

impl Default for CausalConfig {
    fn default() -> Self {
        CausalConfig {
            consistency: Consistency::default(),
            wait_timeout: Duration::from_millis(defaults::WAIT_TIMEOUT_MS),
            fallback: Fallback::default(),
            guard: GuardConfig::default(),
            when_guarded: WhenGuarded::default(),
            tokens: TokenCodec::unsigned(),
            signed: false,
            replay_poll: Duration::from_millis(defaults::REPLAY_POLL_MS),
            lag_bound: LagBound::default(),
            scopes: ScopeLimits {
                capacity: defaults::SCOPE_CAPACITY,
                ttl: Duration::from_millis(defaults::SCOPE_TTL_MS),
            },
            scope_store: None,
            require_signed_scopes: defaults::REQUIRE_SIGNED_SCOPES,
        }
    }
}

/// Which writes a read must see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Plain read/write split: no floor of its own (explicit floors still hold).
    Eventual,
    /// The client's own earlier writes (and monotonic reads).
    Session,
    /// As `Session`, and the client learns its commit positions (ParameterStatus
    /// `lsngate.commit_lsn`) to hand to other connections, which set them as floors.
    Token,
    /// Every write committed through this proxy before the read began.
    Global,
    /// Every write committed on the primary before the read began.
    Universal,
}

/// A consistency mode: a level, and whether reads may wait on a replica for their floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Consistency {
    /// Which writes reads must see.
    pub level: Level,
    /// Never wait: only replicas already known to have the floor serve, else the primary.
    pub fast: bool,
}

impl Default for Consistency {
    fn default() -> Self {
        Consistency {
            level: Level::Session,
            fast: false,
        }
    }
}

/// The accepted spellings, for error messages.
pub const MODES: &str = "session, token, global, universal, fast (= fast_session), fast_token, fast_global, fast_universal or eventual";

impl Consistency {
    /// Parses a mode name (case-insensitive, quotes, `-` or `_` allowed).
    pub fn parse(text: &str) -> Result<Consistency, String> {
        let name = text
            .trim()
            .trim_matches(|c| c == '\'' || c == '"')
            .to_ascii_lowercase()
            .replace('-', "_");
        let (fast, level) = match name.strip_prefix("fast") {
            Some("") => (true, "session"),
            Some(rest) => (true, rest.trim_start_matches('_')),
            None => (false, name.as_str()),
        };
        let level = match level {
            "session" | "local" | "default" => Level::Session,
            "token" => Level::Token,
            "global" => Level::Global,
            "universal" => Level::Universal,
            "eventual" | "none" | "off" if !fast => Level::Eventual,
            _ => {
                return Err(format!(
                    "invalid consistency mode {:?}; use {MODES}",
                    text.trim()
                ));
            }
        };
        Ok(Consistency { level, fast })
    }

    /// Whether the proxy tracks positions for this client (every mode but eventual).
    pub fn tracks_positions(self) -> bool {
        self.level != Level::Eventual
    }

    /// Whether each commit's position is reported to the client as ParameterStatus
    /// `lsngate.commit_lsn` (the modes whose floors travel to other connections).
    pub fn reports_commits(self) -> bool {
        matches!(self.level, Level::Token | Level::Global)
    }
}

impl fmt::Display for Consistency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.level {
            Level::Eventual => "eventual",
            Level::Session => "session",
            Level::Token => "token",
            Level::Global => "global",
            Level::Universal => "universal",
        };
        match (self.fast, self.level) {
            (true, Level::Session) => f.write_str("fast"),
            (true, _) => write!(f, "fast_{level}"),
            (false, _) => f.write_str(level),
        }
    }
}

/// The causal settings of a file: each key, or its default.
pub(super) fn causal_config(file: &FileConfig) -> Result<CausalConfig, ConfigError> {
    let bad = |key: &'static str, why: String| ConfigError::Causal { key, why };
    let default = CausalConfig::default();
    let consistency = match &file.consistency {
        Some(text) => Consistency::parse(text).map_err(|e| bad("consistency", e))?,
        None => default.consistency,
    };
    let fallback = match file
        .fallback
        .as_deref()
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None => default.fallback,
        Some("primary") => Fallback::Primary,
        Some("error") => Fallback::Error,
        Some("stale") => Fallback::Stale,
        Some(other) => {
            return Err(bad(
                "fallback",
                format!("{other:?}; use primary, error or stale"),
            ));
        }
    };
    let when_guarded = match file
        .when_guarded
        .as_deref()
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None => default.when_guarded,
        Some("wait") => WhenGuarded::Wait,
        Some("fail") => WhenGuarded::FailFast,
        Some(other) => return Err(bad("when_guarded", format!("{other:?}; use wait or fail"))),
    };
    let ratio = file
        .breaker_ratio
        .unwrap_or(default.guard.max_fallback_ratio);
    if !(0.0..=1.0).contains(&ratio) {
        return Err(bad(
            "breaker_ratio",
            format!("{ratio} is not between 0 and 1"),
        ));
    }
    let guard = lsngate_core::GuardConfig {
        max_concurrent: file
            .fallback_cap
            .unwrap_or(default.guard.max_concurrent)
            .max(1),
        window: file
            .breaker_window_ms
            .map(Duration::from_millis)
            .unwrap_or(default.guard.window),
        min_reads: file.breaker_min_reads.unwrap_or(default.guard.min_reads),
        max_fallback_ratio: ratio,
        open_for: file
            .breaker_open_ms
            .map(Duration::from_millis)
            .unwrap_or(default.guard.open_for),
    };
    let (tokens, signed) = match (
        &file.token_secret,
        file.require_signed_tokens
            .unwrap_or(defaults::REQUIRE_SIGNED_TOKENS),
    ) {
        (Some(secret), require) if !secret.is_empty() => {
            let mut codec =
                TokenCodec::signed(secret.as_bytes().to_vec()).accept_unsigned(!require);
            if let Some(ttl) = file.token_ttl_s {
                codec = codec.with_ttl(Duration::from_secs(ttl));
            }
            (codec, true)
        }
        (_, true) => {
            return Err(bad(
                "require_signed_tokens",
                "needs token_secret (the HTTP helpers' HMAC key)".into(),
            ));
        }
        _ => (TokenCodec::unsigned(), false),
    };
    let require_signed_scopes = file
        .require_signed_scopes
        .unwrap_or(defaults::REQUIRE_SIGNED_SCOPES);
    if require_signed_scopes && !signed {
        return Err(bad(
            "require_signed_scopes",
            "needs token_secret (the key scopes are signed with)".into(),
        ));
    }
    let scopes = ScopeLimits {
        capacity: match file.scope_capacity {
            Some(0) => {
                return Err(bad(
                    "scope_capacity",
                    "0 would keep no scope; use at least 1 (every read under a scope the proxy does not hold waits for the primary's position)".into(),
                ));
            }
            Some(n) => n,
            None => default.scopes.capacity,
        },
        ttl: match file.scope_ttl_ms {
            Some(0) => {
                return Err(bad(
                    "scope_ttl_ms",
                    "0 would forget every scope at once; use a number of milliseconds like 60000"
                        .into(),
                ));
            }
            Some(ms) => Duration::from_millis(ms),
            None => default.scopes.ttl,
        },
    };
    let scope_store = match file.scope_store.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(url) if url.starts_with("redis://") && url.len() > "redis://".len() => {
            Some(url.to_string())
        }
        Some(other) => {
            return Err(bad(
                "scope_store",
                format!(
                    "{other:?} is not a Redis URL; use redis://host:port or redis://host:port/db (TLS to Redis is not supported)"
                ),
            ));
        }
    };
    Ok(CausalConfig {
        consistency,
        wait_timeout: file
            .wait_timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(default.wait_timeout),
        fallback,
        guard,
        when_guarded,
        tokens,
        signed,
        replay_poll: Duration::from_millis(
            file.replay_poll_ms
                .unwrap_or(defaults::REPLAY_POLL_MS)
                .max(1),
        ),
        lag_bound: lsngate_core::LagBound {
            max_bytes: file.max_replica_lag_bytes,
            max_lag: file.max_replica_lag_ms.map(Duration::from_millis),
        },
        scopes,
        scope_store,
        require_signed_scopes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print_round_trip() {
        for name in [
            "session",
            "token",
            "global",
            "universal",
            "fast",
            "fast_token",
            "fast_global",
            "fast_universal",
            "eventual",
        ] {
            let mode = Consistency::parse(name).unwrap();
            assert_eq!(mode.to_string(), name);
        }
        assert_eq!(
            Consistency::parse("'Fast-Global'").unwrap(),
            Consistency {
                level: Level::Global,
                fast: true
            }
        );
        assert_eq!(
            Consistency::parse("fast_session").unwrap().to_string(),
            "fast"
        );
        let err = Consistency::parse("strong").unwrap_err();
        assert!(err.contains("strong") && err.contains("universal"), "{err}");
        assert!(Consistency::parse("fast_eventual").is_err());
    }

    #[test]
    fn signed_scopes_need_the_token_secret_and_then_refuse_bare_names() {
        let without = FileConfig {
            require_signed_scopes: Some(true),
            ..Default::default()
        };
        let error = causal_config(&without).unwrap_err().to_string();
        assert!(
            error.contains("require_signed_scopes") && error.contains("token_secret"),
            "{error}"
        );
        let with = FileConfig {
            require_signed_scopes: Some(true),
            token_secret: Some("k".into()),
            ..Default::default()
        };
        let causal = causal_config(&with).unwrap();
        let error = causal.parse_scope("'user:42'").unwrap_err();
        assert!(error.contains("unsigned scope refused"), "{error}");
        let signed = causal.tokens.issue_scope(
            &lsngate_core::ScopeName::parse("user:42").unwrap(),
            std::time::SystemTime::now(),
        );
        assert_eq!(
            causal.parse_scope(&format!("'{signed}'")).unwrap().as_str(),
            "user:42"
        );
        let open = causal_config(&FileConfig::default()).unwrap();
        assert_eq!(open.parse_scope("user:42").unwrap().as_str(), "user:42");
    }
}
