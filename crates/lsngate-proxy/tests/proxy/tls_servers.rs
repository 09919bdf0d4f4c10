//! TLS from the proxy to the servers, on a cluster whose nodes accept TCP only over TLS
//! (`ClusterConfig::tls_only`: a certificate for `localhost` from the test kit's CA,
//! `hostnossl ... reject`): every sslmode of the node URLs, checked from the server's side with
//! `pg_stat_ssl`, for pooled connections (primary and replica), the node monitor and cancel
//! requests; certificate failures and plaintext refusals reach the client with their fix; an
//! unknown URL parameter stops the proxy at startup.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::support::*;
use lsngate_cluster::{Cluster, ClusterConfig, Node, TestCa};
use lsngate_proxy::FileConfig;

/// A role that logs in with a client certificate only.
const CERT_ROLE: &str = "cert_user";

fn tls_cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<&'static Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let cluster = Cluster::start(
            &ClusterConfig::default()
                .replicas(1)
                .tls_only()
                .hba(&format!("hostssl all {CERT_ROLE} 127.0.0.1/32 cert")),
        )
        .expect("TLS-only cluster")
        .leak_until_exit();
        cluster
            .primary()
            .sql(&format!("CREATE ROLE {CERT_ROLE} LOGIN"))
            .unwrap();
        cluster
            .wait_caught_up(Duration::from_secs(30))
            .expect("the role reaches the replica");
        cluster
    })
}

fn ca_path(cluster: &Cluster) -> String {
    cluster.tls().unwrap().ca.cert.display().to_string()
}

/// The node's URL as `postgres` on `host` with `params` after `?`.
fn url(node: &Node, host: &str, params: &str) -> String {
    let mut url = format!("postgres://postgres@{host}:{}/postgres", node.port());
    if !params.is_empty() {
        url.push('?');
        url.push_str(params);
    }
    url
}

/// A proxy whose node URLs all carry `params` and name the servers by `host`.
fn proxy(cluster: &Cluster, host: &str, params: &str) -> TestProxy {
    let mut file: FileConfig = file_config(cluster);
    file.primary = Some(url(cluster.primary(), host, params));
    file.replicas = cluster
        .replicas()
        .iter()
        .map(|n| url(n, host, params))
        .collect();
    TestProxy::with(file)
}

/// (ssl, in recovery) of the server connection that ran the statement, routed by `route`.
async fn ssl_of(client: &tokio_postgres::Client, route: &str) -> (bool, bool) {
    let sql = format!(
        "/* lsngate:route={route} */ SELECT ssl, pg_is_in_recovery() FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
    );
    let row = client.query_one(&sql, &[]).await.unwrap();
    (row.get(0), row.get(1))
}

/// Both routes run over TLS: the primary's connection and the replica's.
fn assert_tls_on_both(proxy: &TestProxy) {
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        assert_eq!(ssl_of(&client, "primary").await, (true, false));
        assert_eq!(ssl_of(&client, "replica").await, (true, true));
    });
}

/// The error text a client gets for `sql` through `proxy` (at login or for the statement).
fn client_error(proxy: &TestProxy, sql: &str) -> String {
    let error = rt().block_on(async {
        let (client, connection) =
            match tokio_postgres::connect(&proxy.conninfo(), tokio_postgres::NoTls).await {
                Ok(pair) => pair,
                Err(e) => return lsngate_pgconn::describe(&e),
            };
        tokio::spawn(connection);
        match client.simple_query(sql).await {
            Ok(_) => panic!("{sql} through the proxy worked"),
            Err(e) => lsngate_pgconn::describe(&e),
        }
    });
    // Printed for the guide (cargo test ... -- --nocapture).
    println!("client saw: {error}");
    error
}

