//! One server connection: connect (each host of the URL in turn, TLS as its `sslmode` says),
//! authenticate with the config's credentials (trust, cleartext, MD5, SCRAM-SHA-256), then send
//! and receive frames. It also remembers what the
//! session above must know to reuse it safely: which prepared statements and settings it
//! carries, and its cancel key. It does not decide where queries go.

use std::collections::HashMap;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use std::sync::Arc;

use bytes::{Buf, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use lsngate_pgconn::{Attempt, Negotiated, PLAINTEXT_REFUSED_FIX, refuses_plaintext};

use crate::auth::{
    ServerSecret, md5_response, md5_stored, scram_client_final, scram_client_final_with_keys,
    scram_server_final_ok,
};
use crate::config::{NodeUrl, ServerLogin, host_port};
use crate::net::backend::TxStatus;
use crate::net::sqlstate;
use crate::net::{BackendMessage, ErrorFields, Frame, FrontendMessage, StartupFrame, decode_frame};

/// Why a backend connection failed; `retry_safe` tells the router whether another node may be
/// tried (nothing was sent yet) or the client must get an error.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs)] // variant fields are described by the variant docs
pub enum BackendError {
    /// TCP connect failed or timed out.
    #[error("cannot connect to {node}: {why}; is the server up and the URL right?")]
    Connect { node: String, why: String },
    /// The TLS negotiation or handshake failed (`why` names the cause and the fix).
    #[error("cannot connect to {node}: {why}")]
    Tls { node: String, why: String },
    /// Every host of a multi-host URL failed; each one's reason.
    #[error("cannot connect to any host of {node}: {why}")]
    AllHosts { node: String, why: String },
    /// The server's pg_hba.conf refused a plaintext connection.
    #[error("{node} refused a connection without TLS: {message}; {PLAINTEXT_REFUSED_FIX}")]
    PlaintextRefused { node: String, message: String },
    /// The server refused our credentials or sent an error at startup.
    #[error("{node} refused the proxy's login as {role:?}: {message}; check {check}")]
    Startup {
        node: String,
        role: String,
        message: String,
        sqlstate: String,
        /// Where the credentials come from: the node URL or a user's `server_user`.
        check: &'static str,
    },
    /// The server's SCRAM-SHA-256 signature does not match the password the proxy logs in with.
    #[error(
        "{node} did not prove that it knows the password the proxy logs in with (SCRAM server signature missing or wrong); check that the URL points at the right server"
    )]
    ServerProof { node: String },
    /// The server asked for an authentication method we do not implement.
    #[error(
        "{node} asked for authentication method {code}, which lsngate does not support; use scram-sha-256, md5, password or trust in pg_hba.conf"
    )]
    UnsupportedAuth { node: String, code: i32 },
    /// The connection broke.
    #[error("connection to {node} lost: {why}")]
    Lost { node: String, why: String },
    /// The server sent bytes that are not protocol 3.
    #[error("{node} sent an invalid message: {source}")]
    Protocol {
        node: String,
        source: crate::net::ProtocolError,
    },
}

impl BackendError {
    /// Whether the server itself is unavailable (unreachable, gone, starting or shutting down,
    /// out of connection slots), as opposed to refusing these credentials or this database:
    /// another server may serve instead.
    pub fn server_unavailable(&self) -> bool {
        match self {
            BackendError::Connect { .. }
            | BackendError::Tls { .. }
            | BackendError::AllHosts { .. }
            | BackendError::Lost { .. }
            | BackendError::Protocol { .. } => true,
            BackendError::Startup { sqlstate, .. } => {
                sqlstate.starts_with("57") || sqlstate.starts_with("53")
            }
            BackendError::ServerProof { .. }
            | BackendError::UnsupportedAuth { .. }
            | BackendError::PlaintextRefused { .. } => false,
        }
    }
}

pub use super::settings::Settings;

/// A server connection's cancel key and where to send it; shared, so that handing it to the
/// client's cancel slot on every checkout copies nothing.
#[derive(Debug, Clone, Default)]
pub struct CancelKey {
    /// `host:port` of the server.
    pub address: String,
    /// The backend's process id.
    pub pid: i32,
    /// The backend's cancel secret.
    pub secret: Vec<u8>,
    /// The host name and TLS of the connection when it used TLS: the cancel request goes over
    /// TLS too (as libpq 17 does), for servers that accept nothing else.
    pub tls: Option<(String, lsngate_pgconn::ServerTls)>,
}

