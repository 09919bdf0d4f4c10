//! A prepared statement as the client defined it, kept by the session across backend changes
//! (each server connection may or may not hold its copy: `identity` is what must match).

use std::sync::Arc;

use crate::causal::Floor;
use crate::statement::{Class, LocalCommand, RouteHint};

/// A prepared statement as the client defined it. Cloned for every Parse (the flight log keeps
/// the definitions a flight replaced and made), so its texts are shared, not copied.
#[derive(Debug, Clone)]
pub struct ClientStatement {
    /// The SQL text (hint comment removed).
    pub query: Arc<str>,
    /// Parameter type OIDs from Parse.
    pub param_types: Arc<[u32]>,
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
    /// The text is `DEALLOCATE [PREPARE] ALL` (and not a proxy command): every named statement
    /// is gone once it runs. Read at Parse, not at each of its Binds.
    pub deallocates_all: bool,
    /// [`ClientStatement::identity`], computed once.
    pub(super) identity: Arc<str>,
}

impl ClientStatement {
    /// The identity a backend's copy must match to be reused: parameter types and text, as
    /// `flight.rs` records what each server connection holds.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Whether a Parse of `param_types` and `query` defines this statement: the same identity,
    /// compared without building it.
    pub fn is(&self, param_types: &[u32], query: &str) -> bool {
        crate::net::same(&self.param_types, param_types)
            && crate::net::same_text(&self.query, query)
    }
}

/// The identity of a statement parsed with `param_types` and `query`: `[23, 25]|text`. Built
/// for every Parse a client sends, so by hand rather than through `format!`.
pub fn statement_identity(param_types: &[u32], query: &str) -> String {
    let mut identity = String::with_capacity(query.len() + 3 + 12 * param_types.len());
    identity.push('[');
    for (i, oid) in param_types.iter().enumerate() {
        if i > 0 {
            identity.push_str(", ");
        }
        push_decimal(&mut identity, *oid);
    }
    identity.push_str("]|");
    identity.push_str(query);
    identity
}

fn push_decimal(out: &mut String, mut n: u32) {
    let mut digits = [0u8; 10];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend(digits[at..].iter().map(|&d| char::from(d)));
}

#[cfg(test)]
mod tests {
    use super::statement_identity;

    #[test]
    fn an_identity_is_the_parameter_types_then_the_text() {
        for types in [&[][..], &[0], &[23, 25], &[u32::MAX, 10, 1_000_000]] {
            assert_eq!(
                statement_identity(types, "SELECT $1"),
                format!("{types:?}|SELECT $1")
            );
        }
    }
}
