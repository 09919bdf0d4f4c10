//! The client side: a client's handshake (`handshake`, checking logins with `crate::auth`), the
//! per-client session loop (`session`), the routing plan (`plan`) and the flights and replies
//! it sends and relays. Sessions share `crate::proxy::Proxy`, passed in explicitly, never read
//! from a global.

mod answers;
mod attached;
mod causal;
pub mod client_io;
mod client_statement;
mod commands;
mod copy;
mod deallocate;
mod effects;
pub mod error;
mod flight;
pub mod handshake;
mod lost;
mod passthrough;
mod pipeline;
mod plan;
mod preparation;
mod replies;
mod scopes;
pub mod session;
mod shapes;
mod startup;
mod woken;
