//! [`TokenLayer`]: the tower layer that carries commit tokens between a client and the handlers.
//!
//! Per request it reads the token cookie and the token header (and, with a [`TokenStore`], the
//! user's stored token), verifies each (shape, signature, expiry), merges the good ones by max and
//! hands handlers a [`TokenContext`]. After the handler, if it recorded a commit (or returned a
//! [`NewToken`]), the merge of that and the incoming token is issued with a fresh TTL and set on
//! the response cookie and header, and saved to the store.
//!
//! A bad token is treated as absent — logged at debug, counted in
//! `lsngate_http_tokens_invalid_total{source, reason}` — because the worst a missing token costs is
//! a stale-looking read, while a 400 would lock a user out over a cookie they cannot see. Turn on
//! [`TokenLayer::reject_invalid`] for APIs whose clients manage the header themselves.
//! Not a router: which node serves the read is the library's decision, fed the token from here.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use http::header::SET_COOKIE;
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use lsngate_core::{Token, TokenCodec, TokenError};
use tower_layer::Layer;
use tower_service::Service;

use crate::context::{NewToken, TokenContext};
use crate::cookie::{CookieAttributes, cookie_values};
use lsngate_store::{BoxFuture, TokenStore};

/// The default request/response header: `Lsn-Token`.
pub const DEFAULT_HEADER: &str = "lsn-token";
/// The default cookie name.
pub const DEFAULT_COOKIE: &str = "lsn_token";
/// The default token lifetime in the cookie, header and store.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// Picks the user id a stored token is kept under (`None` for anonymous requests).
pub type UserOf = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

#[derive(Clone)]
struct Config {
    codec: TokenCodec,
    cookie: Option<CookieAttributes>,
    header: Option<HeaderName>,
    ttl: Duration,
    reject_invalid: bool,
    store: Option<(Arc<dyn TokenStore>, UserOf)>,
}

/// The tower layer; see the module docs. Build with [`TokenLayer::new`] and the builder methods.
///
/// Works over any tower service of `http::Request<_>` → `http::Response<B>` where `B: From<String>`
/// (axum's `Body`, `String`, `http_body_util::Full<Bytes>`): the body type is needed for the 400
/// answer of [`TokenLayer::reject_invalid`].
#[derive(Clone)]
pub struct TokenLayer {
    config: Arc<Config>,
}

impl std::fmt::Debug for TokenLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenLayer")
            .field("codec", &self.config.codec)
            .field("cookie", &self.config.cookie)
            .field("header", &self.config.header)
            .field("reject_invalid", &self.config.reject_invalid)
            .field("store", &self.config.store.is_some())
            .finish()
    }
}

impl TokenLayer {
    /// Tokens issued and verified by `codec` (use `TokenCodec::signed(key)` whenever a browser
    /// holds them), in cookie `lsn_token` and header `Lsn-Token`, 30 s TTL, `Secure` cookies.
    pub fn new(codec: TokenCodec) -> TokenLayer {
        TokenLayer {
            config: Arc::new(Config {
                codec: codec.with_ttl(DEFAULT_TTL),
                cookie: Some(CookieAttributes {
                    name: DEFAULT_COOKIE.to_owned(),
                    path: "/".to_owned(),
                    secure: true,
                    max_age: DEFAULT_TTL,
                }),
                header: Some(HeaderName::from_static(DEFAULT_HEADER)),
                ttl: DEFAULT_TTL,
                reject_invalid: false,
                store: None,
            }),
        }
    }

    fn edit(mut self, change: impl FnOnce(&mut Config)) -> TokenLayer {
        // Copy-on-write: a layer already cloned into a router keeps its own configuration.
        change(Arc::make_mut(&mut self.config));
        self
    }

    /// Carries the token in cookie `name` (`None`: no cookie at all, header only).
    pub fn cookie(self, name: Option<&str>) -> TokenLayer {
        let ttl = self.config.ttl;
        self.edit(|c| {
            c.cookie = name.map(|name| CookieAttributes {
                name: name.to_owned(),
                path: "/".to_owned(),
                secure: c.cookie.as_ref().is_none_or(|a| a.secure),
                max_age: ttl,
            })
        })
    }

    /// Sets the cookie's `Secure` attribute (default on; turn off only for plain-HTTP dev).
    pub fn secure(self, secure: bool) -> TokenLayer {
        self.edit(|c| c.cookie.iter_mut().for_each(|a| a.secure = secure))
    }

    /// Sets the cookie's `Path` (default `/`).
    pub fn cookie_path(self, path: &str) -> TokenLayer {
        self.edit(|c| c.cookie.iter_mut().for_each(|a| a.path = path.to_owned()))
    }

    /// Carries the token in header `name` (`None`: no header, cookie only).
    pub fn header(self, name: Option<HeaderName>) -> TokenLayer {
        self.edit(|c| c.header = name)
    }

    /// How long an issued token is honoured (cookie Max-Age, signed expiry, store TTL).
    pub fn ttl(self, ttl: Duration) -> TokenLayer {
        self.edit(|c| {
            c.ttl = ttl;
            c.codec = c.codec.clone().with_ttl(ttl);
            c.cookie.iter_mut().for_each(|a| a.max_age = ttl);
        })
    }

    /// Answers 400 (naming the fix) instead of ignoring a malformed, tampered or expired token.
    pub fn reject_invalid(self, reject: bool) -> TokenLayer {
        self.edit(|c| c.reject_invalid = reject)
    }

