//! One client session after login: reads client messages, groups them into flights (a simple
//! Query, or extended-protocol messages up to Sync/Flush), answers the proxy's own commands, and
//! hands flights to `flight.rs`, which routes them to a backend and relays the replies. It owns
//! the client's state that must survive backend changes: settings, prepared statements, the route
//! hint, the transaction status the client has seen.

use std::collections::HashMap;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use super::causal::ClientFloors;
use super::flight::{Attached, Substitute};
use super::{CancelSlot, Proxy};
use crate::backend::Target;
use crate::causal::Floor;
use crate::net::backend::build;
use crate::net::{ErrorFields, Frame, FrontendMessage, ProtocolError, decode_frame, whole_frame};
use crate::statement::{
    Class, Hints, LocalCommand, RouteHint, comment_hints, local_command, setting_reset,
};

/// A client connection: plain TCP or TLS over it.
pub trait ClientSocket: AsyncRead + AsyncWrite + Unpin + Send {
    /// Writes what the socket takes right now without waiting (plain TCP); `WouldBlock` when it
    /// cannot say without the async path (TLS).
    fn write_now(&self, _buf: &[u8]) -> std::io::Result<usize> {
        Err(std::io::ErrorKind::WouldBlock.into())
    }

    /// Reads what is there into `buf`'s spare room, once there is something; 0 at the end.
    fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
    ) -> Poll<std::io::Result<usize>> {
        crate::net::room_to_read(buf); // a read into no room would look like the end
        let mut read = tokio::io::ReadBuf::uninit(buf.spare_capacity_mut());
        ready!(std::pin::Pin::new(&mut *self).poll_read(cx, &mut read))?;
        let n = read.filled().len();
        // SAFETY: poll_read initialised the first `n` bytes of the spare room.
        unsafe { buf.set_len(buf.len() + n) };
        Poll::Ready(Ok(n))
    }
}

impl ClientSocket for tokio::net::TcpStream {
    fn write_now(&self, buf: &[u8]) -> std::io::Result<usize> {
        crate::socket::try_send(self, buf)
    }

    fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
    ) -> Poll<std::io::Result<usize>> {
        crate::socket::poll_recv(self, cx, buf)
    }
}

impl<S: ClientSocket> ClientSocket for tokio_rustls::server::TlsStream<S> {}

impl ClientSocket for Box<dyn ClientSocket> {
    fn write_now(&self, buf: &[u8]) -> std::io::Result<usize> {
        (**self).write_now(buf)
    }

    fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
    ) -> Poll<std::io::Result<usize>> {
        (**self).poll_recv(cx, buf)
    }
}

/// The client's socket with its read and write buffers.
pub struct ClientIo {
    stream: Box<dyn ClientSocket>,
    read_buf: BytesMut,
    write_buf: BytesMut,
    max_len: usize,
}

impl std::fmt::Debug for ClientIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientIo")
            .field("buffered", &self.read_buf.len())
            .finish_non_exhaustive()
    }
}

impl ClientIo {
    /// Wraps an accepted socket; `read_buf` holds bytes already read during startup.
    pub fn new(stream: Box<dyn ClientSocket>, read_buf: BytesMut, max_len: usize) -> ClientIo {
        ClientIo {
            stream,
            read_buf,
            write_buf: BytesMut::with_capacity(16 * 1024),
            max_len,
        }
    }

    /// The next message, `None` when the client closed the connection. Cancel-safe.
    pub async fn recv(&mut self) -> Result<Option<Frame>, anyhow::Error> {
        Ok(match self.incoming().await? {
            Some(Incoming::Query(_)) => Some(self.take_buffered()),
            Some(Incoming::Frame(frame)) => Some(frame),
            None => None,
        })
    }

    /// What the client sent next, `None` when it closed the connection. A simple Query stays in
    /// the read buffer (see [`Incoming::Query`]). Cancel-safe.
    // A plain poll_fn, not an async fn: no state machine of its own around the read loop, which
    // runs for every message (about 50 instructions per statement under callgrind).
    pub fn incoming(
        &mut self,
    ) -> impl Future<Output = Result<Option<Incoming>, anyhow::Error>> + Send + '_ {
        std::future::poll_fn(move |cx| self.poll_next(cx))
    }

    /// [`ClientIo::incoming`] as a poll.
    pub fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Incoming>, anyhow::Error>> {
        loop {
            if let Some(len) = whole_frame(&mut self.read_buf, self.max_len)? {
                if self.read_buf[0] == b'Q' {
                    return Poll::Ready(Ok(Some(Incoming::Query(len))));
                }
                let frame = decode_frame(&mut self.read_buf, self.max_len)?;
                return Poll::Ready(Ok(Some(Incoming::Frame(frame.expect("a whole frame")))));
            }
            if ready!(self.stream.poll_recv(cx, &mut self.read_buf))? == 0 {
                return Poll::Ready(Ok(None));
            }
        }
    }

    /// Takes the whole message at the front of the read buffer (after [`Incoming::Query`]).
    fn take_buffered(&mut self) -> Frame {
        decode_frame(&mut self.read_buf, usize::MAX)
            .ok()
            .flatten()
            .expect("a whole message is buffered")
    }

    /// Buffers a frame for the client.
    pub fn queue(&mut self, frame: &Frame) {
        frame.encode(&mut self.write_buf);
    }

    /// Buffers a ReadyForQuery with transaction status `status` (written as bytes: one ends
    /// every transaction).
    pub fn queue_ready(&mut self, status: u8) {
        self.write_buf
            .extend_from_slice(&[b'Z', 0, 0, 0, 5, status]);
    }

    /// The write buffer, for bytes relayed as they are.
    pub fn out(&mut self) -> &mut BytesMut {
        &mut self.write_buf
    }

    /// Bytes queued and not yet written.
    pub fn queued(&self) -> usize {
        self.write_buf.len()
    }

    /// Writes everything queued.
    pub async fn flush(&mut self) -> std::io::Result<()> {
        if self.write_buf.is_empty() {
            return Ok(());
        }
        // A reply nearly always fits the socket buffer: one non-blocking write, no future.
        let written = match self.stream.write_now(&self.write_buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
            Err(e) => return Err(e),
        };
        if written < self.write_buf.len() {
            self.stream.write_all(&self.write_buf[written..]).await?;
        }
        self.write_buf.clear();
        Ok(())
    }
}