impl CancelKey {
    /// Sends the CancelRequest on a new connection, over TLS when the cancelled connection used
    /// it, and waits for the server to close that connection.
    pub async fn send(&self) -> std::io::Result<()> {
        use tokio::io::AsyncReadExt;
        let mut out = BytesMut::new();
        StartupFrame::Cancel {
            pid: self.pid,
            secret: self.secret.clone(),
        }
        .encode(&mut out);
        let stream = TcpStream::connect(&self.address).await?;
        let negotiated = match &self.tls {
            None => Negotiated::Plain(stream),
            Some((host, tls)) => tls
                .negotiate(stream, host, Attempt::TlsIfOffered)
                .await
                .map_err(std::io::Error::other)?,
        };
        match negotiated {
            Negotiated::Plain(mut stream) => {
                stream.write_all(&out).await?;
                let _ = stream.read(&mut [0u8; 1]).await;
            }
            Negotiated::Tls(mut stream) => {
                stream.write_all(&out).await?;
                stream.flush().await?;
                let _ = stream.read(&mut [0u8; 1]).await;
            }
        }
        Ok(())
    }
}

/// The socket under a server connection: plain TCP with the proxy's own system calls (see
/// [`crate::socket`]), or TLS over it through tokio-rustls.
#[derive(Debug)]
enum ServerStream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    /// An in-process pipe whose other end a unit test answers as the server (see
    /// [`BackendConn::in_memory`]).
    #[cfg(test)]
    Memory(tokio::io::DuplexStream),
}

/// A new stamp for a connection's reported values: unique in the process, so a session that
/// has compared its client's values with one stamp's needs not compare them again while its
/// own are unchanged, whichever pooled connection carries it.
fn reported_stamp() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// An authenticated server connection.
#[derive(Debug)]
pub struct BackendConn {
    stream: ServerStream,
    read_buf: BytesMut,
    write_buf: BytesMut,
    /// Index of the node in the config.
    pub node: usize,
    /// `host:port`, for errors.
    pub address: String,
    /// Database this connection is logged into.
    pub database: String,
    /// Where a cancel request for this connection goes, once the server announced its key.
    pub cancel: Arc<CancelKey>,
    /// ParameterStatus values reported at startup (server_version, encodings, ...).
    pub server_params: Vec<(String, String)>,
    /// Named prepared statements on this connection: name → query text.
    pub prepared: HashMap<String, String>,
    /// What the server's unnamed statement is: the identity (parameter types and text, as in
    /// `ClientStatement::identity`) of the last `Parse ""` sent here; None when there is none or
    /// a simple Query dropped it.
    pub unnamed: Option<Arc<str>>,
    /// Settings applied on behalf of a client: name → the statement that set it.
    pub applied: Settings,
    /// The values the server last reported on this connection (ParameterStatus, at login and
    /// since): PostgreSQL reports a `GUC_REPORT` setting only when its value differs from the one
    /// it last reported on the connection, so this is what the server takes the other end to know.
    pub reported: HashMap<String, String>,
    /// Names this connection's `reported` as it is now: a stamp no other connection of the
    /// process has, taken anew at every change (see [`reported_stamp`]).
    pub reported_stamp: u64,
    /// When the connection was opened, for `server_lifetime`.
    pub opened: super::clock::Coarse,
    /// Which server this is and its WAL layout, learned right after login.
    pub facts: ServerFacts,
    /// Its socket in the node's registry, shut down when the server stops answering.
    pub severable: Option<Arc<super::sever::Severable>>,
}

/// What the proxy learns about the server behind a connection once, right after login
/// (`lsngate_core::server`, shared with the library).
pub use lsngate_core::ServerFacts;

/// Whom a new connection logs in as, and where those credentials are configured.
struct Login<'a> {
    user: &'a str,
    secret: Secret<'a>,
    check: &'static str,
}

