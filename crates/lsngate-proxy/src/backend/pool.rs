//! A pool of server connections for one (node, database): a semaphore caps the size, idle
//! connections wait in a stack (most recently used first, so the hot ones stay warm). Idle
//! connections unused for `server_idle_timeout` and connections open longer than
//! `server_lifetime` are closed — when a checkout comes across them, when they are given back,
//! and by the reaper task between statements. Handing a connection out and taking it back is all it does;
//! resetting session state is the session's job because only the session knows what it changed.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use super::Nodes;
use super::conn::{BackendConn, BackendError};
use crate::config::NodeUrl;

/// How many connections a pool may hold and how long they live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolLimits {
    /// Max connections per (node, database); fixed when the pool is created.
    pub size: usize,
    /// An idle connection unused for longer than this is closed; None = never.
    pub idle_timeout: Option<Duration>,
    /// A connection open for longer than this is closed instead of reused; None = never.
    pub lifetime: Option<Duration>,
}

impl PoolLimits {
    /// Whether a connection opened at `opened` and idle for `idle` must be closed.
    fn expired(&self, opened: Instant, idle: Duration, now: Instant) -> bool {
        self.idle_timeout.is_some_and(|limit| idle > limit) || self.outlived(opened, now)
    }

    /// Whether a connection opened at `opened` is past its lifetime.
    fn outlived(&self, opened: Instant, now: Instant) -> bool {
        self.lifetime
            .is_some_and(|limit| now.saturating_duration_since(opened) > limit)
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
    since: Instant,
}

/// The idle stack with the limits it is kept to (changed by a reload).
#[derive(Debug)]
struct Shelf {
    conns: Vec<Idle>,
    limits: PoolLimits,
}

impl Shelf {
    /// Takes out every expired connection.
    #[allow(clippy::vec_box)] // the boxes move on, into PooledConn or close()
    fn take_expired(&mut self, now: Instant) -> Vec<Box<BackendConn>> {
        let limits = self.limits;
        // The common case (nothing expired) allocates nothing: this runs on every checkout.
        if !self.conns.iter().any(|idle| {
            limits.expired(
                idle.conn.opened,
                now.saturating_duration_since(idle.since),
                now,
            )
        }) {
            return Vec::new();
        }
        let (expired, kept) = std::mem::take(&mut self.conns)
            .into_iter()
            .partition(|idle| {
                limits.expired(
                    idle.conn.opened,
                    now.saturating_duration_since(idle.since),
                    now,
                )
            });
        self.conns = kept;
        expired.into_iter().map(|idle| idle.conn).collect()
    }
}

/// Idle connections back in the pool for longer than this are probed (a non-blocking read for an
/// EOF or FATAL the server left) before reuse.
const PROBE_AFTER: Duration = Duration::from_secs(1);

/// Connections of one (node, database).
#[derive(Debug)]
pub struct Pool {
    node: usize,
    database: String,
    shelf: Mutex<Shelf>,
    permits: Arc<Semaphore>,
    size: usize,
    open: AtomicUsize,
}

/// Why no connection could be handed out.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs)] // variant fields are described by the variant docs
pub enum PoolError {
    /// Every connection stayed busy for the whole acquire timeout.
    #[error(
        "all {size} connections to node {node} database {database:?} stayed busy for {waited:?}; raise pool_size or acquire_timeout_ms"
    )]
    Exhausted {
        node: usize,
        database: String,
        size: usize,
        waited: Duration,
    },
    /// Opening a new connection failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl Pool {
    /// An empty pool kept to `limits`.
    pub fn new(node: usize, database: &str, limits: PoolLimits) -> Arc<Pool> {
        Arc::new(Pool {
            node,
            database: database.to_string(),
            shelf: Mutex::new(Shelf {
                conns: Vec::new(),
                limits,
            }),
            permits: Arc::new(Semaphore::new(limits.size)),
            size: limits.size,
            open: AtomicUsize::new(0),
        })
    }

    /// Applies a reloaded idle timeout and lifetime; the size of an existing pool stays.
    pub fn set_limits(&self, limits: PoolLimits) {
        self.shelf.lock().expect("pool lock").limits = limits;
    }

    /// A connection: an idle one, or a new one while under the size limit.
    pub async fn acquire(
        self: &Arc<Self>,
        url: &NodeUrl,
        wait: Duration,
        connect: Duration,
    ) -> Result<PooledConn, PoolError> {
        let exhausted = || PoolError::Exhausted {
            node: self.node,
            database: self.database.clone(),
            size: self.size,
            waited: wait,
        };
        // Fast path without arming a timer: a free slot right now.
        let permit = match Arc::clone(&self.permits).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => tokio::time::timeout(wait, Arc::clone(&self.permits).acquire_owned())
                .await
                .map_err(|_| exhausted())?
                .map_err(|_| exhausted())?,
        };
        // Only the connections looked at are checked for expiry here; the reaper closes the
        // rest (a scan of the whole stack on every checkout would cost every statement).
        let (idle, expired) = {
            let mut shelf = self.shelf.lock().expect("pool lock");
            let now = Instant::now();
            let mut expired = Vec::new();
            let mut idle = None;
            while let Some(candidate) = shelf.conns.pop() {
                let idle_for = now.saturating_duration_since(candidate.since);
                if shelf.limits.expired(candidate.conn.opened, idle_for, now) {
                    expired.push(candidate.conn);
                    continue;
                }
                // Probing costs a syscall per checkout; a connection back for less than
                // PROBE_AFTER is taken as is (a server that closed it just now fails that one
                // statement with a clear error, and reads are re-run elsewhere).
                let fresh = idle_for < PROBE_AFTER;
                if fresh || candidate.conn.is_usable() {
                    idle = Some(candidate.conn);
                    break;
                }
                tracing::debug!(node = %candidate.conn.address, "dropping a server connection closed while idle");
                self.open.fetch_sub(1, Ordering::Relaxed);
            }
            (idle, expired)
        };
        self.close(expired);
        let conn = match idle {
            Some(conn) => conn,
            None => {
                let conn =
                    Box::new(BackendConn::connect(self.node, url, &self.database, connect).await?);
                self.open.fetch_add(1, Ordering::Relaxed);
                conn
            }
        };
        Ok(PooledConn {
            conn: Some(conn),
            _permit: permit,
            pool: Arc::clone(self),
        })
    }

    /// Takes a connection back: onto the idle stack, or closed when it outlived its lifetime.
    fn put_back(&self, conn: Box<BackendConn>) {
        let now = Instant::now();
        let expired = {
            let mut shelf = self.shelf.lock().expect("pool lock");
            let mut expired = Vec::new();
            if shelf.limits.outlived(conn.opened, now) {
                expired.push(conn);
            } else {
                shelf.conns.push(Idle { conn, since: now });
            }
            expired
        };
        self.close(expired);
    }

    /// Closes idle connections past their idle timeout or lifetime; returns how many.
    pub fn close_expired(&self) -> usize {
        let expired = self
            .shelf
            .lock()
            .expect("pool lock")
            .take_expired(Instant::now());
        let closed = expired.len();
        self.close(expired);
        closed
    }

    /// (open connections, idle connections, size limit), for /status and /metrics.
    pub fn stats(&self) -> (usize, usize, usize) {
        (
            self.open.load(Ordering::Relaxed),
            self.shelf.lock().expect("pool lock").conns.len(),
            self.size,
        )
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
            tracing::debug!(node = %conn.address, database = %self.database, "closing an expired or discarded server connection");
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
            _ = tokio::time::sleep(limits.reap_period()) => {}
            _ = shutdown.changed() => {}
        }
        if *shutdown.borrow() {
            return;
        }
    }
}

/// A connection on loan; dropping it without `release` closes it (the safe default after errors).
#[derive(Debug)]
pub struct PooledConn {
    /// Boxed: a connection moves between the idle stack and its borrower on every transaction,
    /// and a move of the box copies a pointer, not the connection.
    conn: Option<Box<BackendConn>>,
    _permit: OwnedSemaphorePermit,
    pool: Arc<Pool>,
}

impl PooledConn {
    /// Gives the connection back for reuse (or closes it when it outlived `server_lifetime`).
    pub fn release(mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.put_back(conn);
        }
    }
}

impl Drop for PooledConn {
    fn drop(&mut self) {
        if self.conn.take().is_some() {
            self.pool.open.fetch_sub(1, Ordering::Relaxed);
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
        let now = Instant::now() + Duration::from_secs(120);
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
