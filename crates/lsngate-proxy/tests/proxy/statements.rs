//! The unnamed prepared statement at the protocol level, driven by a raw wire-protocol client
//! (drivers send Parse "" and Bind "" together, so none of them shows this): a Bind "" in a later
//! flight than its Parse "" must run the client's statement wherever that flight lands.

use std::io::{Read, Write};
use std::net::TcpStream;

use bytes::{BufMut, Bytes, BytesMut};
use lsngate_proxy::net::{BackendMessage, FrontendMessage, StartupFrame, decode_frame};

use crate::support::*;
use lsngate_testkit::shared_cluster;

/// What came back for one flight, up to its ReadyForQuery.
#[derive(Debug, Default)]
pub(crate) struct Reply {
    /// Column names of RowDescription messages.
    pub(crate) columns: Vec<String>,
    /// DataRow values as text (NULL as None).
    pub(crate) rows: Vec<Vec<Option<String>>>,
    /// ErrorResponse messages.
    pub(crate) errors: Vec<String>,
}

/// A client speaking protocol 3 by hand over a blocking socket.
pub(crate) struct Wire {
    stream: TcpStream,
    buf: BytesMut,
}

impl Wire {
    /// Logs in as `postgres` (the test proxy trusts loopback clients in flags-only mode).
    pub(crate) fn connect(proxy: &TestProxy) -> Wire {
        let stream = TcpStream::connect(proxy.addr).unwrap();
        // A reply that never comes fails the test instead of hanging it.
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(60)))
            .unwrap();
        let mut wire = Wire {
            stream,
            buf: BytesMut::new(),
        };
        let mut startup = BytesMut::new();
        StartupFrame::Startup {
            minor: 0,
            params: vec![
                ("user".into(), "postgres".into()),
                ("database".into(), "postgres".into()),
            ],
        }
        .encode(&mut startup);
        wire.stream.write_all(&startup).unwrap();
        let reply = wire.until_ready();
        assert!(reply.errors.is_empty(), "login failed: {reply:?}");
        wire
    }

    /// Sends `messages` in one write and reads the replies up to the last ReadyForQuery.
    pub(crate) fn flight(&mut self, messages: &[FrontendMessage]) -> Reply {
        let mut out = BytesMut::new();
        messages.iter().for_each(|m| m.to_frame().encode(&mut out));
        self.stream.write_all(&out).unwrap();
        let readies = messages
            .iter()
            .filter(|m| matches!(m, FrontendMessage::Sync | FrontendMessage::Query(_)))
            .count();
        let mut reply = Reply::default();
        for _ in 0..readies {
            let one = self.until_ready();
            reply.columns.extend(one.columns);
            reply.rows.extend(one.rows);
            reply.errors.extend(one.errors);
        }
        reply
    }

    fn until_ready(&mut self) -> Reply {
        let mut reply = Reply::default();
        loop {
            let frame = match decode_frame(&mut self.buf, usize::MAX).unwrap() {
                Some(frame) => frame,
                None => {
                    let mut chunk = [0u8; 8192];
                    let n = self.stream.read(&mut chunk).unwrap_or_else(|e| {
                        panic!("no reply from the proxy ({e}); so far {reply:?}")
                    });
                    assert!(n > 0, "the proxy closed the connection: {reply:?}");
                    self.buf.extend_from_slice(&chunk[..n]);
                    continue;
                }
            };
            match frame.tag {
                b'T' => reply.columns.extend(row_description(&frame.body)),
                b'D' => reply.rows.push(data_row(&frame.body)),
                _ => match BackendMessage::parse(&frame).unwrap() {
                    BackendMessage::ErrorResponse(e) => reply
                        .errors
                        .push(e.get(b'M').unwrap_or_default().to_string()),
                    BackendMessage::ReadyForQuery(_) => return reply,
                    _ => {}
                },
            }
        }
    }
}

fn row_description(body: &[u8]) -> Vec<String> {
    let count = u16::from_be_bytes([body[0], body[1]]);
    let mut rest = &body[2..];
    (0..count)
        .map(|_| {
            let nul = rest.iter().position(|&b| b == 0).unwrap();
            let name = String::from_utf8_lossy(&rest[..nul]).into_owned();
            rest = &rest[nul + 1 + 18..]; // table oid, column, type oid, size, modifier, format
            name
        })
        .collect()
}

fn data_row(body: &[u8]) -> Vec<Option<String>> {
    let count = u16::from_be_bytes([body[0], body[1]]);
    let mut rest = &body[2..];
    (0..count)
        .map(|_| {
            let len = i32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
            rest = &rest[4..];
            (len >= 0).then(|| {
                let value = String::from_utf8_lossy(&rest[..len as usize]).into_owned();
                rest = &rest[len as usize..];
                value
            })
        })
        .collect()
}

pub(crate) fn parse_unnamed(query: &str) -> FrontendMessage {
    FrontendMessage::Parse {
        statement: String::new(),
        query: query.into(),
        param_types: vec![],
    }
}

