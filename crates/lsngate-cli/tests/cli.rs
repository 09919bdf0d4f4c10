//! The `lsngate` binary end to end on real clusters: `bench` (strategies, the proxy's included,
//! JSON schema), `lag` (verdicts for healthy, paused and stopped replicas; `--advise` on a
//! replica held 200 ms behind), `verify` (seeded
//! runs under faults with 0 violations through the proxy and through the library, read-only
//! transactions, the eventual self-tests that must fail, `--proxy` against `lsngate proxy`,
//! `--primary`/`--replica` against a cluster it does not own, the refused mode and faults) and
//! `cluster up|status|down` (including where the cluster goes when run as root from a directory
//! the servers' user cannot enter).
//! The server version follows LSNGATE_PG_BIN like every other test.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use lsngate_cluster::{Cluster, ClusterConfig, PgBin};
use serde_json::Value;

fn lsngate(args: &[&str]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_lsngate"))
        .args(args)
        .output()
        .expect("run lsngate");
    assert!(
        output.status.success(),
        "lsngate {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    output
}

/// Runs `lsngate` and returns its output whatever its exit status.
fn lsngate_status(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lsngate"))
        .args(args)
        .output()
        .expect("run lsngate")
}

/// The keys `lsngate verify --json` promises.
const VERIFY_KEYS: [&str; 12] = [
    "ops",
    "reads",
    "writes",
    "replica_reads",
    "stale",
    "nonmonotonic",
    "lost",
    "duplicated",
    "indeterminate",
    "hangs",
    "errors",
    "faults",
];

fn json_lines(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).expect("one JSON document on stdout")
}

/// Runs `lsngate verify ARGS --json` and expects a clean verdict: exit status 0, every promised
/// key, no violation of any class, and a run that could have caught a stale read (some replica
/// read was owed a write). The JSON.
fn verify_clean(args: &[&str]) -> Value {
    let mut all = vec!["verify"];
    all.extend_from_slice(args);
    all.push("--json");
    let output = lsngate_status(&all);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "lsngate verify {args:?} found a violation or failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let doc: Value = serde_json::from_str(&stdout).expect("one JSON object");
    for key in VERIFY_KEYS {
        assert!(!doc[key].is_null(), "{key} missing: {doc}");
    }
    for key in [
        "stale",
        "nonmonotonic",
        "lost",
        "duplicated",
        "phantom",
        "hangs",
        "violations",
    ] {
        assert_eq!(doc[key], 0, "{key}: {doc}");
    }
    assert!(
        doc["proved"].as_bool().unwrap(),
        "some replica read was owed a write, so a stale read could have been caught: {doc}"
    );
    doc
}

/// Runs `lsngate verify ARGS --json` where it must find stale reads (the self-test): exit
/// status 1. The JSON.
fn verify_violated(args: &[&str]) -> Value {
    let mut all = vec!["verify"];
    all.extend_from_slice(args);
    all.push("--json");
    let output = lsngate_status(&all);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(1),
        "violations must give exit status 1: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let doc: Value = serde_json::from_str(&stdout).expect("one JSON object");
    assert!(doc["stale"].as_u64().unwrap() > 0, "{doc}");
    assert_eq!(doc["examples"][0]["kind"], "stale", "{doc}");
    assert_eq!(
        doc["examples"][0]["op"]["server"]["in_recovery"], true,
        "{doc}"
    );
    doc
}

/// Each of `kinds` was injected at least once.
fn assert_injected(doc: &Value, kinds: &[&str]) {
    for kind in kinds {
        assert!(
            doc["faults"][kind].as_u64().unwrap_or(0) >= 1,
            "{kind} was never injected: {doc}"
        );
    }
}

/// Every fault kind `lsngate verify` has but `failover`, which the library does not follow.
const ALL_FAULTS_BUT_FAILOVER: [&str; 7] = [
    "pause",
    "delay",
    "stop",
    "kill",
    "net-delay",
    "blackhole",
    "kill-primary",
];

/// The operations of a `--history` file.
fn history_ops(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["type"] == "op")
        .collect()
}

