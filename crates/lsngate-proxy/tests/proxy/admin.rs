//! The admin console (database `lsngate`, alias `pgbouncer`) as PgBouncer users drive it: the
//! real psql with `-c 'SHOW POOLS'` and friends, a driver (tokio-postgres) over the simple
//! protocol, and the control commands' effects checked on the proxy's state and on real clients.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::*;
use lsngate_cluster::shared_cluster;
use lsngate_proxy::FileConfig;
use lsngate_proxy::config::UserEntry;

/// Console users of every test: an admin, a stats user, and a user who is neither.
fn console_config() -> FileConfig {
    let mut file = file_config(shared_cluster());
    file.users = vec![
        UserEntry::new("boss", Some("boss-pw"), "scram-sha-256"),
        UserEntry::new("watcher", Some("watcher-pw"), "scram-sha-256"),
        UserEntry::new("app", Some("app-pw"), "scram-sha-256"),
    ];
    file.admin_users = vec!["boss".into()];
    file.stats_users = vec!["watcher".into()];
    file
}

fn password(user: &str) -> String {
    format!("{user}-pw")
}

/// psql as `user` on `database` through the proxy at `port`: unaligned, `|`-separated, no
/// psqlrc, each `commands` entry a `-c`. Returns (succeeded, stdout, stderr).
fn psql_at(port: u16, user: &str, database: &str, commands: &[&str]) -> (bool, String, String) {
    let conninfo = format!("host=127.0.0.1 port={port} user={user} dbname={database}");
    let mut command = Command::new(shared_cluster().pg_bin().tool("psql"));
    command
        .args([
            "-X",
            "-w",
            "-A",
            "-F",
            "|",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            &conninfo,
        ])
        .env("PGPASSWORD", password(user));
    for c in commands {
        command.args(["-c", c]);
    }
    let output = run(&mut command);
    let (stdout, stderr) = texts(&output);
    (output.status.success(), stdout, stderr)
}

fn psql(
    proxy: &TestProxy,
    user: &str,
    database: &str,
    commands: &[&str],
) -> (bool, String, String) {
    psql_at(proxy.addr.port(), user, database, commands)
}

/// A console command that must succeed; its stdout.
fn console(proxy: &TestProxy, command: &str) -> String {
    let (ok, stdout, stderr) = psql(proxy, "boss", "lsngate", &[command]);
    assert!(ok, "{command} failed: {stderr}");
    stdout
}

/// The rows of a SHOW as maps from column name to value.
fn table(output: &str) -> Vec<std::collections::HashMap<String, String>> {
    let mut lines = output
        .lines()
        .filter(|l| !l.starts_with('(') && !l.is_empty());
    let header: Vec<String> = lines
        .next()
        .unwrap_or_default()
        .split('|')
        .map(str::to_string)
        .collect();
    lines
        .map(|line| {
            header
                .iter()
                .cloned()
                .zip(line.split('|').map(str::to_string))
                .collect()
        })
        .collect()
}

fn header(output: &str) -> &str {
    output.lines().next().unwrap_or_default()
}

