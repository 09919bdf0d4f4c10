//! The lsngate demo: a small web app over a local primary and two streaming replicas that replay
//! 200 ms late, so stale reads are easy to see. Open the printed URL, create and edit items, and
//! flip the toggle between "naive" (no token: the page after Save often shows the old value) and
//! "fixed" (the token layer carries the write's position to the next read).
//!
//! ```text
//! cargo run -p lsngate-http --example demo -- [--port 3000] [--delay-ms 200]
//! ```

mod app;

use std::sync::Arc;
use std::time::Duration;

use lsngate_cluster::{Cluster, ClusterConfig};
use tokio::sync::watch;

fn option(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} takes a number, got {v}"))
        })
        .unwrap_or(default)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    if std::env::args().any(|a| a == "--help" || a == "-h") {
        println!(
            "lsngate demo\n  --port N       HTTP port on 127.0.0.1 (default 3000)\n  --delay-ms N   replicas' recovery_min_apply_delay in milliseconds (default 200)"
        );
        return Ok(());
    }
    let port = option("--port", 3000);
    let delay = Duration::from_millis(option("--delay-ms", 200));
    println!("starting PostgreSQL: a primary and 2 replicas replaying {delay:?} late ...");
    let cluster = tokio::task::spawn_blocking(move || {
        Cluster::start(&ClusterConfig::default().replicas(2).apply_delay(delay))
    })
    .await??;
    let db = app::data::Db::connect(&cluster.primary_url(), &cluster.replica_urls()).await?;
    let demo = Arc::new(app::Demo::new(db));
    let (stop, stopped) = watch::channel(false);
    let worker = tokio::spawn(app::jobs::run(demo.clone(), cluster.primary_url(), stopped));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port as u16)).await?;
    println!(
        "lsngate demo on http://{}/  (Ctrl-C stops it and the cluster)",
        listener.local_addr()?
    );
    let key: Vec<u8> = (0..32).map(|_| rand_byte()).collect();
    axum::serve(listener, app::router(demo, &key))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    let _ = stop.send(true);
    let _ = worker.await;
    drop(cluster);
    Ok(())
}

/// A signing-key byte: the demo's key only has to differ between runs.
fn rand_byte() -> u8 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now()) as u8
}
