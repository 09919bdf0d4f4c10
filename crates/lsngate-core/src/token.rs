//! Commit tokens: "a read carrying this must see every write up to here".
//!
//! A [`Token`] is an LSN taken from the primary after a commit, plus the primary's timeline (so a
//! token from before a failover can be recognised) and an optional expiry. Tokens merge by max:
//! the larger position implies every smaller one on the same history.
//!
//! [`TokenCodec`] turns tokens into one compact text that fits a cookie value, an HTTP header and a
//! JSON string, and back, with optional HMAC-SHA256 signing and a TTL:
//!
//! ```text
//! 0/3F8A120                                   plain LSN (accepted where unsigned tokens are allowed)
//! 0/03F8A120.t1.e1764470000.sBASE64URL…       timeline 1, expires at that Unix time, signed
//! ```
//!
//! The signature covers every byte before `.s`. Decoding checks length, shape, signature and then
//! expiry, and each failure has its own [`TokenError`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::floor::Floor;
use crate::lsn::{Lsn, LsnParseError};

/// The longest token text accepted; anything longer is refused before any other work.
pub const MAX_TOKEN_LEN: usize = 256;

const SHAPE: &str = "X/Y[.t<timeline>][.e<unix-expiry>][.s<signature>], like 0/3F8A120";

/// A position every later read must have seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token {
    /// WAL position at or past the end of the commit record.
    pub lsn: Lsn,
    /// The primary's timeline when the position was taken, when known.
    pub timeline: Option<u32>,
    /// Unix seconds after which the token is no longer honoured; `None` never expires.
    pub expires_at: Option<u64>,
}

impl Token {
    /// A token for `lsn`, with no timeline and no expiry.
    pub fn new(lsn: Lsn) -> Token {
        Token {
            lsn,
            timeline: None,
            expires_at: None,
        }
    }

    /// The same token, taken on the primary's timeline `timeline`.
    pub fn with_timeline(mut self, timeline: u32) -> Token {
        self.timeline = Some(timeline);
        self
    }

    /// The token implying both: position and timeline by [`Floor::max`] (the one rule for the
    /// stricter of two floors), the later expiry (no expiry counts as latest).
    pub fn merge(self, other: Token) -> Token {
        let expires_at = match (self.expires_at, other.expires_at) {
            (Some(a), Some(b)) => Some(a.max(b)),
            _ => None,
        };
        let floor = self.floor().max(other.floor());
        Token {
            lsn: floor.lsn,
            timeline: floor.timeline,
            expires_at,
        }
    }

    /// What a read carrying this token must see.
    pub fn floor(&self) -> Floor {
        Floor {
            lsn: self.lsn,
            timeline: self.timeline,
        }
    }

    /// Merges any number of optional tokens; `None` when there are none.
    pub fn merge_all(tokens: impl IntoIterator<Item = Token>) -> Option<Token> {
        tokens.into_iter().reduce(Token::merge)
    }

    /// Whether the token's expiry has passed at `now`.
    pub fn is_expired(&self, now: SystemTime) -> bool {
        self.expires_at.is_some_and(|at| unix_seconds(now) > at)
    }
}

impl From<Lsn> for Token {
    fn from(lsn: Lsn) -> Self {
        Token::new(lsn)
    }
}

/// Why a token text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("empty token; expected {SHAPE}")]
    /// The text was empty.
    Empty,
    #[error("token is {len} bytes, longer than the {MAX_TOKEN_LEN} allowed; expected {SHAPE}")]
    /// The text is longer than [`MAX_TOKEN_LEN`].
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    #[error("invalid token: {0}")]
    /// The LSN part is malformed.
    Lsn(#[from] LsnParseError),
    #[error("invalid token: bad field \"{field}\"; expected {SHAPE}")]
    /// A field after the LSN is not `t<timeline>`, `e<expiry>` or `s<signature>`.
    BadField {
        /// The field, shortened.
        field: String,
    },
    #[error(
        "invalid token: the signature does not match (tampered, or signed with another key); issue a new token"
    )]
    /// The signature does not match the token under this deployment's key.
    BadSignature,
    #[error(
        "token expired at Unix time {expired_at} ({ago_seconds}s ago); it is ignored, take a fresh one from the next write"
    )]
    /// The token's expiry has passed.
    Expired {
        /// Unix seconds at which it expired.
        expired_at: u64,
        /// How long ago that was.
        ago_seconds: u64,
    },
    #[error(
        "unsigned token refused: this deployment requires signed tokens; issue them with the signing key (TokenCodec::issue)"
    )]
    /// The token has no signature and this deployment requires one.
    Unsigned,
}

