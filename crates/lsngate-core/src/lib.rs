//! lsngate-core: the pure heart of lsngate — WAL positions, commit tokens and the routing
//! decision. No sockets, no clocks read behind your back (time is passed in), no PostgreSQL:
//! everything here is a plain function a unit test or a fuzzer can call.

#![warn(missing_docs)]

pub mod budget;
pub mod clock;
pub mod floor;
pub mod guard;
pub mod lsn;
pub mod pace;
pub mod probe;
pub mod replay;
pub mod route;
pub mod scope;
pub mod scope_token;
pub mod server;
pub mod sync;
pub mod timeline;
pub mod token;
pub mod wal;

pub use clock::WalClock;
pub use floor::Floor;
pub use guard::{
    BreakerState, Fallback, GuardConfig, GuardStatus, PrimaryGuard, Refusal, SharedGuard,
    WhenGuarded,
};
pub use lsn::{Lsn, LsnParseError};
pub use probe::{Poll, Replay, Verdict};
pub use replay::ReplayBook;
pub use route::{Decision, LagBound, PrimaryReason, ReadRequest, ReplicaState, Role, route};
pub use scope::{Eviction, MAX_SCOPE_LEN, ScopeError, ScopeFloors, ScopeLimits, ScopeName};
pub use scope_token::ScopeTokenError;
pub use server::{ServerFacts, ServerId};
pub use token::{MAX_TOKEN_LEN, Token, TokenCodec, TokenError};
pub use wal::reachable_insert_position;
