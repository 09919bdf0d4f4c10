//! Messages a server sends, parsed only as far as the proxy needs (authentication requests,
//! ParameterStatus, BackendKeyData, ReadyForQuery status, error SQLSTATEs, COPY mode changes);
//! row data passes through as the frame it arrived in. Also builds the server messages the
//! proxy answers clients with itself.

use bytes::{BufMut, Bytes, BytesMut};

use super::{ErrorFields, Fields, Frame, ProtocolError, put_cstr};

/// The transaction status a ReadyForQuery reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxStatus {
    /// `I`: not in a transaction block.
    Idle,
    /// `T`: in a transaction block.
    InBlock,
    /// `E`: in a failed transaction block (statements are refused until its end).
    Failed,
}

impl TxStatus {
    /// The status a ReadyForQuery's byte reports; `None` for a byte PostgreSQL never sends.
    pub fn from_byte(byte: u8) -> Option<TxStatus> {
        match byte {
            b'I' => Some(TxStatus::Idle),
            b'T' => Some(TxStatus::InBlock),
            b'E' => Some(TxStatus::Failed),
            _ => None,
        }
    }

    /// The byte a ReadyForQuery carries for it.
    pub fn byte(self) -> u8 {
        match self {
            TxStatus::Idle => b'I',
            TxStatus::InBlock => b'T',
            TxStatus::Failed => b'E',
        }
    }
}

/// A server message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // variant fields are described by the variant docs
pub enum BackendMessage {
    /// 'R': authentication request or result; `code` 0 = ok, 3 = cleartext, 5 = md5 (data = salt),
    /// 10 = SASL (mechanisms), 11 = SASL continue, 12 = SASL final.
    Authentication { code: i32, data: Bytes },
    /// 'S': a run-time parameter changed (or was reported at startup).
    ParameterStatus { name: String, value: String },
    /// 'K': the key a CancelRequest must present.
    BackendKeyData { pid: i32, secret: Bytes },
    /// 'Z': ready for the next query, in this transaction status.
    ReadyForQuery(TxStatus),
    /// 'E'.
    ErrorResponse(ErrorFields),
    /// 'N'.
    NoticeResponse(ErrorFields),
    /// 'G': COPY FROM STDIN starts; the client now sends CopyData.
    CopyInResponse,
    /// 'W': COPY BOTH (replication); treated like COPY IN by the proxy.
    CopyBothResponse,
    /// 'v': the server downgrades the protocol version.
    NegotiateProtocolVersion,
    /// Any other valid server message (rows, completions, descriptions, notifications, ...).
    Other(u8),
}

const PASSTHROUGH_TAGS: &[u8] = b"TDC123nsItHdcAV";

impl BackendMessage {
    /// Parses a frame from a server. Unknown tags are errors.
    pub fn parse(frame: &Frame) -> Result<BackendMessage, ProtocolError> {
        let mut f = Fields::new(frame.tag, &frame.body);
        let msg = match frame.tag {
            b'R' => {
                let code = f.i32()?;
                return Ok(BackendMessage::Authentication {
                    code,
                    data: frame.body.slice(4..),
                });
            }
            b'S' => BackendMessage::ParameterStatus {
                name: f.cstr()?.to_string(),
                value: f.cstr()?.to_string(),
            },
            b'K' => {
                let pid = f.i32()?;
                return Ok(BackendMessage::BackendKeyData {
                    pid,
                    secret: frame.body.slice(4..),
                });
            }
            b'Z' => BackendMessage::ReadyForQuery(TxStatus::from_byte(f.u8()?).ok_or(
                ProtocolError::Malformed {
                    tag: 'Z',
                    why: "transaction status is not I, T or E",
                },
            )?),
            b'E' => {
                return Ok(BackendMessage::ErrorResponse(ErrorFields::parse(
                    b'E',
                    &frame.body,
                )?));
            }
            b'N' => {
                return Ok(BackendMessage::NoticeResponse(ErrorFields::parse(
                    b'N',
                    &frame.body,
                )?));
            }
            b'G' => return Ok(BackendMessage::CopyInResponse),
            b'W' => return Ok(BackendMessage::CopyBothResponse),
            b'v' => return Ok(BackendMessage::NegotiateProtocolVersion),
            tag if PASSTHROUGH_TAGS.contains(&tag) => return Ok(BackendMessage::Other(tag)),
            other => return Err(ProtocolError::UnknownTag(other)),
        };
        f.finish()?;
        Ok(msg)
    }
}

