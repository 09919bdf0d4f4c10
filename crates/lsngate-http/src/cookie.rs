//! The token cookie on the wire: finding it in `Cookie` request headers and writing its
//! `Set-Cookie` line. This is not a cookie jar — it reads one name and writes one attribute set
//! (HttpOnly, SameSite=Lax, Path, Max-Age, optionally Secure), nothing else.
//!
//! The cookie value needs no escaping: token texts are `[0-9A-Za-z/._-]` only (see
//! `lsngate_core::TokenCodec`), all legal in a cookie value.

use std::time::Duration;

use http::HeaderMap;
use http::HeaderValue;
use http::header::COOKIE;

/// Every value of cookie `name` in the request (a browser may send the same name twice when two
/// paths or domains set it; all of them are candidates and merge by max).
pub(crate) fn cookie_values<'a>(
    headers: &'a HeaderMap,
    name: &'a str,
) -> impl Iterator<Item = &'a str> + 'a {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|line| line.split(';'))
        .filter_map(move |pair| {
            let (key, value) = pair.trim().split_once('=')?;
            (key.trim() == name).then(|| value.trim().trim_matches('"'))
        })
}

/// Attributes of the token cookie.
#[derive(Debug, Clone)]
pub(crate) struct CookieAttributes {
    pub name: String,
    pub path: String,
    pub secure: bool,
    pub max_age: Duration,
}

impl CookieAttributes {
    /// The `Set-Cookie` value carrying `token_text`. SameSite=Lax keeps the cookie on the
    /// top-level GET that follows a POST → 303 redirect, which is the read it exists for.
    pub(crate) fn set_cookie(&self, token_text: &str) -> Option<HeaderValue> {
        let mut line = format!(
            "{}={}; Path={}; Max-Age={}; HttpOnly; SameSite=Lax",
            self.name,
            token_text,
            self.path,
            self.max_age.as_secs().max(1)
        );
        if self.secure {
            line.push_str("; Secure");
        }
        HeaderValue::from_str(&line).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_value_of_one_name_across_headers() {
        let mut headers = HeaderMap::new();
        headers.append(COOKIE, HeaderValue::from_static("a=1; lsn_token=0/10; b=2"));
        headers.append(COOKIE, HeaderValue::from_static("lsn_token=\"0/20\""));
        headers.append(COOKIE, HeaderValue::from_static("xlsn_token=0/30; junk"));
        let values: Vec<_> = cookie_values(&headers, "lsn_token").collect();
        assert_eq!(values, ["0/10", "0/20"]);
    }

    #[test]
    fn set_cookie_has_the_safe_attributes() {
        let attributes = CookieAttributes {
            name: "lsn_token".into(),
            path: "/".into(),
            secure: true,
            max_age: Duration::from_secs(30),
        };
        let value = attributes
            .set_cookie("0/10.s abc")
            .map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(
            value.as_deref(),
            Some("lsn_token=0/10.s abc; Path=/; Max-Age=30; HttpOnly; SameSite=Lax; Secure")
        );
        let insecure = CookieAttributes {
            secure: false,
            ..attributes
        };
        let line = insecure.set_cookie("0/10").unwrap();
        assert!(!line.to_str().unwrap().contains("Secure"));
    }

    proptest::proptest! {
        /// Whatever a browser sends, parsing never panics; whatever token we issue, the value
        /// we set is the value we read back.
        #[test]
        fn issued_cookie_reads_back_and_junk_never_panics(
            junk in ".{0,200}",
            position: u64,
            key in proptest::collection::vec(proptest::prelude::any::<u8>(), 1..32),
        ) {
            let mut headers = HeaderMap::new();
            if let Ok(value) = HeaderValue::from_str(&junk) {
                headers.append(COOKIE, value);
            }
            let _ = cookie_values(&headers, "lsn_token").count();

            let codec = lsngate_core::TokenCodec::signed(key);
            let token = lsngate_core::Token::new(lsngate_core::Lsn::new(position));
            let text = codec.issue(&token, std::time::UNIX_EPOCH);
            let attributes = CookieAttributes {
                name: "lsn_token".into(),
                path: "/".into(),
                secure: true,
                max_age: Duration::from_secs(30),
            };
            let line = attributes.set_cookie(&text).unwrap();
            let pair = line.to_str().unwrap().split(';').next().unwrap().to_owned();
            headers.append(COOKIE, HeaderValue::from_str(&pair).unwrap());
            let read: Vec<_> = cookie_values(&headers, "lsn_token").collect();
            proptest::prop_assert!(read.contains(&text.as_str()), "{:?} not in {:?}", text, read);
        }
    }
}
