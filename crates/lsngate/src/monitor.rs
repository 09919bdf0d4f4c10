//! The background monitor: every poll interval, ask the primary for its WAL position and
//! timeline (the WAL clock that turns replay positions into time lag) and each replica for its
//! role, replay position and timeline, feeding the watcher and the per-replica gauges.
//!
//! It is only an accelerator and a health check: reads never depend on it for correctness
//! (an unknown position just means a wait on the read's own connection). Every probe is
//! bounded by a timeout, so a frozen server cannot stall it. It stops when the gate is dropped.

use std::sync::{Arc, Weak};
use std::time::Duration;

use lsngate_core::Role;
use tokio::time::Instant;
use tokio_postgres::SimpleQueryMessage;

use lsngate_core::probe::COMMIT_POSITION_SQL;

use crate::flight;
use crate::gate::Inner;
use crate::pool::discard;

/// On a replica: role, replay position and the timeline its WAL receiver streams (0 when the
/// receiver runs but the timeline is hidden from unprivileged users, NULL when none runs).
const REPLICA_PROBE_SQL: &str = "SELECT pg_is_in_recovery()::text, pg_last_wal_replay_lsn()::text, \
     (SELECT coalesce(received_tli, 0)::text FROM pg_stat_wal_receiver)";

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
    match tokio::time::timeout_at(deadline, conn.client.simple_query(COMMIT_POSITION_SQL)).await {
        Ok(Ok(messages)) => {
            if let Some(position) = flight::commit_position(&messages) {
                inner
                    .watcher
                    .observe_primary(asked, position.lsn, position.timeline);
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
    let answer =
        tokio::time::timeout_at(deadline, conn.client.simple_query(REPLICA_PROBE_SQL)).await;
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
    let lsngate_core::Replay {
        in_recovery,
        replayed,
    } = flight::replica_position(&messages);
    let received = third_column(&messages).and_then(|t| t.parse().ok());
    let role = match in_recovery {
        Some(false) => Role::Primary,
        _ => Role::Standby,
    };
    if role == Role::Standby {
        // The timeline first: an orphan stops serving before its position counts.
        inner.watcher.observe_receiver(index, received);
        if let Some(lsn) = replayed {
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
    let up = if role == Role::Standby { 1.0 } else { 0.0 };
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

fn third_column(messages: &[SimpleQueryMessage]) -> Option<String> {
    messages.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => row.get(2).map(str::to_owned),
        _ => None,
    })
}
