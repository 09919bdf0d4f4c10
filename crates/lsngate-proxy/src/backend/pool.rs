//! A pool of server connections for one (node, database): a semaphore caps the size, idle
//! connections wait in a stack (most recently used first, so the hot ones stay warm). Handing a
//! connection out and taking it back is all it does; resetting session state is the session's
//! job because only the session knows what it changed.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::conn::{BackendConn, BackendError};
use crate::config::NodeUrl;

/// Connections of one (node, database).
#[derive(Debug)]
pub struct Pool {
    node: usize,
    database: String,
    idle: Mutex<Vec<BackendConn>>,
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
    /// An empty pool of at most `size` connections.
    pub fn new(node: usize, database: &str, size: usize) -> Arc<Pool> {
        Arc::new(Pool {
            node,
            database: database.to_string(),
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(size)),
            size,
            open: AtomicUsize::new(0),
        })
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
        let idle = loop {
            let candidate = self.idle.lock().expect("pool lock").pop();
            match candidate {
                Some(conn) if !conn.is_usable() => {
                    tracing::debug!(node = %conn.address, "dropping a server connection closed while idle");
                    self.open.fetch_sub(1, Ordering::Relaxed);
                }
                other => break other,
            }
        };
        let conn = match idle {
            Some(conn) => conn,
            None => {
                let conn = BackendConn::connect(self.node, url, &self.database, connect).await?;
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

    /// (open connections, idle connections, size limit), for /status and /metrics.
    pub fn stats(&self) -> (usize, usize, usize) {
        (
            self.open.load(Ordering::Relaxed),
            self.idle.lock().expect("pool lock").len(),
            self.size,
        )
    }

    /// Closes every idle connection (after a failover or reload).
    pub fn clear_idle(&self) {
        let drained = std::mem::take(&mut *self.idle.lock().expect("pool lock"));
        self.open.fetch_sub(drained.len(), Ordering::Relaxed);
    }
}

/// A connection on loan; dropping it without `release` closes it (the safe default after errors).
#[derive(Debug)]
pub struct PooledConn {
    conn: Option<BackendConn>,
    _permit: OwnedSemaphorePermit,
    pool: Arc<Pool>,
}

impl PooledConn {
    /// Gives the connection back for reuse.
    pub fn release(mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.idle.lock().expect("pool lock").push(conn);
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
