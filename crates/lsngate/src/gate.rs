//! [`Gate`]: the handle an application keeps — pools for the primary and each replica, the
//! shared watcher, the primary guard — and the entry points for reads, writes and sessions.
//!
//! Cheap to clone (an `Arc`); dropping the last clone stops the background monitor. It is not
//! a failover manager: the primary URL is fixed, a promoted replica is only taken out of the
//! read rotation.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::SystemTime;

use lsngate_core::{Refusal, SharedGuard, Token};
use tokio::time::Instant;

use crate::config::Config;
use crate::error::Error;
use crate::flight::{self, Answer, FlightError, Params};
use crate::monitor;
use crate::pool::{NodePool, discard};
use crate::read::{Read, ReadBuilder};
use crate::session::Session;
use crate::watcher::{ReplicaStatus, Watcher};

/// Read-your-writes access to one primary and its streaming replicas.
#[derive(Clone)]
pub struct Gate {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("primary", &self.inner.primary.address)
            .field("replicas", &self.inner.names)
            .finish()
    }
}

/// Shared state behind a [`Gate`].
pub(crate) struct Inner {
    pub config: Config,
    pub primary: NodePool,
    pub replicas: Vec<NodePool>,
    /// (name, address) per replica.
    pub names: Vec<(String, String)>,
    pub watcher: Watcher,
    guard: SharedGuard,
    epoch: Instant,
    spin: AtomicUsize,
}

/// A primary slot for one fallback; released on drop.
pub(crate) struct Permit<'a>(&'a Inner);

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.0.guard.release();
    }
}

impl Gate {
    /// Builds the pools, polls every node once (each poll bounded by the connect timeout) and
    /// starts the background monitor. It succeeds while servers are down, taking up to the
    /// connect timeout then; it fails only on an unusable configuration. Routing starts with
    /// what the first poll learnt — each replica's role and timeline: a read with a token is not
    /// served by a replica whose timeline is unknown (see `lsngate_core::timeline`).
    /// Must be called inside a tokio runtime.
    pub async fn connect(config: Config) -> Result<Gate, Error> {
        crate::metrics::describe();
        let make = |name: String, url: &str| {
            let connector = config.connector.clone();
            NodePool::new(
                name.clone(),
                url,
                config.pool_size,
                config.connect_timeout,
                connector,
            )
            .map_err(|e| {
                Error::Config(format!(
                    "{name} URL: {e}; expected postgres://user@host:port/db"
                ))
            })
        };
        let primary = make("primary".into(), &config.primary_url)?;
        let replicas = config
            .replica_urls
            .iter()
            .enumerate()
            .map(|(i, url)| make(format!("replica{i}"), url))
            .collect::<Result<Vec<_>, _>>()?;
        let names = replicas
            .iter()
            .map(|r| (r.name.clone(), r.address.clone()))
            .collect();
        let inner = Arc::new(Inner {
            watcher: Watcher::new(replicas.len()),
            guard: SharedGuard::new(config.guard),
            config,
            primary,
            replicas,
            names,
            epoch: Instant::now(),
            spin: AtomicUsize::new(0),
        });
        monitor::poll_once(&inner).await;
        monitor::spawn(Arc::downgrade(&inner));
        Ok(Gate { inner })
    }

    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }

    /// A read; set a token, budget and fallback on the builder, then `.query(sql, params)`.
    pub fn read(&self) -> ReadBuilder<'_> {
        ReadBuilder::new(self)
    }

    /// Reads `sql` so that it sees everything `token` stands for (configured budget and
    /// fallback). The common case in one call.
    pub async fn query_after(
        &self,
        token: &Token,
        sql: &str,
        params: Params<'_>,
    ) -> Result<Read, Error> {
        self.read().after(*token).query(sql, params).await
    }

    /// Reads without a token: a healthy replica inside the lag bound, balanced.
    pub async fn query(&self, sql: &str, params: Params<'_>) -> Result<Read, Error> {
        self.read().query(sql, params).await
    }

    /// A session whose reads never go back in time (see [`Session`]).
    pub fn session(&self) -> Session {
        Session::new(self.clone())
    }

    /// The primary's current position: a token for "everything committed so far". Costs one
    /// round trip to the primary.
    pub async fn primary_position(&self) -> Result<Token, Error> {
        let inner = &self.inner;
        let conn = inner.checkout_primary().await?;
        match flight::position_of(&conn.client).await {
            Ok((lsn, timeline)) => Ok(inner.token_from(lsn, timeline)),
            Err(cause) => {
                discard(conn);
                Err(inner.primary_unavailable(cause))
            }
        }
    }

    /// What is known about each replica right now.
    pub fn replicas(&self) -> Vec<ReplicaStatus> {
        self.inner.watcher.status(&self.inner.names)
    }

    /// Encodes `token` for a client (cookie, header, job payload) with the configured codec.
    pub fn issue(&self, token: &Token) -> String {
        self.inner
            .config
            .token_codec
            .issue(token, SystemTime::now())
    }

    /// Reads a token text from a client: checks its shape, signature and expiry.
    pub fn verify(&self, text: &str) -> Result<Token, Error> {
        Ok(self
            .inner
            .config
            .token_codec
            .verify(text, SystemTime::now())?)
    }

    /// Fallback breaker position: `true` while open.
    pub fn breaker_open(&self) -> bool {
        self.inner
            .guard
            .status(self.inner.epoch.elapsed())
            .breaker_open
    }
}

