//! Tests on the shared cluster (nothing here pauses, kills or promotes a node).

use std::time::{Duration, SystemTime};

use lsngate::{Error, Fallback, FallbackReason, Lsn, ServedBy, Token, TokenCodec, TokenError};
use lsngate_cluster::shared_cluster;

use crate::support::{self, Forwarder};

/// The headline: 8 tasks × 1000 insert-then-read, no injected delay: 0 stale, ≥ 99 % replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_tasks_insert_then_read_never_stale_and_stay_on_replicas() {
    let cluster = shared_cluster();
    support::table(cluster, "rw_headline");
    let gate = support::gate(cluster, |c| c).await;
    let began = std::time::Instant::now();
    let tally = support::concurrent(&gate, "rw_headline", 8, 1000).await;
    // Printed for the report, never asserted: timing belongs in the benchmark.
    println!("headline: {tally:?} in {:?}", began.elapsed());
    assert!(
        tally.errors.is_empty(),
        "{:?}",
        &tally.errors[..tally.errors.len().min(5)]
    );
    assert_eq!(tally.ops, 8000);
    assert_eq!(tally.stale, 0, "stale reads: {tally:?}");
    assert!(
        tally.replica * 100 >= tally.ops * 99,
        "only {} of {} reads on a replica: {tally:?}",
        tally.replica,
        tally.ops
    );
}

/// Tokens from clients: each refusal has its own typed error, and a bogus position far ahead of
/// the primary costs the budget, never a hang.
#[tokio::test]
async fn tampered_expired_and_malformed_tokens_get_their_errors() {
    let cluster = shared_cluster();
    let codec = TokenCodec::signed(b"test key".to_vec()).with_ttl(Duration::from_secs(30));
    let gate = support::gate(cluster, |c| c.token_codec(codec.clone())).await;
    let token = gate.primary_position().await.unwrap();
    assert!(
        token.timeline.is_some(),
        "the token carries the primary's timeline"
    );
    let text = gate.issue(&token);
    assert_eq!(gate.verify(&text).unwrap().lsn, token.lsn);

    let ahead = Token::new(Lsn::new(token.lsn.as_u64() + 0x1_0000_0000));
    let forged = codec.issue(&ahead, SystemTime::now());
    let signature = &text[text.find(".s").unwrap()..];
    let tampered = format!("{}{signature}", &forged[..forged.find(".s").unwrap()]);
    assert!(matches!(
        gate.verify(&tampered),
        Err(Error::Token(TokenError::BadSignature))
    ));

    let old = codec.issue(&token, SystemTime::now() - Duration::from_secs(120));
    assert!(matches!(
        gate.verify(&old),
        Err(Error::Token(TokenError::Expired { .. }))
    ));

    let malformed = gate.verify("0/XYZ' OR 1=1 --").unwrap_err();
    assert!(
        matches!(malformed, Error::Token(TokenError::Lsn(_))),
        "{malformed}"
    );
    assert!(
        malformed.to_string().contains("like 0/3F8A120"),
        "{malformed}"
    );
    assert!(matches!(
        gate.verify(""),
        Err(Error::Token(TokenError::Empty))
    ));
    assert!(matches!(
        gate.verify("0/42"),
        Err(Error::Token(TokenError::Unsigned))
    ));

    // A token the primary never reached: the budget is spent, the read falls back.
    let budget = Duration::from_millis(150);
    let read = gate
        .read()
        .after(ahead)
        .budget(budget)
        .query("SELECT 1", &[])
        .await
        .unwrap();
    assert_eq!(read.served.by, ServedBy::Primary);
    assert_eq!(read.served.fallback, Some(FallbackReason::BudgetSpent));
    assert!(
        read.served.wait_time < budget + Duration::from_secs(5),
        "hang detector"
    );
    let refused = gate
        .read()
        .after(ahead)
        .budget(budget)
        .fallback(Fallback::Error)
        .query("SELECT 1", &[])
        .await
        .unwrap_err();
    match &refused {
        Error::NotReplayed {
            token,
            reason,
            replicas,
        } => {
            assert_eq!(*token, Some(ahead.lsn));
            assert_eq!(*reason, FallbackReason::BudgetSpent);
            assert_eq!(replicas.len(), 2);
        }
        other => panic!("{other}"),
    }
    assert!(
        refused.to_string().contains("raise the budget"),
        "{refused}"
    );
}

