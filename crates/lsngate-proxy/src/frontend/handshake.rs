//! A client's handshake, before a session exists (the accept loop that calls it is the
//! crate's top, `serve`) — SSLRequest and GSSENCRequest declined with 'N',
//! CancelRequest forwarded to the backend running the client's query, StartupMessage and
//! password exchange. A client that sends garbage gets a FATAL and loses only its own connection.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::client_io::{ClientIo, ClientSocket};
use super::error::ClientError;
use super::session::Session;
use crate::auth::{AuthError, Credential, ScramExchange, ServerSecret, md5_response};
use crate::clients::{ClientEntry, NewClient};
use crate::config::{AuthServerLogin, Config, ConsoleAccess, HbaLogin, HbaMethod, ServerLogin};
use crate::logins::{Login, Queried};
use crate::net::backend::build::{self, fatal};
use crate::net::sqlstate;
use crate::net::{FrontendMessage, StartupFrame, startup::decode_startup};
use crate::proxy::Proxy;

/// A client of the admin console, logged in: who, with which rights, and its registry entry.
#[derive(Debug)]
pub(crate) struct ConsoleLogin {
    /// Login name.
    pub user: String,
    /// The database name it used (`lsngate` or `pgbouncer`).
    pub database: String,
    /// What it may run.
    pub access: ConsoleAccess,
    /// Its entry in the client registry (its id, its kill switch).
    pub entry: Arc<ClientEntry>,
    /// The client's startup parameters.
    pub params: Vec<(String, String)>,
    /// Its cancel key.
    pub cancel_key: (i32, i32),
}

