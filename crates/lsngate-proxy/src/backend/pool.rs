//! A pool of server connections for one (node, database, role). At most `size` connections are lent
//! at a time; idle ones wait in a stack (most recently used first, so the hot ones stay warm).
//! When every slot is lent, checkouts queue, and a connection (or the slot of one that was
//! closed) given back goes straight to the oldest waiter: first come, first served, and a
//! newcomer never takes a slot someone is already waiting for. Idle connections unused for
//! `server_idle_timeout` and connections open longer than `server_lifetime` are closed — when a
//! checkout comes across them, when they are given back, and by the reaper task between
//! statements. Handing a connection out and taking it back is all it does; resetting session
//! state is the session's job because only the session knows what it changed.
//!
//! A checkout and a return each take the pool's lock once and read the coarse clock once; no
//! timer is armed unless the checkout has to wait.

use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, watch};

use super::Nodes;
use super::clock::Coarse;
use super::conn::{BackendConn, BackendError};
use crate::config::{NodeUrl, PoolLimits, ServerLogin};

/// The expiry arithmetic over the pool settings (the type is `config`'s; what a pool does with
/// it is here).
impl PoolLimits {
    /// Whether a connection opened at `opened` and idle for `idle` must be closed.
    fn expired(&self, opened: Coarse, idle: Duration, now: Coarse) -> bool {
        self.idle_timeout.is_some_and(|limit| idle > limit) || self.outlived(opened, now)
    }

    /// Whether a connection opened at `opened` is past its lifetime.
    fn outlived(&self, opened: Coarse, now: Coarse) -> bool {
        self.lifetime.is_some_and(|limit| now.since(opened) > limit)
    }

