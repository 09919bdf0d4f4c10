//! What handlers see of the token: [`TokenContext`], put into every request's extensions by
//! [`crate::TokenLayer`] and extracted by axum handlers, and [`NewToken`], a response part that
//! reports a write's token. Not the place where tokens are read from or written to the wire —
//! that is the layer's job.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum_core::extract::FromRequestParts;
use axum_core::response::{IntoResponse, IntoResponseParts, Response, ResponseParts};
use http::StatusCode;
use http::request::Parts;
use lsngate_core::Token;

/// The token of one request: what the client brought (cookie, header, token store; merged by max
/// and verified) plus every commit a handler recorded while serving it.
///
/// Cheap to clone; clones share the recorded commits, so a handle moved into a spawned task still
/// reports to the same response.
#[derive(Debug, Clone, Default)]
pub struct TokenContext {
    incoming: Option<Token>,
    committed: Arc<Mutex<Option<Token>>>,
}

impl TokenContext {
    /// A context for a request that brought `incoming` (already verified).
    pub fn new(incoming: Option<Token>) -> TokenContext {
        TokenContext {
            incoming,
            committed: Arc::default(),
        }
    }

    /// The verified token the client brought, if any.
    pub fn incoming(&self) -> Option<Token> {
        self.incoming
    }

    /// The token a read must honour now: the client's, merged with every write this request
    /// already committed (so a handler that writes then reads sees its own write).
    pub fn current(&self) -> Option<Token> {
        Token::merge_all(self.incoming.into_iter().chain(self.committed()))
    }

    /// Records a write's commit token; the layer sets the merge of all of them (and the incoming
    /// one) on the response.
    pub fn record_commit(&self, token: Token) {
        let mut committed = self.committed.lock().unwrap_or_else(|e| e.into_inner());
        *committed = Token::merge_all(committed.iter().copied().chain([token]));
    }

    /// The merge of the commits recorded so far, `None` when the request wrote nothing.
    pub fn committed(&self) -> Option<Token> {
        *self.committed.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Returned by the [`TokenContext`] extractor when the route is not wrapped in the layer.
#[derive(Debug, thiserror::Error)]
#[error(
    "no TokenContext in this request: the route is not wrapped in lsngate_http::TokenLayer; add `.layer(TokenLayer::new(codec))` to the router"
)]
pub struct MissingTokenLayer;

impl IntoResponse for MissingTokenLayer {
    fn into_response(self) -> Response {
        (StatusCode::INTERNAL_SERVER_ERROR, self.to_string()).into_response()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for TokenContext {
    type Rejection = MissingTokenLayer;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<TokenContext>()
            .cloned()
            .ok_or(MissingTokenLayer)
    }
}

/// A response part carrying a write's commit token, for handlers that prefer returning it to
/// calling [`TokenContext::record_commit`]: `(NewToken(token), Redirect::to(..))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewToken(pub Token);

impl IntoResponseParts for NewToken {
    type Error = Infallible;

    fn into_response_parts(self, mut res: ResponseParts) -> Result<ResponseParts, Self::Error> {
        res.extensions_mut().insert(self);
        Ok(res)
    }
}

impl IntoResponse for NewToken {
    fn into_response(self) -> Response {
        (self, StatusCode::NO_CONTENT).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lsngate_core::Lsn;

    #[test]
    fn current_merges_incoming_and_every_commit() {
        let context = TokenContext::new(Some(Token::new(Lsn::new(50))));
        assert_eq!(context.current().map(|t| t.lsn), Some(Lsn::new(50)));
        assert_eq!(context.committed(), None);
        let clone = context.clone();
        clone.record_commit(Token::new(Lsn::new(70)));
        context.record_commit(Token::new(Lsn::new(60)));
        assert_eq!(context.committed().map(|t| t.lsn), Some(Lsn::new(70)));
        assert_eq!(context.current().map(|t| t.lsn), Some(Lsn::new(70)));
        assert_eq!(context.incoming().map(|t| t.lsn), Some(Lsn::new(50)));
    }

    #[test]
    fn no_token_anywhere_is_none() {
        assert_eq!(TokenContext::default().current(), None);
    }
}
