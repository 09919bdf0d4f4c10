//! What goes wrong on the client's side, typed. A [`ClientError`] ends a client's connection
//! (the client was told why when it could be); a [`NoBackend`] does not: the flight that met it
//! gets it as an error (08001: nothing was sent) and the session goes on. Both carry their source, so the log line
//! a session ends with says which it was, at the level it deserves.

use crate::auth::AuthError;
use crate::backend::{BackendError, PoolError};
use crate::net::ProtocolError;

use super::client_io::ReadError;

/// Why a client's connection ended other than by its Terminate.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The client's socket failed, or it went away mid-message: nothing more can be said to it.
    #[error("client connection: {0}")]
    Io(#[from] std::io::Error),
    /// The client broke the protocol; it got a FATAL 08P01 saying how, where that was possible.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The proxy refused the client with a FATAL naming the cause: TLS required, the client limit,
    /// a user not in the config, a bad `lsngate.*` startup option.
    #[error("refused: {0}")]
    Refused(String),
    /// The client did not finish logging in within `client_login_timeout_ms` (FATAL 57014).
    #[error("login timeout: {0}")]
    LoginTimeout(String),
    /// The client's password or SCRAM exchange failed (FATAL 28P01).
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The session cannot go on without a server: the login found none to learn the session's
    /// parameters from, or the connection a pinned session lives on was lost. The client got a
    /// FATAL 08006.
    #[error("server: {0}")]
    Server(String),
}

impl ClientError {
    /// Whether the end is part of normal operation (a client leaving, a bad client): logged at
    /// debug; the rest at info.
    pub fn is_routine(&self) -> bool {
        matches!(self, ClientError::Io(_) | ClientError::Protocol(_))
    }
}

impl From<ReadError> for ClientError {
    fn from(e: ReadError) -> ClientError {
        match e {
            ReadError::Protocol(e) => ClientError::Protocol(e.to_string()),
            ReadError::Io(e) => ClientError::Io(e),
        }
    }
}

impl From<ProtocolError> for ClientError {
    fn from(e: ProtocolError) -> ClientError {
        ClientError::Protocol(e.to_string())
    }
}

/// Why a flight found no server connection.
#[derive(Debug, thiserror::Error)]
pub enum NoBackend {
    /// No node is a reachable primary (a read with no replica serving needs one too).
    #[error("{}", crate::proxy::no_primary())]
    NoPrimary,
    /// The pool gave none: exhausted for the acquire timeout, or opening one failed.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The server connection was lost before the flight went out.
    #[error(transparent)]
    Lost(#[from] BackendError),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client leaving or misbehaving is routine; a refusal, a failed password or a lost
    /// server is what an operator looks for.
    #[test]
    fn routine_ends_are_the_clients_own() {
        let left: ClientError = ReadError::Io(std::io::ErrorKind::UnexpectedEof.into()).into();
        assert!(left.is_routine());
        let garbage: ClientError = ProtocolError::LengthTooSmall { tag: 'Q', len: 1 }.into();
        assert!(matches!(garbage, ClientError::Protocol(_)) && garbage.is_routine());
        assert!(!ClientError::from(AuthError::WrongPassword("app".into())).is_routine());
        assert!(!ClientError::Refused("client limit reached".into()).is_routine());
        assert!(!ClientError::Server("lost".into()).is_routine());
        assert_eq!(NoBackend::NoPrimary.to_string(), crate::proxy::no_primary());
    }
}
