//! The admin port's `/dashboard` rendered by Debian's headless Chromium (`/usr/bin/chromium`,
//! installed by scripts/install/http.sh): the page is loaded with `--dump-dom` under a virtual
//! time budget, so its 500 ms polling of `/status` runs several times before the DOM is read.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use lsngate_cluster::shared_cluster;

const CHROMIUM: &str = "/usr/bin/chromium";

/// Loads `url` in headless Chromium, lets the page run for `budget_ms` of virtual time (network
/// fetches pause that clock, so every poll completes), and returns the serialized DOM.
pub(crate) fn rendered_dom(url: &str, budget_ms: u64) -> String {
    let dir = tempfile::tempdir().expect("a temp dir for the Chromium profile");
    let dom_path = dir.path().join("dom.html");
    let log_path = dir.path().join("chromium.log");
    let mut command = Command::new(CHROMIUM);
    command
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
        ])
        .arg(format!(
            "--user-data-dir={}",
            dir.path().join("profile").display()
        ))
        .arg(format!("--virtual-time-budget={budget_ms}"))
        .arg("--dump-dom")
        .arg(url)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&dom_path).unwrap())
        .stderr(std::fs::File::create(&log_path).unwrap());
    let mut child = command.spawn().unwrap_or_else(|e| {
        panic!("cannot run {CHROMIUM}: {e}; scripts/install/http.sh installs Debian's chromium")
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{CHROMIUM} did not finish rendering {url} within 120 s\n{}",
                read(&log_path)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        status.success(),
        "{CHROMIUM} failed ({status}) rendering {url}\n{}",
        read(&log_path)
    );
    read(&dom_path)
}

fn read(path: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}

/// The text of the first element after `marker` (an attribute such as `id="refreshes"`).
fn text_after<'a>(html: &'a str, marker: &str) -> Option<&'a str> {
    let at = html.find(marker)?;
    let open = at + html[at..].find('>')? + 1;
    let close = open + html[open..].find('<')?;
    Some(html[open..close].trim())
}

/// The markup of the table row carrying `attribute` (e.g. `data-replica="127.0.0.1:5433"`).
fn row<'a>(html: &'a str, attribute: &str) -> Option<&'a str> {
    let at = html.find(&format!("<tr {attribute}"))?;
    let end = at + html[at..].find("</tr>")?;
    Some(&html[at..end])
}

fn field<'a>(row: &'a str, name: &str) -> &'a str {
    text_after(row, &format!("data-field=\"{name}\""))
        .unwrap_or_else(|| panic!("no data-field={name} in {row}"))
}

/// `X/Y` (hexadecimal halves) as a number; None if the text is not an LSN.
fn lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.split_once('/')?;
    let hi = u64::from_str_radix(hi, 16).ok()?;
    let lo = u64::from_str_radix(lo, 16).ok()?;
    (lo <= u32::MAX as u64).then_some((hi << 32) | lo)
}

fn primary_position(status: &serde_json::Value) -> Option<u64> {
    status["causal"]["primary"]["position"]
        .as_str()
        .and_then(lsn)
}

/// Waits (at most 30 s) until /status satisfies `ready`; panics naming `what` otherwise.
fn wait_status(proxy: &TestProxy, what: &str, ready: impl Fn(&serde_json::Value) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = proxy.status();
        if ready(&s) {
            return;
        }
        assert!(Instant::now() < deadline, "waited 30 s for {what}: {s:#}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `n` times: insert a row through the proxy, then read it back (a read with the session's
/// commit as its floor).
fn writes_and_reads(proxy: &TestProxy, table: &str, from: i64, n: i64) {
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        for id in from..from + n {
            client
                .execute(&format!("INSERT INTO {table} (id) VALUES ({id})"), &[])
                .await
                .unwrap();
            let rows = client
                .query(&format!("SELECT id FROM {table} WHERE id = {id}"), &[])
                .await
                .unwrap();
            assert_eq!(rows.len(), 1, "session mode reads its own insert");
        }
    });
}

