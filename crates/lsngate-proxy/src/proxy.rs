//! The state every session of one proxy shares — the config snapshot (swapped whole on
//! SIGHUP), the nodes and their pools, the statement classification cache, the causal state and
//! the cancel-key registry — passed to sessions explicitly, never read from a global. Serving it
//! (accepting clients, starting monitors and the admin port) is `serve`'s.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::backend::Nodes;
use crate::backend::Target;
use crate::config::{Config, ServerLogin};
use crate::statement::ClassCache;

/// Where a client's query is running right now, for CancelRequest routing.
pub type CancelTarget = Arc<crate::backend::CancelKey>;

/// What a client's cancel key leads to.
#[derive(Debug, Default)]
pub struct CancelState {
    /// The server connection running the client's statement, if any.
    pub target: Option<CancelTarget>,
    /// Cancel requests received so far (the proxy's own waits and polls watch this).
    pub requests: u64,
}

/// A client's slot in the cancel registry.
pub type CancelSlot = Arc<Mutex<CancelState>>;

/// How far a proxy is from stopping, in the order a stop escalates (PgBouncer's `SHUTDOWN`
/// variants: a later stage is never undone by an earlier one's request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Drain {
    /// Accepting clients.
    Serving,
    /// Not accepting; every client stays until it leaves (`SHUTDOWN WAIT_FOR_CLIENTS`, a
    /// takeover by a new process).
    WaitForClients,
    /// Not accepting; a client is closed with 57P01 once its transaction is over (SIGTERM,
    /// `SHUTDOWN`, PgBouncer's `WAIT_FOR_SERVERS`).
    WaitForServers,
}

impl Drain {
    /// Its name on the admin console (`SHOW STATE`).
    pub fn name(self) -> &'static str {
        match self {
            Drain::Serving => "no",
            Drain::WaitForClients => "wait_for_clients",
            Drain::WaitForServers => "wait_for_servers",
        }
    }
}

/// State shared by every session of one proxy.
#[derive(Debug)]
pub struct Proxy {
    config: RwLock<Arc<Config>>,
    /// Bumped by every reload, so sessions re-read the config only when it changed.
    config_version: AtomicU64,
    /// Every configured node with its pools.
    pub nodes: Nodes,
    /// Statement classifications by text.
    pub classes: ClassCache,
    cancels: Mutex<HashMap<(i32, i32), CancelSlot>>,
    clients: AtomicUsize,
    /// `lsngate_proxy_queries_total` for route primary and replica, tallied because they are bumped
    /// on every flight.
    pub(crate) queries: [crate::tally::Tally; 2],
    /// `lsngate_proxy_passthrough_total`: simple queries sent on as they came (`passthrough.rs`).
    pub(crate) passed_through: crate::tally::Tally,
    /// Causal-read state shared by the sessions (watcher, guard, statistics, floors).
    pub causal: crate::causal::Causal,
    /// What the topology source (Patroni) last said, for /status and the console.
    pub topology: crate::topology::Topology,
    /// Shutdown signal for node monitors, once serving (monitors of nodes a reload adds use it).
    pub(crate) monitors:
        Mutex<Option<(tokio::sync::watch::Receiver<bool>, tokio::runtime::Handle)>>,
    /// The clients connected now (admin console: SHOW CLIENTS, KILL_CLIENT).
    pub(crate) registry: crate::clients::Clients,
    /// Who login names are; auth_query's cached secrets.
    pub(crate) logins: crate::logins::Logins,
    /// Queries, transactions and bytes per database, for SHOW STATS.
    pub(crate) traffic: crate::traffic::TrafficByDatabase,
    /// Every database's totals at the ends of the last two `stats_period_ms`, for SHOW STATS'
    /// averages; the sampler in `serve` ends the periods.
    pub(crate) stats_periods: Mutex<crate::stats::Periods>,
    /// Where a reload reads the config from (RELOAD on the admin console, SIGHUP).
    reload_source: Mutex<Option<ReloadSource>>,
    /// How the proxy stops, if it does: set by signals, SHUTDOWN on the admin console and a
    /// takeover (see [`Proxy::request_drain`]); `serve` follows it.
    pub(crate) drain: tokio::sync::watch::Sender<Drain>,
    /// Duplicates of the listening sockets (clients, then the admin port), for a new process
    /// that takes them over; set by `serve`, emptied once handed over.
    pub(crate) listening: Mutex<Vec<std::os::fd::OwnedFd>>,
    /// Turned true once `serve` accepts clients (readiness for systemd and the takeover).
    pub(crate) accepting: tokio::sync::watch::Sender<bool>,
    /// Turned true when a new process took the listening sockets over and accepts: this one
    /// stops serving the admin port too (the new one serves it).
    pub(crate) handed_over: tokio::sync::watch::Sender<bool>,
    /// The admin port's listening socket taken over from the previous process, which `serve`
    /// uses instead of binding `admin_listen`.
    pub(crate) admin_socket: Mutex<Option<std::net::TcpListener>>,
}

