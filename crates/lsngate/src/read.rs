//! The read path: pick a replica with core's `route()`, read at once when the watcher knows the
//! server reached has the token, else wait on that same connection within the budget, and apply
//! the fallback policy (primary, error, stale-flagged) when no replica can prove it is fresh.
//!
//! Every read returns how it was served ([`Served`]). Replica failures that are safe to retry
//! elsewhere (connection lost, frozen, recovery conflict, promoted) move the read to the next
//! replica and then the fallback; an error of the statement itself is returned as is, never
//! re-run on the primary.

use std::time::Duration;

use lsngate_core::{
    Decision, Fallback, Lsn, PrimaryReason, ReadRequest, Refusal, Role, Token, Verdict, route,
};
use tokio::time::Instant;
use tokio_postgres::Row;
use tracing::Instrument;

use crate::config::WaitStrategy;
use crate::error::{Error, FallbackReason};
use crate::flight::{self, Answer, FlightError, Params};
use crate::gate::{Gate, Inner, Permit};
use crate::pool::{Pooled, discard};

/// Which node served a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServedBy {
    /// Replica number `0..` in configuration order.
    Replica(usize),
    /// The primary.
    Primary,
}

/// How a read was served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// The node that answered.
    pub by: ServedBy,
    /// Its name: `primary`, `replica0`, ...
    pub node: String,
    /// The replica had to prove it had the token first (a wait or a replay check); false when
    /// it was already known to have it (zero extra round trips) or for reads without a token.
    pub waited: bool,
    /// Time spent before the replica proved the token (or before giving up on replicas).
    pub wait_time: Duration,
    /// Why the read left the replicas, when it did.
    pub fallback: Option<FallbackReason>,
    /// The rows may predate the token (only with [`Fallback::Stale`] or
    /// [`lsngate_core::WhenGuarded::ServeStale`]).
    pub stale: bool,
    /// A position at or past everything the read saw (replay position right after it on a
    /// replica, insert position on the primary); a session's next floor.
    pub seen: Option<Lsn>,
}

/// Rows plus how they were served.
#[derive(Debug)]
pub struct Read {
    /// The rows, as tokio-postgres returns them.
    pub rows: Vec<Row>,
    /// Which node served them, waited or not, fallback, stale.
    pub served: Served,
}

/// One read being built: token, budget, fallback policy. From [`Gate::read`].
#[must_use = "a read does nothing until .query() is awaited"]
pub struct ReadBuilder<'g> {
    gate: &'g Gate,
    token: Option<Token>,
    budget: Option<Duration>,
    fallback: Option<Fallback>,
}

