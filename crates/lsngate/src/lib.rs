//! lsngate: read-your-writes reads on PostgreSQL streaming replicas, for tokio-postgres
//! applications.
//!
//! Write on the primary and get a commit [`Token`] (the primary's WAL position after COMMIT,
//! fetched in the same network flight); read with the token and lsngate serves the read from a
//! replica that has replayed it — at once when it already knows, otherwise after waiting on the
//! connection the read uses (`WAIT FOR LSN` on PostgreSQL ≥ 19, replay polling on older
//! versions) — or falls back as configured when the budget is spent. A read carrying a token
//! never returns data older than the token unless it is explicitly flagged stale.
//!
//! ```no_run
//! # async fn demo() -> Result<(), lsngate::Error> {
//! use lsngate::{Config, Gate};
//! let gate = Gate::connect(
//!     Config::new("postgres://app@primary:5432/shop").replica("postgres://app@replica:5432/shop"),
//! )
//! .await?;
//! let written = gate.write("INSERT INTO orders (id, item) VALUES ($1, $2)", &[&7i64, &"book"]).await?;
//! let read = gate
//!     .query_after(&written.token, "SELECT item FROM orders WHERE id = $1", &[&7i64])
//!     .await?;
//! assert_eq!(read.rows[0].get::<_, String>(0), "book");
//! println!("served by {} (waited: {})", read.served.node, read.served.waited);
//! # Ok(()) }
//! ```
//!
//! What it is not: a failover manager (the primary URL is fixed), or a query router that
//! classifies SQL (reads go where you send them with [`Gate::read`], writes with
//! [`Gate::write`] / [`Gate::begin`]). TLS follows each URL's libpq `sslmode` with lsngate's
//! rustls connector, or is whatever tokio-postgres connector you pass to [`Config::tls`].

#![warn(missing_docs)]

mod config;
mod error;
mod flight;
mod gate;
pub mod metrics;
mod monitor;
mod pool;
mod read;
mod scope;
mod session;
mod watcher;
mod write;

pub use config::{Config, WaitStrategy};
pub use error::{Error, FallbackReason, ReplicaPosition};
pub use flight::Params;
pub use gate::Gate;
pub use lsngate_core::{
    Fallback, GuardConfig, LagBound, Lsn, Refusal, Role, Token, TokenCodec, TokenError, WhenGuarded,
};
pub use read::{Read, ReadBuilder, Served, ServedBy};
pub use scope::Scope;
pub use session::Session;
pub use watcher::ReplicaStatus;
pub use write::{WriteTx, Written, commit_token};
