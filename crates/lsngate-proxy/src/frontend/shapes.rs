//! Result shapes of the client's named statements, so a statement that moves to another server
//! connection answers as it would have where it was prepared.
//!
//! PostgreSQL fixes a prepared statement's result columns when it is parsed. If the table
//! changes shape later (a migration adds a column), every Bind of it fails with `0A000 cached
//! plan must not change result type`, and drivers know to heal that (pgjdbc re-prepares). Under
//! transaction pooling the proxy parses the client's statement again on each server connection
//! it lands on — after the change, that copy has the new columns, and the client's Bind, built
//! for the old ones, failed with `08P01 bind message has 2 result formats but query has 3
//! columns` or silently returned a column the client was never told of.
//!
//! So the proxy remembers the shape the client was shown (the RowDescription or NoData its own
//! Describe got), and before a statement with a known shape is parsed on a connection that lacks
//! it, it parses and describes it there in a round trip of its own. A different shape marks the
//! statement changed: its Binds are sent naming a statement that does not exist and the
//! server's `26000` for it is relayed as PostgreSQL's `0A000`, which also aborts the transaction
//! and skips to the Sync exactly as the real error would. Redefining or closing the statement
//! clears the mark. The round trip costs only the first use of a statement on a connection.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::error::ClientError;
use super::session::Session;
use crate::backend::BackendError;
use crate::net::sqlstate;
use crate::net::{ErrorFields, Frame, FrontendMessage};

/// The statement name Binds of a changed statement are sent with (never prepared anywhere).
const CHANGED: &str = "lsngate_plan_changed";

/// A statement's result columns as a Describe showed them, with the format codes left out (they
/// come from the Bind, not the statement): a RowDescription body, or empty for NoData.
pub type Shape = Bytes;

/// A Describe of the client's still to be answered (`Attached::describing`).
#[derive(Debug)]
pub struct Describing {
    /// The client segment it belongs to (see `Attached::segments_sent`): its answer is the
    /// segment's next RowDescription or NoData, which in a segment ending in a Query come first.
    segment: u64,
    /// The client statement whose result shape its answer shows, when the proxy wants to know
    /// it: its name, and the identity of the definition described (the name may be parsed
    /// again, with other columns, before the answer comes).
    statement: Option<(String, Arc<str>)>,
}

/// The shape in a RowDescription (`T`) or NoData (`n`) body; `None` for a malformed one.
pub fn shape(tag: u8, body: &[u8]) -> Option<Shape> {
    if tag == b'n' {
        return Some(Bytes::new());
    }
    let mut out = BytesMut::from(body);
    let count = u16::from_be_bytes(body.get(..2)?.try_into().ok()?) as usize;
    let mut at = 2;
    for _ in 0..count {
        at += memchr::memchr(0, body.get(at..)?)? + 1;
        // table oid 4, attnum 2, type oid 4, typlen 2, typmod 4, format 2
        let format = at + 16;
        out.get_mut(format..format + 2)?.fill(0);
        at = format + 2;
    }
    (at == body.len()).then(|| out.freeze())
}

impl Session {
    /// Before sending `flight`: one entry per Describe in it, naming the client statement whose
    /// shape its answer shows (when the shape is not known yet) and the client segment it
    /// belongs to, so the relay can record it.
    pub(super) fn expect_shapes(&mut self, flight: &[FrontendMessage]) {
        if !flight
            .iter()
            .any(|m| matches!(m, FrontendMessage::Describe { .. }))
        {
            return;
        }
        let wanted = |session: &Session, at: usize| -> Option<String> {
            let FrontendMessage::Describe { kind, name } = &flight[at] else {
                return None;
            };
            let statement = if *kind == b'S' {
                Some(name.as_str())
            } else {
                // The portal's statement: its last Bind before this Describe in the flight.
                flight[..at].iter().rev().find_map(|b| match b {
                    FrontendMessage::Bind {
                        portal, statement, ..
                    } if crate::net::same_text(portal, name) => Some(statement.as_str()),
                    _ => None,
                })
            };
            statement
                .filter(|s| !s.is_empty())
                .filter(|s| {
                    session
                        .statements
                        .get(*s)
                        .is_some_and(|c| c.shape.is_none())
                })
                .map(str::to_string)
        };
        // Nothing allocated in the common case: every shape the flight shows is known.
        if !(0..flight.len()).any(|at| wanted(self, at).is_some()) {
            return;
        }
        // The definition each Describe shows, as of its place in the flight (seed 20261452014:
        // described, closed and parsed again with other columns before the answer came, the old
        // columns were recorded for the new definition).
        let per_message = self.statement_per_message(flight);
        let described = |at: usize, name: String| -> Option<(String, Arc<str>)> {
            // A portal's statement is the one its last Bind before the Describe bound.
            let index = match &flight[at] {
                FrontendMessage::Describe { kind: b'S', .. } => at,
                FrontendMessage::Describe { name: portal, .. } => {
                    flight[..at].iter().rposition(|b| {
                        matches!(b, FrontendMessage::Bind { portal: p, .. }
                            if crate::net::same_text(p, portal))
                    })?
                }
                _ => return None,
            };
            let s = per_message[index]?;
            Some((name, Arc::clone(&s.identity)))
        };
        let wanted: Vec<_> = (0..flight.len())
            .map(|at| wanted(self, at).and_then(|name| described(at, name)))
            .collect();
        drop(per_message);
        let Some(attached) = self.backend.as_ref() else {
            return;
        };
        // Numbered as `Attached::segments_sent` counts them: the replies to earlier flights
        // still due come first, and a Query among them answers with a RowDescription of its own
        // (seed 20261244221: an INSERT … RETURNING's was recorded as the statement's shape).
        let mut segment = attached.segments_sent;
        let mut entries = Vec::new();
        for (at, m) in flight.iter().enumerate() {
            if matches!(m, FrontendMessage::Describe { .. }) {
                entries.push(Describing {
                    segment,
                    statement: wanted[at].clone(),
                });
            }
            segment += u64::from(m.ends_segment());
        }
        if let Some(attached) = self.backend.as_mut() {
            attached.describing.extend(entries);
        }
    }

