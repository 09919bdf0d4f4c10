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
//!
//! Two limits reach past the pool. A checkout that has waited `reserve_timeout` may take one
//! of `reserve_size` slots beyond `size` (PgBouncer's reserve pool). And opening a connection
//! takes a unit of the node's quota for the pool's database and of the one for its role
//! (`max_db_connections`, `max_user_connections`, see `quota`), closing one gives it back:
//! reusing an idle connection needs no unit. A checkout that finds a quota full queues like one
//! that finds the pool full, closes an idle connection of another pool under that quota if
//! there is one, and is served when a unit comes back — a connection closed by any pool under
//! the quota wakes the pools waiting on it, oldest first.

use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, watch};

use super::Nodes;
use super::clock::Coarse;
use super::conn::{BackendConn, BackendError};
use super::quota::{Quota, Wake, take_both};
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
    /// Whether a checkout may take a slot now: under `size`, or within the reserve for a checkout
    /// queued since `queued` once it has waited `reserve_timeout`. `lent` counts the slots lent
    /// besides the one asked for.
    fn has_room(&self, lent: usize, queued: Option<Coarse>, now: Coarse) -> bool {
        let limits = &self.limits;
        let reserve = limits.reserve_size > 0
            && lent < limits.size + limits.reserve_size
            && queued.is_some_and(|since| now.since(since) >= limits.reserve_timeout);
        !self.paused && (lent < limits.size || reserve)
    }

    /// Whether the oldest queued checkout may take a slot now.
    fn has_room_for_oldest(&self, lent: usize, now: Coarse) -> bool {
        let oldest = self.waiting.front().map(|(since, _)| *since);
        self.has_room(lent, oldest, now)
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

/// How long a connection closed for another pool under a quota may take to end on the server
/// before its unit is given back anyway.
const QUOTA_CLOSE_BOUND: Duration = Duration::from_secs(5);

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
    /// The node's limit on connections to this database (`max_db_connections`).
    database_quota: Arc<Quota<Pool>>,
    /// The node's limit on connections as this role (`max_user_connections`).
    role_quota: Arc<Quota<Pool>>,
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
        "all {size} connections to node {node} database {database:?} as {role:?} stayed busy for {waited:?}; raise pool_size or acquire_timeout_ms{quota}"
    )]
    Exhausted {
        /// What a shared limit adds to the message, when one was full.
        quota: String,
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
    /// lends in `node_busy` too, registering those it opens in `node_connections` and opening
    /// them within the node's `quotas` for its database and role.
    pub fn new(
        node: usize,
        database: &str,
        role: &str,
        limits: PoolLimits,
        node_busy: Arc<AtomicUsize>,
        node_connections: Arc<super::sever::Severables>,
        quotas: (Arc<Quota<Pool>>, Arc<Quota<Pool>>),
    ) -> Arc<Pool> {
        let (database_quota, role_quota) = quotas;
        let pool = Arc::new(Pool {
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
            database_quota,
            role_quota,
            server_params: Mutex::new(None),
        });
        pool.database_quota.join(&pool);
        pool.role_quota.join(&pool);
        pool.set_quota_limits(&limits);
        pool
    }

    /// Applies the shared limits of `limits` to the pool's quotas, waking whoever they let in.
    fn set_quota_limits(&self, limits: &PoolLimits) {
        let mut wake = self.database_quota.set_limit(limits.max_db_connections);
        wake.extend(self.role_quota.set_limit(limits.max_user_connections));
        admit(wake);
    }

    /// Takes a unit of both quotas for a connection about to be opened; when one is full, the
    /// pool is listed as waiting on it (the caller queues its checkout).
    fn take_unit(self: &Arc<Self>) -> bool {
        if take_both(&self.database_quota, &self.role_quota) {
            return true;
        }
        for quota in [&self.database_quota, &self.role_quota] {
            if quota.is_full() {
                quota.wait(self);
            }
        }
        false
    }

    /// Gives back the units of `count` connections closed or never opened.
    fn give_back_units(&self, count: usize) {
        if count == 0 {
            return;
        }
        let mut wake = self.database_quota.give_back(count);
        wake.extend(self.role_quota.give_back(count));
        admit(wake);
    }

    /// For a checkout queued on a full quota: closes one idle connection of another pool under
    /// it, whose unit then comes back to the oldest waiter. The unit comes back once the server
    /// has ended that backend, so the limit holds on the server too.
    async fn evict_for_quota(&self) {
        for quota in [&self.database_quota, &self.role_quota] {
            if !quota.is_full() {
                continue;
            }
            for other in quota.members_besides(self) {
                if other.close_oldest_idle().await {
                    return;
                }
            }
        }
    }

    /// Closes the least recently used idle connection, if there is one, waiting for the server
    /// to end it (at most [`QUOTA_CLOSE_BOUND`]).
    async fn close_oldest_idle(&self) -> bool {
        let oldest = {
            let mut shelf = self.shelf.lock().expect("pool lock");
            (!shelf.conns.is_empty()).then(|| shelf.conns.remove(0).conn)
        };
        let Some(conn) = oldest else {
            return false;
        };
        tracing::debug!(database = %self.database, role = %self.role, "closing an idle server connection for another pool's checkout (max_db_connections / max_user_connections)");
        conn.terminate(QUOTA_CLOSE_BOUND).await;
        self.open.fetch_sub(1, Ordering::Relaxed);
        self.give_back_units(1);
        true
    }

    /// What a shared limit adds to an exhausted pool's message.
    fn quota_note(&self) -> String {
        let (db_open, db_limit) = self.database_quota.usage();
        let (role_open, role_limit) = self.role_quota.usage();
        let mut note = String::new();
        if db_limit > 0 && db_open >= db_limit {
            note += &format!(
                " (max_db_connections = {db_limit} reached for database {:?})",
                self.database
            );
        }
        if role_limit > 0 && role_open >= role_limit {
            note += &format!(
                " (max_user_connections = {role_limit} reached for role {:?})",
                self.role
            );
        }
        note
    }

    /// Applies reloaded limits. A larger size hands the new slots to queued checkouts at once; a
    /// smaller one lends no slot until fewer than the new size are lent.
    pub fn set_limits(self: &Arc<Self>, limits: PoolLimits) {
        let grew = {
            let mut shelf = self.shelf.lock().expect("pool lock");
            let grew = limits.size > shelf.limits.size
                || limits.reserve_size > shelf.limits.reserve_size
                || limits.reserve_timeout < shelf.limits.reserve_timeout;
            shelf.limits = limits;
            grew
        };
        self.set_quota_limits(&limits);
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

    /// Hands free slots to queued checkouts, oldest first, while there is room (after RESUME, a
    /// larger size, a unit of a quota given back, or the reserve timeout).
    fn admit_waiters(self: &Arc<Self>) {
        self.admit_queued(false);
    }

    /// [`Pool::admit_waiters`]; with `reserve`, the oldest waiter may take a reserve slot even
    /// if the coarse clock does not show it waited `reserve_timeout` yet (its caller's timer
    /// says it did: a checkout queued no later than the oldest one timed out).
    fn admit_queued(self: &Arc<Self>, mut reserve: bool) {
        loop {
            let (waiter, idle, expired) = {
                let mut shelf = self.shelf.lock().expect("pool lock");
                if shelf.waiting.is_empty() {
                    drop(shelf);
                    self.database_quota.stop_waiting(self);
                    self.role_quota.stop_waiting(self);
                    return;
                }
                let limits = shelf.limits;
                let in_reserve =
                    reserve && !shelf.paused && shelf.lent < limits.size + limits.reserve_size;
                if !in_reserve && !shelf.has_room_for_oldest(shelf.lent, Coarse::now()) {
                    return;
                }
                reserve = false;
                let (idle, expired) = self.take_idle(&mut shelf);
                if idle.is_none() && !self.take_unit() {
                    drop(shelf);
                    self.close(expired);
                    return;
                }
                let (_, waiter) = shelf.waiting.pop_front().expect("a waiter");
                shelf.lent += 1;
                self.node_busy.fetch_add(1, Ordering::Relaxed);
                (waiter, idle, expired)
            };
            self.close(expired);
            if let Err(mut refused) = waiter.send(self.lend(idle)) {
                // The waiter gave up meanwhile: its slot (and connection, or unit) come back.
                refused.pool = None;
                let conn = refused.conn.take();
                if conn.is_none() {
                    self.give_back_units(1);
                }
                self.give_back(conn);
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
        let mut quota_full = false;
        let (mut lent, expired, queued) = {
            let mut shelf = self.shelf.lock().expect("pool lock");
            let now = Coarse::now();
            let mut taken = None;
            let mut expired = Vec::new();
            if shelf.waiting.is_empty() && shelf.has_room(shelf.lent, None, now) {
                let (idle, stale) = self.take_idle(&mut shelf);
                expired = stale;
                if idle.is_some() || self.take_unit() {
                    shelf.lent += 1;
                    self.node_busy.fetch_add(1, Ordering::Relaxed);
                    taken = Some(self.lend(idle));
                } else {
                    quota_full = true;
                }
            }
            match taken {
                Some(lent) => (Some(lent), expired, None),
                None => {
                    let (tx, rx) = oneshot::channel();
                    shelf.waiting.push_back((now, tx));
                    (None, expired, Some(rx))
                }
            }
        };
        if !expired.is_empty() {
            self.close(expired);
        }
        if let Some(mut rx) = queued {
            let queued_at = Coarse::now();
            if quota_full {
                self.evict_for_quota().await;
            }
            let reserve_after = {
                let limits = self.shelf.lock().expect("pool lock").limits;
                (limits.reserve_size > 0 && limits.reserve_timeout < wait)
                    .then_some(limits.reserve_timeout)
            };
            let first_wait = reserve_after.unwrap_or(wait);
            let mut waited = crate::timer::timeout(first_wait, &mut rx).await;
            if let (Err(_), Some(reserve_after)) = (&waited, reserve_after) {
                // Waited reserve_pool_timeout: the reserve may take this checkout (and any
                // older one) now, or a slot given back later still may.
                self.admit_queued(true);
                waited = crate::timer::timeout(wait - reserve_after, &mut rx).await;
            }
            lent = match waited {
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
                quota: self.quota_note(),
                node: self.node,
                database: self.database.clone(),
                role: self.role.clone(),
                size: self.shelf.lock().expect("pool lock").limits.size,
                waited: wait,
            });
        };
        if lent.conn.is_none() {
            // A free slot without an idle connection: open one (its quota unit is taken). On
            // failure `lent` is dropped, which gives back the unit, and its slot goes to the
            // next waiter.
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
            if !shelf.waiting.is_empty()
                || !shelf.has_room(shelf.lent, None, Coarse::now())
                || shelf.conns.is_empty()
            {
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
            expired.push(candidate.conn);
        }
        (None, expired)
    }

    /// Takes a slot back, with its connection when it can be reused: to the oldest waiter if
    /// any, else onto the idle stack.
    fn give_back(self: &Arc<Self>, mut conn: Option<Box<BackendConn>>) {
        let now = Coarse::now();
        let mut outlived = None;
        // Another pool waits on a full quota of this one: the connection is closed for it
        // rather than kept here (see `quota`).
        let mut yielded = conn
            .take_if(|_| self.quota_wanted_elsewhere())
            .map(|conn| (Arc::clone(self), conn));
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
                // Paused or shrunk: the slot is not handed on. Without a connection to hand on,
                // the waiter needs a quota unit to open one.
                let room = shelf.has_room_for_oldest(shelf.lent - 1, now)
                    && (conn.is_some() || shelf.waiting.is_empty() || self.take_unit());
                // Without room the waiter stays queued (popping it would drop its sender and
                // fail the checkout at once).
                match room.then(|| shelf.waiting.pop_front()).flatten() {
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
                    if conn.is_none() {
                        self.give_back_units(1);
                    }
                }
            }
        }
        if let Some(conn) = outlived {
            self.close(vec![conn]);
        }
        if let Some((pool, conn)) = yielded.take() {
            pool.close_for_quota(conn);
        }
    }

    /// Whether a pool other than this one waits on a full quota of this one.
    fn quota_wanted_elsewhere(&self) -> bool {
        self.database_quota.others_wait(self) || self.role_quota.others_wait(self)
    }

    /// Closes `conn` for another pool under a full quota; its unit comes back once the server
    /// ended the backend (in a task, bounded by the connect timeout of 5 s), so the limit holds
    /// on the server too. Outside a runtime it is closed at once.
    fn close_for_quota(self: Arc<Self>, conn: Box<BackendConn>) {
        tracing::debug!(database = %self.database, role = %self.role, "closing a server connection for another pool waiting on max_db_connections / max_user_connections");
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    conn.terminate(QUOTA_CLOSE_BOUND).await;
                    self.open.fetch_sub(1, Ordering::Relaxed);
                    self.give_back_units(1);
                });
            }
            Err(_) => self.close(vec![conn]),
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
        let count = conns.len();
        for conn in conns {
            tracing::debug!(node = %conn.address, database = %self.database, role = %self.role, "closing an expired or discarded server connection");
            conn.close();
        }
        self.give_back_units(count);
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
            // A connection closed, or a slot whose connection was never opened: either way its
            // quota unit comes back.
            if self.conn.take().is_some() {
                pool.open.fetch_sub(1, Ordering::Relaxed);
            }
            pool.give_back_units(1);
            pool.give_back(None);
        }
    }
}

/// Lets each woken pool admit its queued checkouts, in the order given (oldest waiter first).
fn admit(wake: Wake<Pool>) {
    for pool in wake {
        pool.admit_waiters();
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
            reserve_size: 0,
            reserve_timeout: Duration::ZERO,
            max_db_connections: 0,
            max_user_connections: 0,
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
            reserve_size: 0,
            reserve_timeout: Duration::ZERO,
            max_db_connections: 0,
            max_user_connections: 0,
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
