//! [`Session`]: monotonic reads and read-your-writes for one user or request chain.
//!
//! A session keeps a floor token. Its writes raise the floor to their commit token; each read
//! uses the floor as its token and then raises it to the position the serving node had right
//! after the read ([`crate::Served::seen`]), so the next read — on any replica — waits for at
//! least that and never shows an older state. Stale-flagged answers do not raise it.
//!
//! A session is a value, not a connection: it pins nothing, survives replicas coming and going,
//! and can be rebuilt from a token carried in a cookie ([`Session::observe`]).

use std::sync::Mutex;

use futures_util::future::BoxFuture;
use lsngate_core::Token;
use tokio_postgres::Client;

use crate::error::Error;
use crate::flight::Params;
use crate::gate::Gate;
use crate::read::Read;
use crate::write::Written;
use lsngate_core::sync::lock;

/// Monotonic reads over a [`Gate`]. Cheap; make one per user session or request chain.
#[derive(Debug)]
pub struct Session {
    gate: Gate,
    floor: Mutex<Option<Token>>,
}

impl Session {
    pub(crate) fn new(gate: Gate) -> Session {
        Session {
            gate,
            floor: Mutex::new(None),
        }
    }

    /// The current floor: every read of this session sees at least this.
    pub fn floor(&self) -> Option<Token> {
        *lock(&self.floor)
    }

    /// Raises the floor to include `token` (a commit token, or one carried from a client).
    pub fn observe(&self, token: Token) {
        let mut floor = lock(&self.floor);
        *floor = Some(match *floor {
            Some(current) => current.merge(token),
            None => token,
        });
    }

    /// Reads at or after the floor, then raises the floor to what the read saw.
    pub async fn query(&self, sql: &str, params: Params<'_>) -> Result<Read, Error> {
        self.query_after(None, sql, params).await
    }

    /// Reads at or after the floor and `also` (a floor from elsewhere, a scope's), then raises
    /// the floor to what the read saw.
    pub(crate) async fn query_after(
        &self,
        also: Option<Token>,
        sql: &str,
        params: Params<'_>,
    ) -> Result<Read, Error> {
        let floor = match (self.floor(), also) {
            (Some(own), Some(also)) => Some(own.merge(also)),
            (own, also) => own.or(also),
        };
        let read = self.gate.read().after(floor).query(sql, params).await?;
        if !read.served.stale
            && let Some(seen) = read.served.seen
        {
            self.observe(Token {
                lsn: seen,
                timeline: floor.and_then(|t| t.timeline),
                expires_at: None,
            });
        }
        Ok(read)
    }

    /// [`Gate::write`], raising the floor to the commit token.
    pub async fn write(&self, sql: &str, params: Params<'_>) -> Result<Written, Error> {
        let written = self.gate.write(sql, params).await?;
        self.observe(written.token);
        Ok(written)
    }

    /// [`Gate::transaction`], raising the floor to the commit token.
    pub async fn transaction<T, F>(&self, work: F) -> Result<T, Error>
    where
        F: for<'c> FnOnce(&'c Client) -> BoxFuture<'c, Result<T, tokio_postgres::Error>>,
    {
        let (value, token) = self.gate.transaction(work).await?;
        self.observe(token);
        Ok(value)
    }
}
