//! Messages a client sends after startup (simple query, extended protocol, COPY, auth
//! responses, Terminate), parsed far enough for routing and for renaming prepared statements;
//! bodies the proxy never inspects (Bind parameters, CopyData) stay as bytes.

use bytes::{BufMut, Bytes, BytesMut};

use super::{Fields, Frame, ProtocolError, put_cstr};

/// A client message after startup.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // variant fields are described by the variant docs
pub enum FrontendMessage {
    /// 'Q': one or more statements as text.
    Query(String),
    /// 'P': prepare `query` as `statement` ("" = unnamed).
    Parse {
        statement: String,
        query: String,
        param_types: Vec<u32>,
    },
    /// 'B': bind `statement` into `portal`; `rest` is the parameter formats, values and result
    /// formats, untouched.
    Bind {
        portal: String,
        statement: String,
        rest: Bytes,
    },
    /// 'D': describe a statement (`b'S'`) or portal (`b'P'`).
    Describe { kind: u8, name: String },
    /// 'E': run `portal`, at most `max_rows` rows (0 = all).
    Execute { portal: String, max_rows: i32 },
    /// 'C': close a statement (`b'S'`) or portal (`b'P'`).
    Close { kind: u8, name: String },
    /// 'S': end of an extended-protocol batch.
    Sync,
    /// 'H': send me what you have.
    Flush,
    /// 'X': the client is leaving.
    Terminate,
    /// 'd': a COPY FROM STDIN chunk.
    CopyData(Bytes),
    /// 'c': COPY FROM STDIN finished.
    CopyDone,
    /// 'f': COPY FROM STDIN aborted with a reason.
    CopyFail(String),
    /// 'p': password, SASLInitialResponse or SASLResponse; its shape depends on the auth state.
    AuthResponse(Bytes),
    /// 'F': legacy fast-path function call, forwarded untouched.
    FunctionCall(Bytes),
}

impl FrontendMessage {
    /// Whether the message ends a segment the server answers with a ReadyForQuery: a Sync, a
    /// simple Query or a FunctionCall.
    pub fn ends_segment(&self) -> bool {
        matches!(
            self,
            FrontendMessage::Sync | FrontendMessage::Query(_) | FrontendMessage::FunctionCall(_)
        )
    }

    /// Parses a frame from a client. Unknown tags are errors.
    pub fn parse(frame: &Frame) -> Result<FrontendMessage, ProtocolError> {
        let mut f = Fields::new(frame.tag, &frame.body);
        let msg = match frame.tag {
            b'Q' => FrontendMessage::Query(f.cstr()?.to_string()),
            b'P' => {
                let statement = f.cstr()?.to_string();
                let query = f.cstr()?.to_string();
                let n = f.i16()?;
                if n < 0 {
                    return Err(ProtocolError::Malformed {
                        tag: 'P',
                        why: "negative parameter count",
                    });
                }
                let param_types = (0..n)
                    .map(|_| f.i32().map(|t| t as u32))
                    .collect::<Result<_, _>>()?;
                FrontendMessage::Parse {
                    statement,
                    query,
                    param_types,
                }
            }
            b'B' => {
                let portal = f.cstr()?.to_string();
                let statement = f.cstr()?.to_string();
                let rest = frame.body.slice(frame.body.len() - f.rest().len()..);
                return Ok(FrontendMessage::Bind {
                    portal,
                    statement,
                    rest,
                });
            }
            b'D' | b'C' => {
                let kind = f.u8()?;
                if kind != b'S' && kind != b'P' {
                    return Err(ProtocolError::Malformed {
                        tag: frame.tag as char,
                        why: "kind must be 'S' or 'P'",
                    });
                }
                let name = f.cstr()?.to_string();
                if frame.tag == b'D' {
                    FrontendMessage::Describe { kind, name }
                } else {
                    FrontendMessage::Close { kind, name }
                }
            }
            b'E' => FrontendMessage::Execute {
                portal: f.cstr()?.to_string(),
                max_rows: f.i32()?,
            },
            b'S' => FrontendMessage::Sync,
            b'H' => FrontendMessage::Flush,
            b'X' => FrontendMessage::Terminate,
            b'd' => return Ok(FrontendMessage::CopyData(frame.body.clone())),
            b'c' => FrontendMessage::CopyDone,
            b'f' => FrontendMessage::CopyFail(f.cstr()?.to_string()),
            b'p' => return Ok(FrontendMessage::AuthResponse(frame.body.clone())),
            b'F' => return Ok(FrontendMessage::FunctionCall(frame.body.clone())),
            other => return Err(ProtocolError::UnknownTag(other)),
        };
        f.finish()?;
        Ok(msg)
    }

    /// The length of this message's body (without tag and length), as `to_frame` encodes it.
    fn body_len(&self) -> usize {
        match self {
            FrontendMessage::Query(text) | FrontendMessage::CopyFail(text) => text.len() + 1,
            FrontendMessage::Parse {
                statement,
                query,
                param_types,
            } => statement.len() + query.len() + 4 + 4 * param_types.len(),
            FrontendMessage::Bind {
                portal,
                statement,
                rest,
            } => portal.len() + statement.len() + 2 + rest.len(),
            FrontendMessage::Describe { name, .. } | FrontendMessage::Close { name, .. } => {
                name.len() + 2
            }
            FrontendMessage::Execute { portal, .. } => portal.len() + 5,
            FrontendMessage::CopyData(data)
            | FrontendMessage::AuthResponse(data)
            | FrontendMessage::FunctionCall(data) => data.len(),
            FrontendMessage::Sync
            | FrontendMessage::Flush
            | FrontendMessage::Terminate
            | FrontendMessage::CopyDone => 0,
        }
    }

