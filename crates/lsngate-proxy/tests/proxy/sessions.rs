//! Sessions: authentication, startup parameters and SETs carried across backends, pooling
//! modes, cancel, admin port, reload and drain.

use std::process::Command;

use crate::support::*;
use lsngate_cluster::{Cluster, shared_cluster};
use lsngate_proxy::config::UserEntry;
use lsngate_proxy::{Config, PoolMode};

fn user(name: &str, password: &str, auth: &str) -> UserEntry {
    UserEntry::new(name, Some(password), auth)
}

fn psql_login(proxy: &TestProxy, user: &str, password: &str) -> (bool, String) {
    let psql = shared_cluster().pg_bin().tool("psql");
    psql_current_user(
        &psql,
        proxy,
        &format!("user={user} dbname=postgres"),
        password,
    )
}

#[test]
fn scram_md5_and_unknown_users() {
    let cluster = shared_cluster();
    let mut file = file_config(cluster);
    file.users = vec![
        user("app_scram", "s3cret", "scram-sha-256"),
        user("app_md5", "m5pass", "md5"),
    ];
    let proxy = TestProxy::with(file);
    let (ok, out) = psql_login(&proxy, "app_scram", "s3cret");
    assert!(ok, "{out}");
    assert_eq!(
        out.trim(),
        "postgres",
        "backends are reached with the config's credentials"
    );
    let (ok, out) = psql_login(&proxy, "app_md5", "m5pass");
    assert!(ok, "{out}");
    let (ok, out) = psql_login(&proxy, "app_scram", "wrong");
    assert!(
        !ok && out.contains("password authentication failed"),
        "{out}"
    );
    let (ok, out) = psql_login(&proxy, "app_md5", "wrong");
    assert!(
        !ok && out.contains("password authentication failed"),
        "{out}"
    );
    let (ok, out) = psql_login(&proxy, "nobody", "x");
    assert!(!ok && out.contains("no such user"), "{out}");
    // SIGHUP-style reload: a user added to the config can log in without a restart.
    let mut reloaded = file_config(cluster);
    reloaded.users = vec![
        user("app_scram", "s3cret", "scram-sha-256"),
        user("late", "arrival", "scram-sha-256"),
    ];
    proxy.proxy.reload(Config::build(reloaded).unwrap());
    let (ok, out) = psql_login(&proxy, "late", "arrival");
    assert!(ok, "{out}");
}

/// Reads what the proxy sends until it closes the connection (at most 30 s: a bound, not a
/// measurement), returning the bytes.
fn read_to_close(socket: &mut std::net::TcpStream) -> Vec<u8> {
    use std::io::Read;
    socket
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut received = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        match socket.read(&mut chunk) {
            Ok(0) => return received,
            Ok(n) => received.extend_from_slice(&chunk[..n]),
            Err(e) => panic!("the proxy kept the stalled login open: {e}"),
        }
    }
}

#[test]
fn a_login_that_stalls_is_ended_by_client_login_timeout_and_frees_its_slot() {
    // PostgreSQL ends a login not finished within authentication_timeout; PgBouncer has
    // client_login_timeout. Before 2026-12-05 the proxy waited for a password message for ever
    // (and for a startup message 30 s per read, so a byte every 29 s kept it), each such client
    // holding one of max_client_connections.
    use std::io::Write;
    let cluster = shared_cluster();
    let mut file = file_config(cluster);
    file.users = vec![user("app_scram", "s3cret", "scram-sha-256")];
    file.client_login_timeout_ms = Some(300);
    file.max_client_connections = Some(1);
    let proxy = TestProxy::with(file);
    // Stalls in the SCRAM exchange: startup sent, the SASL request received, no answer.
    let mut stalled = std::net::TcpStream::connect(proxy.addr).unwrap();
    let mut startup = Vec::new();
    for (k, v) in [("user", "app_scram"), ("database", "postgres")] {
        startup.extend_from_slice(k.as_bytes());
        startup.push(0);
        startup.extend_from_slice(v.as_bytes());
        startup.push(0);
    }
    startup.push(0);
    let mut packet = ((startup.len() + 8) as u32).to_be_bytes().to_vec();
    packet.extend_from_slice(&196608u32.to_be_bytes());
    packet.extend_from_slice(&startup);
    stalled.write_all(&packet).unwrap();
    let received = read_to_close(&mut stalled);
    assert_eq!(received.first(), Some(&b'R'), "the SASL request came first");
    let text = String::from_utf8_lossy(&received);
    assert!(
        text.contains("57014") && text.contains("client_login_timeout_ms"),
        "a FATAL naming the timeout before the close: {text:?}"
    );
    // Never sends a startup message: closed too.
    let mut silent = std::net::TcpStream::connect(proxy.addr).unwrap();
    assert_eq!(read_to_close(&mut silent), b"", "closed without a word");
    // The only client slot is free again.
    let (ok, out) = psql_login(&proxy, "app_scram", "s3cret");
    assert!(ok, "{out}");
}