/// A token from a timeline newer than any primary the gate has seen (a failover it has not
/// noticed yet) is served only by replicas on that timeline; here none is, so the primary
/// answers, and the reason names the timeline. (Older timelines: `lsngate_core::timeline`'s
/// `floor_predates`, and the promotion tests in `faults.rs`.)
#[tokio::test]
async fn token_from_another_timeline_reads_the_primary() {
    let cluster = shared_cluster();
    let gate = support::gate(cluster, |c| c).await;
    let token = gate.primary_position().await.unwrap();
    let other = Token {
        timeline: token.timeline.map(|t| t + 1),
        ..token
    };
    let read = gate.query_after(&other, "SELECT 1", &[]).await.unwrap();
    assert_eq!(read.served.by, ServedBy::Primary);
    assert_eq!(read.served.fallback, Some(FallbackReason::TimelineChanged));
    let read = gate.query_after(&token, "SELECT 1", &[]).await.unwrap();
    assert!(matches!(read.served.by, ServedBy::Replica(_)));
}

/// Transactions, own-commit tokens, statement errors, and token-less reads.
#[tokio::test]
async fn transaction_helper_and_token_less_reads() {
    let cluster = shared_cluster();
    support::table(cluster, "rw_tx");
    let gate = support::gate(cluster, |c| c).await;
    let (id, token) = gate
        .transaction(|tx| {
            Box::pin(async move {
                tx.execute("INSERT INTO rw_tx VALUES (1, 'one')", &[])
                    .await?;
                let row = tx
                    .query_one("INSERT INTO rw_tx VALUES (2, 'two') RETURNING id", &[])
                    .await?;
                Ok(row.get::<_, i64>(0))
            })
        })
        .await
        .unwrap();
    assert_eq!(id, 2);
    let read = gate
        .query_after(&token, "SELECT count(*) FROM rw_tx", &[])
        .await
        .unwrap();
    assert_eq!(read.rows[0].get::<_, i64>(0), 2);
    assert!(matches!(read.served.by, ServedBy::Replica(_)));

    // An autocommit write that returns rows: the rows and the token from one flight.
    let (rows, returned) = gate
        .write_returning(
            "INSERT INTO rw_tx VALUES (40, 'forty') RETURNING id, note",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, i64>(0), 40);
    assert_eq!(rows[0].get::<_, String>(1), "forty");
    assert!(returned.lsn > token.lsn, "a later commit has a later token");
    // The timeline comes from what the connection learned when it opened: 1 on a fresh cluster.
    assert_eq!(token.timeline, Some(1), "transaction token: {token:?}");
    assert_eq!(returned.timeline, Some(1), "autocommit token: {returned:?}");
    let read = gate
        .query_after(&returned, "SELECT note FROM rw_tx WHERE id = 40", &[])
        .await
        .unwrap();
    assert_eq!(read.rows[0].get::<_, String>(0), "forty");
    let (none, _) = gate
        .write_returning("UPDATE rw_tx SET note = 'FORTY' WHERE id = 40", &[])
        .await
        .unwrap();
    assert!(none.is_empty(), "no RETURNING, no rows");

    // A failing transaction is rolled back and its error returned, not retried.
    let failed = gate
        .transaction(|tx| {
            Box::pin(async move { tx.execute("INSERT INTO rw_tx VALUES (1, 'dup')", &[]).await })
        })
        .await
        .unwrap_err();
    assert!(matches!(failed, Error::Query { .. }), "{failed}");

    // A commit the caller made on its own connection.
    let client = cluster.primary().connect().await.unwrap();
    client
        .batch_execute("INSERT INTO rw_tx VALUES (3, 'three')")
        .await
        .unwrap();
    let own = lsngate::commit_token(&client).await.unwrap();
    assert!(own.lsn > token.lsn);
    let read = gate
        .query_after(&own, "SELECT note FROM rw_tx WHERE id = 3", &[])
        .await
        .unwrap();
    assert_eq!(read.rows[0].get::<_, String>(0), "three");

    // A statement error on a replica is the caller's error, never re-run on the primary.
    let bad = gate
        .query_after(&own, "SELECT no_such_column FROM rw_tx", &[])
        .await
        .unwrap_err();
    assert!(matches!(bad, Error::Query { .. }), "{bad}");

    // Token-less reads spread over both replicas.
    let mut nodes = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let read = gate.query("SELECT 1", &[]).await.unwrap();
        assert_eq!(read.served.fallback, None);
        nodes.insert(read.served.node);
    }
    assert_eq!(nodes.len(), 2, "{nodes:?}");

    // An open transaction dropped without commit is rolled back.
    {
        let tx = gate.begin().await.unwrap();
        tx.execute("INSERT INTO rw_tx VALUES (4, 'never')", &[])
            .await
            .unwrap();
    }
    let after = gate.primary_position().await.unwrap();
    let read = gate
        .query_after(&after, "SELECT count(*) FROM rw_tx WHERE id = 4", &[])
        .await
        .unwrap();
    assert_eq!(read.rows[0].get::<_, i64>(0), 0);
}

