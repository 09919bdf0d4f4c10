//! A prepared statement as the client defined it, kept by the session across backend changes
//! (each server connection may or may not hold its copy: `identity` is what must match).

use crate::causal::Floor;
use crate::statement::{Class, LocalCommand, RouteHint};

/// A prepared statement as the client defined it.
#[derive(Debug, Clone)]
pub struct ClientStatement {
    /// The SQL text (hint comment removed).
    pub query: String,
    /// Parameter type OIDs from Parse.
    pub param_types: Vec<u32>,
    /// Classification of the text.
    pub class: Class,
    /// A route hint found in the text.
    pub hint: Option<RouteHint>,
    /// A floor from a `lsngate_min_lsn` comment.
    pub floor: Option<Floor>,
    /// The causal scope of a `lsngate_scope` comment.
    pub scope: Option<lsngate_core::ScopeName>,
    /// Why the comment's floor or scope was refused (the statement then fails without running).
    pub hint_error: Option<String>,
    /// The text is a proxy command (`SET lsngate.…`), answered by the proxy.
    pub local: Option<LocalCommand>,
    /// The result columns a Describe showed the client (see `shapes.rs`).
    pub shape: Option<super::shapes::Shape>,
    /// The columns changed since: its Binds fail as PostgreSQL's would (`0A000`).
    pub plan_changed: bool,
    /// The client's text was `RESET name` of a startup setting, and `query` is the `SET` of its
    /// startup value (see `Session::reset_sent_as_set`): its CommandComplete says `RESET`.
    pub reset_as_set: bool,
    /// [`ClientStatement::identity`], computed once.
    pub(super) identity: String,
}

impl ClientStatement {
    /// The identity a backend's copy must match to be reused: parameter types and text, as
    /// `flight.rs` records what each server connection holds.
    pub fn identity(&self) -> &str {
        &self.identity
    }
}

/// The identity of a statement parsed with `param_types` and `query`.
pub fn statement_identity(param_types: &[u32], query: &str) -> String {
    format!("{param_types:?}|{query}")
}