    /// A RowDescription or NoData (the answer to a Describe, or to a Query), an error or a
    /// ReadyForQuery of the client's is being relayed.
    pub(super) fn note_shape(&mut self, tag: u8, body: &[u8]) {
        let Some(attached) = self.backend.as_mut() else {
            return;
        };
        let Some(segment) = attached.segment_answered() else {
            return;
        };
        let describing = &mut attached.describing;
        // Entries of segments answered already: nothing left there can answer them.
        while describing.front().is_some_and(|d| d.segment < segment) {
            describing.pop_front();
        }
        match tag {
            // The rest of the segment is skipped, or it ended: its Describes get no answer.
            b'E' | b'Z' => {
                while describing.front().is_some_and(|d| d.segment == segment) {
                    describing.pop_front();
                }
            }
            b'T' | b'n' if describing.front().is_some_and(|d| d.segment == segment) => {
                if let Some(Describing {
                    statement: Some((name, identity)),
                    ..
                }) = describing.pop_front()
                    && let Some(statement) = self.statements.get_mut(&name)
                    && *statement.identity == *identity
                {
                    Arc::make_mut(statement).shape = shape(tag, body);
                }
            }
            _ => {}
        }
    }

    /// The statements `flight` uses whose shape the client was shown and which the attached
    /// connection lacks (see [`Session::recheck_moved`]); none when nothing is attached.
    pub(super) fn moved_statements(&self, flight: &[FrontendMessage]) -> Vec<String> {
        let mut moved = Vec::new();
        let Some(attached) = self.backend.as_ref() else {
            return moved;
        };
        if self.statements.is_empty() {
            return moved;
        }
        let parsed_here = |name: &str| {
            flight
                .iter()
                .any(|m| matches!(m, FrontendMessage::Parse { statement, .. } if statement == name))
        };
        for m in flight {
            let (FrontendMessage::Bind {
                statement: name, ..
            }
            | FrontendMessage::Describe { kind: b'S', name }) = m
            else {
                continue;
            };
            let Some(s) = self.statements.get(name) else {
                continue;
            };
            if s.shape.is_some()
                && !s.plan_changed
                && attached.conn.prepared.get(name).map(String::as_str) != Some(s.identity())
                && !parsed_here(name)
                && !moved.contains(name)
            {
                moved.push(name.clone());
            }
        }
        moved
    }

