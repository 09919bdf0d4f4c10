//! Following the cluster's membership: with `topology = "patroni"` the node set is the members
//! Patroni's `/cluster` lists, with `topology = "discover"` the primary and the replicas its
//! `pg_stat_replication` lists (`discover`), with `topology = "dns"` the records of a name
//! (`dns`), polled every `topology_poll_ms`, damped (`damp`), and applied to
//! the running proxy — new members get a node (pools, a monitor), members that left are retired
//! (their connections in use finish, nothing new goes there), `noloadbalance` members get no
//! reads. Not a second replica brain: roles, health, positions and timelines still come from
//! the servers through the monitors (`backend`); a leader change Patroni reports only wakes
//! them. When no Patroni answers, the node set stays as it was.
//!
//! The node URLs are the configured primary URL (user, password, database, TLS) with the host
//! and port of each member.

mod damp;
mod discover;
mod dns;
mod patroni;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::watch;

use crate::config::{NodeUrl, TopologySource};
use crate::proxy::Proxy;

pub use damp::{Damper, Placement};
pub use patroni::Member;

/// What the topology source last said, for /status and the admin console.
#[derive(Debug, Default)]
pub struct Topology {
    state: Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    polls: u64,
    last_poll: Option<Instant>,
    answered_by: Option<String>,
    last_error: Option<String>,
    members: Vec<Member>,
    applied: BTreeMap<String, Placement>,
    pending: Vec<(String, Option<Placement>, u32)>,
}

impl Topology {
    /// The topology part of /status.
    pub fn status(&self, proxy: &Proxy) -> serde_json::Value {
        let config = proxy.config();
        let seen = self.state.lock().expect("topology lock");
        let members: Vec<_> = seen
            .members
            .iter()
            .map(|m| {
                serde_json::json!({
                    "name": m.name,
                    "address": crate::config::host_port(&m.host, m.port),
                    "role": m.role,
                    "state": m.state,
                    "timeline": m.timeline,
                    "lag_bytes": m.lag,
                    "nofailover": m.nofailover,
                    "noloadbalance": m.noloadbalance,
                    "in_node_set": seen.applied.contains_key(&key(m)),
                })
            })
            .collect();
        let pending: Vec<_> = seen
            .pending
            .iter()
            .map(|(name, to, polls)| {
                serde_json::json!({
                    "member": name,
                    "change": if to.is_some() { "joins or changes" } else { "leaves" },
                    "seen_polls": polls,
                })
            })
            .collect();
        serde_json::json!({
            "source": config.topology.source.as_str(),
            "patroni_urls": config.topology.patroni_urls.iter()
                .map(|(h, p)| format!("http://{}", crate::config::host_port(h, *p)))
                .collect::<Vec<_>>(),
            "poll_ms": config.topology.poll.as_millis() as u64,
            "settle_polls": config.topology.settle_polls,
            "polls": seen.polls,
            "last_poll_ms_ago": seen.last_poll.map(|t| t.elapsed().as_millis() as u64),
            "answered_by": seen.answered_by,
            "last_error": seen.last_error,
            "members": members,
            "pending": pending,
        })
    }

    /// One row per member: name, address, role, state, timeline, lag, tags, in the node set.
    pub fn members(&self) -> Vec<(Member, bool)> {
        let seen = self.state.lock().expect("topology lock");
        seen.members
            .iter()
            .map(|m| (m.clone(), seen.applied.contains_key(&key(m))))
            .collect()
    }

    /// When the last poll ran, and its error, if any.
    pub fn last_poll(&self) -> (Option<Instant>, Option<String>) {
        let seen = self.state.lock().expect("topology lock");
        (seen.last_poll, seen.last_error.clone())
    }
}

/// A member's key in the damped node set: its address (a member that moves is one leaving and
/// one joining).
fn key(member: &Member) -> String {
    crate::config::host_port(&member.host, member.port)
}

/// What the follow loop keeps between polls.
#[derive(Debug)]
pub struct Follower {
    damper: Damper,
    leader: Option<String>,
    primary_conn: discover::PrimaryConn,
}

impl Follower {
    /// A follower that applies a change seen in `settle` consecutive polls.
    pub fn new(settle: u32) -> Follower {
        Follower {
            damper: Damper::new(settle),
            leader: None,
            primary_conn: None,
        }
    }
}

