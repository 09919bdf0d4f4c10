//! `auth_hba_file`: a file in pg_hba.conf format decides who may log in and how, rule by rule,
//! first match wins — checked with libpq's own `require_auth` (psql of PostgreSQL 19's bundle,
//! whatever server the suite runs on) so the method the proxy asked for is the client's
//! observation, not the proxy's claim; an address rule checked from a second loopback address
//! (a socket bound to 127.0.0.2, then tokio-postgres over it).

use std::process::Command;

use crate::support::*;
use lsngate_cluster::shared_cluster;
use lsngate_proxy::config::UserEntry;

/// libpq ≥ 16 for `require_auth`: the PostgreSQL 19 bundle's psql, on every suite run.
const PSQL_WITH_REQUIRE_AUTH: &str = "/opt/lsngate/pg19/bin/psql";

const RULES: &str = "\
# TYPE  DATABASE  USER                ADDRESS                   METHOD
host    all       hb_blocked          127.0.0.0/8               reject
host    postgres  all                 127.0.0.2/32              trust
host    postgres  hb_md5              127.0.0.1/32              md5
host    postgres  hb_scram,hb_md5_too 127.0.0.1 255.255.255.255 scram-sha-256
";

/// psql's login as `user` to `database`, with libpq's `require_auth` set to `require`:
/// (succeeded, what it printed).
fn login(
    proxy: &TestProxy,
    user: &str,
    password: &str,
    database: &str,
    require: &str,
) -> (bool, String) {
    let conninfo = format!(
        "host=127.0.0.1 port={} user={user} dbname={database} require_auth={require}",
        proxy.addr.port()
    );
    let mut psql = Command::new(PSQL_WITH_REQUIRE_AUTH);
    psql.args([
        "-X",
        "-A",
        "-t",
        "-w",
        "-d",
        &conninfo,
        "-c",
        "SELECT current_user",
    ])
    .env("PGPASSWORD", password);
    let output = run(&mut psql);
    let (stdout, stderr) = texts(&output);
    (output.status.success(), format!("{stdout}{stderr}"))
}

#[test]
fn auth_hba_file_rules_allow_refuse_and_pick_the_method_as_written() {
    let cluster = shared_cluster();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hba.conf");
    std::fs::write(&path, RULES).unwrap();
    let mut file = file_config(cluster);
    file.auth_hba_file = Some(path);
    file.users = vec![
        UserEntry::new("hb_scram", Some("scram-pw"), "scram-sha-256"),
        UserEntry::new("hb_md5", Some("md5-pw"), "md5"),
        UserEntry::new("hb_md5_too", Some("md5-pw"), "md5"),
        UserEntry::new("hb_blocked", Some("blocked-pw"), "scram-sha-256"),
    ];
    let proxy = TestProxy::with(file);

    // SCRAM where the rule says scram-sha-256; a client that insists on MD5 is not served.
    let (ok, out) = login(&proxy, "hb_scram", "scram-pw", "postgres", "scram-sha-256");
    assert!(ok, "{out}");
    let (ok, out) = login(&proxy, "hb_scram", "scram-pw", "postgres", "md5");
    assert!(
        !ok && out.contains("server requested SASL authentication"),
        "{out}"
    );
    let (ok, out) = login(&proxy, "hb_scram", "wrong", "postgres", "scram-sha-256");
    assert!(
        !ok && out.contains("password authentication failed for user \"hb_scram\""),
        "{out}"
    );

    // MD5 where the rule says md5 and the user's secret is an MD5 hash.
    let (ok, out) = login(&proxy, "hb_md5", "md5-pw", "postgres", "md5");
    assert!(ok, "{out}");

    // An MD5 secret under a scram-sha-256 rule: refused like a wrong password, the right one too.
    let (ok, out) = login(&proxy, "hb_md5_too", "md5-pw", "postgres", "scram-sha-256");
    assert!(
        !ok && out.contains("password authentication failed for user \"hb_md5_too\""),
        "{out}"
    );

    // reject, and a login no rule matches, in PostgreSQL's words.
    let (ok, out) = login(
        &proxy,
        "hb_blocked",
        "blocked-pw",
        "postgres",
        "none,scram-sha-256",
    );
    assert!(
        !ok && out.contains(
            "pg_hba.conf rejects connection for host \"127.0.0.1\", user \"hb_blocked\", database \"postgres\", no encryption"
        ),
        "{out}"
    );
    let (ok, out) = login(
        &proxy,
        "hb_scram",
        "scram-pw",
        "template1",
        "none,scram-sha-256",
    );
    assert!(
        !ok && out.contains(
            "no pg_hba.conf entry for host \"127.0.0.1\", user \"hb_scram\", database \"template1\", no encryption"
        ),
        "{out}"
    );

    // From 127.0.0.2 the trust rule comes first: in without the password.
    rt().block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let stream = socket.connect(proxy.addr).await.unwrap();
        let mut config = tokio_postgres::Config::new();
        config
            .user("hb_scram")
            .dbname("postgres")
            .password("not-the-password");
        let (client, connection) = config
            .connect_raw(stream, tokio_postgres::NoTls)
            .await
            .expect("trusted from 127.0.0.2");
        tokio::spawn(connection);
        let one: i32 = client.query_one("SELECT 1", &[]).await.unwrap().get(0);
        assert_eq!(one, 1);
    });
    proxy.shutdown();
}
