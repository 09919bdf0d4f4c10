//! The server side: connections (`conn`), pools per (node, database, role) (`pool`), the
//! health/role monitor (`monitor`) and what each server has replayed (`replay`, fed by the
//! monitor and by client reads). `Nodes` holds what is known about every configured server —
//! its role as detected with `pg_is_in_recovery()`, not as configured — and picks one for a
//! target. It never parses client SQL.

pub mod auth_lookup;
pub mod clock;
pub mod conn;
pub mod gates;
pub mod monitor;
pub mod pool;
pub mod replay;
pub mod settings;
pub mod sever;
pub mod timeline;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub use conn::{BackendConn, BackendError, CancelKey, Settings};
pub use pool::{Pool, PoolError, PooledConn};

use crate::config::{NodeUrl, PoolLimits, ServerLogin};

/// A node's detected role: core's one role model (`Unknown`, `Primary`, `Replica`).
pub use lsngate_core::Role;

/// What the router needs: the primary, or a replica (falling back to the primary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The node currently detected as primary.
    Primary,
    /// The least busy healthy replica; the primary when there is none.
    Replica,
}

/// One configured server and its pools.
#[derive(Debug)]
pub struct NodeState {
    /// Position in the config (0 = configured primary).
    pub index: usize,
    /// Where and as whom to connect.
    pub url: NodeUrl,
    role: AtomicU8,
    healthy: AtomicBool,
    /// Last health-check error, for /status.
    pub last_error: Mutex<Option<String>>,
    pools: Mutex<HashMap<PoolKey, Arc<Pool>>>,
    /// Wakes the node's monitor for an immediate re-check (a wait said `not in recovery`).
    pub recheck: tokio::sync::Notify,
    /// Removed from the config by a reload: its monitor stops, nothing new is routed to it.
    retired: AtomicBool,
    /// Health and position polls made so far, for /status.
    pub polls: AtomicU64,
    /// The monitor's wait before its next poll, in ms (see `monitor::poll_period`), for /status.
    pub poll_period_ms: AtomicU64,
    /// Server connections of this node in use now, all its pools together (kept by the pools).
    busy: Arc<AtomicUsize>,
    /// The timeline it was last seen on, and its WAL receiver (see [`timeline`]).
    pub timeline: timeline::TimelineCell,
    /// Every open server connection to it, to shut down when it stops answering.
    pub connections: Arc<sever::Severables>,
    /// PAUSE and DISABLE of the admin console, shared by every node.
    gates: Arc<gates::Gates>,
    /// False for a member the topology source tags `noloadbalance`: it gets no reads.
    reads: AtomicBool,
}

impl NodeState {
    /// The detected role.
    pub fn role(&self) -> Role {
        match self.role.load(Ordering::Relaxed) {
            1 => Role::Primary,
            2 => Role::Replica,
            _ => Role::Unknown,
        }
    }