/// What proves a login: a password (the node URL's, or a configured one) or what `auth_query`
/// learned.
#[derive(Clone, Copy)]
enum Secret<'a> {
    Password(Option<&'a str>),
    Passthrough(&'a ServerSecret),
}

impl<'a> Secret<'a> {
    fn of(secret: &'a ServerSecret) -> Secret<'a> {
        match secret {
            ServerSecret::None => Secret::Password(None),
            ServerSecret::Password(p) => Secret::Password(Some(p)),
            other => Secret::Passthrough(other),
        }
    }
}

/// One host of a node URL, about to be connected to.
struct Target<'a> {
    node: usize,
    url: &'a NodeUrl,
    host: &'a str,
    port: u16,
    database: &'a str,
    timeout: Duration,
}

impl Target<'_> {
    /// Connects under the URL's `sslmode`: `allow` retries with TLS when the server's
    /// pg_hba.conf refuses plaintext; `disable` turns that refusal into its fix.
    async fn connect(&self, login: &Login<'_>) -> Result<BackendConn, BackendError> {
        let tls = &self.url.tls;
        match self.open(login, tls.first_attempt()).await {
            Err(BackendError::Startup { message, .. }) if tls.retry_with_tls(&message) => {
                self.open(login, Attempt::TlsRequired).await
            }
            Err(BackendError::Startup { node, message, .. }) if refuses_plaintext(&message) => {
                Err(BackendError::PlaintextRefused { node, message })
            }
            other => other,
        }
    }

    async fn open(&self, login: &Login<'_>, attempt: Attempt) -> Result<BackendConn, BackendError> {
        let (timeout, address) = (self.timeout, host_port(self.host, self.port));
        let connect_error = |why: String| BackendError::Connect {
            node: address.clone(),
            why,
        };
        let stream = crate::timer::timeout(timeout, TcpStream::connect((self.host, self.port)))
            .await
            .map_err(|_| connect_error(format!("timed out after {timeout:?}")))?
            .map_err(|e| connect_error(e.to_string()))?;
        let _ = stream.set_nodelay(true);
        let negotiated =
            crate::timer::timeout(timeout, self.url.tls.negotiate(stream, self.host, attempt))
                .await
                .map_err(|_| connect_error(format!("TLS negotiation timed out after {timeout:?}")))?
                .map_err(|why| BackendError::Tls {
                    node: address.clone(),
                    why,
                })?;
        let (stream, tls) = match negotiated {
            Negotiated::Plain(stream) => (ServerStream::Plain(stream), None),
            Negotiated::Tls(stream) => (
                ServerStream::Tls(stream),
                Some((self.host.to_string(), self.url.tls.clone())),
            ),
        };
        let mut conn = BackendConn::fresh(stream, self.node, address, self.database);
        let mut params = vec![
            ("user".into(), login.user.to_string()),
            ("database".into(), self.database.into()),
        ];
        if let Some(name) = &self.url.application_name {
            params.push(("application_name".into(), name.clone()));
        }
        if let Some(options) = &self.url.options {
            params.push(("options".into(), options.clone()));
        }
        let mut out = BytesMut::new();
        StartupFrame::Startup { minor: 0, params }.encode(&mut out);
        conn.write_raw(&out).await?;
        crate::timer::timeout(timeout, conn.authenticate(login, tls))
            .await
            .map_err(|_| BackendError::Connect {
                node: conn.address.clone(),
                why: format!("login timed out after {timeout:?}"),
            })??;
        let facts =
            crate::timer::timeout(timeout, conn.query_row(lsngate_core::server::IDENTITY_SQL))
                .await
                .map_err(|_| BackendError::Connect {
                    node: conn.address.clone(),
                    why: format!("no answer to the identity query within {timeout:?}"),
                })??;
        conn.facts = ServerFacts::from_row(&crate::net::backend::columns(&facts));
        Ok(conn)
    }
}

impl BackendConn {
    /// Opens and authenticates a connection to `url` for `database`, as `login` when given,
    /// else as the URL's user. The URL's hosts are tried in order, as libpq does: one that
    /// cannot be reached or fails TLS gives way to the next; a refused login ends the attempt.
    pub async fn connect(
        node: usize,
        url: &NodeUrl,
        login: Option<&ServerLogin>,
        database: &str,
        timeout: Duration,
    ) -> Result<BackendConn, BackendError> {
        let login = match login {
            Some(l) => Login {
                user: &l.user,
                secret: Secret::of(&l.secret),
                check: match l.secret {
                    ServerSecret::ScramKeys { .. } | ServerSecret::Md5Hash(_) => {
                        "the role's password on the server (auth_query logs in as the client's role with the secret the server stores)"
                    }
                    _ => "server_user/server_password of the client's [[users]] entry",
                },
            },
            None => Login {
                user: &url.user,
                secret: Secret::Password(url.password.as_deref()),
                check: "the user/password in the node URL",
            },
        };
        let timeout = url.connect_timeout.unwrap_or(timeout);
        let mut failed = Vec::new();
        for (host, port) in &url.hosts {
            let target = Target {
                node,
                url,
                host,
                port: *port,
                database,
                timeout,
            };
            match target.connect(&login).await {
                Err(e @ (BackendError::Connect { .. } | BackendError::Tls { .. }))
                    if url.hosts.len() > 1 =>
                {
                    failed.push(e.to_string());
                }
                other => return other,
            }
        }
        Err(BackendError::AllHosts {
            node: url.address(),
            why: failed.join("; "),
        })
    }

