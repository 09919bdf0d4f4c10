//! Causal scopes: read-your-writes per name the application chooses — a user, a tenant, a device,
//! a conversation — across every connection that works under that name. A [`ScopeName`] is
//! client input, checked here once (length and charset) before it goes anywhere; a
//! [`ScopeFloors`] is the bounded book of each scope's floor (the highest commit position made
//! under it): least-recently-used names leave when the book is full, and a floor expires a time
//! after its last raise.
//!
//! Pure: no clock (the caller passes `now`), no lock, no I/O. What a *missing* floor means is the
//! caller's decision, and the only safe one is "unknown", never "nothing to wait for": a scope is
//! missing because it was never written under, or because its floor was evicted or expired, or
//! written through another proxy, and a reader cannot tell which.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::Floor;

/// Longest scope name, in bytes.
pub const MAX_SCOPE_LEN: usize = 128;

/// The characters a scope name may hold besides ASCII letters and digits.
pub const SCOPE_PUNCTUATION: &str = ":_.@/-";

/// A valid scope name: 1 to [`MAX_SCOPE_LEN`] bytes of `[A-Za-z0-9:_.@/-]`. Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScopeName(Arc<str>);

/// Why a scope name was refused; the message names the rule and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    /// Nothing between the quotes.
    #[error(
        "empty scope name; give a name like 'user:42', or RESET lsngate.scope to work without one"
    )]
    Empty,
    /// Longer than [`MAX_SCOPE_LEN`].
    #[error(
        "scope name of {0} bytes is too long; at most {MAX_SCOPE_LEN} bytes (hash long keys, e.g. 'tenant:' plus a digest)"
    )]
    TooLong(usize),
    /// A character outside the charset.
    #[error(
        "scope name holds {0:?}; use only letters, digits and {SCOPE_PUNCTUATION} (like 'user:42' or 'tenant:acme/eu')"
    )]
    BadChar(char),
}

impl ScopeName {
    /// Checks a name as the client wrote it: surrounding whitespace and one pair of single quotes
    /// are not part of it (`SET lsngate.scope = 'user:42'`).
    pub fn parse(text: &str) -> Result<ScopeName, ScopeError> {
        let trimmed = text.trim();
        let name = trimmed
            .strip_prefix('\'')
            .and_then(|t| t.strip_suffix('\''))
            .unwrap_or(trimmed);
        if name.is_empty() {
            return Err(ScopeError::Empty);
        }
        if name.len() > MAX_SCOPE_LEN {
            return Err(ScopeError::TooLong(name.len()));
        }
        if let Some(bad) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || SCOPE_PUNCTUATION.contains(*c)))
        {
            return Err(ScopeError::BadChar(bad));
        }
        Ok(ScopeName(Arc::from(name)))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ScopeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The bounds of a [`ScopeFloors`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScopeLimits {
    /// Most scopes kept; the least recently used leaves first. At least 1.
    pub capacity: usize,
    /// A floor not raised for this long is forgotten.
    pub ttl: Duration,
}

/// Why a floor left the book.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    /// The book was full and the scope was the least recently used.
    Capacity,
    /// Not raised for the TTL.
    Expired,
}

#[derive(Debug, Clone)]
struct Entry {
    floor: Floor,
    raised: Instant,
    /// Position in `order`: larger is more recently used.
    used: u64,
}

/// Each scope's floor, bounded by [`ScopeLimits`]; see the module documentation.
#[derive(Debug, Default)]
pub struct ScopeFloors {
    entries: HashMap<ScopeName, Entry>,
    order: BTreeMap<u64, ScopeName>,
    next_use: u64,
    evicted_capacity: u64,
    expired: u64,
}

impl ScopeFloors {
    /// An empty book.
    pub fn new() -> ScopeFloors {
        ScopeFloors::default()
    }

