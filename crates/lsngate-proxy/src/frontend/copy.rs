//! COPY FROM STDIN on a server connection. Once the server reads a `COPY … FROM STDIN` (a
//! simple Query, or the Execute of a portal bound to one) and starts it, it takes what follows
//! as COPY traffic until the client's CopyDone or CopyFail: a Sync or Flush is ignored (no
//! ReadyForQuery for it), anything else breaks the COPY (08P01 "unexpected message type"). So
//! the proxy's own frames — the position behind a write, a settings read-back, statements a
//! flight needs — wait behind the gate until the client ends the COPY, or until it turns out the
//! COPY never ran (its ReadyForQuery came, or the client moved on to other statements). They
//! are then sent right behind what the client sent, and the replies they are due stay where
//! they were queued: what the proxy holds back and what it sends are one ordered stream.
//!
//! Over the simple protocol CopyDone ends the Query (CommandComplete, ReadyForQuery). Over the
//! extended protocol it ends the Execute only: the batch goes on to the client's next Sync, so a
//! position due for it is taken behind that Sync (`Attached::position_owed`), and a Sync the
//! client sent before its COPY data got no ReadyForQuery. This is not the COPY data path itself:
//! CopyData goes to the server as it comes (`Session::copy_from_client`).

use std::collections::VecDeque;

use super::attached::Owner;
use super::error::ClientError;
use super::session::Session;
use crate::net::{Frame, FrontendMessage};

/// The COPY FROM STDIN state of one server connection: what the proxy sent, and what the
/// server's replies said (`running`).
#[derive(Debug, Default)]
pub struct CopyGate {
    /// The server said it is in COPY mode (CopyInResponse) and has not ended it yet
    /// (CommandComplete, ErrorResponse or ReadyForQuery).
    pub running: bool,
    /// A message that may start COPY FROM STDIN was sent, and neither the client's CopyDone or
    /// CopyFail nor the COPY's ReadyForQuery has come since: proxy frames wait in `deferred`.
    pub closed: bool,
    /// That message's outcome is still to come: CopyInResponse (the COPY started) or the
    /// ReadyForQuery of its segment (it did not, or it is over).
    tracked: bool,
    /// It was an Execute: the batch goes on after CopyDone, up to the client's next Sync.
    pub extended: bool,
    /// Client ReadyForQuerys due before the COPY's own.
    ahead: usize,
    /// Syncs sent behind the COPY's start and before its end: if the COPY started, the server
    /// ignored them.
    ignored_syncs: usize,
    /// A Sync (or Query) was sent after the client ended the COPY.
    synced_after_end: bool,
    /// The client sent CopyDone or CopyFail since the COPY's start was sent (or, for a COPY the
    /// proxy did not see start, since the last client ReadyForQuery).
    client_ended: bool,
    /// Proxy frames held while the gate is closed, in order; their replies are already queued.
    pub deferred: Vec<Frame>,
    /// Portals bound to a COPY FROM STDIN statement (an Execute of one starts a COPY).
    portals: Vec<String>,
}

/// Whether a statement's text may be `COPY … FROM STDIN` (a false positive only delays the
/// proxy's frames to the statement's ReadyForQuery).
pub fn mentions_copy_from_stdin(sql: &str) -> bool {
    let has = |word: &[u8]| {
        // A full comparison only where the first letter matches (`| 0x20` lowers an ASCII
        // letter): it runs for the text of every statement a flight binds.
        let first = word[0];
        sql.as_bytes()
            .windows(word.len())
            .any(|w| w[0] | 0x20 == first && w.eq_ignore_ascii_case(word))
    };
    has(b"stdin") && has(b"copy")
}

fn syncs(messages: &[FrontendMessage]) -> usize {
    messages
        .iter()
        .filter(|m| matches!(m, FrontendMessage::Sync))
        .count()
}

impl CopyGate {
    /// Whether frames sent now could land inside a COPY: the gate is closed, or the server said
    /// it is in COPY mode and the client has not ended it since.
    pub fn inside(&self) -> bool {
        self.closed || (self.running && !self.client_ended)
    }

    /// One reply of the server: a COPY it ran is over at its CommandComplete, an error, or a
    /// ReadyForQuery.
    pub fn heard(&mut self, tag: u8) {
        if matches!(tag, b'C' | b'E' | b'Z') {
            self.running = false;
        }
    }

    /// Nothing of a COPY is under way or held (a ReadyForQuery needs no look here).
    pub fn is_idle(&self) -> bool {
        !self.closed && !self.tracked
    }