/// Databases with a pool on any node, from `/status`.
fn pooled_databases(proxy: &TestProxy) -> Vec<String> {
    let status = proxy.status();
    let mut names: Vec<String> = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|n| n["pools"].as_array().unwrap().clone())
        .map(|p| p["database"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Waits (at most 30 s) until `check` holds.
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "not within 30 s: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn client_conninfo(proxy: &TestProxy, user: &str, application_name: &str) -> String {
    format!(
        "host=127.0.0.1 port={} user={user} password={} dbname=postgres application_name={application_name}",
        proxy.addr.port(),
        password(user)
    )
}

#[test]
fn the_console_database_is_served_by_the_proxy_and_makes_no_pool() {
    let proxy = TestProxy::with(console_config());
    for database in ["lsngate", "pgbouncer"] {
        let out = console_at(&proxy, database, "SHOW VERSION");
        assert!(out.contains("lsngate "), "{database}: {out}");
    }
    // A database the server lacks and a user the config lacks leave no pool either.
    let (ok, _, stderr) = psql(&proxy, "app", "no_such_db", &["SELECT 1"]);
    assert!(
        !ok && stderr.contains("database \"no_such_db\" does not exist")
            && stderr.contains("check the database name the client connected with"),
        "{stderr}"
    );
    let (ok, _, stderr) = psql(&proxy, "nobody", "postgres", &["SELECT 1"]);
    assert!(
        !ok && stderr.contains("no such user \"nobody\""),
        "{stderr}"
    );
    assert_eq!(
        pooled_databases(&proxy),
        Vec::<String>::new(),
        "no pool for lsngate, pgbouncer, no_such_db or nobody's login"
    );
    let (ok, stdout, _) = psql(&proxy, "app", "postgres", &["SELECT 1"]);
    assert!(ok && stdout.contains('1'));
    assert_eq!(pooled_databases(&proxy), vec!["postgres".to_string()]);
}

fn console_at(proxy: &TestProxy, database: &str, command: &str) -> String {
    let (ok, stdout, stderr) = psql(proxy, "boss", database, &[command]);
    assert!(ok, "{command} on {database} failed: {stderr}");
    stdout
}

#[test]
fn only_admin_and_stats_users_get_in_and_stats_users_only_show() {
    let proxy = TestProxy::with(console_config());
    let (ok, _, stderr) = psql(&proxy, "app", "pgbouncer", &["SHOW POOLS"]);
    assert!(
        !ok && stderr.contains("not allowed: user \"app\" may not use the admin console")
            && stderr.contains("admin_users"),
        "{stderr}"
    );
    let (ok, _, stderr) = psql(&proxy, "watcher", "lsngate", &["SHOW VERSION"]);
    assert!(ok, "{stderr}");
    let (ok, _, stderr) = psql(&proxy, "watcher", "lsngate", &["PAUSE"]);
    assert!(
        !ok && stderr.contains("admin access needed: PAUSE is for admin_users"),
        "{stderr}"
    );
    assert!(!proxy.status()["nodes"].as_array().unwrap().is_empty());
    let state = table(&console(&proxy, "SHOW STATE"));
    assert_eq!(state[1]["key"], "paused");
    assert_eq!(
        state[1]["value"], "no",
        "the stats user's PAUSE did nothing"
    );
    // A wrong password is refused as for any login.
    let conninfo = format!(
        "host=127.0.0.1 port={} user=boss dbname=lsngate",
        proxy.addr.port()
    );
    let mut command = Command::new(shared_cluster().pg_bin().tool("psql"));
    command
        .args(["-X", "-w", "-d", &conninfo, "-c", "SHOW POOLS"])
        .env("PGPASSWORD", "wrong");
    let output = run(&mut command);
    let (_, stderr) = texts(&output);
    assert!(
        !output.status.success() && stderr.contains("password authentication failed"),
        "{stderr}"
    );
}

#[test]
fn every_show_answers_from_psql_with_pgbouncer_columns() {
    let cluster = shared_cluster();
    let proxy = TestProxy::with(console_config());
    let rt = rt();
    let held = rt.block_on(connect(&client_conninfo(&proxy, "app", "held_open")));
    rt.block_on(held.simple_query("SELECT 1")).unwrap();
    let expect = [
        ("SHOW HELP", "command"),
        (
            "SHOW POOLS",
            "database|user|cl_active|cl_waiting|sv_active|sv_idle|maxwait|maxwait_us|pool_mode|node|node_role|paused",
        ),
        (
            "SHOW CLIENTS",
            "type|user|database|state|addr|port|local_addr|local_port|connect_time|id|tls|application_name",
        ),
        (
            "SHOW SERVERS",
            "type|user|database|state|addr|port|connect_time|remote_pid|node_role",
        ),
        (
            "SHOW STATS",
            "database|total_server_assignment_count|total_xact_count|total_query_count|total_received|total_sent|total_xact_time|total_query_time|total_wait_time|avg_server_assignment_count|avg_xact_count|avg_query_count|avg_recv|avg_sent|avg_xact_time|avg_query_time|avg_wait_time",
        ),
        (
            "SHOW STATS_TOTALS",
            "database|server_assignment_count|xact_count|query_count|bytes_received|bytes_sent|xact_time|query_time|wait_time",
        ),
        (
            "SHOW STATS_AVERAGES",
            "database|server_assignment_count|xact_count|query_count|bytes_received|bytes_sent|xact_time|query_time|wait_time",
        ),
        (
            "SHOW DATABASES",
            "name|host|port|database|force_user|pool_size|reserve_pool|pool_mode|max_connections|current_connections|paused|disabled",
        ),
        ("SHOW USERS", "name|pool_mode|server_user|console"),
        ("SHOW CONFIG", "key|value|default|changeable"),
        ("SHOW LISTS", "list|items"),
        ("SHOW VERSION", "version"),
        ("SHOW STATE", "key|value"),
        (
            "SHOW REPLICAS",
            "node|role|healthy|replayed_lsn|lag_bytes|lag_ms|busy|timeline|receiver|last_error",
        ),
        (
            "SHOW CAUSAL",
            "consistency|wait_timeout_ms|fallback|reads_replica|reads_waited|reads_fallback|reads_no_replica|reads_stale|reads_error|wait_total_ms|breaker_open|fallbacks_in_flight|fallback_rate|refused_reads|rescued_reads|primary_position",
        ),
    ];
    for (command, columns) in expect {
        let out = console(&proxy, command);
        assert_eq!(header(&out), columns, "{command}:\n{out}");
    }
    // Values from the proxy's state.
    let pools = table(&console(&proxy, "show pools;"));
    let primary = pools
        .iter()
        .find(|p| p["database"] == "postgres" && p["node_role"] == "primary")
        .expect("the primary's pool of database postgres");
    assert_eq!(primary["sv_idle"], "1", "{pools:?}");
    assert_eq!(primary["pool_mode"], "transaction");
    let clients = table(&console(&proxy, "SHOW CLIENTS"));
    let held_row = clients
        .iter()
        .find(|c| c["application_name"] == "held_open")
        .expect("the open client is listed");
    assert_eq!(
        (
            held_row["user"].as_str(),
            held_row["database"].as_str(),
            held_row["state"].as_str()
        ),
        ("app", "postgres", "idle")
    );
    let servers = table(&console(&proxy, "SHOW SERVERS"));
    let pid = &servers
        .iter()
        .find(|s| s["database"] == "postgres" && s["node_role"] == "primary")
        .expect("a server connection to the primary")["remote_pid"];
    let listed = cluster
        .primary()
        .sql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}"
        ))
        .unwrap();
    assert_eq!(listed, "1", "SHOW SERVERS' remote_pid is a real backend");
    let replicas = table(&console(&proxy, "SHOW REPLICAS"));
    assert_eq!(replicas.len(), 1 + cluster.replica_urls().len());
    assert_eq!(replicas[0]["role"], "primary");
    assert!(
        replicas[1..]
            .iter()
            .all(|r| r["role"] == "replica" && r["healthy"] == "yes")
    );
    let causal = table(&console(&proxy, "SHOW CAUSAL"));
    assert_eq!(causal[0]["consistency"], "session");
    assert_eq!(causal[0]["wait_timeout_ms"], "500");
    let config = table(&console(&proxy, "SHOW CONFIG"));
    let pool_size = config.iter().find(|r| r["key"] == "pool_size").unwrap();
    assert_eq!(
        (
            pool_size["value"].as_str(),
            pool_size["changeable"].as_str()
        ),
        ("4", "yes")
    );
    let stats = table(&console(&proxy, "SHOW STATS"));
    let assigned: u64 = stats.iter().find(|r| r["database"] == "postgres").unwrap()
        ["total_server_assignment_count"]
        .parse()
        .unwrap();
    assert!(assigned >= 1, "{stats:?}");
    let lists = table(&console(&proxy, "SHOW LISTS"));
    let used_clients = lists.iter().find(|r| r["list"] == "used_clients").unwrap();
    assert_eq!(used_clients["items"], "2", "the held client and this psql");
    // Several commands in one string, as PgBouncer takes them.
    let (ok, out, stderr) = psql(&proxy, "boss", "lsngate", &["SHOW VERSION; SHOW STATE"]);
    assert!(
        ok && out.contains("lsngate ") && out.contains("paused|no"),
        "{out}{stderr}"
    );
    // An unknown command names itself and lists the valid ones.
    let (ok, _, stderr) = psql(&proxy, "boss", "lsngate", &["SHOW POOOLS"]);
    assert!(
        !ok && stderr.contains("invalid command 'SHOW POOOLS': there is no SHOW POOOLS; the admin console knows: SHOW HELP|POOLS|"),
        "{stderr}"
    );
}