/// Connects and keeps the connection task's outcome: the error a FATAL closed it with.
async fn connect_watched(
    conninfo: &str,
) -> (
    tokio_postgres::Client,
    tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
) {
    let (client, connection) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls)
        .await
        .unwrap();
    (client, tokio::spawn(connection))
}

/// The SQLSTATE the proxy closed a watched connection with (waits at most 30 s: a bound).
async fn closed_with(
    watched: tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
) -> String {
    let ended = tokio::time::timeout(std::time::Duration::from_secs(30), watched)
        .await
        .expect("the proxy ended the idle client")
        .unwrap();
    let error = ended.expect_err("closed by a FATAL");
    error
        .as_db_error()
        .map(|e| format!("{} {}", e.code().code(), e.message()))
        .unwrap_or_else(|| error.to_string())
}

#[test]
fn idle_clients_are_ended_by_the_idle_timeouts_and_an_idle_transaction_is_rolled_back() {
    // PgBouncer's idle_transaction_timeout and client_idle_timeout, with PostgreSQL's codes:
    // a client that opens a block and goes quiet holds a server connection (here the only one)
    // until it is ended; its transaction must not survive it.
    let cluster = shared_cluster();
    let mut file = file_config(cluster);
    file.pool_size = Some(1);
    file.idle_transaction_timeout_ms = Some(300);
    let proxy = TestProxy::with(file);
    rt().block_on(async {
        let setup = connect(&proxy.conninfo()).await;
        setup
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS lsngate_idle_tx (id int); TRUNCATE lsngate_idle_tx",
            )
            .await
            .unwrap();
        let (idle, watched) = connect_watched(&proxy.conninfo()).await;
        idle.batch_execute("BEGIN; INSERT INTO lsngate_idle_tx VALUES (1)")
            .await
            .unwrap();
        let closed = closed_with(watched).await;
        assert!(closed.starts_with("25P03 "), "{closed}");
        assert!(closed.contains("idle_transaction_timeout_ms"), "{closed}");
        // The only server connection serves the next client; the block's insert is gone.
        let count: i64 = setup
            .query_one("SELECT count(*) FROM lsngate_idle_tx", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(count, 0, "the idle transaction was rolled back");
        setup
            .batch_execute("BEGIN; INSERT INTO lsngate_idle_tx VALUES (2); COMMIT")
            .await
            .unwrap();
        // Outside a block that limit does not apply: a client idle there stays.
        tokio::time::sleep(std::time::Duration::from_millis(600)).await;
        assert!(
            !setup.is_closed(),
            "client_idle_timeout_ms is off by default"
        );
    });
    let mut file = file_config(cluster);
    file.client_idle_timeout_ms = Some(300);
    let proxy = TestProxy::with(file);
    rt().block_on(async {
        let (_idle, watched) = connect_watched(&proxy.conninfo()).await;
        let closed = closed_with(watched).await;
        assert!(closed.starts_with("57P05 "), "{closed}");
    });
}

#[test]
fn users_from_a_pgbouncer_auth_file_log_in_with_plain_md5_and_scram_secrets() {
    // A PgBouncer deployment's userlist.txt, its secrets made by PostgreSQL itself: a SCRAM
    // secret from pg_authid, an MD5 hash computed by the server, and a plain password with a
    // doubled quote; comments and blank lines around them.
    let cluster = shared_cluster();
    let primary = cluster.primary();
    primary
        .sql("DROP ROLE IF EXISTS lsngate_af_scram; CREATE ROLE lsngate_af_scram PASSWORD 'scram-pw'")
        .unwrap();
    let scram = primary
        .sql("SELECT rolpassword FROM pg_authid WHERE rolname = 'lsngate_af_scram'")
        .unwrap();
    primary.sql("DROP ROLE lsngate_af_scram").unwrap();
    assert!(scram.trim().starts_with("SCRAM-SHA-256$"), "{scram}");
    let md5 = primary
        .sql("SELECT 'md5' || md5('md5-pw' || 'af_md5')")
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("userlist.txt");
    let userlist = format!(
        "; users of the app\n\"af_scram\" \"{}\"\n\n\"af_md5\" \"{}\" \"\"\n# plain\n\"af_plain\" \"pl\"\"ain\"\n",
        scram.trim(),
        md5.trim()
    );
    std::fs::write(&path, &userlist).unwrap();
    let mut file = file_config(cluster);
    file.auth_file = Some(path.clone());
    let proxy = TestProxy::with(file.clone());
    for (user, password) in [
        ("af_scram", "scram-pw"),
        ("af_md5", "md5-pw"),
        ("af_plain", "pl\"ain"),
    ] {
        let (ok, out) = psql_login(&proxy, user, password);
        assert!(ok, "{user}: {out}");
        let (ok, out) = psql_login(&proxy, user, "wrong");
        assert!(
            !ok && out.contains("password authentication failed"),
            "{user} with a wrong password: {out}"
        );
    }
    // Read again at a reload: a user added to the file logs in without a restart.
    std::fs::write(&path, format!("{userlist}\"af_late\" \"late-pw\"\n")).unwrap();
    proxy.proxy.reload(Config::build(file.clone()).unwrap());
    let (ok, out) = psql_login(&proxy, "af_late", "late-pw");
    assert!(ok, "{out}");
    // A broken line is named; the same user in [[users]] and the file is refused.
    std::fs::write(&path, "\"ok\" \"pw\"\n\"broken \"pw\"\n").unwrap();
    let error = Config::build(file.clone()).unwrap_err().to_string();
    assert!(
        error.contains("userlist.txt") && error.contains("line 2"),
        "{error}"
    );
    std::fs::write(&path, "\"dup\" \"pw\"\n").unwrap();
    file.users = vec![user("dup", "pw", "scram-sha-256")];
    let error = Config::build(file).unwrap_err().to_string();
    assert!(
        error.contains("both under [[users]] and in auth_file"),
        "{error}"
    );
}

