//! lsngate-http: read-your-writes for web apps. The commit token a write returns travels to the
//! next read through the browser (a signed, short-lived cookie), an API client (the `Lsn-Token`
//! header), a per-user store (the same user on another device), and job payloads (the job a write
//! enqueued). Handlers get a [`TokenContext`] to pass to the library's reads and to record
//! commits in.
//!
//! ```no_run
//! use axum::{Router, routing::get};
//! use lsngate_core::TokenCodec;
//! use lsngate_http::{TokenContext, TokenLayer};
//!
//! async fn show(tokens: TokenContext) -> String {
//!     format!("read with token {:?}", tokens.current())
//! }
//! let app: Router = Router::new()
//!     .route("/", get(show))
//!     .layer(TokenLayer::new(TokenCodec::signed(b"server secret".to_vec())));
//! ```
//!
//! Not a database client: reads and writes go through the `lsngate` library's gate (or anything
//! that produces an `lsngate_core::Token`); this crate carries the token, and [`JobContext`]
//! makes a job's reads honour the token in its payload.

#![warn(missing_docs)]

mod context;
mod cookie;
pub mod job;
mod layer;
mod scope;
pub mod worker;

pub use context::{MissingTokenLayer, NewToken, TokenContext};
pub use job::JobPayload;
pub use layer::{DEFAULT_COOKIE, DEFAULT_HEADER, DEFAULT_TTL, TokenLayer, TokenService, UserOf};
/// The token store, shared with the proxy's causal scopes (crate `lsngate-store`).
pub use lsngate_store as store;
pub use lsngate_store::{MemoryTokenStore, RedisTokenStore, StoreError, TokenStore};
pub use scope::{
    DEFAULT_SCOPE_TTL, MissingScopeLayer, ScopeContext, ScopeLayer, ScopeOf, ScopeService,
};
pub use worker::JobContext;