#[test]
fn a_driver_reads_the_shows_over_the_simple_protocol_and_is_told_the_extended_one_is_not_served() {
    let proxy = TestProxy::with(console_config());
    let rt = rt();
    let conninfo = format!(
        "host=127.0.0.1 port={} user=boss password=boss-pw dbname=pgbouncer",
        proxy.addr.port()
    );
    let client = rt.block_on(connect(&conninfo));
    for show in [
        "POOLS",
        "CLIENTS",
        "STATS",
        "DATABASES",
        "CONFIG",
        "REPLICAS",
        "CAUSAL",
    ] {
        let messages = rt
            .block_on(client.simple_query(&format!("SHOW {show}")))
            .unwrap_or_else(|e| panic!("SHOW {show}: {e}"));
        assert!(
            matches!(
                messages.last(),
                Some(tokio_postgres::SimpleQueryMessage::CommandComplete(_))
            ),
            "SHOW {show}"
        );
    }
    let rows = rt.block_on(client.simple_query("SHOW CLIENTS")).unwrap();
    let row = rows
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(r),
            _ => None,
        })
        .expect("this client is listed");
    assert_eq!(row.get("user"), Some("boss"));
    assert_eq!(row.get("database"), Some("pgbouncer"));
    let error = rt
        .block_on(client.query("SHOW POOLS", &[]))
        .expect_err("the extended protocol is refused");
    let db = error.as_db_error().expect("a server error");
    assert_eq!(db.code().code(), "08P01");
    assert!(
        db.message()
            .contains("extended query protocol not supported by the lsngate admin console"),
        "{db}"
    );
    let again = rt.block_on(client.simple_query("SHOW VERSION")).unwrap();
    assert!(again.len() >= 2, "the session goes on after the refusal");
}

