//! The proxy logging into servers with SCRAM-SHA-256: a role whose pg_hba.conf rule demands
//! scram-sha-256 over TCP, its password in the node URLs, reads on the replica and writes on the
//! primary through the proxy; a wrong password gives clients a clear error and the proxy keeps
//! serving, so fixing the password on the server is enough. Users with a `server_user` run as
//! that role instead, from pools of their own.

use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::support::*;
use lsngate_cluster::{Cluster, ClusterConfig, Node};
use lsngate_proxy::FileConfig;
use lsngate_proxy::config::UserEntry;
use tokio_postgres::error::SqlState;

const ROLE: &str = "scram_app";
/// A role with a password, used as a `server_user`.
const REPORTER: &str = "reporter";

/// Members of this group must log in with scram-sha-256 over TCP (auth_query's roles).
pub(crate) const SCRAM_GROUP: &str = "scram_members";
/// Members of this group must log in with md5 over TCP.
pub(crate) const MD5_GROUP: &str = "md5_members";

/// Primary + replica where ROLE, REPORTER and SCRAM_GROUP's members must log in with
/// scram-sha-256 over TCP and MD5_GROUP's with md5 (the cluster's own user stays trusted).
pub(crate) fn scram_cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<&'static Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        Cluster::start(
            &ClusterConfig::default()
                .replicas(1)
                .setting("password_encryption", "scram-sha-256")
                .hba(&format!(
                    "host all {ROLE},{REPORTER} 127.0.0.1/32 scram-sha-256"
                ))
                .hba(&format!(
                    "host all +{SCRAM_GROUP} 127.0.0.1/32 scram-sha-256"
                ))
                .hba(&format!("host all +{MD5_GROUP} 127.0.0.1/32 md5")),
        )
        .expect("scram cluster")
        .leak_until_exit()
    })
}

fn node_url(node: &Node, password: &str) -> String {
    format!(
        "postgres://{ROLE}:{password}@127.0.0.1:{}/postgres",
        node.port()
    )
}

/// A proxy in front of `cluster` that logs into every node as ROLE with `password`; clients log
/// in as `app` / `client-pw`.
fn proxy_config(cluster: &Cluster, password: &str) -> FileConfig {
    let mut file = file_config(cluster);
    file.primary = Some(node_url(cluster.primary(), password));
    file.replicas = cluster
        .replicas()
        .iter()
        .map(|n| node_url(n, password))
        .collect();
    file.users = vec![UserEntry::new("app", Some("client-pw"), "scram-sha-256")];
    file
}

fn client_conninfo(proxy: &TestProxy) -> String {
    format!(
        "host=127.0.0.1 port={} user=app password=client-pw dbname=postgres",
        proxy.addr.port()
    )
}

/// (current_user, pg_is_in_recovery()) of the server that ran the statement.
async fn who_and_where(client: &tokio_postgres::Client, sql: &str) -> (String, bool) {
    let row = client.query_one(sql, &[]).await.unwrap();
    (row.get(0), row.get(1))
}

async fn try_connect(conninfo: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

#[test]
fn the_proxy_logs_into_servers_with_scram_and_reports_a_wrong_password() {
    let cluster = scram_cluster();
    let primary = cluster.primary();
    primary
        .sql(&format!(
            "CREATE ROLE {ROLE} LOGIN PASSWORD 'backend-s3cret'"
        ))
        .unwrap();
    assert_eq!(
        primary
            .sql(&format!(
                "SELECT rolpassword LIKE 'SCRAM-SHA-256$%' FROM pg_authid WHERE rolname = '{ROLE}'"
            ))
            .unwrap(),
        "t",
        "the role has a SCRAM verifier"
    );
    primary
        .sql(&format!(
            "CREATE TABLE scram_t (id int); GRANT SELECT, INSERT ON scram_t TO {ROLE}"
        ))
        .unwrap();
    caught_up(cluster);
    // The rule is in force on both nodes: no password, no login.
    for node in cluster.nodes() {
        let conninfo = format!(
            "host=127.0.0.1 port={} user={ROLE} dbname=postgres",
            node.port()
        );
        let mut psql = Command::new(cluster.pg_bin().tool("psql"));
        psql.args(["-X", "-w", "-d", &conninfo, "-c", "SELECT 1"])
            .env_remove("PGPASSWORD");
        let output = run(&mut psql);
        let (_, stderr) = texts(&output);
        assert!(
            !output.status.success() && stderr.contains("password"),
            "{}: {stderr}",
            node.name()
        );
    }

    let proxy = TestProxy::with(proxy_config(cluster, "backend-s3cret"));
    rt().block_on(async {
        let client = connect(&client_conninfo(&proxy)).await;
        let sql = "SELECT current_user::text, pg_is_in_recovery()";
        assert_eq!(
            who_and_where(&client, sql).await,
            (ROLE.to_string(), true),
            "a read on the replica"
        );
        client
            .execute("INSERT INTO scram_t VALUES (1)", &[])
            .await
            .unwrap();
        client.batch_execute("BEGIN").await.unwrap();
        assert_eq!(
            who_and_where(&client, sql).await,
            (ROLE.to_string(), false),
            "a transaction on the primary"
        );
        client.batch_execute("COMMIT").await.unwrap();
    });
    assert_eq!(primary.sql("SELECT count(*) FROM scram_t").unwrap(), "1");
    drop(proxy);

    let proxy = TestProxy::with(proxy_config(cluster, "not-the-password"));
    rt().block_on(async {
        for attempt in 0..2 {
            let error = match try_connect(&client_conninfo(&proxy)).await {
                Ok(client) => client.batch_execute("SELECT 1").await.unwrap_err(),
                Err(e) => e,
            };
            let text = format!("{error:?}");
            assert!(
                text.contains("password authentication failed")
                    && text.contains("check the user/password in the node URL"),
                "attempt {attempt}: {text}"
            );
        }
    });
    let status = proxy.http_get("/status");
    assert!(
        status.starts_with("HTTP/1.1 200") && status.contains("password authentication failed"),
        "{status}"
    );
    // The proxy kept running: once the server accepts that password, the same proxy serves.
    primary
        .sql(&format!("ALTER ROLE {ROLE} PASSWORD 'not-the-password'"))
        .unwrap();
    caught_up(cluster);
    rt().block_on(async {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let attempt = async {
                let client = try_connect(&client_conninfo(&proxy)).await?;
                client
                    .query_one("SELECT count(*) FROM scram_t", &[])
                    .await
                    .map(|row| row.get::<_, i64>(0))
            };
            match attempt.await {
                Ok(count) => {
                    assert_eq!(count, 1);
                    break;
                }
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("the proxy never served after the password was fixed: {e:?}"),
            }
        }
    });
}

