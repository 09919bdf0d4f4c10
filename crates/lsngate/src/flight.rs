//! The statements sent to one server for one read, pipelined into as few network flights as the
//! protocol allows.
//!
//! tokio-postgres writes every request whose future has been polled before it reads replies, so
//! futures joined on one client leave in one flight and the server runs them in order. A read is
//! sent as `[wait or check] + read + position`: the wait (or the replay check) runs first, the
//! read takes its snapshot after it (autocommit, its own statement), and the trailing position
//! bounds what the read could have seen — the floor for the next read of a session. The read's
//! statement is prepared once per connection beforehand, so its Bind/Execute ride in the same
//! flight instead of waiting for a Parse reply.
//!
//! The statement texts and how their answers read (verdicts included) are
//! `lsngate_core::probe`'s, shared with the proxy: this module only sends them over
//! tokio-postgres. It does no routing and keeps no state: that is [`crate::read`] and the watcher.

use std::time::Duration;

use futures_util::join;
use lsngate_core::probe::{
    self, COMMIT_POSITION_SQL, CommitPosition, INSERT_POSITION_SQL, REPLAY_SQL, Replay,
};
use lsngate_core::{Lsn, Verdict};
use tokio::time::Instant;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row, SimpleQueryMessage, Statement, error::SqlState};

use crate::pool::Conn;

/// Parameters of a read, as tokio-postgres takes them.
pub type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// How a replica flight failed, classified for the fallback decision.
#[derive(Debug)]
pub(crate) enum FlightError {
    /// Connection-level: closed, refused, shut down, timed out. Safe to read elsewhere.
    Unreachable(String),
    /// Cancelled or terminated by a recovery conflict. Safe to read elsewhere.
    Conflict(String),
    /// The statement itself failed; the caller's problem, never retried elsewhere.
    Query(tokio_postgres::Error),
}

/// Sorts a driver error into the three kinds above.
pub(crate) fn classify(error: tokio_postgres::Error) -> FlightError {
    let Some(code) = error.code() else {
        return FlightError::Unreachable(error.to_string());
    };
    let conflict = [
        SqlState::T_R_SERIALIZATION_FAILURE,
        SqlState::T_R_DEADLOCK_DETECTED,
        SqlState::DATABASE_DROPPED,
    ];
    let unreachable = [
        SqlState::ADMIN_SHUTDOWN,
        SqlState::CRASH_SHUTDOWN,
        SqlState::CANNOT_CONNECT_NOW,
        SqlState::TOO_MANY_CONNECTIONS,
    ];
    if conflict.contains(code) {
        FlightError::Conflict(error.to_string())
    } else if unreachable.contains(code) || code.code().starts_with("08") {
        FlightError::Unreachable(error.to_string())
    } else {
        FlightError::Query(error)
    }
}

/// A finished replica or primary read.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The rows; `None` when the read failed but the verdict made it irrelevant (a replica that
    /// had not replayed a `CREATE TABLE` yet cannot even parse the read).
    pub rows: Option<Vec<Row>>,
    /// Position bounding what the read saw (from the trailing statement), when known.
    pub seen: Option<Lsn>,
    /// Verdict of the wait/check that preceded the read (`Passed` when none was needed).
    pub verdict: Verdict,
}

/// Prepares `sql` on this connection unless it already is (a round trip only the first time).
/// For the primary, which has every table, and for the position statements, which name none:
/// on a replica a read's statement is prepared after the wait, inside [`read_then_position`].
pub(crate) async fn prepare(conn: &mut Conn, sql: &str) -> Result<(), tokio_postgres::Error> {
    if conn.cached(sql).is_none() {
        let statement = conn.client.prepare(sql).await?;
        conn.remember(sql, statement);
    }
    Ok(())
}

/// What [`read_then_position`] returns: rows, the trailing statement's rows, a newly prepared
/// statement.
type ReadResult = (
    Result<Vec<Row>, tokio_postgres::Error>,
    Option<Vec<Row>>,
    Option<Statement>,
);

/// The read and then `trailing`. With a cached statement both requests leave on the first poll
/// (same flight as whatever was polled before); without, the Parse goes first and Bind/Execute
/// plus `trailing` follow its reply, so `trailing` always runs after the read's snapshot.
async fn read_then_position(
    client: &Client,
    cached: Option<Statement>,
    sql: &str,
    params: Params<'_>,
    trailing: &Statement,
) -> ReadResult {
    let (statement, fresh) = match cached {
        Some(statement) => (statement, false),
        None => match client.prepare(sql).await {
            Ok(statement) => (statement, true),
            Err(error) => return (Err(error), None, None),
        },
    };
    let (rows, position) = join!(
        client.query(&statement, params),
        client.query(trailing, &[])
    );
    (rows, position.ok(), fresh.then_some(statement))
}