    /// Before a client flight is sent: the frames held for an earlier COPY that go in front of
    /// it. A flight of nothing but Sync and Flush leaves the gate closed (a server in COPY mode
    /// ignores it); any other flight means the client is done with the COPY, or it never ran.
    pub fn before_flight(&mut self, flight: &[FrontendMessage]) -> Vec<Frame> {
        let synced = flight.iter().any(FrontendMessage::ends_segment);
        if !self.closed {
            self.synced_after_end |= synced;
            return Vec::new();
        }
        if flight
            .iter()
            .all(|m| matches!(m, FrontendMessage::Sync | FrontendMessage::Flush))
        {
            self.ignored_syncs += syncs(flight);
            return Vec::new();
        }
        self.closed = false;
        self.synced_after_end |= synced;
        std::mem::take(&mut self.deferred)
    }

    /// A flight whose message at `start` may start COPY FROM STDIN was sent; `clients_due` client
    /// ReadyForQuerys were due before the flight's own.
    pub fn started_by(&mut self, flight: &[FrontendMessage], start: usize, clients_due: usize) {
        let (before, after) = flight.split_at(start);
        self.closed = true;
        self.tracked = true;
        self.extended = matches!(after.first(), Some(FrontendMessage::Execute { .. }));
        self.ahead = clients_due + super::flight::segment_ends(before);
        self.ignored_syncs = syncs(&after[1..]);
        self.synced_after_end = false;
        self.client_ended = false;
    }

    /// The client sent CopyDone or CopyFail: the frames held go right behind it.
    pub fn ended(&mut self) -> Vec<Frame> {
        self.client_ended = true;
        if !self.closed {
            return Vec::new();
        }
        self.closed = false;
        std::mem::take(&mut self.deferred)
    }

    /// A client ReadyForQuery arrived: once it is the COPY's own (or a later one), the COPY is
    /// over without the client's end (it failed, or never started) and the frames held go now.
    pub fn on_ready(&mut self) -> Vec<Frame> {
        let pending = self.closed || self.tracked;
        if pending && self.ahead > 0 {
            self.ahead -= 1;
            return Vec::new();
        }
        self.client_ended = false;
        if !pending {
            return Vec::new();
        }
        self.closed = false;
        self.tracked = false;
        self.ignored_syncs = 0;
        std::mem::take(&mut self.deferred)
    }

    /// The server sent CopyInResponse: the Syncs it ignored get no ReadyForQuery, and over the
    /// extended protocol the batch stays open until a Sync sent after the client's CopyDone.
    /// (A COPY the proxy did not see start, as the pass-through sends it, had no Sync behind it.)
    /// True when the batch stays open that way.
    pub fn copy_started(&mut self, expect: &mut VecDeque<Owner>) -> bool {
        self.running = true;
        if !std::mem::take(&mut self.tracked) {
            return false;
        }
        // Over the simple protocol the first client segment due is the COPY's Query itself.
        let mut keep = usize::from(!self.extended);
        let mut drop = std::mem::take(&mut self.ignored_syncs);
        expect.retain(|owner| {
            if *owner != Owner::Client || drop == 0 {
                return true;
            }
            if keep > 0 {
                keep -= 1;
                return true;
            }
            drop -= 1;
            false
        });
        self.extended && !self.synced_after_end
    }

    /// Where the flight may start COPY FROM STDIN: a Query of one, or the Execute of a portal
    /// bound to one (in this flight or an earlier one); `copies_in(i)` says whether the statement
    /// the Bind at position `i` binds is one ([`ClientStatement::copies_in`], as of that position).
    ///
    /// [`ClientStatement::copies_in`]: super::client_statement::ClientStatement::copies_in
    pub fn copy_start(
        &mut self,
        flight: &[FrontendMessage],
        copies_in: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        let mut start = None;
        for (i, m) in flight.iter().enumerate() {
            match m {
                FrontendMessage::Query(sql) if mentions_copy_from_stdin(sql) => {
                    start = start.or(Some(i));
                }
                FrontendMessage::Bind { portal, .. } => {
                    if !self.portals.is_empty() {
                        self.portals.retain(|p| p != portal);
                    }
                    if copies_in(i) {
                        self.portals.push(portal.clone());
                    }
                }
                FrontendMessage::Close { kind: b'P', name } => self.portals.retain(|p| p != name),
                FrontendMessage::Execute { portal, .. } if self.portals.contains(portal) => {
                    start = start.or(Some(i));
                }
                _ => {}
            }
        }
        start
    }
}

