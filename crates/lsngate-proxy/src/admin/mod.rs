//! The admin side: the console (`console`, the virtual database `lsngate`/`pgbouncer` served
//! over the PostgreSQL protocol) and the HTTP port: `GET /metrics` (Prometheus text from the `metrics` facade, plus pool and
//! node gauges refreshed at scrape time), `GET /status` (JSON: nodes, roles, health, pools,
//! clients, causal reads, the budget advice), `GET /dashboard` (a self-contained HTML page that
//! polls /status and charts /history), `GET /budget` (the what-if page, polling /budget.json)
//! and `GET /history` (the last 15 minutes, for the charts).
//! A deliberately tiny HTTP/1.1 responder — one request per connection, GET only — not a web
//! framework.

pub(crate) mod budget;
pub(crate) mod console;

use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::proxy::Proxy;
use crate::tally::prometheus;

/// The live dashboard: one static page (markup, style and script inline, nothing fetched from
/// elsewhere) that polls `/status` every 500 ms; see `dashboard.html`.
const DASHBOARD: &str = include_str!("dashboard.html");

/// The /status document.
pub fn status(proxy: &Proxy) -> serde_json::Value {
    let nodes: Vec<_> = proxy
        .nodes
        .all()
        .iter()
        .map(|n| {
            let pools = n.pool_stats();
            serde_json::json!({
                "index": n.index,
                "address": n.url.address(),
                "role": n.role().as_str(),
                "healthy": n.healthy(),
                "last_error": *n.last_error.lock().expect("error lock"),
                "polls": n.polls.load(std::sync::atomic::Ordering::Relaxed),
                "poll_period_ms": n.poll_period_ms.load(std::sync::atomic::Ordering::Relaxed),
                "busy": n.busy(),
                "pools": pools,
            })
        })
        .collect();
    let config = proxy.config();
    serde_json::json!({
        "clients": proxy.client_count(),
        "pool_mode": config.pool_mode,
        "nodes": nodes,
        "causal": causal_status(proxy),
        "budget": budget::status(proxy),
        "topology": proxy.topology.status(proxy),
    })
}

/// The causal part of /status: mode, outcomes, waits, guard, and replay against the primary.
pub fn causal_status(proxy: &Proxy) -> serde_json::Value {
    let config = proxy.config();
    let causal = &proxy.causal;
    let (open, in_flight, rate) = causal.guard_state();
    let outcomes: serde_json::Map<_, _> = causal
        .stats
        .outcomes()
        .into_iter()
        .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
        .collect();
    let (buckets, total) = causal.stats.waits();
    let waits: Vec<_> = buckets
        .into_iter()
        .map(|(le, n)| serde_json::json!({"le_ms": le, "count": n}))
        .collect();
    serde_json::json!({
        "consistency": config.causal.consistency.to_string(),
        "wait_timeout_ms": config.causal.wait_timeout.as_millis() as u64,
        "fallback": format!("{:?}", config.causal.fallback).to_lowercase(),
        "outcomes": outcomes,
        "waits": waits,
        "wait_total_ms": total.as_secs_f64() * 1000.0,
        "breaker": {
            "open": open,
            "fallbacks_in_flight": in_flight,
            "fallback_rate": rate,
            "refused_reads": causal.stats.refused.count(),
            "rescued_reads": causal.stats.rescued.count(),
        },
        "primary": {
            "position": causal.watcher.primary_position().map(|l| l.to_string()),
            "timeline": proxy.nodes.newest_timeline.get(),
        },
        "replicas": causal.watcher.views(&proxy.nodes),
        "scopes": causal
            .scopes
            .status(config.causal.scopes, config.causal.scope_store.as_deref()),
    })
}