/// A proxy with one server connection per node: clients take turns on it.
fn one_connection_per_node(cluster: &Cluster) -> TestProxy {
    let mut file = file_config(cluster);
    file.pool_size = Some(1);
    TestProxy::with(file)
}

#[test]
fn startup_parameters_and_sets_follow_the_client_to_every_backend() {
    let cluster = shared_cluster();
    let proxy = one_connection_per_node(cluster);
    rt().block_on(async {
        let a = connect(&format!("{} application_name=lsngate_a", proxy.conninfo())).await;
        let b = connect(&proxy.conninfo()).await;
        a.batch_execute("SET statement_timeout = '4321ms'")
            .await
            .unwrap();
        for _ in 0..3 {
            assert_eq!(
                show(&a, "SHOW application_name").await,
                "lsngate_a",
                "replica backend"
            );
            assert_eq!(show(&a, "SHOW statement_timeout").await, "4321ms");
            assert_eq!(
                show(&b, "SHOW statement_timeout").await,
                "0",
                "b never set it"
            );
            assert_ne!(show(&b, "SHOW application_name").await, "lsngate_a");
            a.batch_execute("BEGIN").await.unwrap();
            assert_eq!(
                show(&a, "SHOW application_name").await,
                "lsngate_a",
                "primary backend"
            );
            assert_eq!(show(&a, "SHOW statement_timeout").await, "4321ms");
            a.batch_execute("COMMIT").await.unwrap();
        }
        a.batch_execute("RESET statement_timeout").await.unwrap();
        assert_eq!(show(&a, "SHOW statement_timeout").await, "0");

        // Startup settings mean on every server connection what they mean on a direct one: a
        // list-valued one stays a list, quotes and backslashes stay themselves.
        let options =
            r"options='-c search_path=lsngate_s1,public -c application_name=it\'s\\\\here\\ now'";
        let direct = connect(&format!("{} {options}", cluster.primary().conninfo())).await;
        let c = connect(&format!("{} {options}", proxy.conninfo())).await;
        let (path, name) = (
            show(&direct, "SHOW search_path").await,
            show(&direct, "SHOW application_name").await,
        );
        assert_eq!(path, "lsngate_s1,public");
        assert_eq!(name, r"it's\here now");
        for _ in 0..3 {
            assert_eq!(show(&c, "SHOW search_path").await, path, "replica backend");
            assert_eq!(show(&c, "SHOW application_name").await, name);
            c.batch_execute("BEGIN").await.unwrap();
            assert_eq!(show(&c, "SHOW search_path").await, path, "primary backend");
            assert_eq!(show(&c, "SHOW application_name").await, name);
            c.batch_execute("COMMIT").await.unwrap();
            // Another client's backend state must not leak in between.
            assert_ne!(show(&b, "SHOW search_path").await, path);
        }
    });
}

#[test]
fn sets_sent_with_the_extended_protocol_follow_their_client_and_never_leak() {
    let cluster = shared_cluster();
    let proxy = one_connection_per_node(cluster);
    rt().block_on(async {
        let a = connect(&proxy.conninfo()).await;
        let b = connect(&proxy.conninfo()).await;
        // Parse/Bind/Execute, as JDBC, psycopg 3 and pgx send a SET.
        a.execute("SET application_name = 'lsngate_ext_a'", &[])
            .await
            .unwrap();
        a.execute("SET statement_timeout TO 4321", &[])
            .await
            .unwrap();
        for _ in 0..3 {
            assert_eq!(show(&a, "SHOW application_name").await, "lsngate_ext_a");
            assert_eq!(show(&a, "SHOW statement_timeout").await, "4321ms");
            assert_ne!(show(&b, "SHOW application_name").await, "lsngate_ext_a");
            assert_eq!(
                show(&b, "SHOW statement_timeout").await,
                "0",
                "b never set it"
            );
            a.batch_execute("BEGIN").await.unwrap();
            assert_eq!(
                show(&a, "SHOW application_name").await,
                "lsngate_ext_a",
                "primary"
            );
            a.batch_execute("COMMIT").await.unwrap();
        }
        a.execute("RESET statement_timeout", &[]).await.unwrap();
        assert_eq!(show(&a, "SHOW statement_timeout").await, "0");
        assert_eq!(show(&a, "SHOW application_name").await, "lsngate_ext_a");
    });
}