/// A client message, as `ClientIo::incoming` found it.
#[derive(Debug)]
pub enum Incoming {
    /// A whole simple Query of this many bytes (tag and length included) at the front of the
    /// read buffer, not taken out yet: the pass-through sends it on from there.
    Query(usize),
    /// Any other message, taken out.
    Frame(Frame),
}

/// A prepared statement as the client defined it.
#[derive(Debug, Clone)]
pub struct ClientStatement {
    /// The SQL text (hint comment removed).
    pub query: String,
    /// Parameter type OIDs from Parse.
    pub param_types: Vec<u32>,
    /// Classification of the text.
    pub class: Class,
    /// A route hint found in the text.
    pub hint: Option<RouteHint>,
    /// A floor from a `lsngate_min_lsn` comment.
    pub floor: Option<Floor>,
    /// Why the comment's floor was refused (the statement then fails without running).
    pub hint_error: Option<String>,
    /// The text is a proxy command (`SET lsngate.…`), answered by the proxy.
    pub local: Option<LocalCommand>,
    /// The result columns a Describe showed the client (see `shapes.rs`).
    pub shape: Option<super::shapes::Shape>,
    /// The columns changed since: its Binds fail as PostgreSQL's would (`0A000`).
    pub plan_changed: bool,
    /// The client's text was `RESET name` of a startup setting, and `query` is the `SET` of its
    /// startup value (see `Session::reset_sent_as_set`): its CommandComplete says `RESET`.
    pub reset_as_set: bool,
    /// [`ClientStatement::identity`], computed once.
    identity: String,
}

impl ClientStatement {
    /// The identity a backend's copy must match to be reused: parameter types and text, as
    /// `flight.rs` records what each server connection holds.
    pub fn identity(&self) -> &str {
        &self.identity
    }
}

/// The identity of a statement parsed with `param_types` and `query`.
pub fn statement_identity(param_types: &[u32], query: &str) -> String {
    format!("{param_types:?}|{query}")
}

/// How long a session that ended waits for replies still due before it gives up its server
/// connection instead of returning it to the pool.
const FINISH_DRAIN: std::time::Duration = std::time::Duration::from_secs(1);

/// Startup parameters that are connection metadata, not settings to apply with SET.
const NOT_SETTINGS: &[&str] = &["user", "database", "options", "replication"];

/// A logged-in client.
#[derive(Debug)]
pub struct Session {
    pub(super) proxy: Arc<Proxy>,
    /// Config snapshot, refreshed at every flight so a reload applies from the next statement.
    pub(super) config: Arc<crate::config::Config>,
    /// The config version `config` is.
    config_seen: u64,
    /// This session's recent statement classifications.
    pub(super) class_memo: crate::statement::ClassMemo,
    /// The pools this session used, by node index (saves the per-node pool lookup per flight).
    pub(super) pools: Vec<(usize, Arc<crate::backend::Pool>)>,
    pub(super) io: ClientIo,
    /// The client's login name.
    user: String,
    /// The role its statements run as, when its [[users]] entry names one (else the node URLs').
    pub(super) server_login: Option<crate::config::ServerLogin>,
    pub(super) database: String,
    /// Settings to apply on every backend: name → SQL value text.
    pub(super) settings: crate::backend::Settings,
    pub(super) statements: HashMap<String, ClientStatement>,
    /// The last unnamed Parse, for Binds to "".
    pub(super) unnamed: Option<ClientStatement>,
    pub(super) hint: RouteHint,
    pub(super) backend: Option<Attached>,
    /// The reply queue of the last backend let go, kept for the next one (no allocation per
    /// transaction).
    pub(super) spare_expect: std::collections::VecDeque<super::flight::Owner>,
    /// Transaction status from the last ReadyForQuery the client got.
    pub(super) status: u8,
    /// Stay on one backend (session pooling, LISTEN).
    pub(super) pinned: bool,
    /// A change of settings may have been undone (see `Session::note_session_effects`): the
    /// server's settings are read back when the transaction ends.
    pub(super) settings_in_doubt: bool,
    pub(super) pending: Vec<FrontendMessage>,
    pub(super) cancel_slot: CancelSlot,
    /// Consistency mode and floors.
    pub(super) floors: ClientFloors,
    /// Portals bound to proxy commands, by name.
    pub(super) local_portals: HashMap<String, LocalCommand>,
    /// Statement names the client deallocated, to close on the server connections it uses
    /// next (see `deallocate.rs`).
    pub(super) closing: std::collections::VecDeque<String>,
    /// Some statement of the client's was marked changed (see `shapes.rs`).
    pub(super) plans_changed: bool,
    /// How the pending messages changed `statements` and `unnamed` (see `pipeline.rs`).
    pub(super) log: super::pipeline::FlightLog,
    /// The settings of the client's startup packet: what `RESET name` returns to.
    pub(super) startup_settings: crate::backend::Settings,
    /// Their values as the client gave them.
    startup_values: HashMap<String, String>,
    /// Portals bound to a statement that is [`ClientStatement::reset_as_set`], by name.
    pub(super) reset_portals: std::collections::HashSet<String>,
    /// The flight about to be sent runs `RESET ALL` or `DISCARD ALL`: the startup settings are
    /// applied again right behind it (see `Session::note_session_effect`).
    pub(super) restore_due: bool,
    /// Some statement was [`ClientStatement::reset_as_set`] (the flights' Executes are then
    /// checked for one).
    pub(super) resets_parsed: bool,
    /// The flight about to be sent is a `RESET` rewritten to the startup value, and the tag its
    /// answer is relayed with (see `Session::reset_to_startup`).
    pub(super) reset_rewritten: Option<&'static str>,
    /// The proxy answered an error for extended messages the client has not sent a Sync for:
    /// it ignores the client's messages up to that Sync (see `answer_flight_error`).
    pub(super) skip_to_sync: bool,
    /// The ParameterStatus values the client was told, at login and since (see
    /// `Session::report_changes`).
    pub(super) reported: HashMap<String, String>,
    shutdown: watch::Receiver<bool>,
}

