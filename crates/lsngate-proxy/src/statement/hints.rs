//! Route hints: how a client tells the proxy where a statement should run or which floor it
//! must see, without any driver support — `SET lsngate.route` for the session, or a comment in
//! the statement itself (`/* lsngate:route=primary */`, sqlcommenter-style
//! `/*lsngate_min_lsn='0/3F8A120'*/`, `/*lsngate_scope='user:42'*/`) that survives ORMs and
//! query builders. The hint comments
//! are cut from the text before classification so that statements differing only in their floor
//! share one cache entry.

/// A routing hint given by the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteHint {
    /// Route as classified.
    Auto,
    /// Always the primary.
    Primary,
    /// A replica even for what looks like a write (the replica will refuse real writes).
    Replica,
}

impl RouteHint {
    /// Parses `primary`, `replica` or `auto` (quotes allowed).
    pub fn parse(text: &str) -> Option<RouteHint> {
        match text
            .trim()
            .trim_matches(|c| c == '\'' || c == '"')
            .to_ascii_lowercase()
            .as_str()
        {
            "primary" => Some(RouteHint::Primary),
            "replica" => Some(RouteHint::Replica),
            "auto" | "default" => Some(RouteHint::Auto),
            _ => None,
        }
    }

    /// The name shown by `SHOW lsngate.route`.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteHint::Auto => "auto",
            RouteHint::Primary => "primary",
            RouteHint::Replica => "replica",
        }
    }
}

/// Per-statement hints found in comments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hints {
    /// `/* lsngate:route=primary */` (or `lsngate_route='replica'`).
    pub route: Option<RouteHint>,
    /// `/* lsngate_min_lsn='0/3F8A120' */`: the raw value, validated by the session.
    pub min_lsn: Option<String>,
    /// `/* lsngate_scope='user:42' */`: the raw value (URL-decoded), validated by the session.
    pub scope: Option<String>,
}

/// Finds lsngate hints in the statement's comments: `/* lsngate:route=primary */` and
/// sqlcommenter-style `/*lsngate_min_lsn='0/3F8A120',lsngate_route='replica'*/`. Returns them
/// with the SQL minus every comment that held only lsngate keys (so statements that differ only
/// in their floor share one classification). String literals are skipped; `None` when no hint.
pub fn comment_hints(sql: &str) -> Option<(Hints, String)> {
    if !sql.contains("lsngate") {
        return None;
    }
    let bytes = sql.as_bytes();
    let mut hints = Hints::default();
    let mut keep = String::with_capacity(sql.len());
    let mut copied = 0;
    let mut found = false;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\'' => {
                i += 1;
                while i < bytes.len() {
                    if bytes[i] == b'\'' && bytes.get(i + 1) == Some(&b'\'') {
                        i += 2;
                    } else if bytes[i] == b'\'' {
                        break;
                    } else {
                        i += 1;
                    }
                }
                i += 1;
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                let Some(len) = sql[i + 2..].find("*/") else {
                    break;
                };
                let inner = &sql[i + 2..i + 2 + len];
                let end = i + 2 + len + 2;
                if let Some(found_here) = parse_hint_comment(inner) {
                    found = true;
                    hints.route = found_here.route.or(hints.route);
                    hints.min_lsn = found_here.min_lsn.or(hints.min_lsn);
                    hints.scope = found_here.scope.or(hints.scope);
                    keep.push_str(&sql[copied..i]);
                    copied = end;
                }
                i = end;
            }
            _ => i += 1,
        }
    }
    if !found {
        return None;
    }
    keep.push_str(&sql[copied.min(sql.len())..]);
    Some((hints, keep))
}

/// The hints of one comment body when every key in it is an lsngate key.
fn parse_hint_comment(inner: &str) -> Option<Hints> {
    let mut hints = Hints::default();
    let mut any = false;
    for pair in inner.split(',') {
        let pair = pair.trim();
        if pair.is_empty() {
            continue;
        }
        let (key, value) = pair.split_once('=')?;
        let value = value.trim().trim_matches('\'').trim();
        match key.trim().to_ascii_lowercase().as_str() {
            "lsngate:route" | "lsngate_route" => hints.route = Some(RouteHint::parse(value)?),
            "lsngate_min_lsn" | "lsngate:min_lsn" => {
                hints.min_lsn = Some(crate::config::percent_decode(value))
            }
            "lsngate_scope" | "lsngate:scope" => {
                hints.scope = Some(crate::config::percent_decode(value))
            }
            _ => return None,
        }
        any = true;
    }
    any.then_some(hints)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_are_read_from_comments_and_cut_from_the_text() {
        assert_eq!(comment_hints("/*/ SELECT lsngate"), None);
        let (hints, rest) = comment_hints("/* lsngate:route=primary */ SELECT 1").unwrap();
        assert_eq!(
            (hints.route, rest.trim()),
            (Some(RouteHint::Primary), "SELECT 1")
        );
        let (hints, rest) =
            comment_hints("SELECT 1 /*lsngate_min_lsn='0%2F3F8A120',lsngate_route='replica'*/")
                .unwrap();
        assert_eq!(hints.min_lsn.as_deref(), Some("0/3F8A120"));
        assert_eq!(hints.route, Some(RouteHint::Replica));
        assert_eq!(rest.trim(), "SELECT 1");
        let (hints, rest) =
            comment_hints("/* lsngate_scope='x y' */ SELECT 1 /*lsngate_scope='user%3A42'*/")
                .unwrap();
        assert_eq!(
            hints.scope.as_deref(),
            Some("user:42"),
            "the last one wins, as for the other keys"
        );
        assert_eq!(rest.trim(), "SELECT 1");
        assert_eq!(
            comment_hints("SELECT '/* lsngate:route=replica */' /*controller='x'*/"),
            None,
            "hints inside literals and foreign sqlcommenter keys are left alone"
        );
    }
}
