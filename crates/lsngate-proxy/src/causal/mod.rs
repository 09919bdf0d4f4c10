//! Causal reads: read-your-writes for every client of the proxy. This module holds what all
//! sessions share — the work done with the consistency settings (the settings themselves are
//! `config::causal`), the replay [`Watcher`] (the server side's, `backend::replay`), the primary guard, the read statistics,
//! the proxy-wide commit floor (`global`), the coalesced primary position (`universal`) and the
//! causal scopes' floors (`scopes`) — plus the statements the proxy adds to a backend flight
//! (`sql`). Per-client floors and the read
//! path live in `frontend::causal`.

pub mod history;
pub mod scopes;
pub mod sql;
pub mod stats;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use lsngate_core::{Lsn, Refusal, SharedGuard, Token};
use tokio::time::Instant;

pub use history::History;
pub use lsngate_core::Floor;
pub use scopes::{ScopeFloorSource, Scopes};
pub use stats::{Outcome, Stats};

use crate::backend::replay::Watcher;
use crate::backend::{BackendConn, Nodes};
use crate::config::CausalConfig;

/// SQLSTATE of "no replica reached the read's floor within the budget" (fallback = error).
pub const SQLSTATE_NOT_CAUGHT_UP: &str = "LG001";
/// SQLSTATE of "the primary guard refused a fallback read" (cap or breaker).
pub const SQLSTATE_GUARDED: &str = "LG002";

/// What the proxy does with its causal settings: the type is `config`'s (pure settings, a leaf),
/// the work with floors and tokens is here.
impl CausalConfig {
    /// Parses a floor given by a client: a plain `X/Y` LSN (unless only signed tokens are
    /// accepted) or a token from the HTTP helpers (`X/Y.t1.e….s…`).
    pub fn parse_floor(&self, text: &str) -> Result<Floor, String> {
        let value = text.trim().trim_matches('\'');
        let token: Token = self
            .tokens
            .verify(value, SystemTime::now())
            .map_err(|e| format!("invalid lsngate.min_lsn {value:?}: {e}"))?;
        Ok(token.floor())
    }

    /// Reads a scope given by a client (SET, comment, startup options): a name, or a scope
    /// signed with the token secret — which `require_signed_scopes` makes the only kind taken.
    pub fn parse_scope(&self, text: &str) -> Result<lsngate_core::ScopeName, String> {
        self.tokens
            .verify_scope(text, self.require_signed_scopes, SystemTime::now())
            .map_err(|e| e.to_string())
    }

    /// The token for a commit floor: its position with the primary's timeline (`X/Y.tN`), signed
    /// when a key is configured. Unlike a bare `X/Y`, it still means the same after a failover,
    /// whoever reads it, whenever (see `backend::timeline`). `None` for an unsigned floor with no
    /// timeline (nothing to add to `lsngate.commit_lsn`).
    pub fn issue(&self, floor: Floor) -> Option<String> {
        let mut token = Token::new(floor.lsn);
        match floor.timeline {
            Some(t) => token = token.with_timeline(t),
            None if !self.signed => return None,
            None => {}
        }
        Some(self.tokens.issue(&token, SystemTime::now()))
    }
}

/// Causal state shared by every session of one proxy.
#[derive(Debug)]
pub struct Causal {
    /// Replay knowledge.
    pub watcher: Watcher,
    /// Read outcomes and waits.
    pub stats: Stats,
    /// Each causal scope's floor.
    pub scopes: Scopes,
    /// The last 15 minutes, for the dashboard's charts.
    pub history: History,
    guard: SharedGuard,
    origin: Instant,
    global: Mutex<Option<Floor>>,
    /// Commits acknowledged through the proxy whose position was lost (counted from 1), and
    /// the highest count a primary position raising `global` has covered since.
    global_unknown: AtomicU64,
    global_unknown_covered: AtomicU64,
    universal: tokio::sync::Mutex<Option<(u64, Floor)>>,
    universal_started: AtomicU64,
    universal_conn: tokio::sync::Mutex<Option<BackendConn>>,
}

impl Causal {
    /// Fresh state with the guard limits of `config`.
    pub fn new(config: &CausalConfig) -> Causal {
        Causal {
            watcher: Watcher::default(),
            stats: Stats::default(),
            scopes: Scopes::default(),
            history: History::default(),
            guard: SharedGuard::new(config.guard),
            origin: Instant::now(),
            global: Mutex::new(None),
            global_unknown: AtomicU64::new(0),
            global_unknown_covered: AtomicU64::new(0),
            universal: tokio::sync::Mutex::new(None),
            universal_started: AtomicU64::new(0),
            universal_conn: tokio::sync::Mutex::new(None),
        }
    }

    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// Counts a finished read (for the statistics and the breaker's rate). A read no replica was
    /// up to serve is not the breaker's business: it limits fallbacks from replicas that lag, and
    /// with none up there is no choice to limit (counting those would show the breaker open on a
    /// primary-only proxy, and refuse fallbacks just after the replicas return).
    pub fn record(&self, outcome: Outcome) {
        self.stats.record(outcome);
        if outcome == Outcome::NoReplica {
            return;
        }
        self.guard.record(self.now(), outcome == Outcome::Fallback);
    }