    /// Before `flight` runs on the attached connection: statements it uses whose shape the
    /// client was shown and which this connection lacks are parsed and described here first; a
    /// different shape marks them changed (see the module doc). `dispatch_to` has drained the
    /// replies due there first (their last one may hand the connection back to the pool).
    /// The connection's loss, when it broke meanwhile (nothing of the flight was sent).
    pub(super) async fn recheck_moved(
        &mut self,
        flight: &[FrontendMessage],
    ) -> Result<Option<BackendError>, ClientError> {
        let moved = self.moved_statements(flight);
        if moved.is_empty() {
            return Ok(None);
        }
        // The round trip needs the connection to itself.
        self.drain().await?;
        for name in moved {
            let Some(s) = self.statements.get(&name).cloned() else {
                continue;
            };
            let Some(attached) = self.backend.as_mut() else {
                return Ok(None);
            };
            let frames = [
                FrontendMessage::Close {
                    kind: b'S',
                    name: name.clone(),
                }
                .to_frame(),
                FrontendMessage::Parse {
                    statement: name.clone(),
                    query: s.query.to_string(),
                    param_types: s.param_types.to_vec(),
                }
                .to_frame(),
                FrontendMessage::Describe {
                    kind: b'S',
                    name: name.clone(),
                }
                .to_frame(),
                FrontendMessage::Sync.to_frame(),
            ];
            let timeout = self.config.connect_timeout;
            let answer = crate::timer::timeout(timeout, async {
                attached.conn.send(&frames).await?;
                let mut found: Option<Shape> = None;
                let mut failed = false;
                loop {
                    let frame = attached.conn.recv().await?;
                    match frame.tag {
                        b'T' | b'n' => found = shape(frame.tag, &frame.body),
                        b'E' => failed = true,
                        b'Z' => return Ok::<_, BackendError>((found, failed)),
                        _ => {}
                    }
                }
            })
            .await;
            match answer {
                Ok(Ok((found, false))) => {
                    attached
                        .conn
                        .prepared
                        .insert(name.clone(), s.identity().to_string());
                    if found != s.shape {
                        tracing::debug!(statement = %name, "the statement's result columns changed since the client described it");
                        if let Some(statement) = self.statements.get_mut(&name) {
                            Arc::make_mut(statement).plan_changed = true;
                            self.plans_changed = true;
                        }
                    }
                }
                // It no longer parses there (a dropped table): the usual re-Parse in front of
                // the client's flight lets the server say why.
                Ok(Ok((_, true))) => {
                    attached.conn.prepared.remove(&name);
                }
                Ok(Err(e)) => return Ok(Some(e)),
                Err(_) => {
                    return Ok(Some(BackendError::Lost {
                        node: attached.conn.address.clone(),
                        why: format!("no answer within {timeout:?} while preparing a statement"),
                    }));
                }
            }
        }
        Ok(None)
    }

    /// The frame to send for client message `m`: a Bind of a changed statement names one that
    /// does not exist, so the server fails it where PostgreSQL would (see the module doc).
    pub(super) fn client_frame(&mut self, m: &FrontendMessage) -> Frame {
        if let FrontendMessage::Bind {
            portal,
            statement,
            rest,
        } = m
            && self.plans_changed
            && self
                .statements
                .get(statement)
                .is_some_and(|s| s.plan_changed)
            && let Some(attached) = self.backend.as_mut()
        {
            attached.plan_changed_sent = true;
            return FrontendMessage::Bind {
                portal: portal.clone(),
                statement: CHANGED.into(),
                rest: rest.clone(),
            }
            .to_frame();
        }
        m.to_frame()
    }

    /// The server's error for a Bind sent by [`Session::client_frame`], as PostgreSQL reports
    /// a changed plan; other errors as they are.
    pub(super) fn changed_plan_error(&self, e: &ErrorFields) -> Option<ErrorFields> {
        let sent = self.backend.as_ref().is_some_and(|b| b.plan_changed_sent);
        let ours = sent
            && e.sqlstate() == Some(sqlstate::INVALID_SQL_STATEMENT_NAME)
            && e.get(b'M').is_some_and(|m| m.contains(CHANGED));
        ours.then(|| {
            let mut error = ErrorFields::new(
                "ERROR",
                sqlstate::FEATURE_NOT_SUPPORTED,
                "cached plan must not change result type",
            );
            // Drivers recognise the error by the server routine that raises it (pgjdbc heals
            // by re-preparing only when it is RevalidateCachedQuery).
            error.fields.push((b'F', "plancache.c".into()));
            error.fields.push((b'R', "RevalidateCachedQuery".into()));
            error
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_ignore_format_codes_and_refuse_garbage() {
        // One column "a": table oid 1, attnum 1, int4 (23), len 4, typmod -1, format 1.
        let mut body = vec![0, 1, b'a', 0];
        body.extend_from_slice(&[
            0, 0, 0, 1, 0, 1, 0, 0, 0, 23, 0, 4, 255, 255, 255, 255, 0, 1,
        ]);
        let text = {
            let mut b = body.clone();
            let n = b.len();
            b[n - 1] = 0;
            b
        };
        assert_eq!(shape(b'T', &body), shape(b'T', &text));
        assert!(shape(b'T', &body).is_some());
        assert_eq!(shape(b'n', &[]), Some(Bytes::new()));
        assert_eq!(shape(b'T', &body[..body.len() - 1]), None);
        assert_eq!(shape(b'T', &[0, 2, b'a', 0]), None);
    }
}