    async fn authenticate(
        &mut self,
        login: &Login<'_>,
        tls: Option<(String, lsngate_pgconn::ServerTls)>,
    ) -> Result<(), BackendError> {
        let mut scram: Option<(String, Vec<u8>)> = None;
        loop {
            let frame = self.recv().await?;
            match self.parse(&frame)? {
                // A SCRAM exchange must end with the server's signature before AuthenticationOk.
                BackendMessage::Authentication { code: 0, .. } if scram.is_some() => {
                    return Err(self.server_proof());
                }
                BackendMessage::Authentication { code: 0, .. } => {}
                BackendMessage::Authentication { code: 3, .. } => {
                    let Secret::Password(password) = login.secret else {
                        return Err(self.passthrough_refused(3, login));
                    };
                    let mut body = password.unwrap_or_default().as_bytes().to_vec();
                    body.push(0);
                    self.send(&[FrontendMessage::AuthResponse(body.into()).to_frame()])
                        .await?;
                }
                BackendMessage::Authentication { code: 5, data } if data.len() == 4 => {
                    let stored = match login.secret {
                        Secret::Password(p) => md5_stored(login.user, p.unwrap_or_default()),
                        Secret::Passthrough(ServerSecret::Md5Hash(hash)) => hash.clone(),
                        Secret::Passthrough(_) => {
                            return Err(self.passthrough_refused(5, login));
                        }
                    };
                    let mut body =
                        md5_response(&stored, [data[0], data[1], data[2], data[3]]).into_bytes();
                    body.push(0);
                    self.send(&[FrontendMessage::AuthResponse(body.into()).to_frame()])
                        .await?;
                }
                BackendMessage::Authentication { code: 10, .. } => {
                    let nonce: [u8; 18] = rand::random();
                    let bare = format!(
                        "n=,r={}",
                        nonce.iter().map(|b| format!("{b:02x}")).collect::<String>()
                    );
                    let first = format!("n,,{bare}");
                    let mut body = BytesMut::from(&b"SCRAM-SHA-256\0"[..]);
                    body.extend_from_slice(&(first.len() as i32).to_be_bytes());
                    body.extend_from_slice(first.as_bytes());
                    self.send(&[FrontendMessage::AuthResponse(body.freeze()).to_frame()])
                        .await?;
                    scram = Some((bare, Vec::new()));
                }
                BackendMessage::Authentication { code: 11, data } => {
                    let (bare, _) = scram.take().ok_or_else(|| self.unsupported(11))?;
                    let server_first = String::from_utf8_lossy(&data).to_string();
                    let answer = match login.secret {
                        Secret::Password(p) => {
                            scram_client_final(p.unwrap_or_default(), &bare, &server_first)
                        }
                        Secret::Passthrough(ServerSecret::ScramKeys {
                            client_key,
                            server_key,
                        }) => scram_client_final_with_keys(
                            client_key,
                            server_key,
                            &bare,
                            &server_first,
                        ),
                        Secret::Passthrough(_) => {
                            return Err(self.passthrough_refused(10, login));
                        }
                    };
                    let (client_final, signature) = answer.ok_or_else(|| self.unsupported(11))?;
                    self.send(&[
                        FrontendMessage::AuthResponse(client_final.into_bytes().into()).to_frame(),
                    ])
                    .await?;
                    scram = Some((bare, signature));
                }
                BackendMessage::Authentication { code: 12, data } => {
                    let (_, signature) = scram.take().ok_or_else(|| self.unsupported(12))?;
                    if !scram_server_final_ok(&String::from_utf8_lossy(&data), &signature) {
                        return Err(self.server_proof());
                    }
                }
                BackendMessage::Authentication { code, .. } => return Err(self.unsupported(code)),
                BackendMessage::ParameterStatus { name, value } => {
                    self.server_params.push((name, value))
                }
                BackendMessage::BackendKeyData { pid, secret } => {
                    self.cancel = Arc::new(CancelKey {
                        address: self.address.clone(),
                        pid,
                        secret: secret.to_vec(),
                        tls: tls.clone(),
                    })
                }
                BackendMessage::ErrorResponse(e) => return Err(self.startup_error(&e, login)),
                BackendMessage::ReadyForQuery(_) => return Ok(()),
                _ => {}
            }
        }
    }