/// A string literal that reads the same whatever `standard_conforming_strings` is.
fn quote_literal(value: &str) -> String {
    let quoted = value.replace('\'', "''");
    if value.contains('\\') {
        format!("E'{}'", quoted.replace('\\', "\\\\"))
    } else {
        format!("'{quoted}'")
    }
}

/// The statement that gives a setting a value as text: `set_config` parses it as the server
/// parses startup parameters and `pg_settings` values (`search_path=a,b` is two schemas; `SET
/// name = 'a,b'` would be one).
pub(super) fn set_config_statement(name: &str, value: &str) -> String {
    format!(
        "SELECT pg_catalog.set_config({}, {}, false)",
        quote_literal(name),
        quote_literal(value)
    )
}

fn is_setting_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

/// The words of a startup `options` string, split as the server splits them: on whitespace,
/// with a backslash taking the next character literally (`a\ b` is the one word `a b`).
fn option_words(options: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut chars = options.chars().peekable();
    loop {
        while chars.next_if(char::is_ascii_whitespace).is_some() {}
        if chars.peek().is_none() {
            return words;
        }
        let mut word = String::new();
        while let Some(c) = chars.next_if(|c| !c.is_ascii_whitespace()) {
            word.push(if c == '\\' {
                chars.next().unwrap_or(c)
            } else {
                c
            });
        }
        words.push(word);
    }
}

/// The `name=value` pairs of a startup `options` string (`-c name=value`, `-cname=value`,
/// `--name=value`).
fn option_pairs(options: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut words = option_words(options).into_iter();
    while let Some(word) = words.next() {
        let pair = if word == "-c" {
            words.next()
        } else {
            word.strip_prefix("--")
                .or(word.strip_prefix("-c"))
                .map(str::to_string)
        };
        if let Some((k, v)) = pair.as_deref().and_then(|p| p.split_once('=')) {
            pairs.push((k.to_string(), v.to_string()));
        }
    }
    pairs
}

/// `-c lsngate.name=value` pairs in the startup `options`: the proxy's own settings.
fn startup_lsngate(params: &[(String, String)]) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for (name, value) in params {
        if name == "options" {
            for (k, v) in option_pairs(value) {
                if let Some(k) = k.to_ascii_lowercase().strip_prefix("lsngate.") {
                    found.push((k.replace('-', "_"), v.clone()));
                }
            }
        } else if let Some(k) = name.to_ascii_lowercase().strip_prefix("lsngate.") {
            found.push((k.to_string(), value.clone()));
        }
    }
    found
}

/// Settings from the startup packet, including `-c name=value` in `options`: (name, value),
/// a later one of a name winning.
fn startup_values(params: &[(String, String)]) -> HashMap<String, String> {
    let mut values = HashMap::new();
    for (name, value) in params {
        if name == "options" {
            for (k, v) in option_pairs(value) {
                if is_setting_name(&k) && !k.to_ascii_lowercase().starts_with("lsngate.") {
                    values.insert(k.to_ascii_lowercase().replace('-', "_"), v);
                }
            }
        } else if !NOT_SETTINGS.contains(&name.as_str())
            && is_setting_name(name)
            && !name.starts_with("_pq_.")
            && !name.to_ascii_lowercase().starts_with("lsngate.")
        {
            values.insert(name.to_ascii_lowercase(), value.clone());
        }
    }
    values
}

/// Settings from the startup packet, applied with `set_config`.
fn startup_settings(params: &[(String, String)]) -> crate::backend::Settings {
    startup_values(params)
        .into_iter()
        .map(|(name, value)| {
            let statement = set_config_statement(&name, &value);
            (name, statement)
        })
        .collect()
}

/// Settings whose `SET name = 'text'` does not mean what the same text means at startup: for
/// these list settings (`GUC_LIST_QUOTE`) SET quotes a string as one element, where the server
/// splits a startup value into a list.
const LIST_QUOTED: &[&str] = &[
    "search_path",
    "temp_tablespaces",
    "session_preload_libraries",
    "local_preload_libraries",
];

