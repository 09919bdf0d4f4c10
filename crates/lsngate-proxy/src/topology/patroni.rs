//! Asking Patroni who is in the cluster: `GET /cluster` on one member's REST API after another
//! until one answers, each request bounded by a timeout, and the members read from its JSON.
//! A plain HTTP/1.0 request over a TCP socket (Patroni's API is Python's http.server; one
//! request shape does not need an HTTP client crate). No HTTPS: the config refuses https URLs.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest `/cluster` answer read (a few hundred bytes per member).
const MAX_ANSWER: usize = 1 << 20;

/// One member as `/cluster` lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Member {
    /// Patroni's member name.
    pub name: String,
    /// `leader`, `replica`, `sync_standby`, `standby_leader`.
    pub role: String,
    /// `running`, `streaming`, `starting`, `stopped`, `crashed`, ...
    pub state: String,
    /// PostgreSQL's host and port.
    pub host: String,
    /// PostgreSQL's port.
    pub port: u16,
    /// Timeline Patroni reports (a replica's lags a switch until its next restartpoint).
    pub timeline: Option<u64>,
    /// Replication lag in bytes Patroni reports; None for the leader or when unknown.
    pub lag: Option<u64>,
    /// Tag `nofailover`: never promoted.
    pub nofailover: bool,
    /// Tag `noloadbalance`: gets no reads.
    pub noloadbalance: bool,
}

impl Member {
    /// Whether Patroni calls it the leader.
    pub fn is_leader(&self) -> bool {
        self.role == "leader" || self.role == "standby_leader"
    }
}

/// The members `/cluster` lists, from the first of `urls` that answers, and which one it was.
/// The error names every URL tried and why each failed.
pub async fn fetch(
    urls: &[(String, u16)],
    timeout: Duration,
) -> Result<(Vec<Member>, String), String> {
    let mut failures = Vec::new();
    for (host, port) in urls {
        let address = crate::config::host_port(host, *port);
        match crate::timer::timeout(timeout, get_cluster(host, *port)).await {
            Ok(Ok(members)) => return Ok((members, address)),
            Ok(Err(e)) => failures.push(format!("{address}: {e}")),
            Err(_) => failures.push(format!("{address}: no answer in {timeout:?}")),
        }
    }
    Err(format!(
        "no Patroni REST API answered GET /cluster ({}); check that Patroni runs and that \
         --patroni-url names its restapi.listen address",
        failures.join("; ")
    ))
}

async fn get_cluster(host: &str, port: u16) -> Result<Vec<Member>, String> {
    let mut stream = TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let request = format!(
        "GET /cluster HTTP/1.0\r\nHost: {}\r\nAccept: application/json\r\nConnection: close\r\n\r\n",
        crate::config::host_port(host, port)
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("send: {e}"))?;
    let mut answer = Vec::new();
    (&mut stream)
        .take(MAX_ANSWER as u64)
        .read_to_end(&mut answer)
        .await
        .map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or("the answer is not HTTP (no end of headers)")?;
    let status = head.split_whitespace().nth(1).unwrap_or("?");
    if status != "200" {
        return Err(format!("answered HTTP {status}"));
    }
    parse_cluster(body)
}

/// The members of a `/cluster` JSON document.
pub fn parse_cluster(body: &str) -> Result<Vec<Member>, String> {
    let document: serde_json::Value =
        serde_json::from_str(body).map_err(|e| format!("/cluster is not JSON: {e}"))?;
    let members = document["members"]
        .as_array()
        .ok_or("/cluster has no members list")?;
    members
        .iter()
        .map(|m| {
            let text = |key: &str| m[key].as_str().unwrap_or_default().to_string();
            let tag = |key: &str| m["tags"][key].as_bool().unwrap_or(false);
            let name = text("name");
            let port = m["port"]
                .as_u64()
                .and_then(|p| u16::try_from(p).ok())
                .ok_or_else(|| format!("/cluster: member {name:?} has no port"))?;
            Ok(Member {
                role: text("role"),
                state: text("state"),
                host: text("host"),
                port,
                timeline: m["timeline"].as_u64(),
                // "unknown" (a string) when Patroni cannot tell.
                lag: m["lag"].as_u64(),
                nofailover: tag("nofailover"),
                noloadbalance: tag("noloadbalance"),
                name,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_roles_lag_and_tags_are_read() {
        // As Patroni 3.0.2 answers, with tags added on one member.
        let body = r#"{"members": [{"name": "m1", "role": "leader", "state": "running",
            "api_url": "http://127.0.0.1:28008/patroni", "host": "127.0.0.1", "port": 25432,
            "timeline": 1}, {"name": "m2", "role": "replica", "state": "running",
            "host": "127.0.0.1", "port": 25433, "timeline": 1, "lag": 0,
            "tags": {"noloadbalance": true, "nofailover": true}},
            {"name": "m3", "role": "replica", "state": "starting", "host": "::1", "port": 5,
            "lag": "unknown"}]}"#;
        let members = parse_cluster(body).unwrap();
        assert_eq!(members.len(), 3);
        assert!(members[0].is_leader() && members[0].lag.is_none());
        assert_eq!(
            (
                members[1].lag,
                members[1].noloadbalance,
                members[1].nofailover
            ),
            (Some(0), true, true)
        );
        assert_eq!(
            (members[2].lag, members[2].state.as_str()),
            (None, "starting")
        );
        assert!(parse_cluster("{}").unwrap_err().contains("no members"));
        assert!(
            parse_cluster(r#"{"members":[{"name":"x"}]}"#)
                .unwrap_err()
                .contains("has no port")
        );
    }
}
