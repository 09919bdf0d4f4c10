//! One client session after login: reads client messages, groups them into flights (a simple
//! Query, or extended-protocol messages up to Sync/Flush), answers the proxy's own commands, and
//! hands flights to `flight.rs`, which routes them to a backend and relays the replies. It owns
//! the client's state that must survive backend changes: settings, prepared statements, the route
//! hint, the transaction status the client has seen.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::watch;

use super::attached::{Attached, Duty, Owner};
use super::causal::ClientFloors;
use super::client_io::{ClientIo, Incoming, ReadError};
use super::client_statement::{ClientStatement, statement_identity};
use super::error::ClientError;
use super::startup::{
    LIST_QUOTED, is_setting_name, quote_literal, startup_lsngate, startup_settings, startup_values,
};
use crate::causal::Floor;
use crate::net::backend::TxStatus;
use crate::net::backend::build;
use crate::net::sqlstate;
use crate::net::{FrontendMessage, ProtocolError, same_text};
use crate::proxy::{CancelSlot, Proxy};
use crate::statement::{
    Class, Hints, LocalCommand, RouteHint, comment_hints, local_command, setting_reset,
};

/// The causal scope of a statement's `lsngate_scope` comment, or why it was refused.
fn hinted_scope(
    config: &crate::config::Config,
    hints: &Hints,
) -> (Option<lsngate_core::ScopeName>, Option<String>) {
    match hints.scope.as_deref().map(|s| config.causal.parse_scope(s)) {
        Some(Ok(scope)) => (Some(scope), None),
        Some(Err(e)) => (None, Some(format!("invalid lsngate_scope comment: {e}"))),
        None => (None, None),
    }
}