impl Session {
    /// Finishes login: reports server parameters and the cancel key, then ReadyForQuery.
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        proxy: Arc<Proxy>,
        mut io: ClientIo,
        user: String,
        database: String,
        params: Vec<(String, String)>,
        cancel_key: (i32, i32),
        cancel_slot: CancelSlot,
        shutdown: watch::Receiver<bool>,
    ) -> anyhow::Result<Session> {
        let mut config_seen = u64::MAX;
        let config = proxy
            .config_if_changed(&mut config_seen)
            .expect("no version is u64::MAX");
        let settings = startup_settings(&params);
        let startup = settings.clone();
        let startup_values = startup_values(&params);
        let mut floors = ClientFloors {
            mode: config.causal.consistency,
            ..ClientFloors::default()
        };
        let mut hint = RouteHint::Auto;
        for (name, value) in startup_lsngate(&params) {
            if let Err((code, message)) =
                super::commands::apply(&mut floors, &mut hint, &config, &name, Some(&value))
            {
                io.queue(&super::listener::fatal(
                    code,
                    &format!("in the startup options: {message}"),
                ));
                io.flush().await?;
                anyhow::bail!(message);
            }
        }
        let server_login = config.user(&user).and_then(|u| u.server_login.clone());
        let server_params = match proxy.server_params(&database, server_login.as_ref()).await {
            Ok(p) => p,
            Err(e) => {
                io.queue(&super::listener::fatal("08006", &e.to_string()));
                io.flush().await?;
                return Err(e);
            }
        };
        let mut reported = HashMap::new();
        for (name, value) in &server_params {
            let client_value = params
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str());
            let value = client_value.unwrap_or(value);
            io.queue(&build::parameter_status(name, value));
            reported.insert(name.clone(), value.to_string());
        }
        io.queue(&build::backend_key_data(cancel_key.0, cancel_key.1));
        io.queue_ready(b'I');
        io.flush().await?;
        tracing::debug!(%user, %database, role = ?server_login.as_ref().map(|l| &l.user), "client logged in");
        Ok(Session {
            config: Arc::clone(&config),
            config_seen,
            pools: Vec::new(),
            class_memo: Default::default(),
            spare_expect: std::collections::VecDeque::with_capacity(4),
            pinned: config.pool_mode == crate::config::PoolMode::Session,
            proxy,
            io,
            user,
            server_login,
            database,
            settings,
            statements: HashMap::new(),
            unnamed: None,
            hint,
            backend: None,
            status: b'I',
            pending: Vec::new(),
            settings_in_doubt: false,
            cancel_slot,
            floors,
            local_portals: HashMap::new(),
            closing: std::collections::VecDeque::new(),
            plans_changed: false,
            log: Default::default(),
            startup_settings: startup,
            startup_values,
            reset_portals: Default::default(),
            restore_due: false,
            resets_parsed: false,
            reset_rewritten: None,
            skip_to_sync: false,
            reported,
            shutdown,
        })
    }

    /// A session as `start` leaves it for a client that gave no startup settings, without the
    /// login (no server is asked for its parameters, nothing is sent to the client): for unit
    /// tests that drive the session in-process.
    #[cfg(test)]
    pub(super) fn in_memory(proxy: Arc<Proxy>, io: ClientIo) -> Session {
        let mut config_seen = u64::MAX;
        let config = proxy
            .config_if_changed(&mut config_seen)
            .expect("no version is u64::MAX");
        Session {
            floors: ClientFloors {
                mode: config.causal.consistency,
                ..ClientFloors::default()
            },
            pinned: config.pool_mode == crate::config::PoolMode::Session,
            config,
            config_seen,
            pools: Vec::new(),
            class_memo: Default::default(),
            spare_expect: std::collections::VecDeque::with_capacity(4),
            proxy,
            io,
            user: "app".into(),
            server_login: None,
            database: "app".into(),
            settings: Default::default(),
            statements: HashMap::new(),
            unnamed: None,
            hint: RouteHint::Auto,
            backend: None,
            status: b'I',
            pending: Vec::new(),
            settings_in_doubt: false,
            cancel_slot: Default::default(),
            local_portals: HashMap::new(),
            closing: std::collections::VecDeque::new(),
            plans_changed: false,
            log: Default::default(),
            startup_settings: Default::default(),
            startup_values: HashMap::new(),
            reset_portals: Default::default(),
            restore_due: false,
            resets_parsed: false,
            reset_rewritten: None,
            skip_to_sync: false,
            reported: HashMap::new(),
            shutdown: watch::channel(false).1,
        }
    }

    /// Takes up a reloaded config, once per reload (checked at every statement).
    fn refresh_config(&mut self) {
        if let Some(config) = self.proxy.config_if_changed(&mut self.config_seen) {
            // A user the reload removed keeps the role it had; a changed role takes effect at
            // the next checkout, from pools of its own.
            if let Some(user) = config.user(&self.user) {
                self.server_login = user.server_login.clone();
            }
            self.pools.clear();
            self.config = config;
            self.class_memo.clear();
        }
    }

    /// The session loop: until the client leaves, breaks the protocol or the proxy drains.
    pub async fn run(mut self) -> anyhow::Result<()> {
        let result = self.run_loop().await;
        self.finish().await;
        result
    }

    async fn run_loop(&mut self) -> anyhow::Result<()> {
        enum Event {
            Client(anyhow::Result<Option<Incoming>>),
            Backend(Result<(), crate::backend::BackendError>),
            Shutdown,
        }
        // Armed once, and polled only when it was woken: the drain signal must not cost on
        // every message.
        let mut shutdown = self.shutdown.clone();
        let mut shutdown_changed = std::pin::pin!(super::woken::WhenWoken::new(async move {
            let _ = shutdown.changed().await;
        }));
        let mut shutdown_seen = false;
        // Read once here and again when the signal fires (the watch's lock costs on every turn).
        let mut draining = *self.shutdown.borrow();
        loop {
            let listening = self
                .backend
                .as_ref()
                .is_some_and(|b| b.awaiting_replies() || self.pinned);
            if draining
                && self.status == b'I'
                && !self.backend.as_ref().is_some_and(|b| b.awaiting_replies())
            {
                self.io.queue(&super::listener::fatal(
                    "57P01",
                    "lsngate proxy is shutting down; reconnect",
                ));
                self.io.flush().await?;
                return Ok(());
            }
            // Biased: in this order, with no random start (no random number per wake-up).
            let event = tokio::select! {
                biased;
                filled = async { super::replies::fill_attached(self.backend.as_mut().expect("listening implies attached")).await }, if listening => Event::Backend(filled),
                incoming = self.io.incoming() => Event::Client(incoming),
                _ = &mut shutdown_changed, if !draining && !shutdown_seen => Event::Shutdown,
            };
            match event {
                Event::Backend(Ok(())) => self.on_buffered_replies().await?,
                Event::Backend(Err(e)) => self.on_backend(Err(e)).await?,
                Event::Client(Ok(Some(incoming))) => {
                    if !self.on_client(incoming).await? {
                        return Ok(());
                    }
                }
                Event::Client(Ok(None)) => return Ok(()),
                Event::Client(Err(e)) => {
                    metrics::counter!("lsngate_proxy_errors_total", "kind" => "protocol")
                        .increment(1);
                    if e.downcast_ref::<ProtocolError>().is_some() {
                        self.io
                            .queue(&super::listener::fatal("08P01", &e.to_string()));
                        let _ = self.io.flush().await;
                    }
                    return Err(e);
                }
                Event::Shutdown => {
                    shutdown_seen = true;
                    draining = *self.shutdown.borrow();
                }
            }
        }
    }

    /// Handles one client message; false when the client said Terminate.
    async fn on_client(&mut self, incoming: Incoming) -> anyhow::Result<bool> {
        let frame = match incoming {
            Incoming::Query(len) => {
                self.refresh_config();
                if self.pending.is_empty() && !self.backend.as_ref().is_some_and(|b| b.open) {
                    // PostgreSQL drops the unnamed statement at every simple Query it runs; one
                    // behind unsynced messages may be skipped (after an error there), and
                    // `query_after_unsynced` decides.
                    self.unnamed = None;
                }
                // Lent out of the buffer for the call: the pass-through sends the message
                // straight from it, and nothing else reads the client meanwhile.
                let buffered = std::mem::take(&mut self.io.read_buf);
                let passed = self.pass_through(&buffered[..len]).await;
                self.io.read_buf = buffered;
                if passed? {
                    self.io.read_buf.advance(len);
                    return Ok(true);
                }
                self.io.take_buffered()
            }
            Incoming::Frame(frame) => {
                if frame.tag == b'P' {
                    self.refresh_config();
                }
                frame
            }
        };
        tracing::trace!(tag = %(frame.tag as char), len = frame.body.len(), "client →");
        let message = match FrontendMessage::parse(&frame) {
            Ok(m) => m,
            Err(e) => {
                metrics::counter!("lsngate_proxy_errors_total", "kind" => "protocol").increment(1);
                self.io
                    .queue(&super::listener::fatal("08P01", &e.to_string()));
                let _ = self.io.flush().await;
                return Err(e.into());
            }
        };
        if self.skip_to_sync && !matches!(message, FrontendMessage::Terminate) {
            // Behind an error the proxy answered for a batch the client has not synced, as the
            // server would after its own error: everything up to the Sync is ignored.
            if matches!(message, FrontendMessage::Sync) {
                self.skip_to_sync = false;
                if self.backend.as_ref().is_some_and(|b| b.open) {
                    // The server holds earlier messages of the batch: its Sync ends them.
                    self.extended_flight(vec![FrontendMessage::Sync], None)
                        .await?;
                } else {
                    self.io.queue_ready(self.status);
                    self.io.flush().await?;
                }
            }
            return Ok(true);
        }
        match message {
            FrontendMessage::Query(sql) => {
                if !self.query_after_unsynced(&sql).await? {
                    self.unnamed = None;
                    self.simple_query(sql).await?
                }
            }
            FrontendMessage::Parse {
                statement,
                query,
                param_types,
            } => {
                let (hints, query) = comment_hints(&query).unwrap_or((Hints::default(), query));
                let (floor, hint_error) = self.hinted_floor(&hints);
                let local = local_command(&query);
                let class = self.class_memo.classify(
                    &self.proxy.classes,
                    &query,
                    &self.config.write_functions,
                );
                let sent_as_set = self.reset_sent_as_set(&query).filter(|_| local.is_none());
                let (query, reset_as_set) = sent_as_set.unwrap_or((query, false));
                self.resets_parsed |= reset_as_set;
                let defined = ClientStatement {
                    identity: statement_identity(&param_types, &query),
                    query: query.clone(),
                    param_types: param_types.clone(),
                    class,
                    hint: hints.route,
                    floor,
                    hint_error,
                    local,
                    shape: None,
                    plan_changed: false,
                    reset_as_set,
                };
                let held = if statement.is_empty() {
                    self.unnamed.as_ref()
                } else {
                    self.statements.get(&statement)
                };
                self.log.touch(&statement, held);
                self.log.parsed.push((statement.clone(), defined.clone()));
                if statement.is_empty() {
                    self.unnamed = Some(defined);
                } else if !self.statements.contains_key(&statement) {
                    // PostgreSQL refuses to parse a name that exists (42P05) and keeps the old
                    // statement: so does the client's view. Whether the name exists at this
                    // Parse's position in the pipeline is `pipeline.rs`'s to say.
                    self.closing.retain(|n| n != &statement);
                    self.statements.insert(statement.clone(), defined);
                }
                self.pending.push(FrontendMessage::Parse {
                    statement,
                    query,
                    param_types,
                });
            }
            FrontendMessage::Close { kind: b'S', name } => {
                if !name.is_empty() {
                    self.log.touch(&name, self.statements.get(&name));
                    self.statements.remove(&name);
                }
                self.pending
                    .push(FrontendMessage::Close { kind: b'S', name });
            }
            m @ (FrontendMessage::Bind { .. }
            | FrontendMessage::Describe { .. }
            | FrontendMessage::Execute { .. }
            | FrontendMessage::Close { .. }) => self.pending.push(m),
            m @ (FrontendMessage::Sync | FrontendMessage::Flush) => {
                self.pending.push(m);
                let flight = std::mem::take(&mut self.pending);
                self.extended_flight(flight, None).await?;
            }
            m @ (FrontendMessage::CopyData(_)
            | FrontendMessage::CopyDone
            | FrontendMessage::CopyFail(_)) => self.copy_from_client(m).await?,
            FrontendMessage::FunctionCall(body) => {
                self.dispatch(
                    vec![FrontendMessage::FunctionCall(body)],
                    Some(Class::Write),
                    None,
                    None,
                )
                .await?
            }
            FrontendMessage::Terminate => return Ok(false),
            FrontendMessage::AuthResponse(_) => {
                let e = ProtocolError::Malformed {
                    tag: 'p',
                    why: "password message after authentication",
                };
                self.io
                    .queue(&super::listener::fatal("08P01", &e.to_string()));
                let _ = self.io.flush().await;
                return Err(e.into());
            }
        }
        Ok(true)
    }

    /// Before a simple Query: extended-protocol messages still waiting for their Sync are sent
    /// (with a Flush) on the backend the Query will use, and the server's answers to everything
    /// unsynced are relayed first, so the client gets its answers in the order it sent its
    /// messages (pgjdbc's autosave sends `Parse/Bind/Execute BEGIN`, `Query SAVEPOINT`, then a
    /// statement and Sync, in one write). True when the server skips the Query: one of those
    /// messages failed, and until the next Sync the server ignores everything, so no answer is
    /// due.
    async fn query_after_unsynced(&mut self, sql: &str) -> anyhow::Result<bool> {
        if !self.pending.is_empty() {
            // The Query runs where these go: they are routed as demandingly as it needs.
            let query = comment_hints(sql).map_or_else(|| sql.to_string(), |(_, s)| s);
            let class = local_command(&query).is_none().then(|| {
                self.class_memo
                    .classify(&self.proxy.classes, &query, &self.config.write_functions)
            });
            self.pending.push(FrontendMessage::Flush);
            let flight = std::mem::take(&mut self.pending);
            self.extended_flight(flight, class).await?;
        }
        if !self.backend.as_ref().is_some_and(|b| b.open) {
            return Ok(false);
        }
        self.settle_unsynced().await
    }

    /// A floor from a statement's `lsngate_min_lsn` comment, or why it was refused.
    fn hinted_floor(&self, hints: &Hints) -> (Option<Floor>, Option<String>) {
        match hints
            .min_lsn
            .as_deref()
            .map(|v| self.config.causal.parse_floor(v))
        {
            Some(Ok(floor)) => (Some(floor), None),
            Some(Err(e)) => (None, Some(format!("{e} (in the lsngate_min_lsn comment)"))),
            None => (None, None),
        }
    }

    /// Per message, the statement it prepares, binds or describes as of its position in the
    /// flight (`None` for other messages and for names the client does not hold there).
    pub(super) fn statement_per_message<'a>(
        &'a self,
        flight: &[FrontendMessage],
    ) -> Vec<Option<&'a ClientStatement>> {
        let (at, _) = super::pipeline::statements_at(
            &self.statements,
            self.unnamed.as_ref(),
            &self.log,
            flight,
        );
        at.into_iter().map(super::pipeline::At::statement).collect()
    }

    /// The statements an extended-protocol flight prepares, binds or describes; `None` for a
    /// name the session does not know.
    fn flight_statements<'a>(
        &'a self,
        flight: &[FrontendMessage],
    ) -> Vec<Option<&'a ClientStatement>> {
        flight
            .iter()
            .zip(self.statement_per_message(flight))
            .filter(|(m, _)| {
                matches!(
                    m,
                    FrontendMessage::Parse { .. }
                        | FrontendMessage::Bind { .. }
                        | FrontendMessage::Describe { kind: b'S', .. }
                )
            })
            .map(|(_, s)| s)
            .collect()
    }

    /// An extended-protocol flight up to Sync or Flush: answered by the proxy (its commands, a
    /// refused floor) or routed by the most demanding class among its statements.
    /// `also`: the class of a simple Query that will follow on the same backend.
    pub(super) async fn extended_flight(
        &mut self,
        flight: Vec<FrontendMessage>,
        also: Option<Class>,
    ) -> anyhow::Result<()> {
        let result = self.extended_flight_sent(flight, also).await;
        // The pending messages are a flight of their own now: the next ones start afresh.
        self.log = Default::default();
        result
    }

    async fn extended_flight_sent(
        &mut self,
        mut flight: Vec<FrontendMessage>,
        also: Option<Class>,
    ) -> anyhow::Result<()> {
        fn named(m: &FrontendMessage) -> Option<&str> {
            match m {
                FrontendMessage::Parse { statement, .. }
                | FrontendMessage::Bind { statement, .. }
                | FrontendMessage::Describe {
                    kind: b'S',
                    name: statement,
                }
                | FrontendMessage::Close {
                    kind: b'S',
                    name: statement,
                } if !statement.is_empty() => Some(statement.as_str()),
                _ => None,
            }
        }
        if self.backend.as_ref().is_some_and(|b| {
            b.unconfirmed.iter().any(|u| {
                u.answer == b'C'
                    || u.effects
                        .iter()
                        .any(|e| flight.iter().filter_map(named).any(|n| n == e.name))
            })
        }) {
            // A DEALLOCATE ALL sent before is not answered yet, or a Parse or Close of a name
            // this flight uses: whether the client and the connection still hold the statements
            // (the server skips them after an error) decides where this flight goes and what it
            // needs in front (an earlier client's statement under the name, closed first), so
            // their answers come first. Where the server skipped them, the client's view is
            // replayed over the messages not sent yet (`undo_unconfirmed`): this flight's, put
            // back among the pending ones while the answers come.
            debug_assert!(self.pending.is_empty());
            self.pending = flight;
            let drained = self.drain().await;
            flight = std::mem::take(&mut self.pending);
            drained?;
        }
        let used = self.flight_statements(&flight);
        // Portals bound in this flight are what their statement is; others what they were.
        let mut bound: HashMap<&str, bool> = HashMap::new();
        let mut portals_local = false;
        for (m, s) in flight.iter().zip(self.statement_per_message(&flight)) {
            match m {
                FrontendMessage::Bind { portal, .. } => {
                    bound.insert(portal.as_str(), s.is_some_and(|s| s.local.is_some()));
                }
                FrontendMessage::Execute { portal, .. }
                | FrontendMessage::Describe {
                    kind: b'P',
                    name: portal,
                } => {
                    portals_local |= bound
                        .get(portal.as_str())
                        .copied()
                        .unwrap_or_else(|| self.local_portals.contains_key(portal.as_str()));
                }
                _ => {}
            }
        }
        let local = used.iter().flatten().filter(|s| s.local.is_some()).count();
        if local > 0 || portals_local {
            if local == used.len() {
                return self.answer_extended_locally(flight).await;
            }
            self.drain().await?;
            let message = "lsngate commands (SET/SHOW/RESET lsngate.*) cannot share a pipeline with SQL statements; send them with their own Sync";
            return self.answer_flight_error(&flight, "0A000", message).await;
        }
        if let Some(error) = used.iter().flatten().find_map(|s| s.hint_error.clone()) {
            self.drain().await?;
            return self.answer_flight_error(&flight, "22023", &error).await;
        }
        let mut class: Option<Class> = None;
        let mut hint = None;
        let mut floor = None;
        let mut unknown = false;
        for s in &used {
            let Some(s) = s else {
                unknown = true;
                continue;
            };
            hint = hint.or(s.hint);
            floor = Floor::merge(floor, s.floor);
            class = Some(match (class, s.class) {
                (None, c) => c,
                (Some(Class::Read), Class::Read) => Class::Read,
                (Some(a), b) if a == b => a,
                _ => Class::Write,
            });
        }
        if unknown {
            class = Some(Class::Write);
        }
        if let Some(also) = also {
            class = Some(match class {
                None => also,
                Some(c) if c == also => c,
                Some(_) => Class::Write,
            });
        }
        self.local_portals.clear();
        self.dispatch(flight, class, hint, floor).await
    }

    async fn simple_query(&mut self, sql: String) -> anyhow::Result<()> {
        let (hints, sql) = comment_hints(&sql).unwrap_or((Hints::default(), sql));
        if let Some(command) = local_command(&sql) {
            return self.answer_locally(command).await;
        }
        if crate::statement::mentions_lsngate_setting(&sql) {
            let message = format!(
                "cannot parse {:?} as a proxy command; use SET lsngate.<name> = 'value', RESET lsngate.<name> or SHOW lsngate.<name>",
                sql.trim()
            );
            return self.answer_error("42601", &message).await;
        }
        let (floor, error) = self.hinted_floor(&hints);
        if let Some(error) = error {
            return self.answer_error("22023", &error).await;
        }
        if let Some(what) = super::deallocate::parse(&sql)
            && self.deallocate(&what).await?
        {
            return Ok(());
        }
        let class =
            self.class_memo
                .classify(&self.proxy.classes, &sql, &self.config.write_functions);
        let sql = self.reset_to_startup(sql);
        if self.reset_rewritten.is_some() {
            // Its answer is told apart by being the only one due (see `reset_to_startup`).
            self.drain().await?;
        }
        self.dispatch(
            vec![FrontendMessage::Query(sql)],
            Some(class),
            hints.route,
            floor,
        )
        .await
    }

    /// `RESET name` (or `SET name TO DEFAULT`) of a setting the client's startup packet gave: on
    /// a direct connection it returns to that value, but on a pooled server connection the server
    /// would return to its own login's. So the statement sent is the startup value's
    /// `set_config`, and its answer is relayed as the original's (`replies.rs`: row and
    /// description dropped, the original's tag).
    fn reset_to_startup(&mut self, sql: String) -> String {
        let Some((name, tag)) = setting_reset(&sql) else {
            return sql;
        };
        match self.startup_settings.get(&name) {
            Some(statement) if self.status != b'E' => {
                self.reset_rewritten = Some(tag);
                statement.clone()
            }
            _ => sql,
        }
    }

    /// `RESET name` (or `SET name TO DEFAULT`) of a startup setting, parsed over the extended
    /// protocol: the statement the server gets is `SET name = 'startup value'`, and whether its
    /// CommandComplete is relayed as `RESET`'s. A direct connection's RESET returns to the value
    /// the client logged in with; a pooled one's would return to its own login's (and report
    /// that). SET is a utility statement like RESET, so the server answers Describe (NoData), a
    /// row limit and a second Execute of the portal (55000) as it would for RESET; only the
    /// CommandComplete tag differs, and is relayed as `RESET` (`replies.rs`). A single quoted
    /// string means the same to SET as the startup text, except for list settings that quote
    /// their elements ([`LIST_QUOTED`]), which are sent as they are.
    fn reset_sent_as_set(&self, query: &str) -> Option<(String, bool)> {
        let (name, tag) = setting_reset(query)?;
        if LIST_QUOTED.contains(&name.as_str()) || !is_setting_name(&name) {
            return None;
        }
        let value = self.startup_values.get(&name)?;
        Some((
            format!("SET {name} = {}", quote_literal(value)),
            tag == "RESET",
        ))
    }

    /// Answers a simple Query the proxy takes over (its commands, a refused hint, a DEALLOCATE
    /// it tracks) with the error `code`, `message`.
    pub(super) async fn answer_error(&mut self, code: &str, message: &str) -> anyhow::Result<()> {
        let error = ErrorFields::new("ERROR", code, message).to_frame(b'E');
        self.answer_query(vec![error], true).await
    }

    /// Answers a simple Query the proxy takes over with `answer` (its replies up to, not
    /// including, ReadyForQuery; `failed` when they end in an error). Where the Query comes
    /// behind extended messages still unsynced on the server, the server's transaction must move
    /// as it would for the client's Query: PostgreSQL 15 commits the batch's implicit
    /// transaction at a Query, 19 keeps it open, and an error aborts it. So a stand-in Query
    /// goes there in its place (empty, or one that fails), its answer is replaced by `answer`
    /// (`replies.rs`), and the client gets the server's ReadyForQuery with the status it reports.
    /// Elsewhere the proxy answers at once, with the status the client last saw (`E` behind an
    /// error inside a transaction block, which fails the server's block too:
    /// `Session::abort_server_block`).
    ///
    /// Not on PostgreSQL 19 when an Execute outside a transaction block is among the unsynced
    /// messages and the answer is no error: 19rc1 keeps that implicit transaction open across
    /// the Query (ReadyForQuery T) and the Sync that then ends it leaves the server connection
    /// unable to start its next transaction (`XX000 StartTransactionCommand: unexpected state
    /// STARTED`), which on a pooled connection would hit whichever client comes next. There the
    /// proxy answers at once (status `I`, where a direct connection would say `T`: a documented
    /// difference). An error stand-in ends that block cleanly, so it is always sent.
    ///
    /// In an aborted block (status `E`) the stand-in is a statement the server refuses there
    /// (25P02, which the client then hears) unless the unsynced messages ended the block (an
    /// `END` over the extended protocol): the server, not the status the client last heard,
    /// judges. `installs` is what a proxy `SET` leaves in force once its answer holds.
    pub(super) async fn answer_query(
        &mut self,
        answer: Vec<Frame>,
        failed: bool,
    ) -> anyhow::Result<()> {
        self.answer_query_installing(answer, failed, None).await
    }

    /// Whether a simple Query the proxy answers itself would go to the server as a stand-in
    /// (see [`Session::answer_query`]): behind unsynced extended messages the server has not
    /// failed.
    pub(super) fn stand_in_due(&self) -> bool {
        self.backend.as_ref().is_some_and(|b| b.open && !b.skipping)
    }

    pub(super) async fn answer_query_installing(
        &mut self,
        answer: Vec<Frame>,
        failed: bool,
        installs: Option<(ClientFloors, RouteHint)>,
    ) -> anyhow::Result<()> {
        self.drain().await?;
        let status = self.status;
        let stand_in_safe = |b: &Attached| {
            failed
                || !b.conn.facts.has_wait_for()
                || status != b'I'
                || b.unsynced_executed.is_none_or(|begun| begun)
        };
        if let Some(attached) = self
            .backend
            .as_mut()
            .filter(|b| b.open && !b.skipping && stand_in_safe(b))
        {
            let stand_in = match (failed, status) {
                (true, _) => "SELECT 1/0",
                (false, b'E') => "SELECT 1",
                (false, _) => "",
            };
            // What a Query does to the server's state: the batch needs no Sync any more.
            attached.open = false;
            attached.unsynced_due = 0;
            attached.unsynced_executed = None;
            attached.substitute = Some(Substitute { answer, installs });
            attached.may_commit = true;
            let sent = attached.send_query(stand_in, super::flight::Owner::Client);
            if let Err(e) = sent.await {
                return self.backend_lost(e).await;
            }
            return Ok(());
        }
        if let Some((floors, hint)) = installs {
            (self.floors, self.hint) = (floors, hint);
        }
        if failed {
            // Inside a transaction block the error fails the block, there as on the server.
            self.abort_server_block().await?;
        }
        answer.iter().for_each(|f| self.io.queue(f));
        let status = self.status;
        self.io.queue_ready(status);
        self.io.flush().await?;
        Ok(())
    }

    /// Where a class should run, after hints.
    pub(super) fn target_for(
        &self,
        class: Option<Class>,
        hint: Option<RouteHint>,
    ) -> Option<Target> {
        match hint.unwrap_or(self.hint) {
            RouteHint::Primary => return Some(Target::Primary),
            RouteHint::Replica if class.is_some() => return Some(Target::Replica),
            _ => {}
        }
        match class? {
            Class::Read | Class::Begin { read_only: true } => Some(Target::Replica),
            Class::TransactionControl | Class::TransactionLocal => None,
            _ => Some(Target::Primary),
        }
    }

    /// Ends the session: a backend that is mid-transaction is closed (the server rolls back);
    /// a pinned one is reset with DISCARD ALL before it returns to the pool.
    async fn finish(&mut self) {
        let Some(mut attached) = self.backend.take() else {
            return;
        };
        self.cancel_slot.lock().expect("cancel slot").target = None;
        self.end_fallback();
        let mut status = self.status;
        if attached.awaiting_replies() && !attached.open && !attached.copy_in {
            // The client left with replies still due (drivers send a Close for each statement
            // they drop, often right before they disconnect): read them to their last
            // ReadyForQuery, unrelayed, so the connection can go back to the pool.
            let drained = crate::timer::timeout(FINISH_DRAIN, async {
                while !attached.expect.is_empty() {
                    let frame = attached.conn.recv().await?;
                    if frame.tag == b'Z' {
                        attached.expect.pop_front();
                        status = frame.body.first().copied().unwrap_or(b'E');
                    }
                }
                Ok::<(), crate::backend::BackendError>(())
            })
            .await;
            if !matches!(drained, Ok(Ok(()))) {
                return;
            }
        }
        if attached.awaiting_replies() || status != b'I' {
            return;
        }
        if matches!(attached.conn.run_simple("DISCARD ALL").await, Ok(None)) {
            attached.conn.prepared.clear();
            attached.conn.applied.clear();
            attached.conn.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_split_like_the_server_splits_them() {
        assert_eq!(
            option_pairs(r"-c search_path=a,b  --work-mem=8MB -capplication_name=x\ y\\z"),
            [
                ("search_path".to_string(), "a,b".to_string()),
                ("work-mem".to_string(), "8MB".to_string()),
                ("application_name".to_string(), r"x y\z".to_string()),
            ]
        );
        assert!(option_pairs("  ").is_empty());
    }

    #[test]
    fn startup_settings_are_applied_with_set_config_and_safe_literals() {
        let params = [
            ("user".to_string(), "u".to_string()),
            (
                "options".to_string(),
                "-c search_path=a,b -c lsngate.consistency=eventual".to_string(),
            ),
            ("application_name".to_string(), r"it's\here".to_string()),
        ];
        let settings = startup_settings(&params);
        assert_eq!(
            settings.get("search_path").unwrap(),
            "SELECT pg_catalog.set_config('search_path', 'a,b', false)"
        );
        assert_eq!(
            settings.get("application_name").unwrap(),
            r"SELECT pg_catalog.set_config('application_name', E'it''s\\here', false)"
        );
        assert_eq!(
            settings.len(),
            2,
            "user and lsngate.* are not settings: {settings:?}"
        );
    }
}