    /// How often the reaper looks for expired connections: a quarter of the shorter limit,
    /// between 10 ms and 1 s.
    pub fn reap_period(&self) -> Duration {
        let shortest = [self.idle_timeout, self.lifetime]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(Duration::MAX);
        (shortest / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }
}

/// An idle connection and when it came back.
#[derive(Debug)]
struct Idle {
    conn: Box<BackendConn>,
    since: Coarse,
}

/// The idle stack, the lent count and the queue of waiting checkouts, under one lock.
#[derive(Debug)]
struct Shelf {
    conns: Vec<Idle>,
    limits: PoolLimits,
    /// Slots lent out: connections in use, being opened, or on their way to a waiter.
    lent: usize,
    /// Checkouts waiting for a slot, oldest first, with when they started waiting.
    waiting: VecDeque<(Coarse, oneshot::Sender<PooledConn>)>,
    /// PAUSE on the admin console: no slot is lent until RESUME; checkouts queue (and time
    /// out after `acquire_timeout_ms` as for a full pool). Slots already lent stay lent.
    paused: bool,
    /// RECONNECT on the admin console: connections opened at or before this are closed when
    /// they come back instead of being reused.
    retire_up_to: Option<Coarse>,
}

impl Shelf {
    /// Whether a checkout may take a slot now.
    fn has_room(&self) -> bool {
        !self.paused && self.lent < self.limits.size
    }
}

impl Shelf {
    /// Takes out every expired connection.
    #[allow(clippy::vec_box)] // the boxes move on, into PooledConn or close()
    fn take_expired(&mut self, now: Coarse) -> Vec<Box<BackendConn>> {
        let limits = self.limits;
        let expired = |idle: &Idle| limits.expired(idle.conn.opened, now.since(idle.since), now);
        // The common case (nothing expired) allocates nothing.
        if !self.conns.iter().any(expired) {
            return Vec::new();
        }
        let (expired, kept) = std::mem::take(&mut self.conns)
            .into_iter()
            .partition(|idle| expired(idle));
        self.conns = kept;
        expired.into_iter().map(|idle| idle.conn).collect()
    }
}

/// Idle connections back in the pool for longer than this are probed (a non-blocking read for an
/// EOF or FATAL the server left) before reuse.
const PROBE_AFTER: Duration = Duration::from_secs(1);

/// ParameterStatus (name, value) pairs a server sends at login.
pub type ServerParams = Vec<(String, String)>;

/// Connections of one (node, database, role).
#[derive(Debug)]
pub struct Pool {
    node: usize,
    database: String,
    /// The role its connections log in as.
    role: String,
    shelf: Mutex<Shelf>,
    open: AtomicUsize,
    /// Checkouts that got a slot, for SHOW STATS (PgBouncer's `server_assignment_count`).
    assignments: AtomicU64,
    /// Microseconds checkouts spent queued for a slot, for SHOW STATS (`wait_time`).
    waited_us: AtomicU64,
    /// The node's count of connections in use, all its pools together: raised and lowered
    /// with `lent`.
    node_busy: Arc<AtomicUsize>,
    /// The node's open connections, which a sever shuts down (see `sever`).
    node_connections: Arc<super::sever::Severables>,
    /// The ParameterStatus values the server sent the newest connection (server_version,
    /// encodings, DateStyle...): what a client is told at login, without a checkout.
    server_params: Mutex<Option<Arc<ServerParams>>>,
}

/// A pool's state for the admin console (`SHOW POOLS`, `SERVERS`, `STATS`).
#[derive(Debug, Clone, Default)]
pub struct PoolActivity {
    /// Slots lent: connections in use or being opened.
    pub lent: usize,
    /// Idle connections.
    pub idle: usize,
    /// Checkouts queued for a slot.
    pub waiting: usize,
    /// How long the oldest queued checkout has waited.
    pub longest_wait: Duration,
    /// Whether PAUSE holds it.
    pub paused: bool,
    /// Server process ids of the idle connections.
    pub idle_pids: Vec<i32>,
    /// Checkouts that got a slot since the pool was made.
    pub assignments: u64,
    /// Microseconds checkouts spent queued, in total.
    pub waited_us: u64,
}

/// Why no connection could be handed out.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs)] // variant fields are described by the variant docs
pub enum PoolError {
    /// Every connection stayed busy for the whole acquire timeout.
    #[error(
        "all {size} connections to node {node} database {database:?} as {role:?} stayed busy for {waited:?}; raise pool_size or acquire_timeout_ms"
    )]
    Exhausted {
        node: usize,
        database: String,
        role: String,
        size: usize,
        waited: Duration,
    },
    /// PAUSE on the admin console held the checkout for the whole acquire timeout.
    #[error(
        "database {database:?} is paused (PAUSE on the lsngate admin console) and stayed paused for {waited:?}; RESUME it there, or raise acquire_timeout_ms to wait longer"
    )]
    Paused { database: String, waited: Duration },
    /// Opening a new connection failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl Pool {
    /// An empty pool of connections as `role`, kept to `limits`, counting the connections it
    /// lends in `node_busy` too and registering those it opens in `node_connections`.
    pub fn new(
        node: usize,
        database: &str,
        role: &str,
        limits: PoolLimits,
        node_busy: Arc<AtomicUsize>,
        node_connections: Arc<super::sever::Severables>,
    ) -> Arc<Pool> {
        Arc::new(Pool {
            node,
            database: database.to_string(),
            role: role.to_string(),
            shelf: Mutex::new(Shelf {
                conns: Vec::new(),
                limits,
                lent: 0,
                waiting: VecDeque::new(),
                paused: false,
                retire_up_to: None,
            }),
            open: AtomicUsize::new(0),
            assignments: AtomicU64::new(0),
            waited_us: AtomicU64::new(0),
            node_busy,
            node_connections,
            server_params: Mutex::new(None),
        })
    }

    /// Applies reloaded limits. A larger size hands the new slots to queued checkouts at once; a
    /// smaller one lends no slot until fewer than the new size are lent.
    pub fn set_limits(self: &Arc<Self>, limits: PoolLimits) {
        let grew = {
            let mut shelf = self.shelf.lock().expect("pool lock");
            let grew = limits.size > shelf.limits.size;
            shelf.limits = limits;
            grew
        };
        if grew {
            self.admit_waiters();
        }
    }

    /// PAUSE (true) or RESUME (false): while paused no slot is lent and checkouts queue.
    pub fn set_paused(self: &Arc<Self>, paused: bool) {
        self.shelf.lock().expect("pool lock").paused = paused;
        if !paused {
            self.admit_waiters();
        }
    }

    /// RECONNECT: closes the idle connections now and those in use when they come back.
    pub fn retire_all(&self) {
        let idle = {
            let mut shelf = self.shelf.lock().expect("pool lock");
            shelf.retire_up_to = Some(Coarse::now());
            std::mem::take(&mut shelf.conns)
        };
        self.close(idle.into_iter().map(|idle| idle.conn).collect());
    }

    /// Hands free slots to queued checkouts, oldest first, while there is room (after RESUME or
    /// a larger size).
    fn admit_waiters(self: &Arc<Self>) {
        loop {
            let (waiter, idle, expired) = {
                let mut shelf = self.shelf.lock().expect("pool lock");
                if !shelf.has_room() {
                    return;
                }
                let Some((_, waiter)) = shelf.waiting.pop_front() else {
                    return;
                };
                shelf.lent += 1;
                self.node_busy.fetch_add(1, Ordering::Relaxed);
                let (idle, expired) = self.take_idle(&mut shelf);
                (waiter, idle, expired)
            };
            self.close(expired);
            if let Err(mut refused) = waiter.send(self.lend(idle)) {
                // The waiter gave up meanwhile: its slot (and connection) come back.
                refused.pool = None;
                self.give_back(refused.conn.take());
            }
        }
    }

    /// A connection: an idle one, or a new one (to `url`, as `login` or else the URL's user) while
    /// under the size limit; else the next one given back, waiting up to `wait` for it.
    pub async fn acquire(
        self: &Arc<Self>,
        url: &NodeUrl,
        login: Option<&ServerLogin>,
        wait: Duration,
        connect: Duration,
    ) -> Result<PooledConn, PoolError> {
        let (mut lent, expired, queued) = {
            let mut shelf = self.shelf.lock().expect("pool lock");
            if shelf.waiting.is_empty() && shelf.has_room() {
                shelf.lent += 1;
                self.node_busy.fetch_add(1, Ordering::Relaxed);
                let (idle, expired) = self.take_idle(&mut shelf);
                (Some(self.lend(idle)), expired, None)
            } else {
                let (tx, rx) = oneshot::channel();
                shelf.waiting.push_back((Coarse::now(), tx));
                (None, Vec::new(), Some(rx))
            }
        };
        if !expired.is_empty() {
            self.close(expired);
        }
        if let Some(mut rx) = queued {
            let queued_at = Coarse::now();
            lent = match crate::timer::timeout(wait, &mut rx).await {
                Ok(Ok(lent)) => Some(lent),
                // The sender went away without a slot: only when the pool itself is dropped.
                Ok(Err(_)) => None,
                Err(_) => {
                    // Timed out; a slot handed over in the meantime is taken, not lost.
                    rx.close();
                    rx.try_recv().ok()
                }
            };
            let waited = Coarse::now().since(queued_at);
            self.waited_us
                .fetch_add(waited.as_micros() as u64, Ordering::Relaxed);
        }
        self.assignments
            .fetch_add(u64::from(lent.is_some()), Ordering::Relaxed);
        let Some(mut lent) = lent else {
            if self.shelf.lock().expect("pool lock").paused {
                return Err(PoolError::Paused {
                    database: self.database.clone(),
                    waited: wait,
                });
            }
            return Err(PoolError::Exhausted {
                node: self.node,
                database: self.database.clone(),
                role: self.role.clone(),
                size: self.shelf.lock().expect("pool lock").limits.size,
                waited: wait,
            });
        };
        if lent.conn.is_none() {
            // A free slot without an idle connection: open one. On failure `lent` is dropped
            // and its slot goes to the next waiter.
            let mut conn =
                BackendConn::connect(self.node, url, login, &self.database, connect).await?;
            match self.node_connections.register(conn.socket_fd()) {
                Ok(handle) => {
                    let _ = handle.label.set(super::sever::ServerLabel {
                        database: self.database.clone(),
                        role: self.role.clone(),
                        pid: conn.cancel.pid,
                        opened_at: std::time::SystemTime::now(),
                    });
                    conn.severable = Some(handle)
                }
                Err(e) => {
                    tracing::warn!(node = %conn.address, "cannot register a server connection to give it up if the server stops answering: {e}")
                }
            }
            self.open.fetch_add(1, Ordering::Relaxed);
            // The newest connection's: a server restarted with other settings shows here.
            *self.server_params.lock().expect("params lock") =
                Some(Arc::new(conn.server_params.clone()));
            lent.conn = Some(Box::new(conn));
        }
        Ok(lent)
    }

    /// An idle connection now, or None when the pool would have to queue or open one (then
    /// [`Pool::acquire`] does). The checkout of the pass-through: no future, no waiting.
    pub fn checkout_idle(self: &Arc<Self>) -> Option<PooledConn> {
        let (idle, expired) = {
            let mut shelf = self.shelf.lock().expect("pool lock");
            if !shelf.waiting.is_empty() || !shelf.has_room() || shelf.conns.is_empty() {
                return None;
            }
            let (idle, expired) = self.take_idle(&mut shelf);
            if idle.is_some() {
                shelf.lent += 1;
                self.node_busy.fetch_add(1, Ordering::Relaxed);
                self.assignments.fetch_add(1, Ordering::Relaxed);
            }
            (idle, expired)
        };
        self.close(expired);
        idle.map(|conn| self.lend(Some(conn)))
    }

    /// The role its connections log in as.
    pub fn role(&self) -> &str {
        &self.role
    }

    /// The server's ParameterStatus values, once a connection was opened.
    pub fn server_params(&self) -> Option<Arc<ServerParams>> {
        self.server_params.lock().expect("params lock").clone()
    }

    /// A slot on loan, with `conn` in it if there is one.
    fn lend(self: &Arc<Self>, conn: Option<Box<BackendConn>>) -> PooledConn {
        PooledConn {
            conn,
            pool: Some(Arc::clone(self)),
        }
    }

    /// The most recently used idle connection that can serve, and the expired ones met on the
    /// way (to close outside the lock). Only the connections looked at are checked for expiry;
    /// the reaper closes the rest.
    #[allow(clippy::vec_box)] // the boxes move on, into PooledConn or close()
    fn take_idle(&self, shelf: &mut Shelf) -> (Option<Box<BackendConn>>, Vec<Box<BackendConn>>) {
        let now = Coarse::now();
        let mut expired = Vec::new();
        while let Some(mut candidate) = shelf.conns.pop() {
            let idle_for = now.since(candidate.since);
            if shelf.limits.expired(candidate.conn.opened, idle_for, now) {
                expired.push(candidate.conn);
                continue;
            }
            // Probing costs a syscall per checkout; a connection back for less than
            // PROBE_AFTER is taken as is (a server that closed it just now fails that one
            // statement with a clear error, and reads are re-run elsewhere).
            if idle_for < PROBE_AFTER || candidate.conn.is_usable() {
                return (Some(candidate.conn), expired);
            }
            tracing::debug!(node = %candidate.conn.address, "dropping a server connection closed while idle");
            self.open.fetch_sub(1, Ordering::Relaxed);
        }
        (None, expired)
    }

    /// Takes a slot back, with its connection when it can be reused: to the oldest waiter if
    /// any, else onto the idle stack.
    fn give_back(self: &Arc<Self>, mut conn: Option<Box<BackendConn>>) {
        let now = Coarse::now();
        let mut outlived = None;
        loop {
            let waiter = {
                let mut shelf = self.shelf.lock().expect("pool lock");
                let retired = |c: &BackendConn| shelf.retire_up_to.is_some_and(|t| c.opened <= t);
                if conn
                    .as_ref()
                    .is_some_and(|c| shelf.limits.outlived(c.opened, now) || retired(c))
                {
                    outlived = conn.take();
                }
                // Paused or shrunk: the slot is not handed on.
                let room = !shelf.paused && shelf.lent <= shelf.limits.size;
                match shelf.waiting.pop_front().filter(|_| room) {
                    Some((_, waiter)) => waiter,
                    None => {
                        shelf.lent -= 1;
                        self.node_busy.fetch_sub(1, Ordering::Relaxed);
                        if let Some(conn) = conn {
                            shelf.conns.push(Idle { conn, since: now });
                        }
                        break;
                    }
                }
            };
            // Outside the lock: a waiter that gave up hands the slot back here, and the next
            // one is tried.
            match waiter.send(self.lend(conn)) {
                Ok(()) => break,
                Err(mut refused) => {
                    refused.pool = None;
                    conn = refused.conn.take();
                }
            }
        }
        if let Some(conn) = outlived {
            self.close(vec![conn]);
        }
    }

    /// Closes idle connections past their idle timeout or lifetime; returns how many.
    pub fn close_expired(&self) -> usize {
        let expired = self
            .shelf
            .lock()
            .expect("pool lock")
            .take_expired(Coarse::now());
        let closed = expired.len();
        self.close(expired);
        closed
    }

    /// (open connections, idle connections, size limit), for /status and /metrics.
    pub fn stats(&self) -> (usize, usize, usize) {
        let shelf = self.shelf.lock().expect("pool lock");
        (
            self.open.load(Ordering::Relaxed),
            shelf.conns.len(),
            shelf.limits.size,
        )
    }

    /// What the admin console shows of this pool right now.
    pub fn activity(&self) -> PoolActivity {
        let shelf = self.shelf.lock().expect("pool lock");
        let now = Coarse::now();
        PoolActivity {
            lent: shelf.lent,
            idle: shelf.conns.len(),
            waiting: shelf.waiting.len(),
            longest_wait: shelf
                .waiting
                .front()
                .map(|(since, _)| now.since(*since))
                .unwrap_or_default(),
            paused: shelf.paused,
            idle_pids: shelf.conns.iter().map(|i| i.conn.cancel.pid).collect(),
            assignments: self.assignments.load(Ordering::Relaxed),
            waited_us: self.waited_us.load(Ordering::Relaxed),
        }
    }

    /// Whether it never opened a connection and lends no slot (nothing to keep it for). A
    /// pool that ever opened one is kept: sessions that logged in through it hold it.
    pub fn is_unused(&self) -> bool {
        let never_opened = self.server_params.lock().expect("params lock").is_none();
        let shelf = self.shelf.lock().expect("pool lock");
        never_opened && shelf.lent == 0 && shelf.waiting.is_empty()
    }

    /// The database its connections are logged into.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// The node index it connects to.
    pub fn node(&self) -> usize {
        self.node
    }

    /// Closes every idle connection (after a failover or reload).
    pub fn clear_idle(&self) {
        let drained = std::mem::take(&mut self.shelf.lock().expect("pool lock").conns);
        self.close(drained.into_iter().map(|idle| idle.conn).collect());
    }

    /// Closes connections that are no longer counted as idle, outside the pool lock.
    #[allow(clippy::vec_box)] // they come boxed from the idle stack
    fn close(&self, conns: Vec<Box<BackendConn>>) {
        if conns.is_empty() {
            return;
        }
        self.open.fetch_sub(conns.len(), Ordering::Relaxed);
        for conn in conns {
            tracing::debug!(node = %conn.address, database = %self.database, role = %self.role, "closing an expired or discarded server connection");
            conn.close();
        }
    }
}