    /// Marks the node removed: its monitor stops at its next wake-up and idle connections close.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
        self.healthy.store(false, Ordering::Relaxed);
        self.pools
            .lock()
            .expect("pools lock")
            .values()
            .for_each(|p| p.clear_idle());
        self.recheck.notify_one();
    }

    /// Whether reads may go to this node (false: tagged `noloadbalance` by Patroni).
    pub fn takes_reads(&self) -> bool {
        self.reads.load(Ordering::Relaxed)
    }

    /// Lets reads go to this node, or not.
    pub fn set_reads(&self, reads: bool) {
        if self.reads.swap(reads, Ordering::Relaxed) != reads {
            tracing::warn!(node = %self.url.address(), reads, "node's reads changed by its tags");
        }
    }

    /// Whether a reload removed this node.
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Relaxed)
    }

    /// Asks the monitor to poll this node now (its role may have changed).
    pub fn request_check(&self) {
        self.recheck.notify_one();
    }

    /// Server connections of this node in use now (lent out by its pools): the load reads are
    /// balanced by.
    pub fn busy(&self) -> usize {
        self.busy.load(Ordering::Relaxed)
    }

    /// Whether the last health check (or connection attempt) succeeded.
    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Records a health-check result.
    pub fn set_health(&self, role: Option<Role>, error: Option<String>) {
        if let Some(role) = role {
            let code = match role {
                Role::Unknown => 0,
                Role::Primary => 1,
                Role::Replica => 2,
            };
            let old = self.role.swap(code, Ordering::Relaxed);
            if old != code && old != 0 {
                tracing::warn!(node = %self.url.address(), ?role, "node changed role");
                self.pools
                    .lock()
                    .expect("pools lock")
                    .values()
                    .for_each(|p| p.clear_idle());
            }
        }
        self.healthy.store(error.is_none(), Ordering::Relaxed);
        *self.last_error.lock().expect("error lock") = error;
    }

    /// The pool for `database` as `login` (None: the URL's user), created on first use with
    /// `limits`; an existing pool takes over the idle timeout and lifetime of `limits` (its size
    /// stays).
    pub fn pool(
        &self,
        database: &str,
        login: Option<&ServerLogin>,
        limits: PoolLimits,
    ) -> Arc<Pool> {
        let key = PoolKey {
            database: database.to_string(),
            login: login.cloned(),
        };
        let role = login.map_or(&self.url.user, |l| &l.user);
        let mut pools = self.pools.lock().expect("pools lock");
        if let Some(pool) = pools.get(&key) {
            pool.set_limits(limits);
            return Arc::clone(pool);
        }
        let pool = Pool::new(
            self.index,
            database,
            role,
            limits,
            Arc::clone(&self.busy),
            Arc::clone(&self.connections),
        );
        if self.gates.is_paused(database) {
            pool.set_paused(true);
        }
        pools.insert(key, Arc::clone(&pool));
        pool
    }

    /// The pool for `database` as `login`, if one was made.
    pub fn existing_pool(&self, database: &str, login: Option<&ServerLogin>) -> Option<Arc<Pool>> {
        let key = PoolKey {
            database: database.to_string(),
            login: login.cloned(),
        };
        self.pools.lock().expect("pools lock").get(&key).cloned()
    }

    /// Forgets the pool for `database` as `login` if it never opened a connection and lends
    /// none: a login the server refused (no such database) leaves no pool behind.
    pub fn drop_unused_pool(&self, database: &str, login: Option<&ServerLogin>) {
        let key = PoolKey {
            database: database.to_string(),
            login: login.cloned(),
        };
        let mut pools = self.pools.lock().expect("pools lock");
        if pools.get(&key).is_some_and(|p| p.is_unused()) {
            pools.remove(&key);
        }
    }

    /// Every pool of this node.
    pub fn pools(&self) -> Vec<Arc<Pool>> {
        self.pools
            .lock()
            .expect("pools lock")
            .values()
            .cloned()
            .collect()
    }

    /// Every pool's figures, by database and role.
    pub fn pool_stats(&self) -> Vec<PoolStats> {
        let pools = self.pools.lock().expect("pools lock");
        let mut stats: Vec<_> = pools
            .iter()
            .map(|(key, p)| {
                let (open, idle, size) = p.stats();
                PoolStats {
                    database: key.database.clone(),
                    role: p.role().to_string(),
                    open,
                    idle,
                    size,
                }
            })
            .collect();
        stats.sort_by(|a, b| (&a.database, &a.role).cmp(&(&b.database, &b.role)));
        stats
    }
}

/// What a node's pools are told apart by: the database, and who the connections log in as — the
/// node URL's user, or a user's `server_user` with its password (so two users naming one role
/// with different passwords never share connections one of them could not open).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PoolKey {
    database: String,
    login: Option<ServerLogin>,
}

/// One pool's figures, for /status and /metrics.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PoolStats {
    /// Database its connections are logged into.
    pub database: String,
    /// Role they log in as.
    pub role: String,
    /// Connections open (idle or lent).
    pub open: usize,
    /// Connections idle in the pool.
    pub idle: usize,
    /// Most connections it may open.
    pub size: usize,
}

/// Every configured node. The list is replaced as a whole when a reload changes it; a node whose
/// URL stays keeps its state, pools and index.
#[derive(Debug)]
pub struct Nodes {
    current: std::sync::RwLock<Arc<Vec<Arc<NodeState>>>>,
    next_index: std::sync::atomic::AtomicUsize,
    /// The newest timeline a primary was seen writing: replicas behind it are orphans.
    pub newest_timeline: timeline::NewestTimeline,
    /// Databases paused or disabled on the admin console.
    pub gates: Arc<gates::Gates>,
}