/// How long a session that ended waits for replies still due before it gives up its server
/// connection instead of returning it to the pool.
const FINISH_DRAIN: std::time::Duration = std::time::Duration::from_secs(1);

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
    /// This session's recent statement definitions.
    definitions: super::client_statement::DefinitionMemo,
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
    pub(super) statements: HashMap<String, Arc<ClientStatement>>,
    /// The last unnamed Parse, for Binds to "".
    pub(super) unnamed: Option<Arc<ClientStatement>>,
    pub(super) hint: RouteHint,
    pub(super) backend: Option<Attached>,
    /// The queues of the last backend let go, kept for the next one (no allocation per
    /// transaction).
    pub(super) spares: super::attached::Spares,
    /// Transaction status from the last ReadyForQuery the client got.
    pub(super) status: TxStatus,
    /// Stay on one backend (session pooling, LISTEN).
    pub(super) pinned: bool,
    /// A change of settings may have been undone (see `Session::note_session_effects`): the
    /// server's settings are read back when the transaction ends.
    pub(super) settings_in_doubt: bool,
    pub(super) pending: Vec<FrontendMessage>,
    pub(super) cancel_slot: CancelSlot,
    /// Consistency mode and floors.
    pub(super) floors: ClientFloors,
    /// Causal scopes: the flight's, and the writes whose commit positions will raise theirs.
    pub(super) scopes: super::scopes::ClientScopes,
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
    /// The proxy settings of the client's startup packet (`lsngate.*`, name without the
    /// prefix): what `RESET lsngate.<name>`, `RESET ALL` and `DISCARD ALL` return to.
    pub(super) startup_proxy: Vec<(String, String)>,
    /// Portals bound to a statement that is [`ClientStatement::reset_as_set`], by name.
    pub(super) reset_portals: std::collections::HashSet<String>,
    /// The flight about to be sent runs `RESET ALL` or `DISCARD ALL`: the startup settings are
    /// applied again right behind it (see `Session::note_session_effect`).
    pub(super) restore_due: bool,
    /// The flight about to be sent runs in a failed block moved off a replica (see
    /// `Session::move_failed_block`): the proxy's `BEGIN` and a statement that fails go in front.
    pub(super) failed_block_first: bool,
    /// Some statement was [`ClientStatement::reset_as_set`] (the flights' Executes are then
    /// checked for one).
    pub(super) resets_parsed: bool,
    /// The flight about to be sent is a `RESET` rewritten to the startup value, and the tag its
    /// answer is relayed with (see `Session::reset_to_startup`).
    pub(super) reset_rewritten: Option<&'static str>,
    /// The proxy answered an error for extended messages the client has not sent a Sync for:
    /// it ignores the client's messages up to that Sync (see `answer_flight_error`).
    pub(super) skip_to_sync: bool,
    /// The last replica read's held-back replies' buffer, emptied, for the next one
    /// ([`RetryBuffer`](super::attached::RetryBuffer)): a read then copies into room it has.
    pub(super) spare_held: bytes::BytesMut,
    /// The ParameterStatus values the client was told, at login and since (see
    /// `Session::report_changes`).
    pub(super) reported: HashMap<String, String>,
    /// Stamps (`BackendConn::reported_stamp`) of connections whose reported values all equal
    /// the client's, checked since `reported` last changed: `report_changes` skips them.
    pub(super) reported_covers: Vec<u64>,
    shutdown: watch::Receiver<bool>,
    /// Its entry in the client registry: KILL_CLIENT and KILL on the admin console fire it.
    client: Option<Arc<crate::clients::ClientEntry>>,
}

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
        client: Arc<crate::clients::ClientEntry>,
        server_login: Option<crate::config::ServerLogin>,
    ) -> Result<Session, ClientError> {
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
        let startup_proxy = startup_lsngate(&params);
        for (name, value) in &startup_proxy {
            if let Err((code, message)) =
                super::commands::apply(&mut floors, &mut hint, &config, name, Some(value))
            {
                io.queue(&crate::net::backend::build::fatal(
                    code,
                    &format!("in the startup options: {message}"),
                ));
                io.flush().await?;
                return Err(ClientError::Refused(message));
            }
        }
        let server_params = match proxy.server_params(&database, server_login.as_ref()).await {
            Ok(p) => p,
            Err(e) => {
                io.queue(&crate::net::backend::build::fatal(
                    sqlstate::CONNECTION_FAILURE,
                    &e.to_string(),
                ));
                io.flush().await?;
                return Err(ClientError::Server(format!("{e:#}")));
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
        io.count_into(proxy.traffic.of(&database));
        io.queue_ready(TxStatus::Idle);
        io.flush().await?;
        tracing::debug!(%user, %database, role = ?server_login.as_ref().map(|l| &l.user), "client logged in");
        Ok(Session {
            config: Arc::clone(&config),
            config_seen,
            pools: Vec::new(),
            class_memo: Default::default(),
            definitions: Default::default(),
            spares: Default::default(),
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
            status: TxStatus::Idle,
            pending: Vec::new(),
            settings_in_doubt: false,
            cancel_slot,
            floors,
            scopes: Default::default(),
            local_portals: HashMap::new(),
            closing: std::collections::VecDeque::new(),
            plans_changed: false,
            log: Default::default(),
            startup_settings: startup,
            startup_values,
            startup_proxy,
            reset_portals: Default::default(),
            restore_due: false,
            failed_block_first: false,
            resets_parsed: false,
            reset_rewritten: None,
            skip_to_sync: false,
            spare_held: bytes::BytesMut::new(),
            reported,
            reported_covers: Vec::new(),
            shutdown,
            client: Some(client),
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
            definitions: Default::default(),
            spares: Default::default(),
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
            status: TxStatus::Idle,
            pending: Vec::new(),
            settings_in_doubt: false,
            cancel_slot: Default::default(),
            scopes: Default::default(),
            local_portals: HashMap::new(),
            closing: std::collections::VecDeque::new(),
            plans_changed: false,
            log: Default::default(),
            startup_settings: Default::default(),
            startup_values: HashMap::new(),
            startup_proxy: Vec::new(),
            reset_portals: Default::default(),
            restore_due: false,
            failed_block_first: false,
            resets_parsed: false,
            reset_rewritten: None,
            skip_to_sync: false,
            spare_held: bytes::BytesMut::new(),
            reported: HashMap::new(),
            reported_covers: Vec::new(),
            shutdown: watch::channel(false).1,
            client: None,
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
            self.definitions.clear();
        }
    }

    /// The session loop: until the client leaves, breaks the protocol or the proxy drains.
    pub async fn run(mut self) -> Result<(), ClientError> {
        let result = self.run_loop().await;
        self.finish().await;
        result
    }

    async fn run_loop(&mut self) -> Result<(), ClientError> {
        enum Event {
            Client(Result<Option<Incoming>, ReadError>),
            Backend(Result<(), crate::backend::BackendError>),
            Shutdown,
            Killed,
            Idle,
        }
        // Armed once, and polled only when it was woken: the drain signal and the admin
        // console's kill switch must not cost on every message.
        // Once the drain signal fired, armed again with the kill switch alone: a drain past
        // its bound ends sessions that wait for their transaction through it.
        let arm = |mut shutdown: Option<watch::Receiver<bool>>,
                   client: Option<Arc<crate::clients::ClientEntry>>| {
            super::woken::WhenWoken::new(async move {
                let killed = async {
                    match &client {
                        Some(client) => client.kill.notified().await,
                        None => std::future::pending().await,
                    }
                };
                let shutdown_changed = async {
                    match shutdown.as_mut() {
                        Some(shutdown) => {
                            if shutdown.changed().await.is_err() {
                                // No sender: no drain to hear of (never a busy loop).
                                std::future::pending::<()>().await
                            }
                        }
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = shutdown_changed => false,
                    _ = killed => true,
                }
            })
        };
        let mut shutdown_changed = std::pin::pin!(arm(
            (!*self.shutdown.borrow()).then(|| self.shutdown.clone()),
            self.client.clone()
        ));
        // Read once here and again when the signal fires (the watch's lock costs on every turn).
        let mut draining = *self.shutdown.borrow();
        loop {
            let listening = self
                .backend
                .as_ref()
                .is_some_and(|b| b.awaiting_replies() || self.pinned);
            if draining
                && self.status == TxStatus::Idle
                && !self.backend.as_ref().is_some_and(|b| b.awaiting_replies())
            {
                self.io.queue(&crate::net::backend::build::fatal(
                    sqlstate::ADMIN_SHUTDOWN,
                    "lsngate proxy is shutting down; reconnect",
                ));
                self.io.flush().await?;
                return Ok(());
            }
            // The client's turn (nothing of its in flight): how long it may take.
            let idle_limit = if self.backend.as_ref().is_some_and(|b| b.awaiting_replies()) {
                None
            } else if self.status == TxStatus::Idle {
                self.config.client_idle_timeout
            } else {
                self.config.idle_transaction_timeout
            };
            let idle = async {
                match idle_limit {
                    Some(limit) => crate::timer::sleep(limit).await,
                    None => std::future::pending().await,
                }
            };
            // Biased: in this order, with no random start (no random number per wake-up).
            let event = tokio::select! {
                biased;
                filled = async { super::replies::fill_attached(self.backend.as_mut().expect("listening implies attached")).await }, if listening => Event::Backend(filled),
                incoming = self.io.incoming() => Event::Client(incoming),
                killed = &mut shutdown_changed => if killed { Event::Killed } else { Event::Shutdown },
                () = idle, if idle_limit.is_some() => Event::Idle,
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
                    if let ReadError::Protocol(protocol) = &e {
                        self.io.queue(&crate::net::backend::build::fatal(
                            sqlstate::PROTOCOL_VIOLATION,
                            &protocol.to_string(),
                        ));
                        let _ = self.io.flush().await;
                    }
                    return Err(e.into());
                }
                Event::Shutdown => {
                    draining = *self.shutdown.borrow();
                    let shutdown = (!draining).then(|| self.shutdown.clone());
                    shutdown_changed.set(arm(shutdown, self.client.clone()));
                }
                Event::Idle => {
                    // PostgreSQL's own idle timeouts' codes and words; the server connection's
                    // open transaction is rolled back as for any client that leaves mid-block.
                    let (code, message) = if self.status == TxStatus::Idle {
                        (
                            sqlstate::IDLE_SESSION_TIMEOUT,
                            "terminating connection due to idle-session timeout (client_idle_timeout_ms on lsngate)",
                        )
                    } else {
                        (
                            sqlstate::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
                            "terminating connection due to idle-in-transaction timeout (idle_transaction_timeout_ms on lsngate); the transaction is rolled back",
                        )
                    };
                    self.io
                        .queue(&crate::net::backend::build::fatal(code, message));
                    let _ = self.io.flush().await;
                    return Ok(());
                }
                Event::Killed => {
                    // At once, like PgBouncer's KILL: a transaction in progress is lost with
                    // the connection (the server rolls it back).
                    self.io.queue(&crate::net::backend::build::fatal(
                        sqlstate::ADMIN_SHUTDOWN,
                        self.client.as_ref().map_or(
                            "terminating connection due to a KILL on the lsngate admin console",
                            |c| c.kill_message(),
                        ),
                    ));
                    let _ = self.io.flush().await;
                    return Ok(());
                }
            }
        }
    }

    /// Whether `flight` executes or describes a portal bound to an lsngate command: portals
    /// bound in the flight are what their statement (`per_message`) is, others what they were.
    fn runs_local_portal(
        &self,
        flight: &[FrontendMessage],
        per_message: &[Option<&ClientStatement>],
    ) -> bool {
        if self.local_portals.is_empty() && per_message.iter().flatten().all(|s| s.local.is_none())
        {
            // No portal of an lsngate command exists, and the flight binds none.
            return false;
        }
        let mut bound = crate::net::NameMap::default();
        let mut local = false;
        for (m, s) in flight.iter().zip(per_message) {
            match m {
                FrontendMessage::Bind { portal, .. } => {
                    bound.insert(portal, s.is_some_and(|s| s.local.is_some()));
                }
                FrontendMessage::Execute { portal, .. }
                | FrontendMessage::Describe {
                    kind: b'P',
                    name: portal,
                } => {
                    local |= bound
                        .get(portal)
                        .copied()
                        .unwrap_or_else(|| self.local_portals.contains_key(portal.as_str()));
                }
                _ => {}
            }
        }
        local
    }

    /// The extended-protocol messages gathered so far, as one flight; the next flight's are
    /// gathered in a vector sized for a driver's usual Parse/Bind/Describe/Execute/Sync, so
    /// pushing them allocates once, not at 1, 2, 4 and 8 messages.
    pub(super) fn take_pending(&mut self) -> Vec<FrontendMessage> {
        std::mem::replace(&mut self.pending, Vec::with_capacity(FLIGHT_CAPACITY))
    }

    /// Handles one client message; false when the client said Terminate.
    async fn on_client(&mut self, incoming: Incoming) -> Result<bool, ClientError> {
        let frame = match incoming {
            Incoming::Query(len) => {
                self.refresh_config();
                self.query_drops_unnamed_portal();
                if self.pending.is_empty()
                    && !self.backend.as_ref().is_some_and(|b| b.batch.is_open())
                {
                    // PostgreSQL drops the unnamed statement at every simple Query it runs; one
                    // behind unsynced messages may be skipped (after an error there), and
                    // `query_after_unsynced` decides.
                    self.unnamed = None;
                }
                // Lent out of the buffer for the call: the pass-through sends the message
                // straight from it, and nothing else reads the client meanwhile.
                let buffered = self.io.lend_read_buf();
                let passed = self.pass_through(&buffered[..len]).await;
                self.io.restore_read_buf(buffered);
                if passed? {
                    self.io.skip(len);
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
                self.io.queue(&crate::net::backend::build::fatal(
                    sqlstate::PROTOCOL_VIOLATION,
                    &e.to_string(),
                ));
                let _ = self.io.flush().await;
                return Err(e.into());
            }
        };
        if self.skip_to_sync && !matches!(message, FrontendMessage::Terminate) {
            // Behind an error the proxy answered for a batch the client has not synced, as the
            // server would after its own error: everything up to the Sync is ignored.
            if matches!(message, FrontendMessage::Sync) {
                self.skip_to_sync = false;
                if self.backend.as_ref().is_some_and(|b| b.batch.is_open()) {
                    // The server holds earlier messages of the batch: its Sync ends them.
                    self.extended_flight(vec![FrontendMessage::Sync], None)
                        .await?;
                } else {
                    self.queue_ready(self.status);
                    self.io.flush().await?;
                }
            }
            return Ok(true);
        }
        match message {
            FrontendMessage::Query(sql) => {
                if !self.query_after_unsynced(&sql).await? {
                    // Again: the messages sent ahead of it may have bound one.
                    self.query_drops_unnamed_portal();
                    self.unnamed = None;
                    self.simple_query(sql).await?
                }
            }
            FrontendMessage::Parse {
                statement,
                query,
                param_types,
            } => {
                let (defined, query) = match self.definitions.get(&param_types, &query) {
                    // The server gets the definition's text: hint comments out, a RESET
                    // rewritten (the client's own string when that is the same).
                    Some(defined) if same_text(&defined.query, &query) => (defined, query),
                    Some(defined) => {
                        let query = defined.query.to_string();
                        (defined, query)
                    }
                    None => {
                        let (defined, sent) = self.define(&param_types, query.clone());
                        self.definitions.keep(&query, &defined);
                        (defined, sent)
                    }
                };
                self.resets_parsed |= defined.reset_as_set;
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
                let flight = self.take_pending();
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
                self.io.queue(&crate::net::backend::build::fatal(
                    sqlstate::PROTOCOL_VIOLATION,
                    &e.to_string(),
                ));
                let _ = self.io.flush().await;
                return Err(e.into());
            }
        }
        Ok(true)
    }

    /// A simple Query replaces the unnamed portal, one bound to an lsngate command too: a
    /// Describe or Execute of it then finds none (34000), as on the server.
    fn query_drops_unnamed_portal(&mut self) {
        if !self.local_portals.is_empty() {
            self.local_portals.remove("");
        }
    }

    /// Before a simple Query: extended-protocol messages still waiting for their Sync are sent
    /// (with a Flush) on the backend the Query will use, and the server's answers to everything
    /// unsynced are relayed first, so the client gets its answers in the order it sent its
    /// messages (pgjdbc's autosave sends `Parse/Bind/Execute BEGIN`, `Query SAVEPOINT`, then a
    /// statement and Sync, in one write). True when the server skips the Query: one of those
    /// messages failed, and until the next Sync the server ignores everything, so no answer is
    /// due.
    async fn query_after_unsynced(&mut self, sql: &str) -> Result<bool, ClientError> {
        if !self.pending.is_empty() {
            // The Query runs where these go: they are routed as demandingly as it needs.
            let query = comment_hints(sql).map_or_else(|| sql.to_string(), |(_, s)| s);
            let class = local_command(&query).is_none().then(|| {
                self.class_memo
                    .classify(&self.proxy.classes, &query, &self.config.write_functions)
            });
            self.pending.push(FrontendMessage::Flush);
            let flight = self.take_pending();
            self.extended_flight(flight, class).await?;
        }
        if !self.backend.as_ref().is_some_and(|b| b.batch.is_open()) {
            return Ok(false);
        }
        self.settle_unsynced().await
    }

    /// What a Parse of `query` with `param_types` defines, and the text the server gets for it
    /// (hint comments taken out, a `RESET` of a startup setting sent as its `SET`).
    fn define(&mut self, param_types: &[u32], query: String) -> (Arc<ClientStatement>, String) {
        let (hints, query) = comment_hints(&query).unwrap_or((Hints::default(), query));
        let (floor, floor_error) = self.hinted_floor(&hints);
        let (scope, scope_error) = hinted_scope(&self.config, &hints);
        let hint_error = floor_error.or(scope_error);
        let local = local_command(&query);
        let class =
            self.class_memo
                .classify(&self.proxy.classes, &query, &self.config.write_functions);
        // Only a statement whose first word is SET or RESET can be one (read only then:
        // scanning every Parse's text showed in callgrind).
        let sent_as_set = matches!(class, Class::SessionState | Class::TransactionLocal)
            .then(|| self.reset_sent_as_set(&query))
            .flatten()
            .filter(|_| local.is_none());
        let (query, reset_as_set) = sent_as_set.unwrap_or((query, false));
        let deallocates_all = local.is_none()
            && super::deallocate::parse(&query) == Some(super::deallocate::Deallocate::All);
        let defined = ClientStatement {
            identity: statement_identity(param_types, &query).into(),
            query: Arc::from(query.as_str()),
            param_types: Arc::from(param_types),
            class,
            hint: hints.route,
            floor,
            scope,
            hint_error,
            copies_in: local.is_none() && super::copy::mentions_copy_from_stdin(&query),
            local,
            shape: None,
            plan_changed: false,
            reset_as_set,
            deallocates_all,
        };
        (Arc::new(defined), query)
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

    /// An extended-protocol flight up to Sync or Flush: answered by the proxy (its commands, a
    /// refused floor) or routed by the most demanding class among its statements.
    /// `also`: the class of a simple Query that will follow on the same backend.
    pub(super) async fn extended_flight(
        &mut self,
        flight: Vec<FrontendMessage>,
        also: Option<Class>,
    ) -> Result<(), ClientError> {
        let result = self.extended_flight_sent(flight, also).await;
        // The pending messages are a flight of their own now: the next ones start afresh.
        self.log.clear();
        result
    }

    async fn extended_flight_sent(
        &mut self,
        mut flight: Vec<FrontendMessage>,
        also: Option<Class>,
    ) -> Result<(), ClientError> {
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
            flight = self.take_pending();
            drained?;
        }
        let due_on_replica = (self.backend.as_ref()).is_some_and(|b| {
            b.target == crate::backend::Target::Replica && b.client_segments_due() > 0
        });
        if due_on_replica
            && self.status == TxStatus::Idle
            && executed(&flight, &self.statement_per_message(&flight))
                .into_iter()
                .any(statement_ends_block)
        {
            // Whether a block is open there is what the replies say, all of them heard (the
            // client sent its `BEGIN READ ONLY` and this flight without waiting: the block was
            // not known yet, and a write behind the flight's COMMIT ran into it, 25006).
            self.pending = flight;
            let drained = self.drain().await;
            flight = self.take_pending();
            drained?;
        }
        let per_message = self.statement_per_message(&flight);
        let used = || flight_statements(&flight, &per_message);
        let ends_replica_block =
            self.flight_ends_replica_block_then_needs_primary(&flight, &per_message);
        let portals_local = self.runs_local_portal(&flight, &per_message);
        let chains = self.in_replica_block() && first_execute_chains(&flight, &per_message);
        let local = used().flatten().filter(|s| s.local.is_some()).count();
        if local > 0 || portals_local {
            if local == used().count() {
                return self.answer_extended_locally(flight).await;
            }
            let message = "lsngate commands (SET/SHOW/RESET lsngate.*) cannot share a pipeline with SQL statements; send them with their own Sync";
            return self
                .refuse_flight(&flight, sqlstate::FEATURE_NOT_SUPPORTED, message)
                .await;
        }
        let hint_error = used().flatten().find_map(|s| s.hint_error.clone());
        if let Some(error) = hint_error {
            return self
                .refuse_flight(&flight, sqlstate::INVALID_PARAMETER_VALUE, &error)
                .await;
        }
        if let Some(message) = ends_replica_block {
            return self
                .refuse_flight(&flight, sqlstate::FEATURE_NOT_SUPPORTED, &message)
                .await;
        }
        let mut class: Option<Class> = None;
        let mut hint = None;
        let mut floor = None;
        let mut scopes = Vec::new();
        let mut unknown = false;
        for s in used() {
            let Some(s) = s else {
                unknown = true;
                continue;
            };
            hint = hint.or(s.hint);
            floor = Floor::merge(floor, s.floor);
            if let Some(scope) = s.scope.as_ref().filter(|scope| !scopes.contains(*scope)) {
                scopes.push(scope.clone());
            }
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
        if chains {
            // Whether the block there failed is what the replies say, all of them heard.
            self.drain().await?;
            let may_add = (self.backend.as_ref()).is_some_and(|b| b.may_add_frames());
            if self.status == TxStatus::Failed && self.in_replica_block() && !self.pinned && may_add
            {
                return self.move_failed_block(flight, class).await;
            }
        }
        self.scopes.flight = scopes;
        let dispatched = self.dispatch(flight, class, hint, floor).await;
        self.scopes.flight.clear();
        dispatched
    }

    async fn simple_query(&mut self, sql: String) -> Result<(), ClientError> {
        let (hints, sql) = comment_hints(&sql).unwrap_or((Hints::default(), sql));
        let sql = match crate::statement::mixed_commands(&sql) {
            None => sql,
            Some(mixed) => match self.answer_leading_commands(mixed).await? {
                Some(rest) => rest,
                None => return Ok(()),
            },
        };
        if let Some(command) = local_command(&sql) {
            return self.answer_locally(command).await;
        }
        if crate::statement::mentions_lsngate_setting(&sql) {
            let message = format!(
                "cannot parse {:?} as a proxy command; use SET lsngate.<name> = 'value', RESET lsngate.<name> or SHOW lsngate.<name>",
                sql.trim()
            );
            return self.answer_error(sqlstate::SYNTAX_ERROR, &message).await;
        }
        let (floor, floor_error) = self.hinted_floor(&hints);
        let (scope, scope_error) = hinted_scope(&self.config, &hints);
        if let Some(error) = floor_error.or(scope_error) {
            return self
                .answer_error(sqlstate::INVALID_PARAMETER_VALUE, &error)
                .await;
        }
        if let Some(what) = super::deallocate::parse(&sql)
            && self.deallocate(&what).await?
        {
            return Ok(());
        }
        let class =
            self.class_memo
                .classify(&self.proxy.classes, &sql, &self.config.write_functions);
        let on_replica =
            (self.backend.as_ref()).is_some_and(|b| b.target == crate::backend::Target::Replica);
        if on_replica && crate::statement::chains_block(&sql) {
            // Whether a block is open there and failed is what the replies say, all of them
            // heard (the client may have sent its statements without waiting for them).
            self.drain().await?;
            // Not in the middle of an extended batch or a COPY there: the ROLLBACK goes first.
            let may_add = (self.backend.as_ref()).is_some_and(|b| b.may_add_frames());
            if self.status == TxStatus::Failed && self.in_replica_block() && !self.pinned && may_add
            {
                let flight = vec![FrontendMessage::Query(sql)];
                return self.move_failed_block(flight, Some(class)).await;
            }
        }
        let due = (self.backend.as_ref()).is_some_and(|b| b.client_segments_due() > 0);
        if on_replica && due && crate::statement::after_block_end(&sql).is_some() {
            // Whether a block is open there is what the replies say, all of them heard (the
            // client sent its `BEGIN READ ONLY` and this Query without waiting: the block was
            // not known yet, and the Query's write ran into it; seed 20261452796).
            self.drain().await?;
        }
        if let Some(message) = self.ends_replica_block_then_needs_primary(&sql) {
            return self
                .answer_error(sqlstate::FEATURE_NOT_SUPPORTED, &message)
                .await;
        }
        let sql = self.reset_to_startup(sql).await?;
        self.scopes.flight = scope.into_iter().collect();
        let dispatched = self
            .dispatch(
                vec![FrontendMessage::Query(sql)],
                Some(class),
                hints.route,
                floor,
            )
            .await;
        self.scopes.flight.clear();
        dispatched
    }

    /// `COMMIT AND CHAIN` or `ROLLBACK AND CHAIN` (a Query of it alone, or a flight whose first
    /// Execute runs it), ending a failed block held on a replica (`BEGIN READ ONLY`). PostgreSQL
    /// rolls the failed block back and chains a block with the default characteristics, not the
    /// failed one's (15.18 and 19rc1: `transaction_read_only` is off in it), so it takes writes;
    /// on the replica they failed with 25006 where PostgreSQL runs them (seeds 20261218249, a
    /// Query, and 20261234371, the extended protocol). So the failed block moves: rolled back on
    /// the replica, opened on the primary with the proxy's `BEGIN` and failed there by a
    /// statement whose error the proxy keeps. A failed block holds nothing a statement could see
    /// (only savepoints, and a flight that rolls back to one runs that first), so the client's
    /// own messages run on the primary as they would have on the replica, answer as PostgreSQL
    /// answers (`ROLLBACK`, then `T`), and the block they chain is on the primary.
    async fn move_failed_block(
        &mut self,
        flight: Vec<FrontendMessage>,
        class: Option<Class>,
    ) -> Result<(), ClientError> {
        let attached = self.backend.as_mut().expect("in a block on a replica");
        if let Err(e) = attached
            .send_query("ROLLBACK", Owner::Proxy(Duty::Rollback))
            .await
        {
            return self.backend_lost(e).await;
        }
        self.drain().await?;
        if self.backend.is_none() {
            // Lost on the way: the client was told (`backend_lost`).
            return Ok(());
        }
        self.release_backend();
        self.failed_block_first = true;
        let route = super::flight::Route::to(Some(crate::backend::Target::Primary));
        let dispatched = self.dispatch_to(flight, class, route).await;
        // Taken by the flight when it was sent; not left for another if it was not.
        self.failed_block_first = false;
        dispatched
    }

    /// Why a simple Query inside a transaction block held on a replica cannot run: it ends the
    /// block (`COMMIT`, `ROLLBACK`, …) and then runs statements that need the primary. One Query
    /// goes to one server, and on the replica those would fail with 25006 where PostgreSQL runs
    /// them (seed 20261206466: `BEGIN READ ONLY`, then `SELECT …; COMMIT; UPDATE …`). Refused
    /// before anything is sent: the block is left as the client had it, failed by the error.
    fn ends_replica_block_then_needs_primary(&mut self, sql: &str) -> Option<String> {
        if !self.in_replica_block() {
            return None;
        }
        let rest = crate::statement::after_block_end(sql)?;
        let class =
            self.class_memo
                .classify(&self.proxy.classes, &rest, &self.config.write_functions);
        needs_primary_after_block(class).then(|| {
            format!(
                "lsngate runs this transaction block on a replica, and this Query ends the block and then runs statements that need the primary ({:?}); one Query goes to one server: send the statements after the block's end as a Query of their own",
                rest.chars().take(80).collect::<String>()
            )
        })
    }

    /// The extended protocol's form of [`Session::ends_replica_block_then_needs_primary`]: inside
    /// a block held on a replica, a flight that executes a portal ending the block and then,
    /// before its Sync, one that needs the primary. The flight goes to one server, where the
    /// second Execute would fail with 25006 (on a direct connection it runs in the implicit
    /// transaction after the block). `per_message` is [`Session::statement_per_message`].
    /// Not looked at: a portal bound before this flight, and a flight behind unsynced messages
    /// (the server holds part of the batch, and only the client's Sync ends it: it goes on to
    /// fail with 25006, a documented limit).
    fn flight_ends_replica_block_then_needs_primary(
        &self,
        flight: &[FrontendMessage],
        per_message: &[Option<&ClientStatement>],
    ) -> Option<String> {
        if !self.in_replica_block() || self.backend.as_ref().is_some_and(|b| b.batch.is_open()) {
            return None;
        }
        let mut ended = false;
        for s in executed(flight, per_message) {
            if ended && needs_primary_after_block(s.class) {
                return Some(format!(
                    "lsngate runs this transaction block on a replica, and this pipeline ends the block and then, before its Sync, executes a statement that needs the primary ({:?}); one pipeline segment goes to one server: send a Sync after the statement that ends the block",
                    s.query.chars().take(80).collect::<String>()
                ));
            }
            ended |= statement_ends_block(s);
        }
        None
    }

    /// Inside a transaction block held on a replica.
    fn in_replica_block(&self) -> bool {
        self.status != TxStatus::Idle
            && self
                .backend
                .as_ref()
                .is_some_and(|b| b.target == crate::backend::Target::Replica)
    }

    /// Refuses an extended-protocol flight before anything of it is sent: each of its segments
    /// gets the error `code`, `message`. Inside a transaction block the error fails the block,
    /// there as on the server (as a refused simple Query's does: [`Session::answer_error`]).
    async fn refuse_flight(
        &mut self,
        flight: &[FrontendMessage],
        code: &str,
        message: &str,
    ) -> Result<(), ClientError> {
        self.drain().await?;
        self.abort_server_block().await?;
        self.answer_flight_error(flight, code, message).await
    }

    /// `RESET name` (or `SET name TO DEFAULT`) of a setting the client's startup packet gave: on
    /// a direct connection it returns to that value, but on a pooled server connection the server
    /// would return to its own login's. So the statement sent is the startup value's
    /// `set_config`, and its answer is relayed as the original's (`replies.rs`: row and
    /// description dropped, the original's tag).
    ///
    /// The answer is told apart by being the only one due, so what is due is read first, before
    /// the rewrite is noted: a flight sent meanwhile (a held-back replica read run again on
    /// 15–18) took the rewrite and its answers were relayed as RESET's (seed 20261213607).
    async fn reset_to_startup(&mut self, sql: String) -> Result<String, ClientError> {
        let Some((name, tag)) = setting_reset(&sql) else {
            return Ok(sql);
        };
        let Some(statement) = self.startup_settings.get(&name).cloned() else {
            return Ok(sql);
        };
        self.drain().await?;
        if self.status == TxStatus::Failed {
            return Ok(sql);
        }
        self.reset_rewritten = Some(tag);
        Ok(statement)
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

    /// Ends the session: a backend that is mid-transaction is closed (the server rolls back);
    /// a pinned one is reset with DISCARD ALL before it returns to the pool.
    async fn finish(&mut self) {
        // Commits whose positions were not heard: their scopes' next reads assume the worst.
        self.scopes_committed(u64::MAX, None).await;
        let Some(mut attached) = self.backend.take() else {
            return;
        };
        self.cancel_slot.lock().expect("cancel slot").target = None;
        self.end_fallback();
        let mut status = self.status;
        if attached.awaiting_replies() && !attached.batch.is_open() && !attached.copy.running {
            // The client left with replies still due (drivers send a Close for each statement
            // they drop, often right before they disconnect): read them to their last
            // ReadyForQuery, unrelayed, so the connection can go back to the pool.
            let drained = crate::timer::timeout(FINISH_DRAIN, async {
                while !attached.expect.is_empty() {
                    let frame = attached.conn.recv().await?;
                    if frame.tag == b'Z' {
                        attached.expect.pop_front();
                        status = frame
                            .body
                            .first()
                            .and_then(|b| TxStatus::from_byte(*b))
                            .unwrap_or(TxStatus::Failed);
                    }
                }
                Ok::<(), crate::backend::BackendError>(())
            })
            .await;
            if !matches!(drained, Ok(Ok(()))) {
                return;
            }
        }
        if attached.awaiting_replies() || status != TxStatus::Idle {
            return;
        }
        if matches!(attached.conn.run_simple("DISCARD ALL").await, Ok(None)) {
            attached.conn.prepared.clear();
            attached.conn.applied.clear();
            attached.conn.release();
        }
    }
}

/// Messages a flight's vector has room for before it grows (see [`Session::take_pending`]).
const FLIGHT_CAPACITY: usize = 8;

/// What cannot run on a replica once a block held there has ended: a write, or a block that will
/// write. (Not the session's route hint: a `ROLLBACK; SELECT …` must still end the block.)
fn needs_primary_after_block(class: Class) -> bool {
    matches!(class, Class::Write | Class::Begin { read_only: false })
}

/// The statement each Execute of `flight` runs, in order, where its portal was bound in the
/// flight to a statement the session knows (`per_message`: [`Session::statement_per_message`]).
fn executed<'a>(
    flight: &[FrontendMessage],
    per_message: &[Option<&'a ClientStatement>],
) -> Vec<&'a ClientStatement> {
    let mut bound = crate::net::NameMap::default();
    let mut runs = Vec::new();
    for (m, s) in flight.iter().zip(per_message) {
        match m {
            FrontendMessage::Bind { portal, .. } => bound.insert(portal, *s),
            FrontendMessage::Execute { portal, .. } => {
                if let Some(Some(s)) = bound.get(portal) {
                    runs.push(*s);
                }
            }
            _ => {}
        }
    }
    runs
}

/// Whether the client statement's first command ends a transaction block (`COMMIT`,
/// `ROLLBACK`, …).
fn statement_ends_block(s: &ClientStatement) -> bool {
    crate::statement::statements(&s.query)
        .first()
        .is_some_and(|q| crate::statement::ends_block(q))
}

/// The statements an extended-protocol flight prepares, binds or describes, from its
/// [`Session::statement_per_message`]; `None` for a name the session does not know. Walked
/// where needed rather than collected (a vector allocated per flight).
fn flight_statements<'s, 'a>(
    flight: &'s [FrontendMessage],
    per_message: &'s [Option<&'a ClientStatement>],
) -> impl Iterator<Item = Option<&'a ClientStatement>> + 's {
    flight
        .iter()
        .zip(per_message)
        .filter(|(m, _)| {
            matches!(
                m,
                FrontendMessage::Parse { .. }
                    | FrontendMessage::Bind { .. }
                    | FrontendMessage::Describe { kind: b'S', .. }
            )
        })
        .map(|(_, s)| *s)
}

/// Whether the first Execute of `flight` runs a portal bound in it to `COMMIT AND CHAIN` or
/// `ROLLBACK AND CHAIN` (`per_message`: [`Session::statement_per_message`]).
fn first_execute_chains(
    flight: &[FrontendMessage],
    per_message: &[Option<&ClientStatement>],
) -> bool {
    let mut bound = crate::net::NameMap::default();
    for (m, s) in flight.iter().zip(per_message) {
        match m {
            FrontendMessage::Bind { portal, .. } => bound.insert(portal, *s),
            FrontendMessage::Execute { portal, .. } => {
                return bound.get(portal).copied().flatten().is_some_and(|s| {
                    crate::statement::statements(&s.query)
                        .first()
                        .is_some_and(|statement| crate::statement::chains_block(statement))
                });
            }
            _ => {}
        }
    }
    false
}