/// Encodes, signs and verifies tokens for one deployment.
#[derive(Clone)]
pub struct TokenCodec {
    key: Option<Vec<u8>>,
    ttl: Option<Duration>,
    accept_unsigned: bool,
}

impl std::fmt::Debug for TokenCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCodec")
            .field("signed", &self.key.is_some())
            .field("ttl", &self.ttl)
            .field("accept_unsigned", &self.accept_unsigned)
            .finish()
    }
}

impl TokenCodec {
    /// No signing, no expiry; plain `X/Y` tokens are accepted. For trusted carriers (a job
    /// payload inside one system, a connection setting).
    pub fn unsigned() -> TokenCodec {
        TokenCodec {
            key: None,
            ttl: None,
            accept_unsigned: true,
        }
    }

    /// Signs every issued token with HMAC-SHA256 under `key` and refuses unsigned ones.
    pub fn signed(key: impl Into<Vec<u8>>) -> TokenCodec {
        TokenCodec {
            key: Some(key.into()),
            ttl: None,
            accept_unsigned: false,
        }
    }

    /// Issued tokens expire `ttl` after issue (30 s is typical for a browser cookie).
    pub fn with_ttl(mut self, ttl: Duration) -> TokenCodec {
        self.ttl = Some(ttl);
        self
    }

    /// With a key: also accept tokens that carry no signature.
    pub fn accept_unsigned(mut self, accept: bool) -> TokenCodec {
        self.accept_unsigned = accept;
        self
    }

    /// The lifetime given to issued tokens, if any.
    pub fn ttl(&self) -> Option<Duration> {
        self.ttl
    }

    /// The signing key, if any.
    pub(crate) fn key(&self) -> Option<&[u8]> {
        self.key.as_deref()
    }

    /// The text form of `token`, with expiry `now + ttl` when a TTL is set, signed when a key is.
    pub fn issue(&self, token: &Token, now: SystemTime) -> String {
        let mut text = token.lsn.to_string();
        if let Some(timeline) = token.timeline {
            text.push_str(&format!(".t{timeline}"));
        }
        let expires_at = match self.ttl {
            Some(ttl) => Some(unix_seconds(now) + ttl.as_secs().max(1)),
            None => token.expires_at,
        };
        if let Some(at) = expires_at {
            text.push_str(&format!(".e{at}"));
        }
        if let Some(key) = &self.key {
            let signature = URL_SAFE_NO_PAD.encode(mac(key, text.as_bytes()));
            text.push_str(".s");
            text.push_str(&signature);
        }
        text
    }

    /// Reads a token, checking shape, signature and expiry, in that order.
    pub fn verify(&self, text: &str, now: SystemTime) -> Result<Token, TokenError> {
        if text.is_empty() {
            return Err(TokenError::Empty);
        }
        if text.len() > MAX_TOKEN_LEN {
            return Err(TokenError::TooLong { len: text.len() });
        }
        let (body, signature) = match text.find(".s") {
            Some(at) => (&text[..at], Some(&text[at + 2..])),
            None => (text, None),
        };
        let token = parse_body(body)?;
        match (signature, &self.key) {
            (Some(signature), Some(key))
                if !signature_matches(key, &[body.as_bytes()], signature) =>
            {
                return Err(TokenError::BadSignature);
            }
            (Some(_), Some(_)) => {}
            // A signature we cannot check is no better than none.
            (Some(_), None) | (None, _) if !self.accept_unsigned => {
                return Err(TokenError::Unsigned);
            }
            _ => {}
        }
        if let Some(expired_at) = token.expires_at {
            check_expiry(expired_at, now).map_err(|ago_seconds| TokenError::Expired {
                expired_at,
                ago_seconds,
            })?;
        }
        Ok(token)
    }
}

