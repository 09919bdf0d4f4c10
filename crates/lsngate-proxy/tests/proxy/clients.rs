//! Compatibility: real client libraries nobody here wrote, each running a scripted session
//! through the proxy (scripts in crates/lsngate-proxy/clients, installed by
//! scripts/install/proxy.sh).

use std::path::PathBuf;
use std::process::Command;

use crate::support::*;
use lsngate_cluster::shared_cluster;

fn clients_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients")
}

fn script(program: &str, file: &str, url: &str, table: &str) -> (String, String) {
    let mut command = Command::new(program);
    command
        .arg(clients_dir().join(file))
        .arg(url)
        .arg(table)
        .current_dir(clients_dir());
    run_ok(&mut command)
}

#[test]
fn psycopg3_scripted_session() {
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    let t = unique("psycopg");
    let (stdout, _) = script("python3", "psycopg_session.py", &proxy.url(), &t);
    assert!(stdout.starts_with("OK psycopg"), "{stdout}");
    assert_eq!(
        cluster
            .primary()
            .sql(&format!("SELECT count(*) FROM {t}"))
            .unwrap(),
        "33"
    );
}

#[test]
fn asyncpg_scripted_session() {
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    let t = unique("asyncpg");
    let (stdout, _) = script("python3", "asyncpg_session.py", &proxy.url(), &t);
    assert!(stdout.starts_with("OK asyncpg"), "{stdout}");
    assert_eq!(
        cluster
            .primary()
            .sql(&format!("SELECT count(*) FROM {t}"))
            .unwrap(),
        "26"
    );
}

#[test]
fn node_postgres_scripted_session() {
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    let t = unique("nodepg");
    let (stdout, _) = script("node", "node_session.js", &proxy.url(), &t);
    assert!(stdout.starts_with("OK node-postgres"), "{stdout}");
    assert_eq!(
        cluster
            .primary()
            .sql(&format!("SELECT count(*) FROM {t}"))
            .unwrap(),
        "8"
    );
}

fn pgbench(cluster: &lsngate_cluster::Cluster, args: &[&str], conninfo_port: u16) -> String {
    let mut command = Command::new(cluster.pg_bin().tool("pgbench"));
    command.args(args).args([
        "-h",
        "127.0.0.1",
        "-p",
        &conninfo_port.to_string(),
        "-U",
        "postgres",
        "postgres",
    ]);
    let (stdout, stderr) = run_ok(&mut command);
    format!("{stdout}{stderr}")
}

#[test]
fn pgbench_init_and_simple_extended_prepared_modes() {
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    let port = proxy.addr.port();
    let init = pgbench(cluster, &["-i", "-s", "1", "-q"], port);
    assert!(init.contains("done"), "{init}");
    caught_up(cluster);
    for mode in ["simple", "extended", "prepared"] {
        for builtin in [&["-S"][..], &["-b", "tpcb-like"][..]] {
            let mut args = vec!["-n", "-c", "4", "-j", "2", "-t", "50", "-M", mode];
            args.extend_from_slice(builtin);
            let out = pgbench(cluster, &args, port);
            assert!(
                out.contains("number of transactions actually processed: 200/200"),
                "{mode} {builtin:?}: {out}"
            );
        }
    }
    let history = cluster
        .primary()
        .sql("SELECT count(*) FROM pgbench_history")
        .unwrap();
    assert_eq!(
        history, "600",
        "every tpcb-like transaction committed exactly once"
    );
}
