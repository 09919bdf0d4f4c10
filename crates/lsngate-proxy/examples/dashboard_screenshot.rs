//! Takes the README's screenshot of the admin port's `/dashboard` (not a test): starts a primary
//! and 2 replicas (lsngate-cluster; replay held back by `APPLY_DELAY_MS`, 20 by default, so waits and
//! lag show), a proxy on loopback ports, a small load of insert-then-read sessions, and while the
//! load runs opens the page in Debian's headless Chromium driven by playwright-core from node
//! (both from scripts/install/http.sh; the package is crates/lsngate-http/e2e's).
//!
//! `cargo run -p lsngate-proxy --example dashboard_screenshot -- crates/lsngate-proxy/docs/dashboard.png [APPLY_DELAY_MS]`

use std::process::Command;
use std::time::Duration;

use lsngate_cluster::{Cluster, ClusterConfig};
use lsngate_proxy::{Config, FileConfig, Proxy};

/// Opens the page in Debian's Chromium with playwright-core (from crates/lsngate-http/e2e), waits
/// in real time for 8 refreshes and 20 chart points (20 s of load on the charts of the last 15
/// minutes), and saves a 1200x1150 screenshot. Arguments: URL, PNG path.
const SHOOT: &str = r#"
import { chromium } from 'playwright-core';
const [url, out] = process.argv.slice(1);
const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium', headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--no-first-run'],
});
try {
  const page = await browser.newPage({ viewport: { width: 1200, height: 1150 } });
  await page.goto(url);
  await page.waitForFunction(() => Number(document.getElementById('refreshes').textContent) >= 8
                             && Number(document.getElementById('history-points').textContent) >= 20,
                             null, { timeout: 60000 });
  await page.screenshot({ path: out });
  console.log('refreshes ' + await page.textContent('#refreshes'));
} finally {
  await browser.close();
}
"#;
/// Concurrent sessions of the load.
const SESSIONS: usize = 4;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let out =
        std::path::absolute(args.next().ok_or_else(|| {
            anyhow::anyhow!("usage: dashboard_screenshot OUT.png [APPLY_DELAY_MS]")
        })?)?;
    let delay: u64 = match args.next() {
        Some(ms) => ms.parse().map_err(|_| {
            anyhow::anyhow!("APPLY_DELAY_MS must be a number of milliseconds, got {ms:?}")
        })?,
        None => 20,
    };
    let cluster = Cluster::start(
        &ClusterConfig::default()
            .replicas(2)
            .apply_delay(Duration::from_millis(delay)),
    )?;
    cluster.wait_streaming(Duration::from_secs(30))?;
    cluster
        .primary()
        .sql("CREATE TABLE dashboard_demo (id bigint PRIMARY KEY, v int)")?;
    cluster.wait_caught_up(Duration::from_secs(30))?;

    let admin = free_port()?;
    let file = FileConfig {
        listen: Some("127.0.0.1:0".parse()?),
        admin_listen: Some(admin),
        primary: Some(cluster.primary_url()),
        replicas: cluster.replica_urls(),
        pool_size: Some(8),
        ..Default::default()
    };
    let config = Config::build(file)?;
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    let port = listener.local_addr()?.port();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let proxy = tokio::spawn(Proxy::new(config).serve(listener, stop_rx));

    let (load_stop, _) = tokio::sync::watch::channel(false);
    let conninfo = format!("host=127.0.0.1 port={port} user=postgres dbname=postgres");
    let mut load = Vec::new();
    for session in 0..SESSIONS as i64 {
        let conninfo = conninfo.clone();
        let mut stopped = load_stop.subscribe();
        load.push(tokio::spawn(async move {
            let (client, connection) =
                tokio_postgres::connect(&conninfo, tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            let mut id = session * 1_000_000;
            while !*stopped.borrow_and_update() {
                id += 1;
                client
                    .execute("INSERT INTO dashboard_demo VALUES ($1, 1)", &[&id])
                    .await?;
                client
                    .query("SELECT v FROM dashboard_demo WHERE id = $1", &[&id])
                    .await?;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            anyhow::Ok(())
        }));
    }

    let url = format!("http://{admin}/dashboard");
    let e2e = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../lsngate-http/e2e");
    let shown = out.clone();
    // Real time, not Chromium's virtual clock: the per-second rates need the load to move
    // between two polls.
    let shot = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .args(["--input-type=module", "-e", SHOOT])
            .arg(&url)
            .arg(&out)
            .current_dir(&e2e)
            .output()
    })
    .await?
    .map_err(|e| anyhow::anyhow!("cannot run node: {e}; scripts/install/http.sh installs it"))?;
    anyhow::ensure!(
        shot.status.success(),
        "the screenshot failed (playwright-core and chromium come from scripts/install/http.sh): {}",
        String::from_utf8_lossy(&shot.stderr)
    );
    println!(
        "dashboard at {admin} rendered to {} ({})",
        shown.display(),
        String::from_utf8_lossy(&shot.stdout).trim()
    );

    let _ = load_stop.send(true);
    for task in load {
        task.await??;
    }
    let _ = stop.send(true);
    proxy.await??;
    Ok(())
}

/// A loopback address with a port nobody listens on right now, for the admin port.
fn free_port() -> anyhow::Result<std::net::SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}