/// How a reload gets the new config: `lsngate proxy` re-reads its config file and flags.
pub type ReloadFn = Box<dyn Fn() -> Result<Config, crate::config::ConfigError> + Send + Sync>;

struct ReloadSource(ReloadFn);

impl std::fmt::Debug for ReloadSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReloadSource")
    }
}

impl Proxy {
    /// A proxy for `config`; nothing runs until `serve`.
    pub fn new(config: Config) -> Arc<Proxy> {
        crate::tally::prometheus();
        Arc::new(Proxy {
            queries: [
                crate::tally::Tally::new(
                    metrics::counter!("lsngate_proxy_queries_total", "route" => "primary"),
                ),
                crate::tally::Tally::new(
                    metrics::counter!("lsngate_proxy_queries_total", "route" => "replica"),
                ),
            ],
            passed_through: crate::tally::Tally::new(metrics::counter!(
                "lsngate_proxy_passthrough_total"
            )),
            nodes: Nodes::new(&config.nodes),
            causal: crate::causal::Causal::new(&config.causal),
            topology: crate::topology::Topology::default(),
            monitors: Mutex::new(None),
            config: RwLock::new(Arc::new(config)),
            config_version: AtomicU64::new(0),
            classes: ClassCache::default(),
            cancels: Mutex::new(HashMap::new()),
            clients: AtomicUsize::new(0),
            registry: crate::clients::Clients::default(),
            logins: crate::logins::Logins::default(),
            traffic: crate::traffic::TrafficByDatabase::default(),
            stats_periods: Mutex::new(crate::stats::Periods::default()),
            reload_source: Mutex::new(None),
            drain: tokio::sync::watch::channel(Drain::Serving).0,
            listening: Mutex::new(Vec::new()),
            accepting: tokio::sync::watch::channel(false).0,
            handed_over: tokio::sync::watch::channel(false).0,
            admin_socket: Mutex::new(None),
        })
    }

    /// Serves the admin port on `listener`, already bound (to the config's `admin_listen`),
    /// instead of binding that address when [`Proxy::serve`] starts: the socket a previous
    /// process handed over, or one an embedding program bound itself so that no other process
    /// can take the port between choosing it and serving it.
    pub fn adopt_admin_listener(&self, listener: std::net::TcpListener) {
        *self.admin_socket.lock().expect("admin socket lock") = Some(listener);
    }

    /// Sets where [`Proxy::reload_from_source`] reads the config (the CLI's file and flags).
    pub fn set_reload_source(&self, source: ReloadFn) {
        *self.reload_source.lock().expect("reload lock") = Some(ReloadSource(source));
    }

