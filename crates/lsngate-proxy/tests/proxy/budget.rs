//! The budget advisor in the proxy, on a replica held 200 ms behind (`recovery_min_apply_delay`):
//! the advice in `/status` and the console's `SHOW BUDGET` comes from the lag the proxy observed
//! while a workload ran through it (a 20 ms budget serves ~none of the token reads from the
//! replica, 1 s ~all), and the `/budget` what-if page in headless Chromium, driven by
//! playwright-core like a user: dragging the TIMEOUT slider changes the numbers shown, dragging
//! the token changes which replica qualifies; and the dashboard's charts of the last 15 minutes
//! carry the workload's points. Asserts on the advice's outcome, never on timing.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::*;
use lsngate_cluster::{Cluster, ClusterConfig};
use lsngate_proxy::config::UserEntry;

/// The playwright-core package scripts/install/http.sh installs.
const PLAYWRIGHT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../lsngate-http/e2e");

/// Opens /budget, waits until it shows advice, then drags the TIMEOUT slider to the stop nearest
/// the low budget and prints what the page shows, then to the high one; then drags the token past
/// the primary (no replica qualifies), before the replicas (every one does), then with
/// "simulate" on past the primary again and the replica up to it. One JSON line per state.
const DRIVE: &str = r#"
import { chromium } from 'playwright-core';
const [url, low, high, shot] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium', headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--no-first-run'],
});
const shown = async (page, what) => console.log(JSON.stringify({
  what,
  budget: await page.textContent('#budget-ms'),
  share: await page.textContent('#share'),
  fallbacks: await page.textContent('#fallbacks'),
  held_mean: await page.textContent('#held-mean'),
  held_p99: await page.textContent('#held-p99'),
  recommended: await page.textContent('#recommended'),
  qualifies: await page.$$eval('li[data-replica]', (li) => li.map((l) => l.dataset.qualifies)),
  curves: await page.$$eval('#cdf polyline', (p) => p.length),
}));
try {
  const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
  await page.goto(url);
  await page.waitForFunction(() => Number(document.getElementById('refreshes').textContent) >= 2
    && document.getElementById('share').textContent.endsWith('%'), null, { timeout: 30000 });
  const stops = await page.evaluate(async () =>
    (await (await fetch('/budget.json')).json()).slider.map((r) => r.budget_ms));
  const slider = await page.$('#timeout');
  const box = await slider.boundingBox();
  const thumb = 8;
  const xOf = (i) => box.x + thumb + (box.width - 2 * thumb) * i / (stops.length - 1);
  const nearest = (ms) => stops.reduce((b, s, i) =>
    Math.abs(Math.log(s / ms)) < Math.abs(Math.log(stops[b] / ms)) ? i : b, 0);
  const y = box.y + box.height / 2;
  const current = Number(await slider.inputValue());
  await page.mouse.move(xOf(current), y);
  await page.mouse.down();
  for (const target of [Number(low), Number(high)]) {
    await page.mouse.move(xOf(nearest(target)), y, { steps: 12 });
    await shown(page, 'timeout ' + target);
  }
  await page.mouse.up();
  const axis = await (await page.$('#axis')).boundingBox();
  // The page redraws the axis at every refresh, and new positions can move the handle between
  // finding it and pressing on it: a token drag that did not take is tried again, and so is
  // one whose handle a redraw replaced between finding it and measuring it (no box then: seen
  // on a loaded machine, 2026-12-06).
  const dragTo = async (selector, atRight) => {
    for (let attempt = 0; attempt < 5; attempt++) {
      const before = await page.textContent('#token-position');
      const handle = await page.$(selector);
      const b = handle && await handle.boundingBox();
      if (!b) {
        await page.waitForTimeout(100);
        continue;
      }
      await page.mouse.move(b.x + b.width / 2, b.y + b.height / 2);
      await page.mouse.down();
      await page.mouse.move(atRight ? axis.x + axis.width - 2 : axis.x + 2, b.y + b.height / 2,
                            { steps: 12 });
      await page.mouse.up();
      if (selector !== '#token rect' || await page.textContent('#token-position') !== before) return;
    }
    throw new Error('dragging ' + selector + ' never moved the token (or its handle was never there)');
  };
  await dragTo('#token rect', true);
  await shown(page, 'token dragged past the primary');
  await dragTo('#token rect', false);
  await shown(page, 'token dragged before the replicas');
  // Simulate first: the replicas' positions stop following the live ones (which replay on past
  // a token placed just ahead of the primary as soon as the server writes any WAL).
  await page.check('#simulate');
  await dragTo('#token rect', true);
  await shown(page, 'simulating, token past the primary');
  await dragTo('g[data-replica] circle', true);
  await shown(page, 'replica dragged up to the token');
  await page.screenshot({ path: shot });
} finally {
  await browser.close();
}
"#;

