//! The node monitor: on every node, every poll interval, one prepared query over a dedicated
//! connection answers role (`pg_is_in_recovery()`), position (replay position on a replica,
//! insert position on the primary) and timeline: `lsngate_core::probe::POLL_SQL`, read by
//! `lsngate_core::Poll` (the library's monitor sends and reads the same). A failed poll marks
//! the node down (the router skips it; a later poll may bring it back); a replica that answers
//! `false` has been promoted and becomes the primary without a restart. Positions feed the causal watcher, tagged with the
//! identity of the server this connection reached. It routes nothing itself.

use std::sync::Arc;
use std::time::Duration;

use lsngate_core::probe::POLL_SQL;
use lsngate_core::{Poll, ServerFacts};
use tokio::sync::watch;
use tokio::time::Instant;

use super::replay::{ServerId, Watcher};
use super::{NodeState, Role};
use crate::config::NodeUrl;

/// The monitor's connection to one node: client, prepared poll, and the server it reached.
pub struct Probe {
    client: tokio_postgres::Client,
    poll: tokio_postgres::Statement,
    facts: ServerFacts,
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probe")
            .field("server", &self.facts.server)
            .finish()
    }
}

fn pg_config(url: &NodeUrl) -> tokio_postgres::Config {
    let mut config = tokio_postgres::Config::new();
    for (host, port) in &url.hosts {
        config.host(host).port(*port);
    }
    config.user(&url.user).dbname(&url.database);
    if let Some(options) = &url.options {
        config.options(options);
    }
    // No tokio-postgres connect timeout (it would need a time driver on this runtime): every
    // poll, connecting included, runs under `check`'s timeout.
    config.application_name("lsngate-proxy-monitor");
    if let Some(password) = &url.password {
        config.password(password);
    }
    config
}

/// Polls one node once and records the result on the node, in the node list (the newest primary
/// timeline) and in the watcher.
pub async fn check(
    node: &NodeState,
    nodes: &super::Nodes,
    watcher: &Watcher,
    probe: &mut Option<Probe>,
    timeout: Duration,
) {
    node.polls
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let result = crate::timer::timeout(timeout, poll(node, probe)).await;
    let outcome = match result {
        Ok(outcome) => outcome,
        Err(_) => {
            // The server (or the network to it) stopped answering: statements in flight there
            // would wait as long as that lasts. Give up every connection to it.
            let why = format!("health check timed out after {timeout:?}");
            let severed = node.connections.sever_all(&format!(
                "{} stopped answering ({why}); lsngate gave up the connection",
                node.url.address()
            ));
            if severed > 0 {
                tracing::warn!(node = %node.url.address(), severed, "{why}: gave up its server connections");
            }
            Err(why)
        }
    };
    match outcome {
        Ok(seen) => {
            let facts = &probe.as_ref().expect("polled").facts;
            let server = &facts.server;
            watcher.observe_monitored(node.index, server);
            // Timelines first: a replica found behind the newest primary stops serving before
            // its position is recorded, and a promoted node's timeline is known before it is
            // routed writes.
            match seen.role {
                Role::Primary => {
                    node.timeline.observe_primary(seen.timeline);
                    if let Some(timeline) = seen.timeline {
                        nodes.newest_timeline.observe(timeline);
                    }
                }
                _ => {
                    if node.timeline.observe_replica(seen.timeline) {
                        tracing::warn!(node = %node.url.address(), user = %node.url.user, "the monitor cannot see this replica's WAL receiver timeline (grant pg_read_all_stats to its user); after a failover an orphaned replica cannot be told from one that follows the new primary");
                    }
                }
            }
            match (seen.role, seen.position) {
                (Role::Replica, Some(lsn)) => watcher.observe_replayed(node.index, server, lsn),
                (Role::Primary, Some(lsn)) => {
                    watcher.observe_primary(Instant::now(), facts.reachable(lsn))
                }
                _ => {}
            }
            node.set_health(Some(seen.role), None);
        }
        Err(e) => {
            if node.healthy() {
                tracing::warn!(node = %node.url.address(), "node failed its health check: {e}");
            }
            *probe = None;
            node.set_health(None, Some(e));
        }
    }
}