impl Session {
    /// COPY data from the client goes straight to the attached backend, even before its
    /// CopyInResponse arrived (asyncpg streams data right behind the COPY query); PostgreSQL
    /// drops COPY messages outside COPY mode, and the proxy drops them when nothing is attached.
    /// Extended messages still waiting for their Sync (Parse/Bind/Execute of a COPY, its data
    /// right behind) go first, with a Flush; the frames the proxy held while the COPY ran go
    /// right behind the client's CopyDone or CopyFail.
    pub(super) async fn copy_from_client(
        &mut self,
        message: FrontendMessage,
    ) -> Result<(), ClientError> {
        if !self.pending.is_empty() {
            self.pending.push(FrontendMessage::Flush);
            let flight = self.take_pending();
            self.extended_flight(flight, None).await?;
        }
        let Some(attached) = self.backend.as_mut() else {
            return Ok(());
        };
        let mut frames = vec![message.to_frame()];
        if matches!(
            message,
            FrontendMessage::CopyDone | FrontendMessage::CopyFail(_)
        ) {
            frames.extend(attached.copy.ended());
        }
        if let Err(e) = attached.conn.send(&frames).await {
            return self.backend_lost(e).await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_from_stdin_is_found_in_any_case() {
        for sql in [
            "COPY t FROM STDIN",
            "copy t (a) from stdin with (format csv)",
            "  CoPy t FROM StDiN",
        ] {
            assert!(mentions_copy_from_stdin(sql), "{sql}");
        }
        for sql in [
            "SELECT 1",
            "COPY t TO STDOUT",
            "select 'stdin'",
            "",
            "s",
            "STDI",
        ] {
            assert!(!mentions_copy_from_stdin(sql), "{sql}");
        }
    }

    fn execute() -> FrontendMessage {
        FrontendMessage::Execute {
            portal: String::new(),
            max_rows: 0,
        }
    }

    fn bind(statement: &str) -> FrontendMessage {
        FrontendMessage::Bind {
            portal: String::new(),
            statement: statement.into(),
            rest: bytes::Bytes::new(),
        }
    }

    #[test]
    fn only_a_query_or_an_execute_of_a_copy_starts_one() {
        let mut gate = CopyGate::default();
        let none = |_: usize| false;
        // A Bind of a COPY statement (position 1 here) makes its portal the COPY's.
        let flight = [bind(""), bind(""), execute(), FrontendMessage::Sync];
        assert_eq!(gate.copy_start(&flight[..1], none), None);
        assert_eq!(gate.copy_start(&flight[1..], |i| i == 0), Some(1));
        // The portal is still the COPY's in a later flight, until it is bound to another.
        assert_eq!(
            gate.copy_start(&[execute(), FrontendMessage::Sync], none),
            Some(0)
        );
        let other = [bind("s1"), execute(), FrontendMessage::Sync];
        assert_eq!(gate.copy_start(&other, none), None);
        let query = [FrontendMessage::Query("copy t from stdin".into())];
        assert_eq!(gate.copy_start(&query, none), Some(0));
    }

    #[test]
    fn held_frames_go_at_the_copys_end_or_its_ready_for_query() {
        let frame = || FrontendMessage::Sync.to_frame();
        let query = [FrontendMessage::Query("COPY t FROM STDIN".into())];
        let mut gate = CopyGate::default();
        gate.started_by(&query, 0, 1);
        gate.deferred.push(frame());
        assert!(gate.before_flight(&[FrontendMessage::Sync]).is_empty());
        assert!(
            gate.on_ready().is_empty(),
            "an earlier segment's ReadyForQuery"
        );
        assert_eq!(gate.ended().len(), 1);
        assert!(!gate.closed);
        gate.started_by(&query, 0, 0);
        gate.deferred.push(frame());
        assert_eq!(gate.on_ready().len(), 1, "the COPY's own ReadyForQuery");
        gate.started_by(&query, 0, 0);
        gate.deferred.push(frame());
        let next = [FrontendMessage::Query("SELECT 1".into())];
        assert_eq!(gate.before_flight(&next).len(), 1);
    }

    #[test]
    fn a_started_copy_drops_the_ready_for_query_of_syncs_it_ignored() {
        let flight = [bind(""), execute(), FrontendMessage::Sync];
        let mut gate = CopyGate::default();
        gate.started_by(&flight, 1, 0);
        let mut expect = VecDeque::from([Owner::Client]);
        let open = gate.copy_started(&mut expect);
        assert!(expect.is_empty() && open);
        // A Sync sent after CopyDone ends the batch: it is answered.
        gate.started_by(&flight[..2], 1, 0);
        gate.ended();
        gate.before_flight(&[FrontendMessage::Sync]);
        let mut expect = VecDeque::from([Owner::Client]);
        let open = gate.copy_started(&mut expect);
        assert_eq!(expect.len(), 1);
        assert!(!open);
        // Over the simple protocol the Query's own ReadyForQuery stays.
        let query = [FrontendMessage::Query("COPY t FROM STDIN".into())];
        gate.started_by(&query, 0, 0);
        gate.before_flight(&[FrontendMessage::Sync]);
        let mut expect = VecDeque::from([Owner::Client, Owner::Client]);
        assert!(!gate.copy_started(&mut expect));
        assert_eq!(expect.len(), 1);
    }
}
