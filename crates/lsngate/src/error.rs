//! Everything the library can fail with. Each variant names the cause and what to do; none of
//! them means "a stale read happened" — a read that could not be proven fresh either fell back,
//! failed with [`Error::NotReplayed`], or came back flagged stale as the policy asked.

use std::fmt;

use lsngate_core::{Lsn, Refusal, Token, TokenError};

/// Why a read was not served by a replica that had the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallbackReason {
    /// The budget was spent before any replica replayed the token.
    BudgetSpent,
    /// The chosen replica answered `not in recovery`: it was promoted.
    Promoted,
    /// The replica could not be reached, or stopped answering (down, frozen, pool exhausted).
    Unreachable,
    /// The wait or the read was cancelled by a recovery conflict on the replica.
    RecoveryConflict,
    /// No replica is configured, healthy and in recovery.
    NoReplica,
    /// Token-less read: every replica is over the lag bound.
    AllLagging,
    /// The token was taken on an older timeline than the primary's current one (a failover
    /// happened since): only the primary is trusted with it. Also when it is from a newer
    /// timeline than any primary seen and no replica follows that timeline yet.
    TimelineChanged,
}

impl fmt::Display for FallbackReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FallbackReason::BudgetSpent => "budget spent",
            FallbackReason::Promoted => "replica promoted",
            FallbackReason::Unreachable => "replica unreachable",
            FallbackReason::RecoveryConflict => "recovery conflict",
            FallbackReason::NoReplica => "no replica",
            FallbackReason::AllLagging => "all replicas lagging",
            FallbackReason::TimelineChanged => "timeline changed",
        })
    }
}

/// A replica's position as known when an error was raised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaPosition {
    /// `replica0`, `replica1`, ...
    pub name: String,
    /// Lowest known replay position over the servers this replica URL reached.
    pub replayed: Option<Lsn>,
}

impl fmt::Display for ReplicaPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.replayed {
            Some(lsn) => write!(f, "{} at {lsn}", self.name),
            None => write!(f, "{} at unknown", self.name),
        }
    }
}

fn positions(replicas: &[ReplicaPosition]) -> String {
    if replicas.is_empty() {
        return "no replicas".into();
    }
    replicas
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Errors of [`crate::Gate`] and [`crate::Session`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A URL or setting is unusable.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// A token text from a client was refused (malformed, tampered, expired, unsigned).
    #[error(transparent)]
    Token(#[from] TokenError),

    /// A write under a causal scope committed, but the scope store could not be told.
    #[error(
        "the write under scope {scope:?} committed at {lsn}, but the scope store could not be told ({cause}); reads under the scope through other processes may not see it: check the store, then call Scope::committed again with the write's token"
    )]
    ScopeNotShared {
        /// The scope.
        scope: String,
        /// The commit's position.
        lsn: Lsn,
        /// What the store said.
        cause: String,
    },

    /// The primary could not be reached.
    #[error(
        "cannot reach the primary {address}: {cause}; check that it is up and the URL is right"
    )]
    PrimaryUnavailable {
        /// host:port of the primary URL.
        address: String,
        /// What failed.
        cause: String,
    },

    /// The statement itself failed (syntax, constraint, permission...): not retried elsewhere.
    #[error("query on {node} failed: {source}")]
    Query {
        /// The node that ran it.
        node: String,
        /// The driver error, with SQLSTATE.
        #[source]
        source: tokio_postgres::Error,
    },

    /// With [`lsngate_core::Fallback::Error`]: no replica could prove it had the token.
    #[error(
        "no replica could serve the read{} ({reason}); replicas: {}; raise the budget, use Fallback::Primary, or retry later",
        token.map(|t| format!(" of token {t}")).unwrap_or_default(),
        positions(replicas)
    )]
    NotReplayed {
        /// The position the read needed (`None` for a token-less read).
        token: Option<Lsn>,
        /// Why the replicas did not serve it.
        reason: FallbackReason,
        /// What each replica was known to have replayed.
        replicas: Vec<ReplicaPosition>,
    },

    /// The primary guard refused a fallback (cap reached or breaker open).
    #[error(
        "the read{} needed the primary ({reason}) but the primary guard refused: {refusal}",
        token.map(|t| format!(" of token {t}")).unwrap_or_default()
    )]
    PrimaryGuarded {
        /// The token, if the read had one.
        token: Option<Lsn>,
        /// Why the read needed the primary.
        reason: FallbackReason,
        /// What the guard said.
        refusal: Refusal,
    },

    /// COMMIT failed on the server: the transaction was rolled back. Nothing was written.
    #[error(
        "commit failed, the transaction was rolled back: {0}; fix the cause and run the transaction again"
    )]
    CommitFailed(#[source] tokio_postgres::Error),

    /// The connection broke while COMMIT was in flight: it may or may not have committed.
    /// lsngate never retries a write; check the data before writing again.
    #[error(
        "connection lost during COMMIT, the outcome is unknown: {0}; check whether the write is there before retrying it"
    )]
    CommitOutcomeUnknown(#[source] tokio_postgres::Error),

    /// The transaction committed but its position could not be read; use
    /// [`crate::Gate::primary_position`] as a (larger, still correct) token.
    #[error(
        "the transaction COMMITTED, but reading its WAL position failed: {cause}; take Gate::primary_position() as its token instead (do not write again)"
    )]
    TokenUnavailable {
        /// What failed.
        cause: String,
    },
}

impl Error {
    /// For [`Error::PrimaryGuarded`] messages: shows the token if any.
    pub(crate) fn guarded(
        token: Option<&Token>,
        reason: FallbackReason,
        refusal: Refusal,
    ) -> Error {
        Error::PrimaryGuarded {
            token: token.map(|t| t.lsn),
            reason,
            refusal,
        }
    }
}