/// The commit and its token leave in one flight; so does a read whose wait is needed
/// (PostgreSQL 19) and a read already known covered (any version).
#[tokio::test]
async fn commit_token_and_wait_plus_read_are_one_flight_each() {
    let cluster = shared_cluster();
    support::table(cluster, "rw_flight");
    let primary = Forwarder::start(vec![cluster.primary().port()]).await;
    let replica = Forwarder::start(vec![cluster.replica(0).port()]).await;
    let gate = lsngate::Gate::connect(
        lsngate::Config::new(primary.url())
            .replica(replica.url())
            .pool_size(1)
            // The monitor polls once at start, then stays out of the flight counts.
            .poll_interval(Duration::from_secs(3600)),
    )
    .await
    .unwrap();
    // The monitor's one round is over once it has the replica's lag, which needs both the
    // primary's and the replica's answer (this used to be a 300 ms sleep).
    support::until("the monitor's first round", || {
        let status = gate.replicas();
        status[0]
            .lag_bytes
            .map(drop)
            .ok_or_else(|| format!("{status:?}"))
    })
    .await;
    let insert = "INSERT INTO rw_flight VALUES ($1, 'x')";
    let select = "SELECT note FROM rw_flight WHERE id = $1";
    // Warm up: prepares both statements on their single connections.
    let warm = gate.write(insert, &[&0i64]).await.unwrap();
    gate.query_after(&warm.token, select, &[&0i64])
        .await
        .unwrap();

    let tx = gate.begin().await.unwrap();
    tx.execute("INSERT INTO rw_flight VALUES (1, 'tx')", &[])
        .await
        .unwrap();
    let before = primary.flights();
    let token = tx.commit().await.unwrap();
    assert_eq!(
        primary.flights() - before,
        1,
        "COMMIT + position in one flight"
    );

    let before = primary.flights();
    let written = gate.write(insert, &[&2i64]).await.unwrap();
    assert_eq!(
        primary.flights() - before,
        1,
        "statement + position in one flight"
    );
    assert!(written.token.lsn > token.lsn);

    let before = replica.flights();
    let read = gate
        .query_after(&written.token, select, &[&2i64])
        .await
        .unwrap();
    assert_eq!(read.served.by, ServedBy::Replica(0));
    assert_eq!(read.rows.len(), 1);
    if cluster.pg_bin().has_wait_for() {
        assert!(read.served.waited, "the watcher cannot know this token yet");
        assert_eq!(
            replica.flights() - before,
            1,
            "WAIT FOR + read in one flight"
        );
    }
    let before = replica.flights();
    let again = gate
        .query_after(&written.token, select, &[&2i64])
        .await
        .unwrap();
    assert!(!again.served.waited, "known covered: no wait");
    assert_eq!(
        replica.flights() - before,
        1,
        "a covered read is the read alone"
    );
}