fn node_state(index: usize, url: &NodeUrl, gates: &Arc<gates::Gates>) -> Arc<NodeState> {
    Arc::new(NodeState {
        index,
        url: url.clone(),
        role: AtomicU8::new(0),
        healthy: AtomicBool::new(false),
        last_error: Mutex::new(None),
        pools: Mutex::new(HashMap::new()),
        recheck: tokio::sync::Notify::new(),
        retired: AtomicBool::new(false),
        polls: AtomicU64::new(0),
        poll_period_ms: AtomicU64::new(0),
        busy: Arc::new(AtomicUsize::new(0)),
        timeline: timeline::TimelineCell::default(),
        connections: Arc::default(),
        gates: Arc::clone(gates),
        reads: AtomicBool::new(true),
    })
}

impl Nodes {
    /// Nodes for these URLs (indexes 0.. in config order), roles unknown until the first check.
    pub fn new(urls: &[NodeUrl]) -> Nodes {
        let gates = Arc::new(gates::Gates::default());
        let all = urls
            .iter()
            .enumerate()
            .map(|(index, url)| node_state(index, url, &gates))
            .collect();
        Nodes {
            gates,
            current: std::sync::RwLock::new(Arc::new(all)),
            next_index: std::sync::atomic::AtomicUsize::new(urls.len()),
            newest_timeline: timeline::NewestTimeline::default(),
        }
    }

    /// The nodes now, in config order (a snapshot).
    pub fn all(&self) -> Arc<Vec<Arc<NodeState>>> {
        Arc::clone(&self.current.read().expect("nodes lock"))
    }

    /// The node with this index, while it is configured.
    pub fn get(&self, index: usize) -> Option<Arc<NodeState>> {
        self.all().iter().find(|n| n.index == index).cloned()
    }

    /// Replaces the node list with `urls`: nodes whose URL stays are kept (state, pools, index),
    /// new URLs get new nodes, the others are retired (their monitors stop, idle connections
    /// close; connections in use finish their work). Returns (added, retired).
    pub fn replace(&self, urls: &[NodeUrl]) -> (Vec<Arc<NodeState>>, Vec<Arc<NodeState>>) {
        let mut current = self.current.write().expect("nodes lock");
        let mut added = Vec::new();
        let next: Vec<Arc<NodeState>> = urls
            .iter()
            .map(|url| match current.iter().find(|n| &n.url == url) {
                Some(kept) => Arc::clone(kept),
                None => {
                    let index = self.next_index.fetch_add(1, Ordering::Relaxed);
                    let node = node_state(index, url, &self.gates);
                    added.push(Arc::clone(&node));
                    node
                }
            })
            .collect();
        let retired: Vec<Arc<NodeState>> = current
            .iter()
            .filter(|n| !next.iter().any(|k| k.index == n.index))
            .cloned()
            .collect();
        for node in &retired {
            node.retire();
        }
        *current = Arc::new(next);
        (added, retired)
    }

    /// Every pool of `database` (None: of every database) on every node.
    pub fn pools_of(&self, database: Option<&str>) -> Vec<Arc<Pool>> {
        self.all()
            .iter()
            .flat_map(|node| node.pools())
            .filter(|pool| database.is_none_or(|db| pool.database() == db))
            .collect()
    }

    /// PAUSE: new checkouts of `database` (None: every database) queue until [`Nodes::resume`].
    pub fn pause(&self, database: Option<&str>) {
        self.gates.pause(database);
        for pool in self.pools_of(database) {
            pool.set_paused(true);
        }
    }

    /// RESUME: lifts a PAUSE; queued checkouts get their slots.
    pub fn resume(&self, database: Option<&str>) {
        self.gates.resume(database);
        for pool in self.pools_of(None) {
            if !self.gates.is_paused(pool.database()) {
                pool.set_paused(false);
            }
        }
    }

