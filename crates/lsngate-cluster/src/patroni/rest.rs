//! Reading a Patroni member's REST API from the test kit: a plain HTTP/1.0 GET over a loopback
//! socket, bounded by a timeout (no HTTP client crate for one request shape), and the
//! `/cluster` document's members.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde::Deserialize;

/// One member as `/cluster` lists it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ClusterMember {
    /// Member name.
    pub name: String,
    /// `leader`, `replica`, `sync_standby`, `standby_leader`.
    pub role: String,
    /// `running`, `streaming`, `stopped`, `starting`, `crashed`, ...
    pub state: String,
    /// PostgreSQL's host.
    #[serde(default)]
    pub host: String,
    /// PostgreSQL's port.
    #[serde(default)]
    pub port: u16,
    /// Timeline, when PostgreSQL runs.
    #[serde(default)]
    pub timeline: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct ClusterDocument {
    members: Vec<ClusterMember>,
}

/// `GET path` on `127.0.0.1:port`: the status code and body. Every step bounded by `timeout`.
pub fn get(port: u16, path: &str, timeout: Duration) -> std::io::Result<(u16, String)> {
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no end of HTTP headers"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line: {head:.40}")))?;
    Ok((status, body.to_string()))
}

/// The members `/cluster` on the member whose API listens on `port` lists.
pub fn cluster_members(port: u16) -> std::io::Result<Vec<ClusterMember>> {
    let (status, body) = get(port, "/cluster", Duration::from_secs(2))?;
    if status != 200 {
        return Err(std::io::Error::other(format!("/cluster answered {status}")));
    }
    serde_json::from_str::<ClusterDocument>(&body)
        .map(|d| d.members)
        .map_err(|e| std::io::Error::other(format!("/cluster: {e}")))
}