/// Reads by outcome, wait time, per-replica position and lag reach the `metrics` facade.
#[tokio::test]
async fn metrics_report_outcomes_waits_and_replica_positions() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    static SNAPSHOTTER: std::sync::OnceLock<metrics_util::debugging::Snapshotter> =
        std::sync::OnceLock::new();
    let snapshotter = SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("first recorder in this binary");
        snapshotter
    });
    let cluster = shared_cluster();
    support::table(cluster, "rw_metrics");
    let gate = support::gate(cluster, |c| c).await;
    let tally = support::insert_then_read(&gate, "rw_metrics", 1, 20).await;
    assert_eq!(tally.stale, 0);
    let far = Token::new(Lsn::new(u64::MAX >> 8));
    gate.read()
        .after(far)
        .budget(Duration::from_millis(20))
        .query("SELECT 1", &[])
        .await
        .unwrap();
    // A snapshot drains the counters, so snapshots are merged until the monitor has exported
    // both replicas' gauges (this used to be one snapshot after a 100 ms sleep).
    let mut snapshot: Vec<(metrics_util::CompositeKey, DebugValue)> = Vec::new();
    let has = |snapshot: &[(metrics_util::CompositeKey, DebugValue)], name: &str, replica: &str| {
        snapshot.iter().any(|(key, _)| {
            key.key().name() == name && key.key().labels().any(|l| l.value() == replica)
        })
    };
    let gauges = [
        lsngate::metrics::REPLAYED_LSN,
        lsngate::metrics::LAG_BYTES,
        lsngate::metrics::LAG_SECONDS,
    ];
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            match snapshot.iter_mut().find(|(k, _)| *k == key) {
                Some((_, DebugValue::Counter(total))) => {
                    if let DebugValue::Counter(n) = value {
                        *total += n;
                    }
                }
                Some((_, DebugValue::Histogram(all))) => {
                    if let DebugValue::Histogram(more) = value {
                        all.extend(more);
                    }
                }
                Some((_, old)) => *old = value,
                None => snapshot.push((key, value)),
            }
        }
        let exported = ["replica0", "replica1"]
            .iter()
            .all(|replica| gauges.iter().all(|name| has(&snapshot, name, replica)));
        if exported {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the monitor never exported both replicas' gauges: {snapshot:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let find = |name: &str, label: Option<(&str, &str)>| {
        snapshot.iter().find(|(key, _)| {
            let key = key.key();
            key.name() == name
                && label.is_none_or(|(k, v)| key.labels().any(|l| l.key() == k && l.value() == v))
        })
    };
    let counter = |name, label| match find(name, Some(label)) {
        Some((_, DebugValue::Counter(n))) => *n,
        other => panic!("{name} {label:?}: {other:?}"),
    };
    assert!(counter(lsngate::metrics::READS, ("outcome", "replica_after_wait")) > 0);
    assert!(counter(lsngate::metrics::READS, ("outcome", "primary_fallback")) > 0);
    assert!(counter(lsngate::metrics::FALLBACKS, ("reason", "budget spent")) > 0);
    assert!(
        matches!(find(lsngate::metrics::WAIT_SECONDS, None), Some((_, DebugValue::Histogram(v))) if !v.is_empty())
    );
    for replica in ["replica0", "replica1"] {
        assert!(
            matches!(find(lsngate::metrics::REPLAYED_LSN, Some(("replica", replica))), Some((_, DebugValue::Gauge(v))) if v.0 > 0.0)
        );
        assert!(find(lsngate::metrics::LAG_BYTES, Some(("replica", replica))).is_some());
        assert!(find(lsngate::metrics::LAG_SECONDS, Some(("replica", replica))).is_some());
    }
    assert!(find(lsngate::metrics::FALLBACK_RATE, None).is_some());
    assert!(find(lsngate::metrics::BREAKER_OPEN, None).is_some());
}

