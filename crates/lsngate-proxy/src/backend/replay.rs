//! What the proxy knows about replay: the replay knowledge shared with the library
//! (`lsngate_core::replay::ReplayBook`: per *server* replayed positions, the servers seen behind
//! each node, the primary's WAL clock), plus what only the proxy needs — which server each node's
//! monitor polls, reads waiting on those polls (PostgreSQL ≤ 18), and whether routing asked for
//! positions lately (the monitors' poll rate). Timelines are the nodes' own (`super::timeline`):
//! routing asks them first which replicas may serve.
//!
//! Fed by the node monitor's polls and by every wait, check and trailing position of a client
//! read. No I/O here, and no replay rule of its own: those are core's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lsngate_core::sync::lock;
use lsngate_core::{Lsn, ReplayBook, ReplicaState};
use tokio::time::Instant;

use super::timeline::Need;
use super::{NodeState, Nodes};

pub use lsngate_core::ServerId;

#[derive(Debug, Default)]
struct NodeView {
    /// The server the node monitor's own connection reached.
    monitored: Option<ServerId>,
    /// Reads waiting for this node's monitor to see their floor (PostgreSQL ≤ 18).
    waiters: usize,
}

/// Node `node`'s view, added (with those before it) when first seen.
fn view(views: &mut Vec<NodeView>, node: usize) -> &mut NodeView {
    if views.len() <= node {
        views.resize_with(node + 1, NodeView::default);
    }
    &mut views[node]
}

/// Replay knowledge shared by every session of a proxy.
#[derive(Debug)]
pub struct Watcher {
    /// Replay knowledge, its times since `origin`; slots are node indexes.
    book: Mutex<ReplayBook>,
    /// Per node index (dense, from 0): looked up on every read, so not hashed.
    nodes: Mutex<Vec<NodeView>>,
    origin: Instant,
    /// Woken at every replay observation, for reads waiting on the monitor's polls.
    replay_seen: tokio::sync::Notify,
    /// When routing last asked for replica positions (ms since `origin`, plus one; 0: never).
    consulted: AtomicU64,
}

/// Routing that asked for positions within this long keeps the monitors polling every
/// `replay_poll`; after it they poll at the health interval (see [`Watcher::in_demand`]).
pub const DEMAND_WINDOW: Duration = Duration::from_secs(10);

impl Default for Watcher {
    fn default() -> Self {
        Watcher {
            // The proxy's book samples visibility lags: /status, SHOW BUDGET and /budget advise
            // the wait budget from them.
            book: Mutex::new(ReplayBook::sampling_visibility()),
            nodes: Mutex::default(),
            origin: Instant::now(),
            replay_seen: tokio::sync::Notify::new(),
            consulted: AtomicU64::new(0),
        }
    }
}

/// One replica as routing and the dashboard see it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReplicaView {
    /// Node index in the config.
    pub node: usize,
    /// `host:port`.
    pub address: String,
    /// Lowest replayed position over the servers seen behind the address.
    pub replayed: Option<String>,
    /// Bytes behind the primary's last sampled position.
    pub lag_bytes: Option<u64>,
    /// Time since the primary first wrote WAL this replica lacks (0 when caught up).
    pub lag_ms: Option<f64>,
    /// Timeline the replica receives, when known (the last one seen while its receiver is down).
    pub timeline: Option<u32>,
    /// Its WAL receiver at the last poll: `streaming`, `hidden` (timeline not visible to the
    /// monitor's role), `down`, or `unseen`.
    pub receiver: &'static str,
    /// Distinct servers seen behind this address.
    pub servers_seen: usize,
}

impl Watcher {
    /// `server`, reached through node `node`, reported having replayed `lsn` (never lowers).
    pub fn observe_replayed(&self, node: usize, server: &ServerId, lsn: Lsn) {
        let now = self.since_origin(Instant::now());
        lock(&self.book).observe_replayed(node, server, lsn, now);
        self.replay_seen.notify_waiters();
    }

    /// Whether more than one server answered behind node `node` lately (a load balancer, or a
    /// restart): what a read there saw is then known only from a position taken behind it.
    pub fn several_servers(&self, node: usize) -> bool {
        let now = self.since_origin(Instant::now());
        lock(&self.book).several_servers(node, now)
    }

    /// The node monitor's connection reached `server`.
    pub fn observe_monitored(&self, node: usize, server: &ServerId) {
        view(&mut lock(&self.nodes), node).monitored = Some(server.clone());
    }

    /// Whether node `node`'s monitor polls `server` (so its polls can serve that server's waiters).
    pub fn monitors(&self, node: usize, server: &str) -> bool {
        lock(&self.nodes)
            .get(node)
            .and_then(|v| v.monitored.as_deref())
            .is_some_and(|m| m == server)
    }