/// Polls the topology source until `shutdown` and applies what it says. Returns at once for a
/// static topology.
pub async fn follow(
    proxy: Arc<Proxy>,
    mut follower: Follower,
    mut shutdown: watch::Receiver<bool>,
) {
    if proxy.config().topology.source == TopologySource::Static {
        return;
    }
    loop {
        poll_once(&proxy, &mut follower).await;
        let period = proxy.config().topology.poll;
        tokio::select! {
            _ = crate::timer::sleep(period) => {}
            _ = shutdown.changed() => if *shutdown.borrow() { return },
        }
    }
}

/// One poll: ask the source (Patroni or the primary), damp, apply. Public for `serve`, which polls once before the first
/// health checks so the proxy starts with Patroni's members rather than the template URL.
pub async fn poll_once(proxy: &Arc<Proxy>, follower: &mut Follower) {
    let config = proxy.config();
    let topology = &config.topology;
    let fetched = match topology.source {
        TopologySource::Static => return,
        TopologySource::Patroni => patroni::fetch(&topology.patroni_urls, topology.request_timeout)
            .await
            .map(|(members, by)| (members, by, None)),
        TopologySource::Discover => {
            let timeout = config.connect_timeout.min(topology.request_timeout * 5);
            discover::fetch(proxy, &mut follower.primary_conn, topology, timeout).await
        }
        TopologySource::Dns => match &topology.dns {
            Some(dns) => dns::fetch(dns, topology.request_timeout).await,
            None => Err("topology = \"dns\" without dns_name".into()),
        },
    };
    let (damper, leader) = (&mut follower.damper, &mut follower.leader);
    let mut seen = proxy.topology.state.lock().expect("topology lock");
    seen.polls += 1;
    seen.last_poll = Some(Instant::now());
    let members = match fetched {
        Ok((members, answered_by, warning)) => {
            seen.answered_by = Some(answered_by);
            if warning.is_some() && seen.last_error != warning {
                tracing::warn!("topology: {}", warning.as_deref().unwrap_or_default());
            }
            seen.last_error = warning;
            members
        }
        Err(e) => {
            if seen.last_error.as_deref() != Some(&e) {
                tracing::warn!("topology: {e}; the node set stays as it was");
            }
            seen.last_error = Some(e);
            return;
        }
    };
    let placements: BTreeMap<String, Placement> = members
        .iter()
        .map(|m| {
            let placement = Placement {
                host: m.host.clone(),
                port: m.port,
                reads: !m.noloadbalance,
            };
            (m.name.clone(), placement)
        })
        .collect();
    let now_leader = members
        .iter()
        .find(|m| m.is_leader())
        .map(|m| m.name.clone());
    let changed = !placements.is_empty() && damper.observe(&placements);
    seen.members = members;
    seen.applied = damper.applied();
    seen.pending = damper.pending();
    drop(seen);
    if changed {
        apply(proxy, &damper.applied(), now_leader.as_deref());
    }
    if now_leader != *leader {
        if leader.is_some() {
            tracing::warn!(
                from = leader.as_deref().unwrap_or("none"),
                to = now_leader.as_deref().unwrap_or("none"),
                "topology: Patroni's leader changed; re-checking every node's role now"
            );
        }
        // The server says who takes writes; Patroni's word only makes the monitors look now.
        for node in proxy.nodes.all().iter() {
            node.request_check();
        }
        *leader = now_leader;
    }
}

/// Makes the proxy's node set `applied`: the leader first, then the others by address; the
/// login, database and TLS settings of the configured primary URL.
fn apply(proxy: &Arc<Proxy>, applied: &BTreeMap<String, Placement>, leader: Option<&str>) {
    let template = proxy.config().nodes[0].clone();
    let mut order: Vec<(&String, &Placement)> = applied.iter().collect();
    order.sort_by_key(|(address, _)| (Some(address.as_str()) != leader, address.as_str()));
    let urls: Vec<NodeUrl> = order
        .iter()
        .map(|(_, placement)| NodeUrl {
            hosts: vec![(placement.host.clone(), placement.port)],
            ..template.clone()
        })
        .collect();
    proxy.set_node_set(&urls, "topology");
    for node in proxy.nodes.all().iter() {
        let placement = applied
            .values()
            .find(|p| node.url.hosts == [(p.host.clone(), p.port)]);
        if let Some(placement) = placement {
            node.set_reads(placement.reads);
        }
    }
}