fn login(proxy: &TestProxy, user: &str, password: &str) -> String {
    format!(
        "host=127.0.0.1 port={} user={user} password={password} dbname=postgres",
        proxy.addr.port()
    )
}

/// A user with `server_user` runs as that role everywhere (its default `server_password` is its
/// own password), a user without runs as the node URL's user, and the two never get each
/// other's server connections, even with one connection per pool. A wrong `server_password`
/// fails only that user's logins, naming the entry to fix.
#[test]
fn each_user_runs_as_its_server_role_from_pools_of_its_own() {
    let cluster = scram_cluster();
    let primary = cluster.primary();
    primary
        .sql(&format!(
            "CREATE ROLE {REPORTER} LOGIN PASSWORD 'rep-pw'; \
             CREATE TABLE ledger (id int); GRANT SELECT ON ledger TO {REPORTER}"
        ))
        .unwrap();
    caught_up(cluster);
    // `app` runs as the node URL's user (or as REPORTER: the reload below), REPORTER as itself
    // with its own password, `guesser` as REPORTER with a wrong password.
    let config = |app_runs_as_reporter: bool| {
        let mut file = file_config(cluster);
        file.pool_size = Some(1);
        let mut app = UserEntry::new("app", Some("app-pw"), "scram-sha-256");
        if app_runs_as_reporter {
            app.server_user = Some(REPORTER.into());
            app.server_password = Some("rep-pw".into());
        }
        let mut reporter = UserEntry::new(REPORTER, Some("rep-pw"), "scram-sha-256");
        reporter.server_user = Some(REPORTER.into());
        let mut guesser = UserEntry::new("guesser", Some("guesser-pw"), "md5");
        guesser.server_user = Some(REPORTER.into());
        guesser.server_password = Some("a-guess".into());
        file.users = vec![app, reporter, guesser];
        file
    };
    let proxy = TestProxy::with(config(false));
    let sql = "SELECT current_user::text, pg_is_in_recovery()";
    rt().block_on(async {
        let app = connect(&login(&proxy, "app", "app-pw")).await;
        let rep = connect(&login(&proxy, REPORTER, "rep-pw")).await;
        for round in 0..5 {
            for (client, role) in [(&app, "postgres"), (&rep, REPORTER)] {
                assert_eq!(
                    who_and_where(client, sql).await,
                    (role.to_string(), true),
                    "round {round}: a read on the replica"
                );
                client.batch_execute("BEGIN").await.unwrap();
                assert_eq!(
                    who_and_where(client, sql).await,
                    (role.to_string(), false),
                    "round {round}: a transaction on the primary"
                );
                client.batch_execute("COMMIT").await.unwrap();
            }
        }
        app.execute("INSERT INTO ledger VALUES (1)", &[])
            .await
            .unwrap();
        let denied = rep
            .execute("INSERT INTO ledger VALUES (2)", &[])
            .await
            .unwrap_err();
        assert_eq!(
            denied.code(),
            Some(&SqlState::INSUFFICIENT_PRIVILEGE),
            "the reporter writes as itself, not as the URL's superuser: {denied:?}"
        );
        rep.batch_execute("BEGIN").await.unwrap();
        let row = rep
            .query_one("SELECT count(*) FROM ledger", &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, i64>(0), 1);
        rep.batch_execute("COMMIT").await.unwrap();

        let error = match try_connect(&login(&proxy, "guesser", "guesser-pw")).await {
            Ok(client) => client.batch_execute("SELECT 1").await.unwrap_err(),
            Err(e) => e,
        };
        let text = error
            .as_db_error()
            .map(|e| e.message().to_string())
            .unwrap_or_else(|| format!("{error:?}"));
        assert!(
            text.contains("password authentication failed")
                && text.contains(&format!("login as \"{REPORTER}\""))
                && text
                    .contains("check server_user/server_password of the client's [[users]] entry"),
            "{text}"
        );
        // The others are untouched.
        assert_eq!(who_and_where(&rep, sql).await, (REPORTER.to_string(), true));

        // A reload that gives `app` a role applies from its next statement, in its session.
        proxy
            .proxy
            .reload(lsngate_proxy::Config::build(config(true)).unwrap());
        assert_eq!(
            who_and_where(&app, sql).await,
            (REPORTER.to_string(), true),
            "app after the reload"
        );
    });
    // The sessions end after their clients: what they gave back is counted once they have.
    let deadline = Instant::now() + Duration::from_secs(30);
    while proxy.proxy.client_count() > 0 {
        assert!(
            Instant::now() < deadline,
            "the clients' sessions never ended"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = proxy.http_get("/status");
    let body = status.split("\r\n\r\n").nth(1).unwrap_or_default();
    let json: serde_json::Value = serde_json::from_str(body).expect("status JSON");
    for node in json["nodes"].as_array().unwrap() {
        let mut roles: Vec<&str> = node["pools"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["open"].as_u64() == Some(1))
            .map(|p| p["role"].as_str().unwrap())
            .collect();
        roles.sort();
        assert_eq!(roles, ["postgres", REPORTER], "{node}");
    }
    let metrics = proxy.http_get("/metrics");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("lsngate_proxy_pool_open_connections")
                && l.contains(&format!("role=\"{REPORTER}\""))),
        "{metrics}"
    );
}