/// Read + trailing position. `primary` picks which position statement trails.
pub(crate) async fn read(
    conn: &mut Conn,
    sql: &str,
    params: Params<'_>,
    primary: bool,
) -> Result<Answer, tokio_postgres::Error> {
    let trailing = if primary {
        COMMIT_POSITION_SQL
    } else {
        REPLAY_SQL
    };
    // Prepared once per connection (built-in functions only, so a replica can prepare it before
    // it has the read's tables): after that it is bound and executed in the read's flight,
    // never parsed or planned again.
    prepare(conn, trailing).await?;
    let trailing = conn.cached(trailing).expect("prepared above");
    let cached = conn.cached(sql);
    let (rows, position, fresh) =
        read_then_position(&conn.client, cached, sql, params, &trailing).await;
    if let Some(statement) = fresh {
        conn.remember(sql, statement);
    }
    let position = position
        .as_deref()
        .and_then(<[Row]>::first)
        .map(row_columns);
    let (in_recovery, seen) = match position {
        Some(row) if primary => (None, probe::commit_position(&row).map(|p| p.lsn)),
        Some(row) => {
            let replay = Replay::from_row(&row);
            (replay.in_recovery, replay.replayed)
        }
        None => (None, None),
    };
    // A "replica" that answers not in recovery was promoted: its answer is not used as one.
    let verdict = match in_recovery {
        Some(false) => Verdict::NotInRecovery,
        _ => Verdict::Passed,
    };
    Ok(Answer {
        rows: Some(rows?),
        seen,
        verdict,
    })
}

/// Keeps the rows when the verdict makes them matter; a failed read under `Passed` is the
/// caller's error, under any other verdict it is just a missing stale answer.
fn settle(
    rows: Result<Vec<Row>, tokio_postgres::Error>,
    seen: Option<Lsn>,
    verdict: Verdict,
) -> Result<Answer, tokio_postgres::Error> {
    let rows = match (rows, verdict) {
        (Ok(rows), _) => Some(rows),
        (Err(error), Verdict::Passed) => return Err(error),
        (Err(_), _) => None,
    };
    Ok(Answer {
        rows,
        seen,
        verdict,
    })
}

/// What runs before the read in [`read_behind`].
enum Before<'a> {
    /// `WAIT FOR LSN ...` (a literal position: sent as a simple query, parsed each time).
    Wait(&'a str),
    /// [`REPLAY_SQL`], prepared once per connection like the trailing position.
    Check,
}

/// The first row of an answer as owned text columns (`None` for NULL); empty without a row.
type Columns = Vec<Option<String>>;

/// What [`read_behind`] returns: the answer to the statement before the read, the read's rows
/// and the position trailing them.
type BehindResult = (
    Result<Columns, tokio_postgres::Error>,
    Result<Vec<Row>, tokio_postgres::Error>,
    Option<Lsn>,
);

/// `before` (a wait or a replay check), then the read and the replay position, in one flight.
/// Fails only when the position statement cannot be prepared (once per connection).
async fn read_behind(
    conn: &mut Conn,
    before: Before<'_>,
    sql: &str,
    params: Params<'_>,
) -> Result<BehindResult, tokio_postgres::Error> {
    prepare(conn, REPLAY_SQL).await?;
    let replay = conn.cached(REPLAY_SQL).expect("prepared above");
    let cached = conn.cached(sql);
    let client = &conn.client;
    // Each request leaves when its future is first polled: `join!` polls the statement before
    // the read first, so the server runs it first.
    let answer = async {
        match before {
            Before::Wait(wait) => client
                .simple_query(wait)
                .await
                .map(|messages| owned(columns(&messages))),
            Before::Check => client
                .query(&replay, &[])
                .await
                .map(|rows| owned(rows.first().map(row_columns))),
        }
    };
    let (answer, (rows, position, fresh)) = join!(
        answer,
        read_then_position(client, cached, sql, params, &replay)
    );
    if let Some(statement) = fresh {
        conn.remember(sql, statement);
    }
    let seen = position
        .as_deref()
        .and_then(<[Row]>::first)
        .map(|row| Replay::from_row(&row_columns(row)))
        .unwrap_or_default();
    Ok((answer, rows, seen.replayed))
}

fn owned(row: Option<Vec<Option<&str>>>) -> Columns {
    row.unwrap_or_default()
        .into_iter()
        .map(|c| c.map(str::to_string))
        .collect()
}

fn borrowed(row: &Columns) -> Vec<Option<&str>> {
    row.iter().map(Option::as_deref).collect()
}

/// PostgreSQL ≥ 19: `WAIT FOR LSN` + read + position in one flight. The read's rows are only
/// fresh when the wait said `success`; otherwise they are returned for the stale policy.
pub(crate) async fn wait_for_then_read(
    conn: &mut Conn,
    floor: Lsn,
    timeout: Duration,
    sql: &str,
    params: Params<'_>,
) -> Result<Answer, tokio_postgres::Error> {
    let wait = probe::wait_for_sql(floor, timeout);
    let (status, rows, seen) = read_behind(conn, Before::Wait(&wait), sql, params).await?;
    let status = status?;
    let verdict = match Verdict::of_wait(status.first().and_then(Option::as_deref)) {
        Verdict::NotYet { .. } => Verdict::NotYet { replayed: seen },
        verdict => verdict,
    };
    settle(rows, seen, verdict)
}

