//! Serving a proxy: the first health checks, a monitor per node, the pool reaper, the admin port,
//! then the accept loop with its drain on shutdown. The top of the crate: it starts every layer
//! and is imported by none.
//!
//! A drain (see [`Drain`]) stops the accept loop at once; then `WaitForServers` closes each
//! client once its transaction is over, `WaitForClients` lets clients stay until they leave,
//! and either ends, past `shutdown_timeout_ms`, with 57P01 for every client left. The monitors,
//! the reaper and the admin port run until the last client is gone: a client that stays still
//! reads from replicas.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::proxy::{Drain, Proxy};

/// How long sessions ended past the drain's bound have to send their 57P01 and go.
const FAREWELL_LIMIT: Duration = Duration::from_secs(5);

/// What a client ended by the drain's bound is told.
const DRAIN_EXPIRED: &str =
    "terminating connection: lsngate proxy is shutting down and shutdown_timeout_ms has passed";

impl Proxy {
    /// Serves clients until `outer` turns true (a `WaitForServers` drain) or a drain is
    /// requested otherwise ([`Proxy::request_drain`]), then drains.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        outer: watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        self.follow_outer(outer);
        // Background work (monitors, reaper, sampler, topology) stops when serving is over.
        let (stop_tx, shutdown) = watch::channel(false);
        // Sessions close once idle when this turns true (a `WaitForServers` drain).
        let (close_tx, close) = watch::channel(false);
        let config = self.config();
        let check_timeout = config.connect_timeout;
        // Patroni's members, not the template URL, are checked first (one bounded poll).
        let mut follower = crate::topology::Follower::new(config.topology.settle_polls);
        if config.topology.source == crate::config::TopologySource::Patroni {
            crate::topology::poll_once(&self, &mut follower).await;
        }
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
        tokio::spawn(crate::topology::follow(
            Arc::clone(&self),
            follower,
            shutdown.clone(),
        ));
        let (reaped, stop) = (Arc::clone(&self), shutdown.clone());
        tokio::spawn(async move {
            crate::backend::pool::reap(&reaped.nodes, || reaped.config().pool_limits(), stop).await
        });
        let (sampled, mut stop) = (Arc::clone(&self), shutdown.clone());
        tokio::spawn(async move {
            // The history's one sampler (memory bounded by its ring, see causal::history).
            loop {
                sampled.causal.observe_history(&sampled.nodes);
                tokio::select! {
                    _ = crate::timer::sleep(crate::causal::history::POINT_EVERY) => {}
                    _ = stop.changed() => if *stop.borrow() { return },
                }
            }
        });
        let (sampled, mut stop) = (Arc::clone(&self), shutdown.clone());
        tokio::spawn(async move {
            // SHOW STATS' periods: the first begins now, each ends after the stats_period_ms
            // the config says when it began (a reload applies from the next period on).
            loop {
                let totals = sampled.database_stats();
                sampled
                    .stats_periods
                    .lock()
                    .expect("stats lock")
                    .ended(std::time::Instant::now(), totals);
                tokio::select! {
                    _ = crate::timer::sleep(sampled.config().stats_period) => {}
                    _ = stop.changed() => if *stop.borrow() { return },
                }
            }
        });
        let mut listening = vec![listener.as_fd().try_clone_to_owned()?];
        if let Some(admin) = config.admin_listen {
            let inherited = self.admin_socket.lock().expect("admin socket lock").take();
            let admin_listener = match inherited {
                Some(socket) => {
                    socket.set_nonblocking(true)?;
                    TcpListener::from_std(socket)?
                }
                None => TcpListener::bind(admin).await?,
            };
            listening.push(admin_listener.as_fd().try_clone_to_owned()?);
            tokio::spawn(crate::admin::serve(
                Arc::clone(&self),
                admin_listener,
                self.admin_stop(shutdown.clone()),
            ));
        }
        *self.listening.lock().expect("listening lock") = listening;
        let mut drain = self.drain.subscribe();
        let mut sessions = JoinSet::new();
        self.accepting.send_replace(true);
        while *drain.borrow_and_update() == Drain::Serving {
            tokio::select! {
                accepted = listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(a) => a,
                        Err(e) => { tracing::warn!("accept failed: {e}"); continue; }
                    };
                    let proxy = Arc::clone(&self);
                    let close = close.clone();
                    sessions.spawn(async move {
                        match crate::frontend::handshake::handle_client(proxy, stream, close, crate::admin::console::serve).await {
                            Err(e) if e.is_routine() => tracing::debug!(%peer, "client session ended: {e}"),
                            Err(e) => tracing::info!(%peer, "client session ended: {e}"),
                            Ok(()) => {}
                        }
                    });
                }
                _ = drain.changed() => {}
                Some(_) = sessions.join_next(), if !sessions.is_empty() => {}
            }
        }
        // Closing a socket handed over closes this process's descriptor only: the new process
        // accepts from the same queue.
        drop(listener);
        self.listening.lock().expect("listening lock").clear();
        crate::notify::tell("STOPPING=1");
        tracing::info!(
            clients = sessions.len(),
            drain = self.draining().name(),
            "stopped accepting; draining"
        );
        let mut expired = std::pin::pin!(crate::timer::sleep(config.shutdown_timeout));
        loop {
            if *drain.borrow_and_update() == Drain::WaitForServers {
                close_tx.send_replace(true);
            }
            tokio::select! {
                joined = sessions.join_next() => if joined.is_none() { break },
                _ = drain.changed() => {}
                () = &mut expired => {
                    let ended = self.registry.end_all(DRAIN_EXPIRED);
                    tracing::warn!(clients = ended, "shutdown_timeout_ms passed: the clients left are disconnected");
                    let _ = crate::timer::timeout(FAREWELL_LIMIT, async {
                        while sessions.join_next().await.is_some() {}
                    })
                    .await;
                    break;
                }
            }
        }
        stop_tx.send_replace(true);
        Ok(())
    }

    /// Follows `outer` (a test's stop, `run`'s caller): true asks for a `WaitForServers` drain.
    fn follow_outer(self: &Arc<Self>, mut outer: watch::Receiver<bool>) {
        let proxy = Arc::downgrade(self);
        tokio::spawn(async move {
            if outer.wait_for(|stop| *stop).await.is_ok()
                && let Some(proxy) = proxy.upgrade()
            {
                proxy.request_drain(Drain::WaitForServers);
            }
        });
    }

    /// The admin port's stop: serving is over, or a new process took the port over.
    fn admin_stop(&self, mut shutdown: watch::Receiver<bool>) -> watch::Receiver<bool> {
        let (stop, signal) = watch::channel(false);
        let mut handed_over = self.handed_over.subscribe();
        tokio::spawn(async move {
            tokio::select! {
                _ = shutdown.wait_for(|s| *s) => {}
                _ = handed_over.wait_for(|h| *h) => {}
                _ = stop.closed() => return,
            }
            let _ = stop.send(true);
        });
        signal
    }
}