#[test]
fn a_set_among_other_statements_of_a_query_follows_its_client_and_never_leaks() {
    // PostgreSQL runs every statement of a multi-statement Query: a SET behind a write is as
    // much the session's as one sent alone.
    let cluster = shared_cluster();
    let proxy = one_connection_per_node(cluster);
    rt().block_on(async {
        let a = connect(&proxy.conninfo()).await;
        let b = connect(&proxy.conninfo()).await;
        a.batch_execute("SELECT 1; SET application_name = 'lsngate_multi_a'")
            .await
            .unwrap();
        a.batch_execute("SELECT 2; SET statement_timeout = '4321ms'; SELECT 3")
            .await
            .unwrap();
        for _ in 0..3 {
            assert_ne!(show(&b, "SHOW application_name").await, "lsngate_multi_a");
            assert_eq!(
                show(&b, "SHOW statement_timeout").await,
                "0",
                "b never set it"
            );
            assert_eq!(show(&a, "SHOW application_name").await, "lsngate_multi_a");
            assert_eq!(show(&a, "SHOW statement_timeout").await, "4321ms");
        }
        a.batch_execute("SELECT 1; RESET statement_timeout")
            .await
            .unwrap();
        assert_eq!(show(&a, "SHOW statement_timeout").await, "0");
        b.batch_execute("SET statement_timeout = '1234ms'")
            .await
            .unwrap();
        assert_eq!(show(&a, "SHOW statement_timeout").await, "0", "a reset it");
    });
}

#[test]
fn a_proxy_command_that_fails_in_a_transaction_block_fails_the_block() {
    // On a direct connection an error inside BEGIN ... fails the block: every statement up to
    // ROLLBACK is refused (25P02), and what the block wrote is gone. A proxy command the proxy
    // answers with an error must do the same, or the client's next statements commit.
    let cluster = shared_cluster();
    let proxy = one_connection_per_node(cluster);
    rt().block_on(async {
        let a = connect(&proxy.conninfo()).await;
        a.batch_execute(
            "CREATE TABLE IF NOT EXISTS lsngate_failed_block (id int); TRUNCATE lsngate_failed_block",
        )
        .await
        .unwrap();
        for command in [
            "SET lsngate.consistency = 'nonsense'",
            "SET lsngate.route = 'nowhere'",
        ] {
            a.batch_execute("BEGIN; INSERT INTO lsngate_failed_block VALUES (1)")
                .await
                .unwrap();
            let refused = a.batch_execute(command).await.unwrap_err();
            assert_eq!(refused.code().map(|c| c.code()), Some("22023"), "{refused}");
            let after = a.query("SELECT 1", &[]).await.unwrap_err();
            assert_eq!(after.code().map(|c| c.code()), Some("25P02"), "{after}");
            a.batch_execute("COMMIT").await.unwrap();
            let rows = a
                .query_one("SELECT count(*) FROM lsngate_failed_block", &[])
                .await
                .unwrap();
            assert_eq!(rows.get::<_, i64>(0), 0, "the failed block wrote nothing");
        }
    });
    // The failure undoes a SET made inside the block, and PostgreSQL reports the value it
    // returns to ahead of its ReadyForQuery `E`; so must the proxy's own answer, or the client
    // goes on believing the undone value (seed 20261229615 found it over the extended protocol).
    use lsngate_proxy::net::FrontendMessage::Query;
    let mut wire =
        crate::statements::Wire::connect_to_with(proxy.addr, &[("application_name", "login")]);
    let opened = wire.flight(&[
        Query("BEGIN".into()),
        Query("SET application_name = 'in-block'".into()),
    ]);
    assert_eq!(
        opened.parameters,
        [("application_name".to_string(), "in-block".to_string())]
    );
    let refused = wire.flight(&[Query("SET lsngate.consistency = 'nonsense'".into())]);
    assert_eq!(refused.tags, b"ESZ", "{refused:?}");
    assert_eq!(refused.statuses, b"E", "{refused:?}");
    assert_eq!(
        refused.parameters,
        [("application_name".to_string(), "login".to_string())]
    );
    let ended = wire.flight(&[
        Query("ROLLBACK".into()),
        Query("SHOW application_name".into()),
    ]);
    assert!(ended.errors.is_empty(), "{ended:?}");
    assert!(ended.parameters.is_empty(), "{ended:?}");
    assert_eq!(ended.rows, [vec![Some("login".to_string())]]);
}