#[test]
fn pause_holds_a_new_query_until_resume_while_the_transaction_in_flight_finishes() {
    let mut file = console_config();
    file.acquire_timeout_ms = Some(60_000);
    file.consistency = Some("eventual".into());
    let proxy = TestProxy::with(file);
    let t = unique("paused");
    let rt = rt();
    let in_flight = rt.block_on(connect(&client_conninfo(&proxy, "app", "in_flight")));
    rt.block_on(in_flight.batch_execute(&format!("CREATE TABLE {t} (id int)")))
        .unwrap();
    rt.block_on(in_flight.batch_execute(&format!("BEGIN; INSERT INTO {t} VALUES (1)")))
        .unwrap();
    // PAUSE waits for the open transaction, which goes on and commits meanwhile.
    let port = proxy.addr.port();
    let pause = std::thread::spawn(move || psql_at(port, "boss", "lsngate", &["PAUSE postgres"]));
    eventually("PAUSE took hold", || {
        table(&console(&proxy, "SHOW DATABASES"))
            .iter()
            .any(|d| d["name"] == "postgres" && d["paused"] == "1")
    });
    rt.block_on(in_flight.batch_execute(&format!("INSERT INTO {t} VALUES (2); COMMIT")))
        .unwrap();
    let (ok, _, stderr) = pause.join().unwrap();
    assert!(ok, "PAUSE: {stderr}");
    caught_up(shared_cluster());
    // A new query now waits in the pool's queue.
    let conninfo = client_conninfo(&proxy, "app", "newcomer");
    let query = format!("SELECT count(*) FROM {t}");
    let newcomer = std::thread::spawn(move || {
        let rt = crate::support::rt();
        let client = rt.block_on(connect(&conninfo));
        let rows = rt.block_on(client.simple_query(&query)).unwrap();
        match &rows[1] {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).unwrap().to_string(),
            other => panic!("{other:?}"),
        }
    });
    eventually("the newcomer queued", || {
        table(&console(&proxy, "SHOW POOLS"))
            .iter()
            .any(|p| p["database"] == "postgres" && p["cl_waiting"] == "1")
    });
    assert!(!newcomer.is_finished(), "held while paused");
    console(&proxy, "RESUME postgres");
    assert_eq!(
        newcomer.join().unwrap(),
        "2",
        "the in-flight transaction committed both rows"
    );
    let (ok, _, stderr) = psql(&proxy, "boss", "lsngate", &["RESUME postgres"]);
    assert!(
        !ok && stderr.contains("database \"postgres\" is not paused"),
        "{stderr}"
    );
}