/// Connections go through the configured TLS connector, which follows each URL's `sslmode`
/// (only the plumbing is tested here: the test servers do not serve TLS).
#[tokio::test]
async fn tls_connector_is_used_for_every_connection() {
    let cluster = shared_cluster();
    let config = lsngate::Config::new(cluster.primary_url())
        .replicas(cluster.replica_urls())
        .tls(tokio_postgres::NoTls);
    let gate = lsngate::Gate::connect(config).await.unwrap();
    let token = gate.primary_position().await.unwrap();
    gate.query_after(&token, "SELECT 1", &[]).await.unwrap();
    let strict = lsngate::Config::new(format!("{}?sslmode=require", cluster.primary_url()))
        .tls(tokio_postgres::NoTls);
    let strict = lsngate::Gate::connect(strict).await.unwrap();
    let error = strict.primary_position().await.unwrap_err();
    assert!(matches!(error, Error::PrimaryUnavailable { .. }), "{error}");
    assert!(error.to_string().contains("check that it is up"), "{error}");
}

/// Reads go to the least busy replica: while one replica serves a long read of this gate, the
/// gate's other reads all go to the other one.
///
/// The long read waits for an advisory lock the test holds on both replicas and releases only
/// after the other reads, so it is still running however slow they are (it was a 2 s
/// `pg_sleep`, which a loaded machine could outlast).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_go_to_the_least_busy_replica() {
    let cluster = shared_cluster();
    // A grace long enough that the long read is not taken for an unreachable replica; one
    // monitor poll only (at start), as its probes borrow a connection of the same pools.
    let gate = std::sync::Arc::new(
        support::gate(cluster, |c| {
            c.io_grace(Duration::from_secs(30))
                .poll_interval(Duration::from_secs(3600))
        })
        .await,
    );
    support::until("both replicas healthy", || {
        let status = gate.replicas();
        (status.iter().filter(|r| r.healthy).count() == 2)
            .then_some(())
            .ok_or_else(|| format!("{status:?}"))
    })
    .await;
    // Advisory locks work on a hot standby; the key is this test binary's own.
    let key = 0x6c73_6e00_0000_0000_i64 | i64::from(std::process::id());
    let mut holders = Vec::new();
    for replica in cluster.replicas() {
        let holder = replica.connect().await.unwrap();
        holder
            .simple_query(&format!("SELECT pg_advisory_lock({key})"))
            .await
            .unwrap();
        holders.push(holder);
    }
    let marker = format!("least_busy_{}", std::process::id());
    let slow_sql = format!(
        "SELECT pg_advisory_lock_shared({key})::text, pg_advisory_unlock_shared({key}) AS {marker}"
    );
    let slow = tokio::spawn({
        let gate = std::sync::Arc::clone(&gate);
        async move { gate.query(&slow_sql, &[]).await.unwrap().served }
    });
    // Which replica runs the long read, seen from the servers themselves: waiting for the lock.
    let running = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%AS {marker}' \
         AND state = 'active' AND wait_event_type = 'Lock'"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let busy = loop {
        let on: Vec<usize> = (0..2)
            .filter(|&i| cluster.replica(i).sql(&running).unwrap().trim() == "1")
            .collect();
        if let [index] = on[..] {
            break index;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the long read never showed on a replica"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    for _ in 0..10 {
        let read = gate.query("SELECT 1", &[]).await.unwrap();
        assert_eq!(
            read.served.by,
            ServedBy::Replica(1 - busy),
            "a read went to the busy replica{busy} while the other was idle"
        );
    }
    for holder in &holders {
        holder
            .simple_query(&format!("SELECT pg_advisory_unlock({key})"))
            .await
            .unwrap();
    }
    let served = tokio::time::timeout(Duration::from_secs(30), slow)
        .await
        .expect("the long read ends once the lock is released")
        .unwrap();
    assert_eq!(served.by, ServedBy::Replica(busy));
}
