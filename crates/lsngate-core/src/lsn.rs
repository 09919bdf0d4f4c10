//! WAL positions (LSNs) as PostgreSQL prints and compares them.
//!
//! An `Lsn` is a 64-bit byte position in the write-ahead log. PostgreSQL prints it as two hex
//! halves `X/Y`; PostgreSQL 19 zero-pads the low half (`0/0306EE20`), older versions do not
//! (`0/306EE20`). Both parse to the same number. Ordering and subtraction are numeric, never
//! textual (`"0/A" > "0/10"` as strings, but not as positions).
//!
//! This module is pure: no I/O. Text for SQL is always produced by [`Lsn`]'s `Display`, from the
//! number, so nothing a client typed ever reaches a query verbatim.

use std::fmt;
use std::str::FromStr;

/// A WAL position. `Lsn::ZERO` is `0/0`, which PostgreSQL uses as "invalid".
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(u64);

/// Why a text could not be read as an LSN. Every message names the bad part and shows a good
/// value, so it can be shown to a user as is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LsnParseError {
    /// The text was empty.
    #[error("invalid LSN \"\": empty; expected two hex parts of 1–8 digits like 0/3F8A120")]
    Empty,
    #[error(
        "invalid LSN \"{text}\": missing the '/' separator; expected two hex parts of 1–8 digits like 0/3F8A120"
    )]
    /// No `/` between the two halves.
    MissingSeparator {
        /// The offending text, shortened and escaped for display.
        text: String,
    },
    #[error(
        "invalid LSN \"{text}\": the {side} part is empty; expected two hex parts of 1–8 digits like 0/3F8A120"
    )]
    /// One side of the `/` is empty.
    EmptyPart {
        /// The offending text, shortened and escaped for display.
        text: String,
        /// `high` or `low`.
        side: &'static str,
    },
    #[error(
        "invalid LSN \"{text}\": the {side} part has {digits} digits, at most 8 are allowed; expected two hex parts of 1–8 digits like 0/3F8A120"
    )]
    /// One side has more than 8 hex digits.
    TooManyDigits {
        /// The offending text, shortened and escaped for display.
        text: String,
        /// `high` or `low`.
        side: &'static str,
        /// How many digits that side has.
        digits: usize,
    },
    #[error(
        "invalid LSN \"{text}\": the {side} part is not hexadecimal; expected two hex parts of 1–8 digits like 0/3F8A120"
    )]
    /// One side holds something other than hex digits.
    BadHex {
        /// The offending text, shortened and escaped for display.
        text: String,
        /// `high` or `low`.
        side: &'static str,
    },
}

/// Longest text echoed back in an error, so a huge hostile input does not become a huge message.
const ECHO_LIMIT: usize = 40;

fn echo(text: &str) -> String {
    let mut shown: String = text.chars().take(ECHO_LIMIT).collect();
    if shown.len() < text.len() {
        shown.push('…');
    }
    shown.escape_debug().to_string()
}

impl Lsn {
    /// `0/0`, which PostgreSQL uses as "invalid".
    pub const ZERO: Lsn = Lsn(0);
    /// `FFFFFFFF/FFFFFFFF`.
    pub const MAX: Lsn = Lsn(u64::MAX);

    /// The position `position` bytes into the WAL.
    pub const fn new(position: u64) -> Lsn {
        Lsn(position)
    }

    /// The position as a number of bytes.
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// Parses PostgreSQL's `X/Y` text form (each side 1–8 hex digits, either case).
    pub fn parse(text: &str) -> Result<Lsn, LsnParseError> {
        if text.is_empty() {
            return Err(LsnParseError::Empty);
        }
        let Some((high, low)) = text.split_once('/') else {
            return Err(LsnParseError::MissingSeparator { text: echo(text) });
        };
        let high = parse_half(text, high, "high")?;
        let low = parse_half(text, low, "low")?;
        Ok(Lsn((u64::from(high) << 32) | u64::from(low)))
    }

    /// Bytes from `earlier` to `self`; 0 when `earlier` is not earlier.
    pub fn bytes_since(self, earlier: Lsn) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// The SQL literal `'X/Y'::pg_lsn`, built from the number.
    pub fn to_sql_literal(self) -> String {
        format!("'{self}'::pg_lsn")
    }
}

fn parse_half(text: &str, half: &str, side: &'static str) -> Result<u32, LsnParseError> {
    if half.is_empty() {
        return Err(LsnParseError::EmptyPart {
            text: echo(text),
            side,
        });
    }
    if !half.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(LsnParseError::BadHex {
            text: echo(text),
            side,
        });
    }
    if half.len() > 8 {
        return Err(LsnParseError::TooManyDigits {
            text: echo(text),
            side,
            digits: half.len(),
        });
    }
    // 1–8 hex digits always fit in u32.
    Ok(u32::from_str_radix(half, 16).expect("validated hex of at most 8 digits"))
}

