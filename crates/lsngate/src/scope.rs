//! [`Scope`]: read-your-writes per name the application chooses — a user, a tenant, a device —
//! across every process that shares one scope store. A write under the scope raises the scope's
//! floor in the store (max-merge, kept `ttl`); a read under it waits for that floor. The floors
//! live under the same keys and in the same form as the lsngate proxy's (`scope_store`, keys
//! `lsngate:scope:<name>`, see [`lsngate_store::SCOPE_PREFIX`]), so a Rust service using this
//! library and services in other languages behind proxies on the same Redis share scopes.
//!
//! Reads through one [`Scope`] value never go back in time: it keeps a [`Session`] of its own,
//! raised by its writes and by what its reads saw, and each read waits for the scope's floor and
//! that session's. A `Scope` made per request keeps a request's reads in order; keep one per
//! user (or carry its [`Scope::session_floor`]) to keep them in order across requests.
//!
//! A scope with no floor in the store (never written under, expired, or the store did not
//! answer) is read as the proxy reads it: after the primary's current position, which is past
//! every write ever made under it — never stale, at the cost of a primary round trip; that
//! position is then saved as the scope's floor.

use std::sync::Arc;
use std::time::Duration;

use lsngate_core::{ScopeName, Token};
use lsngate_store::TokenStore;

use crate::error::Error;
use crate::flight::Params;
use crate::gate::Gate;
use crate::read::Read;
use crate::session::Session;
use crate::write::Written;

/// Read-your-writes under one scope name, over a [`Gate`] and a shared [`TokenStore`], and
/// monotonic reads through this value. Cheap; make one per request, or keep one per user.
pub struct Scope {
    gate: Gate,
    /// What this value's own writes and reads have raised its floor to.
    session: Session,
    name: ScopeName,
    store: Arc<dyn TokenStore>,
    ttl: Duration,
}

impl std::fmt::Debug for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scope")
            .field("name", &self.name.as_str())
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Gate {
    /// Work under the causal scope `name` (1–128 bytes of letters, digits and `:_.@/-`), whose
    /// floor lives in `store` for `ttl` after its last write (use the proxies' `scope_ttl_ms` when
    /// sharing with them). For the proxies' keys, a Redis store made with
    /// `RedisTokenStore::connect(url).await?.with_prefix(lsngate_store::SCOPE_PREFIX)`.
    pub fn scope(
        &self,
        name: &str,
        store: Arc<dyn TokenStore>,
        ttl: Duration,
    ) -> Result<Scope, Error> {
        let name = ScopeName::parse(name).map_err(|e| Error::Config(e.to_string()))?;
        Ok(Scope {
            gate: self.clone(),
            session: self.session(),
            name,
            store,
            ttl,
        })
    }
}

impl Scope {
    /// The scope's name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// What a read under the scope must see: the store's floor, else the primary's current
    /// position (saved as the floor). Reads through this value also wait for
    /// [`Scope::session_floor`].
    pub async fn floor(&self) -> Result<Token, Error> {
        match self.store.load(self.name.as_str()).await {
            Ok(Some(token)) => return Ok(token),
            Ok(None) => {}
            Err(e) => tracing::warn!(
                scope = self.name.as_str(),
                "scope store unavailable, reading after the primary's position: {e}"
            ),
        }
        let primary = self.gate.primary_position().await?;
        // A seed only: a failure costs the next reader the same primary round trip.
        let _ = self.store.save(self.name.as_str(), primary, self.ttl).await;
        Ok(primary)
    }

    /// What this value's own writes and the reads it made have seen; `None` before any.
    pub fn session_floor(&self) -> Option<Token> {
        self.session.floor()
    }

    /// Reads at or after the scope's floor and everything this value's earlier reads saw, then
    /// raises [`Scope::session_floor`] to what the read saw.
    pub async fn query(&self, sql: &str, params: Params<'_>) -> Result<Read, Error> {
        let floor = self.floor().await?;
        self.session.query_after(Some(floor), sql, params).await
    }

    /// [`Gate::write`], then raises the scope's floor in the store to the commit token. When the
    /// store cannot be told, the write stands (it committed) and the error says so: readers
    /// under the scope elsewhere may miss it.
    pub async fn write(&self, sql: &str, params: Params<'_>) -> Result<Written, Error> {
        let written = self.gate.write(sql, params).await?;
        self.committed(written.token).await?;
        Ok(written)
    }

    /// Raises the scope's floor to `token`, a commit made under the scope some other way
    /// ([`Gate::transaction`], [`crate::WriteTx::commit`]); this value's reads wait for it even
    /// when the store cannot be told.
    pub async fn committed(&self, token: Token) -> Result<(), Error> {
        self.session.observe(token);
        self.store
            .save(self.name.as_str(), token, self.ttl)
            .await
            .map_err(|e| Error::ScopeNotShared {
                scope: self.name.to_string(),
                lsn: token.lsn,
                cause: e.to_string(),
            })
    }
}