/// Frames the proxy sends to clients on its own behalf.
pub mod build {
    use super::*;

    fn auth(code: i32, data: &[u8]) -> Frame {
        let mut b = BytesMut::new();
        b.put_i32(code);
        b.put_slice(data);
        Frame::new(b'R', b.freeze())
    }

    /// AuthenticationOk.
    pub fn auth_ok() -> Frame {
        auth(0, &[])
    }
    /// AuthenticationCleartextPassword.
    pub fn auth_cleartext() -> Frame {
        auth(3, &[])
    }
    /// AuthenticationMD5Password with its salt.
    pub fn auth_md5(salt: [u8; 4]) -> Frame {
        auth(5, &salt)
    }
    /// AuthenticationSASL offering SCRAM-SHA-256.
    pub fn auth_sasl() -> Frame {
        auth(10, b"SCRAM-SHA-256\0\0")
    }
    /// AuthenticationSASLContinue.
    pub fn auth_sasl_continue(data: &[u8]) -> Frame {
        auth(11, data)
    }
    /// AuthenticationSASLFinal.
    pub fn auth_sasl_final(data: &[u8]) -> Frame {
        auth(12, data)
    }
    /// ParameterStatus.
    pub fn parameter_status(name: &str, value: &str) -> Frame {
        let mut b = BytesMut::new();
        put_cstr(&mut b, name);
        put_cstr(&mut b, value);
        Frame::new(b'S', b.freeze())
    }
    /// BackendKeyData.
    pub fn backend_key_data(pid: i32, secret: i32) -> Frame {
        let mut b = BytesMut::new();
        b.put_i32(pid);
        b.put_i32(secret);
        Frame::new(b'K', b.freeze())
    }
    /// ReadyForQuery.
    pub fn ready_for_query(status: TxStatus) -> Frame {
        // Static bodies: one of these goes to a client at the end of every transaction.
        let body = match status {
            TxStatus::Idle => Bytes::from_static(b"I"),
            TxStatus::InBlock => Bytes::from_static(b"T"),
            TxStatus::Failed => Bytes::from_static(b"E"),
        };
        Frame::new(b'Z', body)
    }
    /// A FATAL ErrorResponse: the proxy ends the client's connection after sending it.
    pub fn fatal(code: &str, message: &str) -> Frame {
        ErrorFields::new("FATAL", code, message).to_frame(b'E')
    }
    /// CommandComplete.
    pub fn command_complete(tag: &str) -> Frame {
        let mut b = BytesMut::new();
        put_cstr(&mut b, tag);
        Frame::new(b'C', b.freeze())
    }
    /// NegotiateProtocolVersion: we speak 3.0 and none of the `_pq_` options.
    pub fn negotiate_protocol_version(unsupported: &[String]) -> Frame {
        let mut b = BytesMut::new();
        b.put_i32(0);
        b.put_i32(unsupported.len() as i32);
        unsupported.iter().for_each(|o| put_cstr(&mut b, o));
        Frame::new(b'v', b.freeze())
    }
    /// RowDescription for one text column, then DataRow frames, for SHOW answered locally.
    pub fn single_text_row(column: &str, value: &str) -> Vec<Frame> {
        vec![
            row_description(&[(column, TEXT_OID)]),
            text_data_row(&[Some(value)]),
        ]
    }

    /// The type OID of `text`.
    pub const TEXT_OID: u32 = 25;
    /// The type OID of `int8`.
    pub const INT8_OID: u32 = 20;

    /// RowDescription of columns (name, type OID), every value in text format.
    pub fn row_description(columns: &[(&str, u32)]) -> Frame {
        let mut d = BytesMut::new();
        d.put_i16(columns.len() as i16);
        for (name, oid) in columns {
            put_cstr(&mut d, name);
            d.put_i32(0);
            d.put_i16(0);
            d.put_u32(*oid);
            d.put_i16(if *oid == INT8_OID { 8 } else { -1 });
            d.put_i32(-1);
            d.put_i16(0);
        }
        Frame::new(b'T', d.freeze())
    }