    /// Waits until `server` (polled by node `node`'s monitor) is known to have replayed `floor`,
    /// or `deadline`. While it waits, the node counts a waiter, and its monitor polls fast.
    pub async fn wait_replayed(
        &self,
        node: usize,
        server: &str,
        floor: Lsn,
        deadline: Instant,
    ) -> bool {
        struct Waiting<'a>(&'a Watcher, usize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                if let Some(v) = lock(&self.0.nodes).get_mut(self.1) {
                    v.waiters = v.waiters.saturating_sub(1);
                }
            }
        }
        view(&mut lock(&self.nodes), node).waiters += 1;
        let _waiting = Waiting(self, node);
        loop {
            let seen = self.replay_seen.notified();
            if self.replayed(server).is_some_and(|r| r >= floor) {
                return true;
            }
            if crate::timer::timeout_at(deadline, seen).await.is_err() {
                return self.replayed(server).is_some_and(|r| r >= floor);
            }
        }
    }

    /// `now` as the book's time.
    fn since_origin(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.origin)
    }

    /// `now` as the `consulted` clock: ms since `origin`, plus one (0 means never).
    fn tick(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.origin).as_millis() as u64 + 1
    }

    /// Whether a consultation at tick `last` is within [`DEMAND_WINDOW`] of tick `now`.
    fn recent(last: u64, now: u64) -> bool {
        last != 0 && now.saturating_sub(last) <= DEMAND_WINDOW.as_millis() as u64
    }

    /// Notes that routing asked for positions at `now`; false when nobody had for
    /// [`DEMAND_WINDOW`] (the monitors were polling slowly until now).
    fn consulted_at(&self, now: Instant) -> bool {
        let tick = self.tick(now);
        Self::recent(self.consulted.swap(tick, Ordering::Relaxed), tick)
    }

    /// Whether routing asked for positions within [`DEMAND_WINDOW`]: the node monitors then
    /// poll every `replay_poll`, else at the health interval, so that a proxy whose reads need no
    /// positions (consistency `eventual`, no lag bound) does not query every node 50 times a
    /// second.
    pub fn in_demand(&self) -> bool {
        Self::recent(
            self.consulted.load(Ordering::Relaxed),
            self.tick(Instant::now()),
        )
    }

    /// Reads waiting on node `node`'s monitor right now.
    pub fn waiters(&self, node: usize) -> usize {
        lock(&self.nodes).get(node).map_or(0, |v| v.waiters)
    }

    /// The primary was at `lsn` at `when`.
    pub fn observe_primary(&self, when: Instant, lsn: Lsn) {
        let at = self.since_origin(when);
        lock(&self.book).observe_primary(at, lsn);
    }

    /// What `server` is known to have replayed.
    pub fn replayed(&self, server: &str) -> Option<Lsn> {
        lock(&self.book).replayed(server)
    }

    /// The primary's last sampled position.
    pub fn primary_position(&self) -> Option<Lsn> {
        lock(&self.book).primary_position()
    }

    /// How long ago the primary first wrote past `replayed` (zero when caught up). Unlike
    /// `now() - pg_last_xact_replay_timestamp()` this does not grow while the primary is idle.
    pub fn lag_behind(&self, replayed: Lsn, now: Instant) -> Option<Duration> {
        lock(&self.book).lag_behind(replayed, self.since_origin(now))
    }

    /// Lowest replayed position over the servers seen behind `node`.
    pub fn node_replayed(&self, node: usize) -> Option<Lsn> {
        let now = self.since_origin(Instant::now());
        lock(&self.book).slot_replayed(node, now)
    }

    /// Routing input: every node detected as a replica, with what is known of it (time lag only
    /// `with_lag`: it costs a walk over the WAL clock). A replica whose timeline does not admit
    /// `need` (an orphan, or one not known to be on the floor's history) counts as unhealthy
    /// for this read: `WAIT FOR LSN` and replay checks compare numbers only.
    pub fn replicas(
        &self,
        nodes: &Nodes,
        need: Need,
        with_lag: bool,
    ) -> Vec<(Arc<NodeState>, ReplicaState)> {
        let now = Instant::now();
        if !self.consulted_at(now) {
            // The monitors are polling slowly: wake them so that the next reads find fresh
            // positions (this one waits or checks, as any read does without them).
            nodes.all().iter().for_each(|n| n.request_check());
        }
        self.states(nodes, need, with_lag, now)
    }

    /// What [`Watcher::replicas`] returns, without counting as routing's demand for positions:
    /// for the pages and metrics that only look (a dashboard polling `/status` must not keep
    /// the monitors polling fast for a proxy whose reads need no positions).
    fn states(
        &self,
        nodes: &Nodes,
        need: Need,
        with_lag: bool,
        now: Instant,
    ) -> Vec<(Arc<NodeState>, ReplicaState)> {
        let all = nodes.all();
        let at = self.since_origin(now);
        // Locked once for every replica (it was once per replica, on every read).
        let book = lock(&self.book);
        all.iter()
            .filter(|n| n.role() == crate::backend::Role::Replica)
            .map(|n| {
                let (replayed, lag_bytes, lag) = {
                    let replayed = book.slot_replayed(n.index, at);
                    let lag = replayed
                        .filter(|_| with_lag)
                        .and_then(|r| book.lag_behind(r, at));
                    (replayed, replayed.and_then(|r| book.lag_bytes(r)), lag)
                };
                let state = ReplicaState {
                    healthy: nodes.serves(n, need),
                    role: crate::backend::Role::Replica,
                    replayed,
                    lag_bytes,
                    lag,
                    busy: n.busy(),
                };
                (Arc::clone(n), state)
            })
            .collect()
    }

    /// Every replica's address, replayed position and time lag, without counting as routing's
    /// demand for positions (unlike [`Watcher::replicas`]): a sampler reading this every 100 ms
    /// must not keep the monitors polling fast for a proxy whose reads need no positions.
    pub fn lags(&self, nodes: &Nodes) -> Vec<(String, Option<Lsn>, Option<Duration>)> {
        let at = self.since_origin(Instant::now());
        let book = lock(&self.book);
        nodes
            .all()
            .iter()
            .filter(|n| n.role() == crate::backend::Role::Replica)
            .map(|n| {
                let replayed = book.slot_replayed(n.index, at);
                let lag = replayed.and_then(|r| book.lag_behind(r, at));
                (n.url.address(), replayed, lag)
            })
            .collect()
    }

    /// Every replica's visibility-lag samples (how long each newly replayed write took to show
    /// there, see `ReplayBook::observe_replayed`) and how far back the oldest reaches (the
    /// window they cover): the budget advice's input.
    pub fn visible_lags(&self, nodes: &Nodes) -> (Vec<lsngate_core::budget::ReplicaLag>, Duration) {
        let at = self.since_origin(Instant::now());
        let book = lock(&self.book);
        let replicas: Vec<_> = nodes
            .all()
            .iter()
            .filter(|n| n.role() == crate::backend::Role::Replica)
            .cloned()
            .collect();
        let lags = replicas
            .iter()
            .map(|n| lsngate_core::budget::ReplicaLag {
                name: n.url.address(),
                samples: book.visible_lags(n.index, at),
            })
            .collect();
        let reach = replicas
            .iter()
            .filter_map(|n| book.visible_reach(n.index, at))
            .max()
            .unwrap_or_default();
        (lags, reach)
    }

    /// Snapshot of every replica, for `/status`, metrics and the dashboard.
    pub fn views(&self, nodes: &Nodes) -> Vec<ReplicaView> {
        let now = Instant::now();
        self.states(nodes, Need::Any, false, Instant::now())
            .into_iter()
            .map(|(node, state)| ReplicaView {
                node: node.index,
                address: node.url.address(),
                replayed: state.replayed.map(|l| l.to_string()),
                lag_bytes: state.lag_bytes,
                lag_ms: state
                    .replayed
                    .and_then(|r| self.lag_behind(r, now))
                    .map(|d| d.as_secs_f64() * 1000.0),
                timeline: node.timeline.get().last_known,
                receiver: node.timeline.get().receiver.as_str(),
                servers_seen: lock(&self.book).servers_seen(node.index),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_only_rise_and_stay_with_their_server() {
        let watcher = Watcher::default();
        let (a, b): (ServerId, ServerId) = ("a".into(), "b".into());
        watcher.observe_replayed(1, &a, Lsn::new(100));
        watcher.observe_replayed(1, &a, Lsn::new(50));
        assert_eq!(watcher.replayed("a"), Some(Lsn::new(100)));
        assert_eq!(
            watcher.replayed("b"),
            None,
            "A's position says nothing of B"
        );
        watcher.observe_replayed(1, &b, Lsn::new(70));
        assert_eq!(
            watcher.node_replayed(1),
            Some(Lsn::new(70)),
            "an address fronting two servers routes on the lower one"
        );
    }

    #[tokio::test]
    async fn waiters_are_counted_and_woken_by_the_monitors_observation() {
        let watcher = std::sync::Arc::new(Watcher::default());
        let server: ServerId = "a".into();
        watcher.observe_monitored(1, &server);
        assert!(watcher.monitors(1, "a") && !watcher.monitors(1, "b"));
        let waiting = {
            let watcher = std::sync::Arc::clone(&watcher);
            tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(10);
                watcher.wait_replayed(1, "a", Lsn::new(100), deadline).await
            })
        };
        while watcher.waiters(1) == 0 {
            tokio::task::yield_now().await;
        }
        watcher.observe_replayed(1, &server, Lsn::new(99));
        watcher.observe_replayed(1, &server, Lsn::new(100));
        assert!(waiting.await.unwrap(), "woken once the floor was observed");
        assert_eq!(watcher.waiters(1), 0, "the waiter unregistered");
        let deadline = Instant::now() + Duration::from_millis(20);
        assert!(!watcher.wait_replayed(1, "a", Lsn::new(500), deadline).await);
    }

    #[test]
    fn lag_comes_from_the_primary_wal_clock() {
        let watcher = Watcher::default();
        let start = Instant::now();
        watcher.observe_primary(start, Lsn::new(100));
        watcher.observe_primary(start + Duration::from_secs(1), Lsn::new(200));
        let now = start + Duration::from_secs(3);
        assert_eq!(watcher.lag_behind(Lsn::new(200), now), Some(Duration::ZERO));
        assert_eq!(
            watcher.lag_behind(Lsn::new(150), now),
            Some(Duration::from_secs(2))
        );
    }
}
