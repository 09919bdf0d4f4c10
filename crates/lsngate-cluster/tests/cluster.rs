//! The harness proves itself on real servers: replication works, WAIT FOR LSN behaves as the
//! background doc says (PostgreSQL 19), pausing replay makes a replica stale, promotion makes it
//! writable, the fault helpers do what they say, and a cluster directory the servers' user
//! cannot reach is refused before any server program runs.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use lsngate_cluster::{Cluster, ClusterConfig, Error, SyncMode, shared_cluster};

#[path = "cluster/patroni.rs"]
mod patroni;
#[path = "cluster/pgbouncer.rs"]
mod pgbouncer;
#[path = "cluster/pgpool.rs"]
mod pgpool;

const SETTLE: Duration = Duration::from_secs(30);

#[test]
fn insert_on_primary_becomes_visible_on_every_replica() {
    let cluster = shared_cluster();
    let primary = cluster.primary();
    primary
        .sql("CREATE TABLE visible (id int PRIMARY KEY, note text)")
        .unwrap();
    primary
        .sql("INSERT INTO visible VALUES (1, 'hello')")
        .unwrap();
    let position = primary.sql("SELECT pg_current_wal_insert_lsn()").unwrap();
    assert_eq!(cluster.replicas().len(), 2);
    for replica in cluster.replicas() {
        assert!(replica.is_in_recovery().unwrap());
        replica.wait_replayed(&position, SETTLE).unwrap();
        assert_eq!(
            replica
                .sql("SELECT note FROM visible WHERE id = 1")
                .unwrap(),
            "hello",
            "{} must see the row once it replayed {position}",
            replica.name()
        );
    }
}

#[test]
fn wait_for_lsn_answers_success_and_timeout_on_19() {
    let cluster = shared_cluster();
    if !cluster.pg_bin().has_wait_for() {
        // PostgreSQL ≤ 18 has no WAIT FOR; prove the statement really is absent there, so this
        // branch fails if detection is wrong.
        let err = cluster
            .replica(0)
            .sql("WAIT FOR LSN '0/1' WITH (NO_THROW)")
            .unwrap_err();
        assert!(err.to_string().contains("syntax error"), "{err}");
        return;
    }
    let primary = cluster.primary();
    primary
        .sql("CREATE TABLE IF NOT EXISTS waits (id int)")
        .unwrap();
    primary.sql("INSERT INTO waits VALUES (1)").unwrap();
    let position = primary.sql("SELECT pg_current_wal_insert_lsn()").unwrap();
    let replica = cluster.replica(1);
    let status = replica
        .sql(&format!(
            "WAIT FOR LSN '{position}' WITH (MODE 'standby_replay', TIMEOUT '10s', NO_THROW)"
        ))
        .unwrap();
    assert_eq!(status, "success");
    let future = "FFFF/0";
    let status = replica
        .sql(&format!(
            "WAIT FOR LSN '{future}' WITH (TIMEOUT '50ms', NO_THROW)"
        ))
        .unwrap();
    assert_eq!(status, "timeout");
    let status = primary
        .sql(&format!(
            "WAIT FOR LSN '{position}' WITH (TIMEOUT '50ms', NO_THROW)"
        ))
        .unwrap();
    assert_eq!(status, "not in recovery");
}

#[tokio::test]
async fn connect_gives_a_working_driver_connection() {
    let cluster = shared_cluster();
    let client = cluster.replica(0).connect().await.unwrap();
    let row = client
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0));
    assert!(
        cluster
            .primary_url()
            .starts_with("postgres://postgres@127.0.0.1:")
    );
    assert_eq!(cluster.replica_urls().len(), 2);
}