    /// Asks for a primary slot for one fallback read; on `Ok` call [`Causal::release`] after.
    /// A refusal is counted here and logged by the caller, once per read (a read queueing for a
    /// slot asks every few milliseconds).
    pub fn admit(&self) -> Result<(), Refusal> {
        let result = self.guard.try_admit(self.now());
        if result.is_err() {
            metrics::counter!("lsngate_proxy_guard_refusals_total").increment(1);
        }
        result
    }

    /// Returns a slot from [`Causal::admit`].
    pub fn release(&self) {
        self.guard.release();
    }

    /// `(breaker open, fallbacks in flight, fallback rate)` for status and metrics.
    pub fn guard_state(&self) -> (bool, usize, f64) {
        let status = self.guard.status(self.now());
        (status.breaker_open, status.in_flight, status.fallback_rate)
    }

    /// One tick of the history sampler: replay lag, statistics totals and the breaker now.
    pub fn observe_history(&self, nodes: &Nodes) {
        let count = |name: &str| {
            self.stats
                .outcomes()
                .into_iter()
                .filter(|(o, _)| name.is_empty() || *o == name)
                .map(|(_, n)| n)
                .sum::<u64>()
        };
        let waits = self.stats.waits().0.iter().map(|(_, n)| n).sum();
        self.history.observe(history::Observation {
            now: Instant::now(),
            lags: self
                .watcher
                .lags(nodes)
                .into_iter()
                .map(|(address, _, lag)| (address, lag))
                .collect(),
            totals: history::Totals {
                reads: count(""),
                waits,
                fallbacks: count(Outcome::Fallback.as_str()),
            },
            breaker_open: self.guard_state().0,
        });
    }

    /// Raises the proxy-wide floor with a commit made through the proxy.
    pub fn committed(&self, floor: Floor) {
        let mut global = self.global.lock().expect("global lock");
        *global = Floor::merge(*global, Some(floor));
    }

    /// A commit acknowledged through the proxy whose position was lost: the proxy-wide floor
    /// misses it until [`Causal::global_covered`] raises it with a primary position taken after
    /// this call.
    pub fn committed_unknown(&self) {
        self.global_unknown.fetch_add(1, Ordering::SeqCst);
    }

    /// When some commit of unknown position is not yet under the proxy-wide floor: the mark to
    /// hand to [`Causal::global_covered`] with a primary position taken after this call.
    pub fn global_uncovered(&self) -> Option<u64> {
        let marked = self.global_unknown.load(Ordering::SeqCst);
        (self.global_unknown_covered.load(Ordering::SeqCst) < marked).then_some(marked)
    }

    /// Raises the proxy-wide floor to `floor`, a primary position taken after
    /// [`Causal::global_uncovered`] gave `mark`: past every commit of unknown position up to it.
    pub fn global_covered(&self, mark: u64, floor: Floor) {
        self.committed(floor);
        self.global_unknown_covered
            .fetch_max(mark, Ordering::SeqCst);
    }

    /// Every commit made through this proxy so far (see [`Causal::global_uncovered`] for those
    /// whose position was lost).
    pub fn global_floor(&self) -> Option<Floor> {
        *self.global.lock().expect("global lock")
    }

    /// The primary's position, taken after this call began: every write committed on the primary
    /// before the call is below it. Concurrent callers share one query: a caller takes the result
    /// of a query that *started* after it arrived, so at most two query times pass.
    pub async fn primary_position(
        &self,
        nodes: &Nodes,
        connect_timeout: Duration,
    ) -> anyhow::Result<Floor> {
        let arrival = self.universal_started.load(Ordering::SeqCst);
        let mut last = self.universal.lock().await;
        if let Some((started, floor)) = *last
            && started > arrival
        {
            return Ok(floor);
        }
        let ticket = self.universal_started.fetch_add(1, Ordering::SeqCst) + 1;
        let floor = self.query_primary(nodes, connect_timeout).await?;
        *last = Some((ticket, floor));
        Ok(floor)
    }

    async fn query_primary(
        &self,
        nodes: &Nodes,
        connect_timeout: Duration,
    ) -> anyhow::Result<Floor> {
        let mut slot = self.universal_conn.lock().await;
        for attempt in 0..2 {
            if slot.is_none() {
                let node = nodes.primary().ok_or_else(|| {
                    anyhow::anyhow!("no primary is reachable to read its WAL position")
                })?;
                let conn = BackendConn::connect(
                    node.index,
                    &node.url,
                    None,
                    &node.url.database,
                    connect_timeout,
                )
                .await?;
                *slot = Some(conn);
            }
            let conn = slot.as_mut().expect("connected");
            match conn
                .query_row(lsngate_core::probe::INSERT_POSITION_SQL)
                .await
            {
                Ok(row) => {
                    let lsn = row
                        .first()
                        .cloned()
                        .flatten()
                        .and_then(|t| Lsn::parse(&t).ok())
                        .ok_or_else(|| anyhow::anyhow!("the primary returned no WAL position"))?;
                    return Ok(Floor {
                        lsn: conn.facts.reachable(lsn),
                        timeline: conn.facts.timeline,
                    });
                }
                Err(e) if attempt == 0 => {
                    tracing::debug!("universal position connection lost, reconnecting: {e}");
                    *slot = None;
                }
                Err(e) => return Err(e.into()),
            }
        }
        unreachable!("the loop returns on its second attempt")
    }
}