fn parse_body(body: &str) -> Result<Token, TokenError> {
    let mut fields = body.split('.');
    let lsn = Lsn::parse(fields.next().unwrap_or_default())?;
    let mut token = Token::new(lsn);
    for field in fields {
        let bad = || TokenError::BadField {
            field: field.chars().take(24).collect(),
        };
        let (tag, value) = field.split_at_checked(1).ok_or_else(bad)?;
        if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        match tag {
            "t" if token.timeline.is_none() => {
                token.timeline = Some(value.parse().map_err(|_| bad())?)
            }
            "e" if token.expires_at.is_none() => {
                token.expires_at = Some(value.parse().map_err(|_| bad())?)
            }
            _ => return Err(bad()),
        }
    }
    Ok(token)
}

/// Whether `signature` (base64url, no padding) is the HMAC-SHA256 under `key` of `parts` in a
/// row; compared in constant time.
pub(crate) fn signature_matches(key: &[u8], parts: &[&[u8]], signature: &str) -> bool {
    let Ok(signature) = URL_SAFE_NO_PAD.decode(signature) else {
        return false;
    };
    let mut check = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key");
    for part in parts {
        check.update(part);
    }
    check.verify_slice(&signature).is_ok()
}

/// `Err(seconds ago)` when Unix time `expired_at` has passed at `now`.
pub(crate) fn check_expiry(expired_at: u64, now: SystemTime) -> Result<(), u64> {
    let now = unix_seconds(now);
    if now > expired_at {
        Err(now - expired_at)
    } else {
        Ok(())
    }
}

pub(crate) fn mac(key: &[u8], body: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key");
    mac.update(body);
    mac.finalize().into_bytes().to_vec()
}