impl Inner {
    pub fn next_spin(&self) -> usize {
        self.spin.fetch_add(1, Ordering::Relaxed)
    }

    pub fn token_from(&self, lsn: lsngate_core::Lsn, timeline: Option<u32>) -> Token {
        self.watcher.observe_primary(Instant::now(), lsn, timeline);
        Token {
            lsn,
            timeline,
            expires_at: None,
        }
    }

    pub fn primary_unavailable(&self, cause: impl Into<String>) -> Error {
        Error::PrimaryUnavailable {
            address: self.primary.address.clone(),
            cause: cause.into(),
        }
    }

    pub async fn checkout_primary(&self) -> Result<crate::pool::Pooled, Error> {
        let deadline = Instant::now() + self.config.connect_timeout;
        self.primary
            .checkout(deadline)
            .await
            .map_err(|e| self.primary_unavailable(e.to_string()))
    }

    /// A primary slot from the guard, if it gives one now (the caller queues; see
    /// `read::fall_back`).
    pub fn try_admit_fallback(&self) -> Result<Permit<'_>, Refusal> {
        self.guard
            .try_admit(self.epoch.elapsed())
            .map(|()| Permit(self))
    }

    /// A read on the primary with its trailing insert position.
    pub async fn read_primary(&self, sql: &str, params: Params<'_>) -> Result<Answer, Error> {
        let mut conn = self.checkout_primary().await?;
        let result = flight::read(&mut conn, sql, params, true).await;
        match result {
            Ok(answer) => Ok(answer),
            Err(error) => match flight::classify(error) {
                FlightError::Query(source) => Err(Error::Query {
                    node: self.primary.name.clone(),
                    source,
                }),
                FlightError::Unreachable(cause) | FlightError::Conflict(cause) => {
                    discard(conn);
                    Err(self.primary_unavailable(cause))
                }
            },
        }
    }

    /// Feeds the guard's rate and exports it.
    pub fn record_read(&self, fell_back: bool) {
        let status = self.guard.record(self.epoch.elapsed(), fell_back);
        metrics::gauge!(crate::metrics::FALLBACK_RATE).set(status.fallback_rate);
        let open = if status.breaker_open { 1.0 } else { 0.0 };
        metrics::gauge!(crate::metrics::BREAKER_OPEN).set(open);
    }
}
