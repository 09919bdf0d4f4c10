//! Read floors: "a read must see every write up to this position, on this history". The one rule
//! for the stricter of two floors, used by tokens ([`crate::Token::merge`]) in the library and by
//! every floor the proxy keeps per client and proxy-wide. Pure values; where a floor comes from
//! (a commit, a served read, a client's `SET`) and where a read goes for it is not decided here.
//!
//! Position and timeline are maxed each on its own. Letting a newer timeline's floor replace an
//! older one outright would lose the older position when the new timeline forked *after* it:
//! `(tl 1, 900)` and `(tl 2, 500)` with the fork at 950 must still wait for 900. Where the fork is
//! below the older position, the writes past it were lost with the old primary; waiting for the
//! new timeline to pass the number then only routes more reads to the primary, never a stale one
//! to a replica (see [`crate::timeline`] for which replicas may serve a timeline at all).

use std::fmt;

use crate::lsn::Lsn;

/// A position reads must see, with the primary timeline it was taken on when known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Floor {
    /// The WAL position.
    pub lsn: Lsn,
    /// Timeline of the primary that produced it; `None` for replica replay positions and bare
    /// `X/Y` tokens.
    pub timeline: Option<u32>,
}

impl Floor {
    /// A floor without timeline.
    pub fn at(lsn: Lsn) -> Floor {
        Floor {
            lsn,
            timeline: None,
        }
    }

    /// The stricter of two floors: the larger position and the newer timeline, each on its own.
    pub fn max(self, other: Floor) -> Floor {
        Floor {
            lsn: self.lsn.max(other.lsn),
            timeline: self.timeline.max(other.timeline),
        }
    }

    /// [`Floor::max`] over optional floors (`None`: no floor).
    pub fn merge(a: Option<Floor>, b: Option<Floor>) -> Option<Floor> {
        match (a, b) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}

impl From<Lsn> for Floor {
    fn from(lsn: Lsn) -> Self {
        Floor::at(lsn)
    }
}

/// The position alone, as `X/Y`.
impl fmt::Display for Floor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.lsn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Token;
    use proptest::prelude::*;

    fn floor(lsn: u64, timeline: Option<u32>) -> Floor {
        Floor {
            lsn: Lsn::new(lsn),
            timeline,
        }
    }

    #[test]
    fn a_newer_timeline_does_not_forget_the_older_position() {
        let (old, new) = (floor(900, Some(1)), floor(500, Some(2)));
        assert_eq!(old.max(new), floor(900, Some(2)));
        assert_eq!(new.max(old), floor(900, Some(2)));
        assert_eq!(new.max(Floor::at(Lsn::new(600))), floor(600, Some(2)));
        assert_eq!(Floor::merge(None, Some(old)), Some(old));
        assert_eq!(Floor::merge(None, None), None);
    }

    fn any_floor() -> impl Strategy<Value = Floor> {
        (any::<u64>(), proptest::option::of(1u32..5)).prop_map(|(l, t)| floor(l, t))
    }

    proptest! {
        /// `max` is a join: commutative, associative, idempotent, and never lowers either side.
        #[test]
        fn max_is_a_join(a in any_floor(), b in any_floor(), c in any_floor()) {
            prop_assert_eq!(a.max(b), b.max(a));
            prop_assert_eq!(a.max(b).max(c), a.max(b.max(c)));
            prop_assert_eq!(a.max(a), a);
            let m = a.max(b);
            prop_assert!(m.lsn >= a.lsn && m.lsn >= b.lsn);
            prop_assert!(m.timeline >= a.timeline && m.timeline >= b.timeline);
            prop_assert!(m.lsn == a.lsn || m.lsn == b.lsn);
            prop_assert!(m.timeline == a.timeline || m.timeline == b.timeline);
        }

        /// `merge` treats `None` as the bottom: no floor adds nothing.
        #[test]
        fn none_is_the_bottom(a in proptest::option::of(any_floor()), b in proptest::option::of(any_floor())) {
            prop_assert_eq!(Floor::merge(a, None), a);
            prop_assert_eq!(Floor::merge(a, b), Floor::merge(b, a));
        }

        /// Tokens merge their position and timeline by the very same rule.
        #[test]
        fn tokens_merge_as_floors(a in any_floor(), b in any_floor()) {
            let token = |f: Floor| Token { lsn: f.lsn, timeline: f.timeline, expires_at: None };
            prop_assert_eq!(token(a).merge(token(b)).floor(), a.max(b));
        }
    }
}