#[test]
fn paused_replay_makes_a_replica_stale_until_resumed() {
    let cluster = Cluster::start(&ClusterConfig::default().replicas(1)).unwrap();
    let (primary, replica) = (cluster.primary(), cluster.replica(0));
    primary.sql("CREATE TABLE paused (id int)").unwrap();
    cluster.wait_caught_up(SETTLE).unwrap();
    replica.pause_replay().unwrap();
    primary.sql("INSERT INTO paused VALUES (1)").unwrap();
    let position = primary.sql("SELECT pg_current_wal_insert_lsn()").unwrap();
    // Received but not replayed: the replica is streaming, yet the row is not there.
    primary
        .wait_until("replica received the insert", SETTLE, || {
            Ok(primary.sql(&format!(
                "SELECT count(*) FROM pg_stat_replication WHERE flush_lsn >= '{position}'"
            ))? == "1")
        })
        .unwrap();
    assert_eq!(replica.sql("SELECT count(*) FROM paused").unwrap(), "0");
    assert_eq!(
        replica
            .sql(&format!("SELECT pg_last_wal_replay_lsn() >= '{position}'"))
            .unwrap(),
        "f"
    );
    replica.resume_replay().unwrap();
    replica.wait_replayed(&position, SETTLE).unwrap();
    assert_eq!(replica.sql("SELECT count(*) FROM paused").unwrap(), "1");
}

#[test]
fn fault_helpers_stop_kill_freeze_and_restart_a_replica() {
    let cluster = Cluster::start(&ClusterConfig::default().replicas(1)).unwrap();
    let replica = cluster.replica(0);
    replica.kill().unwrap();
    assert!(
        replica.sql("SELECT 1").is_err(),
        "a killed replica answers nothing"
    );
    replica.start().unwrap();
    cluster.wait_streaming(SETTLE).unwrap();
    replica.stop().unwrap();
    assert!(replica.sql("SELECT 1").is_err());
    replica.start().unwrap();
    replica.freeze();
    // psql gives up after PGCONNECT_TIMEOUT; a frozen server accepts the TCP connection in the
    // kernel but never answers the startup.
    assert!(
        replica.sql("SELECT 1").is_err(),
        "a frozen replica answers nothing"
    );
    replica.thaw();
    assert_eq!(replica.sql("SELECT 1").unwrap(), "1");
    replica.set_apply_delay(Duration::from_millis(250)).unwrap();
    replica
        .wait_until("delay applied", SETTLE, || {
            Ok(replica.sql("SHOW recovery_min_apply_delay")? == "250ms")
        })
        .unwrap();
}

#[test]
fn promotion_makes_a_replica_writable() {
    let cluster = Cluster::start(&ClusterConfig::default().replicas(1)).unwrap();
    let replica = cluster.replica(0);
    let err = replica.sql("CREATE TABLE nope (id int)").unwrap_err();
    assert!(err.to_string().contains("read-only transaction"), "{err}");
    replica.promote().unwrap();
    assert!(!replica.is_in_recovery().unwrap());
    replica.sql("CREATE TABLE promoted (id int)").unwrap();
    replica.sql("INSERT INTO promoted VALUES (1)").unwrap();
    assert_eq!(replica.sql("SELECT count(*) FROM promoted").unwrap(), "1");
}

#[test]
fn remote_apply_makes_commits_visible_on_the_sync_standby_at_once() {
    let config = ClusterConfig::default()
        .replicas(1)
        .sync(SyncMode::RemoteApply)
        .apply_delay(Duration::from_millis(1))
        .hot_standby_feedback(true);
    let cluster = Cluster::start(&config).unwrap();
    let (primary, replica) = (cluster.primary(), cluster.replica(0));
    assert_eq!(
        primary.sql("SHOW synchronous_commit").unwrap(),
        "remote_apply"
    );
    assert_eq!(replica.sql("SHOW hot_standby_feedback").unwrap(), "on");
    primary.sql("CREATE TABLE applied (id int)").unwrap();
    for i in 0..20 {
        primary
            .sql(&format!("INSERT INTO applied VALUES ({i})"))
            .unwrap();
        // COMMIT returned only after replica1 replayed it: no wait needed.
        assert_eq!(
            replica.sql("SELECT count(*) FROM applied").unwrap(),
            (i + 1).to_string()
        );
    }
}

