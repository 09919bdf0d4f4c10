//! Reading a Patroni member's REST API from the test kit: a plain HTTP/1.0 GET over a loopback
//! socket (over TLS when the API serves HTTPS), bounded by a timeout (no HTTP client crate for
//! one request shape), and the `/cluster` document's members.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
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
/// With `ca`, over TLS, the server's certificate checked for `localhost` against that CA.
pub fn get(
    port: u16,
    path: &str,
    timeout: Duration,
    ca: Option<&Path>,
) -> std::io::Result<(u16, String)> {
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let request =
        format!("GET {path} HTTP/1.0\r\nHost: localhost:{port}\r\nConnection: close\r\n\r\n");
    let mut response = String::new();
    match ca {
        None => {
            stream.write_all(request.as_bytes())?;
            stream.read_to_string(&mut response)?;
        }
        Some(ca) => {
            let mut tls = rustls::StreamOwned::new(tls_client(ca)?, stream);
            tls.write_all(request.as_bytes())?;
            // Python's TLS server may close without close_notify: what came before counts.
            match tls.read_to_string(&mut response) {
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !response.is_empty() => {
                }
                other => {
                    other?;
                }
            }
        }
    }
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

/// A TLS client for `localhost` trusting only the CA in `ca`.
fn tls_client(ca: &Path) -> std::io::Result<rustls::ClientConnection> {
    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).map_err(std::io::Error::other)? {
        roots
            .add(cert.map_err(std::io::Error::other)?)
            .map_err(std::io::Error::other)?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from("localhost").expect("a DNS name");
    rustls::ClientConnection::new(std::sync::Arc::new(config), name).map_err(std::io::Error::other)
}

/// The members `/cluster` on the member whose API listens on `port` lists (over TLS with `ca`).
pub fn cluster_members(port: u16, ca: Option<&Path>) -> std::io::Result<Vec<ClusterMember>> {
    let (status, body) = get(port, "/cluster", Duration::from_secs(2), ca)?;
    if status != 200 {
        return Err(std::io::Error::other(format!("/cluster answered {status}")));
    }
    serde_json::from_str::<ClusterDocument>(&body)
        .map(|d| d.members)
        .map_err(|e| std::io::Error::other(format!("/cluster: {e}")))
}