#[test]
fn reset_all_and_discard_all_return_the_proxy_settings_to_the_login_values() {
    // Pools that hand a connection to the next request (Npgsql, PgBouncer-style resets) run
    // DISCARD ALL or RESET ALL so that nothing of the last borrower's session is left. The
    // proxy's own settings are part of that session: a leftover `eventual` would let the next
    // borrower read stale data, a leftover scope would file its writes under another user's.
    // As on a direct connection, what the client gave at login is what RESET returns to.
    let cluster = shared_cluster();
    let proxy = one_connection_per_node(cluster);
    rt().block_on(async {
        let login = "options='-c lsngate.consistency=global -c lsngate.scope=tenant:login'";
        let client = connect(&format!("{} {login}", proxy.conninfo())).await;
        let settings = [
            ("consistency", "eventual", "global"),
            ("scope", "user:41", "tenant:login"),
            ("route", "primary", "auto"),
            ("min_lsn", "0/00000001", ""),
        ];
        let set_all = settings
            .iter()
            .map(|(name, value, _)| format!("SET lsngate.{name} = '{value}';"))
            .collect::<String>();
        for (reset, extended) in [
            ("DISCARD ALL", false),
            ("RESET ALL", false),
            ("DISCARD ALL", true),
            ("RESET ALL", true),
        ] {
            client.batch_execute(&set_all).await.unwrap();
            for (name, value, _) in settings {
                let shown = show(&client, &format!("SHOW lsngate.{name}")).await;
                assert_eq!(shown, value, "lsngate.{name} before {reset}");
            }
            if extended {
                client.execute(reset, &[]).await.unwrap();
            } else {
                client.batch_execute(reset).await.unwrap();
            }
            for (name, _, login_value) in settings {
                let shown = show(&client, &format!("SHOW lsngate.{name}")).await;
                assert_eq!(
                    shown, login_value,
                    "lsngate.{name} after {reset} (extended: {extended})"
                );
            }
        }
        // One setting's RESET goes back to its login value too, not to the proxy's default.
        client
            .batch_execute("SET lsngate.consistency = 'eventual'; RESET lsngate.consistency")
            .await
            .unwrap();
        assert_eq!(show(&client, "SHOW lsngate.consistency").await, "global");
        // A DISCARD ALL the server refuses (inside a transaction block) changes nothing.
        client
            .batch_execute("SET lsngate.consistency = 'eventual'; BEGIN")
            .await
            .unwrap();
        let refused = client.batch_execute("DISCARD ALL").await.unwrap_err();
        assert_eq!(refused.code().map(|c| c.code()), Some("25001"), "{refused}");
        client.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(show(&client, "SHOW lsngate.consistency").await, "eventual");
        // RESET ALL among other statements the server runs.
        client.batch_execute("SELECT 1; RESET ALL").await.unwrap();
        assert_eq!(show(&client, "SHOW lsngate.consistency").await, "global");
    });
}

#[test]
fn proxy_commands_lead_a_string_of_statements_or_it_is_refused_whole() {
    // `psql -c "SET lsngate.scope = 'user:7'; INSERT ..."` sends one Query. The proxy answers
    // its commands itself, so they run first and the rest goes to the server; a command behind
    // a statement for the server cannot keep its place, and must not reach the server (which
    // takes `lsngate.scope` as a placeholder setting of its own and ignores it) or be read as
    // one long value: the whole string is refused, with nothing run.
    let cluster = shared_cluster();
    let proxy = one_connection_per_node(cluster);
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        client
            .batch_execute("CREATE TABLE IF NOT EXISTS lsngate_mixed (id int); TRUNCATE lsngate_mixed")
            .await
            .unwrap();
        let answers = client
            .simple_query("SET lsngate.scope = 'user:7'; SHOW lsngate.scope; INSERT INTO lsngate_mixed SELECT length(';'); SELECT count(*) FROM lsngate_mixed")
            .await
            .unwrap();
        let rows: Vec<&str> = answers
            .iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0),
                _ => None,
            })
            .collect();
        assert_eq!(rows, ["user:7", "1"], "{answers:?}");
        let refused = client
            .batch_execute("INSERT INTO lsngate_mixed VALUES (2); SET lsngate.scope = 'user:9'")
            .await
            .unwrap_err();
        assert_eq!(refused.code().map(|c| c.code()), Some("0A000"), "{refused}");
        let message = refused.as_db_error().map(|e| e.message()).unwrap_or_default();
        assert!(message.contains("must come first"), "{message}");
        let count: i64 = client
            .query_one("SELECT count(*) FROM lsngate_mixed", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(count, 1, "nothing of the refused string ran");
        assert_eq!(show(&client, "SHOW lsngate.scope").await, "user:7");
        // A bad value stops the string at that command, as an error stops a server's string.
        let refused = client
            .batch_execute("SET lsngate.route = 'nowhere'; INSERT INTO lsngate_mixed VALUES (3)")
            .await
            .unwrap_err();
        assert_eq!(refused.code().map(|c| c.code()), Some("22023"), "{refused}");
        let count: i64 = client
            .query_one("SELECT count(*) FROM lsngate_mixed", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(count, 1, "the string stopped at the bad command");
    });
}