/// Logs in as `user` on `port` and answers the SASL offer with a mechanism nobody offered; the
/// SQLSTATE of the error that follows.
fn sqlstate_for_an_unoffered_sasl_mechanism(port: u16, user: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut writer = stream.try_clone().unwrap();
    let mut read_message = || {
        let mut head = [0u8; 5];
        stream.read_exact(&mut head).unwrap();
        let len = u32::from_be_bytes(head[1..5].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len - 4];
        stream.read_exact(&mut body).unwrap();
        (head[0], body)
    };
    let mut startup = 196_608u32.to_be_bytes().to_vec();
    for (key, value) in [("user", user), ("database", "postgres")] {
        startup.extend([key.as_bytes(), b"\0", value.as_bytes(), b"\0"].concat());
    }
    startup.push(0);
    let mut packet = ((startup.len() + 4) as u32).to_be_bytes().to_vec();
    packet.extend(startup);
    writer.write_all(&packet).unwrap();
    match read_message() {
        (b'R', body) if body[..4] == 10u32.to_be_bytes() => {}
        (b'R', body) => panic!("expected a SASL offer, got authentication request {body:?}"),
        (tag, body) => panic!("expected a SASL offer, got {:?} {body:?}", tag as char),
    }
    let mut initial = b"BOGUS-MECHANISM\0".to_vec();
    initial.extend((-1i32).to_be_bytes());
    let mut message = vec![b'p'];
    message.extend(((initial.len() + 4) as u32).to_be_bytes());
    message.extend(initial);
    writer.write_all(&message).unwrap();
    loop {
        let (tag, body) = read_message();
        if tag == b'E' {
            return body
                .split(|b| *b == 0)
                .find_map(|field| field.strip_prefix(b"C"))
                .map(|code| String::from_utf8_lossy(code).into_owned())
                .expect("an error with a SQLSTATE");
        }
    }
}

/// A client that picks a SASL mechanism the proxy did not offer broke the protocol, as
/// PostgreSQL says (08P01 "invalid SASL authentication mechanism"): compared with the server
/// itself, whose pg_hba.conf demands SCRAM for ROLE. It used to get 28P01, a wrong password.
#[test]
fn an_unoffered_sasl_mechanism_is_a_protocol_violation_as_on_the_server() {
    let cluster = scram_cluster();
    let direct = sqlstate_for_an_unoffered_sasl_mechanism(cluster.primary().port(), ROLE);
    let mut file = file_config(cluster);
    file.users = vec![UserEntry::new("app", Some("client-pw"), "scram-sha-256")];
    let proxy = TestProxy::with(file);
    let proxied = sqlstate_for_an_unoffered_sasl_mechanism(proxy.addr.port(), "app");
    assert_eq!(direct, "08P01", "the server's answer");
    assert_eq!(proxied, direct, "the proxy answers as the server does");
}
