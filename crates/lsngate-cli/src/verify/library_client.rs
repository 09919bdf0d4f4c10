//! A verify process using the lsngate library directly: one [`lsngate::Gate`] over the primary
//! and the replicas, shared by every process as an application shares it, and per process what
//! the mode asks an application to keep:
//!
//! - `session`: a [`lsngate::Session`] (its floor rises with its writes and with what its reads
//!   saw);
//! - `token`: nothing but the token handed over — writes return their commit token, reads run
//!   with `gate.read().after(token)`; a bare token read remembers nothing, so it promises no
//!   monotonic reads and the checker does not hold it to them;
//! - `universal`: a session that also takes `Gate::primary_position()` before each read;
//! - `scope`: a [`lsngate::Scope`] shared with another process, over one in-process store all
//!   processes share (as app servers share one Redis): writes raise the scope's floor with their
//!   token, reads wait for it;
//! - `eventual`: token-less reads (the self-test control).
//!
//! The library has no gate-wide commit floor (the proxy's `global`) and reads one statement at a
//! time (no transactions on replicas): [`refusal`] says so before a run starts.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use std::time::Duration;

use lsngate::{Gate, Scope, Session, Token};
use lsngate_core::Lsn;
use lsngate_store::{MemoryTokenStore, TokenStore};

use super::client::{
    Effect, Failure, READ_SQL, Seen, WRITE_SQL, Written, effect_of, seen, sqlstate,
};
use super::workload::Mode;

/// The gate every process shares, and how many of their reads it served from the primary.
pub struct LibraryTarget {
    pub gate: Gate,
    /// Reads the gate answered from the primary (`Served::by`), as the library reports them.
    pub fallbacks: AtomicU64,
    /// Scope mode: where the scopes' floors live, shared by every process.
    scopes: Arc<dyn TokenStore>,
}

/// How long a scope's floor lives after its last write (longer than any run's pauses).
const SCOPE_TTL: Duration = Duration::from_secs(600);

impl LibraryTarget {
    pub fn new(gate: Gate) -> LibraryTarget {
        LibraryTarget {
            gate,
            fallbacks: AtomicU64::new(0),
            scopes: Arc::new(MemoryTokenStore::new()),
        }
    }
}

/// Why the library cannot be verified in `mode`, naming the fix; None when it can.
pub fn refusal(mode: Mode) -> Option<String> {
    match mode {
        Mode::Global => Some(
            "--mode global is the proxy's mode (every write committed through one proxy), and a \
             lsngate Gate keeps no gate-wide commit floor: each write's token goes only to whoever \
             holds it. Use --mode universal with the library (Gate::primary_position() before each \
             read: every write committed on the primary), --mode session or token, or verify the \
             proxy's global mode without --library/--primary"
                .into(),
        ),
        Mode::Fast => Some(
            "--mode fast is the proxy's mode (reads never wait while the primary takes them), and \
             a lsngate Gate has none: its reads wait within their budget (Config::budget). Use \
             --mode session with the library, or verify the proxy's fast mode without \
             --library/--primary"
                .into(),
        ),
        _ => None,
    }
}

/// What the workload gets for a read-only transaction through the library (it never asks).
pub fn no_read_only_transactions() -> Failure {
    Failure {
        sqlstate: "unsupported".into(),
        effect: Effect::Nothing,
        message: "the lsngate library runs reads one statement at a time (Gate::read); its \
                  transactions (Gate::begin, Gate::transaction) run on the primary"
            .into(),
    }
}

pub struct LibraryClient {
    target: Arc<LibraryTarget>,
    mode: Mode,
    /// Session and universal modes (and eventual's writes are plain gate writes).
    session: Option<Session>,
    /// Scope mode: the scope this process shares with its pair.
    scope: Option<Scope>,
    /// The timeline of this process's last write token: a floor handed over as a bare position
    /// is taken to be on it (there is no failover in a verify run).
    timeline: Option<u32>,
}

impl LibraryClient {
    /// `scope`: the scope of scope mode (a name the workload makes).
    pub fn open(
        target: &Arc<LibraryTarget>,
        mode: Mode,
        scope: Option<&str>,
    ) -> anyhow::Result<LibraryClient> {
        let session =
            matches!(mode, Mode::Session | Mode::Universal).then(|| target.gate.session());
        let scope = scope
            .map(|name| {
                target
                    .gate
                    .scope(name, Arc::clone(&target.scopes), SCOPE_TTL)
            })
            .transpose()?;
        Ok(LibraryClient {
            target: Arc::clone(target),
            mode,
            session,
            scope,
            timeline: None,
        })
    }