    /// Raises `scope`'s floor to at least `floor` (max-merge: a late, lower position never lowers
    /// it) and restarts its TTL. Returns the floors this pushed out.
    pub fn raise(
        &mut self,
        scope: &ScopeName,
        floor: Floor,
        now: Instant,
        limits: ScopeLimits,
    ) -> Vec<Eviction> {
        let mut evicted = Vec::new();
        if let Some(expired) = self.expire(scope, now, limits) {
            evicted.push(expired);
        }
        let used = self.touch();
        match self.entries.get_mut(scope) {
            Some(entry) => {
                self.order.remove(&entry.used);
                entry.floor = entry.floor.max(floor);
                entry.raised = now;
                entry.used = used;
            }
            None => {
                self.entries.insert(
                    scope.clone(),
                    Entry {
                        floor,
                        raised: now,
                        used,
                    },
                );
            }
        }
        self.order.insert(used, scope.clone());
        evicted.extend(self.shrink(now, limits));
        evicted
    }

    /// `scope`'s floor, or `None` when the book does not know it (never raised, evicted or
    /// expired: the caller must then assume the worst). Marks it recently used.
    pub fn floor(
        &mut self,
        scope: &ScopeName,
        now: Instant,
        limits: ScopeLimits,
    ) -> (Option<Floor>, Option<Eviction>) {
        let expired = self.expire(scope, now, limits);
        let used = self.touch();
        let Some(entry) = self.entries.get_mut(scope) else {
            return (None, expired);
        };
        self.order.remove(&entry.used);
        entry.used = used;
        self.order.insert(used, scope.clone());
        (Some(entry.floor), expired)
    }

    /// Drops `scope`'s floor (its last commit position is unknown): its next reads assume the
    /// worst.
    pub fn forget(&mut self, scope: &ScopeName) {
        if let Some(entry) = self.entries.remove(scope) {
            self.order.remove(&entry.used);
        }
    }

    /// Scopes held now (expired ones included until they are looked at or pushed out).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no scope is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Floors that left so far: `(pushed out by the capacity, expired)`.
    pub fn evictions(&self) -> (u64, u64) {
        (self.evicted_capacity, self.expired)
    }

    fn touch(&mut self) -> u64 {
        self.next_use += 1;
        self.next_use
    }

    fn expire(&mut self, scope: &ScopeName, now: Instant, limits: ScopeLimits) -> Option<Eviction> {
        let entry = self.entries.get(scope)?;
        if now.saturating_duration_since(entry.raised) < limits.ttl {
            return None;
        }
        self.forget(scope);
        self.expired += 1;
        Some(Eviction::Expired)
    }

