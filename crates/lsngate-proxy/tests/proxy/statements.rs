//! The unnamed prepared statement at the protocol level, driven by a raw wire-protocol client
//! (drivers send Parse "" and Bind "" together, so none of them shows this): a Bind "" in a later
//! flight than its Parse "" must run the client's statement wherever that flight lands.

use std::io::{Read, Write};
use std::net::TcpStream;

use bytes::{BufMut, Bytes, BytesMut};
use lsngate_proxy::net::{BackendMessage, FrontendMessage, StartupFrame, decode_frame};

use crate::support::*;
use lsngate_cluster::shared_cluster;

/// What came back for one flight, up to its ReadyForQuery.
#[derive(Debug, Default)]
pub(crate) struct Reply {
    /// Column names of RowDescription messages.
    pub(crate) columns: Vec<String>,
    /// DataRow values as text (NULL as None).
    pub(crate) rows: Vec<Vec<Option<String>>>,
    /// ErrorResponse messages.
    pub(crate) errors: Vec<String>,
    /// Every message's tag, in order (ReadyForQuery included).
    pub(crate) tags: Vec<u8>,
    /// The transaction status of each ReadyForQuery (`I`, `T`, `E`).
    pub(crate) statuses: Vec<u8>,
    /// ParameterStatus messages, name and value, in order.
    pub(crate) parameters: Vec<(String, String)>,
}

/// A client speaking protocol 3 by hand over a blocking socket.
pub(crate) struct Wire {
    stream: TcpStream,
    buf: BytesMut,
}

impl Wire {
    /// Logs in as `postgres` (the test proxy trusts loopback clients in flags-only mode).
    pub(crate) fn connect(proxy: &TestProxy) -> Wire {
        Wire::connect_to(proxy.addr)
    }

    /// Logs in as `postgres` at `addr` (a proxy, or a server directly).
    pub(crate) fn connect_to(addr: std::net::SocketAddr) -> Wire {
        Wire::connect_to_with(addr, &[])
    }

    /// Logs in as `postgres` at `addr` with `settings` in the startup packet too
    /// (`application_name`, say).
    pub(crate) fn connect_to_with(addr: std::net::SocketAddr, settings: &[(&str, &str)]) -> Wire {
        let stream = TcpStream::connect(addr).unwrap();
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
            params: [("user", "postgres"), ("database", "postgres")]
                .iter()
                .chain(settings)
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
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
        self.replies(readies)
    }

    /// Sends `messages` in one write and reads the replies up to the `readies`-th
    /// ReadyForQuery (for flights whose Query the server skips after an error).
    pub(crate) fn flight_with(&mut self, messages: &[FrontendMessage], readies: usize) -> Reply {
        let mut out = BytesMut::new();
        messages.iter().for_each(|m| m.to_frame().encode(&mut out));
        self.stream.write_all(&out).unwrap();
        self.replies(readies)
    }

    fn replies(&mut self, readies: usize) -> Reply {
        let mut reply = Reply::default();
        for _ in 0..readies {
            let one = self.until_ready();
            reply.columns.extend(one.columns);
            reply.rows.extend(one.rows);
            reply.errors.extend(one.errors);
            reply.tags.extend(one.tags);
            reply.statuses.extend(one.statuses);
            reply.parameters.extend(one.parameters);
        }
        reply
    }

    /// Sends `messages` in one write without waiting for anything.
    pub(crate) fn send(&mut self, messages: &[FrontendMessage]) {
        let mut out = BytesMut::new();
        messages.iter().for_each(|m| m.to_frame().encode(&mut out));
        self.stream.write_all(&out).unwrap();
    }

    fn until_ready(&mut self) -> Reply {
        self.until(b'Z')
    }