#[test]
fn sets_the_server_undid_are_undone_for_the_client_too() {
    let cluster = shared_cluster();
    let proxy = one_connection_per_node(cluster);
    rt().block_on(async {
        let a = connect(&proxy.conninfo()).await;
        // Reads outside a block run on a replica's server connection, where the proxy applies
        // what it believes the client's settings are; a block runs on the primary's.
        let both = |name: &'static str| {
            let a = &a;
            async move {
                let replica = show(a, &format!("SHOW {name}")).await;
                a.batch_execute("BEGIN").await.unwrap();
                let primary = show(a, &format!("SHOW {name}")).await;
                a.batch_execute("COMMIT").await.unwrap();
                assert_eq!(
                    replica, primary,
                    "{name} differs between server connections"
                );
                replica
            }
        };
        // Rolled back: gone.
        a.batch_execute("BEGIN").await.unwrap();
        a.batch_execute("SET statement_timeout = '1234ms'")
            .await
            .unwrap();
        a.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(both("statement_timeout").await, "0");
        // Committed: kept.
        a.batch_execute("BEGIN").await.unwrap();
        a.batch_execute("SET work_mem = '7MB'").await.unwrap();
        a.batch_execute("COMMIT").await.unwrap();
        assert_eq!(both("work_mem").await, "7MB");
        // Rolled back to a savepoint: the value before it.
        a.batch_execute("BEGIN").await.unwrap();
        a.batch_execute("SAVEPOINT s").await.unwrap();
        a.batch_execute("SET work_mem = '9MB'").await.unwrap();
        a.batch_execute("ROLLBACK TO SAVEPOINT s").await.unwrap();
        a.batch_execute("COMMIT").await.unwrap();
        assert_eq!(both("work_mem").await, "7MB");
        // A multi-statement string that fails after its SET: undone with it.
        let e = a
            .batch_execute("SET work_mem = '5MB'; SELECT 1/0")
            .await
            .unwrap_err();
        assert_eq!(e.code().unwrap().code(), "22012");
        assert_eq!(both("work_mem").await, "7MB");
        // One that succeeds: every SET in it is kept, list values as the server parsed them.
        a.batch_execute("SET search_path = lsngate_x, public; SET work_mem = '6MB'")
            .await
            .unwrap();
        assert_eq!(both("work_mem").await, "6MB");
        assert_eq!(both("search_path").await, "lsngate_x, public");
        // An extended-protocol SET inside a transaction that rolls back.
        a.batch_execute("BEGIN").await.unwrap();
        a.execute("SET work_mem = '3MB'", &[]).await.unwrap();
        a.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(both("work_mem").await, "6MB");
        // Inside an aborted block the read-back fails; after ROLLBACK it succeeds.
        a.batch_execute("BEGIN").await.unwrap();
        a.batch_execute("SET work_mem = '2MB'").await.unwrap();
        assert!(a.batch_execute("SELECT 1/0").await.is_err());
        a.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(both("work_mem").await, "6MB");
        // A setting changed by a function is read back like a SET.
        a.batch_execute("SELECT pg_catalog.set_config('work_mem', '11MB', false)")
            .await
            .unwrap();
        assert_eq!(both("work_mem").await, "11MB");
        // Transaction-scoped changes change nothing that lasts.
        a.batch_execute("BEGIN").await.unwrap();
        a.batch_execute("SET LOCAL work_mem = '13MB'")
            .await
            .unwrap();
        a.batch_execute("SELECT set_config('work_mem', '14MB', true)")
            .await
            .unwrap();
        assert_eq!(show(&a, "SHOW work_mem").await, "14MB");
        a.batch_execute("COMMIT").await.unwrap();
        assert_eq!(both("work_mem").await, "11MB");
        // Sent without waiting (tokio-postgres writes requests polled together at once): the SET
        // and the RESET reach the proxy before BEGIN's answer, and the ROLLBACK undoes them.
        // They were taken for changes outside a block and stayed recorded, so the client got the
        // undone SET's value, and the next client on the connection the first one's setting
        // where the RESET was undone (seed 20261422566).
        let (b, s, r) = tokio::join!(
            a.batch_execute("BEGIN"),
            a.batch_execute("SET work_mem = '3MB'"),
            a.batch_execute("ROLLBACK"),
        );
        b.unwrap();
        s.unwrap();
        r.unwrap();
        assert_eq!(both("work_mem").await, "11MB");
        let (b, s, r) = tokio::join!(
            a.batch_execute("BEGIN"),
            a.batch_execute("RESET work_mem"),
            a.batch_execute("ROLLBACK"),
        );
        b.unwrap();
        s.unwrap();
        r.unwrap();
        assert_eq!(both("work_mem").await, "11MB");
        drop(a);
        let next = connect(&proxy.conninfo()).await;
        next.batch_execute("BEGIN").await.unwrap();
        assert_eq!(
            show(&next, "SHOW work_mem").await,
            "4MB",
            "the first client's setting"
        );
        next.batch_execute("COMMIT").await.unwrap();
        assert_eq!(
            show(&next, "SHOW work_mem").await,
            "4MB",
            "the first client's setting"
        );
    });
}