/// Bind of the unnamed statement into the unnamed portal with one text parameter.
fn bind_unnamed(value: &str) -> FrontendMessage {
    let mut rest = BytesMut::new();
    rest.put_i16(0); // parameter formats: all text
    rest.put_i16(1);
    rest.put_i32(value.len() as i32);
    rest.put_slice(value.as_bytes());
    rest.put_i16(0); // result formats: all text
    FrontendMessage::Bind {
        portal: String::new(),
        statement: String::new(),
        rest: Bytes::from(rest),
    }
}

pub(crate) fn execute_unnamed(value: &str) -> Vec<FrontendMessage> {
    vec![
        bind_unnamed(value),
        FrontendMessage::Execute {
            portal: String::new(),
            max_rows: 0,
        },
        FrontendMessage::Sync,
    ]
}

fn route(wire: &mut Wire, to: &str) {
    let reply = wire.flight(&[FrontendMessage::Query(format!("SET lsngate.route = {to}"))]);
    assert!(reply.errors.is_empty(), "{reply:?}");
}

fn row(value: &str, on_replica: bool) -> Vec<Vec<Option<String>>> {
    let on_replica = if on_replica { "t" } else { "f" };
    vec![vec![Some(value.to_string()), Some(on_replica.to_string())]]
}

#[test]
fn the_unnamed_statement_follows_its_client_to_other_server_connections() {
    let cluster = shared_cluster();
    let mut file = file_config(cluster);
    // One server connection per node: the clients take turns on the same ones.
    file.pool_size = Some(1);
    let proxy = TestProxy::with(file);
    let mut a = Wire::connect(&proxy);
    let mut b = Wire::connect(&proxy);
    let statement = |who: &str| {
        format!("SELECT '{who}:' || $1::text AS from_{who}, pg_is_in_recovery() AS on_replica")
    };
    // A prepares the unnamed statement on the primary, then B replaces it on that one connection.
    for (wire, who) in [(&mut a, "a"), (&mut b, "b")] {
        route(wire, "primary");
        let reply = wire.flight(&[parse_unnamed(&statement(who)), FrontendMessage::Sync]);
        assert!(reply.errors.is_empty(), "{who}: {reply:?}");
    }
    // A's later flights describe and run A's statement, not B's.
    let reply = a.flight(&[
        FrontendMessage::Describe {
            kind: b'S',
            name: String::new(),
        },
        FrontendMessage::Sync,
    ]);
    assert!(reply.errors.is_empty(), "{reply:?}");
    assert_eq!(reply.columns, vec!["from_a", "on_replica"], "{reply:?}");
    let reply = a.flight(&execute_unnamed("1"));
    assert!(reply.errors.is_empty(), "{reply:?}");
    assert_eq!(reply.rows, row("a:1", false));
    // On a replica, which never saw A's Parse.
    route(&mut a, "replica");
    let reply = a.flight(&execute_unnamed("2"));
    assert!(reply.errors.is_empty(), "{reply:?}");
    assert_eq!(reply.rows, row("a:2", true));
    // B's statement is a read: it goes to a replica, where A's statement (or none) was.
    route(&mut b, "auto");
    for i in 3..6 {
        let reply = b.flight(&execute_unnamed(&i.to_string()));
        assert!(reply.errors.is_empty(), "{reply:?}");
        assert_eq!(reply.rows, row(&format!("b:{i}"), true));
    }
    // A simple query drops the unnamed statement on its server connection; A's is re-sent.
    route(&mut a, "primary");
    let reply = a.flight(&[FrontendMessage::Query("SELECT 1".into())]);
    assert!(reply.errors.is_empty(), "{reply:?}");
    let reply = a.flight(&execute_unnamed("6"));
    assert!(reply.errors.is_empty(), "{reply:?}");
    assert_eq!(reply.rows, row("a:6", false));
}

/// Flights a client sends before a write's replies are back (pipelining; tokio-postgres does it
/// when a failed statement's Close+Sync and the next query follow the error at once) all get
/// their replies. The write's ReadyForQuery waits for the commit position the proxy reads behind
/// it; the ReadyForQuery of the flights queued behind that position must not wait for another.
#[test]
fn flights_pipelined_behind_a_write_all_get_their_replies() {
    let cluster = shared_cluster();
    let table = unique("pipelined");
    cluster
        .primary()
        .sql(&format!("CREATE TABLE {table} (id int)"))
        .unwrap();
    // Consistency `session`, the default: a write's position is read in its flight.
    let proxy = TestProxy::start(cluster);
    let mut wire = Wire::connect(&proxy);
    for round in 1..=20 {
        let mut messages = vec![parse_unnamed(&format!(
            "INSERT INTO {table} VALUES ($1::int)"
        ))];
        messages.extend(execute_unnamed(&round.to_string()));
        messages.extend(
            [
                "BEGIN".to_string(),
                format!("SELECT count(*) FROM {table}"),
                "COMMIT".to_string(),
            ]
            .map(FrontendMessage::Query),
        );
        let reply = wire.flight(&messages);
        assert!(reply.errors.is_empty(), "round {round}: {reply:?}");
        assert_eq!(
            reply.rows,
            vec![vec![Some(round.to_string())]],
            "round {round}: the transaction sees every insert"
        );
    }
}