    pub async fn write(&mut self, op_id: &str, key: i32, process: i32) -> Result<Written, Failure> {
        let (rows, token) = self
            .target
            .gate
            .write_returning(WRITE_SQL, &[&op_id, &key, &process])
            .await
            .map_err(failure)?;
        // What Session::write does, for a statement that returns its row; what Scope::write
        // does, likewise.
        if let Some(session) = &self.session {
            session.observe(token);
        }
        if let Some(scope) = &self.scope {
            scope.committed(token).await.map_err(failure)?;
        }
        self.timeline = token.timeline.or(self.timeline);
        let version = rows.first().map(|row| row.get(0)).ok_or_else(|| Failure {
            sqlstate: "no-row".into(),
            message: format!("no row for key {key}: the table was not there"),
            effect: Effect::Nothing,
        })?;
        Ok(Written {
            version,
            commit: (self.mode == Mode::Token).then_some(token.lsn),
        })
    }

    pub async fn read(&mut self, key: i32, floor: Option<Lsn>) -> Result<Seen, Failure> {
        let gate = &self.target.gate;
        let read = match (&self.session, self.mode) {
            _ if let Some(scope) = &self.scope => scope.query(READ_SQL, &[&key]).await,
            (Some(session), mode) => {
                if mode == Mode::Universal {
                    session.observe(gate.primary_position().await.map_err(failure)?);
                }
                session.query(READ_SQL, &[&key]).await
            }
            (None, Mode::Token) => {
                let token = floor.map(|lsn| Token {
                    lsn,
                    timeline: self.timeline,
                    expires_at: None,
                });
                gate.read().after(token).query(READ_SQL, &[&key]).await
            }
            (None, _) => gate.query(READ_SQL, &[&key]).await,
        }
        .map_err(failure)?;
        if read.served.by == lsngate::ServedBy::Primary {
            self.target.fallbacks.fetch_add(1, Ordering::Relaxed);
        }
        Ok(seen(read.rows.first()))
    }
}

/// The library's error as a history entry: the server's SQLSTATE when there is one, else the
/// library's own class. What a failed write did is the library's own word (`CommitOutcomeUnknown`,
/// `CommitFailed`, `TokenUnavailable`: committed, its position lost), or for a statement's error
/// the server's.
fn failure(e: lsngate::Error) -> Failure {
    use lsngate::Error;
    let class = match &e {
        Error::Query { source, .. }
        | Error::CommitFailed(source)
        | Error::CommitOutcomeUnknown(source) => {
            return Failure {
                sqlstate: sqlstate(source),
                effect: match &e {
                    Error::CommitOutcomeUnknown(_) => Effect::Unknown,
                    Error::CommitFailed(_) => Effect::Nothing,
                    _ => effect_of(source),
                },
                message: e.to_string(),
            };
        }
        Error::PrimaryUnavailable { .. } => "primary-unavailable",
        Error::NotReplayed { .. } => "not-replayed",
        Error::PrimaryGuarded { .. } => "guarded",
        Error::TokenUnavailable { .. } => "token-unavailable",
        Error::ScopeNotShared { .. } => "scope-not-shared",
        Error::Config(_) | Error::Token(_) => "config",
    };
    Failure {
        sqlstate: class.into(),
        effect: match e {
            // Both say the write committed: its position was lost, or not told to the store.
            Error::TokenUnavailable { .. } | Error::ScopeNotShared { .. } => Effect::Committed,
            _ => Effect::Nothing,
        },
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the million-operation run through the library under kill-primary: a write whose
    /// commit went through and whose position query died with the primary came back as
    /// `TokenUnavailable` ("the transaction COMMITTED"), was recorded as failed, and the checker
    /// rightly called it a phantom. It is a committed write whose version is unknown.
    #[test]
    fn a_write_the_library_says_committed_is_recorded_as_committed() {
        let committed = failure(lsngate::Error::TokenUnavailable {
            cause: "connection closed".into(),
        });
        assert_eq!(committed.effect, Effect::Committed);
        assert_eq!(committed.sqlstate, "token-unavailable");
        let unreachable = failure(lsngate::Error::PrimaryUnavailable {
            address: "127.0.0.1:1".into(),
            cause: "refused".into(),
        });
        assert_eq!(unreachable.effect, Effect::Nothing);
    }
}
