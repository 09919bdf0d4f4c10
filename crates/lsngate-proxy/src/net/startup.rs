//! The untagged first message of a connection: StartupMessage, SSLRequest, GSSENCRequest or
//! CancelRequest. Decoding only; what to answer is the session's business.

use bytes::{Buf, BufMut, BytesMut};

use super::{Fields, ProtocolError, put_cstr};

const SSL_REQUEST: u32 = 80877103;
const GSSENC_REQUEST: u32 = 80877104;
const CANCEL_REQUEST: u32 = 80877102;
/// Startup packets are small; anything larger is garbage (PostgreSQL uses 10000 too).
pub const MAX_STARTUP_LEN: usize = 10_000;

/// The first message a client sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartupFrame {
    /// A StartupMessage: protocol minor version and the key/value parameters in order.
    Startup {
        /// Protocol minor version requested (0 for 3.0, 2 for 3.2).
        minor: u16,
        /// Parameters such as `user`, `database`, `application_name`, `options`.
        params: Vec<(String, String)>,
    },
    /// The client asks for TLS before the startup message.
    SslRequest,
    /// The client asks for GSSAPI encryption (always declined).
    GssEncRequest,
    /// Cancel the query running for the session identified by this key.
    Cancel {
        /// Process id the server announced in BackendKeyData.
        pid: i32,
        /// Secret key bytes (4 bytes in protocol 3.0).
        secret: Vec<u8>,
    },
}

impl StartupFrame {
    /// The value of a startup parameter, if the client sent it.
    pub fn param(params: &[(String, String)], name: &str) -> Option<String> {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }

    /// The wire form, for sending a startup or cancel to a backend.
    pub fn encode(&self, out: &mut BytesMut) {
        let mut body = BytesMut::new();
        match self {
            StartupFrame::Startup { minor, params } => {
                body.put_u16(3);
                body.put_u16(*minor);
                for (k, v) in params {
                    put_cstr(&mut body, k);
                    put_cstr(&mut body, v);
                }
                body.put_u8(0);
            }
            StartupFrame::SslRequest => body.put_u32(SSL_REQUEST),
            StartupFrame::GssEncRequest => body.put_u32(GSSENC_REQUEST),
            StartupFrame::Cancel { pid, secret } => {
                body.put_u32(CANCEL_REQUEST);
                body.put_i32(*pid);
                body.put_slice(secret);
            }
        }
        out.put_u32(body.len() as u32 + 4);
        out.put_slice(&body);
    }
}

/// Takes the first message off `buf` when complete.
pub fn decode_startup(
    buf: &mut BytesMut,
    max_len: usize,
) -> Result<Option<StartupFrame>, ProtocolError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if len < 8 {
        return Err(ProtocolError::LengthTooSmall { tag: '0', len });
    }
    let len = len as usize;
    let limit = max_len.min(MAX_STARTUP_LEN);
    if len > limit {
        return Err(ProtocolError::TooLarge {
            tag: '0',
            len,
            limit,
        });
    }
    if buf.len() < len {
        return Ok(None);
    }
    let packet = buf.split_to(len);
    let mut fields = Fields::new(b'0', &packet[4..]);
    let code = fields.i32()? as u32;
    let frame = match code {
        SSL_REQUEST => StartupFrame::SslRequest,
        GSSENC_REQUEST => StartupFrame::GssEncRequest,
        CANCEL_REQUEST => {
            let pid = fields.i32()?;
            let secret = fields.rest().to_vec();
            if secret.is_empty() || secret.len() > 256 {
                return Err(ProtocolError::Malformed {
                    tag: '0',
                    why: "cancel key must be 1..256 bytes",
                });
            }
            StartupFrame::Cancel { pid, secret }
        }
        _ => decode_params(code, &mut fields)?,
    };
    let _ = packet.remaining();
    Ok(Some(frame))
}

fn decode_params(code: u32, fields: &mut Fields<'_>) -> Result<StartupFrame, ProtocolError> {
    let (major, minor) = ((code >> 16) as u16, code as u16);
    if major != 3 {
        return Err(ProtocolError::UnsupportedVersion { major, minor });
    }
    let mut params = Vec::new();
    loop {
        let key = fields.cstr()?;
        if key.is_empty() {
            break;
        }
        let value = fields.cstr()?;
        params.push((key.to_string(), value.to_string()));
    }
    fields.finish()?;
    Ok(StartupFrame::Startup { minor, params })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(frame: StartupFrame) {
        let mut buf = BytesMut::new();
        frame.encode(&mut buf);
        assert_eq!(decode_startup(&mut buf, 1 << 20).unwrap(), Some(frame));
        assert!(buf.is_empty());
    }

    #[test]
    fn every_startup_kind_round_trips() {
        round_trip(StartupFrame::SslRequest);
        round_trip(StartupFrame::GssEncRequest);
        round_trip(StartupFrame::Cancel {
            pid: 42,
            secret: vec![1, 2, 3, 4],
        });
        round_trip(StartupFrame::Startup {
            minor: 0,
            params: vec![
                ("user".into(), "app".into()),
                ("database".into(), "db".into()),
            ],
        });
    }

    #[test]
    fn garbage_is_rejected() {
        let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\n\r\n"[..]);
        assert!(decode_startup(&mut buf, 1 << 20).is_err());
        let mut buf = BytesMut::from(&b"\x00\x00\x00\x08\x00\x02\x00\x00"[..]);
        assert!(matches!(
            decode_startup(&mut buf, 1 << 20),
            Err(ProtocolError::UnsupportedVersion { .. })
        ));
        let mut buf = BytesMut::from(&b"\x00\x00\x00\x0c\x00\x03\x00\x00user"[..]);
        assert!(decode_startup(&mut buf, 1 << 20).is_err());
    }
}
