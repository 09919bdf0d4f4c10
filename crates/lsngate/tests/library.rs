//! The library against real clusters (PostgreSQL 19 or whatever `LSNGATE_PG_BIN` selects):
//! exactness (no stale read for a token, ever), routing (replica when possible), budgets,
//! faults (paused, frozen, killed, promoted replicas), sessions, tokens, TLS to the servers,
//! and the one-flight claims measured with a counting TCP forwarder.

#[path = "library/support.rs"]
mod support;

#[path = "library/faults.rs"]
mod faults;

#[path = "library/basics.rs"]
mod basics;

#[path = "library/tls.rs"]
mod tls;