/// The reaper: closes expired idle connections of every pool, as often as the current limits
/// ask (see [`PoolLimits::reap_period`]), until `shutdown` turns true. `limits` is read at every
/// round and handed to every pool, so a reload applies without waiting for a statement.
pub async fn reap(
    nodes: &Nodes,
    limits: impl Fn() -> PoolLimits,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let limits = limits();
        let closed: usize = nodes
            .all()
            .iter()
            .flat_map(|node| node.pools())
            .map(|pool| {
                pool.set_limits(limits);
                pool.close_expired()
            })
            .sum();
        if closed > 0 {
            tracing::debug!(closed, "closed expired idle server connections");
        }
        tokio::select! {
            _ = crate::timer::sleep(limits.reap_period()) => {}
            _ = shutdown.changed() => {}
        }
        if *shutdown.borrow() {
            return;
        }
    }
}

/// A slot on loan, with its connection once there is one. `release` gives both back; dropping
/// it instead closes the connection (the safe default after errors) and frees the slot.
#[derive(Debug)]
pub struct PooledConn {
    /// Boxed: a connection moves between the idle stack and its borrower on every transaction,
    /// and a move of the box copies a pointer, not the connection. None only inside the pool,
    /// before a new connection is opened for the slot.
    conn: Option<Box<BackendConn>>,
    /// The pool the slot goes back to; None once it went back.
    pool: Option<Arc<Pool>>,
}

