//! Accepting clients: the accept loop with its connection limit and drain on shutdown, and the
//! handshake before a session exists — SSLRequest and GSSENCRequest declined with 'N',
//! CancelRequest forwarded to the backend running the client's query, StartupMessage and
//! password exchange. A client that sends garbage gets a FATAL and loses only its own connection.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::Proxy;
use super::session::{ClientIo, ClientSocket, Session};
use crate::auth::{Credential, ScramExchange, md5_response};
use crate::net::backend::build;
use crate::net::{ErrorFields, Frame, FrontendMessage, StartupFrame, startup::decode_startup};

/// How long a draining proxy waits for open sessions before it exits anyway.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);

impl Proxy {
    /// Serves clients until `shutdown` turns true, then drains.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        mut shutdown: watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        let config = self.config();
        let check_timeout = config.connect_timeout;
        let mut first_checks = JoinSet::new();
        for node in self.nodes.all().iter() {
            let (node, proxy) = (Arc::clone(node), Arc::clone(&self));
            first_checks.spawn(async move {
                let (nodes, watcher) = (&proxy.nodes, &proxy.causal.watcher);
                crate::backend::monitor::check(&node, nodes, watcher, &mut None, check_timeout)
                    .await
            });
        }
        first_checks.join_all().await;
        *self.monitors.lock().expect("monitors lock") =
            Some((shutdown.clone(), tokio::runtime::Handle::current()));
        for node in self.nodes.all().iter() {
            self.watch(Arc::clone(node));
        }
        let (reaped, stop) = (Arc::clone(&self), shutdown.clone());
        tokio::spawn(async move {
            crate::backend::pool::reap(&reaped.nodes, || reaped.config().pool_limits(), stop).await
        });
        if let Some(admin) = config.admin_listen {
            let admin_listener = TcpListener::bind(admin).await?;
            tokio::spawn(crate::admin::serve(
                Arc::clone(&self),
                admin_listener,
                shutdown.clone(),
            ));
        }
        let mut sessions = JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(a) => a,
                        Err(e) => { tracing::warn!("accept failed: {e}"); continue; }
                    };
                    let proxy = Arc::clone(&self);
                    let stop = shutdown.clone();
                    sessions.spawn(async move {
                        if let Err(e) = proxy.handle_client(stream, stop).await {
                            tracing::debug!(%peer, "client session ended: {e}");
                        }
                    });
                }
                _ = shutdown.changed() => if *shutdown.borrow() { break },
                Some(_) = sessions.join_next(), if !sessions.is_empty() => {}
            }
        }
        drop(listener);
        let _ = crate::timer::timeout(DRAIN_LIMIT, async {
            while sessions.join_next().await.is_some() {}
        })
        .await;
        Ok(())
    }

    async fn handle_client(
        self: Arc<Self>,
        stream: TcpStream,
        shutdown: watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        let _ = stream.set_nodelay(true);
        let config = self.config();
        let mut socket: Box<dyn ClientSocket> = Box::new(stream);
        let mut buf = BytesMut::with_capacity(1024);
        let mut encrypted = false;
        let (minor, params) = loop {
            match read_startup(&mut socket, &mut buf, config.max_message_size).await? {
                StartupFrame::SslRequest => match config.tls.as_ref().filter(|_| !encrypted) {
                    Some(tls) => {
                        if !buf.is_empty() {
                            // Bytes sent before the TLS handshake could be injected by a
                            // man in the middle; PostgreSQL refuses them too.
                            anyhow::bail!(
                                "client sent data after SSLRequest before the TLS handshake"
                            );
                        }
                        socket.write_all(b"S").await?;
                        socket = Box::new(tls.acceptor.accept(socket).await?);
                        encrypted = true;
                    }
                    None => socket.write_all(b"N").await?,
                },
                StartupFrame::GssEncRequest => socket.write_all(b"N").await?,
                StartupFrame::Cancel { pid, secret } => {
                    return self.forward_cancel(pid, &secret).await;
                }
                StartupFrame::Startup { minor, params } => break (minor, params),
            }
        };
        if config.tls.as_ref().is_some_and(|t| t.required) && !encrypted {
            let message = "lsngate requires TLS for every client: connect with sslmode=require";
            socket
                .write_all(&fatal("28000", message).to_bytes())
                .await?;
            anyhow::bail!(message);
        }
        if self.client_joined() > config.max_client_connections {
            self.client_left();
            socket
                .write_all(
                    &fatal(
                        "53300",
                        "too many clients connected to lsngate; raise max_client_connections",
                    )
                    .to_bytes(),
                )
                .await?;
            anyhow::bail!("client limit reached");
        }
        let result = self
            .login_and_run(socket, buf, minor, params, shutdown)
            .await;
        self.client_left();
        result
    }

    async fn login_and_run(
        self: &Arc<Self>,
        stream: Box<dyn ClientSocket>,
        buf: BytesMut,
        minor: u16,
        params: Vec<(String, String)>,
        shutdown: watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        let config = self.config();
        let mut io = ClientIo::new(stream, buf, config.max_message_size);
        let user = StartupFrame::param(&params, "user").unwrap_or_default();
        let database = StartupFrame::param(&params, "database").unwrap_or_else(|| user.clone());
        if minor > 0 || params.iter().any(|(k, _)| k.starts_with("_pq_.")) {
            let unsupported: Vec<String> = params
                .iter()
                .filter(|(k, _)| k.starts_with("_pq_."))
                .map(|(k, _)| k.clone())
                .collect();
            io.queue(&build::negotiate_protocol_version(&unsupported));
        }
        let Some(credential) = config.credential(&user).cloned() else {
            let message =
                format!("no such user \"{user}\" in the lsngate config; add it under [[users]]");
            io.queue(&fatal("28000", &message));
            io.flush().await?;
            anyhow::bail!(message);
        };
        if let Err(e) = authenticate(&mut io, &user, &credential).await {
            io.queue(&fatal("28P01", &e.to_string()));
            let _ = io.flush().await;
            return Err(e);
        }
        let (key, slot) = self.register_cancel();
        let session = Session::start(
            Arc::clone(self),
            io,
            user,
            database,
            params,
            key,
            slot,
            shutdown,
        )
        .await;
        let result = match session {
            Ok(session) => session.run().await,
            Err(e) => Err(e),
        };
        self.unregister_cancel(key);
        result
    }

    async fn forward_cancel(&self, pid: i32, secret: &[u8]) -> anyhow::Result<()> {
        if secret.len() != 4 {
            return Ok(());
        }
        let key = (
            pid,
            i32::from_be_bytes([secret[0], secret[1], secret[2], secret[3]]),
        );
        let Some(target) = self.cancel_target(key) else {
            return Ok(());
        };
        metrics::counter!("lsngate_proxy_cancels_total").increment(1);
        // Over TLS when the cancelled connection used it.
        target.send().await?;
        Ok(())
    }
}

