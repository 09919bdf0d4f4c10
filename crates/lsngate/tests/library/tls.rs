//! TLS from the library to the servers, on a cluster whose nodes accept TCP only over TLS
//! (`ClusterConfig::tls_only`): the default `prefer` and `require` encrypt the primary's and the
//! replicas' connections (`pg_stat_ssl`, seen by the server), `verify-full` checks the CA and the
//! host name, `disable` says what pg_hba.conf wants, and URL parameters lsngate does not know
//! are refused when the gate is built.

use std::sync::OnceLock;
use std::time::Duration;

use lsngate::{Config, Error, Gate, ServedBy};
use lsngate_cluster::{Cluster, ClusterConfig, Node, TestCa};

const SSL_SQL: &str =
    "SELECT ssl, pg_is_in_recovery() FROM pg_stat_ssl WHERE pid = pg_backend_pid()";

fn tls_cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<&'static Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        Cluster::start(&ClusterConfig::default().replicas(1).tls_only())
            .expect("TLS-only cluster")
            .leak_until_exit()
    })
}

fn url(node: &Node, host: &str, params: &str) -> String {
    format!(
        "postgres://postgres@{host}:{}/postgres?{params}",
        node.port()
    )
}

fn config(cluster: &Cluster, host: &str, params: &str) -> Config {
    Config::new(url(cluster.primary(), host, params))
        .replicas(cluster.replicas().iter().map(|n| url(n, host, params)))
        .poll_interval(Duration::from_millis(20))
}

/// The primary's connection and a replica's both run over TLS.
async fn assert_tls_on_both(config: Config) {
    let gate = Gate::connect(config).await.expect("gate");
    let (rows, token) = gate.write_returning(SSL_SQL, &[]).await.unwrap();
    assert_eq!(
        (rows[0].get::<_, bool>(0), rows[0].get::<_, bool>(1)),
        (true, false),
        "the primary's connection"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let read = gate.query_after(&token, SSL_SQL, &[]).await.unwrap();
        if matches!(read.served.by, ServedBy::Replica(_)) {
            let row = &read.rows[0];
            assert_eq!((row.get::<_, bool>(0), row.get::<_, bool>(1)), (true, true));
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no read reached the replica within 20 s: {:?}",
            gate.replicas()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The error a gate on these URLs gives for a write (the primary cannot be reached).
async fn primary_error(config: Config) -> String {
    let gate = Gate::connect(config)
        .await
        .expect("gate (connections open lazily)");
    let error = gate.primary_position().await.unwrap_err();
    assert!(matches!(error, Error::PrimaryUnavailable { .. }), "{error}");
    // Printed for the guide (cargo test ... -- --nocapture).
    println!("gate said: {error}");
    error.to_string()
}

#[tokio::test]
async fn prefer_and_require_encrypt_primary_and_replica_connections() {
    let cluster = tls_cluster();
    // No sslmode: libpq's default prefer, which takes the TLS the server offers.
    assert_tls_on_both(
        Config::new(cluster.primary_url())
            .replicas(cluster.replica_urls())
            .poll_interval(Duration::from_millis(20)),
    )
    .await;
    assert_tls_on_both(config(cluster, "127.0.0.1", "sslmode=require")).await;
    assert_tls_on_both(config(cluster, "127.0.0.1", "sslmode=allow")).await;
}

#[tokio::test]
async fn verify_full_checks_the_ca_and_the_host_name() {
    let cluster = tls_cluster();
    let ca = cluster.tls().unwrap().ca.cert.display().to_string();
    let full = format!("sslmode=verify-full&sslrootcert={ca}");
    assert_tls_on_both(config(cluster, "localhost", &full)).await;
    let error = primary_error(config(cluster, "127.0.0.1", &full)).await;
    assert!(
        error.contains("server certificate is not valid for host \"127.0.0.1\""),
        "{error}"
    );
    let dir = tempfile::tempdir().unwrap();
    let other = TestCa::create(dir.path(), "other-ca").unwrap();
    let params = format!("sslmode=verify-full&sslrootcert={}", other.cert.display());
    let error = primary_error(config(cluster, "localhost", &params)).await;
    assert!(
        error.contains(&format!(
            "server certificate not trusted by sslrootcert={}",
            other.cert.display()
        )),
        "{error}"
    );
}

#[tokio::test]
async fn disable_against_a_tls_only_server_says_why() {
    let cluster = tls_cluster();
    let error = primary_error(config(cluster, "127.0.0.1", "sslmode=disable")).await;
    assert!(
        error.contains("no encryption")
            && error.contains("pg_hba.conf requires SSL for this connection; set sslmode=require"),
        "{error}"
    );
}

#[tokio::test]
async fn unknown_parameters_and_files_for_a_foreign_connector_are_refused() {
    let cluster = tls_cluster();
    let bad = Config::new(cluster.primary_url()).replica(url(
        cluster.replica(0),
        "127.0.0.1",
        "sslmdoe=require",
    ));
    let Err(error) = Gate::connect(bad).await else {
        panic!("a misspelt parameter was accepted");
    };
    let error = error.to_string();
    assert!(
        error.contains("replica0 URL: unknown parameter \"sslmdoe\"; supported: host"),
        "{error}"
    );
    let ca = cluster.tls().unwrap().ca.cert.display().to_string();
    let foreign = Config::new(url(
        cluster.primary(),
        "localhost",
        &format!("sslrootcert={ca}"),
    ))
    .tls(tokio_postgres::NoTls);
    let Err(error) = Gate::connect(foreign).await else {
        panic!("sslrootcert with a foreign connector was accepted");
    };
    let error = error.to_string();
    assert!(
        error.contains("sslrootcert is read by lsngate's own TLS"),
        "{error}"
    );
}
