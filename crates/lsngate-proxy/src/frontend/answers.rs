//! The proxy's own answers to a client's simple Query — its commands, a refused hint, a
//! DEALLOCATE it tracks — in place of the server's, and what keeps the server's transaction in
//! step with what the client hears: a stand-in Query behind unsynced extended messages, a
//! failing statement inside a transaction block the answer fails.

use super::attached::{Attached, Batch, Duty, Owner, Substitute};
use super::causal::ClientFloors;
use super::error::ClientError;
use super::session::Session;
use crate::net::backend::TxStatus;
use crate::net::{ErrorFields, Frame};
use crate::statement::RouteHint;

/// What [`Duty::Abort`] sends: fails at once, and says why in the server's log.
pub(super) const ABORT_SQL: &str = "DO $$BEGIN RAISE EXCEPTION 'lsngate: the client''s transaction block failed at a statement the proxy answered'; END$$";

impl Session {
    /// Answers a simple Query the proxy takes over (its commands, a refused hint, a DEALLOCATE
    /// it tracks) with the error `code`, `message`.
    pub(super) async fn answer_error(
        &mut self,
        code: &str,
        message: &str,
    ) -> Result<(), ClientError> {
        let error = ErrorFields::new("ERROR", code, message).to_frame(b'E');
        self.answer_query(vec![error], true).await
    }

    /// Answers a simple Query the proxy takes over with `answer` (its replies up to, not
    /// including, ReadyForQuery; `failed` when they end in an error). Where the Query comes
    /// behind extended messages still unsynced on the server, the server's transaction must move
    /// as it would for the client's Query: PostgreSQL 15 commits the batch's implicit
    /// transaction at a Query, 19 keeps it open, and an error aborts it. So a stand-in Query
    /// goes there in its place (a `SHOW`, or one that fails), its answer is replaced by
    /// `answer` (`replies.rs`), and the client gets the server's ReadyForQuery with the status
    /// it reports. So it does inside a transaction block, where a Query drops the unnamed portal
    /// a synced batch left. Elsewhere the proxy answers at once, with the status the client last
    /// saw (`E` behind an error inside a transaction block, which fails the server's block too:
    /// `Session::abort_server_block`).
    ///
    /// Not on PostgreSQL 19 when an Execute outside a transaction block is among the unsynced
    /// messages and the answer is no error: 19rc1 keeps that implicit transaction open across
    /// the Query (ReadyForQuery T) and the Sync that then ends it leaves the server connection
    /// unable to start its next transaction (`XX000 StartTransactionCommand: unexpected state
    /// STARTED`), which on a pooled connection would hit whichever client comes next. There the
    /// proxy answers at once (status `I`, where a direct connection would say `T`: a documented
    /// difference). An error stand-in ends that block cleanly, so it is always sent.
    ///
    /// In an aborted block (status `E`) the stand-in is a statement the server refuses there
    /// (25P02, which the client then hears) unless the unsynced messages ended the block (an
    /// `END` over the extended protocol): the server, not the status the client last heard,
    /// judges. `installs` is what a proxy `SET` leaves in force once its answer holds.
    pub(super) async fn answer_query(
        &mut self,
        answer: Vec<Frame>,
        failed: bool,
    ) -> Result<(), ClientError> {
        self.answer_query_installing(answer, failed, None).await
    }

    /// Whether a simple Query the proxy answers itself would go to the server as a stand-in
    /// (see [`Session::answer_query`]): behind unsynced extended messages the server has not
    /// failed.
    pub(super) fn stand_in_due(&self) -> bool {
        self.backend
            .as_ref()
            .is_some_and(|b| b.batch.open_and_sound())
    }