fn refresh_gauges(proxy: &Proxy) {
    for tally in proxy.queries.iter().chain([&proxy.passed_through]) {
        tally.report();
    }
    proxy.causal.stats.report();
    proxy.causal.scopes.report();
    for n in proxy.nodes.all().iter() {
        let address = n.url.address();
        let role = n.role().as_str();
        metrics::gauge!("lsngate_proxy_node_up", "node" => address.clone(), "role" => role)
            .set(if n.healthy() { 1.0 } else { 0.0 });
        metrics::gauge!("lsngate_proxy_node_busy_connections", "node" => address.clone())
            .set(n.busy() as f64);
        for pool in n.pool_stats() {
            let labels = [
                ("node", address.clone()),
                ("database", pool.database),
                ("role", pool.role),
            ];
            metrics::gauge!("lsngate_proxy_pool_open_connections", &labels).set(pool.open as f64);
            metrics::gauge!("lsngate_proxy_pool_idle_connections", &labels).set(pool.idle as f64);
            metrics::gauge!("lsngate_proxy_pool_size", &labels).set(pool.size as f64);
        }
    }
    metrics::gauge!("lsngate_proxy_connected_clients").set(proxy.client_count() as f64);
    let causal = &proxy.causal;
    for view in causal.watcher.views(&proxy.nodes) {
        let labels = [("node", view.address.clone())];
        if let Some(lsn) = view
            .replayed
            .as_deref()
            .and_then(|t| lsngate_core::Lsn::parse(t).ok())
        {
            metrics::gauge!("lsngate_proxy_replica_replayed_lsn", &labels).set(lsn.as_u64() as f64);
        }
        if let Some(bytes) = view.lag_bytes {
            metrics::gauge!("lsngate_proxy_replica_lag_bytes", &labels).set(bytes as f64);
        }
        if let Some(ms) = view.lag_ms {
            metrics::gauge!("lsngate_proxy_replica_lag_seconds", &labels).set(ms / 1000.0);
        }
    }
    if let Some(lsn) = causal.watcher.primary_position() {
        metrics::gauge!("lsngate_proxy_primary_lsn").set(lsn.as_u64() as f64);
    }
    let (open, in_flight, rate) = causal.guard_state();
    metrics::gauge!("lsngate_proxy_breaker_open").set(if open { 1.0 } else { 0.0 });
    metrics::gauge!("lsngate_proxy_fallbacks_in_flight").set(in_flight as f64);
    metrics::gauge!("lsngate_proxy_fallback_rate").set(rate);
}

/// Serves the admin port until shutdown.
pub async fn serve(proxy: Arc<Proxy>, listener: TcpListener, mut shutdown: watch::Receiver<bool>) {
    prometheus();
    loop {
        tokio::select! {
            accepted = listener.accept() => if let Ok((stream, _)) = accepted {
                let proxy = Arc::clone(&proxy);
                tokio::spawn(async move { let _ = respond(&proxy, stream).await; });
            },
            _ = shutdown.changed() => if *shutdown.borrow() { return },
        }
    }
}

async fn respond(proxy: &Proxy, stream: TcpStream) -> std::io::Result<()> {
    const KNOWN: &str = "/metrics, /status, /dashboard, /budget, /budget.json or /history";
    crate::whatif::answer(stream, KNOWN, |path| {
        let json = |value: serde_json::Value| serde_json::to_string(&value).unwrap_or_default();
        Some(match path {
            "/metrics" => {
                refresh_gauges(proxy);
                let text = prometheus()
                    .map(|h| h.render())
                    .unwrap_or_else(|| "# metrics recorder unavailable\n".into());
                ("text/plain; version=0.0.4", text)
            }
            "/status" => (
                "application/json",
                serde_json::to_string_pretty(&status(proxy)).unwrap_or_default(),
            ),
            "/dashboard" => ("text/html; charset=utf-8", DASHBOARD.to_string()),
            "/budget" => ("text/html; charset=utf-8", crate::whatif::PAGE.to_string()),
            "/budget.json" => ("application/json", json(budget::page_data(proxy))),
            "/history" => ("application/json", json(budget::history(proxy))),
            _ => return None,
        })
    })
    .await
}