#[test]
fn a_query_paused_longer_than_acquire_timeout_gets_an_error_naming_the_pause() {
    let mut file = console_config();
    file.acquire_timeout_ms = Some(200);
    let proxy = TestProxy::with(file);
    assert!(psql(&proxy, "app", "postgres", &["SELECT 1"]).0);
    console(&proxy, "PAUSE postgres");
    let (ok, _, stderr) = psql(&proxy, "app", "postgres", &["SELECT 1"]);
    assert!(
        !ok && stderr
            .contains("database \"postgres\" is paused (PAUSE on the lsngate admin console)")
            && stderr.contains("RESUME it there"),
        "{stderr}"
    );
    console(&proxy, "RESUME postgres");
    assert!(psql(&proxy, "app", "postgres", &["SELECT 1"]).0);
}

#[test]
fn kill_client_ends_just_that_client() {
    let proxy = TestProxy::with(console_config());
    let rt = rt();
    let doomed = rt.block_on(connect(&client_conninfo(&proxy, "app", "doomed")));
    let spared = rt.block_on(connect(&client_conninfo(&proxy, "app", "spared")));
    let clients = table(&console(&proxy, "SHOW CLIENTS"));
    let id = &clients
        .iter()
        .find(|c| c["application_name"] == "doomed")
        .expect("listed")["id"];
    console(&proxy, &format!("KILL_CLIENT {id}"));
    // The session ends on its own task: it has written its FATAL once it left the list.
    eventually("the killed client left the list", || {
        let clients = table(&console(&proxy, "SHOW CLIENTS"));
        !clients.iter().any(|c| c["application_name"] == "doomed")
            && clients.iter().any(|c| c["application_name"] == "spared")
    });
    let error = rt
        .block_on(doomed.simple_query("SELECT 1"))
        .expect_err("the killed client's connection is gone");
    let db = error.as_db_error().expect("the proxy's FATAL");
    assert_eq!(db.code().code(), "57P01");
    assert!(
        db.message().contains("KILL on the lsngate admin console"),
        "{db}"
    );
    rt.block_on(spared.simple_query("SELECT 1")).unwrap();
    let (ok, _, stderr) = psql(&proxy, "boss", "lsngate", &["KILL_CLIENT 999999"]);
    assert!(
        !ok && stderr.contains("no client with id 999999"),
        "{stderr}"
    );
}

#[test]
fn control_commands_run_from_psql() {
    let proxy = TestProxy::with(console_config());
    let rt = rt();
    let app = rt.block_on(connect(&client_conninfo(&proxy, "app", "app")));
    rt.block_on(app.simple_query("SELECT 1")).unwrap();
    // RECONNECT replaces the server connections.
    let before: Vec<String> = table(&console(&proxy, "SHOW SERVERS"))
        .iter()
        .map(|s| s["remote_pid"].clone())
        .collect();
    assert!(!before.is_empty());
    console(&proxy, "RECONNECT postgres");
    rt.block_on(app.simple_query("SELECT 1")).unwrap();
    let after: Vec<String> = table(&console(&proxy, "SHOW SERVERS"))
        .iter()
        .map(|s| s["remote_pid"].clone())
        .collect();
    assert!(
        after.iter().all(|pid| !before.contains(pid)),
        "{before:?} -> {after:?}"
    );
    // DISABLE refuses new logins until ENABLE.
    console(&proxy, "DISABLE postgres");
    let (ok, _, stderr) = psql(&proxy, "app", "postgres", &["SELECT 1"]);
    assert!(
        !ok && stderr.contains("database \"postgres\" is not currently accepting connections")
            && stderr.contains("ENABLE postgres"),
        "{stderr}"
    );
    console(&proxy, "ENABLE postgres");
    assert!(psql(&proxy, "app", "postgres", &["SELECT 1"]).0);
    // SET changes a live setting, refuses the others with the reason.
    console(&proxy, "SET pool_size = 3");
    let config = table(&console(&proxy, "SHOW CONFIG"));
    assert_eq!(
        config.iter().find(|r| r["key"] == "pool_size").unwrap()["value"],
        "3"
    );
    let pools = table(&console(&proxy, "SHOW DATABASES"));
    assert_eq!(
        pools.iter().find(|d| d["name"] == "postgres").unwrap()["pool_size"],
        "3"
    );
    for (set, error) in [
        (
            "SET listen = '127.0.0.1:1'",
            "SET cannot change \"listen\" on a running lsngate; change it in the config file and restart",
        ),
        (
            "SET consistency = eventual",
            "SET cannot change \"consistency\" on a running lsngate; change it in the config file and RELOAD",
        ),
        (
            "SET no_such_key = 1",
            "unrecognized configuration parameter \"no_such_key\"",
        ),
        (
            "SET pool_size = many",
            "invalid value for pool_size: \"many\": expected a whole number",
        ),
    ] {
        let (ok, _, stderr) = psql(&proxy, "boss", "lsngate", &[set]);
        assert!(!ok && stderr.contains(error), "{set}: {stderr}");
    }
    // RELOAD of an in-process proxy has no file to read: said so, nothing changes.
    let (ok, _, stderr) = psql(&proxy, "boss", "lsngate", &["RELOAD"]);
    assert!(
        !ok && stderr.contains("no config source to reload from"),
        "{stderr}"
    );
    // KILL disconnects the database's clients; the console session stays.
    let (ok, out, stderr) = psql(
        &proxy,
        "boss",
        "lsngate",
        &["KILL postgres", "SHOW VERSION"],
    );
    assert!(ok && out.contains("lsngate "), "{stderr}");
    eventually("KILL ended the database's client", || {
        !table(&console(&proxy, "SHOW CLIENTS"))
            .iter()
            .any(|c| c["database"] == "postgres")
    });
    assert!(rt.block_on(app.simple_query("SELECT 1")).is_err(), "killed");
    assert!(
        psql(&proxy, "app", "postgres", &["SELECT 1"]).0,
        "new logins are served"
    );
    // PAUSE and RESUME of every database.
    console(&proxy, "PAUSE");
    assert!(console(&proxy, "SHOW STATE").contains("paused|yes"));
    console(&proxy, "RESUME");
    assert!(psql(&proxy, "app", "postgres", &["SELECT 1"]).0);
    // SHUTDOWN drains the proxy as SIGTERM does.
    console(&proxy, "SHUTDOWN");
    proxy.shutdown();
}