    /// Expired floors at the least-recently-used end go first, then whatever exceeds the cap.
    fn shrink(&mut self, now: Instant, limits: ScopeLimits) -> Vec<Eviction> {
        let mut evicted = Vec::new();
        while let Some((_, oldest)) = self.order.first_key_value() {
            let oldest = oldest.clone();
            let over = self.entries.len() > limits.capacity.max(1);
            if let Some(expired) = self.expire(&oldest, now, limits) {
                evicted.push(expired);
            } else if over {
                self.forget(&oldest);
                self.evicted_capacity += 1;
                evicted.push(Eviction::Capacity);
            } else {
                break;
            }
        }
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Lsn;
    use proptest::prelude::*;

    fn name(s: &str) -> ScopeName {
        ScopeName::parse(s).unwrap()
    }

    fn at(n: u64) -> Floor {
        Floor::at(Lsn::from(n))
    }

    const LIMITS: ScopeLimits = ScopeLimits {
        capacity: 2,
        ttl: Duration::from_secs(10),
    };

    #[test]
    fn names_are_checked_and_quotes_dropped() {
        assert_eq!(name("'user:42'").as_str(), "user:42");
        assert_eq!(
            name(" tenant:acme/eu-1.x@y_z ").as_str(),
            "tenant:acme/eu-1.x@y_z"
        );
        assert_eq!(ScopeName::parse("''"), Err(ScopeError::Empty));
        assert_eq!(ScopeName::parse("'user 42'"), Err(ScopeError::BadChar(' ')));
        assert_eq!(
            ScopeName::parse("x'; DROP TABLE t; --"),
            Err(ScopeError::BadChar('\''))
        );
        assert_eq!(ScopeName::parse("é"), Err(ScopeError::BadChar('é')));
        assert!(ScopeName::parse(&"a".repeat(MAX_SCOPE_LEN)).is_ok());
        assert_eq!(
            ScopeName::parse(&"a".repeat(MAX_SCOPE_LEN + 1)),
            Err(ScopeError::TooLong(MAX_SCOPE_LEN + 1))
        );
        let message = ScopeError::BadChar(' ').to_string();
        assert!(message.contains("letters, digits"), "{message}");
    }

    #[test]
    fn floors_only_rise_and_unknown_scopes_say_so() {
        let mut book = ScopeFloors::new();
        let now = Instant::now();
        let a = name("a");
        assert_eq!(book.floor(&a, now, LIMITS).0, None);
        book.raise(&a, at(100), now, LIMITS);
        book.raise(&a, at(50), now, LIMITS);
        assert_eq!(book.floor(&a, now, LIMITS).0, Some(at(100)));
        book.forget(&a);
        assert_eq!(book.floor(&a, now, LIMITS).0, None);
    }

    #[test]
    fn the_least_recently_used_scope_leaves_a_full_book() {
        let mut book = ScopeFloors::new();
        let now = Instant::now();
        let (a, b, c) = (name("a"), name("b"), name("c"));
        book.raise(&a, at(1), now, LIMITS);
        book.raise(&b, at(2), now, LIMITS);
        // A read of `a` makes `b` the least recently used.
        assert_eq!(book.floor(&a, now, LIMITS).0, Some(at(1)));
        assert_eq!(book.raise(&c, at(3), now, LIMITS), vec![Eviction::Capacity]);
        assert_eq!(book.floor(&b, now, LIMITS).0, None);
        assert_eq!(book.floor(&a, now, LIMITS).0, Some(at(1)));
        assert_eq!(book.len(), 2);
        assert_eq!(book.evictions(), (1, 0));
    }

    #[test]
    fn a_floor_expires_a_ttl_after_its_last_raise() {
        let mut book = ScopeFloors::new();
        let start = Instant::now();
        let a = name("a");
        book.raise(&a, at(1), start, LIMITS);
        let later = start + Duration::from_secs(9);
        assert_eq!(
            book.floor(&a, later, LIMITS).0,
            Some(at(1)),
            "reads do not extend it"
        );
        book.raise(&a, at(2), later, LIMITS);
        assert_eq!(
            book.floor(&a, later + Duration::from_secs(9), LIMITS).0,
            Some(at(2))
        );
        assert_eq!(
            book.floor(&a, later + LIMITS.ttl, LIMITS),
            (None, Some(Eviction::Expired))
        );
        assert_eq!(book.evictions(), (0, 1));
    }

    proptest! {
        /// Whatever the sequence, the book never holds more than its capacity, and a floor it
        /// reports is never below the highest raise of that scope since it last entered.
        #[test]
        fn the_book_stays_bounded_and_never_reports_a_lower_floor(
            ops in proptest::collection::vec((0u8..6, 0u64..1000, any::<bool>()), 0..200)
        ) {
            let limits = ScopeLimits { capacity: 3, ttl: Duration::from_secs(3600) };
            let mut book = ScopeFloors::new();
            let mut highest: HashMap<u8, u64> = HashMap::new();
            let now = Instant::now();
            for (scope, lsn, write) in ops {
                let s = name(&format!("s{scope}"));
                if write {
                    let present = book.entries.contains_key(&s);
                    book.raise(&s, at(lsn), now, limits);
                    let h = highest.entry(scope).or_insert(0);
                    *h = if present { (*h).max(lsn) } else { lsn };
                } else if let (Some(floor), _) = book.floor(&s, now, limits) {
                    prop_assert!(floor.lsn >= Lsn::from(highest[&scope]));
                } else {
                    highest.remove(&scope);
                }
                prop_assert!(book.len() <= 3);
                prop_assert_eq!(book.order.len(), book.entries.len());
            }
        }
    }
}