/// Reads the next untagged startup-phase packet; garbage gets a FATAL and ends the connection.
async fn read_startup(
    socket: &mut Box<dyn ClientSocket>,
    buf: &mut BytesMut,
    max_len: usize,
) -> anyhow::Result<StartupFrame> {
    loop {
        match decode_startup(buf, max_len) {
            Ok(Some(frame)) => return Ok(frame),
            Ok(None) => {}
            Err(e) => {
                metrics::counter!("lsngate_proxy_errors_total", "kind" => "protocol").increment(1);
                let _ = socket
                    .write_all(&fatal("08P01", &e.to_string()).to_bytes())
                    .await;
                anyhow::bail!(e);
            }
        }
        if crate::timer::timeout(Duration::from_secs(30), socket.read_buf(buf)).await?? == 0 {
            anyhow::bail!("client left during startup");
        }
    }
}

/// A FATAL ErrorResponse frame.
pub fn fatal(code: &str, message: &str) -> Frame {
    ErrorFields::new("FATAL", code, message).to_frame(b'E')
}

async fn read_auth_response(io: &mut ClientIo) -> anyhow::Result<Bytes> {
    match io.recv().await? {
        Some(frame) => match FrontendMessage::parse(&frame)? {
            FrontendMessage::AuthResponse(body) => Ok(body),
            other => anyhow::bail!("expected a password message, got {other:?}"),
        },
        None => anyhow::bail!("client left during authentication"),
    }
}

fn cstring(body: &[u8]) -> String {
    String::from_utf8_lossy(body.strip_suffix(&[0]).unwrap_or(body)).into_owned()
}

async fn authenticate(
    io: &mut ClientIo,
    user: &str,
    credential: &Credential,
) -> anyhow::Result<()> {
    match credential {
        Credential::Trust => {}
        Credential::Md5 { hash } => {
            let salt: [u8; 4] = rand::random();
            io.queue(&build::auth_md5(salt));
            io.flush().await?;
            let answer = cstring(&read_auth_response(io).await?);
            if answer != md5_response(hash, salt) {
                anyhow::bail!(crate::auth::AuthError::BadPassword(user.to_string()));
            }
        }
        Credential::Scram(verifier) => {
            io.queue(&build::auth_sasl());
            io.flush().await?;
            let initial = read_auth_response(io).await?;
            let client_first = sasl_initial_data(&initial)?;
            let exchange = ScramExchange::start(verifier, &client_first)?;
            io.queue(&build::auth_sasl_continue(
                exchange.server_first().as_bytes(),
            ));
            io.flush().await?;
            let client_final = String::from_utf8_lossy(&read_auth_response(io).await?).into_owned();
            let server_final = exchange.finish(user, verifier, &client_final)?;
            io.queue(&build::auth_sasl_final(server_final.as_bytes()));
        }
    }
    io.queue(&build::auth_ok());
    Ok(())
}

fn sasl_initial_data(body: &[u8]) -> anyhow::Result<String> {
    let nul = body
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| anyhow::anyhow!("malformed SASLInitialResponse"))?;
    if &body[..nul] != b"SCRAM-SHA-256" {
        anyhow::bail!(
            "unsupported SASL mechanism {:?}; use SCRAM-SHA-256",
            String::from_utf8_lossy(&body[..nul])
        );
    }
    let rest = &body[nul + 1..];
    if rest.len() < 4 {
        anyhow::bail!("malformed SASLInitialResponse");
    }
    Ok(String::from_utf8_lossy(&rest[4..]).into_owned())
}