/// Serves a logged-in admin-console client: the admin layer's, handed down by `serve` (the
/// client side names no layer above it).
pub(crate) type ConsoleFn =
    fn(
        Arc<Proxy>,
        ClientIo,
        ConsoleLogin,
        watch::Receiver<bool>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ClientError>> + Send>>;

/// Where a client connected from and over what.
#[derive(Debug, Clone, Copy)]
struct Origin {
    peer: Option<std::net::SocketAddr>,
    local: Option<std::net::SocketAddr>,
    tls: bool,
}

/// Serves one accepted client connection: the handshake, then its session (or the admin
/// console, for the databases `lsngate` and `pgbouncer`) until it ends.
pub(crate) async fn handle_client(
    proxy: Arc<Proxy>,
    stream: TcpStream,
    shutdown: watch::Receiver<bool>,
    console: ConsoleFn,
) -> Result<(), ClientError> {
    let _ = stream.set_nodelay(true);
    let (peer, local) = (stream.peer_addr().ok(), stream.local_addr().ok());
    let config = proxy.config();
    // One bound for the whole login, as PostgreSQL's authentication_timeout: a client that
    // connects and stalls (or trickles a byte at a time) must not hold its slot for ever.
    let login_deadline = tokio::time::Instant::now() + config.client_login_timeout;
    let mut socket: Box<dyn ClientSocket> = Box::new(stream);
    let mut buf = BytesMut::with_capacity(1024);
    let mut encrypted = false;
    let (minor, params) = loop {
        let startup = crate::timer::timeout_at(
            login_deadline,
            read_startup(&mut socket, &mut buf, config.max_message_size),
        )
        .await;
        let Ok(startup) = startup else {
            return Err(ClientError::Refused(format!(
                "no startup message within client_login_timeout_ms ({} ms)",
                config.client_login_timeout.as_millis()
            )));
        };
        match startup? {
            StartupFrame::SslRequest => match config.tls.as_ref().filter(|_| !encrypted) {
                Some(tls) => {
                    if !buf.is_empty() {
                        // Bytes sent before the TLS handshake could be injected by a
                        // man in the middle; PostgreSQL refuses them too.
                        return Err(ClientError::Protocol(
                            "client sent data after SSLRequest before the TLS handshake".into(),
                        ));
                    }
                    socket.write_all(b"S").await?;
                    let handshake =
                        crate::timer::timeout_at(login_deadline, tls.acceptor.accept(socket));
                    socket = Box::new(handshake.await.map_err(|_| {
                        ClientError::Refused(
                            "TLS handshake not done within client_login_timeout_ms".into(),
                        )
                    })??);
                    encrypted = true;
                }
                None => socket.write_all(b"N").await?,
            },
            StartupFrame::GssEncRequest => socket.write_all(b"N").await?,
            StartupFrame::Cancel { pid, secret } => {
                return forward_cancel(&proxy, pid, &secret).await;
            }
            StartupFrame::Startup { minor, params } => break (minor, params),
        }
    };
    if config.tls.as_ref().is_some_and(|t| t.required) && !encrypted {
        let message = "lsngate requires TLS for every client: connect with sslmode=require";
        socket
            .write_all(&fatal(sqlstate::INVALID_AUTHORIZATION_SPECIFICATION, message).to_bytes())
            .await?;
        return Err(ClientError::Refused(message.into()));
    }
    if proxy.client_joined() > config.max_client_connections {
        proxy.client_left();
        socket
            .write_all(
                &fatal(
                    sqlstate::TOO_MANY_CONNECTIONS,
                    "too many clients connected to lsngate; raise max_client_connections",
                )
                .to_bytes(),
            )
            .await?;
        return Err(ClientError::Refused("client limit reached".into()));
    }
    let origin = Origin {
        peer,
        local,
        tls: encrypted,
    };
    let result = login_and_run(
        &proxy,
        socket,
        buf,
        minor,
        params,
        shutdown,
        origin,
        console,
        login_deadline,
    )
    .await;
    proxy.client_left();
    result
}

/// Refuses the login with a FATAL carrying `code` and `message`.
async fn refuse(io: &mut ClientIo, code: &str, message: String) -> Result<(), ClientError> {
    io.queue(&fatal(code, &message));
    io.flush().await?;
    Err(ClientError::Refused(message))
}

#[allow(clippy::too_many_arguments)]
async fn login_and_run(
    proxy: &Arc<Proxy>,
    stream: Box<dyn ClientSocket>,
    buf: BytesMut,
    minor: u16,
    params: Vec<(String, String)>,
    shutdown: watch::Receiver<bool>,
    origin: Origin,
    console: ConsoleFn,
    login_deadline: tokio::time::Instant,
) -> Result<(), ClientError> {
    let config = proxy.config();
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
    let hba = match hba_method(&config, origin, &user, &database) {
        Ok(method) => method,
        Err(message) => {
            login_failed(&user, &database, origin, &message);
            return refuse(
                &mut io,
                sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
                message,
            )
            .await;
        }
    };
    let found = proxy
        .logins
        .find(&config, &proxy.nodes, &user, &database)
        .await;
    let (credential, queried) = match found {
        Ok(Login::Listed(credential)) => (credential, None),
        Ok(Login::Queried(queried)) => (queried.credential.clone(), Some(queried)),
        // As PostgreSQL does for a role it lacks: a full exchange against a secret nobody
        // knows, so the client learns only "password authentication failed".
        Ok(Login::NoSecret) => (nobodys_secret(), None),
        Ok(Login::Unlisted) => {
            let message =
                format!("no such user \"{user}\" in the lsngate config; add it under [[users]]");
            login_failed(&user, &database, origin, "unknown user");
            return refuse(
                &mut io,
                sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
                message,
            )
            .await;
        }
        Err(e) => {
            login_failed(&user, &database, origin, &format!("auth_query failed: {e}"));
            let message = format!(
                "could not check the password of user \"{user}\": the server did not answer auth_query ({e})"
            );
            return refuse(&mut io, sqlstate::CONNECTION_FAILURE, message).await;
        }
    };
    let (credential, hba_refusal) = match hba {
        None => (credential, None),
        Some((method, line)) => match hba_credential(method, credential) {
            Ok(credential) => (credential, None),
            Err(why) => (
                nobodys_secret(),
                Some(format!("auth_hba_file line {line} ({method:?}): {why}")),
            ),
        },
    };
    let authenticated =
        crate::timer::timeout_at(login_deadline, authenticate(&mut io, &user, &credential))
            .await
            .unwrap_or_else(|_| {
                Err(ClientError::LoginTimeout(format!(
                    "canceling authentication due to timeout: not logged in within client_login_timeout_ms ({} ms)",
                    config.client_login_timeout.as_millis()
                )))
            });
    let client_key = match authenticated {
        Ok(client_key) => client_key,
        Err(e) => {
            let code = match e {
                ClientError::Protocol(_) => sqlstate::PROTOCOL_VIOLATION,
                ClientError::LoginTimeout(_) => sqlstate::QUERY_CANCELED,
                _ => sqlstate::INVALID_PASSWORD,
            };
            let reason = match (&e, &queried) {
                (ClientError::Auth(_), _) if hba_refusal.is_some() => {
                    hba_refusal.unwrap_or_default()
                }
                (ClientError::Auth(_), None) if config.user(&user).is_none() => {
                    "auth_query found no password for this role".to_string()
                }
                (ClientError::Auth(_), Some(_)) => {
                    // The server's secret may have changed since it was cached.
                    proxy.logins.forget(&config, &user, &database);
                    "wrong password (auth_query's secret)".to_string()
                }
                _ => e.to_string(),
            };
            login_failed(&user, &database, origin, &reason);
            io.queue(&fatal(code, &e.to_string()));
            let _ = io.flush().await;
            return Err(e);
        }
    };
    let server_login = match &queried {
        None => config.user(&user).and_then(|u| u.server_login.clone()),
        Some(queried) => auth_server_login(&config, &user, queried, client_key),
    };
    let console_access = if crate::config::is_console_database(&database) {
        // PgBouncer's answer to a user in neither list, with the fix.
        let Some(access) = config.console_access(&user) else {
            let message = format!(
                "not allowed: user \"{user}\" may not use the admin console \"{database}\"; \
                 add it to admin_users (every command) or stats_users (SHOW only)"
            );
            return refuse(
                &mut io,
                sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
                message,
            )
            .await;
        };
        Some(access)
    } else {
        if proxy.nodes.gates.is_disabled(&database) {
            let message = format!(
                "database \"{database}\" is not currently accepting connections: it was \
                 DISABLEd on the lsngate admin console; ENABLE {database} there"
            );
            return refuse(&mut io, sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE, message).await;
        }
        None
    };
    let (key, slot) = proxy.register_cancel();
    let limits = crate::clients::ClientLimits {
        per_database: config.max_db_client_connections,
        per_user: config.max_user_client_connections,
    };
    let registered = proxy.registry.register_within(
        NewClient {
            user: user.clone(),
            database: database.clone(),
            peer: origin.peer,
            local: origin.local,
            application_name: StartupFrame::param(&params, "application_name").unwrap_or_default(),
            tls: origin.tls,
            cancel: Arc::clone(&slot),
        },
        limits,
    );
    let registered = match registered {
        Ok(registered) => registered,
        Err(over) => {
            proxy.unregister_cancel(key);
            return refuse(&mut io, sqlstate::TOO_MANY_CONNECTIONS, over.to_string()).await;
        }
    };
    if let Some(access) = console_access {
        let login = ConsoleLogin {
            user,
            database,
            access,
            entry: Arc::clone(&registered.entry),
            params,
            cancel_key: key,
        };
        let result = console(Arc::clone(proxy), io, login, shutdown).await;
        proxy.unregister_cancel(key);
        return result;
    }
    let session = Session::start(
        Arc::clone(proxy),
        io,
        user,
        database,
        params,
        key,
        slot,
        shutdown,
        Arc::clone(&registered.entry),
        server_login,
    )
    .await;
    let result = match session {
        Ok(session) => session.run().await,
        Err(e) => Err(e),
    };
    proxy.unregister_cancel(key);
    result
}

async fn forward_cancel(proxy: &Proxy, pid: i32, secret: &[u8]) -> Result<(), ClientError> {
    if secret.len() != 4 {
        return Ok(());
    }
    let key = (
        pid,
        i32::from_be_bytes([secret[0], secret[1], secret[2], secret[3]]),
    );
    let owner = crate::handover::pid_of_key(pid);
    let config = proxy.config();
    match &config.runtime_dir {
        // A session of another lsngate process on this port (one this process took over from):
        // its control socket passes the key on.
        Some(dir) if owner != std::process::id() & crate::handover::PID_MASK => {
            let (dir, port) = (dir.clone(), config.listen.port());
            let forwarded = tokio::task::spawn_blocking(move || {
                crate::handover::forward_cancel(&dir, port, owner, key)
            })
            .await;
            match forwarded {
                Ok(Ok(true)) => metrics::counter!("lsngate_proxy_cancels_total").increment(1),
                Ok(Ok(false)) => {}
                Ok(Err(e)) => tracing::info!(pid = owner, "cancel not forwarded: {e}"),
                Err(e) => tracing::info!(pid = owner, "cancel not forwarded: {e}"),
            }
            Ok(())
        }
        _ => cancel_here(proxy, key).await,
    }
}

/// Cancels the statement of this process's session with `key`, if one runs on a server.
pub(crate) async fn cancel_here(proxy: &Proxy, key: (i32, i32)) -> Result<(), ClientError> {
    let Some(target) = proxy.cancel_target(key) else {
        return Ok(());
    };
    metrics::counter!("lsngate_proxy_cancels_total").increment(1);
    // Over TLS when the cancelled connection used it.
    target.send().await?;
    Ok(())
}

/// Reads the next untagged startup-phase packet; garbage gets a FATAL and ends the connection.
async fn read_startup(
    socket: &mut Box<dyn ClientSocket>,
    buf: &mut BytesMut,
    max_len: usize,
) -> Result<StartupFrame, ClientError> {
    loop {
        match decode_startup(buf, max_len) {
            Ok(Some(frame)) => return Ok(frame),
            Ok(None) => {}
            Err(e) => {
                metrics::counter!("lsngate_proxy_errors_total", "kind" => "protocol").increment(1);
                let _ = socket
                    .write_all(&fatal(sqlstate::PROTOCOL_VIOLATION, &e.to_string()).to_bytes())
                    .await;
                return Err(e.into());
            }
        }
        if socket.read_buf(buf).await? == 0 {
            return Err(ClientError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
    }
}

async fn read_auth_response(io: &mut ClientIo) -> Result<Bytes, ClientError> {
    match io.recv().await? {
        Some(frame) => match FrontendMessage::parse(&frame)? {
            FrontendMessage::AuthResponse(body) => Ok(body),
            other => Err(ClientError::Protocol(format!(
                "expected a password message, got {other:?}"
            ))),
        },
        None => Err(ClientError::Io(std::io::ErrorKind::UnexpectedEof.into())),
    }
}

fn cstring(body: &[u8]) -> String {
    String::from_utf8_lossy(body.strip_suffix(&[0]).unwrap_or(body)).into_owned()
}

/// Runs the password exchange `credential` asks for; returns the ClientKey a SCRAM client
/// proved (for `auth_server_login = "client_role"`).
async fn authenticate(
    io: &mut ClientIo,
    user: &str,
    credential: &Credential,
) -> Result<Option<Vec<u8>>, ClientError> {
    let mut client_key = None;
    match credential {
        Credential::Trust => {}
        Credential::Md5 { hash } => {
            let salt: [u8; 4] = rand::random();
            io.queue(&build::auth_md5(salt));
            io.flush().await?;
            let answer = cstring(&read_auth_response(io).await?);
            if answer != md5_response(hash, salt) {
                return Err(crate::auth::AuthError::WrongPassword(user.to_string()).into());
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
            let proved = exchange.finish(user, verifier, &client_final)?;
            io.queue(&build::auth_sasl_final(proved.server_final.as_bytes()));
            client_key = Some(proved.client_key);
        }
    }
    io.queue(&build::auth_ok());
    Ok(client_key)
}

/// As whom a client auth_query let in reaches the servers: its own role, proved with what its
/// login proved, or the node URL's user.
fn auth_server_login(
    config: &Config,
    user: &str,
    queried: &Queried,
    client_key: Option<Vec<u8>>,
) -> Option<ServerLogin> {
    let auth = config.auth_query.as_ref()?;
    if auth.server_login == AuthServerLogin::NodeUser {
        return None;
    }
    let secret = match (&queried.plain, &queried.credential, client_key) {
        (Some(plain), _, _) => ServerSecret::Password(plain.clone()),
        (None, Credential::Scram(verifier), Some(client_key)) => ServerSecret::ScramKeys {
            client_key,
            server_key: verifier.server_key.clone(),
        },
        (None, Credential::Md5 { hash }, _) => ServerSecret::Md5Hash(hash.clone()),
        _ => ServerSecret::None,
    };
    Some(ServerLogin {
        user: user.to_string(),
        secret,
    })
}

/// A secret no password matches: a login against it runs the whole SCRAM exchange and fails.
fn nobodys_secret() -> Credential {
    let nobody: [u8; 16] = rand::random();
    Credential::Scram(crate::auth::ScramVerifier::from_password(
        &format!("{nobody:?}"),
        4096,
    ))
}

/// The `auth_hba_file` method for this login: None without the file; an error (PostgreSQL's
/// words) when no rule matches or the rule rejects.
fn hba_method(
    config: &Config,
    origin: Origin,
    user: &str,
    database: &str,
) -> Result<Option<(HbaMethod, usize)>, String> {
    let Some(hba) = &config.hba else {
        return Ok(None);
    };
    let encryption = if origin.tls {
        "SSL encryption"
    } else {
        "no encryption"
    };
    let Some(peer) = origin.peer else {
        return Err(format!(
            "no pg_hba.conf entry for an unknown host, user \"{user}\", database \"{database}\", {encryption}"
        ));
    };
    let login = HbaLogin {
        peer: peer.ip(),
        tls: origin.tls,
        user,
        database,
    };
    let host = peer.ip();
    match hba.method(login) {
        None => Err(format!(
            "no pg_hba.conf entry for host \"{host}\", user \"{user}\", database \"{database}\", {encryption}"
        )),
        Some((HbaMethod::Reject, _)) => Err(format!(
            "pg_hba.conf rejects connection for host \"{host}\", user \"{user}\", database \"{database}\", {encryption}"
        )),
        Some(rule) => Ok(Some(rule)),
    }
}

/// What a login must prove under the rule's method: `trust` asks nothing; `scram-sha-256`
/// takes only a SCRAM secret; `md5` and `password` take the user's secret as it is. A user
/// without a password cannot pass a method that asks for one: the error says why (for the log;
/// the client is told only that the password failed).
fn hba_credential(method: HbaMethod, credential: Credential) -> Result<Credential, &'static str> {
    match (method, credential) {
        (HbaMethod::Trust, _) => Ok(Credential::Trust),
        (HbaMethod::ScramSha256, Credential::Md5 { .. }) => {
            Err("the user's secret is an MD5 hash, the rule demands SCRAM")
        }
        (_, Credential::Trust) => Err("the user has no password, the rule demands one"),
        (_, credential) => Ok(credential),
    }
}

/// Counts and logs a refused login with its reason; the client hears only what PostgreSQL
/// would say.
fn login_failed(user: &str, database: &str, origin: Origin, reason: &str) {
    metrics::counter!("lsngate_proxy_login_failures_total").increment(1);
    tracing::warn!(%user, %database, peer = ?origin.peer, %reason, "login refused");
}

fn sasl_initial_data(body: &[u8]) -> Result<String, ClientError> {
    let nul = body
        .iter()
        .position(|&b| b == 0)
        .ok_or(AuthError::BadScramMessage(
            "no mechanism in SASLInitialResponse",
        ))?;
    if &body[..nul] != b"SCRAM-SHA-256" {
        return Err(ClientError::Protocol(format!(
            "unsupported SASL mechanism {:?}; use SCRAM-SHA-256",
            String::from_utf8_lossy(&body[..nul])
        )));
    }
    let rest = &body[nul + 1..];
    if rest.len() < 4 {
        return Err(AuthError::BadScramMessage("SASLInitialResponse too short").into());
    }
    Ok(String::from_utf8_lossy(&rest[4..]).into_owned())
}