impl PooledConn {
    /// Gives the connection back for reuse (or closes it when it outlived `server_lifetime`).
    /// In place: what is left is an empty loan, which dropping does nothing more to.
    pub fn release(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.give_back(self.conn.take());
        }
    }
}

#[cfg(test)]
impl PooledConn {
    /// A connection lent by no pool: releasing or dropping it only drops it. For unit tests.
    pub(crate) fn unpooled(conn: BackendConn) -> PooledConn {
        PooledConn {
            conn: Some(Box::new(conn)),
            pool: None,
        }
    }
}

impl Drop for PooledConn {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            if self.conn.take().is_some() {
                pool.open.fetch_sub(1, Ordering::Relaxed);
            }
            pool.give_back(None);
        }
    }
}

impl Deref for PooledConn {
    type Target = BackendConn;
    fn deref(&self) -> &BackendConn {
        self.conn
            .as_ref()
            .expect("connection present until release")
    }
}

impl DerefMut for PooledConn {
    fn deref_mut(&mut self) -> &mut BackendConn {
        self.conn
            .as_mut()
            .expect("connection present until release")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_counts_idle_time_and_age_separately() {
        let limits = PoolLimits {
            size: 1,
            idle_timeout: Some(Duration::from_secs(10)),
            lifetime: Some(Duration::from_secs(60)),
        };
        let now = Coarse::now() + Duration::from_secs(120);
        let ago = |secs| now - Duration::from_secs(secs);
        let secs = Duration::from_secs;
        assert!(
            !limits.expired(ago(30), secs(5), now),
            "young and recently used"
        );
        assert!(limits.expired(ago(30), secs(11), now), "idle too long");
        assert!(limits.expired(ago(61), secs(1), now), "open too long");
        assert!(limits.outlived(ago(61), now) && !limits.outlived(ago(59), now));
        let never = PoolLimits {
            idle_timeout: None,
            lifetime: None,
            ..limits
        };
        assert!(!never.expired(ago(120), secs(120), now));
    }

    #[test]
    fn reap_period_follows_the_shorter_limit_within_bounds() {
        let limits = |idle: Option<u64>, life: Option<u64>| PoolLimits {
            size: 1,
            idle_timeout: idle.map(Duration::from_millis),
            lifetime: life.map(Duration::from_millis),
        };
        let ms = Duration::from_millis;
        assert_eq!(
            limits(Some(600_000), Some(3_600_000)).reap_period(),
            ms(1000)
        );
        assert_eq!(limits(Some(400), Some(3_600_000)).reap_period(), ms(100));
        assert_eq!(limits(None, Some(200)).reap_period(), ms(50));
        assert_eq!(limits(Some(1), None).reap_period(), ms(10));
        assert_eq!(limits(None, None).reap_period(), ms(1000));
    }
}
