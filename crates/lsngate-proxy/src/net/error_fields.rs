//! ErrorResponse and NoticeResponse bodies: a list of (field code, text) pairs. The proxy reads
//! SQLSTATE from backend errors (25006 means "re-run on the primary") and builds its own errors
//! with the same shape.

use bytes::{BufMut, BytesMut};

use super::{Fields, Frame, ProtocolError, put_cstr};

/// The fields of an ErrorResponse or NoticeResponse.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ErrorFields {
    /// (code, value) pairs in wire order; `S` severity, `C` SQLSTATE, `M` message, ...
    pub fields: Vec<(u8, String)>,
}

impl ErrorFields {
    /// An error built by the proxy itself.
    pub fn new(severity: &str, code: &str, message: impl Into<String>) -> ErrorFields {
        ErrorFields {
            fields: vec![
                (b'S', severity.into()),
                (b'V', severity.into()),
                (b'C', code.into()),
                (b'M', message.into()),
            ],
        }
    }

    /// Parses the body of an 'E' or 'N' message.
    pub fn parse(tag: u8, body: &[u8]) -> Result<ErrorFields, ProtocolError> {
        let mut f = Fields::new(tag, body);
        let mut fields = Vec::new();
        loop {
            let code = f.u8()?;
            if code == 0 {
                break;
            }
            fields.push((code, f.cstr()?.to_string()));
        }
        f.finish()?;
        Ok(ErrorFields { fields })
    }

    /// The value of one field.
    pub fn get(&self, code: u8) -> Option<&str> {
        self.fields
            .iter()
            .find(|(c, _)| *c == code)
            .map(|(_, v)| v.as_str())
    }

    /// The SQLSTATE, e.g. `25006`.
    pub fn sqlstate(&self) -> Option<&str> {
        self.get(b'C')
    }

    /// As an ErrorResponse (`b'E'`) or NoticeResponse (`b'N'`) frame.
    pub fn to_frame(&self, tag: u8) -> Frame {
        let mut b = BytesMut::new();
        for (code, value) in &self.fields {
            b.put_u8(*code);
            put_cstr(&mut b, value);
        }
        b.put_u8(0);
        Frame::new(tag, b.freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_reads_sqlstate() {
        let e = ErrorFields::new(
            "ERROR",
            "25006",
            "cannot execute INSERT in a read-only transaction",
        );
        let frame = e.to_frame(b'E');
        let back = ErrorFields::parse(b'E', &frame.body).unwrap();
        assert_eq!(back.sqlstate(), Some("25006"));
        assert_eq!(back, e);
        assert!(ErrorFields::parse(b'E', b"Cabc").is_err());
    }
}
