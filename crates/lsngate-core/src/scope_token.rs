//! Signed scopes: a scope name a client may only use if the application server gave it to them.
//! A scope is client input, and where the client is not trusted to pick its own (a browser, a
//! mobile app, a tenant's own SQL), a deployment with a token secret can require scopes signed
//! with it: `<name>~s<signature>`, or `<name>~e<unix seconds>~s<signature>` with an expiry.
//! The signature is base64url (no padding) of HMAC-SHA256 under the token secret over
//! `lsngate-scope:` followed by everything before `~s` — the prefix keeps a scope's signature
//! from ever standing for a commit token's. `~` is outside the scope charset, so a signed scope
//! never reads as a name.

use std::time::SystemTime;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::scope::{MAX_SCOPE_LEN, ScopeError, ScopeName};
use crate::token::{TokenCodec, check_expiry, mac, signature_matches, unix_seconds};

/// What a scope's signature is computed over, before the signed text.
const DOMAIN: &[u8] = b"lsngate-scope:";

/// Why a scope as a client gave it was refused; the message names the rule and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeTokenError {
    /// The name itself is invalid.
    #[error(transparent)]
    Name(#[from] ScopeError),
    /// A bare name where signed scopes are required.
    #[error(
        "unsigned scope refused: this deployment requires scopes signed with its token secret (require_signed_scopes); have the application server sign it (TokenCodec::issue_scope: '<name>~s<signature>', see the README's signed scopes)"
    )]
    Unsigned,
    /// A field between `~` is not `e<unix seconds>` or a final `s<signature>`.
    #[error(
        "invalid signed scope: bad field {0:?}; expected '<name>~s<signature>' or '<name>~e<unix seconds>~s<signature>'"
    )]
    BadField(String),
    /// The signature does not match under this deployment's key.
    #[error(
        "invalid signed scope: the signature does not match (tampered, or signed with another key); sign it again with the token secret"
    )]
    BadSignature,
    /// Signed, but this deployment has no key to check it with.
    #[error(
        "a signed scope was given but no token secret is configured to check it; set token_secret, or give the bare name"
    )]
    NoKey,
    /// The expiry has passed.
    #[error(
        "signed scope expired at Unix time {expired_at} ({ago_seconds}s ago); have the application server sign a fresh one"
    )]
    Expired {
        /// Unix seconds at which it expired.
        expired_at: u64,
        /// How long ago that was.
        ago_seconds: u64,
    },
}

impl TokenCodec {
    /// The signed form of `scope` for a client to set as `lsngate.scope`, expiring `now + ttl`
    /// when the codec has a TTL. Without a key, the bare name.
    pub fn issue_scope(&self, scope: &ScopeName, now: SystemTime) -> String {
        let Some(key) = self.key() else {
            return scope.as_str().to_string();
        };
        let mut text = scope.as_str().to_string();
        if let Some(ttl) = self.ttl() {
            text.push_str(&format!("~e{}", unix_seconds(now) + ttl.as_secs().max(1)));
        }
        let signature = URL_SAFE_NO_PAD.encode(mac(key, &[DOMAIN, text.as_bytes()].concat()));
        text.push_str("~s");
        text.push_str(&signature);
        text
    }

    /// Reads a scope as a client gave it (quotes and surrounding whitespace aside): a signed
    /// scope is checked (shape, name, signature, expiry); a bare name is accepted unless
    /// `require_signed`.
    pub fn verify_scope(
        &self,
        text: &str,
        require_signed: bool,
        now: SystemTime,
    ) -> Result<ScopeName, ScopeTokenError> {
        let trimmed = text.trim();
        let text = trimmed
            .strip_prefix('\'')
            .and_then(|t| t.strip_suffix('\''))
            .unwrap_or(trimmed);
        // A name, an expiry and a signature at most: anything longer is no scope of ours.
        if text.len() > MAX_SCOPE_LEN + 80 {
            return Err(ScopeError::TooLong(text.len()).into());
        }
        let Some((body, signature)) = text.rsplit_once("~s") else {
            if require_signed {
                // A bad name says so first: its fix comes before signing it.
                ScopeName::parse(text)?;
                return Err(ScopeTokenError::Unsigned);
            }
            return Ok(ScopeName::parse(text)?);
        };
        let key = self.key().ok_or(ScopeTokenError::NoKey)?;
        let (name, expiry) = match body.split_once('~') {
            None => (body, None),
            Some((name, field)) => {
                let at = field
                    .strip_prefix('e')
                    .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|v| v.parse::<u64>().ok())
                    .ok_or_else(|| ScopeTokenError::BadField(field.chars().take(24).collect()))?;
                (name, Some(at))
            }
        };
        let scope = ScopeName::parse(name)?;
        if !signature_matches(key, &[DOMAIN, body.as_bytes()], signature) {
            return Err(ScopeTokenError::BadSignature);
        }
        if let Some(expired_at) = expiry {
            check_expiry(expired_at, now).map_err(|ago_seconds| ScopeTokenError::Expired {
                expired_at,
                ago_seconds,
            })?;
        }
        Ok(scope)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    fn scope(name: &str) -> ScopeName {
        ScopeName::parse(name).unwrap()
    }

