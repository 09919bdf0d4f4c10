//! Causal scopes, proxy side: the one book of scope floors every client of this proxy shares
//! (`lsngate_core::ScopeFloors` behind a lock, bounded by `scope_capacity` and `scope_ttl_ms`
//! as the config says at each call, so a reload applies at once), the floors shared with other
//! proxies through Redis when `scope_store` is set (`lsngate_store::RedisTokenStore`, the
//! atomic max-merge store lsngate-http keeps its users' tokens in, under keys
//! `lsngate:scope:<name>`), and their counts for `/status` and `/metrics`. Scope names are never a
//! label value: only totals and outcomes are counted.
//!
//! Every call to Redis is bounded by the caller (the proxy's runtime has no tokio timers, so the
//! connection sets none of its own), and a connection that failed is dropped and opened again
//! at the next call.
//!
//! Which scope a statement works under, and when a commit raises it, is the session's
//! (`frontend::scopes`); what a read under a scope the book does not hold does (it waits for the
//! primary's current position, like `universal`) is `frontend::causal`'s.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use lsngate_core::{Eviction, Floor, ScopeFloors, ScopeLimits, ScopeName, Token};
use lsngate_store::{RedisTokenStore, TokenStore};

use super::Outcome;
use crate::tally::Tally;

/// `url` without its credentials (`redis://:secret@host:6379/0` → `redis://…@host:6379/0`).
fn redacted(url: &str) -> String {
    match url.rsplit_once('@') {
        Some((_, host)) => format!("redis://…@{host}"),
        None => url.to_string(),
    }
}

/// Where the floor of a read under a scope came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScopeFloorSource {
    /// The book held the scope's floor.
    Known,
    /// The book did not (never written under here, evicted, expired, or its last commit's
    /// position was lost): the read waited for the primary's current position.
    Unknown,
}

/// What is done with Redis, for its counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedOp {
    /// A read under a scope asked for its floor.
    Load,
    /// A commit under a scope raised it (or a read seeded it).
    Save,
    /// A commit's position was lost: the scope's floor is dropped.
    Remove,
}

impl SharedOp {
    const ALL: [SharedOp; 3] = [SharedOp::Load, SharedOp::Save, SharedOp::Remove];

    fn as_str(self) -> &'static str {
        match self {
            SharedOp::Load => "load",
            SharedOp::Save => "save",
            SharedOp::Remove => "remove",
        }
    }
}

/// The scopes' floors and their counts.
#[derive(Debug)]
pub struct Scopes {
    book: Mutex<ScopeFloors>,
    /// The Redis of `scope_store`, once connected: its URL and the store.
    shared: Mutex<Option<(String, RedisTokenStore)>>,
    /// `lsngate_proxy_scope_store_calls_total{op}` and `…_errors_total{op}`, as `SharedOp::ALL`.
    shared_calls: [Tally; 3],
    shared_errors: [Tally; 3],
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
            shared: Mutex::new(None),
            shared_calls: SharedOp::ALL.map(|op| {
                Tally::new(metrics::counter!(
                    "lsngate_proxy_scope_store_calls_total",
                    "op" => op.as_str()
                ))
            }),
            shared_errors: SharedOp::ALL.map(|op| {
                Tally::new(metrics::counter!(
                    "lsngate_proxy_scope_store_errors_total",
                    "op" => op.as_str()
                ))
            }),
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

    /// `scope`'s floor in the Redis at `url`: `Ok(None)` when Redis holds none (never written,
    /// or past its TTL there).
    pub async fn load_shared(
        &self,
        url: &str,
        scope: &ScopeName,
        bound: Duration,
    ) -> Result<Option<Floor>, String> {
        let token = self
            .call_shared(url, SharedOp::Load, bound, |store| async move {
                store.load(scope.as_str()).await
            })
            .await?;
        Ok(token.map(|t| t.floor()))
    }

    /// Raises `scope`'s floor in the Redis at `url` to at least `floor` (atomic max-merge), kept
    /// `ttl` from now.
    pub async fn save_shared(
        &self,
        url: &str,
        scope: &ScopeName,
        floor: Floor,
        ttl: Duration,
        bound: Duration,
    ) -> Result<(), String> {
        let mut token = Token::new(floor.lsn);
        if let Some(timeline) = floor.timeline {
            token = token.with_timeline(timeline);
        }
        self.call_shared(url, SharedOp::Save, bound, |store| async move {
            store.save(scope.as_str(), token, ttl).await
        })
        .await
    }

    /// Drops `scope`'s floor from the Redis at `url`: every proxy's next read under it waits for
    /// the primary's position.
    pub async fn remove_shared(
        &self,
        url: &str,
        scope: &ScopeName,
        bound: Duration,
    ) -> Result<(), String> {
        self.call_shared(url, SharedOp::Remove, bound, |store| async move {
            store.remove(scope.as_str()).await
        })
        .await
    }

    /// One call to Redis, connecting first if needed, within `bound` altogether.
    async fn call_shared<T, F, Fut>(
        &self,
        url: &str,
        op: SharedOp,
        bound: Duration,
        call: F,
    ) -> Result<T, String>
    where
        F: FnOnce(RedisTokenStore) -> Fut,
        Fut: std::future::Future<Output = Result<T, lsngate_store::StoreError>>,
    {
        self.shared_calls[op as usize].add(1);
        let attempt = async {
            let store = self.shared_store(url).await?;
            call(store).await.map_err(|e| e.to_string())
        };
        let result = match crate::timer::timeout(bound, attempt).await {
            Ok(result) => result,
            Err(_) => Err(format!(
                "scope store: no answer from Redis at {url} within {} ms",
                bound.as_millis()
            )),
        };
        if let Err(e) = &result {
            self.shared_errors[op as usize].add(1);
            // Opened again at the next call (a connection that failed once may be broken).
            *self.shared.lock().expect("scope store slot") = None;
            tracing::warn!("{e}");
        }
        result
    }

    async fn shared_store(&self, url: &str) -> Result<RedisTokenStore, String> {
        if let Some((connected, store)) = self.shared.lock().expect("scope store slot").as_ref()
            && connected == url
        {
            return Ok(store.clone());
        }
        let store = RedisTokenStore::connect_without_timers(url)
            .await
            .map_err(|e| format!("scope store: {e}"))?
            .with_prefix(lsngate_store::SCOPE_PREFIX);
        *self.shared.lock().expect("scope store slot") = Some((url.to_string(), store.clone()));
        Ok(store)
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
            .chain(&self.shared_calls)
            .chain(&self.shared_errors)
            .chain([&self.raises])
            .for_each(Tally::report);
        metrics::gauge!("lsngate_proxy_scopes_tracked").set(self.tracked() as f64);
    }

    /// The scopes part of `/status` (`store`: the `scope_store` URL, if any).
    pub fn status(&self, limits: ScopeLimits, store: Option<&str>) -> serde_json::Value {
        let shared: serde_json::Map<_, _> = SharedOp::ALL
            .iter()
            .map(|op| {
                (
                    op.as_str().to_string(),
                    serde_json::json!({
                        "calls": self.shared_calls[*op as usize].count(),
                        "errors": self.shared_errors[*op as usize].count(),
                    }),
                )
            })
            .collect();
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
            "store": store.map(|url| serde_json::json!({"url": redacted(url), "calls": shared})),
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
