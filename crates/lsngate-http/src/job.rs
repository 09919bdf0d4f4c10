//! Tokens in job payloads. A write that enqueues a job puts its commit token in the payload; the
//! worker waits for it before its first read, and a job that enqueues follow-up jobs hands on the
//! max of its own token and whatever it committed itself.
//!
//! The token travels as a plain JSON string (`"token": "0/03F8A120.t1"`) so any language's
//! worker can read it. It is neither signed nor given an expiry here: the queue is inside the
//! system, and a job may sit in the queue longer than any browser TTL yet still needs the write.
//! Not a queue: store the payload wherever your jobs live (a PostgreSQL table, Redis, …).

use std::time::UNIX_EPOCH;

use lsngate_core::{Token, TokenCodec, TokenError};
use serde::{Deserialize, Serialize};

/// A job body plus the commit token its first read must honour.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobPayload<T> {
    /// The position the worker's first read must have replayed; `None` for jobs no write caused.
    #[serde(with = "token_text", default, skip_serializing_if = "Option::is_none")]
    pub token: Option<Token>,
    /// What the job is about.
    pub job: T,
}

impl<T> JobPayload<T> {
    /// A job enqueued by a request (or job) whose writes `token` stands for.
    pub fn new(job: T, token: Option<Token>) -> JobPayload<T> {
        JobPayload {
            token: token.map(without_expiry),
            job,
        }
    }

    /// A job enqueued while handling this one: it carries the max of this job's token and
    /// `committed`, the token of writes this job made itself.
    pub fn follow_up<U>(&self, job: U, committed: Option<Token>) -> JobPayload<U> {
        JobPayload::new(
            job,
            Token::merge_all(self.token.into_iter().chain(committed)),
        )
    }
}

fn without_expiry(mut token: Token) -> Token {
    token.expires_at = None;
    token
}

/// Parses a token text found in a payload: shape checked (so it is safe to use in SQL through
/// `Lsn`'s Display), signature ignored, expiry dropped.
pub fn parse_payload_token(text: &str) -> Result<Token, TokenError> {
    // The Unix epoch as "now" means no expiry can have passed: payload tokens never expire.
    TokenCodec::unsigned()
        .verify(text, UNIX_EPOCH)
        .map(without_expiry)
}

/// `#[serde(with = "lsngate_http::job::token_text")]` for an `Option<Token>` field in your own
/// payload types: a plain `"X/Y[.tN]"` string, or absent/null.
pub mod token_text {
    use super::*;
    use serde::{Deserializer, Serializer};

    /// Writes the token as its text form.
    pub fn serialize<S: Serializer>(token: &Option<Token>, s: S) -> Result<S::Ok, S::Error> {
        match token {
            Some(token) => {
                let text = TokenCodec::unsigned().issue(&without_expiry(*token), UNIX_EPOCH);
                s.serialize_some(&text)
            }
            None => s.serialize_none(),
        }
    }

    /// Reads a token text, refusing malformed ones with the token error (which names the fix).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Token>, D::Error> {
        let text: Option<String> = Option::deserialize(d)?;
        text.map(|text| parse_payload_token(&text).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lsngate_core::Lsn;
    use serde_json::json;

    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    struct SendMail {
        order: i64,
    }

    #[test]
    fn token_is_a_plain_json_string() {
        let mut token = Token::new(Lsn::new(0x3F8A120)).with_timeline(1);
        token.expires_at = Some(1_000);
        let payload = JobPayload::new(SendMail { order: 7 }, Some(token));
        let value = serde_json::to_value(&payload).unwrap();
        assert_eq!(
            value,
            json!({"token": "0/03F8A120.t1", "job": {"order": 7}})
        );
        let back: JobPayload<SendMail> = serde_json::from_value(value).unwrap();
        assert_eq!(
            back.token,
            Some(Token::new(Lsn::new(0x3F8A120)).with_timeline(1))
        );
    }

    #[test]
    fn missing_or_null_token_is_none_and_bad_token_is_an_error() {
        let back: JobPayload<SendMail> =
            serde_json::from_value(json!({"job": {"order": 1}})).unwrap();
        assert_eq!(back.token, None);
        let back: JobPayload<SendMail> =
            serde_json::from_value(json!({"token": null, "job": {"order": 1}})).unwrap();
        assert_eq!(back.token, None);
        let error = serde_json::from_value::<JobPayload<SendMail>>(
            json!({"token": "0/XYZ'; DROP TABLE t;--", "job": {"order": 1}}),
        )
        .unwrap_err();
        assert!(error.to_string().contains("like 0/3F8A120"), "{error}");
        assert_eq!(
            serde_json::to_value(JobPayload::new(1, None)).unwrap(),
            json!({"job": 1})
        );
    }

    #[test]
    fn payload_tokens_never_expire() {
        let token = parse_payload_token("0/10.e5").unwrap();
        assert_eq!(token.expires_at, None);
        assert_eq!(token.lsn, Lsn::new(0x10));
    }

    #[test]
    fn follow_up_carries_the_max() {
        let parent = JobPayload::new("charge", Some(Token::new(Lsn::new(50))));
        let later = parent.follow_up("mail", Some(Token::new(Lsn::new(80))));
        assert_eq!(later.token.map(|t| t.lsn), Some(Lsn::new(80)));
        let earlier = parent.follow_up("mail", Some(Token::new(Lsn::new(10))));
        assert_eq!(earlier.token.map(|t| t.lsn), Some(Lsn::new(50)));
        assert_eq!(parent.follow_up("mail", None).token, parent.token);
        let none = JobPayload::new("x", None).follow_up("y", None);
        assert_eq!(none.token, None);
    }
}