    #[test]
    fn a_signed_scope_round_trips_and_a_bare_name_is_refused_when_signing_is_required() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let codec = TokenCodec::signed(b"secret".to_vec());
        let signed = codec.issue_scope(&scope("user:42"), now);
        assert!(signed.starts_with("user:42~s"), "{signed}");
        assert_eq!(codec.verify_scope(&signed, true, now), Ok(scope("user:42")));
        assert_eq!(
            codec.verify_scope(&format!("'{signed}'"), true, now),
            Ok(scope("user:42")),
            "quoted as in SET"
        );
        assert_eq!(
            codec.verify_scope("user:42", true, now),
            Err(ScopeTokenError::Unsigned)
        );
        assert_eq!(
            codec.verify_scope("user:42", false, now),
            Ok(scope("user:42"))
        );
        assert_eq!(
            codec.verify_scope("user 42", true, now),
            Err(ScopeTokenError::Name(ScopeError::BadChar(' '))),
            "a bad name is named before the missing signature"
        );
    }

    #[test]
    fn a_tampered_foreign_or_expired_scope_is_refused() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let codec = TokenCodec::signed(b"secret".to_vec()).with_ttl(Duration::from_secs(30));
        let signed = codec.issue_scope(&scope("user:42"), now);
        assert!(signed.starts_with("user:42~e1800000030~s"), "{signed}");
        assert_eq!(codec.verify_scope(&signed, true, now), Ok(scope("user:42")));
        let other = signed.replacen("user:42", "user:43", 1);
        assert_eq!(
            codec.verify_scope(&other, true, now),
            Err(ScopeTokenError::BadSignature)
        );
        let later = signed.replacen("e1800000030", "e1900000000", 1);
        assert_eq!(
            codec.verify_scope(&later, true, now),
            Err(ScopeTokenError::BadSignature),
            "the expiry is signed"
        );
        let foreign = TokenCodec::signed(b"other".to_vec()).issue_scope(&scope("user:42"), now);
        assert_eq!(
            codec.verify_scope(&foreign, true, now),
            Err(ScopeTokenError::BadSignature)
        );
        assert_eq!(
            codec.verify_scope(&signed, true, now + Duration::from_secs(31)),
            Err(ScopeTokenError::Expired {
                expired_at: 1_800_000_030,
                ago_seconds: 1
            })
        );
        assert_eq!(
            TokenCodec::unsigned().verify_scope(&signed, false, now),
            Err(ScopeTokenError::NoKey)
        );
        assert!(matches!(
            codec.verify_scope("user:42~x1~sAAAA", true, now),
            Err(ScopeTokenError::BadField(_))
        ));
        // A commit token's signature is not a scope's, even over the same text.
        let token = codec.issue(&crate::Token::new(crate::Lsn::new(0x10)), now);
        let (body, sig) = token.rsplit_once(".s").unwrap();
        assert!(
            codec
                .verify_scope(&format!("{body}~s{sig}"), true, now)
                .is_err()
        );
    }

    proptest! {
        #[test]
        fn verifying_never_panics(text in ".{0,300}") {
            let codec = TokenCodec::signed(b"k".to_vec());
            let _ = codec.verify_scope(&text, true, SystemTime::now());
            let _ = codec.verify_scope(&text, false, SystemTime::now());
        }
    }
}