#[test]
fn bench_runs_every_strategy_and_writes_the_documented_json() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let svg = dir.path().join("bench.svg");
    let output = lsngate(&[
        "bench",
        "--ops",
        "60",
        "--workers",
        "4",
        "--sweep-ops",
        "24",
        "--timeouts",
        "500ms,5ms",
        "--read-load",
        "2",
        "--read-load-phase",
        "300ms",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(
        table.contains("read p50 / primary")
            && table.contains("read p50 / floor")
            && table.contains("write p50"),
        "{table}"
    );
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();

    let env = &doc["environment"];
    for key in [
        "server_version",
        "replicas",
        "apply_delay_ms",
        "cores",
        "workers",
        "ops",
        "rounds",
    ] {
        assert!(!env[key].is_null(), "environment.{key} missing: {env}");
    }
    assert_eq!(env["rounds"], 4, "the default rounds: {env}");
    let results = doc["results"].as_array().unwrap();
    let by_name = |name: &str| results.iter().find(|r| r["strategy"] == name);
    let major = PgBin::find(None).unwrap().major;
    let mut expected = vec![
        "primary",
        "replica",
        "sleep:50ms",
        "sync-on",
        "remote-apply",
        "poll",
        "lsngate",
        "proxy-session",
        "proxy-token",
        "proxy-scope",
        "proxy-global",
        "proxy-eventual",
        "proxy-fast",
        "floor",
        "pgbouncer",
    ];
    if major >= 19 {
        expected.push("waitfor");
    } else {
        let skipped = doc["skipped"].as_array().unwrap();
        assert!(
            skipped.iter().any(|s| s["strategy"] == "waitfor"
                && s["reason"].as_str().unwrap().contains("PostgreSQL 19")),
            "waitfor must be skipped with its reason on {major}: {skipped:?}"
        );
    }
    for name in &expected {
        let row = by_name(name).unwrap_or_else(|| panic!("no result for {name}: {results:?}"));
        for key in ["ops", "stale", "served_by_replica", "fallbacks"] {
            assert!(row[key].is_u64(), "{name}.{key} not a count: {row}");
        }
        for key in ["p50_ms", "p95_ms", "p99_ms", "e2e_p50_ms", "write_p50_ms"] {
            assert!(row[key].as_f64().unwrap() > 0.0, "{name}.{key}: {row}");
        }
        assert_eq!(row["ops"], 60);
        assert!(row["p50_ms"].as_f64() <= row["p95_ms"].as_f64());
        assert!(row["p95_ms"].as_f64() <= row["p99_ms"].as_f64());
    }
    // Safe strategies are never stale; primary never uses a replica; the replica strategies do.
    for name in [
        "primary",
        "remote-apply",
        "poll",
        "waitfor",
        "lsngate",
        "proxy-session",
        "proxy-token",
        "proxy-scope",
        "proxy-global",
        "proxy-fast",
        "floor",
    ] {
        if let Some(row) = by_name(name) {
            assert_eq!(row["stale"], 0, "{name} must never be stale: {row}");
        }
    }
    assert_eq!(by_name("primary").unwrap()["served_by_replica"], 0);
    // pgpool-II beside it (scripts/install/proxy.sh installs it): `always` sends every read after
    // the session's first write to the primary, so it is never stale and never uses a replica;
    // `transaction` load-balances the next transaction's read to the standby. `dml_adaptive`
    // either runs or is skipped with pgpool's own error (its "kind mismatch among backends").
    let always = by_name("pgpool-always").expect("a pgpool-always row");
    assert_eq!(
        (
            always["stale"].as_u64(),
            always["served_by_replica"].as_u64()
        ),
        (Some(0), Some(0)),
        "{always}"
    );
    let transaction = by_name("pgpool-transaction").expect("a pgpool-transaction row");
    assert!(
        transaction["served_by_replica"].as_u64() > Some(0),
        "{transaction}"
    );
    assert!(by_name("pgpool-delay_threshold").is_some(), "{results:?}");
    let skipped = doc["skipped"].as_array().unwrap();
    assert!(
        by_name("pgpool-dml_adaptive").is_some()
            || skipped
                .iter()
                .any(|s| s["strategy"] == "pgpool-dml_adaptive"
                    && s["reason"].as_str().unwrap().starts_with("pgpool-II: ")),
        "pgpool-dml_adaptive: neither a row nor a reason: {skipped:?}"
    );
    // Through the proxy every read is served by a replica or falls back to the primary, and the
    // proxy's own outcome counts come with the row.
    for name in [
        "proxy-session",
        "proxy-token",
        "proxy-scope",
        "proxy-global",
        "proxy-fast",
    ] {
        let row = by_name(name).unwrap();
        assert_eq!(
            row["served_by_replica"].as_u64().unwrap() + row["fallbacks"].as_u64().unwrap(),
            60,
            "{row}"
        );
        let outcomes = &row["proxy_outcomes"];
        for key in [
            "replica",
            "waited",
            "fallback",
            "no_replica",
            "stale",
            "error",
        ] {
            assert!(outcomes[key].is_u64(), "{name}.proxy_outcomes.{key}: {row}");
        }
        assert_eq!(outcomes["stale"], 0, "{row}");
        assert_eq!(outcomes["error"], 0, "{row}");
    }
    assert!(
        by_name("lsngate").unwrap().get("proxy_outcomes").is_none(),
        "only the proxy strategies report the proxy's outcomes"
    );
    let naive = by_name("replica").unwrap();
    assert_eq!(naive["served_by_replica"], 60);
    // PgBouncer beside it (scripts/install/proxy.sh installs it): every read through its
    // replica database, and the line that sets the proxy rows against its hop.
    assert_eq!(by_name("pgbouncer").unwrap()["served_by_replica"], 60);
    let hop = table
        .lines()
        .find(|l| l.starts_with("A pooler's hop here: pgbouncer's replica read p50 "))
        .unwrap_or_else(|| panic!("no pooler hop line:\n{table}"));
    assert!(
        hop.contains("proxy-session ") && hop.contains("proxy-global "),
        "{hop}"
    );
    // The proxy's own hop, with nothing waited for: every read on the replica.
    let eventual = by_name("proxy-eventual").unwrap();
    assert_eq!(eventual["served_by_replica"], 60, "{eventual}");
    assert!(
        naive["stale"].as_u64().unwrap() <= 60,
        "counted, not capped: {naive}"
    );

    let sweep = doc["sweep"].as_array().unwrap();
    let swept: Vec<&str> = sweep
        .iter()
        .map(|r| r["strategy"].as_str().unwrap())
        .collect();
    assert!(
        swept.contains(&"lsngate") && swept.contains(&"poll"),
        "{swept:?}"
    );
    for row in sweep {
        for key in [
            "strategy",
            "timeout_ms",
            "apply_delay_ms",
            "ops",
            "stale",
            "served_by_replica",
            "fallbacks",
            "p50_ms",
        ] {
            assert!(!row[key].is_null(), "sweep.{key} missing: {row}");
        }
        assert_eq!(
            row["stale"], 0,
            "the budget never makes a read stale: {row}"
        );
        assert_eq!(row["apply_delay_ms"], 50.0);
        assert_eq!(
            row["served_by_replica"].as_u64().unwrap() + row["fallbacks"].as_u64().unwrap(),
            24,
            "every read is served by the replica or falls back: {row}"
        );
        if row["timeout_ms"] == 5.0 {
            // 5 ms cannot cover a 50 ms apply delay: nearly everything falls back.
            assert!(row["fallbacks"].as_u64().unwrap() >= 20, "{row}");
        }
    }
    let read_load = doc["read_load"].as_array().unwrap();
    assert_eq!(read_load.len(), 2);
    assert_eq!(read_load[1]["readers"], 2);
    assert!(read_load[1]["reads_per_second"].as_f64().unwrap() > 0.0);
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.starts_with("<svg") && chart.contains("primary: 0/60 stale"));
    assert!(
        chart.contains("proxy-session: 0/60 stale") && chart.contains("proxy-token: 0/60 stale"),
        "the proxy strategies are charted like the rest"
    );
}

/// `bench --profile` measures every path and reads what the library adds over the same
/// statements pipelined on a connection of its own (the rows and the two "over" lines).
#[test]
fn bench_profile_takes_the_library_paths_apart() {
    let output = lsngate(&["bench", "--profile", "--ops", "40", "--quiet"]);
    let table = String::from_utf8_lossy(&output.stdout);
    // The default strategies configure a synchronous standby: the plain insert must not wait
    // for it while the library's writes do not.
    assert!(
        table.contains("Every write path commits with synchronous_commit = local."),
        "{table}"
    );
    for path in [
        "insert (own connection)",
        "insert, then position (2 round trips)",
        "insert + position, pipelined (own connection)",
        "library write_returning",
        "replica read (own connection)",
        "replica read + replay position, pipelined",
        "library read, no token",
    ] {
        let line = table
            .lines()
            .find(|l| l.contains(&format!(" {path} ")))
            .unwrap_or_else(|| panic!("no row for {path}: {table}"));
        let p50: f64 = line
            .split('┆')
            .nth(2)
            .and_then(|c| c.trim().strip_suffix("ms"))
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no p50 in {line:?}"));
        assert!(p50 > 0.0, "{line}");
    }
    // The library's read after a token is one path counted in two rows, known or proved.
    let rounds = |path: &str| -> usize {
        let line = table.lines().find(|l| l.contains(path)).unwrap();
        line.split('┆').nth(1).unwrap().trim().parse().unwrap()
    };
    assert_eq!(
        rounds("library read after a token, known replayed")
            + rounds("library read after a token, proved in flight"),
        40,
        "{table}"
    );
    assert!(
        table.lines().any(|l| l
            .starts_with("library write_returning over insert + position, pipelined")
            && l.contains(" µs (")),
        "no line for the library's write over the pipelined pair: {table}"
    );
}

