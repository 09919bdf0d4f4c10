//! `auth_user` + `auth_query`: clients log in as roles the config does not list, against the
//! secrets the server stores — a role created after the proxy started, a wrong password and an
//! unknown role refused alike, SCRAM and MD5 secrets, the proxy logging in to the servers as the
//! client's own role (the server's pg_hba.conf demands a password of it), a SECURITY DEFINER
//! function run by an unprivileged auth_user, and a changed password taking effect with the
//! cache off. Clients: tokio-postgres and psql.

use std::process::Command;

use crate::server_auth::{MD5_GROUP, SCRAM_GROUP, scram_cluster};
use crate::support::*;
use lsngate_cluster::Cluster;
use lsngate_proxy::FileConfig;
use lsngate_proxy::config::UserEntry;
use tokio_postgres::error::SqlState;

/// Creates the roles' groups, once per test binary (tests run in parallel).
fn groups(cluster: &Cluster) {
    static CREATED: std::sync::Once = std::sync::Once::new();
    CREATED.call_once(|| {
        for group in [SCRAM_GROUP, MD5_GROUP] {
            cluster
                .primary()
                .sql(&format!("CREATE ROLE {group} NOLOGIN"))
                .unwrap();
        }
    });
}

/// A role that must prove `password` to the servers with SCRAM.
fn scram_role(cluster: &Cluster, name: &str, password: &str) {
    cluster
        .primary()
        .sql(&format!(
            "SET password_encryption = 'scram-sha-256'; \
             CREATE ROLE {name} LOGIN PASSWORD '{password}' IN ROLE {SCRAM_GROUP}"
        ))
        .unwrap();
}

fn superuser(cluster: &Cluster) -> String {
    cluster.primary().sql("SELECT current_user").unwrap()
}

fn conninfo(proxy: &TestProxy, user: &str, password: &str) -> String {
    format!(
        "host=127.0.0.1 port={} user={user} password={password} dbname=postgres",
        proxy.addr.port()
    )
}

