//! Pooling settings: how long a client holds a server connection (`PoolMode`) and how many server
//! connections a pool may hold and how long they live (`PoolLimits`). Pure values; the pools
//! that keep them, and the expiry arithmetic over them, are `backend::pool`.

use std::time::Duration;

use serde::Deserialize;

/// Pooling mode.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum, Default, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum PoolMode {
    /// A backend serves a client for one transaction (or one autocommit statement).
    #[default]
    Transaction,
    /// A backend serves one client for its whole session.
    Session,
}

/// How many connections a pool may hold and how long they live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolLimits {
    /// Max connections per (node, database, role); fixed when the pool is created.
    pub size: usize,
    /// An idle connection unused for longer than this is closed; None = never.
    pub idle_timeout: Option<Duration>,
    /// A connection open for longer than this is closed instead of reused; None = never.
    pub lifetime: Option<Duration>,
    /// Extra connections a checkout may use once it has waited `reserve_timeout`
    /// (PgBouncer's `reserve_pool_size`); 0 = none.
    pub reserve_size: usize,
    /// How long a checkout waits before it may use the reserve (`reserve_pool_timeout`).
    pub reserve_timeout: Duration,
    /// Most open server connections per (node, database), all roles' pools together
    /// (`max_db_connections`); 0 = unlimited.
    pub max_db_connections: usize,
    /// Most open server connections per (node, role), all databases' pools together
    /// (`max_user_connections`); 0 = unlimited.
    pub max_user_connections: usize,
}