async fn poll(node: &NodeState, probe: &mut Option<Probe>) -> Result<Poll, String> {
    if probe.as_ref().is_none_or(|p| p.client.is_closed()) {
        // TLS as the URL's sslmode says, like the pooled connections.
        let client = lsngate_pgconn::connect(&pg_config(&node.url), &node.url.tls).await?;
        let facts = client
            .simple_query(lsngate_core::server::IDENTITY_SQL)
            .await
            .map_err(|e| format!("learning the server identity: {e}"))?;
        let facts = facts
            .iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(row) => Some(ServerFacts::from_row(
                    &(0..row.len()).map(|i| row.get(i)).collect::<Vec<_>>(),
                )),
                _ => None,
            })
            .unwrap_or_else(|| ServerFacts {
                server: ServerId::from("unknown"),
                ..ServerFacts::default()
            });
        let poll = client.prepare(POLL_SQL).await.map_err(|e| e.to_string())?;
        *probe = Some(Probe {
            client,
            poll,
            facts,
        });
    }
    let p = probe.as_ref().expect("connected above");
    let row = p
        .client
        .query_one(&p.poll, &[])
        .await
        .map_err(|e| describe(&e))?;
    let columns: Vec<Option<&str>> = (0..row.len()).map(|i| row.get(i)).collect();
    Poll::from_row(&columns)
        .ok_or_else(|| "the poll did not say whether the node is in recovery".into())
}

/// The error with its causes (see [`lsngate_pgconn::describe`]).
fn describe(e: &tokio_postgres::Error) -> String {
    lsngate_pgconn::describe(e)
}

/// Poll period of a node while reads wait on it.
const WAITER_POLL: Duration = Duration::from_millis(2);

/// How long the monitor waits before its next poll of a node: every 2 ms while reads wait on
/// its polls; every `replay_poll` while routing uses positions (recently, or always under a lag
/// bound); at the health interval otherwise.
fn poll_period(config: &crate::config::Config, watcher: &Watcher, node: usize) -> Duration {
    let bound = &config.causal.lag_bound;
    let replay_poll = config.causal.replay_poll.min(config.health_interval);
    if watcher.waiters(node) > 0 {
        WAITER_POLL.min(replay_poll)
    } else if bound.max_bytes.is_some() || bound.max_lag.is_some() || watcher.in_demand() {
        replay_poll
    } else {
        config.health_interval
    }
}

/// What a node's monitor needs from the proxy it serves (implemented by the shared proxy state,
/// a layer above, so this layer names no type of it).
pub trait Monitored: Send + Sync + 'static {
    /// Every configured node.
    fn nodes(&self) -> &super::Nodes;
    /// The replay knowledge the polls feed.
    fn watcher(&self) -> &Watcher;
    /// The current config.
    fn config(&self) -> Arc<crate::config::Config>;
}

/// Polls `node` (see [`poll_period`]; at once when a session asks for a re-check) until
/// `shutdown` turns true.
pub async fn watch_node(
    node: Arc<NodeState>,
    proxy: Arc<impl Monitored>,
    timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut probe = None;
    loop {
        if node.is_retired() {
            tracing::info!(node = %node.url.address(), "node removed from the config; its monitor stops");
            return;
        }
        check(&node, proxy.nodes(), proxy.watcher(), &mut probe, timeout).await;
        // Reads waiting for this node's replay (PostgreSQL ≤ 18) are served by fast polls here,
        // one query for all of them instead of one per read.
        let period = poll_period(&proxy.config(), proxy.watcher(), node.index);
        node.poll_period_ms.store(
            period.as_millis() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        tokio::select! {
            _ = crate::timer::sleep(period) => {}
            _ = node.recheck.notified() => {}
            _ = shutdown.changed() => {}
        }
        if *shutdown.borrow() {
            return;
        }
    }
}
