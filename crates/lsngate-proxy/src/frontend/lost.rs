//! A server connection lost while replies were due: what can run again elsewhere (a replica
//! read nothing of which reached the client), what the client is told (08006, with the
//! outcome unknown where the statement may have committed), and a commit position lost with
//! the connection, taken from the primary instead. Also a connection lost before a flight was
//! sent while a transaction block or a pinned session lived on it.

use super::attached::{Duty, Owner};
use super::error::ClientError;
use super::session::Session;
use crate::backend::{BackendError, Target};
use crate::net::backend::TxStatus;
use crate::net::{ErrorFields, sqlstate};

impl Session {
    /// The backend broke. Replies still due become errors; only a replica read (which cannot
    /// have written) is re-run, on the primary.
    pub(super) async fn backend_lost(&mut self, error: BackendError) -> Result<(), ClientError> {
        let Some(mut attached) = self.backend.take() else {
            return Ok(());
        };
        self.cancel_slot.lock().expect("cancel slot").target = None;
        metrics::counter!("lsngate_proxy_errors_total", "kind" => "backend_lost").increment(1);
        tracing::warn!("backend lost mid-flight: {error}");
        if attached.target == Target::Replica {
            // Nothing of the read reached the client yet (held back, or its wait undecided or
            // failed): it can run elsewhere.
            let unseen = attached.retry.is_some() || attached.wait.is_some();
            if unseen && let Some(read) = attached.take_read() {
                metrics::counter!("lsngate_proxy_retries_total", "reason" => "replica_lost")
                    .increment(1);
                if let Some(n) = self.proxy.nodes.get(attached.conn.node) {
                    n.request_check();
                }
                return Box::pin(self.fall_back(read)).await;
            }
            if attached.retry.is_some()
                && let Some((flight, class, log)) = attached.take_rerun()
            {
                metrics::counter!("lsngate_proxy_retries_total", "reason" => "replica_lost")
                    .increment(1);
                let route = super::flight::Route {
                    log: Some(log),
                    ..super::flight::Route::to(Some(Target::Primary))
                };
                return Box::pin(self.dispatch_to(flight, class, route)).await;
            }
        }
        self.end_fallback();
        let position_due = attached
            .expect
            .iter()
            .any(|o| matches!(o, Owner::Proxy(Duty::Position { wrote: true, .. })));
        if position_due {
            // The commit went through but its position was lost with the connection: take the
            // primary's current position instead (it is past the commit).
            let position = self.primary_position().await;
            self.scopes_committed(u64::MAX, position.as_ref().ok().copied())
                .await;
            match position {
                Ok(floor) => self.on_position(floor, true).await?,
                Err(e) => {
                    tracing::warn!(
                        "commit position lost and the primary unreachable: {e}; the client's reads go to the primary until it answers"
                    );
                    for unknown in self.floors.commit_lost(&self.proxy.causal) {
                        self.io.queue(&unknown);
                    }
                }
            }
        }
        if let Some(held) = attached.held_ready {
            self.io.queue(&held);
        }
        let waiting = attached
            .expect
            .iter()
            .filter(|o| **o == Owner::Client)
            .count();
        let waiting = if waiting == 0
            && (attached.batch.is_open() || attached.copy.running || self.status != TxStatus::Idle)
        {
            1
        } else {
            waiting
        };
        // Inside a transaction block, anything but its end leaves the transaction to be rolled
        // back by the server when it finds the connection closed; a statement outside one, or
        // a COMMIT, may have committed or not, and the proxy cannot tell which.
        let outcome = if self.status != TxStatus::Idle && !attached.may_commit {
            "it was not retried; the open transaction is rolled back (nothing of it was committed)"
        } else {
            "its outcome is unknown: it may or may not have been committed, so it was not retried; check before running it again"
        };
        let message = format!(
            "lsngate lost the server connection while it ran your statement ({error}); {outcome}"
        );
        for segment in 0..waiting {
            // The server's own FATAL, relayed as an ERROR, already answered the statement in
            // progress: it gets its ReadyForQuery, not a second error.
            if !(segment == 0 && attached.error_relayed) {
                self.io.queue(
                    &ErrorFields::new("ERROR", sqlstate::CONNECTION_FAILURE, message.clone())
                        .to_frame(b'E'),
                );
            }
            self.io.queue_ready(TxStatus::Idle);
        }
        self.status = TxStatus::Idle;
        if waiting == 0 && self.pinned {
            self.io.queue(&crate::net::backend::build::fatal(
                sqlstate::CONNECTION_FAILURE,
                &message,
            ));
            self.io.flush().await?;
            return Err(ClientError::Server(message));
        }
        self.io.flush().await?;
        Ok(())
    }

    /// The attached connection broke before `segments` of a flight were sent (the proxy's own
    /// round trip found it), and a transaction block or a pinned session lived on it. Nothing
    /// of the flight ran, but what lived there is gone: inside a block each segment is told the
    /// transaction is rolled back and the block ends (ReadyForQuery 'I', as when the loss comes
    /// mid-statement); a pinned session ends with FATAL. The caller has detached the connection.
    pub(super) async fn lost_before_sending(
        &mut self,
        error: BackendError,
        segments: usize,
    ) -> Result<(), ClientError> {
        self.cancel_slot.lock().expect("cancel slot").target = None;
        metrics::counter!("lsngate_proxy_errors_total", "kind" => "backend_lost").increment(1);
        tracing::warn!("backend lost before a flight was sent: {error}");
        self.end_fallback();
        if self.status == TxStatus::Idle {
            let message = format!(
                "lsngate lost the server connection your session's state lived on ({error}); your statement was not sent; reconnect"
            );
            self.io.queue(&crate::net::backend::build::fatal(
                sqlstate::CONNECTION_FAILURE,
                &message,
            ));
            self.io.flush().await?;
            return Err(ClientError::Server(message));
        }
        let message = format!(
            "lsngate lost the server connection of your transaction before this statement was sent ({error}); the open transaction is rolled back (nothing of it was committed)"
        );
        for _ in 0..segments.max(1) {
            self.io.queue(
                &ErrorFields::new("ERROR", sqlstate::CONNECTION_FAILURE, message.clone())
                    .to_frame(b'E'),
            );
            self.io.queue_ready(TxStatus::Idle);
        }
        self.status = TxStatus::Idle;
        self.io.flush().await?;
        Ok(())
    }
}