    /// Reads the config again and applies it (SIGHUP, RELOAD); the error names what is wrong
    /// with the new config, which is then not applied.
    pub fn reload_from_source(self: &Arc<Self>) -> Result<(), String> {
        let loaded = {
            let source = self.reload_source.lock().expect("reload lock");
            let Some(ReloadSource(load)) = source.as_ref() else {
                return Err(
                    "this proxy has no config source to reload from (it was started \
                     in-process, not by lsngate proxy); start it with lsngate proxy --config FILE"
                        .into(),
                );
            };
            load()
        };
        let config = loaded.map_err(|e| e.to_string())?;
        if config.runtime_dir != self.config().runtime_dir {
            // The control socket stays where it was bound; forwarding cancels to another
            // directory would lose them.
            return Err(
                "runtime_dir cannot change on a reload: the control socket is bound; start a \
                 new process with --takeover to move it"
                    .into(),
            );
        }
        self.reload(config);
        Ok(())
    }

    /// The current config (a snapshot; SIGHUP swaps it).
    pub fn config(&self) -> Arc<Config> {
        Arc::clone(&self.config.read().expect("config lock"))
    }

    /// The current config when it changed since `seen` (which is updated), else None.
    pub fn config_if_changed(&self, seen: &mut u64) -> Option<Arc<Config>> {
        let version = self.config_version.load(Ordering::Acquire);
        if version == *seen {
            return None;
        }
        *seen = version;
        Some(self.config())
    }

    /// Swaps in a new config. Users, pool limits, timeouts, routing functions and the node list
    /// take effect at once: added nodes are checked and monitored, removed ones retired (their
    /// connections in use finish their work). Causal modes and budgets apply to new clients; the
    /// fallback guard's limits stay as started.
    /// With a `patroni` topology the node set is Patroni's, and a reload leaves it alone.
    pub fn reload(self: &Arc<Self>, config: Config) {
        let static_nodes = config.topology.source == crate::config::TopologySource::Static;
        if static_nodes && config.nodes != self.config().nodes {
            self.set_node_set(&config.nodes, "SIGHUP");
        }
        let limits = config.pool_limits();
        *self.config.write().expect("config lock") = Arc::new(config);
        // Sizes too: a changed pool_size applies to the pools already made, at once.
        for pool in self.nodes.pools_of(None) {
            pool.set_limits(limits);
        }
        self.config_version.fetch_add(1, Ordering::Release);
        self.classes.clear();
        tracing::info!("configuration reloaded");
    }

    /// Makes `urls` the node set: nodes whose URL stays keep their state and pools, new ones are
    /// checked and monitored, the others retired (connections in use finish their work).
    /// `why` names the cause in the log: a reload or the topology source.
    pub fn set_node_set(self: &Arc<Self>, urls: &[crate::config::NodeUrl], why: &str) {
        let (added, retired) = self.nodes.replace(urls);
        for node in &retired {
            tracing::warn!(node = %node.url.address(), "{why}: node removed; draining it");
        }
        for node in added {
            tracing::warn!(node = %node.url.address(), "{why}: node added");
            self.watch(node);
        }
    }

    /// Starts the monitor of `node` (once serving; before that `serve` starts them all).
    pub(crate) fn watch(self: &Arc<Self>, node: Arc<crate::backend::NodeState>) {
        let Some((stop, runtime)) = self.monitors.lock().expect("monitors lock").clone() else {
            return;
        };
        let config = self.config();
        runtime.spawn(crate::backend::monitor::watch_node(
            node,
            Arc::clone(self),
            config.connect_timeout,
            stop,
        ));
    }

    /// Every database's totals now, for SHOW STATS: checkouts and their queueing from the
    /// pools, queries, transactions and bytes from the client sessions' counters.
    pub(crate) fn database_stats(
        &self,
    ) -> std::collections::BTreeMap<String, crate::stats::DatabaseStats> {
        let mut by_database: std::collections::BTreeMap<String, crate::stats::DatabaseStats> =
            Default::default();
        for pool in self.nodes.pools_of(None) {
            let activity = pool.activity();
            let entry = by_database.entry(pool.database().to_string()).or_default();
            entry.assignments += activity.assignments;
            entry.wait_us += activity.waited_us;
        }
        for (database, traffic) in self.traffic.totals() {
            by_database.entry(database).or_default().traffic = traffic;
        }
        by_database
    }

    /// Connected clients right now.
    pub fn client_count(&self) -> usize {
        self.clients.load(Ordering::Relaxed)
    }