    /// DataRow of text values (`None` is NULL).
    pub fn text_data_row(values: &[Option<&str>]) -> Frame {
        let mut r = BytesMut::new();
        r.put_i16(values.len() as i16);
        for value in values {
            match value {
                Some(v) => {
                    r.put_i32(v.len() as i32);
                    r.put_slice(v.as_bytes());
                }
                None => r.put_i32(-1),
            }
        }
        Frame::new(b'D', r.freeze())
    }

    /// EmptyQueryResponse.
    pub fn empty_query() -> Frame {
        Frame::new(b'I', Bytes::new())
    }
}

/// A decoded row as the text columns `lsngate_core::probe` reads.
pub fn columns(row: &[Option<String>]) -> Vec<Option<&str>> {
    row.iter().map(Option::as_deref).collect()
}

/// The values of a DataRow body as text (`None` for NULL); `None` when malformed.
pub fn data_row(body: &[u8]) -> Option<Vec<Option<String>>> {
    let count = i16::from_be_bytes(body.get(..2)?.try_into().ok()?);
    let mut at = 2;
    let mut values = Vec::with_capacity(count.max(0) as usize);
    for _ in 0..count {
        let len = i32::from_be_bytes(body.get(at..at + 4)?.try_into().ok()?);
        at += 4;
        if len < 0 {
            values.push(None);
        } else {
            let end = at + len as usize;
            values.push(Some(
                String::from_utf8_lossy(body.get(at..end)?).into_owned(),
            ));
            at = end;
        }
    }
    Some(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_for_query_reads_its_status_and_refuses_a_byte_postgresql_never_sends() {
        for status in [TxStatus::Idle, TxStatus::InBlock, TxStatus::Failed] {
            let frame = build::ready_for_query(status);
            assert_eq!(frame.body.as_ref(), [status.byte()]);
            assert_eq!(
                BackendMessage::parse(&frame).unwrap(),
                BackendMessage::ReadyForQuery(status)
            );
        }
        let odd = Frame::new(b'Z', Bytes::from_static(b"X"));
        assert!(matches!(
            BackendMessage::parse(&odd),
            Err(ProtocolError::Malformed { tag: 'Z', .. })
        ));
    }

    #[test]
    fn parses_what_the_proxy_builds() {
        assert_eq!(
            BackendMessage::parse(&build::ready_for_query(TxStatus::InBlock)).unwrap(),
            BackendMessage::ReadyForQuery(TxStatus::InBlock)
        );
        assert_eq!(
            BackendMessage::parse(&build::parameter_status("TimeZone", "UTC")).unwrap(),
            BackendMessage::ParameterStatus {
                name: "TimeZone".into(),
                value: "UTC".into()
            }
        );
        match BackendMessage::parse(&build::auth_md5([1, 2, 3, 4])).unwrap() {
            BackendMessage::Authentication { code: 5, data } => {
                assert_eq!(&data[..], &[1, 2, 3, 4])
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            BackendMessage::parse(&build::backend_key_data(7, 9)).unwrap(),
            BackendMessage::BackendKeyData { pid: 7, .. }
        ));
        assert_eq!(
            BackendMessage::parse(&build::command_complete("SET")).unwrap(),
            BackendMessage::Other(b'C')
        );
        assert!(BackendMessage::parse(&Frame::new(b'?', Bytes::new())).is_err());
        assert!(BackendMessage::parse(&Frame::new(b'Z', Bytes::new())).is_err());
    }

    #[test]
    fn data_rows_decode_and_garbage_does_not_panic() {
        let mut body = vec![0, 2, 0, 0, 0, 4];
        body.extend_from_slice(b"true");
        body.extend_from_slice(&[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(data_row(&body), Some(vec![Some("true".into()), None]));
        assert_eq!(data_row(&[0, 1, 0, 0, 0, 9, b'x']), None);
        assert_eq!(data_row(&[]), None);
    }
}
