//! Fetching a login's secret from the server for `auth_query`: one connection as `auth_user`,
//! the query with the login name as its one parameter (never spliced into the SQL text), the
//! second column of its first row. The connection is closed afterwards; the caller caches.

use std::time::Duration;

use bytes::{BufMut, BytesMut};

use super::conn::{BackendConn, BackendError};
use crate::config::{AuthQuery, NodeUrl, ServerLogin};
use crate::net::{BackendMessage, FrontendMessage};

/// What the server says about a login name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Looked {
    /// The role's stored secret (`SCRAM-SHA-256$…`, `md5…` or, rarely, plain text).
    Secret(String),
    /// No row, or a row without a secret: the role cannot log in with a password.
    NoSecret,
}

/// Runs `auth_query` for `login` on `url` (node index `node`) in `database`, bounded by
/// `timeout` for the connection and again for the answer.
pub async fn look_up(
    node: usize,
    url: &NodeUrl,
    auth: &AuthQuery,
    database: &str,
    login: &str,
    timeout: Duration,
) -> Result<Looked, BackendError> {
    let runner = ServerLogin {
        user: auth.user.clone(),
        secret: auth.secret.clone(),
    };
    let database = auth.dbname.as_deref().unwrap_or(database);
    let mut conn = BackendConn::connect(node, url, Some(&runner), database, timeout).await?;
    let answer = crate::timer::timeout(timeout, run(&mut conn, &auth.query, login)).await;
    conn.close();
    answer.map_err(|_| BackendError::Lost {
        node: url.address(),
        why: format!("auth_query gave no answer within {timeout:?}"),
    })?
}

async fn run(conn: &mut BackendConn, query: &str, login: &str) -> Result<Looked, BackendError> {
    // Bind: no parameter formats (all text), one value, no result formats (all text).
    let mut rest = BytesMut::new();
    rest.put_i16(0);
    rest.put_i16(1);
    rest.put_i32(login.len() as i32);
    rest.put_slice(login.as_bytes());
    rest.put_i16(0);
    conn.send(&[
        FrontendMessage::Parse {
            statement: String::new(),
            query: query.to_string(),
            param_types: Vec::new(),
        }
        .to_frame(),
        FrontendMessage::Bind {
            portal: String::new(),
            statement: String::new(),
            rest: rest.freeze(),
        }
        .to_frame(),
        FrontendMessage::Execute {
            portal: String::new(),
            max_rows: 0,
        }
        .to_frame(),
        FrontendMessage::Sync.to_frame(),
    ])
    .await?;
    let mut row = None;
    let mut error = None;
    loop {
        let frame = conn.recv().await?;
        match conn.parse(&frame)? {
            BackendMessage::Other(b'D') if row.is_none() => {
                row = crate::net::backend::data_row(&frame.body);
            }
            BackendMessage::ErrorResponse(e) => {
                error = Some(e.get(b'M').unwrap_or("error").to_string())
            }
            BackendMessage::ReadyForQuery(_) => break,
            _ => {}
        }
    }
    if let Some(why) = error {
        return Err(BackendError::Lost {
            node: conn.address.clone(),
            why: format!("auth_query failed: {why}; check auth_query and auth_user's rights"),
        });
    }
    Ok(match row.and_then(|r| r.into_iter().nth(1)).flatten() {
        Some(secret) if !secret.is_empty() => Looked::Secret(secret),
        _ => Looked::NoSecret,
    })
}