fn drive_page(url: &str, low_ms: u64, high_ms: u64) -> Vec<serde_json::Value> {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("drive.mjs");
    // Next to node_modules, so that `import 'playwright-core'` resolves.
    let script_in_package =
        std::path::Path::new(PLAYWRIGHT).join(format!("budget-drive-{}.mjs", std::process::id()));
    std::fs::write(&script, DRIVE).unwrap();
    std::fs::copy(&script, &script_in_package).unwrap();
    let shot = dir.path().join("budget.png");
    let output = Command::new("node")
        .arg(&script_in_package)
        .args([url, &low_ms.to_string(), &high_ms.to_string()])
        .arg(&shot)
        .output();
    let _ = std::fs::remove_file(&script_in_package);
    let output = output.expect("node not found: run scripts/install/http.sh");
    let (stdout, stderr) = texts(&output);
    assert!(
        output.status.success(),
        "driving {url} failed (scripts/install/http.sh installs chromium and playwright-core)\n{stdout}\n{stderr}"
    );
    if let Ok(path) = std::env::var("LSNGATE_BUDGET_SCREENSHOT") {
        std::fs::copy(&shot, path).unwrap();
    }
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn percent(text: &serde_json::Value) -> f64 {
    text.as_str()
        .and_then(|t| t.strip_suffix('%'))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("not a percentage: {text}"))
}

