//! The write path: transactions on the primary that return a commit [`Token`].
//!
//! The token is `pg_current_wal_insert_lsn()` read on the same connection *after* COMMIT
//! returns — at or past the end of the commit record even under `synchronous_commit = off` —
//! sent in the same network flight as the COMMIT (two pipelined simple-query messages: the
//! server finishes the COMMIT, then runs the SELECT in a new implicit transaction), so the token
//! costs no round trip. A position read inside the transaction, or in the same query string,
//! would precede the commit record. Writes are never retried here.

use std::ops::Deref;

use futures_util::future::BoxFuture;
use futures_util::join;
use lsngate_core::Token;
use tokio_postgres::{Client, Row};

use crate::error::Error;
use crate::flight::{self, Params};
use crate::gate::{Gate, Inner};
use crate::pool::{Pooled, discard};

/// An open transaction on the primary. Derefs to [`tokio_postgres::Client`] for statements;
/// finish with [`WriteTx::commit`] (returns the token) or [`WriteTx::rollback`]. Dropped
/// unfinished, it is rolled back.
pub struct WriteTx<'g> {
    inner: &'g Inner,
    conn: Option<Pooled>,
}

impl Deref for WriteTx<'_> {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self
            .conn
            .as_ref()
            .expect("open until commit/rollback")
            .client
    }
}

impl WriteTx<'_> {
    /// Commits and returns the commit token, in one network flight.
    pub async fn commit(mut self) -> Result<Token, Error> {
        let mut conn = self.conn.take().expect("open until commit/rollback");
        if let Err(error) = flight::prepare_commit_position(&mut conn).await {
            // COMMIT was never sent; a broken connection aborts the transaction.
            discard(conn);
            return Err(Error::CommitFailed(error));
        }
        let (committed, position) = join!(
            conn.client.batch_execute("COMMIT"),
            flight::commit_position_on(&conn)
        );
        if let Err(error) = committed {
            let unknown = error.code().is_none();
            discard(conn);
            return Err(if unknown {
                Error::CommitOutcomeUnknown(error)
            } else {
                Error::CommitFailed(error)
            });
        }
        match position {
            Ok((lsn, timeline)) => Ok(self.inner.token_from(lsn, timeline)),
            Err(cause) => {
                discard(conn);
                Err(Error::TokenUnavailable { cause })
            }
        }
    }

    /// Rolls back.
    pub async fn rollback(mut self) -> Result<(), Error> {
        let conn = self.conn.take().expect("open until commit/rollback");
        match conn.client.batch_execute("ROLLBACK").await {
            Ok(()) => Ok(()),
            Err(error) => {
                discard(conn);
                Err(self.inner.primary_unavailable(error.to_string()))
            }
        }
    }
}

impl Drop for WriteTx<'_> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        // The connection must not go back to the pool inside a transaction. Roll back in the
        // background when a runtime is there; otherwise closing the connection aborts it.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if conn.client.batch_execute("ROLLBACK").await.is_err() {
                        discard(conn);
                    }
                });
            }
            Err(_) => discard(conn),
        }
    }
}

/// The token for a transaction the caller committed itself on `client` (a primary connection
/// it holds): call right after COMMIT returned, on the same connection.
pub async fn commit_token(client: &Client) -> Result<Token, Error> {
    let (lsn, timeline) = flight::position_of(client)
        .await
        .map_err(|cause| Error::TokenUnavailable { cause })?;
    Ok(Token {
        lsn,
        timeline,
        expires_at: None,
    })
}

/// What an autocommit write should return.
#[derive(Clone, Copy)]
enum Returning {
    Count,
    Rows,
}

enum Outcome {
    Count(u64),
    Rows(Vec<Row>),
}

/// Rows written by [`Gate::write`] and the token that makes them visible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Rows the statement affected.
    pub rows: u64,
    /// Read with this to see the write.
    pub token: Token,
}