    pub(super) async fn answer_query_installing(
        &mut self,
        answer: Vec<Frame>,
        failed: bool,
        installs: Option<(ClientFloors, RouteHint)>,
    ) -> Result<(), ClientError> {
        self.drain().await?;
        let status = self.status;
        let stand_in_safe = |b: &Attached| {
            failed
                || !b.conn.facts.has_wait_for()
                || status != TxStatus::Idle
                || matches!(
                    b.batch,
                    Batch::Open {
                        executed: None | Some(true),
                        ..
                    }
                )
        };
        // Inside a block the server's unnamed portal may outlive the batch that bound it, and
        // a Query drops it (seed 20261234471): a stand-in goes there too, unless the answer is
        // an error, whose failing of the block is a Query of its own (`abort_server_block`).
        let in_block = !failed && status == TxStatus::InBlock;
        if let Some(attached) = self.backend.as_mut().filter(|b| {
            (b.batch.open_and_sound() && stand_in_safe(b)) || (in_block && b.may_add_frames())
        }) {
            // Each drops the unnamed portal, as the client's Query would have (an empty Query
            // runs no statement and drops nothing). `SHOW` takes no snapshot, so a block the
            // unsynced messages opened may still set its isolation level behind it (`SELECT 1`
            // took the block's snapshot there: seed 20261248831).
            let stand_in = if failed {
                "SELECT 1/0"
            } else {
                "SHOW server_version"
            };
            // The stand-in ends the batch's implicit transaction outside a block (15 to 18
            // commit it at a Query; on 19 no stand-in is sent then, see `stand_in_safe`), and
            // with it the writes the batch executed: their commit position, owed since they
            // were sent, is taken behind it, as behind the client's own Sync (seed 20261206836:
            // the next read ran on a replica without the row).
            let commits = !failed
                && status == TxStatus::Idle
                && matches!(
                    attached.batch,
                    Batch::Open {
                        executed: Some(false),
                        ..
                    }
                );
            let owed = commits && std::mem::take(&mut attached.position_owed);
            // What a Query does to the server's state: the batch needs no Sync any more.
            attached.may_commit |= attached.batch.is_open();
            attached.batch = Batch::Synced;
            attached.substitute = Some(Substitute { answer, installs });
            let sent = attached.send_query(stand_in, super::attached::Owner::Client);
            if let Err(e) = sent.await {
                return self.backend_lost(e).await;
            }
            if owed {
                let attached = self.backend.as_mut().expect("attached");
                let probe = attached.position_probe(&mut self.scopes, true);
                if let Err(e) = attached.conn.send(&probe).await {
                    return self.backend_lost(e).await;
                }
            }
            return Ok(());
        }
        if let Some((floors, hint)) = installs {
            (self.floors, self.hint) = (floors, hint);
        }
        answer.iter().for_each(|f| self.io.queue(f));
        if failed {
            // Inside a transaction block the error fails the block, there as on the server.
            self.abort_server_block().await?;
        }
        self.queue_ready(self.status);
        self.io.flush().await?;
        Ok(())
    }

    /// After an error the proxy answered itself inside a transaction block (a proxy command
    /// that failed): a direct connection's block would now be failed, refusing every statement
    /// up to ROLLBACK. So the server's block is made to fail too, with a statement whose replies
    /// the proxy keeps, and the client's status is `E`. False (nothing done) where no server
    /// connection holds the block, or it is inside a batch or a COPY.
    ///
    /// The failure is waited for: a `SET` inside the block is undone by it, and PostgreSQL
    /// reports the old value ahead of its ReadyForQuery `E` (seed 20261229615), as the caller's
    /// `Session::queue_ready` then does.
    pub(super) async fn abort_server_block(&mut self) -> Result<bool, ClientError> {
        let Some(attached) = self.backend.as_mut() else {
            return Ok(false);
        };
        if self.status != TxStatus::InBlock || !attached.may_add_frames() || attached.copy.running {
            return Ok(false);
        }
        self.status = TxStatus::Failed;
        if let Err(e) = attached
            .send_query(ABORT_SQL, Owner::Proxy(Duty::Abort))
            .await
        {
            self.backend_lost(e).await?;
            return Ok(true);
        }
        self.drain().await?;
        Ok(true)
    }
}