/// `lsngate bench` against `cluster` (not one it starts), 16 ops by 2 workers of `strategies`,
/// no read-load run: its stdout and its `--json` document.
fn bench_existing(cluster: &Cluster, strategies: &str) -> (String, Value) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let output = lsngate(&[
        "bench",
        "--primary",
        &cluster.primary_url(),
        "--replica",
        &cluster.replica_urls()[0],
        "--ops",
        "16",
        "--workers",
        "2",
        "--strategies",
        strategies,
        "--read-load",
        "0",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]);
    let doc = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (String::from_utf8_lossy(&output.stdout).into_owned(), doc)
}

#[test]
fn bench_against_an_existing_cluster_says_what_it_cannot_run() {
    let cluster = Cluster::start(&ClusterConfig::default().replicas(1)).unwrap();
    let (text, doc) = bench_existing(&cluster, "primary,sync-on,poll,proxy-session,proxy-token");
    assert!(
        text.contains("skipped sync-on: the primary has no synchronous standby"),
        "{text}"
    );
    assert!(text.contains("poll"), "{text}");
    assert!(
        !text.contains("Wait budget sweep"),
        "no sweep on an existing cluster unless asked"
    );
    // The proxy strategies run there too: the bench's proxy points at the given URLs.
    for name in ["proxy-session", "proxy-token"] {
        let row = doc["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["strategy"] == name)
            .unwrap_or_else(|| panic!("no {name} result: {doc}"));
        assert_eq!(row["ops"], 16, "{row}");
        assert_eq!(row["stale"], 0, "{name} must never be stale: {row}");
    }
}

/// The pgpool rows on a cluster the bench does not own: pgpool-II, started by the test kit,
/// reaches the given primary and replica by their URLs; `always` never reads a replica after the
/// session's write, so it is never stale.
#[test]
fn bench_pgpool_rows_run_against_an_existing_cluster() {
    let cluster = Cluster::start(&ClusterConfig::default().replicas(1)).unwrap();
    let (_, doc) = bench_existing(&cluster, "pgpool-always,pgpool-transaction");
    let results = doc["results"].as_array().unwrap();
    for name in ["pgpool-always", "pgpool-transaction"] {
        let row = results
            .iter()
            .find(|r| r["strategy"] == name)
            .unwrap_or_else(|| panic!("no {name} result: {doc}"));
        assert_eq!(row["ops"], 16, "{row}");
    }
    let always = results
        .iter()
        .find(|r| r["strategy"] == "pgpool-always")
        .unwrap();
    assert_eq!(always["stale"], 0, "{always}");
}

#[test]
fn verify_through_the_proxy_under_every_fault_finds_no_violation() {
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history.jsonl");
    let doc = verify_clean(&[
        "--seconds",
        "6",
        "--fault-period",
        "1s",
        "--seed",
        "2026",
        "--workers",
        "4",
        "--history",
        history.to_str().unwrap(),
    ]);
    assert_eq!(doc["seed"], 2026);
    assert_injected(&doc, &ALL_FAULTS_BUT_FAILOVER);
    assert_injected(&doc, &["failover"]);
    // The history holds every operation and fault, and says who answered each read.
    let text = std::fs::read_to_string(&history).unwrap();
    let entries: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ops = entries.iter().filter(|e| e["type"] == "op").count() as u64;
    let faults = entries.iter().filter(|e| e["type"] == "fault").count() as u64;
    assert_eq!(ops, doc["ops"].as_u64().unwrap());
    let injected: u64 = doc["faults"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(faults, injected);
    assert!(entries.iter().any(|e| e["type"] == "op"
        && e["kind"] == "read"
        && e["server"]["in_recovery"] == true
        && e["server"]["port"].is_i64()));
    // And last, the op ids on the primary at the end: every acknowledged write among them, so
    // a lost, duplicated or phantom verdict can be read again from the file.
    let last = entries.last().unwrap();
    assert_eq!(last["type"], "committed", "{last}");
    for write in entries
        .iter()
        .filter(|e| e["type"] == "op" && e["kind"] == "write" && e["outcome"] == "ok")
    {
        let id = write["op_id"].as_str().unwrap();
        assert_eq!(last["committed"][id], 1, "{id}");
    }
}

#[test]
fn verify_token_global_and_fast_modes_find_no_violation_under_faults() {
    for (mode, faults) in [
        ("token", "kill,net-delay"),
        ("global", "pause,stop"),
        ("fast", "pause,kill"),
    ] {
        let doc = verify_clean(&[
            "--mode",
            mode,
            "--faults",
            faults,
            "--seconds",
            "3",
            "--fault-period",
            "1s",
            "--seed",
            "11",
        ]);
        assert_eq!(doc["mode"], mode);
        assert_injected(&doc, &faults.split(',').collect::<Vec<_>>());
        // The in-process proxy's guard is reported (what it refused, and what a replica took
        // back), and a rescued read is one it refused.
        let guard = &doc["guard"];
        let refused = guard["refused_reads"].as_u64().expect("guard counts");
        assert!(
            guard["rescued_reads"].as_u64().unwrap() <= refused,
            "{guard}"
        );
    }
}

/// Scope mode: clients in pairs share a causal scope and (through the proxy) write and read on
/// two connections, so only the scope carries a write to the reads of either client; with the
/// replica 20 ms behind, replica reads are owed writes they would miss without it. The same
/// through the library.
#[test]
fn verify_scope_mode_through_the_proxy_finds_no_violation_under_faults() {
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history.jsonl");
    let doc = verify_clean(&[
        "--mode",
        "scope",
        "--faults",
        "pause,kill",
        "--apply-delay",
        "20ms",
        "--seconds",
        "3",
        "--fault-period",
        "1s",
        "--seed",
        "13",
        "--history",
        history.to_str().unwrap(),
    ]);
    assert_eq!(doc["mode"], "scope");
    assert_injected(&doc, &["pause", "kill"]);
    let ops = history_ops(&history);
    assert!(
        ops.iter()
            .all(|e| e["scope"] == format!("verify:s{}", e["process"].as_u64().unwrap() / 2)),
        "every operation names the scope of its pair"
    );
    // The library's Gate::scope, its floors in one store every client shares.
    let doc = verify_clean(&[
        "--library",
        "--mode",
        "scope",
        "--faults",
        "pause,kill",
        "--apply-delay",
        "20ms",
        "--seconds",
        "3",
        "--fault-period",
        "1s",
        "--seed",
        "13",
    ]);
    assert_eq!(doc["mode"], "scope");
}

#[test]
fn verify_self_test_catches_eventual_reads_on_a_delayed_replica() {
    let doc = verify_violated(&[
        "--mode",
        "eventual",
        "--faults",
        "none",
        "--apply-delay",
        "200ms",
        "--seconds",
        "3",
        "--seed",
        "1",
    ]);
    let example = &doc["examples"][0];
    assert!(
        example["session"].as_array().unwrap().len() >= 2,
        "the session's operations around it are shown: {example}"
    );
}

#[test]
fn verify_refuses_faults_on_a_deployment_it_does_not_own() {
    let output = lsngate_status(&[
        "verify",
        "--proxy",
        "postgres://app@127.0.0.1:1/app",
        "--faults",
        "kill",
    ]);
    // 2, not 1: nothing was checked, so this must not read as a violation found.
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--faults needs the local cluster"),
        "{stderr}"
    );
}

#[test]
fn verify_universal_mode_and_read_only_transactions_through_the_proxy_find_no_violation() {
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history.jsonl");
    let doc = verify_clean(&[
        "--mode",
        "universal",
        "--faults",
        "pause,blackhole",
        "--seconds",
        "3",
        "--fault-period",
        "1s",
        "--seed",
        "12",
        "--history",
        history.to_str().unwrap(),
    ]);
    assert_eq!(doc["mode"], "universal");
    assert!(doc["transactions"].as_u64().unwrap() > 0, "{doc}");
    // Each read of a read-only transaction is in the history, tagged with it, and some were
    // answered by the replica (in the server's own words).
    assert!(
        history_ops(&history).iter().any(|e| e["txn"].is_string()
            && e["outcome"] == "ok"
            && e["server"]["in_recovery"] == true),
        "no read of a read-only transaction ran on the replica"
    );
}

#[test]
fn verify_the_library_under_every_fault_finds_no_violation() {
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history.jsonl");
    let doc = verify_clean(&[
        "--library",
        "--seconds",
        "6",
        "--fault-period",
        "1s",
        "--seed",
        "2026",
        "--history",
        history.to_str().unwrap(),
    ]);
    assert!(
        doc["target"].as_str().unwrap().contains("lsngate library"),
        "{doc}"
    );
    assert!(
        doc["fallbacks"].is_u64(),
        "the library says which reads it sent to the primary: {doc}"
    );
    assert_eq!(
        doc["transactions"], 0,
        "the library has no transactions on replicas: {doc}"
    );
    assert_injected(&doc, &ALL_FAULTS_BUT_FAILOVER);
    assert!(
        doc["faults"]["failover"].is_null(),
        "the library does not follow a failover, so `all` leaves it out: {doc}"
    );
    assert!(history_ops(&history).iter().any(|e| e["kind"] == "read"
        && e["server"]["in_recovery"] == true
        && e["server"]["port"].is_i64()));
}

#[test]
fn verify_the_library_in_token_and_universal_modes_finds_no_violation_under_faults() {
    for (mode, faults) in [("token", "kill,net-delay"), ("universal", "pause,stop")] {
        let doc = verify_clean(&[
            "--library",
            "--mode",
            mode,
            "--faults",
            faults,
            "--seconds",
            "3",
            "--fault-period",
            "1s",
            "--seed",
            "11",
        ]);
        assert_eq!(doc["mode"], mode);
        assert_injected(&doc, &faults.split(',').collect::<Vec<_>>());
    }
}

#[test]
fn verify_self_test_catches_eventual_library_reads_on_a_delayed_replica() {
    verify_violated(&[
        "--library",
        "--mode",
        "eventual",
        "--faults",
        "none",
        "--apply-delay",
        "200ms",
        "--seconds",
        "3",
        "--seed",
        "1",
    ]);
}

#[test]
fn verify_the_library_refuses_global_mode_and_faults_on_a_deployment_it_does_not_own() {
    // Refused before anything starts: no cluster, no connection.
    let output = lsngate_status(&["verify", "--library", "--mode", "global"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--mode global") && stderr.contains("no gate-wide commit floor"),
        "the cause: {stderr}"
    );
    assert!(stderr.contains("--mode universal"), "the fix: {stderr}");
    let output = lsngate_status(&["verify", "--library", "--mode", "fast"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--mode fast is the proxy's") && stderr.contains("--mode session"),
        "the cause and the fix: {stderr}"
    );
    let output = lsngate_status(&["verify", "--library", "--faults", "pause,failover"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("fixed primary URL") && stderr.contains("drop --library"),
        "{stderr}"
    );
    let output = lsngate_status(&[
        "verify",
        "--primary",
        "postgres://app@127.0.0.1:1/app",
        "--replica",
        "postgres://app@127.0.0.1:2/app",
        "--faults",
        "kill",
    ]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--faults needs the local cluster") && stderr.contains("--primary"),
        "{stderr}"
    );
    // A replica without its primary, and two targets at once, are usage errors.
    let output = lsngate_status(&["verify", "--replica", "postgres://app@127.0.0.1:2/app"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let output = lsngate_status(&[
        "verify",
        "--proxy",
        "postgres://app@127.0.0.1:1/app",
        "--library",
    ]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
}

#[test]
fn verify_the_library_over_primary_and_replica_urls_finds_no_violation() {
    // Behind enough that reads owed a write reach the replica before it has replayed it.
    let config = ClusterConfig::default()
        .replicas(1)
        .apply_delay(Duration::from_millis(50));
    let cluster = Cluster::start(&config).unwrap();
    let doc = verify_clean(&[
        "--primary",
        &cluster.primary_url(),
        "--replica",
        &cluster.replica_urls()[0],
        "--seconds",
        "2",
        "--workers",
        "2",
        "--seed",
        "5",
    ]);
    assert_eq!(doc["faults"], serde_json::json!({}), "{doc}");
    assert!(
        doc["target"]
            .as_str()
            .unwrap()
            .starts_with("lsngate library over primary"),
        "{doc}"
    );
}

/// `--fault-hook`: on hosts lsngate does not own, the user's program injects and heals each
/// fault. Here it pauses replay on the replica (psql) and freezes its processes (SIGSTOP), and
/// logs every call; the run sees both kinds, pairs every inject with a heal, records the hook's
/// first line as the fault's detail, and finds no violation.
#[test]
fn verify_with_a_fault_hook_injects_and_heals_faults_on_hosts_it_does_not_own() {
    let config = ClusterConfig::default()
        .replicas(1)
        .apply_delay(Duration::from_millis(50));
    let cluster = Cluster::start(&config).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (hook, log, history) = (
        dir.path().join("hook.sh"),
        dir.path().join("hook.log"),
        dir.path().join("history.jsonl"),
    );
    let replica = &cluster.replicas()[0];
    std::fs::write(
        &hook,
        format!(
            r#"#!/bin/sh
set -eu
psql="{psql} -X -q -At -d {url}"
pm=$(head -n1 {data}/postmaster.pid)
case "$1 $2" in
  "inject pause") $psql -c 'SELECT pg_wal_replay_pause()' >/dev/null ;;
  "heal pause") $psql -c 'SELECT pg_wal_replay_resume()' >/dev/null ;;
  "inject stop") kill -STOP "$pm"; pkill -STOP -P "$pm" ;;
  "heal stop") kill -CONT "$pm"; pkill -CONT -P "$pm" ;;
  *) echo "unknown fault $2" >&2; exit 3 ;;
esac
echo "$1 $LSNGATE_FAULT replica=$LSNGATE_FAULT_REPLICA" >> {log}
echo "hook did $1 $2"
"#,
            psql = cluster.pg_bin().tool("psql").display(),
            url = replica.url(),
            data = replica.data_dir().display(),
            log = log.display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    let doc = verify_clean(&[
        "--primary",
        &cluster.primary_url(),
        "--replica",
        &replica.url(),
        "--faults",
        "pause,stop",
        "--fault-hook",
        hook.to_str().unwrap(),
        "--seconds",
        "3",
        "--fault-period",
        "1s",
        "--seed",
        "9",
        "--history",
        history.to_str().unwrap(),
    ]);
    assert_injected(&doc, &["pause", "stop"]);
    let calls = std::fs::read_to_string(&log).unwrap();
    let calls: Vec<&str> = calls.lines().collect();
    assert_eq!(calls.len() % 2, 0, "every inject has its heal: {calls:?}");
    for pair in calls.chunks(2) {
        assert!(
            pair[0].starts_with("inject ")
                && pair[1] == pair[0].replacen("inject", "heal", 1)
                && pair[0].ends_with("replica=0"),
            "{calls:?}"
        );
    }
    let injected: u64 = ["pause", "stop"]
        .iter()
        .map(|k| doc["faults"][k].as_u64().unwrap())
        .sum();
    assert_eq!(calls.len() as u64, 2 * injected, "{calls:?}");
    let windows: Vec<Value> = std::fs::read_to_string(&history)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["type"] == "fault")
        .collect();
    assert!(
        windows.iter().all(
            |w| w["detail"].as_str().unwrap().starts_with("hook did inject")
                && w["node"] == "replica 0 (hook)"
        ),
        "{windows:?}"
    );
    // A hook that fails stops the run at once (not after --seconds: the deployment is no longer
    // what the schedule says) and says which call failed and why.
    let output = lsngate_status(&[
        "verify",
        "--primary",
        &cluster.primary_url(),
        "--replica",
        &replica.url(),
        "--faults",
        "delay",
        "--fault-hook",
        hook.to_str().unwrap(),
        "--seconds",
        "600",
        "--fault-period",
        "1s",
    ]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("inject delay") && stderr.contains("unknown fault delay"),
        "{stderr}"
    );
    // And a hook without faults, or on the local cluster, is refused before anything starts.
    let output = lsngate_status(&["verify", "--fault-hook", hook.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("--fault-hook is for hosts you control"),
        "{output:?}"
    );
}

#[test]
fn lag_names_the_bottleneck_for_healthy_paused_and_stopped_replicas() {
    let cluster = Cluster::start(&ClusterConfig::default().replicas(2)).unwrap();
    let primary_url = cluster.primary_url();
    let urls = cluster.replica_urls().join(",");
    let lag = |extra: &[&str]| {
        let mut args = vec![
            "lag",
            "--primary",
            &primary_url,
            "--replica",
            &urls,
            "--json",
            "--sample",
            "100ms",
        ];
        args.extend_from_slice(extra);
        json_lines(&lsngate(&args))
    };
    let verdict = |report: &Value, i: usize| {
        let replica = &report["replicas"][i];
        (
            replica["verdict"]["bottleneck"]
                .as_str()
                .unwrap()
                .to_string(),
            replica["verdict"]["reason"].as_str().unwrap().to_string(),
        )
    };

    let healthy = lag(&["--heartbeat"]);
    for i in 0..2 {
        assert_eq!(verdict(&healthy, i).0, "none", "{healthy}");
        assert!(healthy["replicas"][i]["heartbeat_lag_ms"].as_f64().unwrap() >= 0.0);
    }

    cluster.replica(0).pause_replay().unwrap();
    cluster
        .primary()
        .sql("CREATE TABLE lag_probe AS SELECT g FROM generate_series(1, 20000) g")
        .unwrap();
    let position = cluster
        .primary()
        .sql("SELECT pg_current_wal_insert_lsn()")
        .unwrap();
    cluster
        .replica(1)
        .wait_replayed(&position, Duration::from_secs(30))
        .unwrap();
    let paused = lag(&[]);
    let (bottleneck, reason) = verdict(&paused, 0);
    assert_eq!(bottleneck, "replay_paused", "{paused}");
    assert!(reason.contains("replay is paused"), "{reason}");
    assert!(
        paused["replicas"][0]["bytes_received_not_replayed"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert_eq!(
        verdict(&paused, 1).0,
        "none",
        "the other replica is fine: {paused}"
    );

    cluster.replica(0).resume_replay().unwrap();
    cluster.replica(0).stop().unwrap();
    let stopped = lag(&[]);
    let (bottleneck, reason) = verdict(&stopped, 0);
    assert_eq!(bottleneck, "down", "{stopped}");
    assert!(reason.contains("not streaming"), "{reason}");
}

/// The keys `lsngate lag --advise --json` promises, at the top and per candidate.
const ADVICE_KEYS: [&str; 5] = [
    "window",
    "replicas",
    "candidates",
    "recommended_budget_ms",
    "reason",
];
const CANDIDATE_KEYS: [&str; 5] = [
    "budget_ms",
    "replica_share",
    "fallbacks_per_s",
    "held_connections_mean",
    "held_connections_p99",
];

#[test]
fn lag_advise_turns_a_replica_200ms_behind_into_a_budget_that_covers_it() {
    let cluster = Cluster::start(
        &ClusterConfig::default()
            .replicas(1)
            .apply_delay(Duration::from_millis(200)),
    )
    .unwrap();
    let primary_url = cluster.primary_url();
    let urls = cluster.replica_urls().join(",");
    let base = [
        "lag",
        "--primary",
        &primary_url,
        "--replica",
        &urls,
        "--advise",
    ];
    let with = |extra: &[&'static str]| -> Vec<&str> { [&base[..], extra].concat() };
    let advice = json_lines(&lsngate(&with(&[
        "--reads-per-second",
        "100",
        "--pool-size",
        "40",
        "--window",
        "2s",
        "--budgets",
        "20ms,1s",
        "--json",
    ])));
    let mut keys: Vec<_> = advice.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    let mut expected = ADVICE_KEYS.map(String::from).to_vec();
    expected.sort();
    assert_eq!(keys, expected, "{advice}");
    let replica = &advice["replicas"][0];
    assert!(replica["samples"].as_u64().unwrap() >= 2, "{advice}");
    // recovery_min_apply_delay holds every write back at least 200 ms: the samples say so.
    assert!(replica["p50_ms"].as_f64().unwrap() >= 200.0, "{advice}");
    let candidates = advice["candidates"].as_array().unwrap();
    for c in candidates {
        let mut keys: Vec<_> = c.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        let mut expected = CANDIDATE_KEYS.map(String::from).to_vec();
        expected.sort();
        assert_eq!(keys, expected, "{c}");
    }
    let share = |ms: u64| {
        candidates
            .iter()
            .find(|c| c["budget_ms"] == ms)
            .unwrap_or_else(|| panic!("no {ms} ms candidate: {advice}"))["replica_share"]
            .as_f64()
            .unwrap()
    };
    assert!(
        share(20) < 0.05,
        "20 ms cannot cover 200 ms of lag: {advice}"
    );
    assert!(share(1000) > 0.95, "1 s covers it: {advice}");
    assert_eq!(advice["recommended_budget_ms"], 1000, "{advice}");
    assert!(
        advice["reason"]
            .as_str()
            .unwrap()
            .starts_with("smallest budget"),
        "{advice}"
    );

    // The human table names the pick; bad values are refused with the reason, not dropped.
    let table = lsngate(&with(&[
        "--reads-per-second",
        "100",
        "--pool-size",
        "40",
        "--window",
        "500ms",
    ]));
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("recommended budget: "), "{text}");
    assert!(text.contains("replica share"), "{text}");
    for (args, message) in [
        (
            with(&["--reads-per-second", "0", "--pool-size", "4"]),
            "expected a positive number of token reads per second",
        ),
        (
            with(&["--reads-per-second", "10", "--pool-size", "0"]),
            "--pool-size",
        ),
        (
            with(&["--pool-size", "4"]),
            "--advise needs --reads-per-second N",
        ),
        (
            with(&["--reads-per-second", "10"]),
            "--advise needs --pool-size N",
        ),
        (
            with(&[
                "--reads-per-second",
                "10",
                "--pool-size",
                "4",
                "--window",
                "0s",
            ]),
            "must be more than zero",
        ),
        (
            vec!["lag", "--primary", &primary_url, "--pool-size", "4"],
            "--advise",
        ),
    ] {
        let output = lsngate_status(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} was accepted");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }

    // --serve: the proxy's what-if page for library users, from the same samples and model.
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut server = Command::new(env!("CARGO_BIN_EXE_lsngate"))
        .args(with(&[
            "--reads-per-second",
            "100",
            "--pool-size",
            "40",
            "--serve",
        ]))
        .arg(&listen)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let get = |path: &str| -> Option<String> {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(&listen).ok()?;
        write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        response.split("\r\n\r\n").nth(1).map(str::to_string)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let document = loop {
        let document: Option<Value> =
            get("/budget.json").and_then(|b| serde_json::from_str(&b).ok());
        if let Some(document) = document.clone().filter(|d| d["slider"].is_array()) {
            break document;
        }
        if std::time::Instant::now() > deadline {
            let _ = server.kill();
            panic!("--serve gave no advice within 30 s: {document:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let page = get("/budget").unwrap_or_default();
    let _ = server.kill();
    let _ = server.wait();
    let stop = |ms: u64| {
        document["slider"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["budget_ms"] == ms)
            .unwrap_or_else(|| panic!("no {ms} ms stop: {document}"))["replica_share"]
            .as_f64()
            .unwrap()
    };
    assert!(stop(20) < 0.05 && stop(1000) > 0.95, "{document}");
    assert_eq!(document["reads_per_second"], 100.0);
    assert!(
        document["replicas"][0]["replayed"].is_string(),
        "{document}"
    );
    assert!(page.contains("id=\"timeout\""), "the what-if page: {page}");
}

#[test]
fn cluster_up_status_down() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c");
    let path = path.to_str().unwrap();
    let up = lsngate(&["cluster", "up", "--replicas", "1", "--dir", path]);
    let env = String::from_utf8_lossy(&up.stdout);
    let primary = env
        .lines()
        .find_map(|l| l.strip_prefix("LSNGATE_PRIMARY_URL="))
        .unwrap();
    let replicas = env
        .lines()
        .find_map(|l| l.strip_prefix("LSNGATE_REPLICA_URLS="))
        .unwrap();
    assert!(
        primary.starts_with("postgres://postgres@127.0.0.1:"),
        "{env}"
    );
    assert_eq!(replicas.split(',').count(), 1);
    let status = lsngate(&["cluster", "status", "--dir", path]);
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.contains("primary") && status.contains("replica1") && status.contains("replica"),
        "{status}"
    );
    lsngate(&["cluster", "down", "--dir", path]);
    assert!(!std::path::Path::new(path).exists());
}

/// `lsngate` run in `cwd` with `TMPDIR` set, success or not.
fn lsngate_in(cwd: &Path, tmpdir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lsngate"))
        .args(args)
        .current_dir(cwd)
        .env("TMPDIR", tmpdir)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run lsngate")
}

/// A directory only its owner may enter, like /root where a root user clones the repository.
fn closed_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

/// An empty temp dir anyone may enter, to stand in for /tmp.
fn open_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self").unwrap().uid() == 0
}

/// The first run of a root user in a fresh clone under /root: `cluster up` with no --dir from a
/// directory the `lsngate` user cannot enter. It used to put the cluster there and fail in
/// initdb; the default is now $TMPDIR/lsngate-cluster-<user>, which `status` and `down` find
/// again without --dir.
#[test]
fn cluster_up_without_dir_works_from_a_directory_the_server_user_cannot_enter() {
    let (cwd, tmp) = (closed_dir(), open_dir());
    let run = |args: &[&str]| {
        let output = lsngate_in(cwd.path(), tmp.path(), args);
        assert!(
            output.status.success(),
            "lsngate {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        output
    };
    let up = run(&["cluster", "up", "--replicas", "1"]);
    let made: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(made.len(), 1, "one cluster directory in $TMPDIR: {made:?}");
    let dir = &made[0];
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("lsngate-cluster-"), "{name}");
    assert!(dir.join("cluster.json").exists());
    let said = String::from_utf8_lossy(&up.stderr);
    assert!(said.contains(&dir.display().to_string()), "{said}");
    assert!(
        String::from_utf8_lossy(&up.stdout).contains("LSNGATE_PRIMARY_URL=postgres://"),
        "{up:?}"
    );
    assert_eq!(
        std::fs::read_dir(cwd.path()).unwrap().count(),
        0,
        "nothing written in the current directory"
    );
    let status = run(&["cluster", "status"]);
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("replica1"),
        "{status:?}"
    );
    run(&["cluster", "down"]);
    assert!(!dir.exists());
}

/// An explicit --dir the `lsngate` user cannot reach: as root, refused before initdb with the
/// directory, the parent that blocks it and the fix, nothing created; as another user, whose
/// servers run as that user, it simply works.
#[test]
fn cluster_up_with_a_dir_the_server_user_cannot_enter_names_the_parent_and_the_fix() {
    let (closed, tmp) = (closed_dir(), open_dir());
    let dir = closed.path().join("c");
    let path = dir.to_str().unwrap();
    let up = lsngate_in(tmp.path(), tmp.path(), &["cluster", "up", "--dir", path]);
    if !is_root() {
        assert!(up.status.success(), "{up:?}");
        lsngate(&["cluster", "down", "--dir", path]);
        return;
    }
    assert!(!up.status.success(), "{up:?}");
    let said = String::from_utf8_lossy(&up.stderr);
    let blocker = format!(
        "`lsngate` cannot enter {} (mode 0700, owner root)",
        closed.path().display()
    );
    for part in [path, blocker.as_str(), "choose another --dir"] {
        assert!(said.contains(part), "{part:?} missing from: {said}");
    }
    assert!(
        !said.contains("initdb:"),
        "refused before initdb ran: {said}"
    );
    assert!(!dir.exists(), "nothing created");
}

#[test]
fn proxy_subcommand_splits_reads_passes_verify_and_stops_cleanly_on_sigterm() {
    let cluster = Cluster::start(&ClusterConfig::default().replicas(1)).unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut proxy = Command::new(env!("CARGO_BIN_EXE_lsngate"))
        .args([
            "proxy",
            "--listen",
            &listen,
            "--primary",
            &cluster.primary_url(),
        ])
        .args(["--replica", &cluster.replica_urls()[0]])
        .spawn()
        .expect("start lsngate proxy");
    let psql = PgBin::find(None).unwrap().tool("psql");
    let query = |sql: &str| {
        let output = Command::new(&psql)
            .args(["-X", "-A", "-t", "-h", "127.0.0.1", "-p", &port.to_string()])
            .args(["-U", "postgres", "-d", "postgres", "-c", sql])
            .env("PGCONNECT_TIMEOUT", "3")
            .output()
            .unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).trim().to_string(),
        )
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !query("SELECT 1").0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the proxy never accepted a client"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        query("SELECT pg_is_in_recovery()"),
        (true, "t".into()),
        "a plain read goes to the replica"
    );
    assert_eq!(
        query("/* lsngate:route=primary */ SELECT pg_is_in_recovery()"),
        (true, "f".into()),
        "a hinted read goes to the primary"
    );
    // verify --proxy: any deployment, no faults, the proxy's own counters not read.
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let doc = verify_clean(&[
        "--proxy",
        &url,
        "--seconds",
        "2",
        "--workers",
        "2",
        "--seed",
        "5",
    ]);
    assert!(doc["fallbacks"].is_null(), "{doc}");
    assert_eq!(doc["faults"], serde_json::json!({}), "{doc}");
    let status = Command::new("kill")
        .args(["-TERM", &proxy.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = proxy.wait().unwrap();
    assert!(exit.success(), "SIGTERM drains and exits 0: {exit}");
}

/// A free loopback port.
fn free_port() -> u16 {
    lsngate_cluster::free_port().unwrap()
}

/// `SELECT <sql>` through psql as `user` with `password` on 127.0.0.1:`port`, retried for up to
/// 20 s while the pooler starts: its output, or the last error.
fn psql_as(
    port: u16,
    user: &str,
    password: &str,
    database: &str,
    sql: &str,
) -> Result<String, String> {
    let psql = PgBin::find(None).unwrap().tool("psql");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let output = Command::new(&psql)
            .args([
                "-X",
                "-A",
                "-t",
                "-w",
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .args(["-U", user, "-d", database, "-c", sql])
            .env("PGPASSWORD", password)
            .env("PGCONNECT_TIMEOUT", "3")
            .output()
            .unwrap();
        if output.status.success() {
            return Ok(String::from_utf8_lossy(&output.stdout).trim().to_string());
        }
        let error = String::from_utf8_lossy(&output.stderr).to_string();
        if std::time::Instant::now() > deadline || !error.contains("Connection refused") {
            return Err(error);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn config_import_turns_a_pgbouncer_ini_pgbouncer_runs_into_a_config_the_proxy_runs() {
    // A pgbouncer.ini with the common settings, proven by PgBouncer itself (it starts and logs
    // a user of its auth_file in), then imported: the proxy starts from the output as it is and
    // logs the same user in, and the settings it cannot carry are named.
    let cluster = Cluster::start(&ClusterConfig::default().replicas(1)).unwrap();
    let dir = open_dir();
    let path = |name: &str| dir.path().join(name).display().to_string();
    std::fs::write(
        path("userlist.txt"),
        "\"app\" \"app-pw\"\n\"ops\" \"ops-pw\"\n",
    )
    .unwrap();
    let port = free_port();
    let ini = format!(
        "; the common settings of a transaction-pooling deployment\n\
         [databases]\n\
         postgres = host=127.0.0.1 port={primary} dbname=postgres user=postgres\n\
         \n\
         [pgbouncer]\n\
         listen_addr = 127.0.0.1\n\
         listen_port = {port}\n\
         unix_socket_dir =\n\
         auth_type = scram-sha-256\n\
         auth_file = {userlist}\n\
         admin_users = ops\n\
         stats_users = app\n\
         pool_mode = transaction\n\
         default_pool_size = 10\n\
         max_client_conn = 100\n\
         max_db_connections = 20\n\
         max_user_connections = 15\n\
         reserve_pool_size = 2\n\
         reserve_pool_timeout = 3\n\
         query_wait_timeout = 30\n\
         client_login_timeout = 60\n\
         idle_transaction_timeout = 0\n\
         server_idle_timeout = 300\n\
         server_lifetime = 3600\n\
         server_connect_timeout = 5\n\
         ignore_startup_parameters = extra_float_digits\n\
         logfile = {log}\n\
         pidfile = {pid}\n",
        primary = cluster.primary().port(),
        userlist = path("userlist.txt"),
        log = path("pgbouncer.log"),
        pid = path("pgbouncer.pid"),
    );
    let ini_path = path("pgbouncer.ini");
    std::fs::write(&ini_path, &ini).unwrap();
    let _ = Command::new("chown")
        .args(["-R", lsngate_cluster::SERVER_USER])
        .arg(dir.path())
        .status();
    let mut bouncer = Command::new("pgbouncer");
    if is_root() {
        bouncer.args(["-u", lsngate_cluster::SERVER_USER]);
    }
    let mut bouncer = bouncer.arg(&ini_path).spawn().expect("start pgbouncer");
    let through_pgbouncer = psql_as(port, "app", "app-pw", "postgres", "SELECT 41 + 1");
    let _ = bouncer.kill();
    let _ = bouncer.wait();
    assert_eq!(
        through_pgbouncer,
        Ok("42".into()),
        "PgBouncer runs this ini: {}",
        std::fs::read_to_string(path("pgbouncer.log")).unwrap_or_default()
    );

    let imported = lsngate(&["config", "import", &ini_path]);
    let toml = String::from_utf8_lossy(&imported.stdout).to_string();
    println!("{toml}");
    for line in [
        format!("listen = \"127.0.0.1:{port}\""),
        "pool_size = 10".into(),
        "acquire_timeout_ms = 30000".into(),
        "admin_users = [\"ops\"]".into(),
        "max_db_connections = 20".into(),
        "max_user_connections = 15".into(),
        "reserve_pool_size = 2".into(),
        "reserve_pool_timeout_ms = 3000".into(),
    ] {
        assert!(toml.contains(&line), "{line} in:\n{toml}");
    }
    for named in ["logfile", "ignore_startup_parameters"] {
        assert!(
            toml.contains(&format!("# - {named}")),
            "{named} named as not carried over:\n{toml}"
        );
    }
    std::fs::write(path("lsngate.toml"), &toml).unwrap();
    let mut proxy = Command::new(env!("CARGO_BIN_EXE_lsngate"))
        .args(["proxy", "--config", &path("lsngate.toml")])
        .spawn()
        .expect("start lsngate proxy");
    let through_lsngate = psql_as(port, "app", "app-pw", "postgres", "SELECT 41 + 1");
    let wrong = psql_as(port, "app", "wrong", "postgres", "SELECT 1");
    let console = psql_as(port, "ops", "ops-pw", "pgbouncer", "SHOW VERSION");
    let _ = proxy.kill();
    let _ = proxy.wait();
    assert_eq!(through_lsngate, Ok("42".into()));
    assert!(
        wrong
            .as_ref()
            .is_err_and(|e| e.contains("password authentication failed")),
        "{wrong:?}"
    );
    assert!(
        console.is_ok(),
        "the admin console for admin_users: {console:?}"
    );
}

/// Runs `lsngate cluster down --dir` on drop, so a failed assertion leaves no servers behind.
struct DownOnDrop(String);

impl Drop for DownOnDrop {
    fn drop(&mut self) {
        let _ = lsngate_status(&["cluster", "down", "--dir", &self.0]);
    }
}

/// `cluster up --patroni` leaves etcd and Patroni running after the command, prints the URLs,
/// and a later command finds them by the directory: `status` lists the members, `patroni-fault`
/// switches over and heals (what `lsngate verify --fault-hook scripts/patroni-fault-hook.sh`
/// runs), and `down` stops it all.
#[test]
fn cluster_up_patroni_status_fault_and_down() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p");
    let path = path.to_str().unwrap().to_string();
    let up = lsngate(&[
        "cluster",
        "up",
        "--patroni",
        "--replicas",
        "1",
        "--dir",
        &path,
    ]);
    let _down = DownOnDrop(path.clone());
    let env = String::from_utf8_lossy(&up.stdout);
    let line = |key: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {env}"))
            .to_string()
    };
    assert!(line("LSNGATE_PRIMARY_URL=").starts_with("postgres://postgres@127.0.0.1:"));
    assert_eq!(line("LSNGATE_REPLICA_URLS=").split(',').count(), 1);
    assert_eq!(line("LSNGATE_PATRONI_URLS=").split(',').count(), 2);
    assert!(
        String::from_utf8_lossy(&up.stderr).contains("patronictl: /usr/bin/patronictl -c "),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let status = lsngate(&["cluster", "status", "--dir", &path]);
    let status = String::from_utf8_lossy(&status.stdout).to_string();
    assert!(
        status.contains("member1") && status.contains("leader") && status.contains("member2"),
        "{status}"
    );
    let fault = lsngate(&[
        "cluster",
        "patroni-fault",
        "inject",
        "failover",
        "--dir",
        &path,
    ]);
    let said = String::from_utf8_lossy(&fault.stdout).to_string();
    assert!(
        said.starts_with("patronictl switchover member1 -> member2"),
        "{said}"
    );
    let healed = lsngate(&[
        "cluster",
        "patroni-fault",
        "heal",
        "failover",
        "--dir",
        &path,
    ]);
    let said = String::from_utf8_lossy(&healed.stdout).to_string();
    assert!(
        said.starts_with("leader member2 with 1 replica(s)"),
        "{said}"
    );
    lsngate(&["cluster", "down", "--dir", &path]);
    assert!(!std::path::Path::new(&path).exists());
}

/// The next datagram on `socket` (a proxy's `NOTIFY_SOCKET`), waiting at most 60 s.
fn notice(socket: &std::os::unix::net::UnixDatagram) -> String {
    socket
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut buf = [0u8; 512];
    let n = socket.recv(&mut buf).expect("a notification within 60 s");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn proxy_takeover_keeps_the_old_process_session_and_it_exits_once_that_leaves() {
    use std::io::{BufRead, BufReader, Write};
    let cluster = Cluster::start(&ClusterConfig::default().replicas(1)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let runtime_dir = dir.path().to_str().unwrap().to_string();
    let start = |name: &str| {
        let socket_path = dir.path().join(format!("{name}.notify"));
        let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_lsngate"))
            .args([
                "proxy",
                "--listen",
                &listen,
                "--primary",
                &cluster.primary_url(),
            ])
            .args(["--replica", &cluster.replica_urls()[0]])
            .args(["--runtime-dir", &runtime_dir, "--takeover"])
            .env("NOTIFY_SOCKET", &socket_path)
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start lsngate proxy");
        assert_eq!(notice(&socket), format!("READY=1\nMAINPID={}", child.id()));
        (child, socket)
    };
    // Nothing to take over yet: the first process binds the port.
    let (mut old, old_notices) = start("old");
    let psql = PgBin::find(None).unwrap().tool("psql");
    let mut session = Command::new(&psql)
        .args([
            "-X",
            "-A",
            "-t",
            "-q",
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .args(["-U", "postgres", "-d", "postgres"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = session.stdin.take().unwrap();
    let mut output = BufReader::new(session.stdout.take().unwrap());
    let mut ask = |sql: &str| {
        writeln!(input, "{sql}").unwrap();
        let mut line = String::new();
        output.read_line(&mut line).unwrap();
        line.trim().to_string()
    };
    assert_eq!(ask("BEGIN; SELECT 41 + 1;"), "42");
    let (mut new, _new_notices) = start("new");
    assert_eq!(notice(&old_notices), "STOPPING=1", "the old process drains");
    // The old process's client goes on inside its transaction, and after it.
    assert_eq!(ask("SELECT 43; COMMIT;"), "43");
    assert_eq!(ask("SELECT 44;"), "44");
    assert!(
        old.try_wait().unwrap().is_none(),
        "its client is still there"
    );
    // New clients reach the new process.
    assert_eq!(
        psql_as(port, "postgres", "", "postgres", "SELECT 1"),
        Ok("1".into())
    );
    drop(input);
    assert!(session.wait().unwrap().success());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let exit = loop {
        if let Some(exit) = old.try_wait().unwrap() {
            break exit;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the old process did not exit once its client left"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "{exit}");
    assert!(new.try_wait().unwrap().is_none());
    assert!(
        Command::new("kill")
            .args(["-TERM", &new.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    assert!(new.wait().unwrap().success());
}