pub(crate) fn unix_seconds(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn plain_lsn_is_an_unsigned_token() {
        let codec = TokenCodec::unsigned();
        let token = codec.verify("0/3F8A120", at(0)).unwrap();
        assert_eq!(token, Token::new(Lsn::new(0x3F8A120)));
        assert_eq!(codec.issue(&token, at(0)), "0/03F8A120");
    }

    #[test]
    fn signed_token_round_trips_and_fits_a_cookie() {
        let codec = TokenCodec::signed(b"secret".to_vec()).with_ttl(Duration::from_secs(30));
        let token = Token::new(Lsn::new(0x1_0000_00A0)).with_timeline(3);
        let text = codec.issue(&token, at(1_000));
        assert!(text.starts_with("1/000000A0.t3.e1030.s"), "{text}");
        assert!(
            text.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"/._-".contains(&b)),
            "cookie-safe: {text}"
        );
        let back = codec.verify(&text, at(1_010)).unwrap();
        assert_eq!(back.lsn, token.lsn);
        assert_eq!(back.timeline, Some(3));
        assert_eq!(back.expires_at, Some(1_030));
    }

    #[test]
    fn each_refusal_has_its_own_error() {
        let signed = TokenCodec::signed(b"k".to_vec()).with_ttl(Duration::from_secs(30));
        let good = signed.issue(&Token::new(Lsn::new(0x42)), at(100));
        assert_eq!(signed.verify("", at(100)), Err(TokenError::Empty));
        assert!(matches!(
            signed.verify(&"0".repeat(300), at(100)),
            Err(TokenError::TooLong { len: 300 })
        ));
        assert!(matches!(
            signed.verify("0/XYZ", at(100)),
            Err(TokenError::Lsn(LsnParseError::BadHex { .. }))
        ));
        assert!(matches!(
            signed.verify("00000042", at(100)),
            Err(TokenError::Lsn(LsnParseError::MissingSeparator { .. }))
        ));
        assert!(matches!(
            signed.verify("0/123456789", at(100)),
            Err(TokenError::Lsn(LsnParseError::TooManyDigits { .. }))
        ));
        assert!(matches!(
            signed.verify("0/42.x9", at(100)),
            Err(TokenError::BadField { .. })
        ));
        assert_eq!(signed.verify("0/42", at(100)), Err(TokenError::Unsigned));
        let tampered = good.replace("0/00000042", "0/00000043");
        assert_eq!(
            signed.verify(&tampered, at(100)),
            Err(TokenError::BadSignature)
        );
        assert_eq!(
            signed.verify(&good, at(200)),
            Err(TokenError::Expired {
                expired_at: 130,
                ago_seconds: 70
            })
        );
        let other_key = TokenCodec::signed(b"other".to_vec());
        assert_eq!(
            other_key.verify(&good, at(100)),
            Err(TokenError::BadSignature)
        );
    }

    #[test]
    fn unsigned_codec_refuses_signatures_it_cannot_check_only_when_strict() {
        let signed = TokenCodec::signed(b"k".to_vec());
        let text = signed.issue(&Token::new(Lsn::new(7)), at(0));
        // Accepting unsigned tokens means the signature adds nothing, but does not hurt.
        assert!(TokenCodec::unsigned().verify(&text, at(0)).is_ok());
        let lenient = TokenCodec::signed(b"k".to_vec()).accept_unsigned(true);
        assert!(lenient.verify("0/7", at(0)).is_ok());
        assert!(lenient.verify(&text, at(0)).is_ok());
    }

    #[test]
    fn error_messages_name_the_fix() {
        let codec = TokenCodec::unsigned();
        let message = codec.verify("0/XYZ", at(0)).unwrap_err().to_string();
        assert!(message.contains("like 0/3F8A120"), "{message}");
        let message = TokenCodec::signed(b"k".to_vec())
            .verify("0/1", at(0))
            .unwrap_err()
            .to_string();
        assert!(message.contains("requires signed tokens"), "{message}");
    }

    #[test]
    fn merge_keeps_the_largest() {
        let a = Token::new(Lsn::new(10)).with_timeline(1);
        let b = Token::new(Lsn::new(20));
        let merged = a.merge(b);
        assert_eq!(merged.lsn, Lsn::new(20));
        assert_eq!(merged.timeline, Some(1));
        assert_eq!(Token::merge_all([a, b, a]), Some(merged));
        assert_eq!(Token::merge_all([]), None);
    }

    proptest! {
        #[test]
        fn issue_verify_round_trip(position: u64, timeline in proptest::option::of(1u32..1000), key in proptest::collection::vec(any::<u8>(), 1..64)) {
            let codec = TokenCodec::signed(key).with_ttl(Duration::from_secs(30));
            let mut token = Token::new(Lsn::new(position));
            token.timeline = timeline;
            let back = codec.verify(&codec.issue(&token, at(1_000)), at(1_020)).unwrap();
            prop_assert_eq!(back.lsn, token.lsn);
            prop_assert_eq!(back.timeline, token.timeline);
        }

        #[test]
        fn merge_is_max(a: u64, b: u64, c: u64) {
            let tokens = [a, b, c].map(|p| Token::new(Lsn::new(p)));
            prop_assert_eq!(Token::merge_all(tokens).unwrap().lsn.as_u64(), a.max(b).max(c));
            prop_assert_eq!(tokens[0].merge(tokens[1]), tokens[1].merge(tokens[0]));
        }

        #[test]
        fn any_tampered_byte_fails_verification(position: u64, index: usize, replacement: u8) {
            let codec = TokenCodec::signed(b"key".to_vec()).with_ttl(Duration::from_secs(30));
            let text = codec.issue(&Token::new(Lsn::new(position)).with_timeline(2), at(1_000));
            let mut bytes = text.clone().into_bytes();
            let index = index % bytes.len();
            prop_assume!(bytes[index] != replacement);
            bytes[index] = replacement;
            let tampered = String::from_utf8_lossy(&bytes).into_owned();
            prop_assert!(codec.verify(&tampered, at(1_000)).is_err(), "{} accepted", tampered);
        }

        #[test]
        fn verify_never_panics(text in ".{0,300}") {
            let _ = TokenCodec::signed(b"k".to_vec()).verify(&text, at(0));
            let _ = TokenCodec::unsigned().verify(&text, at(0));
        }
    }
}
