//! [`ScopeLayer`]: causal scopes for web apps. Per request it names the scope the request works
//! under (`user:<id>` from the session, a tenant from the host — the app's `scope_of`) and hands
//! handlers a [`ScopeContext`] holding the library's [`lsngate::Scope`] for it: writes through it
//! raise the scope's floor in the shared store, reads through it wait for that floor. The store
//! is the one the lsngate proxies' `scope_store` uses (keys `lsngate:scope:<name>`), so the same
//! user's requests see their writes on any instance of this app, and through any proxy where
//! services in other languages set `lsngate.scope` to the same name.
//!
//! Unlike [`crate::TokenLayer`]'s per-user token, a scope with no floor in the store is never read
//! as "nothing to wait for": [`lsngate::Scope`] then reads after the primary's current position,
//! as the proxy does. Not a router and not a token carrier: no cookie, no header.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum_core::extract::FromRequestParts;
use axum_core::response::{IntoResponse, Response as AxumResponse};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use lsngate::{Gate, Scope};
use lsngate_store::{BoxFuture, TokenStore};
use tower_layer::Layer;
use tower_service::Service;

/// How long a scope's floor is kept after its last write: the proxy's `scope_ttl_ms` default.
pub const DEFAULT_SCOPE_TTL: Duration = Duration::from_secs(60);

/// Picks the scope a request works under (`None`: none, e.g. an anonymous request).
pub type ScopeOf = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

struct Config {
    gate: Gate,
    store: Arc<dyn TokenStore>,
    ttl: Duration,
    scope_of: ScopeOf,
}

/// The tower layer; see the module docs.
#[derive(Clone)]
pub struct ScopeLayer {
    config: Arc<Config>,
}

impl std::fmt::Debug for ScopeLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScopeLayer")
            .field("ttl", &self.config.ttl)
            .finish_non_exhaustive()
    }
}

impl ScopeLayer {
    /// Scopes over `gate`, their floors in `store` (for the proxies' keys, a
    /// `RedisTokenStore` made `.with_prefix(lsngate_store::SCOPE_PREFIX)`), named per request by
    /// `scope_of`; floors kept [`DEFAULT_SCOPE_TTL`] after their last write.
    pub fn new(
        gate: Gate,
        store: Arc<dyn TokenStore>,
        scope_of: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> ScopeLayer {
        ScopeLayer {
            config: Arc::new(Config {
                gate,
                store,
                ttl: DEFAULT_SCOPE_TTL,
                scope_of: Arc::new(scope_of),
            }),
        }
    }

    /// Keeps floors `ttl` after their last write (use the proxies' `scope_ttl_ms` when sharing).
    pub fn ttl(self, ttl: Duration) -> ScopeLayer {
        let config = &self.config;
        ScopeLayer {
            config: Arc::new(Config {
                gate: config.gate.clone(),
                store: config.store.clone(),
                ttl,
                scope_of: config.scope_of.clone(),
            }),
        }
    }
}

impl<S> Layer<S> for ScopeLayer {
    type Service = ScopeService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ScopeService {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The service [`ScopeLayer`] wraps around yours.
#[derive(Clone)]
pub struct ScopeService<S> {
    inner: S,
    config: Arc<Config>,
}

/// What a handler gets: the request's scope, if it works under one. Extract it in axum handlers.
#[derive(Debug, Clone, Default)]
pub struct ScopeContext {
    scope: Option<Arc<Scope>>,
}

impl ScopeContext {
    /// The request's scope: read and write through it. `None` when `scope_of` named none.
    pub fn scope(&self) -> Option<&Scope> {
        self.scope.as_deref()
    }
}

/// Returned by the [`ScopeContext`] extractor when the route is not wrapped in the layer.
#[derive(Debug, thiserror::Error)]
#[error(
    "no ScopeContext in this request: the route is not wrapped in lsngate_http::ScopeLayer; add `.layer(ScopeLayer::new(gate, store, scope_of))` to the router"
)]
pub struct MissingScopeLayer;

impl IntoResponse for MissingScopeLayer {
    fn into_response(self) -> AxumResponse {
        (StatusCode::INTERNAL_SERVER_ERROR, self.to_string()).into_response()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for ScopeContext {
    type Rejection = MissingScopeLayer;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<ScopeContext>()
            .cloned()
            .ok_or(MissingScopeLayer)
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for ScopeService<S>
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
            let scope = match (config.scope_of)(&parts) {
                None => None,
                Some(name) => {
                    match config.gate.scope(&name, config.store.clone(), config.ttl) {
                        Ok(scope) => Some(Arc::new(scope)),
                        // The name comes from the request: the client hears what is wrong.
                        Err(error) => {
                            let mut response = Response::new(ResBody::from(format!("{error}\n")));
                            *response.status_mut() = StatusCode::BAD_REQUEST;
                            return Ok(response);
                        }
                    }
                }
            };
            parts.extensions.insert(ScopeContext { scope });
            inner.call(Request::from_parts(parts, body)).await
        })
    }
}