#[test]
fn chromium_renders_the_live_dashboard_from_status() {
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    let table = unique("dash");
    cluster
        .primary()
        .sql(&format!("CREATE TABLE {table} (id bigint PRIMARY KEY)"))
        .unwrap();
    caught_up(cluster);
    const READS: i64 = 20;
    writes_and_reads(&proxy, &table, 0, READS);
    // One write and read under a causal scope, on two connections.
    rt().block_on(async {
        let scoped = |sql: String| format!("/* lsngate_scope='user:7' */ {sql}");
        let writer = connect(&proxy.conninfo()).await;
        let reader = connect(&proxy.conninfo()).await;
        writer
            .batch_execute(&scoped(format!("INSERT INTO {table} (id) VALUES (-7)")))
            .await
            .unwrap();
        let rows = reader
            .simple_query(&scoped(format!("SELECT id FROM {table} WHERE id = -7")))
            .await
            .unwrap();
        assert!(
            rows.iter()
                .any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_)))
        );
    });
    let replicas = cluster.replicas().len();
    wait_status(&proxy, "every replica's replayed position", |s| {
        let views = s["causal"]["replicas"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        views.len() == replicas && views.iter().all(|r| r["replayed"].is_string())
    });

    let url = format!("http://{}/dashboard", proxy.admin);
    let dom = rendered_dom(&url, 4000);
    let after = proxy.status();
    let refreshes: u64 = text_after(&dom, "id=\"refreshes\"")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no refresh counter in the DOM:\n{dom}"));
    let first = text_after(&dom, "id=\"primary-position\"").unwrap_or_default();
    println!(
        "first load: {refreshes} refreshes, primary {first}, mode {:?}",
        text_after(&dom, "id=\"consistency\"")
    );
    assert!(
        refreshes >= 2,
        "the page must refresh itself from /status (refreshes = {refreshes})"
    );
    assert!(
        dom.contains("id=\"error\" role=\"alert\" hidden"),
        "the error line must stay hidden while /status answers:\n{dom}"
    );
    assert_eq!(text_after(&dom, "id=\"consistency\""), Some("session"));
    for replica in cluster.replicas() {
        let address = format!("127.0.0.1:{}", replica.port());
        let row = row(&dom, &format!("data-replica=\"{address}\""))
            .unwrap_or_else(|| panic!("replica {address} missing from the dashboard:\n{dom}"));
        let replayed = field(row, "replayed");
        println!(
            "{address}: replayed {replayed}, lag {} / {}, {} {}",
            field(row, "lag_bytes"),
            field(row, "lag_ms"),
            field(row, "role"),
            field(row, "healthy")
        );
        assert!(
            lsn(replayed).is_some(),
            "{address}: replayed {replayed:?} is not an X/Y position"
        );
        assert_eq!(field(row, "role"), "replica");
        assert_eq!(field(row, "healthy"), "healthy");
    }
    // The proxy is idle now: the page shows exactly the counters /status holds.
    let mut total = 0;
    for name in [
        "replica",
        "waited",
        "fallback",
        "no_replica",
        "stale",
        "error",
    ] {
        let row = row(&dom, &format!("data-outcome=\"{name}\""))
            .unwrap_or_else(|| panic!("outcome {name} missing from the dashboard:\n{dom}"));
        let shown: u64 = field(row, "count").parse().unwrap();
        println!("{name}: {shown} ({})", field(row, "rate"));
        assert_eq!(
            shown, after["causal"]["outcomes"][name],
            "{name} on the page vs /status"
        );
        total += shown;
    }
    let served = |name: &str| {
        text_after(
            row(&dom, &format!("data-outcome=\"{name}\"")).unwrap(),
            "data-field=\"count\"",
        )
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap()
    };
    assert!(
        total >= READS as u64,
        "{READS} reads with a floor were made, the page counts {total}"
    );
    assert!(
        served("replica") + served("waited") > 0,
        "replicas served some of the reads"
    );

    // The scopes panel shows what /status holds.
    let scopes = &after["causal"]["scopes"];
    assert_eq!(
        text_after(&dom, "id=\"scopes-tracked\""),
        Some("1"),
        "{scopes}"
    );
    assert_eq!(
        text_after(&dom, "id=\"scopes-capacity\"").map(str::to_string),
        Some(scopes["capacity"].to_string())
    );
    let mut scoped_reads = 0;
    for name in [
        "replica",
        "waited",
        "fallback",
        "no_replica",
        "stale",
        "error",
    ] {
        let row = row(&dom, &format!("data-scope-outcome=\"{name}\""))
            .unwrap_or_else(|| panic!("scope outcome {name} missing from the dashboard:\n{dom}"));
        let shown: u64 = field(row, "count").parse().unwrap();
        assert_eq!(
            shown, scopes["reads"]["outcomes"][name],
            "{name}: page vs /status"
        );
        scoped_reads += shown;
    }
    assert!(scoped_reads >= 1, "the read under user:7 is counted");

    // More writes move the primary; a second load shows the higher position.
    let first = lsn(first).unwrap_or_else(|| panic!("primary position {first:?} is not X/Y"));
    writes_and_reads(&proxy, &table, READS, 5);
    wait_status(&proxy, "a higher primary position", |s| {
        primary_position(s).is_some_and(|p| p > first)
    });
    let dom = rendered_dom(&url, 1500);
    let second = text_after(&dom, "id=\"primary-position\"").unwrap_or_default();
    println!("second load: primary {second}");
    assert!(
        lsn(second).is_some_and(|p| p > first),
        "second load: primary {second:?} should be past {first:#x}"
    );
}

/// Watching the proxy must not change it: `/status` (which the dashboard polls every 500 ms),
/// `/metrics` and `/budget.json` read the replicas' positions without counting as routing's
/// demand for them, so with no client reading the monitors stay at the health interval instead
/// of polling every node every `replay_poll_ms` (before the fix, the first /status switched
/// them to 20 ms and the dashboard kept them there).
#[test]
fn watching_the_admin_port_does_not_make_the_monitors_poll_fast() {
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    let health_interval = 200; // file_config's health_interval_ms
    // A bounded look: 30 rounds of the pages a dashboard and a scraper fetch.
    for _ in 0..30 {
        let status = proxy.status();
        proxy.http_get("/metrics");
        proxy.http_get("/budget.json");
        for node in status["nodes"].as_array().unwrap() {
            let period = node["poll_period_ms"].as_u64().unwrap();
            assert!(
                period == 0 || period == health_interval,
                "node {} polls every {period} ms with no client reading: {status:#}",
                node["address"]
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