    /// The server asks for a method the secret `auth_query` learned cannot answer: an MD5 hash
    /// cannot do SCRAM, SCRAM keys cannot do MD5, neither gives a cleartext password.
    fn passthrough_refused(&self, code: i32, login: &Login<'_>) -> BackendError {
        let method = match code {
            3 => "a cleartext password",
            5 => "MD5",
            _ => "SCRAM-SHA-256",
        };
        BackendError::Connect {
            node: self.address.clone(),
            why: format!(
                "the server asked for {method} to log in role \"{}\", which the secret auth_query \
                 found for it cannot answer; store the role's password as the server's \
                 pg_hba.conf method expects (SCRAM verifier for scram-sha-256, md5 hash for md5), \
                 or set auth_server_login = \"node_user\"",
                login.user
            ),
        }
    }

    fn unsupported(&self, code: i32) -> BackendError {
        BackendError::UnsupportedAuth {
            node: self.address.clone(),
            code,
        }
    }

    fn server_proof(&self) -> BackendError {
        BackendError::ServerProof {
            node: self.address.clone(),
        }
    }

    fn startup_error(&self, e: &ErrorFields, login: &Login<'_>) -> BackendError {
        // A database the server lacks is the client's choice, not the proxy's credentials.
        let check = if e.sqlstate() == Some(sqlstate::INVALID_CATALOG_NAME) {
            "the database name the client connected with: the server has no such database"
        } else {
            login.check
        };
        BackendError::Startup {
            node: self.address.clone(),
            role: login.user.to_string(),
            check,
            message: e.get(b'M').unwrap_or("unknown error").to_string(),
            sqlstate: e
                .sqlstate()
                .unwrap_or(sqlstate::CONNECTION_EXCEPTION)
                .to_string(),
        }
    }

    /// Parses a frame from this server.
    pub fn parse(&self, frame: &Frame) -> Result<BackendMessage, BackendError> {
        BackendMessage::parse(frame).map_err(|source| BackendError::Protocol {
            node: self.address.clone(),
            source,
        })
    }

    async fn write_raw(&mut self, bytes: &[u8]) -> Result<(), BackendError> {
        let written = self.send_now(bytes)?;
        if written < bytes.len() {
            self.send_rest(&bytes[written..]).await?;
        }
        Ok(())
    }

    /// Writes `rest`, what [`BackendConn::send_now`] could not, waiting for room as needed.
    pub async fn send_rest(&mut self, rest: &[u8]) -> Result<(), BackendError> {
        let written = match &mut self.stream {
            ServerStream::Plain(stream) => stream.write_all(rest).await,
            // rustls holds records it could not write yet: the flush sends them.
            ServerStream::Tls(stream) => match stream.write_all(rest).await {
                Ok(()) => stream.flush().await,
                Err(e) => Err(e),
            },
            #[cfg(test)]
            ServerStream::Memory(stream) => stream.write_all(rest).await,
        };
        written.map_err(|e| self.lost(e))
    }

    /// Writes what the socket takes right now, without waiting: how many bytes that was. A
    /// statement nearly always fits the socket buffer, so this one non-blocking write is the
    /// whole send; [`BackendConn::send_rest`] writes any rest (all of it over TLS).
    pub fn send_now(&mut self, bytes: &[u8]) -> Result<usize, BackendError> {
        let ServerStream::Plain(stream) = &self.stream else {
            return Ok(0);
        };
        match crate::socket::try_send(stream, bytes) {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(0),
            Err(e) => Err(self.lost(e)),
        }
    }

    /// The error for a socket that failed under this connection.
    fn lost(&self, e: std::io::Error) -> BackendError {
        self.lost_because(e.to_string())
    }

    /// The error for a connection that broke for `why`, unless the proxy gave it up itself.
    fn lost_because(&self, why: String) -> BackendError {
        let why = match self.severable.as_ref().and_then(|s| s.reason()) {
            Some(reason) => reason.to_string(),
            None => why,
        };
        BackendError::Lost {
            node: self.address.clone(),
            why,
        }
    }