/// A SET the server may have undone (one of several in a string) has the server's settings read
/// back once its transaction is over — but not onto a server connection that is reading COPY
/// data: behind it the client already started a COPY over the extended protocol (Parse, Bind,
/// Execute, Flush), where the read-back's Query would break the COPY (08P01 "unexpected message
/// type 0x51 during COPY from stdin"). It waits for the batch's Sync.
#[test]
fn a_settings_read_back_waits_for_a_copy_running_behind_it() {
    use lsngate_proxy::net::FrontendMessage::{
        self, CopyData, CopyDone, Execute, Flush, Query, Sync,
    };
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    let table = unique("copy_read_back_settings");
    cluster
        .primary()
        .sql(&format!("CREATE TABLE {table} (id int)"))
        .unwrap();
    let mut wire = crate::statements::Wire::connect(&proxy);
    wire.send(&[
        Query("SET work_mem = '5MB'; SET application_name = 'copy-read-back'".into()),
        crate::statements::parse_unnamed(&format!("COPY {table} FROM STDIN")),
        FrontendMessage::Bind {
            portal: String::new(),
            statement: String::new(),
            rest: bytes::Bytes::from_static(&[0, 0, 0, 0, 0, 0]),
        },
        Execute {
            portal: String::new(),
            max_rows: 0,
        },
        Flush,
    ]);
    let started = wire.until(b'G');
    assert!(started.errors.is_empty(), "{started:?}");
    let copied = wire.flight(&[CopyData("1\n2\n".into()), CopyDone, Sync]);
    assert!(copied.errors.is_empty(), "{copied:?}");
    assert_eq!(copied.tags, b"CZ", "{copied:?}");
    let read = format!(
        "SELECT current_setting('application_name'), current_setting('work_mem'), count(*) FROM {table}"
    );
    let reply = wire.flight(&[Query(read)]);
    assert!(reply.errors.is_empty(), "{reply:?}");
    let row = |v: &[&str]| v.iter().map(|v| Some(v.to_string())).collect::<Vec<_>>();
    assert_eq!(reply.rows, [row(&["copy-read-back", "5MB", "2"])]);
}

#[test]
fn transaction_pooling_shares_backends_session_pooling_pins_them() {
    let cluster = shared_cluster();
    for (mode, expect_same) in [(PoolMode::Session, true), (PoolMode::Transaction, false)] {
        let mut file = file_config(cluster);
        file.pool_mode = Some(mode);
        file.pool_size = Some(2);
        let proxy = TestProxy::with(file);
        rt().block_on(async {
            let a = connect(&proxy.conninfo()).await;
            let b = connect(&proxy.conninfo()).await;
            let pid_sql = "/* lsngate:route=primary */ SELECT pg_backend_pid()::text";
            let a1 = show(&a, pid_sql).await;
            let b1 = show(&b, pid_sql).await;
            let a2 = show(&a, pid_sql).await;
            assert_ne!(a1, "");
            if expect_same {
                assert_ne!(a1, b1, "session pooling: one backend per client");
                assert_eq!(a1, a2);
            } else {
                assert_eq!(
                    a1, b1,
                    "transaction pooling: the idle backend is reused by the next client"
                );
            }
        });
    }
}

#[test]
fn cancel_reaches_the_backend_running_the_query() {
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    let marker = unique("cancel_me");
    let nodes: Vec<_> = cluster.nodes().cloned().collect();
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        let token = client.cancel_token();
        let running = marker.clone();
        let canceller = tokio::spawn(async move {
            tokio::task::spawn_blocking(move || wait_running(&nodes, &running))
                .await
                .unwrap();
            token.cancel_query(tokio_postgres::NoTls).await.unwrap();
        });
        let err = client
            .batch_execute(&format!("SELECT pg_sleep(20) AS {marker}"))
            .await
            .unwrap_err();
        assert_eq!(
            err.code(),
            Some(&tokio_postgres::error::SqlState::QUERY_CANCELED),
            "{err:?}"
        );
        canceller.await.unwrap();
        assert_eq!(show(&client, "SELECT 'alive'").await, "alive");
    });
}

