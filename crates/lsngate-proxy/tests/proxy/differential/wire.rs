//! The differential checker's raw protocol-3 client: no driver, because drivers hide the reply
//! stream (they wait for replies, retry, drop what they do not expect). It logs in with trust,
//! writes the bytes it is given, and turns every server message into a [`Reply`]: the part that
//! must be equal on both sides (`key`) and what only helps a reader (`note`, e.g. an error's
//! message text). Every read is bounded; a silent server is reported, never waited out.
//!
//! Normalized away: BackendKeyData, ParameterStatus values and the proxy's own `lsngate.*`
//! ParameterStatus, a ParameterStatus that repeats the value the client already has (PostgreSQL
//! reports only changes), the proxy's documented stale-read NOTICE, table OIDs in RowDescription
//! (each side has its own table), error texts (SQLSTATE and severity are compared).

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use lsngate_proxy::net::{ErrorFields, Frame, StartupFrame, decode_frame};

use super::case::MARKER;

/// How long any one wait for replies may take before it is reported as a hang.
pub const REPLY_BOUND: Duration = Duration::from_secs(20);

/// One server message, normalized.
#[derive(Debug, Clone)]
pub struct Reply {
    /// What must be the same on both sides.
    pub key: String,
    /// What is shown but not compared.
    pub note: String,
}

impl std::fmt::Display for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.note.is_empty() {
            write!(f, "{}", self.key)
        } else {
            write!(f, "{} ({})", self.key, self.note)
        }
    }
}

/// A logged-in client connection and the replies it has read so far.
pub struct Conn {
    stream: TcpStream,
    buf: BytesMut,
    /// Every reply since the login's ReadyForQuery.
    pub replies: Vec<Reply>,
    /// ReadyForQuery messages among them.
    pub readies: usize,
    /// The reply index of the end marker's row, once it arrived.
    marker_row: Option<usize>,
    parameters: HashMap<String, String>,
}

impl Conn {
    /// Connects and logs in as `postgres` to database `postgres` (trust: lsngate-cluster's servers
    /// and the test proxy trust loopback clients).
    pub fn connect(addr: SocketAddr) -> Result<Conn, String> {
        let stream =
            TcpStream::connect(addr).map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let mut conn = Conn {
            stream,
            buf: BytesMut::with_capacity(16 * 1024),
            replies: Vec::new(),
            readies: 0,
            marker_row: None,
            parameters: HashMap::new(),
        };
        let mut startup = BytesMut::new();
        StartupFrame::Startup {
            minor: 0,
            params: vec![
                ("user".into(), "postgres".into()),
                ("database".into(), "postgres".into()),
                ("application_name".into(), "lsngate-diff".into()),
            ],
        }
        .encode(&mut startup);
        conn.send(&startup)?;
        let deadline = Instant::now() + REPLY_BOUND;
        loop {
            let Some(frame) = conn.next_frame(deadline)? else {
                return Err(format!("no login reply from {addr} within {REPLY_BOUND:?}"));
            };
            match frame.tag {
                b'R' if frame.body[..4] == [0, 0, 0, 0] => {}
                b'R' => {
                    return Err(format!(
                        "{addr} asked for authentication method {:?}; the checker logs in with trust only (loopback clients of the lsngate-cluster cluster and the test proxy)",
                        &frame.body[..4]
                    ));
                }
                b'S' => {
                    let (name, value) = parameter_status(&frame.body);
                    conn.parameters.insert(name, value);
                }
                b'K' => {}
                b'E' => return Err(format!("login to {addr} refused: {}", error_text(&frame))),
                b'Z' => return Ok(conn),
                other => {
                    return Err(format!(
                        "unexpected message '{}' from {addr} during login",
                        other as char
                    ));
                }
            }
        }
    }

