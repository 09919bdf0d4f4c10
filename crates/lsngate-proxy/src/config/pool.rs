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
}