    /// The socket's descriptor (for the node's registry of connections).
    pub fn socket_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        match &self.stream {
            ServerStream::Plain(tcp) => tcp.as_raw_fd(),
            ServerStream::Tls(tls) => tls.get_ref().0.as_raw_fd(),
            #[cfg(test)]
            ServerStream::Memory(_) => -1,
        }
    }

    /// Writes frames in one flight (one syscall for the batch).
    pub async fn send(&mut self, frames: &[Frame]) -> Result<(), BackendError> {
        self.send_around(frames, frames.len(), &[]).await
    }

    /// Writes `frames[..at]`, then the client's `messages` (encoded straight into the send
    /// buffer, with no frame built for each), then `frames[at..]`, in one flight.
    pub async fn send_around(
        &mut self,
        frames: &[Frame],
        at: usize,
        messages: &[crate::net::FrontendMessage],
    ) -> Result<(), BackendError> {
        self.write_buf.clear();
        let (before, after) = frames.split_at(at);
        before.iter().for_each(|f| f.encode(&mut self.write_buf));
        messages.iter().for_each(|m| m.encode(&mut self.write_buf));
        after.iter().for_each(|f| f.encode(&mut self.write_buf));
        let buf = std::mem::take(&mut self.write_buf);
        let result = self.write_raw(&buf).await;
        self.write_buf = buf;
        result
    }

    /// Receives one frame. Cancel-safe: bytes only move into the connection's own buffer.
    pub async fn recv(&mut self) -> Result<Frame, BackendError> {
        self.fill().await?;
        self.next_frame().expect("filled")
    }

    /// Reads until at least one whole frame is buffered. Cancel-safe.
    // A plain poll_fn, not an async fn, as `ClientIo::incoming`: it runs for every reply.
    pub fn fill(&mut self) -> impl Future<Output = Result<(), BackendError>> + Send + '_ {
        std::future::poll_fn(move |cx| self.poll_fill(cx))
    }

    /// [`BackendConn::fill`] as a poll.
    pub fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BackendError>> {
        while !self.has_frame() {
            let received = match &mut self.stream {
                ServerStream::Plain(stream) => {
                    ready!(crate::socket::poll_recv(stream, cx, &mut self.read_buf))
                }
                ServerStream::Tls(stream) => {
                    ready!(poll_read_tls(stream, cx, &mut self.read_buf))
                }
                #[cfg(test)]
                ServerStream::Memory(stream) => {
                    ready!(poll_read_tls(stream, cx, &mut self.read_buf))
                }
            };
            let n = match received {
                Ok(n) => n,
                Err(e) => return Poll::Ready(Err(self.lost(e))),
            };
            if n == 0 {
                return Poll::Ready(Err(self.lost_because("server closed the connection".into())));
            }
        }
        Poll::Ready(Ok(()))
    }

    /// The next buffered frame, if a whole one is there.
    pub fn next_frame(&mut self) -> Option<Result<Frame, BackendError>> {
        if !self.has_frame() {
            return None;
        }
        if let Some(status) = self.take_ready() {
            // ReadyForQuery ends every transaction: no allocation for it.
            return Some(Ok(crate::net::backend::build::ready_for_query(status)));
        }
        Some(match decode_frame(&mut self.read_buf, usize::MAX) {
            Ok(Some(frame)) if frame.tag == b'S' => {
                if let Ok(BackendMessage::ParameterStatus { name, value }) =
                    BackendMessage::parse(&frame)
                    && self.reported.get(&name) != Some(&value)
                {
                    self.reported.insert(name, value);
                    self.reported_stamp = reported_stamp();
                }
                Ok(frame)
            }
            Ok(frame) => Ok(frame.expect("a whole frame is buffered")),
            Err(source) => Err(BackendError::Protocol {
                node: self.address.clone(),
                source,
            }),
        })
    }

    /// Runs `sql` as a simple query and returns its first row (empty when it has none). A server
    /// error becomes `BackendError::Startup`-like `Lost`, since the caller's own SQL failed.
    pub async fn query_row(&mut self, sql: &str) -> Result<Vec<Option<String>>, BackendError> {
        self.send(&[FrontendMessage::Query(sql.into()).to_frame()])
            .await?;
        // A simple Query drops the unnamed statement.
        self.unnamed = None;
        match self.answer_row().await? {
            Err(why) => Err(BackendError::Lost {
                node: self.address.clone(),
                why: format!("the proxy's query {sql:?} failed: {why}"),
            }),
            Ok(row) => Ok(row.unwrap_or_default()),
        }
    }

    /// Reads the answer to the proxy's own statement up to ReadyForQuery: its first row (None
    /// when it has none), or the server's error message.
    pub async fn answer_row(
        &mut self,
    ) -> Result<Result<Option<Vec<Option<String>>>, String>, BackendError> {
        let mut row = None;
        let mut error = None;
        loop {
            let frame = self.recv().await?;
            match self.parse(&frame)? {
                BackendMessage::Other(b'D') if row.is_none() => {
                    row = crate::net::backend::data_row(&frame.body);
                }
                BackendMessage::ErrorResponse(e) => {
                    error = Some(e.get(b'M').unwrap_or("error").to_string())
                }
                BackendMessage::ReadyForQuery(_) => break,
                _ => {}
            }
        }
        Ok(match error {
            Some(why) => Err(why),
            None => Ok(row),
        })
    }

    /// Runs `sql` as a simple query and discards the result; used for resets. Returns the error
    /// message if the server reported one.
    pub async fn run_simple(&mut self, sql: &str) -> Result<Option<String>, BackendError> {
        // A simple Query drops the unnamed statement.
        self.unnamed = None;
        self.send(&[FrontendMessage::Query(sql.into()).to_frame()])
            .await?;
        let mut error = None;
        loop {
            let frame = self.recv().await?;
            match self.parse(&frame)? {
                BackendMessage::ErrorResponse(e) => {
                    error = Some(e.get(b'M').unwrap_or("error").to_string())
                }
                BackendMessage::ReadyForQuery(_) => return Ok(error),
                _ => {}
            }
        }
    }
}

