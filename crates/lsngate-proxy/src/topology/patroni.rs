//! Asking Patroni who is in the cluster: `GET /cluster` on one member's REST API after another
//! until one answers, each request bounded by a timeout, and the members read from its JSON.
//! A plain HTTP/1.0 request over a TCP socket (Patroni's API is Python's http.server; one
//! request shape does not need an HTTP client crate), over TLS for an `https://` URL, the
//! certificate checked for the URL's host name.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::config::PatroniUrl;

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
    /// A member as a source other than Patroni knows it: no timeline, lag or tags.
    pub fn untagged(name: String, role: &str, state: &str, host: String, port: u16) -> Member {
        Member {
            name,
            role: role.into(),
            state: state.into(),
            host,
            port,
            timeline: None,
            lag: None,
            nofailover: false,
            noloadbalance: false,
        }
    }

    /// Whether Patroni calls it the leader.
    pub fn is_leader(&self) -> bool {
        self.role == "leader" || self.role == "standby_leader"
    }
}

/// The members `/cluster` lists, from the first of `urls` that answers, and which one it was.
/// The error names every URL tried and why each failed.
pub async fn fetch(
    urls: &[PatroniUrl],
    tls: Option<&lsngate_pgconn::ServerTls>,
    timeout: Duration,
) -> Result<(Vec<Member>, String), String> {
    let mut failures = Vec::new();
    for url in urls {
        let address = url.to_string();
        let tls = tls.filter(|_| url.https);
        match crate::timer::timeout(timeout, get_cluster(&url.host, url.port, tls)).await {
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

async fn get_cluster(
    host: &str,
    port: u16,
    tls: Option<&lsngate_pgconn::ServerTls>,
) -> Result<Vec<Member>, String> {
    let stream = TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let request = format!(
        "GET /cluster HTTP/1.0\r\nHost: {}\r\nAccept: application/json\r\nConnection: close\r\n\r\n",
        crate::config::host_port(host, port)
    );
    let answer = match tls {
        None => exchange(stream, &request).await?,
        Some(tls) => {
            // The server TLS settings' checks, with HTTP's protocol name instead of PostgreSQL's.
            let mut config = (*tls.client_config()).clone();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            let name = tokio_rustls::rustls::pki_types::ServerName::try_from(host.to_string())
                .map_err(|e| format!("TLS: {host:?} is not a host name: {e}"))?;
            let stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
                .connect(name, stream)
                .await
                .map_err(|e| format!("TLS handshake: {e}"))?;
            exchange(stream, &request).await?
        }
    };
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

/// Sends `request` and reads the answer to its end (at most MAX_ANSWER bytes). A TLS server
/// that closes without close_notify (Python's often does) has still answered.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    request: &str,
) -> Result<Vec<u8>, String> {
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("send: {e}"))?;
    let mut answer = Vec::new();
    match (&mut stream)
        .take(MAX_ANSWER as u64)
        .read_to_end(&mut answer)
        .await
    {
        Ok(_) => Ok(answer),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !answer.is_empty() => Ok(answer),
        Err(e) => Err(format!("read: {e}")),
    }
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