/// Waits until /status shows every node unhealthy with a last error containing `expected`.
fn wait_unhealthy_with(proxy: &TestProxy, expected: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = proxy.status();
        let nodes = status["nodes"].as_array().unwrap().clone();
        let all_failed = nodes.iter().all(|n| {
            n["healthy"] == false
                && n["last_error"]
                    .as_str()
                    .is_some_and(|e| e.contains(expected))
        });
        if all_failed {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "nodes never all showed unhealthy with {expected:?}: {nodes:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Connections of the node monitor on `node`: (with TLS, without).
fn monitor_connections(node: &Node) -> (u32, u32) {
    let count = |ssl: &str| {
        node.sql(&format!(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.application_name = 'lsngate-proxy-monitor' AND s.ssl = {ssl}"
        ))
        .unwrap()
        .parse()
        .unwrap()
    };
    (count("true"), count("false"))
}

#[test]
fn require_encrypts_pooled_monitor_and_cancel_connections() {
    let cluster = tls_cluster();
    let proxy = proxy(cluster, "127.0.0.1", "sslmode=require");
    assert_tls_on_both(&proxy);
    for node in cluster.nodes() {
        let (tls, plain) = monitor_connections(node);
        assert!(
            tls >= 1 && plain == 0,
            "{}: monitor connections with TLS {tls}, without {plain}",
            node.name()
        );
    }
    // A cancel request reaches the server the query runs on (over TLS, as that connection).
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        let token = client.cancel_token();
        let sleeper = tokio::spawn(async move {
            client
                .simple_query("/* lsngate:route=primary */ SELECT pg_sleep(60)")
                .await
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        while cluster
            .primary()
            .sql("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(60)%' AND pid <> pg_backend_pid()")
            .unwrap()
            != "1"
        {
            assert!(Instant::now() < deadline, "the sleep never started on the primary");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        token.cancel_query(tokio_postgres::NoTls).await.unwrap();
        let result = tokio::time::timeout(Duration::from_secs(20), sleeper)
            .await
            .expect("the cancel ended the sleep within 20 s")
            .unwrap();
        let error = result.expect_err("the sleep was cancelled");
        assert_eq!(
            error.code(),
            Some(&tokio_postgres::error::SqlState::QUERY_CANCELED),
            "{error:?}"
        );
    });
}

#[test]
fn prefer_is_the_default_and_takes_tls_when_offered() {
    let cluster = tls_cluster();
    assert_tls_on_both(&proxy(cluster, "127.0.0.1", ""));
    // allow starts in plaintext, is refused by pg_hba.conf, and retries with TLS.
    assert_tls_on_both(&proxy(cluster, "127.0.0.1", "sslmode=allow"));
}

#[test]
fn verify_full_checks_the_ca_and_the_host_name() {
    let cluster = tls_cluster();
    let ca = ca_path(cluster);
    assert_tls_on_both(&proxy(
        cluster,
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ));
    // verify-ca checks only the chain: the certificate names localhost, not 127.0.0.1.
    assert_tls_on_both(&proxy(
        cluster,
        "127.0.0.1",
        &format!("sslmode=verify-ca&sslrootcert={ca}"),
    ));

    let wrong_host = proxy(
        cluster,
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    );
    let expected = "server certificate is not valid for host \"127.0.0.1\"";
    wait_unhealthy_with(&wrong_host, expected);
    let error = client_error(&wrong_host, "SELECT 1");
    assert!(
        error.contains(expected) && error.contains("sslmode=verify-ca"),
        "{error}"
    );

    let other_dir = tempfile::tempdir().unwrap();
    let other = TestCa::create(other_dir.path(), "other-ca").unwrap();
    let wrong_ca = proxy(
        cluster,
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", other.cert.display()),
    );
    let expected = format!(
        "server certificate not trusted by sslrootcert={}",
        other.cert.display()
    );
    wait_unhealthy_with(&wrong_ca, &expected);
    let error = client_error(&wrong_ca, "SELECT 1");
    assert!(
        error.contains(&expected) && error.contains("set sslrootcert to the PEM file of the CA"),
        "{error}"
    );
}

#[test]
fn disable_against_a_tls_only_server_says_why() {
    let cluster = tls_cluster();
    let proxy = proxy(cluster, "127.0.0.1", "sslmode=disable");
    let fix = "pg_hba.conf requires SSL for this connection; set sslmode=require or stronger";
    wait_unhealthy_with(&proxy, fix);
    let error = client_error(&proxy, "SELECT 1");
    assert!(
        error.contains("no encryption") && error.contains(fix),
        "{error}"
    );
}

#[test]
fn client_certificates_come_from_sslcert_and_sslkey() {
    let cluster = tls_cluster();
    let tls = cluster.tls().unwrap();
    let issued = tls
        .ca
        .issue(&format!("client-{}", std::process::id()), CERT_ROLE, &[])
        .unwrap();
    let params = format!(
        "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
        tls.ca.cert.display(),
        issued.cert.display(),
        issued.key.display()
    );
    let mut file = file_config(cluster);
    let cert_url = |node: &Node| {
        format!(
            "postgres://{CERT_ROLE}@localhost:{}/postgres?{params}",
            node.port()
        )
    };
    file.primary = Some(cert_url(cluster.primary()));
    file.replicas = cluster.replicas().iter().map(cert_url).collect();
    let proxy = TestProxy::with(file);
    rt().block_on(async {
        let conninfo = format!(
            "host=127.0.0.1 port={} user={CERT_ROLE} dbname=postgres",
            proxy.addr.port()
        );
        let client = connect(&conninfo).await;
        for route in ["primary", "replica"] {
            let sql = format!(
                "/* lsngate:route={route} */ SELECT current_user::text, s.ssl, s.client_dn FROM pg_stat_ssl s WHERE pid = pg_backend_pid()"
            );
            let row = client.query_one(&sql, &[]).await.unwrap();
            let (user, ssl, dn): (String, bool, Option<String>) = (row.get(0), row.get(1), row.get(2));
            assert_eq!((user.as_str(), ssl), (CERT_ROLE, true), "{route}");
            assert_eq!(dn.as_deref(), Some(&*format!("/CN={CERT_ROLE}")), "{route}");
        }
    });
}

#[test]
fn an_unknown_url_parameter_stops_the_proxy_at_startup() {
    let cluster = tls_cluster();
    let mut file = file_config(cluster);
    let replica = url(cluster.replica(0), "127.0.0.1", "sslmdoe=require");
    file.replicas = vec![cluster.replica_urls()[0].clone(), replica.clone()];
    let error = lsngate_proxy::Config::build(file).unwrap_err().to_string();
    assert!(
        error.contains("invalid URL of replica 2")
            && error.contains("unknown parameter \"sslmdoe\"; supported: host, port"),
        "{error}"
    );
    // The same from the command line: the program exits before listening, naming it.
    let output = run(
        std::process::Command::new(crate::signals::example_binary()).args([
            "--listen",
            "127.0.0.1:0",
            "--primary",
            &cluster.primary_url(),
            "--replica",
            &replica,
        ]),
    );
    let (_, stderr) = texts(&output);
    assert!(
        !output.status.success() && stderr.contains("unknown parameter \"sslmdoe\""),
        "{stderr}"
    );
}