/// Reads what TLS (or a unit test's in-memory pipe) yields into `buf`'s spare room (made first,
/// as for plain TCP); 0 at the end.
fn poll_read_tls<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    cx: &mut Context<'_>,
    buf: &mut BytesMut,
) -> Poll<std::io::Result<usize>> {
    crate::net::room_to_read(buf);
    let mut read = tokio::io::ReadBuf::uninit(buf.spare_capacity_mut());
    ready!(std::pin::Pin::new(stream).poll_read(cx, &mut read))?;
    let n = read.filled().len();
    // SAFETY: poll_read initialised the first `n` bytes of the spare room.
    unsafe { buf.set_len(buf.len() + n) };
    Poll::Ready(Ok(n))
}

impl BackendConn {
    /// Whether an idle connection can be handed out: nothing may be waiting on it. A server that
    /// closed it (restart, `pg_terminate_backend`, idle timeout) left EOF or a FATAL behind, and
    /// handing that out would turn a statement that never reached a server into an error.
    pub fn is_usable(&mut self) -> bool {
        let mut probe = [0u8; 1];
        let socket = match &mut self.stream {
            ServerStream::Plain(stream) => &*stream,
            ServerStream::Tls(stream) => {
                // Records already taken off the socket may hold a message (or the close).
                let (socket, session) = stream.get_mut();
                match session.process_new_packets() {
                    Ok(state)
                        if state.plaintext_bytes_to_read() == 0 && !state.peer_has_closed() => {}
                    _ => return false,
                }
                &*socket
            }
            #[cfg(test)]
            ServerStream::Memory(_) => return self.read_buf.is_empty(),
        };
        self.read_buf.is_empty()
            && matches!(socket.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }

    /// Whether this connection runs over TLS.
    pub fn is_tls(&self) -> bool {
        matches!(self.stream, ServerStream::Tls(_))
    }

    /// Sends a Terminate and waits, at most `bound`, for the server to close its end. The
    /// server closes the socket only after its backend left pg_stat_activity (PostgreSQL runs
    /// the shared-memory exit hooks before the proc-exit ones that close the socket), so
    /// a connection opened after this returns is not counted next to this one on the server.
    pub async fn terminate(mut self, bound: Duration) {
        let closed = async {
            if self
                .send(&[FrontendMessage::Terminate.to_frame()])
                .await
                .is_ok()
            {
                while self.recv().await.is_ok() {}
            }
        };
        let _ = crate::timer::timeout(bound, closed).await;
    }

    /// Closes the connection politely: a Terminate (and over TLS a close_notify) if the socket
    /// takes it without waiting (so the server logs no unexpected EOF), then the socket is
    /// dropped.
    pub fn close(self) {
        let mut terminate = BytesMut::new();
        FrontendMessage::Terminate.to_frame().encode(&mut terminate);
        match self.stream {
            ServerStream::Plain(stream) => {
                let _ = stream.try_write(&terminate);
            }
            ServerStream::Tls(mut stream) => {
                use std::io::Write;
                let (socket, session) = stream.get_mut();
                let _ = session.writer().write_all(&terminate);
                session.send_close_notify();
                let mut records = Vec::new();
                while session.wants_write() {
                    if session.write_tls(&mut records).is_err() {
                        break;
                    }
                }
                let _ = socket.try_write(&records);
            }
            #[cfg(test)]
            ServerStream::Memory(_) => {}
        }
    }

    /// A connection to node `node` over an in-process pipe, logged in as nothing in particular,
    /// and the pipe's other end: what the proxy sends arrives there, and what the test writes
    /// there is the server's answer. For unit tests of the session's reply handling.
    #[cfg(test)]
    pub(crate) fn in_memory(node: usize) -> (BackendConn, tokio::io::DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(1 << 20);
        let conn = BackendConn::fresh(
            ServerStream::Memory(ours),
            node,
            "in-memory:5432".into(),
            "app",
        );
        (conn, theirs)
    }

    /// A connection over `stream` before its login: nothing learned, nothing applied.
    fn fresh(stream: ServerStream, node: usize, address: String, database: &str) -> BackendConn {
        BackendConn {
            stream,
            read_buf: BytesMut::with_capacity(16 * 1024),
            write_buf: BytesMut::with_capacity(16 * 1024),
            node,
            address,
            database: database.to_string(),
            cancel: Arc::default(),
            server_params: Vec::new(),
            prepared: HashMap::new(),
            unnamed: None,
            applied: Settings::new(),
            reported: HashMap::new(),
            reported_stamp: reported_stamp(),
            facts: ServerFacts::default(),
            opened: super::clock::Coarse::now(),
            severable: None,
        }
    }

    /// Moves the complete messages at the front of the read buffer whose tag `plain` accepts
    /// into `out` as they are — one copy, no parsing — and stops at the first other or
    /// incomplete one. Returns the bytes moved.
    pub fn take_plain(&mut self, out: &mut BytesMut, plain: impl Fn(u8) -> bool) -> usize {
        let end = self.plain_run(plain);
        if end > 0 {
            out.extend_from_slice(&self.read_buf[..end]);
            self.read_buf.advance(end);
        }
        end
    }

    /// Drops the complete messages at the front of the read buffer whose tag `plain` accepts,
    /// unread (answers nobody needs: a proxy segment's BindComplete, say); the bytes dropped.
    pub fn skip_plain(&mut self, plain: impl Fn(u8) -> bool) -> usize {
        let end = self.plain_run(plain);
        self.read_buf.advance(end);
        end
    }

    /// The length of the run of complete messages at the front of the read buffer whose tag
    /// `plain` accepts.
    fn plain_run(&self, plain: impl Fn(u8) -> bool) -> usize {
        let b = &self.read_buf;
        let mut end = 0;
        while b.len() >= end + 5 && plain(b[end]) {
            let len = u32::from_be_bytes([b[end + 1], b[end + 2], b[end + 3], b[end + 4]]) as usize;
            if len < 4 || b.len() < end + 1 + len {
                break;
            }
            end += 1 + len;
        }
        end
    }

    /// Takes a buffered ReadyForQuery off the front; its transaction status. One with a status
    /// byte PostgreSQL never sends stays, for the frame parser to refuse.
    pub fn take_ready(&mut self) -> Option<TxStatus> {
        let b = &self.read_buf;
        if b.len() >= 6 && b[0] == b'Z' && b[1..5] == [0, 0, 0, 5] {
            let status = TxStatus::from_byte(b[5])?;
            self.read_buf.advance(6);
            return Some(status);
        }
        None
    }

    /// Whether a whole frame is already buffered (so the client flush can wait for it).
    /// A length below 4 counts as whole, so that `next_frame` reports it.
    pub fn has_frame(&self) -> bool {
        let b = &self.read_buf;
        b.len() >= 5 && (u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize) < b.len()
    }
}