    /// Appends this message's body (without tag and length) to `b`; returns its tag.
    fn put_body(&self, b: &mut BytesMut) -> u8 {
        match self {
            FrontendMessage::Query(q) => {
                put_cstr(b, q);
                b'Q'
            }
            FrontendMessage::Parse {
                statement,
                query,
                param_types,
            } => {
                put_cstr(b, statement);
                put_cstr(b, query);
                b.put_i16(param_types.len() as i16);
                param_types.iter().for_each(|t| b.put_u32(*t));
                b'P'
            }
            FrontendMessage::Bind {
                portal,
                statement,
                rest,
            } => {
                put_cstr(b, portal);
                put_cstr(b, statement);
                b.put_slice(rest);
                b'B'
            }
            FrontendMessage::Describe { kind, name } | FrontendMessage::Close { kind, name } => {
                b.put_u8(*kind);
                put_cstr(b, name);
                if matches!(self, FrontendMessage::Describe { .. }) {
                    b'D'
                } else {
                    b'C'
                }
            }
            FrontendMessage::Execute { portal, max_rows } => {
                put_cstr(b, portal);
                b.put_i32(*max_rows);
                b'E'
            }
            FrontendMessage::Sync => b'S',
            FrontendMessage::Flush => b'H',
            FrontendMessage::Terminate => b'X',
            FrontendMessage::CopyData(data) => {
                b.put_slice(data);
                b'd'
            }
            FrontendMessage::CopyDone => b'c',
            FrontendMessage::CopyFail(reason) => {
                put_cstr(b, reason);
                b'f'
            }
            FrontendMessage::AuthResponse(data) => {
                b.put_slice(data);
                b'p'
            }
            FrontendMessage::FunctionCall(data) => {
                b.put_slice(data);
                b'F'
            }
        }
    }

    /// The frame for this message.
    pub fn to_frame(&self) -> Frame {
        // Sized up front: grown field by field, a Parse or Bind body was reallocated three or
        // four times per forwarded message.
        let mut b = BytesMut::with_capacity(self.body_len());
        let tag = self.put_body(&mut b);
        Frame::new(tag, b.freeze())
    }

    /// Appends the wire form (tag, length, body) to `out`, as [`Frame::encode`] of
    /// [`FrontendMessage::to_frame`] would without the frame in between: a forwarded client
    /// message is written straight into the server connection's send buffer.
    pub fn encode(&self, out: &mut BytesMut) {
        let len = self.body_len();
        out.reserve(5 + len);
        let at = out.len();
        out.put_u8(0);
        out.put_u32((len + 4) as u32);
        let tag = self.put_body(out);
        out[at] = tag;
        debug_assert_eq!(out.len() - at, 5 + len, "body_len disagrees with put_body");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let messages = vec![
            FrontendMessage::Query("select 1; select 2".into()),
            FrontendMessage::Parse {
                statement: "s1".into(),
                query: "select $1".into(),
                param_types: vec![23],
            },
            FrontendMessage::Bind {
                portal: "".into(),
                statement: "s1".into(),
                rest: Bytes::from_static(b"\0\0\0\x01\0\0\0\x011\0\0"),
            },
            FrontendMessage::Describe {
                kind: b'S',
                name: "s1".into(),
            },
            FrontendMessage::Execute {
                portal: "".into(),
                max_rows: 0,
            },
            FrontendMessage::Close {
                kind: b'P',
                name: "p".into(),
            },
            FrontendMessage::Sync,
            FrontendMessage::Flush,
            FrontendMessage::Terminate,
            FrontendMessage::CopyData(Bytes::from_static(b"1\t2\n")),
            FrontendMessage::CopyDone,
            FrontendMessage::CopyFail("nope".into()),
            FrontendMessage::AuthResponse(Bytes::from_static(b"md5abc\0")),
            FrontendMessage::FunctionCall(Bytes::from_static(b"\0\0\0\x01\0\0\0\0\0\0")),
        ];
        for m in messages {
            let frame = m.to_frame();
            assert_eq!(frame.body.len(), m.body_len(), "{m:?}");
            let (mut direct, mut via_frame) = (BytesMut::new(), BytesMut::new());
            m.encode(&mut direct);
            frame.encode(&mut via_frame);
            assert_eq!(direct, via_frame, "{m:?}");
            assert_eq!(FrontendMessage::parse(&frame).unwrap(), m);
        }
    }

    #[test]
    fn malformed_bodies_are_errors() {
        assert!(FrontendMessage::parse(&Frame::new(b'Q', &b"no terminator"[..])).is_err());
        assert!(FrontendMessage::parse(&Frame::new(b'P', &b"s\0q\0\xff\xff"[..])).is_err());
        assert!(FrontendMessage::parse(&Frame::new(b'D', &b"Zs\0"[..])).is_err());
        assert!(FrontendMessage::parse(&Frame::new(b'S', &b"extra"[..])).is_err());
        assert!(matches!(
            FrontendMessage::parse(&Frame::new(b'~', &b""[..])),
            Err(ProtocolError::UnknownTag(b'~'))
        ));
    }
}
