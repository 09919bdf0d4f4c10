//! Causal scopes, proxy side: the one book of scope floors every client of this proxy shares
//! (`lsngate_core::ScopeFloors` behind a lock, bounded by `scope_capacity` and `scope_ttl_ms`
//! as the config says at each call, so a reload applies at once), and its counts for `/status`
//! and `/metrics`. Scope names are never a label value: only totals and outcomes are counted.
//!
//! Which scope a statement works under, and when a commit raises it, is the session's
//! (`frontend::scopes`); what a read under a scope the book does not hold does (it waits for the
//! primary's current position, like `universal`) is `frontend::causal`'s.

use std::sync::Mutex;
use std::time::Instant;

use lsngate_core::{Eviction, Floor, ScopeFloors, ScopeLimits, ScopeName};

use super::Outcome;
use crate::tally::Tally;

/// Where the floor of a read under a scope came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScopeFloorSource {
    /// The book held the scope's floor.
    Known,
    /// The book did not (never written under here, evicted, expired, or its last commit's
    /// position was lost): the read waited for the primary's current position.
    Unknown,
}

/// The scopes' floors and their counts.
#[derive(Debug)]
pub struct Scopes {
    book: Mutex<ScopeFloors>,
    /// `lsngate_proxy_scope_evictions_total{reason="capacity"|"ttl"}`.
    evictions: [Tally; 2],
    /// `lsngate_proxy_scope_reads_total{floor="known"|"unknown"}`.
    floors: [Tally; 2],
    /// `lsngate_proxy_scope_read_outcomes_total{outcome=…}`, as `Outcome::ALL`.
    outcomes: [Tally; 6],
    /// `lsngate_proxy_scope_raises_total`: commits that raised a scope's floor.
    raises: Tally,
}

impl Default for Scopes {
    fn default() -> Self {
        Scopes {
            book: Mutex::new(ScopeFloors::new()),
            evictions: ["capacity", "ttl"].map(|reason| {
                Tally::new(metrics::counter!(
                    "lsngate_proxy_scope_evictions_total",
                    "reason" => reason
                ))
            }),
            floors: ["known", "unknown"].map(|floor| {
                Tally::new(metrics::counter!(
                    "lsngate_proxy_scope_reads_total",
                    "floor" => floor
                ))
            }),
            outcomes: Outcome::ALL.map(|o| {
                Tally::new(metrics::counter!(
                    "lsngate_proxy_scope_read_outcomes_total",
                    "outcome" => o.as_str()
                ))
            }),
            raises: Tally::new(metrics::counter!("lsngate_proxy_scope_raises_total")),
        }
    }
}

impl Scopes {
    /// A commit made under `scope` reached `floor`.
    pub fn raise(&self, scope: &ScopeName, floor: Floor, limits: ScopeLimits) {
        let evicted =
            self.book
                .lock()
                .expect("scope book")
                .raise(scope, floor, Instant::now(), limits);
        self.raises.add(1);
        self.count_evictions(&evicted);
    }

    /// `scope`'s floor, `None` when the book does not hold it.
    pub fn floor(&self, scope: &ScopeName, limits: ScopeLimits) -> Option<Floor> {
        let (floor, expired) =
            self.book
                .lock()
                .expect("scope book")
                .floor(scope, Instant::now(), limits);
        self.count_evictions(expired.as_slice());
        floor
    }

    /// `scope`'s last commit position is unknown: its reads assume the worst until it is raised.
    pub fn forget(&self, scope: &ScopeName) {
        self.book.lock().expect("scope book").forget(scope);
    }

    /// Counts where a read's scope floor came from.
    pub fn record_floor(&self, source: ScopeFloorSource) {
        self.floors[source as usize].add(1);
    }

    /// Counts how a read under a scope ended.
    pub fn record_outcome(&self, outcome: Outcome) {
        let i = Outcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0);
        self.outcomes[i].add(1);
    }

    fn count_evictions(&self, evicted: &[Eviction]) {
        for e in evicted {
            let i = match e {
                Eviction::Capacity => 0,
                Eviction::Expired => 1,
            };
            self.evictions[i].add(1);
        }
    }

    /// Scopes held now.
    pub fn tracked(&self) -> usize {
        self.book.lock().expect("scope book").len()
    }

    /// Hands the counts since the last scrape to the metrics registry.
    pub fn report(&self) {
        self.evictions
            .iter()
            .chain(&self.floors)
            .chain(&self.outcomes)
            .chain([&self.raises])
            .for_each(Tally::report);
        metrics::gauge!("lsngate_proxy_scopes_tracked").set(self.tracked() as f64);
    }

    /// The scopes part of `/status`.
    pub fn status(&self, limits: ScopeLimits) -> serde_json::Value {
        let outcomes: serde_json::Map<_, _> = Outcome::ALL
            .iter()
            .zip(&self.outcomes)
            .map(|(o, n)| (o.as_str().to_string(), serde_json::json!(n.count())))
            .collect();
        serde_json::json!({
            "tracked": self.tracked(),
            "capacity": limits.capacity,
            "ttl_ms": limits.ttl.as_millis() as u64,
            "raises": self.raises.count(),
            "evictions": {
                "capacity": self.evictions[0].count(),
                "ttl": self.evictions[1].count(),
            },
            "reads": {
                "known_floor": self.floors[0].count(),
                "unknown_floor": self.floors[1].count(),
                "outcomes": outcomes,
            },
        })
    }
}
