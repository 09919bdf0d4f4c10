//! The job side of the token: [`JobContext`] wraps one job taken from a queue. Its reads go
//! through the `lsngate` gate after the payload's token — on a replica once it has replayed the
//! token, within the budget, else on the primary (the gate's fallback policy) — so the worker
//! never misses the row the request wrote. Its writes raise the token, and the follow-up jobs it
//! enqueues carry the max.
//!
//! Not a queue or a scheduler: claiming jobs (`FOR UPDATE SKIP LOCKED`, Redis, …) is yours.

use std::time::Duration;

use lsngate::{Gate, Params, Read, ReadBuilder, Written};
use lsngate_core::Token;

use crate::job::JobPayload;

/// One job being worked on: its body, the token its reads honour, and what it committed.
#[derive(Debug)]
pub struct JobContext<'g, T> {
    gate: &'g Gate,
    payload: JobPayload<T>,
    committed: Option<Token>,
    budget: Option<Duration>,
}

impl<'g, T> JobContext<'g, T> {
    /// Starts work on `payload` with `gate`; reads use the gate's budget and fallback.
    pub fn new(gate: &'g Gate, payload: JobPayload<T>) -> JobContext<'g, T> {
        JobContext {
            gate,
            payload,
            committed: None,
            budget: None,
        }
    }

    /// Waits at most `budget` for a replica before the primary serves a read (instead of the
    /// gate's default). Jobs are rarely in a hurry: a longer budget keeps load off the primary.
    pub fn with_budget(mut self, budget: Duration) -> JobContext<'g, T> {
        self.budget = Some(budget);
        self
    }

    /// The job body.
    pub fn job(&self) -> &T {
        &self.payload.job
    }

    /// The token reads honour now: the payload's, raised by this job's own writes.
    pub fn token(&self) -> Option<Token> {
        Token::merge_all(self.payload.token.into_iter().chain(self.committed))
    }

    /// A read after [`JobContext::token`], to adjust (fallback policy) before `.query(..)`.
    pub fn read(&self) -> ReadBuilder<'g> {
        let read = self.gate.read().after(self.token());
        match self.budget {
            Some(budget) => read.budget(budget),
            None => read,
        }
    }

    /// Runs one read-only statement after the job's token; the answer says who served it and
    /// how long it waited.
    pub async fn query(&self, sql: &str, params: Params<'_>) -> Result<Read, lsngate::Error> {
        self.read().query(sql, params).await
    }

    /// Runs one statement on the primary and raises the job's token to its commit. Never
    /// retried: a failed write is the caller's to handle.
    pub async fn write(
        &mut self,
        sql: &str,
        params: Params<'_>,
    ) -> Result<Written, lsngate::Error> {
        let written = self.gate.write(sql, params).await?;
        self.record_commit(written.token);
        Ok(written)
    }

    /// Raises the job's token to a commit made some other way (e.g. `Gate::transaction`).
    pub fn record_commit(&mut self, token: Token) {
        self.committed = Token::merge_all(self.committed.into_iter().chain([token]));
    }

    /// The payload of a job to enqueue next: it carries this job's token, max-merged with what
    /// this job committed.
    pub fn follow_up<U>(&self, job: U) -> JobPayload<U> {
        self.payload.follow_up(job, self.committed)
    }
}