#[test]
fn admin_port_reports_nodes_pools_and_query_counts() {
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        client.batch_execute("SELECT 1").await.unwrap();
        client
            .batch_execute("/* lsngate:route=primary */ SELECT 1")
            .await
            .unwrap();
    });
    let status = proxy.http_get("/status");
    let body = status.split("\r\n\r\n").nth(1).unwrap();
    let json: serde_json::Value = serde_json::from_str(body).unwrap();
    let roles: Vec<&str> = json["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, vec!["primary", "replica", "replica"], "{body}");
    assert!(
        json["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["healthy"] == true),
        "{body}"
    );
    let metrics = proxy.http_get("/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(
        metrics.contains("lsngate_proxy_queries_total{route=\"replica\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("lsngate_proxy_queries_total{route=\"primary\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("lsngate_proxy_pool_open_connections"),
        "{metrics}"
    );
    assert!(proxy.http_get("/nope").starts_with("HTTP/1.1 404"));
}

#[test]
fn shutdown_lets_an_open_transaction_finish() {
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    let t = unique("drain");
    cluster
        .primary()
        .sql(&format!("CREATE TABLE {t} (id int)"))
        .unwrap();
    let runtime = rt();
    let client = runtime.block_on(async {
        let client = connect(&proxy.conninfo()).await;
        client
            .batch_execute(&format!("BEGIN; INSERT INTO {t} VALUES (1)"))
            .await
            .unwrap();
        client
    });
    let addr = proxy.addr;
    let stopper = std::thread::spawn(move || proxy.shutdown());
    // Draining has begun once the proxy stops accepting (this used to be a 300 ms sleep).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(addr).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the proxy still accepted clients 30 s after shutdown"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    runtime.block_on(async {
        client
            .batch_execute(&format!("INSERT INTO {t} VALUES (2); COMMIT"))
            .await
            .unwrap();
        let after = client.batch_execute("SELECT 1").await;
        assert!(after.is_err(), "the drained session is closed once idle");
    });
    stopper.join().unwrap();
    assert_eq!(
        cluster
            .primary()
            .sql(&format!("SELECT count(*) FROM {t}"))
            .unwrap(),
        "2"
    );
}

#[test]
fn tls_is_offered_and_can_be_required() {
    let cluster = shared_cluster();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    run_ok(
        Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=localhost",
            ])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert),
    );
    let mut file = file_config(cluster);
    file.tls_cert = Some(cert);
    file.tls_key = Some(key);
    file.tls_mode = Some(lsngate_proxy::TlsMode::Require);
    let proxy = TestProxy::with(file);
    let attempt = |sslmode: &str| {
        let conninfo = format!("{} sslmode={sslmode}", proxy.conninfo());
        let mut command = Command::new(cluster.pg_bin().tool("psql"));
        command.args([
            "-X",
            "-d",
            &conninfo,
            "-c",
            "\\conninfo",
            "-c",
            "SELECT 'over tls'",
        ]);
        let output = run(&mut command);
        let (stdout, stderr) = texts(&output);
        (output.status.success(), format!("{stdout}{stderr}"))
    };
    let (ok, out) = attempt("require");
    assert!(ok, "{out}");
    assert!(out.contains("SSL") && out.contains("over tls"), "{out}");
    let (ok, out) = attempt("disable");
    assert!(!ok && out.contains("requires TLS"), "{out}");
}

/// Session pooling pins a *primary* connection to each client, whatever its first statement:
/// a first read used to attach a replica (planned as "stay where the session is", with no
/// connection yet) and pin the client there, so its writes then failed with 25006 and its reads
/// waited for no floor.
#[test]
fn session_pooling_pins_a_primary_connection_even_when_the_first_statement_reads() {
    let cluster = shared_cluster();
    let mut file = file_config(cluster);
    file.pool_mode = Some(PoolMode::Session);
    let proxy = TestProxy::with(file);
    let table = unique("session_first_read");
    cluster
        .primary()
        .sql(&format!("CREATE TABLE {table} (id int)"))
        .unwrap();
    rt().block_on(async {
        let client = connect(&proxy.conninfo()).await;
        let first = show(&client, "SELECT pg_is_in_recovery()::text").await;
        assert_eq!(
            first, "false",
            "the first read pinned the client to a replica"
        );
        client
            .batch_execute(&format!("INSERT INTO {table} VALUES (1)"))
            .await
            .expect("a write after the first read runs on the pinned primary");
        let seen = show(&client, &format!("SELECT count(*)::text FROM {table}")).await;
        assert_eq!(seen, "1");
    });
}