#[test]
fn reload_applies_a_changed_pool_size() {
    let cluster = shared_cluster();
    let dir = tempfile::tempdir().unwrap();
    let port = lsngate_cluster::free_port().unwrap();
    let config_path = dir.path().join("lsngate.toml");
    let write_config = |pool_size: usize| {
        let text = format!(
            "listen = \"127.0.0.1:{port}\"\nprimary = \"{}\"\npool_size = {pool_size}\n\
             acquire_timeout_ms = 60000\nconsistency = \"eventual\"\nadmin_users = [\"boss\"]\n\
             [[users]]\nname = \"boss\"\npassword = \"boss-pw\"\n\
             [[users]]\nname = \"app\"\npassword = \"app-pw\"\n",
            cluster.primary_url()
        );
        std::fs::write(&config_path, text).unwrap();
    };
    write_config(1);
    let mut child = Command::new(crate::signals::example_binary())
        .arg("--config")
        .arg(&config_path)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the proxy_cli example is built by cargo test");
    eventually("the proxy listens", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let console = |command: &str| {
        let (ok, stdout, stderr) = psql_at(port, "boss", "lsngate", &[command]);
        assert!(ok, "{command}: {stderr}");
        stdout
    };
    let conninfo = |name: &str| {
        format!(
            "host=127.0.0.1 port={port} user=app password=app-pw dbname=postgres application_name={name}"
        )
    };
    let rt = rt();
    // The pool's one connection is held by an open transaction; a second client queues.
    let holder = rt.block_on(connect(&conninfo("holder")));
    rt.block_on(holder.batch_execute("BEGIN; SELECT 1"))
        .unwrap();
    let second = conninfo("second");
    let queued = std::thread::spawn(move || {
        let rt = crate::support::rt();
        let client = rt.block_on(connect(&second));
        rt.block_on(client.simple_query("SELECT 2")).map(|_| ())
    });
    eventually("the second client queued", || {
        table(&console("SHOW POOLS"))
            .iter()
            .any(|p| p["cl_waiting"] == "1")
    });
    write_config(2);
    console("RELOAD");
    // The second slot goes to the queued client while the first is still held.
    queued.join().unwrap().expect("served from the grown pool");
    let pools = table(&console("SHOW POOLS"));
    assert_eq!(
        pools[0]["sv_active"], "1",
        "the holder keeps its connection: {pools:?}"
    );
    let databases = table(&console("SHOW DATABASES"));
    assert_eq!(
        databases.iter().find(|d| d["name"] == "postgres").unwrap()["pool_size"],
        "2"
    );
    rt.block_on(holder.batch_execute("COMMIT")).unwrap();
    // A config with an error is not applied, and RELOAD says why.
    std::fs::write(&config_path, "pool_size = \"three\"\n").unwrap();
    let (ok, _, stderr) = psql_at(port, "boss", "lsngate", &["RELOAD"]);
    assert!(
        !ok && stderr.contains("config not reloaded: invalid config file"),
        "{stderr}"
    );
    assert!(console("SHOW CONFIG").contains("pool_size|2|20|yes"));
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn pgx_reads_every_show_over_the_simple_protocol_and_is_told_the_extended_one_is_not_served() {
    let proxy = TestProxy::with(console_config());
    let program = crate::drivers::build_pgx_program("pgx_console");
    let url = format!(
        "postgres://boss:boss-pw@127.0.0.1:{}/pgbouncer?sslmode=disable",
        proxy.addr.port()
    );
    let shows = [
        "HELP",
        "POOLS",
        "CLIENTS",
        "SERVERS",
        "STATS",
        "STATS_TOTALS",
        "STATS_AVERAGES",
        "DATABASES",
        "USERS",
        "CONFIG",
        "LISTS",
        "VERSION",
        "STATE",
        "REPLICAS",
        "CAUSAL",
    ];
    let (stdout, _) = run_ok(Command::new(program).arg(&url).args(shows));
    assert!(
        stdout.contains(
            "extended: ERROR: extended query protocol not supported by the lsngate admin console"
        ) && stdout.contains("(SQLSTATE 08P01)"),
        "{stdout}"
    );
    for show in shows {
        assert!(
            stdout.contains(&format!("SHOW {show}: ")),
            "{show}: {stdout}"
        );
    }
    assert!(
        stdout.contains("SHOW CLIENTS: type,user,database,state,addr,port,local_addr,local_port,connect_time,id,tls,application_name | "),
        "{stdout}"
    );
}

/// SHOW STATS' totals for `database`: (total_query_count, total_xact_count, total_received,
/// total_sent, total_query_time).
fn query_stats(proxy: &TestProxy, database: &str) -> (u64, u64, u64, u64, u64) {
    let stats = table(&console(proxy, "SHOW STATS"));
    let row = stats
        .iter()
        .find(|r| r["database"] == database)
        .unwrap_or_else(|| panic!("no SHOW STATS row for {database}: {stats:?}"));
    let number = |column: &str| -> u64 { row[column].parse().unwrap() };
    (
        number("total_query_count"),
        number("total_xact_count"),
        number("total_received"),
        number("total_sent"),
        number("total_query_time"),
    )
}

#[test]
fn show_stats_counts_queries_transactions_and_bytes() {
    let proxy = TestProxy::with(console_config());
    // 20 statements (each -c is one simple Query, an autocommit transaction of its own) and
    // one BEGIN; SELECT; COMMIT sent as three.
    let mut statements: Vec<String> = (0..20).map(|i| format!("SELECT {i}")).collect();
    statements.extend(["BEGIN", "SELECT 'in a block'", "COMMIT"].map(String::from));
    let statements: Vec<&str> = statements.iter().map(String::as_str).collect();
    let (ok, _, stderr) = psql(&proxy, "app", "postgres", &statements);
    assert!(ok, "{stderr}");
    let (queries, transactions, received, sent, query_time) = query_stats(&proxy, "postgres");
    assert!(queries >= 23, "23 queries ran, SHOW STATS counts {queries}");
    assert!(
        transactions >= 21 && transactions < queries,
        "20 autocommit statements and one block: {transactions} transactions of {queries} queries"
    );
    assert!(received > 0 && sent > 0 && query_time > 0);
    let (ok, _, stderr) = psql(&proxy, "app", "postgres", &["SELECT repeat('x', 5000)"; 5]);
    assert!(ok, "{stderr}");
    let (more_queries, _, more_received, more_sent, _) = query_stats(&proxy, "postgres");
    assert!(
        more_queries >= queries + 5,
        "{queries} then {more_queries} queries"
    );
    assert!(
        more_received > received && more_sent >= sent + 5 * 5000,
        "bytes grow: received {received} → {more_received}, sent {sent} → {more_sent}"
    );
    // STATS_TOTALS says the same under its names; STATS_AVERAGES has a row for the database.
    let totals = table(&console(&proxy, "SHOW STATS_TOTALS"));
    let row = totals.iter().find(|r| r["database"] == "postgres").unwrap();
    let total_queries: u64 = row["query_count"].parse().unwrap();
    assert!(total_queries >= more_queries, "{row:?}");
    let averages = table(&console(&proxy, "SHOW STATS_AVERAGES"));
    let row = averages
        .iter()
        .find(|r| r["database"] == "postgres")
        .unwrap();
    let mean_query_us: u64 = row["query_time"].parse().unwrap();
    assert!(mean_query_us > 0, "{row:?}");
}

/// STATS_AVERAGES' (query_count per second, query_time per query) for `database`.
fn averages(proxy: &TestProxy, database: &str) -> (u64, u64) {
    let rows = table(&console(proxy, "SHOW STATS_AVERAGES"));
    let row = rows
        .iter()
        .find(|r| r["database"] == database)
        .unwrap_or_else(|| panic!("no STATS_AVERAGES row for {database}: {rows:?}"));
    (
        row["query_count"].parse().unwrap(),
        row["query_time"].parse().unwrap(),
    )
}

/// The averages are the last complete stats_period's, as PgBouncer's: a period with traffic
/// shows it, an idle one after it shows zeros while the totals keep everything. (They used to
/// be over the time since the proxy started, so an idle proxy kept showing its past load.)
#[test]
fn show_stats_averages_cover_the_last_stats_period() {
    let mut file = console_config();
    file.stats_period_ms = Some(300);
    let proxy = TestProxy::with(file);
    let config = table(&console(&proxy, "SHOW CONFIG"));
    let row = config
        .iter()
        .find(|r| r["key"] == "stats_period_ms")
        .unwrap();
    assert_eq!(row["value"], "300", "{row:?}");
    // Traffic until a whole period with queries in it has ended (bounded, not timed).
    let batch = ["SELECT 1"; 40];
    let deadline = Instant::now() + Duration::from_secs(30);
    let busy = loop {
        let (ok, _, stderr) = psql(&proxy, "app", "postgres", &batch);
        assert!(ok, "{stderr}");
        let (per_second, query_us) = averages(&proxy, "postgres");
        if per_second > 0 && query_us > 0 {
            break (per_second, query_us);
        }
        assert!(Instant::now() < deadline, "no period with traffic in 30 s");
    };
    // Then nothing: within a few periods the averages fall to zero, the totals stay.
    let deadline = Instant::now() + Duration::from_secs(30);
    while averages(&proxy, "postgres") != (0, 0) {
        assert!(
            Instant::now() < deadline,
            "after {busy:?} the averages never fell to zero on an idle proxy: {:?}",
            averages(&proxy, "postgres")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (total_queries, ..) = query_stats(&proxy, "postgres");
    assert!(
        total_queries >= 40,
        "the totals keep the past: {total_queries}"
    );
}

#[test]
fn set_changes_the_connection_limits_of_the_running_proxy() {
    let proxy = TestProxy::with(console_config());
    let config = table(&console(&proxy, "SHOW CONFIG"));
    for key in [
        "max_db_connections",
        "max_user_connections",
        "max_db_client_connections",
        "max_user_client_connections",
        "reserve_pool_size",
        "reserve_pool_timeout_ms",
    ] {
        let row = config.iter().find(|r| r["key"] == key).unwrap();
        assert_eq!(row["changeable"], "yes", "{row:?}");
    }
    console(&proxy, "SET max_db_client_connections = 1");
    let conninfo = format!(
        "host=127.0.0.1 port={} user=app password=app-pw dbname=postgres",
        proxy.addr.port()
    );
    let rt = rt();
    let first = rt.block_on(connect(&conninfo));
    let refused = rt.block_on(async {
        match tokio_postgres::connect(&conninfo, tokio_postgres::NoTls).await {
            Ok(_) => None,
            Err(e) => e
                .as_db_error()
                .map(|e| (e.code().clone(), e.message().to_string())),
        }
    });
    let (code, message) = refused.expect("the second client of postgres is refused");
    assert_eq!(code, tokio_postgres::error::SqlState::TOO_MANY_CONNECTIONS);
    assert!(
        message.contains("max_db_client_connections = 1"),
        "{message}"
    );
    console(&proxy, "SET max_db_client_connections = 0");
    let second = rt.block_on(connect(&conninfo));
    let answer: i32 = rt
        .block_on(second.query_one("SELECT 2", &[]))
        .unwrap()
        .get(0);
    assert_eq!(answer, 2);
    drop(first);
}
