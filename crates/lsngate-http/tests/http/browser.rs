//! The demo app end to end in Debian's headless Chromium, driven by playwright-core
//! (`e2e/drive.mjs`): a real cluster whose replicas replay 200 ms late, the real app on
//! 127.0.0.1, real form posts, redirects and cookies.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lsngate_cluster::{Cluster, ClusterConfig};
use serde::Deserialize;
use tokio::sync::watch;

use crate::demo_app::{self, Demo};

/// What one page showed; every field is printed when an assertion fails.
#[allow(dead_code)]
#[derive(Debug, Deserialize)]
struct Seen {
    expected: String,
    status: Option<String>,
    seen: Option<String>,
    served: String,
    wait_ms: Option<f64>,
    fresh: bool,
}

#[derive(Debug, Deserialize)]
struct Drive {
    edits: Vec<Seen>,
    creates: Vec<Seen>,
}

fn e2e_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e")
}

/// Runs `e2e/drive.mjs` against the app and parses what the browser saw.
async fn drive(base: &str, mode: &str, cycles: usize, shots: Option<&Path>) -> Drive {
    assert!(
        e2e_dir().join("node_modules/playwright-core").is_dir(),
        "playwright-core is not installed in {}: run scripts/install/http.sh",
        e2e_dir().display()
    );
    let mut command = tokio::process::Command::new("node");
    command
        .current_dir(e2e_dir())
        .arg("drive.mjs")
        .arg(base)
        .arg(mode)
        .arg(cycles.to_string());
    if let Some(dir) = shots {
        command.arg(dir);
    }
    let output = command
        .output()
        .await
        .expect("node not found: run scripts/install/http.sh");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "drive.mjs {mode} failed: {stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("drive.mjs printed {stdout:?}: {e}"))
}

struct Running {
    base: String,
    stop: watch::Sender<bool>,
    cluster: Cluster,
}

async fn start_demo(delay: Duration) -> Running {
    let cluster = tokio::task::spawn_blocking(move || {
        Cluster::start(&ClusterConfig::default().replicas(2).apply_delay(delay))
    })
    .await
    .unwrap()
    .expect("start a cluster with delayed replicas");
    let db = demo_app::data::Db::connect(&cluster.primary_url(), &cluster.replica_urls())
        .await
        .unwrap();
    let demo = Arc::new(Demo::new(db));
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(demo_app::jobs::run(
        demo.clone(),
        cluster.primary_url(),
        stopped,
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = demo_app::router(demo, b"browser test key");
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Running {
        base,
        stop,
        cluster,
    }
}

/// Waits until the worker has run every job, then counts (with token: found, missed) and
/// (without token: found, missed).
async fn job_results(primary_url: &str) -> [(i64, i64); 2] {
    let (client, connection) = tokio_postgres::connect(primary_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let queued: i64 = client
            .query_one("SELECT count(*) FROM jobs WHERE done_at IS NULL", &[])
            .await
            .unwrap()
            .get(0);
        if queued == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{queued} jobs still queued after 60 s: the worker is stuck"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let count = |with_token: bool, found: bool| {
        let client = &client;
        async move {
            let sql = "SELECT count(*) FROM jobs WHERE (payload ? 'token') = $1 AND found = $2";
            client
                .query_one(sql, &[&with_token, &found])
                .await
                .unwrap()
                .get::<_, i64>(0)
        }
    };
    [
        (count(true, true).await, count(true, false).await),
        (count(false, true).await, count(false, false).await),
    ]
}

fn stale(seen: &[Seen]) -> Vec<&Seen> {
    seen.iter().filter(|s| !s.fresh).collect()
}

/// With the token: all 50 edits and all 10 creates show the new value.
fn assert_every_page_fresh(fixed: &Drive) {
    assert_eq!((fixed.edits.len(), fixed.creates.len()), (50, 10));
    assert_eq!(
        stale(&fixed.edits).len(),
        0,
        "stale pages with the token: {:?}",
        stale(&fixed.edits)
    );
    assert_eq!(
        stale(&fixed.creates).len(),
        0,
        "missing new items with the token: {:?}",
        stale(&fixed.creates)
    );
    let by_replica = fixed
        .edits
        .iter()
        .filter(|s| s.served.starts_with("replica"))
        .count();
    let mut waits: Vec<f64> = fixed.edits.iter().filter_map(|s| s.wait_ms).collect();
    waits.sort_by(f64::total_cmp);
    eprintln!(
        "fixed: 50/50 fresh, {by_replica} served by a replica, wait p50 {:.1} ms, max {:.1} ms",
        waits.get(waits.len() / 2).unwrap_or(&f64::NAN),
        waits.last().unwrap_or(&f64::NAN)
    );
}

/// Without the token the browser must see old values, or the fixed run proves nothing.
fn assert_some_pages_stale(naive: &Drive) {
    let stale_edits = stale(&naive.edits).len();
    let missing = naive
        .creates
        .iter()
        .filter(|s| s.status.as_deref() == Some("missing"))
        .count();
    eprintln!("naive: {stale_edits}/20 edits stale, {missing}/10 new items not found");
    assert!(
        stale_edits > 0,
        "naive mode never showed a stale page: the browser test cannot fail"
    );
    assert!(naive.edits.iter().all(|s| s.served.starts_with("replica")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_sees_every_write_with_the_token_and_stale_pages_without() {
    let demo = start_demo(Duration::from_millis(200)).await;
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("lsngate-demo-shots");
    std::fs::create_dir_all(&shots).unwrap();

    let fixed = drive(&demo.base, "fixed", 50, Some(&shots)).await;
    assert_every_page_fresh(&fixed);

    // The same clicks without the token: the browser must see old values, or the test above
    // proves nothing.
    let naive_shots = shots.join("naive");
    std::fs::create_dir_all(&naive_shots).unwrap();
    let naive = drive(&demo.base, "naive", 20, Some(&naive_shots)).await;
    assert_some_pages_stale(&naive);

    let primary = demo.cluster.primary_url();
    let [(token_found, token_missed), (naive_found, naive_missed)] = job_results(&primary).await;
    eprintln!(
        "jobs with token: {token_found} found, {token_missed} missed; without: {naive_found} found, {naive_missed} missed"
    );
    assert_eq!(
        (token_found, token_missed),
        (10, 0),
        "the worker must find every row it was given a token for"
    );
    assert!(
        naive_missed > 0,
        "tokenless jobs never missed their row: the job check cannot fail"
    );

    // The README picture: the same item saved fixed then naive, and the request log.
    let showcase = drive(&demo.base, "showcase", 6, Some(&shots)).await;
    let fixed_half = &showcase.edits[..6];
    assert_eq!(stale(fixed_half).len(), 0, "{fixed_half:?}");
    eprintln!("screenshots in {}", shots.display());
    let _ = demo.stop.send(true);
}