#[test]
fn a_detached_cluster_is_found_again_by_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c");
    let started = Cluster::start(&ClusterConfig::default().replicas(1).dir(&path)).unwrap();
    let port = started.primary().port();
    let kept = started.detach();
    let again = Cluster::open(&kept).unwrap();
    assert_eq!(again.primary().port(), port);
    assert_eq!(again.primary().sql("SELECT 1").unwrap(), "1");
    assert!(again.replica(0).is_in_recovery().unwrap());
    let err = Cluster::start(&ClusterConfig::default().dir(&path)).unwrap_err();
    assert!(err.to_string().contains("already holds a cluster"), "{err}");
    again.destroy().unwrap();
    assert!(!path.exists());
}

/// As root, servers run as `lsngate`: a cluster directory inside a root-only (0700) directory is
/// refused before initdb runs, naming the parent that blocks it and the fix, and nothing is left
/// behind. (It used to reach initdb, whose "Permission denied" ran into its next output line.)
/// Run by another user, servers run as that user, who can use the directory, so it starts.
#[test]
fn a_cluster_dir_the_server_user_cannot_enter_is_refused_before_initdb() {
    let closed = tempfile::tempdir().unwrap();
    std::fs::set_permissions(closed.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let dir = closed.path().join("cluster");
    let result = Cluster::start(&ClusterConfig::default().replicas(0).dir(&dir));
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        result
            .expect("servers run as this user, who owns the directory")
            .destroy()
            .unwrap();
        return;
    }
    let error = result.expect_err("the lsngate user cannot enter a root-only directory");
    assert!(matches!(error, Error::DirUnreachable { .. }), "{error:?}");
    let text = error.to_string();
    let blocker = format!(
        "`lsngate` cannot enter {} (mode 0700, owner root)",
        closed.path().display()
    );
    for part in [
        dir.display().to_string().as_str(),
        blocker.as_str(),
        "choose another --dir",
    ] {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }
    assert!(
        !text.contains("initdb:"),
        "initdb must not have run: {text}"
    );
    assert!(
        !dir.exists(),
        "nothing left behind in {}",
        closed.path().display()
    );
}

/// Found by a million-operation `lsngate verify` run: a failover right after the replica had
/// restarted (its WAL receiver not yet connected) stopped the primary, and the replica never
/// got the shutdown checkpoint, so it could not be promoted and the cluster was left with no
/// primary. A hand-over to a replica that does not stream is now refused before anything stops.
#[test]
fn a_hand_over_to_a_replica_that_does_not_stream_is_refused_and_the_primary_stays() {
    let cluster = Cluster::start(&ClusterConfig::default().replicas(1)).unwrap();
    let (primary, replica) = (cluster.primary(), cluster.replica(0));
    // The replica streams from a port nobody listens on.
    replica
        .set(
            "primary_conninfo",
            "host=127.0.0.1 port=1 user=postgres application_name=replica1",
        )
        .unwrap();
    let gone = std::time::Instant::now() + Duration::from_secs(30);
    while primary
        .sql("SELECT count(*) FROM pg_stat_replication")
        .unwrap()
        != "0"
    {
        assert!(
            std::time::Instant::now() < gone,
            "the replica kept streaming"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let refused = primary.hand_over_to(replica).unwrap_err().to_string();
    assert!(refused.contains("streaming"), "{refused}");
    assert!(!primary.is_in_recovery().unwrap(), "the primary still runs");
    primary.sql("CREATE TABLE still_primary (x int)").unwrap();
    // Streaming again, the hand-over goes through and the old primary follows the new one.
    replica.follow(primary).unwrap();
    primary.hand_over_to(replica).unwrap();
    assert!(!replica.is_in_recovery().unwrap());
    primary.follow(replica).unwrap();
    replica.sql("INSERT INTO still_primary VALUES (1)").unwrap();
    let at = replica.position().unwrap();
    primary.wait_replayed(&at, Duration::from_secs(30)).unwrap();
    assert_eq!(
        primary.sql("SELECT count(*) FROM still_primary").unwrap(),
        "1"
    );
}
