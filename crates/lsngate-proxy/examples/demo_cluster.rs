//! Starts a throwaway cluster (primary + 2 replicas, from lsngate-cluster) and an lsngate proxy
//! in front of it (user `postgres` may use the admin console), prints the URLs, and runs until
//! Ctrl-C. For trying the proxy by hand:
//! `cargo run -p lsngate-proxy --example demo_cluster [APPLY_DELAY_MS]` — a delay
//! (`recovery_min_apply_delay` on the replicas) makes stale reads easy to see.

use std::time::Duration;

use lsngate_cluster::{Cluster, ClusterConfig};
use lsngate_proxy::{Config, FileConfig, Proxy};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber_init();
    let delay: u64 = match std::env::args().nth(1) {
        Some(ms) => ms.parse().map_err(|_| {
            anyhow::anyhow!("APPLY_DELAY_MS must be a number of milliseconds, got {ms:?}")
        })?,
        None => 0,
    };
    let cluster = Cluster::start(
        &ClusterConfig::default()
            .replicas(2)
            .apply_delay(Duration::from_millis(delay)),
    )?;
    cluster.wait_streaming(Duration::from_secs(30))?;
    let file = FileConfig {
        listen: Some("127.0.0.1:6432".parse()?),
        admin_listen: Some("127.0.0.1:9187".parse()?),
        primary: Some(cluster.primary_url()),
        replicas: cluster.replica_urls(),
        admin_users: vec!["postgres".into()],
        ..Default::default()
    };
    let config = Config::build(file)?;
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    println!("primary   {}", cluster.primary_url());
    for url in cluster.replica_urls() {
        println!("replica   {url}");
    }
    println!("proxy     postgres://postgres@127.0.0.1:6432/postgres");
    println!("admin     http://127.0.0.1:9187/status  http://127.0.0.1:9187/metrics");
    println!("console   psql -h 127.0.0.1 -p 6432 -U postgres lsngate -c 'SHOW POOLS'");
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        // Ctrl-C or SIGTERM: return normally, so the cluster is torn down.
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        let _ = stop.send(true);
    });
    Proxy::new(config).serve(listener, stop_rx).await
}

fn tracing_subscriber_init() {
    // The proxy library never installs a subscriber; this demo logs to stderr per RUST_LOG.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
}