    pub fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.stream
            .write_all(bytes)
            .map_err(|e| format!("write failed: {e}"))
    }

    /// Reads until `done` holds; false when `deadline` passed first.
    pub fn read_until(
        &mut self,
        deadline: Instant,
        mut done: impl FnMut(&Conn) -> bool,
    ) -> Result<bool, String> {
        while !done(self) {
            let Some(frame) = self.next_frame(deadline)? else {
                return Ok(false);
            };
            self.take(&frame)?;
        }
        Ok(true)
    }

    /// Reads until nothing arrived for `quiet` (or `done` holds, or `deadline` passed): what the
    /// server sends for a Flush, whose end no message marks.
    pub fn read_until_quiet(
        &mut self,
        quiet: Duration,
        deadline: Instant,
        mut done: impl FnMut(&Conn) -> bool,
    ) -> Result<(), String> {
        while !done(self) {
            let until = (Instant::now() + quiet).min(deadline);
            match self.next_frame(until)? {
                Some(frame) => self.take(&frame)?,
                None => return Ok(()),
            }
        }
        Ok(())
    }

    /// The end marker's row and the ReadyForQuery after it have arrived.
    pub fn marker_done(&self) -> bool {
        self.marker_row.is_some_and(|row| {
            self.replies[row..]
                .iter()
                .any(|r| r.key.starts_with("ReadyForQuery"))
        })
    }

    pub fn close(mut self) {
        let _ = self.stream.write_all(b"X\0\0\0\x04");
    }

    /// The next whole message, reading as needed; None at `deadline`.
    fn next_frame(&mut self, deadline: Instant) -> Result<Option<Frame>, String> {
        loop {
            if let Some(frame) =
                decode_frame(&mut self.buf, usize::MAX).map_err(|e| e.to_string())?
            {
                return Ok(Some(frame));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            self.stream
                .set_read_timeout(Some((deadline - now).max(Duration::from_millis(1))))
                .map_err(|e| e.to_string())?;
            let mut chunk = [0u8; 16 * 1024];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err("the server closed the connection".into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("read failed: {e}")),
            }
        }
    }

    fn take(&mut self, frame: &Frame) -> Result<(), String> {
        let Some(reply) = self.normalize(frame)? else {
            return Ok(());
        };
        if reply.key.starts_with("ReadyForQuery") {
            self.readies += 1;
        }
        if self.marker_row.is_none() && reply.key == format!("DataRow [{MARKER:?}]") {
            self.marker_row = Some(self.replies.len());
        }
        self.replies.push(reply);
        Ok(())
    }

    fn normalize(&mut self, frame: &Frame) -> Result<Option<Reply>, String> {
        let body = &frame.body[..];
        let plain = |key: &str| {
            Ok(Some(Reply {
                key: key.to_string(),
                note: String::new(),
            }))
        };
        match frame.tag {
            b'1' => plain("ParseComplete"),
            b'2' => plain("BindComplete"),
            b'3' => plain("CloseComplete"),
            b'n' => plain("NoData"),
            b's' => plain("PortalSuspended"),
            b'I' => plain("EmptyQueryResponse"),
            b'c' => plain("CopyDone"),
            b'K' => Ok(None),
            b'Z' => plain(&format!(
                "ReadyForQuery {}",
                body.first().map_or('?', |&b| b as char)
            )),
            b'C' => plain(&format!("CommandComplete {:?}", cstr(body).0)),
            b'T' => plain(&format!("RowDescription [{}]", row_description(body)?)),
            b'D' => plain(&format!("DataRow [{}]", data_row(body)?)),
            b't' => plain(&format!(
                "ParameterDescription {:?}",
                parameter_types(body)?
            )),
            b'd' => plain(&format!("CopyData {}", value(body))),
            b'G' | b'H' | b'W' => {
                let name = match frame.tag {
                    b'G' => "CopyInResponse",
                    b'H' => "CopyOutResponse",
                    _ => "CopyBothResponse",
                };
                plain(&format!("{name} {:?}", body))
            }
            b'E' | b'N' => {
                let fields = ErrorFields::parse(frame.tag, body).map_err(|e| e.to_string())?;
                let message = fields.get(b'M').unwrap_or_default().to_string();
                if frame.tag == b'N' && message.starts_with("lsngate: served by replica") {
                    return Ok(None); // the proxy's documented notice of a stale read
                }
                let severity = fields.get(b'V').or(fields.get(b'S')).unwrap_or("?");
                let kind = if frame.tag == b'E' {
                    "ErrorResponse"
                } else {
                    "NoticeResponse"
                };
                Ok(Some(Reply {
                    key: format!("{kind} {severity} {}", fields.sqlstate().unwrap_or("?")),
                    note: message,
                }))
            }
            b'S' => {
                let (name, value) = parameter_status(body);
                if name.starts_with("lsngate.") || self.parameters.get(&name) == Some(&value) {
                    return Ok(None);
                }
                self.parameters.insert(name.clone(), value.clone());
                Ok(Some(Reply {
                    key: format!("ParameterStatus {name}"),
                    note: value,
                }))
            }
            b'A' => {
                let (channel, rest) = cstr(&body[4.min(body.len())..]);
                plain(&format!(
                    "NotificationResponse {channel:?} {:?}",
                    cstr(rest).0
                ))
            }
            other => Ok(Some(Reply {
                key: format!("message '{}'", other as char),
                note: format!("{} bytes", body.len()),
            })),
        }
    }
}

