//! Serving a proxy: the first health checks, a monitor per node, the pool reaper, the admin port,
//! then the accept loop with its drain on shutdown. The top of the crate: it starts every layer
//! and is imported by none.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::proxy::Proxy;

/// How long a draining proxy waits for open sessions before it exits anyway.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);

impl Proxy {
    /// Serves clients until `shutdown` turns true, then drains.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        outer: watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        let mut shutdown = self.shutdown_signal(outer);
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
                        match crate::frontend::handshake::handle_client(proxy, stream, stop, crate::admin::console::serve).await {
                            Err(e) if e.is_routine() => tracing::debug!(%peer, "client session ended: {e}"),
                            Err(e) => tracing::info!(%peer, "client session ended: {e}"),
                            Ok(()) => {}
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

    /// The drain signal of sessions, monitors and the admin port: `outer` (SIGTERM, a test)
    /// or SHUTDOWN on the admin console, whichever comes first.
    fn shutdown_signal(&self, mut outer: watch::Receiver<bool>) -> watch::Receiver<bool> {
        let (drain, signal) = watch::channel(*outer.borrow());
        let mut console = self.shutdown_requested.subscribe();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    changed = outer.changed() => if changed.is_err() || *outer.borrow() { break },
                    changed = console.changed() => if changed.is_err() || *console.borrow() { break },
                    _ = drain.closed() => return,
                }
            }
            let _ = drain.send(true);
        });
        signal
    }
}
