//! The `discover` topology source, for teams without Patroni: the replicas streaming from the
//! primary, as its `pg_stat_replication` lists them, each placed by its `application_name`
//! (`discover_replicas` map first, then `discover_template`). The primary asked is the one the
//! monitors detect; its node stays in the set. One connection to it is kept between polls.

use std::time::Duration;

use super::patroni::Member;
use crate::backend::BackendConn;
use crate::config::TopologyConfig;
use crate::proxy::Proxy;

/// One text cell: `application_name|lag_bytes` per streaming replica, comma-separated.
const REPLICAS_SQL: &str = "SELECT coalesce(string_agg(application_name || '|' || \
     coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::bigint::text, ''), ',' \
     ORDER BY application_name), '') FROM pg_stat_replication WHERE state = 'streaming'";

/// The connection kept to the primary (by node index) between polls.
pub type PrimaryConn = Option<(usize, BackendConn)>;

/// The primary and the streaming replicas it lists, and which primary answered. Replicas the
/// map and the template do not place are left out, named in the error kept for /status.
pub async fn fetch(
    proxy: &Proxy,
    conn: &mut PrimaryConn,
    topology: &TopologyConfig,
    timeout: Duration,
) -> Result<(Vec<Member>, String, Option<String>), String> {
    let node = proxy.nodes.primary().ok_or(
        "no primary is known to ask for pg_stat_replication; check the primary URL and /status",
    )?;
    let address = node.url.address();
    if conn.as_ref().is_none_or(|(index, _)| *index != node.index) {
        let connect =
            BackendConn::connect(node.index, &node.url, None, &node.url.database, timeout);
        let opened = crate::timer::timeout(timeout, connect)
            .await
            .map_err(|_| format!("{address}: no connection in {timeout:?}"))?
            .map_err(|e| format!("{address}: {e}"))?;
        *conn = Some((node.index, opened));
    }
    let (_, open) = conn.as_mut().expect("connected above");
    let asked = crate::timer::timeout(timeout, open.query_row(REPLICAS_SQL)).await;
    let row = match asked {
        Ok(Ok(row)) => row,
        Ok(Err(e)) => {
            *conn = None;
            return Err(format!("{address}: {e}"));
        }
        Err(_) => {
            *conn = None;
            return Err(format!(
                "{address}: no answer to pg_stat_replication in {timeout:?}"
            ));
        }
    };
    let text = row.first().cloned().flatten().unwrap_or_default();
    let (host, port) = node.url.hosts[0].clone();
    let mut members = vec![Member::untagged(
        "primary".into(),
        "leader",
        "running",
        host,
        port,
    )];
    let mut unplaced = Vec::new();
    for entry in text.split(',').filter(|e| !e.is_empty()) {
        let (name, lag) = entry.split_once('|').unwrap_or((entry, ""));
        let Some((host, port)) = topology.place(name, port) else {
            unplaced.push(name.to_string());
            continue;
        };
        members.push(Member {
            lag: lag.parse().ok(),
            ..Member::untagged(name.to_string(), "replica", "streaming", host, port)
        });
    }
    let warning = (!unplaced.is_empty()).then(|| {
        format!(
            "replicas {unplaced:?} stream from {address} but neither discover_replicas nor \
             discover_template places them; they get no reads until one does"
        )
    });
    Ok((members, address, warning))
}