async fn try_login(conninfo: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// The SQLSTATE and message of a refused login.
async fn refusal(conninfo: &str) -> (SqlState, String) {
    let error = try_login(conninfo).await.expect_err("the login is refused");
    let db = error
        .as_db_error()
        .unwrap_or_else(|| panic!("a server error, not {error:?}"));
    (db.code().clone(), db.message().to_string())
}

fn auth_query_proxy(cluster: &Cluster, extra: impl FnOnce(&mut FileConfig)) -> TestProxy {
    let mut file = file_config(cluster);
    file.auth_user = Some(superuser(cluster));
    extra(&mut file);
    TestProxy::with(file)
}

#[test]
fn auth_query_logs_in_roles_created_later_as_their_own_role_and_refuses_the_rest_alike() {
    let cluster = scram_cluster();
    groups(cluster);
    let table = unique("aq_t");
    cluster
        .primary()
        .sql(&format!(
            "CREATE TABLE {table} (id int); \
             GRANT SELECT, INSERT ON {table} TO {SCRAM_GROUP}, {MD5_GROUP}"
        ))
        .unwrap();
    let proxy = auth_query_proxy(cluster, |file| {
        assert!(
            file.users.is_empty() && file.auth_file.is_none(),
            "no user is listed"
        );
    });
    // Created after the proxy started; listed nowhere in its config.
    let alice = unique("aq_alice");
    scram_role(cluster, &alice, "alice-pw");
    let bob = unique("aq_bob");
    cluster
        .primary()
        .sql(&format!(
            "SET password_encryption = 'md5'; \
             CREATE ROLE {bob} LOGIN PASSWORD 'bob-pw' IN ROLE {MD5_GROUP}"
        ))
        .unwrap();
    caught_up(cluster);
    rt().block_on(async {
        for (role, password) in [(&alice, "alice-pw"), (&bob, "bob-pw")] {
            let client = try_login(&conninfo(&proxy, role, password))
                .await
                .unwrap_or_else(|e| panic!("{role} logs in through auth_query: {e:?}"));
            client
                .execute(&format!("INSERT INTO {table} VALUES (1)"), &[])
                .await
                .unwrap();
            let row = client
                .query_one(
                    &format!(
                        "SELECT current_user::text, pg_is_in_recovery(), \
                         (SELECT count(*) FROM {table}) FROM {table} LIMIT 1"
                    ),
                    &[],
                )
                .await
                .unwrap();
            let (who, replica): (String, bool) = (row.get(0), row.get(1));
            assert_eq!(
                who, *role,
                "the proxy logs in to the server as the client's role"
            );
            assert!(replica, "{role}'s read ran on the replica");
            assert!(row.get::<_, i64>(2) >= 1, "and saw its own write");
        }
        // A wrong password and a role the server lacks get the same answer.
        let wrong = refusal(&conninfo(&proxy, &alice, "nope")).await;
        let nobody = refusal(&conninfo(&proxy, "aq_nobody", "nope")).await;
        assert_eq!(wrong.0, SqlState::INVALID_PASSWORD, "{wrong:?}");
        assert_eq!(nobody.0, SqlState::INVALID_PASSWORD, "{nobody:?}");
        assert_eq!(
            wrong.1,
            format!("password authentication failed for user \"{alice}\"")
        );
        assert_eq!(
            nobody.1,
            "password authentication failed for user \"aq_nobody\""
        );
        // A user-supplied name is a parameter, never SQL text.
        let injected = refusal(&format!(
            "host=127.0.0.1 port={} user='x\\' OR \\'1\\'=\\'1' password=nope dbname=postgres",
            proxy.addr.port()
        ))
        .await;
        assert_eq!(injected.0, SqlState::INVALID_PASSWORD, "{injected:?}");
    });
    // psql, a client whose protocol code is libpq's.
    let mut psql = Command::new(cluster.pg_bin().tool("psql"));
    psql.args([
        "-X",
        "-w",
        "-At",
        "-d",
        &format!(
            "host=127.0.0.1 port={} user={alice} dbname=postgres",
            proxy.addr.port()
        ),
        "-c",
        "SELECT current_user",
    ])
    .env("PGPASSWORD", "alice-pw");
    let (stdout, _) = run_ok(&mut psql);
    assert_eq!(stdout.trim(), alice);
    proxy.shutdown();
}

#[test]
fn auth_query_runs_a_security_definer_function_as_an_unprivileged_user() {
    let cluster = scram_cluster();
    groups(cluster);
    let lookup = unique("aq_lookup");
    scram_role(cluster, &lookup, "lookup-pw");
    let function = unique("aq_secret_of");
    cluster
        .primary()
        .sql(&format!(
            "CREATE FUNCTION public.{function}(p_user text, OUT usename name, OUT passwd text) \
             RETURNS record LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog \
             AS $$ SELECT usename, passwd FROM pg_shadow WHERE usename = p_user $$; \
             REVOKE ALL ON FUNCTION public.{function}(text) FROM PUBLIC; \
             GRANT EXECUTE ON FUNCTION public.{function}(text) TO {lookup}"
        ))
        .unwrap();
    let proxy = auth_query_proxy(cluster, |file| {
        file.auth_user = Some(lookup.clone());
        // The only listed user is auth_user itself, with the password it needs on the server.
        file.users = vec![UserEntry::new(&lookup, Some("lookup-pw"), "scram-sha-256")];
        file.auth_query = Some(format!("SELECT usename, passwd FROM public.{function}($1)"));
        file.auth_server_login = Some("node_user".into());
    });
    let carol = unique("aq_carol");
    scram_role(cluster, &carol, "carol-pw");
    caught_up(cluster);
    rt().block_on(async {
        let client = try_login(&conninfo(&proxy, &carol, "carol-pw"))
            .await
            .expect("carol logs in through the function");
        let who: String = client
            .query_one("SELECT current_user::text", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            who,
            superuser(cluster),
            "node_user: statements run as the node URL's user"
        );
        let wrong = refusal(&conninfo(&proxy, &carol, "nope")).await;
        assert_eq!(wrong.0, SqlState::INVALID_PASSWORD, "{wrong:?}");
    });
    proxy.shutdown();
}

#[test]
fn without_the_cache_a_changed_password_takes_effect_at_the_next_login() {
    let cluster = scram_cluster();
    groups(cluster);
    let proxy = auth_query_proxy(cluster, |file| file.auth_cache_ttl_ms = Some(0));
    let dave = unique("aq_dave");
    scram_role(cluster, &dave, "old-pw");
    caught_up(cluster);
    rt().block_on(async {
        try_login(&conninfo(&proxy, &dave, "old-pw"))
            .await
            .expect("the first password logs in");
        cluster
            .primary()
            .sql(&format!("ALTER ROLE {dave} PASSWORD 'new-pw'"))
            .unwrap();
        let client = try_login(&conninfo(&proxy, &dave, "new-pw"))
            .await
            .expect("the new password logs in at once");
        let who: String = client
            .query_one("SELECT current_user::text", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(who, dave);
        let old = refusal(&conninfo(&proxy, &dave, "old-pw")).await;
        assert_eq!(old.0, SqlState::INVALID_PASSWORD, "{old:?}");
    });
    proxy.shutdown();
}