    /// Also keeps each user's token in `store`, under the id `user_of` finds in the request.
    pub fn store(
        self,
        store: Arc<dyn TokenStore>,
        user_of: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> TokenLayer {
        self.edit(|c| c.store = Some((store, Arc::new(user_of))))
    }
}

impl<S> Layer<S> for TokenLayer {
    type Service = TokenService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TokenService {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The service [`TokenLayer`] wraps around yours.
#[derive(Clone)]
pub struct TokenService<S> {
    inner: S,
    config: Arc<Config>,
}

/// A token the layer could not honour, and where it came from.
struct Refusal {
    source: &'static str,
    error: TokenError,
}

impl Config {
    /// Every token the request carries: verified ones merged, refused ones listed.
    fn read_request(&self, headers: &HeaderMap, now: SystemTime) -> (Option<Token>, Vec<Refusal>) {
        let mut good = Vec::new();
        let mut refused = Vec::new();
        let cookies = self
            .cookie
            .iter()
            .flat_map(|a| cookie_values(headers, &a.name));
        let header_values = self
            .header
            .iter()
            .flat_map(|name| headers.get_all(name).iter())
            .map(|value| value.to_str().unwrap_or("\u{FFFD}"))
            .flat_map(|line| line.split(',').map(str::trim));
        let candidates = cookies
            .map(|text| ("cookie", text))
            .chain(header_values.map(|text| ("header", text)));
        for (source, text) in candidates {
            match self.codec.verify(text, now) {
                Ok(token) => good.push(token),
                Err(error) => refused.push(Refusal { source, error }),
            }
        }
        (Token::merge_all(good), refused)
    }

    async fn load_stored(&self, parts: &Parts) -> (Option<String>, Option<Token>) {
        let Some((store, user_of)) = &self.store else {
            return (None, None);
        };
        let Some(user) = user_of(parts) else {
            return (None, None);
        };
        match store.load(&user).await {
            Ok(token) => (Some(user), token),
            Err(error) => {
                tracing::warn!(%error, "token store load failed; using the request's token only");
                count_invalid("store", "unavailable");
                (Some(user), None)
            }
        }
    }

    /// Sets the issued token on the response (cookie + header) and saves it for the user.
    async fn write_response<B>(
        &self,
        response: &mut Response<B>,
        token: Token,
        user: Option<&str>,
    ) {
        let now = SystemTime::now();
        let text = self.codec.issue(&token, now);
        let headers = response.headers_mut();
        if let Some(cookie) = self.cookie.as_ref().and_then(|a| a.set_cookie(&text)) {
            headers.append(SET_COOKIE, cookie);
        }
        if let (Some(name), Ok(value)) = (&self.header, HeaderValue::from_str(&text)) {
            headers.insert(name.clone(), value);
        }
        metrics::counter!("lsngate_http_tokens_issued_total").increment(1);
        if let (Some((store, _)), Some(user)) = (&self.store, user)
            && let Err(error) = store.save(user, token, self.ttl).await
        {
            tracing::warn!(%error, user, "token store save failed; the cookie/header still carry the token");
            count_invalid("store", "unavailable");
        }
    }
}

fn reason(error: &TokenError) -> &'static str {
    match error {
        TokenError::Empty => "empty",
        TokenError::TooLong { .. } => "too_long",
        TokenError::Lsn(_) | TokenError::BadField { .. } => "malformed",
        TokenError::BadSignature => "bad_signature",
        TokenError::Expired { .. } => "expired",
        TokenError::Unsigned => "unsigned",
    }
}

fn count_invalid(source: &'static str, reason: &'static str) {
    metrics::counter!("lsngate_http_tokens_invalid_total", "source" => source, "reason" => reason)
        .increment(1);
}

fn rejection<B: From<String>>(refused: &Refusal, config: &Config) -> Response<B> {
    let name = match refused.source {
        "cookie" => config.cookie.as_ref().map_or("", |a| a.name.as_str()),
        _ => config.header.as_ref().map_or("", |h| h.as_str()),
    };
    let body = format!(
        "refused the {} {name}: {}; send the token the last write returned, or none\n",
        refused.source, refused.error
    );
    let mut response = Response::new(B::from(body));
    *response.status_mut() = StatusCode::BAD_REQUEST;
    response
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for TokenService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: From<String> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The clone that was polled ready serves this request; the fresh clone waits for the next.
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        let config = self.config.clone();
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            let (incoming, refused) = config.read_request(&parts.headers, SystemTime::now());
            for refusal in &refused {
                tracing::debug!(source = refusal.source, error = %refusal.error, "ignoring invalid commit token");
                count_invalid(refusal.source, reason(&refusal.error));
            }
            if let (true, Some(first)) = (config.reject_invalid, refused.first()) {
                return Ok(rejection(first, &config));
            }
            let (user, stored) = config.load_stored(&parts).await;
            let context = TokenContext::new(Token::merge_all(incoming.into_iter().chain(stored)));
            parts.extensions.insert(context.clone());
            let mut response = inner.call(Request::from_parts(parts, body)).await?;
            let returned = response.extensions_mut().remove::<NewToken>().map(|t| t.0);
            if let Some(written) = Token::merge_all(context.committed().into_iter().chain(returned))
            {
                let token = Token::merge_all(context.incoming().into_iter().chain([written]));
                let token = token.expect("at least the written token");
                config
                    .write_response(&mut response, token, user.as_deref())
                    .await;
            }
            Ok(response)
        })
    }
}
