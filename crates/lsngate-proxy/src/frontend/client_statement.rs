//! A prepared statement as the client defined it, kept by the session across backend changes
//! (each server connection may or may not hold its copy: `identity` is what must match).

use std::sync::Arc;

use crate::causal::Floor;
use crate::net::same_text;
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
    /// The text may start COPY FROM STDIN (`copy::mentions_copy_from_stdin`): an Execute of a
    /// portal bound to it may put the server in COPY mode. Read at Parse, not at each Bind.
    pub copies_in: bool,
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
        crate::net::same(&self.param_types, param_types) && same_text(&self.query, query)
    }
}

/// A session's last few statement definitions, by the text and parameter types the client
/// parsed them with: an application parses the same few statements over and over (pgbench's
/// extended protocol and most drivers send a Parse of the unnamed statement for every
/// statement), and reading a definition (hint comments, proxy commands, class, `RESET` rewrite,
/// `DEALLOCATE ALL`, COPY, identity) cost more than the rest of the Parse together under
/// callgrind. What a definition reads besides its text is the config and the session's startup
/// settings: emptied when the config changes.
#[derive(Debug, Default)]
pub struct DefinitionMemo {
    /// The client's text (before hint comments were taken out), and what it defines.
    entries: Vec<(Arc<str>, Arc<ClientStatement>)>,
    next: usize,
}

const MEMO_SIZE: usize = 8;

impl DefinitionMemo {
    /// The definition of a Parse of `query` with `param_types`, as fresh as a new one (no shape
    /// seen), when one was memoised.
    pub fn get(&self, param_types: &[u32], query: &str) -> Option<Arc<ClientStatement>> {
        self.entries
            .iter()
            .find(|(text, s)| {
                same_text(text, query) && crate::net::same(&s.param_types, param_types)
            })
            .map(|(_, s)| Arc::clone(s))
    }

    /// Keeps `defined`, a fresh definition of the client's `query`, in place of the oldest. Not
    /// one whose comment gave a floor or a scope, or had one refused: a token is checked against
    /// the clock (it expires), so each Parse of it is checked again.
    pub fn keep(&mut self, query: &str, defined: &Arc<ClientStatement>) {
        if defined.floor.is_some() || defined.scope.is_some() || defined.hint_error.is_some() {
            return;
        }
        let text: Arc<str> = if same_text(&defined.query, query) {
            Arc::clone(&defined.query)
        } else {
            Arc::from(query)
        };
        let entry = (text, Arc::clone(defined));
        if self.entries.len() < MEMO_SIZE {
            self.entries.push(entry);
        } else {
            self.entries[self.next] = entry;
            self.next = (self.next + 1) % MEMO_SIZE;
        }
    }

    /// Forgets every definition (the config changed).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.next = 0;
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
pub(super) mod tests {
    use super::*;

    /// A read the client defined with one `int4` parameter (for other modules' tests too).
    pub(in crate::frontend) fn defined(query: &str) -> ClientStatement {
        ClientStatement {
            query: Arc::from(query),
            param_types: Arc::from(&[23u32][..]),
            class: Class::Read,
            hint: None,
            floor: None,
            scope: None,
            hint_error: None,
            local: None,
            shape: None,
            plan_changed: false,
            reset_as_set: false,
            deallocates_all: false,
            copies_in: false,
            identity: statement_identity(&[23], query).into(),
        }
    }

    #[test]
    fn the_memo_finds_a_definition_by_the_clients_text_and_types_and_forgets_the_oldest() {
        let mut memo = DefinitionMemo::default();
        // Kept under the client's text, hint comment included, not the text sent.
        let client = "/* lsngate:route=primary */ SELECT $1";
        memo.keep(client, &Arc::new(defined("SELECT $1")));
        assert_eq!(&*memo.get(&[23], client).unwrap().query, "SELECT $1");
        assert!(memo.get(&[23], "SELECT $1").is_none());
        assert!(memo.get(&[25], client).is_none(), "other parameter types");
        for i in 0..MEMO_SIZE {
            let query = format!("SELECT {i}");
            memo.keep(&query, &Arc::new(defined(&query)));
        }
        assert!(memo.get(&[23], client).is_none(), "the oldest went");
        assert!(memo.get(&[23], "SELECT 0").is_some());
        memo.clear();
        assert!(memo.get(&[23], "SELECT 0").is_none());
    }

    #[test]
    fn a_definition_whose_comment_gave_a_floor_or_an_error_is_read_again_each_time() {
        let mut memo = DefinitionMemo::default();
        let mut refused = defined("SELECT 1");
        refused.hint_error = Some("invalid lsngate_min_lsn comment".into());
        memo.keep("/* lsngate_min_lsn=x */ SELECT 1", &Arc::new(refused));
        assert!(
            memo.get(&[23], "/* lsngate_min_lsn=x */ SELECT 1")
                .is_none()
        );
        let mut floored = defined("SELECT 1");
        floored.floor = Some(Floor {
            lsn: lsngate_core::Lsn::new(1),
            timeline: None,
        });
        memo.keep("/* lsngate_min_lsn=0/1 */ SELECT 1", &Arc::new(floored));
        assert!(
            memo.get(&[23], "/* lsngate_min_lsn=0/1 */ SELECT 1")
                .is_none()
        );
    }

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