impl fmt::Display for Lsn {
    /// PostgreSQL 19's form: `%X/%08X`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:08X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

impl fmt::Debug for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Lsn({self})")
    }
}

impl FromStr for Lsn {
    type Err = LsnParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Lsn::parse(s)
    }
}

impl From<u64> for Lsn {
    fn from(position: u64) -> Self {
        Lsn(position)
    }
}

impl From<Lsn> for u64 {
    fn from(lsn: Lsn) -> Self {
        lsn.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_both_paddings_and_cases() {
        assert_eq!(Lsn::parse("0/306EE20").unwrap(), Lsn::new(0x306EE20));
        assert_eq!(Lsn::parse("0/0306ee20").unwrap(), Lsn::new(0x306EE20));
        assert_eq!(Lsn::parse("16/B374D848").unwrap(), Lsn::new(0x16_B374_D848));
        assert_eq!(
            Lsn::parse("FFFFFFFF/FFFFFFFF").unwrap(),
            Lsn::MAX,
            "the full 64-bit range"
        );
    }

    #[test]
    fn formats_like_postgresql_19() {
        assert_eq!(Lsn::new(0x306EE20).to_string(), "0/0306EE20");
        assert_eq!(Lsn::new(0x16_B374_D848).to_string(), "16/B374D848");
        assert_eq!(Lsn::ZERO.to_string(), "0/00000000");
        assert_eq!(Lsn::new(0x1F0).to_sql_literal(), "'0/000001F0'::pg_lsn");
    }

    #[test]
    fn each_malformation_has_its_own_error() {
        assert_eq!(Lsn::parse(""), Err(LsnParseError::Empty));
        assert!(matches!(
            Lsn::parse("0306EE20"),
            Err(LsnParseError::MissingSeparator { .. })
        ));
        assert!(matches!(
            Lsn::parse("/1"),
            Err(LsnParseError::EmptyPart { side: "high", .. })
        ));
        assert!(matches!(
            Lsn::parse("1/"),
            Err(LsnParseError::EmptyPart { side: "low", .. })
        ));
        assert!(matches!(
            Lsn::parse("0/XYZ"),
            Err(LsnParseError::BadHex { side: "low", .. })
        ));
        assert!(matches!(
            Lsn::parse("0/123456789"),
            Err(LsnParseError::TooManyDigits {
                side: "low",
                digits: 9,
                ..
            })
        ));
        assert!(matches!(
            Lsn::parse("0/1/2"),
            Err(LsnParseError::BadHex { side: "low", .. })
        ));
        assert!(matches!(
            Lsn::parse("-1/0"),
            Err(LsnParseError::BadHex { side: "high", .. })
        ));
        assert!(matches!(
            Lsn::parse("+1/0"),
            Err(LsnParseError::BadHex { .. })
        ));
        assert!(matches!(
            Lsn::parse(" 0/1"),
            Err(LsnParseError::BadHex { .. })
        ));
        assert!(matches!(
            Lsn::parse("0/1'; DROP TABLE t; --"),
            Err(LsnParseError::BadHex { .. })
        ));
    }

    #[test]
    fn errors_explain_the_fix() {
        let message = Lsn::parse("0/XYZ").unwrap_err().to_string();
        assert_eq!(
            message,
            "invalid LSN \"0/XYZ\": the low part is not hexadecimal; expected two hex parts of 1–8 digits like 0/3F8A120"
        );
        let long = "9".repeat(500);
        let message = Lsn::parse(&long).unwrap_err().to_string();
        assert!(
            message.len() < 200,
            "hostile input is not echoed whole: {message}"
        );
    }

    #[test]
    fn subtraction_saturates() {
        let a = Lsn::new(100);
        let b = Lsn::new(40);
        assert_eq!(a.bytes_since(b), 60);
        assert_eq!(b.bytes_since(a), 0);
    }

    proptest! {
        #[test]
        fn format_parse_round_trip(position: u64) {
            let lsn = Lsn::new(position);
            prop_assert_eq!(Lsn::parse(&lsn.to_string()).unwrap(), lsn);
        }

        #[test]
        fn unpadded_and_lowercase_forms_parse_to_the_same_number(position: u64) {
            let text = format!("{:x}/{:x}", position >> 32, position & 0xFFFF_FFFF);
            prop_assert_eq!(Lsn::parse(&text).unwrap().as_u64(), position);
        }

        #[test]
        fn order_is_numeric_order(a: u64, b: u64) {
            prop_assert_eq!(Lsn::new(a).cmp(&Lsn::new(b)), a.cmp(&b));
            let (ta, tb) = (Lsn::new(a).to_string(), Lsn::new(b).to_string());
            prop_assert_eq!(Lsn::parse(&ta).unwrap() < Lsn::parse(&tb).unwrap(), a < b);
        }

        #[test]
        fn parse_never_panics(text in ".{0,40}") {
            let _ = Lsn::parse(&text);
        }
    }
}