#[test]
fn advice_pages_and_console_come_from_the_lag_the_proxy_observed() {
    let cluster = Cluster::start(
        &ClusterConfig::default()
            .replicas(1)
            .apply_delay(Duration::from_millis(200)),
    )
    .unwrap();
    cluster.wait_streaming(Duration::from_secs(30)).unwrap();
    let table = unique("budget");
    cluster
        .primary()
        .sql(&format!("CREATE TABLE {table} (id bigint PRIMARY KEY)"))
        .unwrap();
    caught_up(&cluster);
    let mut file = file_config(&cluster);
    file.wait_timeout_ms = Some(1000);
    file.pool_size = Some(8);
    file.users = vec![
        UserEntry::new("boss", Some("boss-pw"), "scram-sha-256"),
        UserEntry::new("app", Some("app-pw"), "scram-sha-256"),
    ];
    file.admin_users = vec!["boss".into()];
    let proxy = TestProxy::with(file);
    // Two sessions write and read back their own rows (a token read each) through the proxy.
    const PER_SESSION: i64 = 12;
    let conninfo = format!(
        "host=127.0.0.1 port={} user=app password=app-pw dbname=postgres",
        proxy.addr.port()
    );
    std::thread::scope(|s| {
        for session in 0..2i64 {
            let (conninfo, table) = (&conninfo, &table);
            s.spawn(move || {
                rt().block_on(async {
                    let client = connect(conninfo).await;
                    for i in 0..PER_SESSION {
                        let id = session * 1000 + i;
                        client
                            .execute(&format!("INSERT INTO {table} VALUES ({id})"), &[])
                            .await
                            .unwrap();
                        let rows = client
                            .query(&format!("SELECT id FROM {table} WHERE id = {id}"), &[])
                            .await
                            .unwrap();
                        assert_eq!(rows.len(), 1, "read-your-writes");
                    }
                })
            });
        }
    });

    // The chart points are taken every second: wait (bounded) for one covering the workload.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        let status = proxy.status();
        if status["budget"]["candidates"].is_array() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "no advice 30 s after the workload: {:#}",
            status["budget"]
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let advice = &status["budget"];
    println!("{advice:#}");
    let replica = &advice["replicas"][0];
    assert!(replica["samples"].as_u64().unwrap() >= 5, "{advice:#}");
    let share = |ms: u64| {
        advice["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["budget_ms"] == ms)
            .unwrap_or_else(|| panic!("no {ms} ms candidate: {advice:#}"))["replica_share"]
            .as_f64()
            .unwrap()
    };
    assert!(share(20) < 0.15, "20 ms cannot cover 200 ms: {advice:#}");
    assert!(share(1000) > 0.9, "1 s covers it: {advice:#}");
    let recommended = advice["recommended_budget_ms"].as_u64().unwrap();
    assert!(
        (200..=1000).contains(&recommended),
        "a budget that covers the 200 ms lag: {advice:#}"
    );
    assert_eq!(advice["window"]["source"], "wal_clock");

    // The console prints the same advice, one row per candidate.
    let console = rt().block_on(async {
        let client = connect(&format!(
            "host=127.0.0.1 port={} user=boss password=boss-pw dbname=lsngate",
            proxy.addr.port()
        ))
        .await;
        client.simple_query("SHOW BUDGET").await.unwrap()
    });
    let rows: Vec<_> = console
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => Some(row),
            _ => None,
        })
        .collect();
    let picked: Vec<_> = rows
        .iter()
        .filter(|r| r.get("recommended") == Some("yes"))
        .collect();
    assert_eq!(picked.len(), 1, "one recommended row");
    assert_eq!(
        picked[0].get("budget_ms"),
        Some(recommended.to_string().as_str())
    );
    assert!(picked[0].get("reason").is_some_and(|r| !r.is_empty()));
    assert!(
        rows.iter()
            .all(|r| matches!(r.get("guard_cap_hit"), Some("yes" | "no"))),
        "a light workload (a few reads a second) never fills the guard's 32 slots"
    );
    assert!(rows.iter().all(|r| r.get("guard_cap_hit") == Some("no")));
    let console_share = |ms: &str| -> f64 {
        rows.iter()
            .find(|r| r.get("budget_ms") == Some(ms))
            .and_then(|r| r.get("replica_share"))
            .and_then(|s| s.parse().ok())
            .unwrap()
    };
    assert!(console_share("20") < 0.15 && console_share("1000") > 0.9);

    // The what-if page: the slider moves the numbers, the token decides who qualifies.
    let states = drive_page(&format!("http://{}/budget", proxy.admin), 20, 1000);
    for state in &states {
        println!("{state}");
    }
    let [low, high, past, before, simulating, simulated] = &states[..] else {
        panic!("six states expected: {states:?}");
    };
    assert!(percent(&low["share"]) < 15.0, "{low}");
    assert!(percent(&high["share"]) > 90.0, "{high}");
    assert_ne!(low["budget"], high["budget"], "the slider moved");
    assert_ne!(
        low["fallbacks"], high["fallbacks"],
        "and the numbers with it"
    );
    assert_eq!(low["curves"], 1, "one lag curve per replica");
    let qualifies = |state: &serde_json::Value| state["qualifies"].clone();
    assert_eq!(qualifies(past), serde_json::json!(["no"]), "{past}");
    assert_eq!(qualifies(before), serde_json::json!(["yes"]), "{before}");
    assert_eq!(
        qualifies(simulating),
        serde_json::json!(["no"]),
        "{simulating}"
    );
    assert_eq!(
        qualifies(simulated),
        serde_json::json!(["yes"]),
        "{simulated}"
    );

    // The dashboard's charts: once /history holds a point that saw the reads (bounded wait),
    // the page draws it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !history_saw_reads(&proxy) {
        assert!(
            Instant::now() < deadline,
            "no /history point with reads after 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let dom = crate::dashboard::rendered_dom(&format!("http://{}/dashboard", proxy.admin), 5000);
    let chart = |name: &str| -> (usize, f64) {
        let at = dom
            .find(&format!("data-chart=\"{name}\""))
            .unwrap_or_else(|| panic!("no {name} chart:\n{dom}"));
        let tag = &dom[dom[..at].rfind('<').unwrap()..at + dom[at..].find('>').unwrap()];
        let attr = |key: &str| {
            let from = tag
                .find(&format!("data-{key}=\""))
                .unwrap_or_else(|| panic!("{key} in {tag}"))
                + key.len()
                + 7;
            tag[from..from + tag[from..].find('"').unwrap()].to_string()
        };
        (
            attr("points").parse().unwrap(),
            attr("max").parse().unwrap(),
        )
    };
    let (lag_points, lag_max) = chart("lag");
    let (read_points, reads_max) = chart("reads");
    println!(
        "charts: lag {lag_points} points, max {lag_max} ms; reads {read_points} points, max {reads_max}/s"
    );
    assert!(lag_points >= 1 && read_points >= 2, "{dom}");
    assert!(reads_max > 0.0, "the workload's reads are on the chart");
    let replica = format!("127.0.0.1:{}", cluster.replica(0).port());
    assert!(
        dom.contains(&format!("data-series=\"{replica}\"")),
        "a lag line for {replica}"
    );
}

fn history_saw_reads(proxy: &TestProxy) -> bool {
    let response = proxy.http_get("/history");
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    let history: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    history["points"]
        .as_array()
        .is_some_and(|points| points.iter().any(|p| p["reads_per_s"].as_f64() > Some(0.0)))
}