    pub(crate) fn client_joined(&self) -> usize {
        metrics::gauge!("lsngate_proxy_clients").increment(1.0);
        self.clients.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn client_left(&self) {
        metrics::gauge!("lsngate_proxy_clients").decrement(1.0);
        self.clients.fetch_sub(1, Ordering::Relaxed);
    }

    /// Asks the proxy to stop as `drain` says, unless it already stops at a later stage; true
    /// when that changed how it stops.
    pub fn request_drain(&self, drain: Drain) -> bool {
        self.drain.send_if_modified(|now| {
            let later = drain > *now;
            if later {
                *now = drain;
            }
            later
        })
    }

    /// How the proxy stops now.
    pub fn draining(&self) -> Drain {
        *self.drain.borrow()
    }

    /// Resolves once `serve` accepts clients.
    pub async fn accepting(&self) {
        let mut accepting = self.accepting.subscribe();
        let _ = accepting.wait_for(|a| *a).await;
    }

    /// A new client's cancel key and slot. The key's first half carries this process's ID in
    /// its low bits (see `handover::pid_of_key`): after an online restart the new process,
    /// which then receives every cancel request, knows which process owns the session.
    pub(crate) fn register_cancel(&self) -> ((i32, i32), CancelSlot) {
        let slot: CancelSlot = Arc::new(Mutex::new(CancelState::default()));
        let mut cancels = self.cancels.lock().expect("cancel lock");
        let pid = std::process::id() & crate::handover::PID_MASK;
        loop {
            let high = rand::random::<u32>() & !crate::handover::PID_MASK & 0x7fff_ffff;
            let key = ((high | pid) as i32, rand::random::<i32>());
            if let std::collections::hash_map::Entry::Vacant(e) = cancels.entry(key) {
                e.insert(Arc::clone(&slot));
                return (key, slot);
            }
        }
    }

    pub(crate) fn unregister_cancel(&self, key: (i32, i32)) {
        self.cancels.lock().expect("cancel lock").remove(&key);
    }

    pub(crate) fn cancel_target(&self, key: (i32, i32)) -> Option<CancelTarget> {
        let slot = self
            .cancels
            .lock()
            .expect("cancel lock")
            .get(&key)
            .cloned()?;

        let mut state = slot.lock().expect("cancel slot lock");
        state.requests += 1;
        state.target.clone()
    }
}

impl Proxy {
    /// ParameterStatus values to report at login: those the primary sent the pool's newest
    /// connection (a checkout only before there was one).
    pub async fn server_params(
        &self,
        database: &str,
        login: Option<&ServerLogin>,
    ) -> anyhow::Result<Vec<(String, String)>> {
        let config = self.config();
        let node = self
            .nodes
            .pick(Target::Primary)
            .ok_or_else(|| anyhow::anyhow!(no_primary()))?;
        let pool = node.pool(database, login, config.pool_limits());
        // Known once the pool opened a connection: a login does not wait for a busy pool.
        if let Some(params) = pool.server_params() {
            return Ok(params.to_vec());
        }
        let acquired = pool
            .acquire(
                &node.url,
                login,
                config.acquire_timeout,
                config.connect_timeout,
            )
            .await;
        let mut conn = match acquired {
            Ok(conn) => conn,
            Err(e) => {
                // A database the server does not have (or refuses) leaves no pool behind.
                drop(pool);
                node.drop_unused_pool(database, login);
                return Err(e.into());
            }
        };
        let params = conn.server_params.clone();
        conn.release();
        Ok(params)
    }
}

/// The error a client gets when no node is a reachable primary.
pub(crate) fn no_primary() -> String {
    "no primary is reachable: every configured node is down or in recovery; check /status on the admin port".into()
}

impl crate::backend::monitor::Monitored for Proxy {
    fn nodes(&self) -> &Nodes {
        &self.nodes
    }

    fn watcher(&self) -> &crate::backend::replay::Watcher {
        &self.causal.watcher
    }

    fn config(&self) -> Arc<Config> {
        Proxy::config(self)
    }
}
