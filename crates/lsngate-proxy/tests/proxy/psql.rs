//! psql through the proxy: a scripted session and protocol-level robustness.

use std::io::{Read, Write};

use crate::support::*;
use lsngate_cluster::shared_cluster;

/// psql on the proxy, unaligned and tuples only, no psqlrc.
fn psql(cluster: &lsngate_cluster::Cluster, proxy: &TestProxy) -> std::process::Command {
    let mut command = std::process::Command::new(cluster.pg_bin().tool("psql"));
    command.args(["-X", "-A", "-t", "-d", &proxy.conninfo()]);
    command
}

#[test]
fn psql_scripted_session_ddl_insert_transaction_copy_error_recovery() {
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    let t = unique("psql");
    let script = format!(
        "CREATE TABLE {t} (id int PRIMARY KEY, note text);\n\
         INSERT INTO {t} VALUES (1, 'one');\n\
         BEGIN;\n\
         INSERT INTO {t} VALUES (2, 'two');\n\
         SELECT count(*) FROM {t};\n\
         COMMIT;\n\
         COPY {t} FROM STDIN;\n3\tthree\n4\tfour\n\\.\n\
         \\set ON_ERROR_STOP 0\n\
         INSERT INTO {t} VALUES (1, 'duplicate');\n\
         \\set ON_ERROR_STOP 1\n\
         PREPARE by_id(int) AS SELECT note FROM {t} WHERE id = $1;\n\
         EXECUTE by_id(3);\n\
         /* lsngate:route=primary */ COPY (SELECT id FROM {t} ORDER BY id) TO STDOUT;\n"
    );
    let mut command = psql(cluster, &proxy);
    command.args(["-q", "-v", "ON_ERROR_STOP=1"]);
    command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let (stdout, stderr) = texts(&output);
    assert!(output.status.success(), "psql failed\n{stdout}\n{stderr}");
    assert!(
        stderr.contains("duplicate key value"),
        "the error reached the client: {stderr}"
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        vec!["2", "three", "1", "2", "3", "4"],
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert_eq!(
        cluster
            .primary()
            .sql(&format!("SELECT count(*) FROM {t}"))
            .unwrap(),
        "4"
    );
}

#[test]
fn garbage_ends_only_that_client() {
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    let healthy = psql(cluster, &proxy)
        .args(["-c", "SELECT 'still here' FROM pg_sleep(1)"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    for garbage in [
        &b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        &b"\x00\x00\x00\x08\x04\xd2\x16\x2f"[..],
        &b"\xff\xff\xff\xff"[..],
    ] {
        let mut stream = std::net::TcpStream::connect(proxy.addr).unwrap();
        stream.write_all(garbage).unwrap();
        let mut reply = Vec::new();
        let _ = stream.read_to_end(&mut reply);
        assert!(
            reply.first() == Some(&b'E') || reply == b"N",
            "expected a FATAL, got {reply:?}"
        );
    }
    // A logged-in client that then sends an oversized / unknown message.
    let mut stream = std::net::TcpStream::connect(proxy.addr).unwrap();
    let mut startup = b"\x00\x03\x00\x00user\x00postgres\x00database\x00postgres\x00\x00".to_vec();
    let mut packet = ((startup.len() + 4) as u32).to_be_bytes().to_vec();
    packet.append(&mut startup);
    stream.write_all(&packet).unwrap();
    stream.write_all(b"Q\x7f\xff\xff\xff").unwrap();
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    let text = String::from_utf8_lossy(&reply);
    assert!(text.contains("exceeds the limit"), "reply: {text}");
    let output = healthy.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "still here");
}

#[test]
fn a_client_encoding_other_than_utf8_is_refused_with_the_fix() {
    use std::os::unix::ffi::OsStrExt;
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    // 'é' in LATIN1 is the single byte 0xE9: not UTF-8.
    let sql = std::ffi::OsStr::from_bytes(b"SELECT '\xe9'");
    let output = run(psql(cluster, &proxy)
        .env("PGCLIENTENCODING", "LATIN1")
        .arg("-c")
        .arg(sql));
    let (stdout, stderr) = texts(&output);
    assert!(!output.status.success(), "{stdout}");
    assert!(
        stderr.contains("not UTF-8") && stderr.contains("client_encoding=UTF8"),
        "{stderr}"
    );
    // ASCII text in another client encoding is fine, and the proxy goes on serving.
    let (stdout, _) = run_ok(
        psql(cluster, &proxy)
            .env("PGCLIENTENCODING", "LATIN1")
            .args(["-c", "SELECT 41 + 1"]),
    );
    assert_eq!(stdout.trim(), "42");
}