    /// Whether `node` is a healthy replica that may serve a read needing `need` (see
    /// [`timeline`]: orphans of a failover serve nothing).
    pub fn serves(&self, node: &NodeState, need: timeline::Need) -> bool {
        node.healthy()
            && node.role() == Role::Replica
            && node.takes_reads()
            && timeline::admits(node.timeline.get(), self.newest_timeline.get(), need)
    }

    /// The node to use for `target` (the least busy healthy replica that is not an orphan, at
    /// random among equally busy ones), or None when no primary is known.
    pub fn pick(&self, target: Target) -> Option<Arc<NodeState>> {
        // Under the read lock, not on a copy of the list: this runs on every statement.
        let all = self.current.read().expect("nodes lock");
        if target == Target::Replica {
            // One pass, each count read once: the least busy so far, replaced by an equally busy
            // one with probability 1/(equals seen), so ties end up uniformly random. Random, not
            // round robin: drivers send two flights per statement (prepare, then execute), and
            // a strict rotation would give every execute the same replica.
            let mut chosen: Option<(&Arc<NodeState>, usize, usize)> = None;
            for node in all.iter() {
                if !self.serves(node, timeline::Need::Any) {
                    continue;
                }
                let busy = node.busy();
                chosen = match chosen {
                    Some((_, least, _)) if busy < least => Some((node, busy, 1)),
                    Some((kept, least, ties)) if busy == least => {
                        let ties = ties + 1;
                        let node = if rand::random_range(0..ties) == 0 {
                            node
                        } else {
                            kept
                        };
                        Some((node, least, ties))
                    }
                    Some(kept) => Some(kept),
                    None => Some((node, busy, 1)),
                };
            }
            if let Some((node, ..)) = chosen {
                return Some(Arc::clone(node));
            }
        }
        Self::primary_of(&all)
    }

    /// The healthy node detected as primary; else one detected as primary earlier; else, while no
    /// check ever reached the configured primary, that one — so a client gets the reason it cannot
    /// be reached (refused login, connection refused) instead of "no primary".
    pub fn primary(&self) -> Option<Arc<NodeState>> {
        Self::primary_of(&self.all())
    }

    fn primary_of(all: &[Arc<NodeState>]) -> Option<Arc<NodeState>> {
        let detected = all
            .iter()
            .find(|n| n.healthy() && n.role() == Role::Primary);
        detected
            .or_else(|| all.iter().find(|n| n.role() == Role::Primary))
            .or_else(|| all.first().filter(|n| n.role() == Role::Unknown))
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A primary and three healthy replicas.
    fn cluster() -> Nodes {
        let urls: Vec<NodeUrl> = (0..4)
            .map(|i| NodeUrl::parse(&format!("postgres://app@127.0.0.1:{}/app", 5432 + i)).unwrap())
            .collect();
        let nodes = Nodes::new(&urls);
        for (i, node) in nodes.all().iter().enumerate() {
            let role = if i == 0 { Role::Primary } else { Role::Replica };
            node.set_health(Some(role), None);
        }
        nodes
    }

    /// Which nodes 300 picks of a replica landed on, with these busy counts on the replicas.
    fn picked(nodes: &Nodes, busy: [usize; 3]) -> std::collections::BTreeSet<usize> {
        for (node, busy) in nodes.all()[1..].iter().zip(busy) {
            node.busy.store(busy, Ordering::Relaxed);
        }
        (0..300)
            .map(|_| nodes.pick(Target::Replica).unwrap().index)
            .collect()
    }

    #[test]
    fn replica_reads_go_to_the_least_busy_and_ties_are_shared() {
        let nodes = cluster();
        assert_eq!(picked(&nodes, [2, 0, 0]), [2, 3].into());
        assert_eq!(picked(&nodes, [5, 4, 3]), [3].into());
        assert_eq!(picked(&nodes, [1, 1, 1]), [1, 2, 3].into());
        // An unhealthy replica is never picked for being idle; none serving means the primary.
        nodes.all()[3].set_health(None, Some("down".into()));
        assert_eq!(picked(&nodes, [1, 1, 0]), [1, 2].into());
        for node in &nodes.all()[1..] {
            node.set_health(None, Some("down".into()));
        }
        assert_eq!(picked(&nodes, [0, 0, 0]), [0].into());
        assert_eq!(nodes.pick(Target::Primary).unwrap().index, 0);
    }
}
