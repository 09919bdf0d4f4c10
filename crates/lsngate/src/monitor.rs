//! The background monitor: every poll interval, ask the primary for its WAL position and
//! timeline (the WAL clock that turns replay positions into time lag) and each replica for its
//! role, replay position and timeline, feeding the watcher and the per-replica gauges. Every node
//! gets the same statement, `lsngate_core::probe::POLL_SQL`, read by `lsngate_core::Poll` (the
//! proxy's monitor sends and reads the same).
//!
//! It is only an accelerator and a health check: reads never depend on it for correctness
//! (an unknown position just means a wait on the read's own connection). Every probe is
//! bounded by a timeout, so a frozen server cannot stall it. It stops when the gate is dropped.

use std::sync::{Arc, Weak};
use std::time::Duration;

use lsngate_core::probe::POLL_SQL;
use lsngate_core::{Poll, Role};
use tokio::time::Instant;
use tokio_postgres::SimpleQueryMessage;

use crate::flight;
use crate::gate::Inner;
use crate::pool::discard;

/// Polls every node from now on, the first poll after one interval (the gate ran one itself).
pub(crate) fn spawn(inner: Weak<Inner>) {
    tokio::spawn(async move {
        loop {
            let Some(interval) = inner.upgrade().map(|g| g.config.poll_interval) else {
                return;
            };
            tokio::time::sleep(interval).await;
            let Some(gate) = inner.upgrade() else { return };
            poll_once(&gate).await;
        }
    });
}

/// One poll of every node, each probe bounded by the connect timeout.
pub(crate) async fn poll_once(inner: &Arc<Inner>) {
    let probes = (0..inner.replicas.len()).map(|i| probe_replica(inner, i));
    futures_util::future::join(probe_primary(inner), futures_util::future::join_all(probes)).await;
}

fn probe_deadline(inner: &Inner) -> Instant {
    Instant::now() + inner.config.connect_timeout.max(Duration::from_millis(100))
}

async fn probe_primary(inner: &Inner) {
    let deadline = probe_deadline(inner);
    let Ok(conn) = inner.primary.checkout(deadline).await else {
        return;
    };
    let asked = Instant::now();
    match tokio::time::timeout_at(deadline, conn.client.simple_query(POLL_SQL)).await {
        Ok(Ok(messages)) => {
            if let Some(Poll {
                role: Role::Primary,
                position: Some(insert),
                timeline,
            }) = poll(&messages)
            {
                let lsn = conn.facts.reachable(insert);
                inner.watcher.observe_primary(asked, lsn, timeline);
            }
        }
        _ => discard(conn),
    }
}

async fn probe_replica(inner: &Inner, index: usize) {
    let pool = &inner.replicas[index];
    let deadline = probe_deadline(inner);
    let replica = pool.name.clone();
    let conn = match pool.checkout(deadline).await {
        Ok(conn) => conn,
        Err(error) => {
            inner.watcher.mark_unreachable(index, &error.to_string());
            metrics::gauge!(crate::metrics::REPLICA_UP, "replica" => replica).set(0.0);
            return;
        }
    };
    let answer = tokio::time::timeout_at(deadline, conn.client.simple_query(POLL_SQL)).await;
    let messages = match answer {
        Ok(Ok(messages)) => messages,
        Ok(Err(error)) => {
            inner.watcher.mark_unreachable(index, &error.to_string());
            return discard(conn);
        }
        Err(_) => {
            inner.watcher.mark_unreachable(index, "probe timed out");
            return discard(conn);
        }
    };
    // An answer that does not say is taken as a replica's, as before a first poll.
    let seen = poll(&messages);
    let role = seen.map_or(Role::Replica, |p| p.role);
    if let Some(Poll {
        role: Role::Replica,
        position,
        timeline: received,
    }) = seen
    {
        // The timeline first: an orphan stops serving before its position counts.
        inner.watcher.observe_receiver(index, received);
        if let Some(lsn) = position {
            inner
                .watcher
                .observe_replayed(index, &conn.facts.server, lsn);
        }
    }
    inner.watcher.observe_role(index, role);
    export(inner, index, role);
}

fn export(inner: &Inner, index: usize, role: Role) {
    let now = Instant::now();
    let state = inner.watcher.states(lsngate_core::timeline::Need::Any)[index];
    let lag = state
        .replayed
        .and_then(|r| inner.watcher.lag_behind(r, now));
    inner.watcher.observe_lag(index, lag);
    let replica = inner.replicas[index].name.clone();
    let up = if role == Role::Replica { 1.0 } else { 0.0 };
    metrics::gauge!(crate::metrics::REPLICA_UP, "replica" => replica.clone()).set(up);
    if let Some(replayed) = state.replayed {
        metrics::gauge!(crate::metrics::REPLAYED_LSN, "replica" => replica.clone())
            .set(replayed.as_u64() as f64);
    }
    if let Some(bytes) = state.lag_bytes {
        metrics::gauge!(crate::metrics::LAG_BYTES, "replica" => replica.clone()).set(bytes as f64);
    }
    if let Some(lag) = lag {
        metrics::gauge!(crate::metrics::LAG_SECONDS, "replica" => replica).set(lag.as_secs_f64());
    }
}

/// [`POLL_SQL`]'s answer.
fn poll(messages: &[SimpleQueryMessage]) -> Option<Poll> {
    Poll::from_row(&flight::columns(messages)?)
}