/// PostgreSQL ≤ 18: check replay + read + position in one flight; if the check fails, poll
/// with backoff until `deadline`, then read again (replay only moves forward on a running
/// server, so a true check stays true for the following statement). The check is the prepared
/// [`REPLAY_SQL`]: bound and executed, never parsed or planned again.
pub(crate) async fn poll_then_read(
    conn: &mut Conn,
    floor: Lsn,
    deadline: Instant,
    sql: &str,
    params: Params<'_>,
) -> Result<Answer, tokio_postgres::Error> {
    let (check, rows, seen) = read_behind(conn, Before::Check, sql, params).await?;
    let check = Replay::from_row(&borrowed(&check?));
    let first = Verdict::of_replay(check, floor);
    if !matches!(first, Verdict::NotYet { .. }) {
        return settle(rows, seen, first);
    }
    let replayed = check.replayed;
    let replay = conn.cached(REPLAY_SQL).expect("prepared by read_behind");
    let mut backoff = lsngate_core::pace::ReplayBackoff::default();
    loop {
        let now = Instant::now();
        if now >= deadline {
            return settle(rows, seen, Verdict::NotYet { replayed });
        }
        tokio::time::sleep(backoff.next_pause(deadline - now)).await;
        let answer = conn.client.query(&replay, &[]).await?;
        let check = answer
            .first()
            .map(|row| Replay::from_row(&row_columns(row)))
            .unwrap_or_default();
        match Verdict::of_replay(check, floor) {
            Verdict::Passed => return read(conn, sql, params, false).await,
            Verdict::NotInRecovery => return settle(rows, seen, Verdict::NotInRecovery),
            Verdict::NotYet { .. } => {}
        }
    }
}

fn first_row(messages: &[SimpleQueryMessage]) -> Option<&tokio_postgres::SimpleQueryRow> {
    messages.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => Some(row),
        _ => None,
    })
}

/// A row of text columns (`None` for NULL), as `lsngate_core::probe` reads them.
fn row_columns(row: &Row) -> Vec<Option<&str>> {
    (0..row.len()).map(|i| row.get(i)).collect()
}

/// The first row's columns as text (`None` for NULL), as `lsngate_core::probe` reads them.
pub(crate) fn columns(messages: &[SimpleQueryMessage]) -> Option<Vec<Option<&str>>> {
    let row = first_row(messages)?;
    Some((0..row.len()).map(|i| row.get(i)).collect())
}

/// [`COMMIT_POSITION_SQL`]'s answer.
pub(crate) fn commit_position(messages: &[SimpleQueryMessage]) -> Option<CommitPosition> {
    probe::commit_position(&columns(messages)?)
}

// The insert position alone (`INSERT_POSITION_SQL`) is prepared once per primary connection:
// after every commit the server only binds and executes it (no parse or plan on the hot path),
// and the timeline and WAL sizes come from what the connection learned when it was opened.

/// Readies `conn` for [`commit_position_on`] (one round trip, the first time only).
pub(crate) async fn prepare_commit_position(conn: &mut Conn) -> Result<(), tokio_postgres::Error> {
    match conn.facts.timeline {
        Some(_) => prepare(conn, INSERT_POSITION_SQL).await,
        None => Ok(()),
    }
}

/// The token position after a commit on `conn`; polled together with the commit, so both leave
/// in one flight and the server answers in order. Falls back to [`COMMIT_POSITION_SQL`] on a
/// connection whose timeline is not known.
pub(crate) async fn commit_position_on(conn: &Conn) -> Result<(Lsn, Option<u32>), String> {
    match (conn.facts.timeline, conn.cached(INSERT_POSITION_SQL)) {
        (Some(timeline), Some(statement)) => {
            let row = conn
                .client
                .query_one(&statement, &[])
                .await
                .map_err(|e| e.to_string())?;
            let insert = Lsn::parse(row.get::<_, &str>(0)).map_err(|e| e.to_string())?;
            let lsn = conn.facts.reachable(insert);
            Ok((lsn, Some(timeline)))
        }
        _ => position_of(&conn.client).await,
    }
}

/// Runs [`COMMIT_POSITION_SQL`] on `client` (for a commit the caller made itself).
pub(crate) async fn position_of(client: &Client) -> Result<(Lsn, Option<u32>), String> {
    let messages = client
        .simple_query(COMMIT_POSITION_SQL)
        .await
        .map_err(|e| e.to_string())?;
    commit_position(&messages)
        .map(|p| (p.lsn, p.timeline))
        .ok_or_else(|| "no position in the answer".to_string())
}