    /// Reads replies up to the first message tagged `tag` (included).
    pub(crate) fn until(&mut self, tag: u8) -> Reply {
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
            reply.tags.push(frame.tag);
            match frame.tag {
                b'T' => reply.columns.extend(row_description(&frame.body)),
                b'D' => reply.rows.push(data_row(&frame.body)),
                b'Z' => reply.statuses.extend(frame.body.first()),
                b'S' => {
                    let mut parts = frame.body.split(|&b| b == 0).map(String::from_utf8_lossy);
                    let name = parts.next().unwrap_or_default().into_owned();
                    let value = parts.next().unwrap_or_default().into_owned();
                    reply.parameters.push((name, value));
                }
                _ => {
                    if let BackendMessage::ErrorResponse(e) = BackendMessage::parse(&frame).unwrap()
                    {
                        reply
                            .errors
                            .push(e.get(b'M').unwrap_or_default().to_string());
                    }
                }
            }
            if frame.tag == tag {
                return reply;
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

/// `sql` run without parameters over the extended protocol, with no Sync: Parse of the unnamed
/// statement, Bind into the unnamed portal, Execute of all rows.
pub(crate) fn run_unnamed(sql: &str) -> [FrontendMessage; 3] {
    [
        parse_unnamed(sql),
        FrontendMessage::Bind {
            portal: String::new(),
            statement: String::new(),
            rest: Bytes::from_static(&[0, 0, 0, 0, 0, 0]),
        },
        FrontendMessage::Execute {
            portal: String::new(),
            max_rows: 0,
        },
    ]
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

/// Sets the route hint with a named statement over the extended protocol: a simple Query would
/// drop the client's unnamed statement, as on PostgreSQL.
fn route(wire: &mut Wire, to: &str) {
    let reply = wire.flight(&[
        FrontendMessage::Close {
            kind: b'S',
            name: "route".into(),
        },
        FrontendMessage::Parse {
            statement: "route".into(),
            query: format!("SET lsngate.route = {to}"),
            param_types: vec![],
        },
        FrontendMessage::Bind {
            portal: String::new(),
            statement: "route".into(),
            rest: Bytes::from_static(&[0, 0, 0, 0, 0, 0]),
        },
        FrontendMessage::Execute {
            portal: String::new(),
            max_rows: 0,
        },
        FrontendMessage::Sync,
    ]);
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
    // A simple query drops the client's unnamed statement, as PostgreSQL does: wherever the
    // next Bind lands, it is gone (26000), even where a copy of it was parsed.
    route(&mut a, "primary");
    let reply = a.flight(&[FrontendMessage::Query("SELECT 1".into())]);
    assert!(reply.errors.is_empty(), "{reply:?}");
    let reply = a.flight(&execute_unnamed("6"));
    assert_eq!(
        reply.errors,
        vec!["unnamed prepared statement does not exist"],
        "{reply:?}"
    );
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

fn bind_no_parameters() -> FrontendMessage {
    FrontendMessage::Bind {
        portal: String::new(),
        statement: String::new(),
        rest: Bytes::from_static(&[0, 0, 0, 0, 0, 0]),
    }
}

fn execute() -> FrontendMessage {
    FrontendMessage::Execute {
        portal: String::new(),
        max_rows: 0,
    }
}

/// Issue #21: pgjdbc with `autosave` sends `Parse/Bind/Execute BEGIN`, a simple `Query
/// SAVEPOINT`, then the statement and Sync, in one write. The proxy ran the Query at once and
/// the unsynced BEGIN later (`25P01 SAVEPOINT can only be used in transaction blocks`, then
/// BEGIN): replies out of order, and pgjdbc paired them with the wrong statements.
#[test]
fn a_query_after_unsynced_extended_messages_is_answered_in_order() {
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    let mut wire = Wire::connect(&proxy);
    let autosave = [
        parse_unnamed("BEGIN"),
        bind_no_parameters(),
        execute(),
        FrontendMessage::Query("SAVEPOINT PGJDBC_AUTOSAVE".into()),
        parse_unnamed("SELECT 41 + 1"),
        bind_no_parameters(),
        execute(),
        FrontendMessage::Sync,
    ];
    let reply = wire.flight(&autosave);
    assert!(reply.errors.is_empty(), "{reply:?}");
    assert_eq!(reply.rows, vec![vec![Some("42".into())]]);
    // BEGIN's ParseComplete, BindComplete, CommandComplete; SAVEPOINT's CommandComplete and
    // ReadyForQuery; then the SELECT's, as PostgreSQL answers them.
    assert_eq!(reply.tags, b"12CCZ12DCZ".to_vec(), "{reply:?}");
    let reply = wire.flight(&[FrontendMessage::Query("COMMIT".into())]);
    assert!(reply.errors.is_empty(), "{reply:?}");

    // The proxy's own commands wait for the answers to what was sent before them.
    let reply = wire.flight(&[
        parse_unnamed("SELECT 7"),
        bind_no_parameters(),
        execute(),
        FrontendMessage::Query("SHOW lsngate.consistency".into()),
        FrontendMessage::Sync,
    ]);
    assert_eq!(
        reply.rows,
        vec![vec![Some("7".into())], vec![Some("session".into())]],
        "{reply:?}"
    );

    // A read waiting for its Sync and a write in the Query: both run where the write can.
    let t = unique("ordered");
    cluster
        .primary()
        .sql(&format!("CREATE TABLE {t} (id int)"))
        .unwrap();
    caught_up(cluster);
    let reply = wire.flight(&[
        parse_unnamed("SELECT 1"),
        bind_no_parameters(),
        execute(),
        FrontendMessage::Query(format!("INSERT INTO {t} VALUES (1)")),
        FrontendMessage::Sync,
    ]);
    assert!(reply.errors.is_empty(), "{reply:?}");

    // After an error the server skips to the Sync, the Query too: one ReadyForQuery in all.
    let reply = wire.flight_with(
        &[
            parse_unnamed("SELECT 1/0"),
            bind_no_parameters(),
            execute(),
            FrontendMessage::Query("SELECT 'skipped'".into()),
            FrontendMessage::Sync,
        ],
        1,
    );
    assert_eq!(reply.errors.len(), 1, "{reply:?}");
    assert!(reply.rows.is_empty(), "the Query was skipped: {reply:?}");
    let reply = wire.flight(&[FrontendMessage::Query("SELECT 'after'".into())]);
    assert_eq!(reply.rows, vec![vec![Some("after".into())]], "{reply:?}");
}

fn parse_named(name: &str, query: &str) -> FrontendMessage {
    FrontendMessage::Parse {
        statement: name.into(),
        query: query.into(),
        param_types: vec![],
    }
}

fn run_named(name: &str) -> Vec<FrontendMessage> {
    vec![
        FrontendMessage::Bind {
            portal: String::new(),
            statement: name.into(),
            rest: Bytes::from_static(&[0, 0, 0, 0, 0, 0]),
        },
        execute(),
        FrontendMessage::Sync,
    ]
}

/// Issue #21: pgx sends `DEALLOCATE lrupsc_N_M` as a simple query when its statement cache
/// evicts; forwarded, it landed on server connections that never prepared the statement
/// (`26000`). The same exchanges, straight to PostgreSQL and through the proxy, must answer alike.
#[test]
fn deallocate_keeps_the_clients_statements_and_the_servers_in_step() {
    let cluster = shared_cluster();
    let proxy = TestProxy::start(cluster);
    let direct: std::net::SocketAddr = format!("127.0.0.1:{}", cluster.primary().port())
        .parse()
        .unwrap();
    let query = |sql: &str| FrontendMessage::Query(sql.into());
    let exchanges: Vec<Vec<FrontendMessage>> = vec![
        vec![parse_named("lrupsc_1_0", "SELECT 1"), FrontendMessage::Sync],
        run_named("lrupsc_1_0"),
        vec![query("deallocate \"lrupsc_1_0\"")],
        // Gone for the client, wherever a copy of it was parsed.
        run_named("lrupsc_1_0"),
        vec![query("DEALLOCATE nosuch")],
        // The name is free again, for another statement.
        vec![parse_named("lrupsc_1_0", "SELECT 2"), FrontendMessage::Sync],
        run_named("lrupsc_1_0"),
        vec![query("BEGIN")],
        vec![query("DEALLOCATE PREPARE nosuch")],
        vec![query("SELECT 1")],
        vec![query("ROLLBACK")],
        vec![query("DEALLOCATE ALL")],
        run_named("lrupsc_1_0"),
    ];
    let answers = |mut wire: Wire| {
        exchanges
            .iter()
            .map(|flight| {
                let reply = wire.flight(flight);
                (reply.rows, reply.errors)
            })
            .collect::<Vec<_>>()
    };
    let expected = answers(Wire::connect_to(direct));
    assert_eq!(
        expected[3].1,
        vec!["prepared statement \"lrupsc_1_0\" does not exist"]
    );
    // Several clients through the proxy, so statements of one meet connections of others.
    for round in 0..3 {
        let seen = answers(Wire::connect(&proxy));
        for (i, (want, got)) in expected.iter().zip(&seen).enumerate() {
            assert_eq!(got, want, "round {round}, exchange {i}: {:?}", exchanges[i]);
        }
    }
    // A cache that keeps evicting: hundreds of statements prepared, run and deallocated.
    let mut wire = Wire::connect(&proxy);
    for i in 0..400 {
        let name = format!("lrupsc_2_{i}");
        let mut flight = vec![parse_named(&name, &format!("SELECT {i}"))];
        flight.extend(run_named(&name));
        let reply = wire.flight(&flight);
        assert_eq!(reply.rows, vec![vec![Some(i.to_string())]], "{reply:?}");
        let reply = wire.flight(&[query(&format!("deallocate \"{name}\""))]);
        assert!(reply.errors.is_empty(), "{reply:?}");
    }
}

/// Bind of named statement `s1` with parameter `1` and these result format codes.
fn bind_s1(formats: &[i16]) -> FrontendMessage {
    let mut rest = BytesMut::new();
    rest.put_i16(0);
    rest.put_i16(1);
    rest.put_i32(1);
    rest.put_slice(b"1");
    rest.put_i16(formats.len() as i16);
    formats.iter().for_each(|f| rest.put_i16(*f));
    FrontendMessage::Bind {
        portal: String::new(),
        statement: "s1".into(),
        rest: Bytes::from(rest),
    }
}

/// Found by the pgjdbc session: a statement the client described, parsed again by the proxy on
/// another server connection after its table gained a column, returned the new columns
/// (`08P01 bind message has 2 result formats but query has 3 columns`, or a column the client
/// was never told of). PostgreSQL answers `0A000 cached plan must not change result type`, which
/// drivers heal; so must the proxy, through a replica and the primary alike.
#[test]
fn a_statement_whose_table_changed_shape_fails_as_on_postgresql_wherever_it_runs() {
    let cluster = shared_cluster();
    let t = unique("plan");
    cluster
        .primary()
        .sql(&format!(
            "CREATE TABLE {t} (id int, a text); INSERT INTO {t} VALUES (1, 'one')"
        ))
        .unwrap();
    caught_up(cluster);
    let mut file = file_config(cluster);
    file.pool_size = Some(1);
    let proxy = TestProxy::with(file);
    let direct: std::net::SocketAddr = format!("127.0.0.1:{}", cluster.primary().port())
        .parse()
        .unwrap();
    let run = |formats: &[i16]| vec![bind_s1(formats), execute(), FrontendMessage::Sync];
    let prepare = vec![
        parse_named("s1", &format!("SELECT * FROM {t} WHERE id = $1")),
        FrontendMessage::Describe {
            kind: b'S',
            name: "s1".into(),
        },
        FrontendMessage::Sync,
    ];
    let mut direct = Wire::connect_to(direct);
    let mut through = Wire::connect(&proxy);
    // Prepared and described on a replica, run there.
    through.flight(&[FrontendMessage::Query("SET lsngate.route = replica".into())]);
    for wire in [&mut direct, &mut through] {
        let reply = wire.flight(&prepare);
        assert!(reply.errors.is_empty(), "{reply:?}");
        let reply = wire.flight(&run(&[0, 0]));
        assert_eq!(reply.rows, vec![vec![Some("1".into()), Some("one".into())]]);
    }
    cluster
        .primary()
        .sql(&format!("ALTER TABLE {t} ADD COLUMN b text DEFAULT 'new'"))
        .unwrap();
    caught_up(cluster);
    // Now on the primary, a connection the statement never was on.
    through.flight(&[FrontendMessage::Query("SET lsngate.route = primary".into())]);
    for formats in [&[0, 0][..], &[]] {
        let want = direct.flight(&run(formats));
        let got = through.flight(&run(formats));
        assert_eq!(
            want.errors,
            vec!["cached plan must not change result type"],
            "the control"
        );
        assert_eq!(
            (got.errors, got.rows, got.tags),
            (want.errors, want.rows, want.tags)
        );
    }
    // In a transaction the error aborts it, as on PostgreSQL; re-preparing heals.
    for wire in [&mut direct, &mut through] {
        wire.flight(&[FrontendMessage::Query("BEGIN".into())]);
        wire.flight(&run(&[]));
        let reply = wire.flight(&[FrontendMessage::Query("SELECT 1".into())]);
        assert_eq!(reply.errors.len(), 1, "aborted: {reply:?}");
        wire.flight(&[FrontendMessage::Query("ROLLBACK".into())]);
        let mut again = vec![FrontendMessage::Close {
            kind: b'S',
            name: "s1".into(),
        }];
        again.extend(prepare.clone());
        assert!(wire.flight(&again).errors.is_empty());
        let reply = wire.flight(&run(&[0, 0, 0]));
        assert_eq!(
            reply.rows,
            vec![vec![
                Some("1".into()),
                Some("one".into()),
                Some("new".into())
            ]],
            "{reply:?}"
        );
    }
}