impl<'g> ReadBuilder<'g> {
    pub(crate) fn new(gate: &'g Gate) -> ReadBuilder<'g> {
        ReadBuilder {
            gate,
            token: None,
            budget: None,
            fallback: None,
        }
    }

    /// The read must see everything `token` stands for (`None`: an eventual read).
    pub fn after(mut self, token: impl Into<Option<Token>>) -> Self {
        self.token = token.into();
        self
    }

    /// Overrides the configured budget for this read.
    pub fn budget(mut self, budget: Duration) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Overrides the configured fallback policy for this read.
    pub fn fallback(mut self, fallback: Fallback) -> Self {
        self.fallback = Some(fallback);
        self
    }

    /// Runs `sql` (read-only, one statement, `$1`-style parameters).
    pub async fn query(self, sql: &str, params: Params<'_>) -> Result<Read, Error> {
        let inner = self.gate.inner();
        let plan = Plan {
            token: self.token,
            budget: self.budget.unwrap_or(inner.config.budget),
            fallback: self.fallback.unwrap_or(inner.config.fallback),
        };
        let span = tracing::debug_span!("lsngate.read", token = ?plan.token.map(|t| t.lsn));
        let result = execute(inner, &plan, sql, params).instrument(span).await;
        record(inner, &result);
        result
    }
}

/// What a read needs besides its SQL.
pub(crate) struct Plan {
    pub token: Option<Token>,
    pub budget: Duration,
    pub fallback: Fallback,
}

/// Where a replica attempt ended.
enum Attempt {
    /// Proven fresh (or token-less).
    Fresh {
        answer: Answer,
        waited: bool,
        wait_time: Duration,
    },
    /// Budget spent; the rows may be stale.
    NotYet(Answer),
    /// The server is not in recovery.
    Promoted,
}

async fn execute(inner: &Inner, plan: &Plan, sql: &str, params: Params<'_>) -> Result<Read, Error> {
    let start = Instant::now();
    let deadline = start + plan.budget;
    let hard = deadline + inner.config.io_grace;
    let floor = plan.token.map(|t| t.lsn);
    let token_timeline = plan.token.and_then(|t| t.timeline);
    let primary_timeline = inner.watcher.primary_timeline();
    if lsngate_core::timeline::floor_predates(token_timeline, primary_timeline) {
        let why = FallbackReason::TimelineChanged;
        return fall_back(inner, plan, why, None, start, sql, params).await;
    }
    // A token from a timeline newer than any primary seen: only replicas on it qualify, and
    // when none does the honest reason is still the timeline.
    let newer_timeline = token_timeline > primary_timeline && primary_timeline.is_some();
    let mut excluded = vec![false; inner.replicas.len()];
    let mut reason = None;
    let mut stale = None;
    loop {
        let index = match next_replica(inner, plan, &excluded, deadline) {
            Ok(index) => index,
            Err(FallbackReason::NoReplica) if newer_timeline && reason.is_none() => {
                let why = FallbackReason::TimelineChanged;
                return fall_back(inner, plan, why, stale, start, sql, params).await;
            }
            Err(why) => {
                let why = reason.unwrap_or(why);
                return fall_back(inner, plan, why, stale, start, sql, params).await;
            }
        };
        excluded[index] = true;
        let failure = match attempt(inner, index, floor, deadline, hard, sql, params).await {
            Ok(Attempt::Fresh {
                answer,
                waited,
                wait_time,
            }) => return Ok(replica_read(inner, index, answer, waited, wait_time)),
            Ok(Attempt::NotYet(answer)) => {
                stale = Some((index, answer));
                FallbackReason::BudgetSpent
            }
            Ok(Attempt::Promoted) => {
                inner.watcher.observe_role(index, Role::Primary);
                FallbackReason::Promoted
            }
            Err(error) => absorb(inner, index, error)?,
        };
        reason = Some(failure);
    }
}

/// The next replica to try, skipping `excluded` ones; once the budget is spent only replicas
/// already known to have the token qualify.
fn next_replica(
    inner: &Inner,
    plan: &Plan,
    excluded: &[bool],
    deadline: Instant,
) -> Result<usize, FallbackReason> {
    let need = match plan.token {
        Some(token) => lsngate_core::timeline::Need::Floor(token.timeline),
        None => lsngate_core::timeline::Need::Any,
    };
    let mut states = inner.watcher.states(need);
    for ((state, out), pool) in states.iter_mut().zip(excluded).zip(&inner.replicas) {
        state.healthy &= !out;
        state.busy = pool.busy();
    }
    let request = ReadRequest {
        floor: plan.token.map(|t| t.lsn),
        may_wait: Instant::now() < deadline,
        lag_bound: inner.config.lag_bound,
        spin: inner.next_spin(),
    };
    match route(&request, &states) {
        Decision::Replica { index, .. } => Ok(index),
        Decision::Primary(PrimaryReason::NoReplica) => Err(FallbackReason::NoReplica),
        Decision::Primary(PrimaryReason::NotCaughtUp) => Err(FallbackReason::BudgetSpent),
        Decision::Primary(PrimaryReason::AllLagging) => Err(FallbackReason::AllLagging),
    }
}

/// Records a failed replica attempt; a statement error ends the read, anything else makes it
/// try elsewhere.
fn absorb(inner: &Inner, index: usize, error: FlightError) -> Result<FallbackReason, Error> {
    match error {
        FlightError::Unreachable(cause) => {
            inner.watcher.mark_unreachable(index, &cause);
            Ok(FallbackReason::Unreachable)
        }
        FlightError::Conflict(cause) => {
            tracing::info!(
                replica = index,
                cause,
                "read cancelled by a recovery conflict"
            );
            Ok(FallbackReason::RecoveryConflict)
        }
        FlightError::Query(source) => Err(Error::Query {
            node: inner.replicas[index].name.clone(),
            source,
        }),
    }
}

fn replica_read(
    inner: &Inner,
    index: usize,
    answer: Answer,
    waited: bool,
    wait_time: Duration,
) -> Read {
    Read {
        rows: answer.rows.unwrap_or_default(),
        served: Served {
            by: ServedBy::Replica(index),
            node: inner.replicas[index].name.clone(),
            waited,
            wait_time,
            fallback: None,
            stale: false,
            seen: answer.seen,
        },
    }
}

/// One try on replica `index`, bounded by `hard` (budget + I/O grace) in every step.
async fn attempt(
    inner: &Inner,
    index: usize,
    floor: Option<Lsn>,
    deadline: Instant,
    hard: Instant,
    sql: &str,
    params: Params<'_>,
) -> Result<Attempt, FlightError> {
    let pool = &inner.replicas[index];
    let mut conn = pool
        .checkout(hard)
        .await
        .map_err(|e| FlightError::Unreachable(format!("{}: {e}", pool.address)))?;
    let outcome = tokio::time::timeout_at(
        hard,
        on_connection(inner, index, &mut conn, floor, deadline, sql, params),
    )
    .await;
    match outcome {
        Err(_) => {
            discard(conn);
            Err(FlightError::Unreachable(format!(
                "{}: no answer within the budget + I/O grace",
                pool.address
            )))
        }
        Ok(Err(error)) => {
            if !matches!(error, FlightError::Query(_)) {
                discard(conn);
            }
            Err(error)
        }
        Ok(Ok(attempt)) => Ok(attempt),
    }
}

async fn on_connection(
    inner: &Inner,
    index: usize,
    conn: &mut Pooled,
    floor: Option<Lsn>,
    deadline: Instant,
    sql: &str,
    params: Params<'_>,
) -> Result<Attempt, FlightError> {
    let server = conn.facts.server.clone();
    let known = inner.watcher.replayed(&server);
    let started = Instant::now();
    let Some(floor) = floor.filter(|&f| known.is_none_or(|k| k < f)) else {
        // Known covered (or no token): the read alone, zero extra round trips.
        let answer = flight::read(conn, sql, params, false)
            .await
            .map_err(flight::classify)?;
        if answer.verdict == Verdict::NotInRecovery {
            return Ok(Attempt::Promoted);
        }
        if let Some(seen) = answer.seen {
            inner.watcher.observe_replayed(index, &server, seen);
        }
        return Ok(Attempt::Fresh {
            answer,
            waited: false,
            wait_time: Duration::ZERO,
        });
    };
    let wait_for = match inner.config.wait_strategy {
        WaitStrategy::Auto => conn.facts.has_wait_for(),
        WaitStrategy::WaitFor => true,
        WaitStrategy::Poll => false,
    };
    let span = tracing::debug_span!("lsngate.wait", replica = index, token = %floor, wait_for);
    let answer = async {
        if wait_for {
            let left = deadline.saturating_duration_since(Instant::now());
            flight::wait_for_then_read(conn, floor, left, sql, params).await
        } else {
            flight::poll_then_read(conn, floor, deadline, sql, params).await
        }
    }
    .instrument(span)
    .await
    .map_err(flight::classify)?;
    let wait_time = started.elapsed();
    metrics::histogram!(crate::metrics::WAIT_SECONDS).record(wait_time.as_secs_f64());
    if let Some(seen) = answer.seen {
        inner.watcher.observe_replayed(index, &server, seen);
    }
    Ok(match answer.verdict {
        Verdict::Passed => {
            inner.watcher.observe_replayed(index, &server, floor);
            Attempt::Fresh {
                answer,
                waited: true,
                wait_time,
            }
        }
        Verdict::NotYet { .. } => Attempt::NotYet(answer),
        Verdict::NotInRecovery => Attempt::Promoted,
    })
}

/// No replica served the read: apply the fallback policy, then the primary guard.
async fn fall_back(
    inner: &Inner,
    plan: &Plan,
    reason: FallbackReason,
    stale: Option<(usize, Answer)>,
    start: Instant,
    sql: &str,
    params: Params<'_>,
) -> Result<Read, Error> {
    let span = tracing::info_span!("lsngate.fallback", %reason, token = ?plan.token.map(|t| t.lsn));
    let _entered = span.enter();
    tracing::debug!("read leaves the replicas");
    metrics::counter!(crate::metrics::FALLBACKS, "reason" => reason.to_string()).increment(1);
    let wait_time = start.elapsed();
    match plan.fallback {
        Fallback::Error => {
            return Err(Error::NotReplayed {
                token: plan.token.map(|t| t.lsn),
                reason,
                replicas: inner.watcher.positions(&inner.names),
            });
        }
        Fallback::Stale if stale.as_ref().is_some_and(|(_, a)| a.rows.is_some()) => {
            return Ok(stale_read(inner, stale, reason, wait_time).expect("checked"));
        }
        _ => {}
    }
    drop(_entered);
    let permit = match queue_for_primary(inner, plan, start, sql, params).await {
        Queued::Admitted(permit) => permit,
        Queued::Rescued(read) => return Ok(read),
        Queued::Failed(error) => return Err(error),
        Queued::Refused(refusal) => {
            let guarded = Error::guarded(plan.token.as_ref(), reason, refusal);
            return match inner.config.when_guarded {
                lsngate_core::WhenGuarded::ServeStale => {
                    stale_read(inner, stale, reason, wait_time).ok_or(guarded)
                }
                _ => Err(guarded),
            };
        }
    };
    let answer = inner.read_primary(sql, params).await;
    drop(permit);
    let answer = answer?;
    Ok(Read {
        rows: answer.rows.unwrap_or_default(),
        served: Served {
            by: ServedBy::Primary,
            node: inner.primary.name.clone(),
            waited: false,
            wait_time,
            fallback: Some(reason),
            stale: false,
            seen: answer.seen,
        },
    })
}

/// How a fallback's wait for a primary slot ended.
enum Queued<'a> {
    /// The guard gave it a slot.
    Admitted(Permit<'a>),
    /// A replica seen to have the token while it queued served it.
    Rescued(Read),
    /// No slot before the queue's deadline (or none asked: `when_guarded` is not `wait`).
    Refused(Refusal),
    /// The replica that served it found an error in the statement itself.
    Failed(Error),
}

/// A primary slot for a fallback, queueing as configured. While it queues (`when_guarded =
/// wait`), a replica known to have the read's token serves it instead (tried once): in a lag
/// event the guard refuses most fallbacks, and the replicas' recovery would otherwise not reach
/// the reads already queued.
async fn queue_for_primary<'a>(
    inner: &'a Inner,
    plan: &Plan,
    start: Instant,
    sql: &str,
    params: Params<'_>,
) -> Queued<'a> {
    let queue_until = Instant::now() + inner.config.guard_queue_timeout;
    let mut may_rescue =
        plan.token.is_some() && inner.config.when_guarded == lsngate_core::WhenGuarded::Wait;
    loop {
        let refusal = match inner.try_admit_fallback() {
            Ok(permit) => return Queued::Admitted(permit),
            Err(refusal) => refusal,
        };
        // Past its budget (`start`), only a replica already known to have the token qualifies.
        let none_excluded = vec![false; inner.replicas.len()];
        if may_rescue && let Ok(index) = next_replica(inner, plan, &none_excluded, start) {
            may_rescue = false;
            let floor = plan.token.map(|t| t.lsn);
            let hard = Instant::now() + inner.config.io_grace;
            match attempt(inner, index, floor, start, hard, sql, params).await {
                Ok(Attempt::Fresh { answer, waited, .. }) => {
                    tracing::info!(
                        replica = index,
                        "a replica replayed the token of a read queued for the primary; read there"
                    );
                    metrics::counter!(crate::metrics::RESCUED).increment(1);
                    let read = replica_read(inner, index, answer, waited, start.elapsed());
                    return Queued::Rescued(read);
                }
                Ok(Attempt::Promoted) => inner.watcher.observe_role(index, Role::Primary),
                Ok(Attempt::NotYet(_)) => {}
                // Lost or conflicted there: it goes on queueing. An error of the statement
                // itself is the read's answer, as on any replica.
                Err(error) => {
                    if let Err(error) = absorb(inner, index, error) {
                        return Queued::Failed(error);
                    }
                }
            }
        }
        let left = queue_until.saturating_duration_since(Instant::now());
        match lsngate_core::pace::guard_queue_pause(inner.config.when_guarded, left) {
            Some(pause) => tokio::time::sleep(pause).await,
            None => return Queued::Refused(refusal),
        }
    }
}

fn stale_read(
    inner: &Inner,
    stale: Option<(usize, Answer)>,
    reason: FallbackReason,
    wait_time: Duration,
) -> Option<Read> {
    let (index, answer) = stale?;
    Some(Read {
        rows: answer.rows?,
        served: Served {
            by: ServedBy::Replica(index),
            node: inner.replicas[index].name.clone(),
            waited: true,
            wait_time,
            fallback: Some(reason),
            stale: true,
            seen: answer.seen,
        },
    })
}

/// Outcome metrics and the guard's rate input.
fn record(inner: &Inner, result: &Result<Read, Error>) {
    let outcome = match result {
        Err(_) => "error",
        Ok(read) if read.served.stale => "stale",
        Ok(read) if read.served.by == ServedBy::Primary => "primary_fallback",
        Ok(read) if read.served.waited => "replica_after_wait",
        Ok(_) => "replica_at_once",
    };
    metrics::counter!(crate::metrics::READS, "outcome" => outcome).increment(1);
    inner.record_read(outcome == "primary_fallback");
}