fn cstr(bytes: &[u8]) -> (String, &[u8]) {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let text = String::from_utf8_lossy(&bytes[..end]).into_owned();
    (text, &bytes[(end + 1).min(bytes.len())..])
}

fn parameter_status(body: &[u8]) -> (String, String) {
    let (name, rest) = cstr(body);
    (name, cstr(rest).0)
}

fn error_text(frame: &Frame) -> String {
    ErrorFields::parse(frame.tag, &frame.body)
        .map(|f| {
            format!(
                "{} {}",
                f.sqlstate().unwrap_or("?"),
                f.get(b'M').unwrap_or_default()
            )
        })
        .unwrap_or_else(|e| e.to_string())
}

/// A column value: text as a quoted string, bytes that are not UTF-8 (binary results) in hex.
fn value(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => format!("{text:?}"),
        Err(_) => bytes.iter().map(|b| format!("{b:02x}")).collect::<String>() + "h",
    }
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("truncated server message".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn i16(&mut self) -> Result<i16, String> {
        Ok(i16::from_be_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn i32(&mut self) -> Result<i32, String> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn cstr(&mut self) -> Result<String, String> {
        let (text, rest) = cstr(self.0);
        self.0 = rest;
        Ok(text)
    }
}

/// Columns as `name type/len/mod fmt`, with `tbl#N` for a table column (N its attribute number;
/// the table's OID differs between the two sides' tables and is left out).
fn row_description(body: &[u8]) -> Result<String, String> {
    let mut c = Cursor(body);
    let count = c.i16()?;
    let mut columns = Vec::new();
    for _ in 0..count {
        let name = c.cstr()?;
        let table = c.i32()?;
        let attnum = c.i16()?;
        let type_oid = c.i32()?;
        let len = c.i16()?;
        let typmod = c.i32()?;
        let format = c.i16()?;
        let origin = if table != 0 {
            format!(" tbl#{attnum}")
        } else {
            String::new()
        };
        columns.push(format!(
            "{name} {type_oid}/{len}/{typmod} f{format}{origin}"
        ));
    }
    Ok(columns.join(", "))
}

fn data_row(body: &[u8]) -> Result<String, String> {
    let mut c = Cursor(body);
    let count = c.i16()?;
    let mut values = Vec::new();
    for _ in 0..count {
        let len = c.i32()?;
        values.push(if len < 0 {
            "NULL".to_string()
        } else {
            value(c.take(len as usize)?)
        });
    }
    Ok(values.join(", "))
}

fn parameter_types(body: &[u8]) -> Result<Vec<i32>, String> {
    let mut c = Cursor(body);
    let count = c.i16()?;
    (0..count).map(|_| c.i32()).collect()
}
