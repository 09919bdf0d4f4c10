//! The admin HTTP port: `GET /metrics` (Prometheus text from the `metrics` facade, plus pool and
//! node gauges refreshed at scrape time) and `GET /status` (JSON: nodes, roles, health, pools,
//! clients). A deliberately tiny HTTP/1.1 responder — one request per connection, GET only — not
//! a web framework.

use std::sync::{Arc, OnceLock};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::frontend::Proxy;

static PROMETHEUS: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the process-wide Prometheus recorder (once); None if another recorder won.
pub fn prometheus() -> Option<&'static PrometheusHandle> {
    PROMETHEUS
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok().map(|_| handle)
        })
        .as_ref()
}

/// The /status document.
pub fn status(proxy: &Proxy) -> serde_json::Value {
    let nodes: Vec<_> = proxy
        .nodes
        .all
        .iter()
        .map(|n| {
            let pools: Vec<_> = n
                .pool_stats()
                .into_iter()
                .map(|(db, open, idle, size)| serde_json::json!({"database": db, "open": open, "idle": idle, "size": size}))
                .collect();
            serde_json::json!({
                "index": n.index,
                "address": n.url.address(),
                "role": n.role(),
                "healthy": n.healthy(),
                "last_error": *n.last_error.lock().expect("error lock"),
                "pools": pools,
            })
        })
        .collect();
    let config = proxy.config();
    serde_json::json!({
        "clients": proxy.client_count(),
        "pool_mode": config.pool_mode,
        "nodes": nodes,
    })
}

fn refresh_gauges(proxy: &Proxy) {
    for n in &proxy.nodes.all {
        let address = n.url.address();
        let role = format!("{:?}", n.role()).to_lowercase();
        metrics::gauge!("lsngate_proxy_node_up", "node" => address.clone(), "role" => role)
            .set(if n.healthy() { 1.0 } else { 0.0 });
        for (db, open, idle, size) in n.pool_stats() {
            let labels = [("node", address.clone()), ("database", db)];
            metrics::gauge!("lsngate_proxy_pool_open_connections", &labels).set(open as f64);
            metrics::gauge!("lsngate_proxy_pool_idle_connections", &labels).set(idle as f64);
            metrics::gauge!("lsngate_proxy_pool_size", &labels).set(size as f64);
        }
    }
    metrics::gauge!("lsngate_proxy_connected_clients").set(proxy.client_count() as f64);
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

async fn respond(proxy: &Proxy, mut stream: TcpStream) -> std::io::Result<()> {
    let mut request = Vec::new();
    let mut chunk = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 8192 {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&chunk[..n]);
    }
    let line = String::from_utf8_lossy(&request)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    let path = line.split_whitespace().nth(1).unwrap_or("/");
    let (code, content_type, body) = match path {
        "/metrics" => {
            refresh_gauges(proxy);
            let text = prometheus()
                .map(|h| h.render())
                .unwrap_or_else(|| "# metrics recorder unavailable\n".into());
            ("200 OK", "text/plain; version=0.0.4", text)
        }
        "/status" => (
            "200 OK",
            "application/json",
            serde_json::to_string_pretty(&status(proxy)).unwrap_or_default(),
        ),
        _ => (
            "404 Not Found",
            "text/plain",
            "try /metrics or /status\n".to_string(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {code}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}