impl Gate {
    /// Opens a transaction on the primary (`BEGIN`, one round trip).
    pub async fn begin(&self) -> Result<WriteTx<'_>, Error> {
        let inner = self.inner();
        let conn = inner.checkout_primary().await?;
        if let Err(error) = conn.client.batch_execute("BEGIN").await {
            discard(conn);
            return Err(inner.primary_unavailable(error.to_string()));
        }
        Ok(WriteTx {
            inner,
            conn: Some(conn),
        })
    }

    /// Runs `work` in a transaction on the primary, commits, and returns its result and the
    /// commit token. On an error from `work` the transaction is rolled back and the error
    /// returned (as [`Error::Query`]); nothing is retried.
    ///
    /// ```no_run
    /// # async fn f(gate: lsngate::Gate) -> Result<(), lsngate::Error> {
    /// let (id, token) = gate
    ///     .transaction(|tx| Box::pin(async move {
    ///         let row = tx.query_one("INSERT INTO orders (item) VALUES ($1) RETURNING id", &[&"book"]).await?;
    ///         Ok(row.get::<_, i64>(0))
    ///     }))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn transaction<T, F>(&self, work: F) -> Result<(T, Token), Error>
    where
        F: for<'c> FnOnce(&'c Client) -> BoxFuture<'c, Result<T, tokio_postgres::Error>>,
    {
        let tx = self.begin().await?;
        match work(&tx).await {
            Ok(value) => Ok((value, tx.commit().await?)),
            Err(source) => {
                let _ = tx.rollback().await;
                Err(Error::Query {
                    node: self.inner().primary.name.clone(),
                    source,
                })
            }
        }
    }

    /// Runs one statement in autocommit on the primary and returns its row count and commit
    /// token; statement and token query leave in one flight (after the first use of `sql` on a
    /// connection, which prepares it).
    pub async fn write(&self, sql: &str, params: Params<'_>) -> Result<Written, Error> {
        let (outcome, token) = self.autocommit(sql, params, Returning::Count).await?;
        let rows = match outcome {
            Outcome::Count(rows) => rows,
            Outcome::Rows(rows) => rows.len() as u64,
        };
        Ok(Written { rows, token })
    }

    /// Like [`Gate::write`], for a statement that returns rows (`INSERT ... RETURNING id`):
    /// the rows and the commit token, in one flight.
    ///
    /// ```no_run
    /// # async fn f(gate: lsngate::Gate) -> Result<(), lsngate::Error> {
    /// let (rows, token) = gate
    ///     .write_returning("INSERT INTO orders (item) VALUES ($1) RETURNING id", &[&"book"])
    ///     .await?;
    /// let id: i64 = rows[0].get(0);
    /// # Ok(()) }
    /// ```
    pub async fn write_returning(
        &self,
        sql: &str,
        params: Params<'_>,
    ) -> Result<(Vec<Row>, Token), Error> {
        let (outcome, token) = self.autocommit(sql, params, Returning::Rows).await?;
        let rows = match outcome {
            Outcome::Rows(rows) => rows,
            Outcome::Count(_) => Vec::new(),
        };
        Ok((rows, token))
    }

    /// One autocommit statement and the commit position query, pipelined in one flight.
    async fn autocommit(
        &self,
        sql: &str,
        params: Params<'_>,
        returning: Returning,
    ) -> Result<(Outcome, Token), Error> {
        let inner = self.inner();
        let mut conn = inner.checkout_primary().await?;
        if let Err(source) = flight::prepare(&mut conn, sql).await {
            // Nothing ran yet: a broken connection here is just an unreachable primary.
            if source.code().is_none() {
                discard(conn);
                return Err(inner.primary_unavailable(source.to_string()));
            }
            return Err(self.primary_error(conn, source));
        }
        if let Err(source) = flight::prepare_commit_position(&mut conn).await {
            discard(conn);
            return Err(inner.primary_unavailable(source.to_string()));
        }
        let statement = conn.cached(sql).expect("prepared above");
        let run = async {
            match returning {
                Returning::Count => conn
                    .client
                    .execute(&statement, params)
                    .await
                    .map(Outcome::Count),
                Returning::Rows => conn
                    .client
                    .query(&statement, params)
                    .await
                    .map(Outcome::Rows),
            }
        };
        let (executed, position) = join!(run, flight::commit_position_on(&conn));
        let outcome = match executed {
            Ok(outcome) => outcome,
            Err(source) => return Err(self.primary_error(conn, source)),
        };
        match position {
            Ok((lsn, timeline)) => Ok((outcome, inner.token_from(lsn, timeline))),
            Err(cause) => {
                discard(conn);
                Err(Error::TokenUnavailable { cause })
            }
        }
    }

    fn primary_error(&self, conn: Pooled, source: tokio_postgres::Error) -> Error {
        let inner = self.inner();
        if source.code().is_none() {
            discard(conn);
            // An autocommit statement whose connection broke may or may not have committed.
            return Error::CommitOutcomeUnknown(source);
        }
        Error::Query {
            node: inner.primary.name.clone(),
            source,
        }
    }
}
