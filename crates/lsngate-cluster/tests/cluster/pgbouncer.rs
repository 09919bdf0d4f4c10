//! The kit's PgBouncer on real servers: each database it is given reaches its own server, the
//! pool mode asked for is the one it runs, and dropping it stops it.

use std::time::{Duration, Instant};

use lsngate_cluster::{Pgbouncer, PgbouncerConfig, PoolMode, shared_cluster};

/// `pg_is_in_recovery()` and the port of the server that answered, through `client`.
async fn server_of(client: &tokio_postgres::Client) -> (bool, String) {
    let row = client
        .query_one(
            "SELECT pg_is_in_recovery(), current_setting('port') WHERE $1::int = 1",
            &[&1i32],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn each_database_reaches_its_own_server_and_pgbouncer_stops_when_dropped() {
    let cluster = shared_cluster();
    let config = PgbouncerConfig::default()
        .database("primary", &cluster.primary_url())
        .unwrap()
        .database("replica0", &cluster.replica_urls()[0])
        .unwrap()
        .pool_mode(PoolMode::Session);
    let pgbouncer = tokio::task::spawn_blocking(move || Pgbouncer::start(&config))
        .await
        .unwrap()
        .unwrap();
    // A prepared statement with a parameter (tokio-postgres names it): session pooling keeps it
    // on the client's server connection.
    let primary = pgbouncer.connect("primary").await.unwrap();
    let replica = pgbouncer.connect("replica0").await.unwrap();
    assert_eq!(
        server_of(&primary).await,
        (false, cluster.primary().port().to_string())
    );
    assert_eq!(
        server_of(&replica).await,
        (true, cluster.replica(0).port().to_string())
    );
    drop((primary, replica));

    let (pid, port) = (pgbouncer.pid(), pgbouncer.port());
    drop(pgbouncer);
    let deadline = Instant::now() + Duration::from_secs(10);
    let alive = || std::path::Path::new(&format!("/proc/{pid}")).exists();
    while alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !alive(),
        "PgBouncer ({pid}) still running after it was dropped"
    );
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "something still listens on PgBouncer's port {port}"
    );
}

#[tokio::test]
async fn in_transaction_pooling_two_clients_share_one_server_connection() {
    let cluster = shared_cluster();
    let config = PgbouncerConfig::default()
        .database("postgres", &cluster.primary_url())
        .unwrap()
        .pool_size(1);
    let pgbouncer = tokio::task::spawn_blocking(move || Pgbouncer::start(&config))
        .await
        .unwrap()
        .unwrap();
    // Both connected at once: each transaction borrows the one server connection and returns it.
    let first = pgbouncer.connect("postgres").await.unwrap();
    let second = pgbouncer.connect("postgres").await.unwrap();
    let (a, b) = (backend(&first).await, backend(&second).await);
    assert_eq!(
        a, b,
        "with a pool of one in transaction pooling, both clients run on the one server connection"
    );
}

/// The server process a simple query runs on, bounded: in session pooling with a pool of one a
/// second client would wait for the first to leave.
async fn backend(client: &tokio_postgres::Client) -> String {
    let rows = tokio::time::timeout(
        Duration::from_secs(10),
        client.simple_query("SELECT pg_backend_pid()"),
    )
    .await
    .expect("no server connection for this client within 10 s: not transaction pooling")
    .unwrap();
    rows.iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
            _ => None,
        })
        .unwrap()
}
