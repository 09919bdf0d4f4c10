//! A server connection attached to a session, and what the session must remember about it
//! while it is: which replies are due and whose they are (`Owner`, `Duty`), a replica read's
//! held-back replies, COPY state, the unsynced extended batch, and the pins and settings still
//! in doubt. `flight.rs` sends through it; `replies.rs` reads its replies against it.

use std::collections::VecDeque;

use bytes::BytesMut;

use super::causal::{CausalRead, Discard, PendingVerdict, PlacedRead, ReadWait};
use super::copy::CopyGate;
use super::pipeline::FlightLog;
use super::scopes::ClientScopes;
use super::shapes::Describing;
use crate::backend::{PooledConn, Target};
use crate::causal::sql::{Probe, Segment, forget_probes, probe_segment};
use crate::net::{Frame, FrontendMessage};
use crate::statement::Class;

/// What a proxy-owned segment is for; its replies are consumed here, never relayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Duty {
    /// Prepared statements a backend must carry (or must not: an earlier client's, closed).
    Prepare,
    /// A name the client's Parse must find taken, as it would directly (see
    /// `preparation::taking_segment`); refused where it is taken already.
    Take,
    /// The client's settings, applied to a backend that lacks them. Unlike [`Duty::Prepare`]'s,
    /// its failure inside an aborted block (25P02) says nothing of the statements the flight
    /// binds (seed 555882).
    Settings,
    /// The wait (or replay check) in front of a replica read.
    Verdict,
    /// The replay position after a replica read, the client's next floor: only where the
    /// server's identity is unknown or the address fronts several servers (elsewhere the read's
    /// server stands for it, `ClientFloors::served`).
    Served,
    /// The insert position after a primary flight (a commit, or a read there).
    Position {
        /// The flight may have written: the position is a commit token.
        wrote: bool,
        /// The segment's number, for the causal scopes its answer raises (`scopes.rs`).
        number: u64,
    },
    /// The server's session settings, read back when a transaction ends while the client's SETs
    /// are in doubt (see [`Session::note_session_effects`]).
    Resync,
    /// The client's startup settings applied again behind its `RESET ALL` or `DISCARD ALL`
    /// (see [`Session::note_session_effect`]).
    Restore,
    /// A statement that fails on purpose: the server's transaction block fails with an error the
    /// proxy answered itself (see [`Session::abort_server_block`]).
    Abort,
    /// The proxy's own `ROLLBACK` of a block the client never heard of (a discarded read's
    /// `BEGIN READ ONLY`), or of one that moves to another server (see
    /// `Session::move_failed_block`).
    Rollback,
    /// The proxy's own `BEGIN` of a block the client opened on another server (see
    /// `Session::move_failed_block`).
    Begin,
}

/// Who is waiting for the replies of one segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The proxy's own statements.
    Proxy(Duty),
    /// The client's: replies are relayed.
    Client,
}

/// Replies held back while a replica read may still need a re-run on the primary.
#[derive(Debug)]
pub struct RetryBuffer {
    /// The replies so far, as the server sent them: one buffer, filled by the plain relay's
    /// copy (`Session::drain_replies`) without a frame built for each.
    pub(super) held: BytesMut,
    pub(super) read_only_violation: bool,
}

impl RetryBuffer {
    /// Whether more is held than `limit` allows while no 25006 makes a re-run due: the replies
    /// then go to the client, and a later 25006 reaches it as it is.
    pub(super) fn over(&self, limit: usize) -> bool {
        self.held.len() > limit && !self.read_only_violation
    }
}

/// What the server answered to a proxy segment, gathered until its ReadyForQuery and handled
/// then as one.
#[derive(Debug, Default)]
pub struct ProxyAnswer {
    /// The values of its DataRows.
    pub rows: Vec<Vec<Option<String>>>,
    /// It failed ([`Duty::Resync`]: the settings stay in doubt).
    pub failed: bool,
    /// A cancel request (57014 "user request") hit it: the server's message.
    pub cancelled: Option<String>,
}

impl ProxyAnswer {
    /// The last row: the one answer of a probe.
    pub fn row(&self) -> Option<&[Option<String>]> {
        self.rows.last().map(Vec::as_slice)
    }
}

/// The proxy's answer to a simple Query it took over, given in place of a stand-in Query's
/// replies (`Session::answer_query`). A stand-in refused with 25P02 (an aborted block the
/// client's unsynced messages did not end) is answered by that refusal instead, as the server
/// would answer the client's Query.
#[derive(Debug)]
pub struct Substitute {
    /// The replies up to, not including, ReadyForQuery.
    pub answer: Vec<Frame>,
    /// The client's floors and route hint once the answer holds (a proxy `SET` behind
    /// unsynced messages that may have ended an aborted block takes effect only if they did).
    pub installs: Option<(super::causal::ClientFloors, crate::statement::RouteHint)>,
}

/// The client's extended-protocol messages on the server since its last Sync. What is due
/// and whether the server is skipping have meaning only while a batch is open, so they live in
/// its variant.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Batch {
    /// Nothing awaits a Sync.
    #[default]
    Synced,
    /// The server awaits a Sync: a flight ended with Flush, or an extended COPY finished.
    Open {
        /// Answers still due: one per Parse, Bind, Describe, Close and Execute.
        due: usize,
        /// Of those, the Executes' (a CommandComplete, EmptyQueryResponse or PortalSuspended
        /// each): where a `RESET` relabelled behind them starts counting (`reset_tags`).
        executes: usize,
        /// One of them failed: the server now skips every message up to the next Sync — a
        /// simple Query included.
        skipping: bool,
        /// What the Executes sent ran: `None` when there were none, else whether one of them
        /// was a BEGIN (see `Session::answer_query`).
        executed: Option<bool>,
    },
}

impl Batch {
    /// An open batch with nothing due yet.
    pub const FRESH: Batch = Batch::Open {
        due: 0,
        executes: 0,
        skipping: false,
        executed: None,
    };

    pub fn is_open(&self) -> bool {
        matches!(self, Batch::Open { .. })
    }

    /// Open, and none of its messages failed so far.
    pub fn open_and_sound(&self) -> bool {
        matches!(
            self,
            Batch::Open {
                skipping: false,
                ..
            }
        )
    }

    /// Opens a batch, keeping one already open as it is (an extended COPY's batch goes on past
    /// the Sync its Execute came with).
    pub fn open(&mut self) {
        if !self.is_open() {
            *self = Batch::FRESH;
        }
    }

    /// A flight ending in Flush was sent: `tail` extended messages stand behind its last Sync or
    /// Query (`ended` says whether it had one), `executes` of them Executes, and its Executes ran
    /// a BEGIN or not (`executed`). A bare Flush with nothing behind the last end leaves no batch
    /// open.
    pub fn flushed(&mut self, ended: bool, tail: usize, executes: usize, executed: Option<bool>) {
        let (due, executes_due, skipping, before) = match *self {
            Batch::Open {
                due,
                executes,
                skipping,
                executed,
            } if !ended => (due, executes, skipping, executed),
            _ => (0, 0, false, None),
        };
        *self = if tail > 0 || (self.is_open() && !ended) {
            Batch::Open {
                due: due + tail,
                executes: executes_due + executes,
                skipping,
                executed: executed
                    .map(|begun| begun || before.unwrap_or(false))
                    .or(before),
            }
        } else {
            Batch::Synced
        };
    }

    /// The Executes sent into the open batch whose answers are still to come.
    pub fn executes_due(&self) -> usize {
        match self {
            Batch::Open { executes, .. } => *executes,
            Batch::Synced => 0,
        }
    }

    /// One reply of the server heard while the batch is open and no segment is due: an error
    /// makes the server skip to the Sync; the answer to a Parse, Bind, Describe, Close or
    /// Execute counts down what is due (a ParameterDescription, a DataRow or a notice is none).
    pub fn heard(&mut self, tag: u8) {
        if let Batch::Open {
            due,
            executes,
            skipping,
            ..
        } = self
        {
            match tag {
                b'E' => {
                    *skipping = true;
                    *due = 0;
                    *executes = 0;
                }
                b'C' | b'I' | b's' => {
                    *due = due.saturating_sub(1);
                    *executes = executes.saturating_sub(1);
                }
                b'1' | b'2' | b'3' | b'n' | b'T' => *due = due.saturating_sub(1),
                _ => {}
            }
        }
    }
}

/// The queues of an attachment let go, emptied, for the next one: a client attaches a pooled
/// connection for every transaction, and these would otherwise be allocated and freed each time
/// (a Parse of the unnamed statement alone puts an entry in `unconfirmed`).
#[derive(Debug, Default)]
pub struct Spares {
    expect: VecDeque<Owner>,
    unconfirmed: VecDeque<super::pipeline::Unconfirmed>,
    describing: VecDeque<Describing>,
    rerun_log: FlightLog,
}

/// A backend attached to the session.
#[derive(Debug)]
pub struct Attached {
    /// The pooled connection.
    pub conn: PooledConn,
    /// What it serves as (by detected role at attach time).
    pub target: Target,
    /// One entry per ReadyForQuery still to come, oldest first.
    pub expect: VecDeque<Owner>,
    /// The client's extended-protocol messages sent since its last Sync.
    pub batch: Batch,
    /// COPY FROM STDIN on this connection: what the proxy sent, what the server said, and the
    /// proxy frames held behind it.
    pub copy: CopyGate,
    /// Held-back replies of a replica read.
    pub retry: Option<RetryBuffer>,
    /// The client already got an error for the segment in progress (a FATAL before a crash).
    pub error_relayed: bool,
    /// The server sent FATAL: this connection is closing and takes no further flights.
    pub doomed: bool,
    /// The causal read in flight on this backend, for a fallback re-run.
    pub read: Option<PlacedRead>,
    /// The client's flight of the read in flight here, with its class, moved in when it was
    /// sent (never copied): what runs elsewhere after a failed wait (`read`), a lost replica,
    /// or a write refused with 25006 (`retry`).
    pub rerun: Option<(Vec<FrontendMessage>, Option<Class>)>,
    /// How the client's statements stood before the flight in `rerun` (its [`FlightLog`]): a
    /// re-run reads its messages against it, not against the flight being assembled by then
    /// (seed 20261220829: a `Describe S ""` re-run on the primary described the unnamed
    /// statement its own later Parse defines).
    pub rerun_log: FlightLog,
    /// The wait or check in front of the read: undecided, or failed (what then happens to the
    /// client's replies).
    pub wait: Option<ReadWait>,
    /// The answer to the proxy segment in progress, so far.
    pub answer: ProxyAnswer,
    /// A client ReadyForQuery held until the proxy segment trailing its flight (see
    /// [`Attached::trailing_segment_next`]) has answered.
    pub held_ready: Option<Frame>,
    /// A write ran in an extended batch a later flight's Sync ends (a flight ending in Flush, a
    /// COPY over the extended protocol): that flight takes the position behind it.
    pub position_owed: bool,
    /// The batch ran a BEGIN nothing after it may have ended, so what it ran commits at that
    /// block's end, not at its Sync: the position owed waits for a flight that may end a
    /// block. Taken before, it would be a SELECT inside the block, taking the block's snapshot
    /// ahead of the client's first query (seed 20261237149: `BEGIN ISOLATION LEVEL` then
    /// failed with 25001).
    pub owed_at_block_end: bool,
    /// The proxy's own answer to a simple Query it took over inside an extended batch still open
    /// (see `Session::answer_query`): the server runs a stand-in Query, whose answer this
    /// replaces, so its transaction moves as it would for the client's Query.
    pub substitute: Option<Substitute>,
    /// The client segment (by number, see `segments_done`) behind statements the proxy could
    /// not prepare because the block was aborted (their Parse met 25P02): the server's 26000
    /// for a Bind or Describe of one is relayed as the 25P02 PostgreSQL gives (it finds the
    /// statement before it refuses the message for the aborted block).
    pub unprepared_in_aborted_block: Option<u64>,
    /// A flight sent here may commit (it ran outside a transaction block, or may end one): if
    /// the connection is lost before its replies, its outcome is unknown.
    pub may_commit: bool,
    /// Per Describe of the client's still to be answered, the statement whose result shape
    /// its answer shows, when the proxy wants to know it (see `shapes.rs`).
    pub describing: VecDeque<Describing>,
    /// A Bind of a changed statement was sent (see `shapes.rs`).
    pub plan_changed_sent: bool,
    /// Client segments (ending in Sync or a Query) sent here since the connection was attached;
    /// those not due any more (see [`Attached::segments_done`]) are answered.
    pub segments_sent: u64,
    /// The client's Parses and Closes not answered yet, oldest first (see `pipeline.rs`).
    pub unconfirmed: VecDeque<super::pipeline::Unconfirmed>,
    /// While `unconfirmed` holds a Parse of the unnamed statement: the client segment being
    /// answered and how many of its messages the server has answered so far (counted from
    /// their last reply: ParseComplete, BindComplete, CloseComplete, RowDescription or NoData,
    /// CommandComplete, EmptyQueryResponse, PortalSuspended).
    pub answered: (u64, u32),
    /// The client segment and the position in it (as `answered`) of the message the server
    /// last refused with an error.
    pub refused_at: Option<(u64, u32)>,
    /// The client segment in flight is a RESET (or `SET ... TO DEFAULT`) sent as `set_config`
    /// (see `Session::reset_to_startup`): its row is dropped and its tag relayed as this.
    pub reset_rewritten: Option<&'static str>,
    /// Per Execute of the client's still to be answered, whether its portal runs a RESET sent
    /// as SET (its CommandComplete is relayed as `RESET`); `None` marks the end of a segment
    /// (Sync or Query). Empty unless a flight ran such a portal.
    pub reset_tags: VecDeque<Option<bool>>,
    /// A flight whose settings the session recorded as the server's before the server answered
    /// is still due: an error among its replies puts them in doubt (`Session::settings_in_doubt`).
    pub effects_due: bool,
    /// The statements other clients left on the connection were closed (see `preparation`).
    pub foreign_closed: bool,
    /// A simple Query under way may have returned a setting to the server login's value among its
    /// statements (see `statement::may_reset_in_parts`): the client's next flight waits for the
    /// read-back behind it, and for the startup values applied again (`Session::on_resync`).
    pub reset_in_doubt: bool,
    /// A statement that pins the session (SQL `PREPARE`, `LISTEN`, `DECLARE`) was sent and the
    /// session pinned, but the server has not said it ran: the last client segment of its flight
    /// (see `segments_done`). If that segment ends without the statement's CommandComplete (the
    /// server skipped it after an earlier error, or refused it), the pin is undone.
    pub pin_unconfirmed: Option<u64>,
}

impl Attached {
    /// Sends `sql` as a simple Query whose replies `owner` is due, behind what was sent: the
    /// server drops its unnamed statement for it.
    pub async fn send_query(
        &mut self,
        sql: &str,
        owner: Owner,
    ) -> Result<(), crate::backend::BackendError> {
        self.conn.unnamed = None;
        self.expect.push_back(owner);
        let query = FrontendMessage::Query(sql.to_string()).to_frame();
        self.conn.send(std::slice::from_ref(&query)).await
    }

    /// The segment that takes the insert position behind what was sent (numbered by `scopes`,
    /// which it hands the scopes written under when `wrote`), its owner now due. The one place a
    /// position probe is queued: behind a synced flight (`flight.rs`) and behind a proxy
    /// command's stand-in Query that commits unsynced writes (`answers.rs`).
    pub(super) fn position_probe(&mut self, scopes: &mut ClientScopes, wrote: bool) -> Segment {
        let number = scopes.position_sent(wrote);
        let segment = self.probe(Probe::Position);
        self.expect
            .push_back(Owner::Proxy(Duty::Position { wrote, number }));
        segment
    }

    /// The frames of `probe`, queued behind what was sent before its owner is pushed. The
    /// probes' statements are parsed again while an earlier probe is unanswered: its Parse may
    /// yet fail (skipped in a block the client's error aborted), and a probe that then finds no
    /// statement fails the block a `COMMIT AND CHAIN` opened, the client's (seed 20261420741:
    /// the client's next Parse got 25P02).
    pub(super) fn probe(&mut self, probe: Probe) -> Segment {
        let earlier = self.expect.iter().any(|o| {
            matches!(
                o,
                Owner::Proxy(Duty::Position { .. } | Duty::Served | Duty::Verdict)
            )
        });
        if earlier {
            forget_probes(&mut self.conn.prepared);
        }
        probe_segment(probe, &mut self.conn.prepared)
    }

    /// The causal read in flight here with its flight, taken to run elsewhere.
    pub(super) fn take_read(&mut self) -> Option<CausalRead> {
        let placed = self.read.take()?;
        let (flight, class, log) = self.take_rerun()?;
        Some(CausalRead {
            floor: placed.floor,
            flight,
            class,
            log: Some(log),
            queue_deadline: placed.queue_deadline,
        })
    }

    /// The flight kept here for a re-run, with its record.
    pub(super) fn take_rerun(
        &mut self,
    ) -> Option<(Vec<FrontendMessage>, Option<Class>, Box<FlightLog>)> {
        let (flight, class) = self.rerun.take()?;
        Some((flight, class, Box::new(std::mem::take(&mut self.rerun_log))))
    }

    /// The read in flight here is over (its answer accepted, or relayed past the point of a
    /// re-run): its flight is not kept.
    pub(super) fn read_over(&mut self) {
        self.read = None;
        self.rerun = None;
    }

    /// Every client segment sent here is answered: what was kept for the flights in flight is
    /// over.
    pub(super) fn all_answered(&mut self) {
        self.effects_due = false;
        self.read_over();
        self.may_commit = false;
        self.plan_changed_sent = false;
    }

    /// This attachment's queues, emptied, for the next one (before it is dropped).
    pub(super) fn take_spares(&mut self) -> Spares {
        let mut spares = Spares {
            expect: std::mem::take(&mut self.expect),
            unconfirmed: std::mem::take(&mut self.unconfirmed),
            describing: std::mem::take(&mut self.describing),
            rerun_log: std::mem::take(&mut self.rerun_log),
        };
        spares.rerun_log.clear();
        spares.expect.clear();
        spares.unconfirmed.clear();
        spares.describing.clear();
        spares
    }

    /// `spares` are the emptied queues of the attachment before (they keep their allocations
    /// from transaction to transaction).
    pub(super) fn new(conn: PooledConn, target: Target, spares: Spares) -> Attached {
        let Spares {
            expect,
            unconfirmed,
            describing,
            rerun_log,
        } = spares;
        debug_assert!(expect.is_empty() && unconfirmed.is_empty() && describing.is_empty());
        Attached {
            conn,
            target,
            expect,
            batch: Batch::Synced,
            copy: CopyGate::default(),
            retry: None,
            error_relayed: false,
            doomed: false,
            read: None,
            rerun: None,
            rerun_log,
            wait: None,
            answer: ProxyAnswer::default(),
            held_ready: None,
            position_owed: false,
            owed_at_block_end: false,
            substitute: None,
            unprepared_in_aborted_block: None,
            may_commit: false,
            describing,
            plan_changed_sent: false,
            segments_sent: 0,
            unconfirmed,
            answered: (0, 0),
            refused_at: None,
            reset_rewritten: None,
            reset_tags: VecDeque::new(),
            reset_in_doubt: false,
            pin_unconfirmed: None,
            effects_due: false,
            foreign_closed: false,
        }
    }

    /// The wait in front of the read, while its verdict is still to come.
    pub fn pending_verdict(&self) -> Option<&PendingVerdict> {
        match &self.wait {
            Some(ReadWait::Pending(verdict)) => Some(verdict),
            _ => None,
        }
    }

    /// Takes the wait in front of the read if its verdict is still to come.
    pub fn take_pending_verdict(&mut self) -> Option<PendingVerdict> {
        match self.wait.take() {
            Some(ReadWait::Pending(verdict)) => Some(verdict),
            other => {
                self.wait = other;
                None
            }
        }
    }

    /// The wait in front of the read failed: its replies are dropped unseen.
    pub fn discarding(&self) -> bool {
        matches!(self.wait, Some(ReadWait::Failed(_)))
    }

    /// Takes what happens after a failed wait, once the read's replies are dropped.
    pub fn take_discard(&mut self) -> Option<Discard> {
        match self.wait.take() {
            Some(ReadWait::Failed(discard)) => Some(discard),
            other => {
                self.wait = other;
                None
            }
        }
    }

    /// Whether replies are still due (the backend must not be reused or released yet).
    pub fn awaiting_replies(&self) -> bool {
        !self.expect.is_empty() || self.batch.is_open() || self.copy.running
    }

    /// Whether the next reply due belongs to the segment the proxy put behind a client flight
    /// (the replay position behind a replica read, the primary's position behind a write or a
    /// transaction's end). The client's ReadyForQuery just before it is held until it answers:
    /// the client then never sees a floor-raising reply before the floor is raised, nor a
    /// backend still busy after its ReadyForQuery (transaction pooling hands it on at once).
    /// The read-back of the client's settings ([`Duty::Resync`]) and the startup settings applied
    /// again behind a `RESET ALL` ([`Duty::Restore`]) trail it the same way: a client that heard
    /// its transaction is over before the read-back answered could send its next SET ahead of
    /// the answer, which would then undo it in the proxy's books.
    /// Read off the queue, not kept as a flag: a client that pipelines its next flight before
    /// this one's replies arrive has its own segments queued behind the trailing one.
    pub fn trailing_segment_next(&self) -> bool {
        matches!(
            self.expect.front(),
            Some(Owner::Proxy(
                Duty::Served | Duty::Position { .. } | Duty::Restore | Duty::Resync
            ))
        )
    }

    /// Client segments still due.
    pub fn client_segments_due(&self) -> usize {
        self.expect.iter().filter(|o| **o == Owner::Client).count()
    }

    /// Whether the proxy may send frames of its own in front of the client's next flight: the
    /// server is neither in the middle of the client's extended batch nor in a COPY the client
    /// has not ended (behind the client's CopyDone or CopyFail, frames reach the server after
    /// the COPY, even before its CommandComplete came back).
    pub fn may_add_frames(&self) -> bool {
        !(self.batch.is_open() || self.copy.inside())
    }

    /// Counts a reply of the client segment being answered ([`Attached::answered`]), and
    /// notes where an error refused a message ([`Attached::refused_at`]).
    pub fn count_answer(&mut self, tag: u8) {
        if !matches!(
            tag,
            b'1' | b'2' | b'3' | b'T' | b'n' | b'C' | b'I' | b's' | b'E'
        ) {
            return;
        }
        let Some(segment) = self.segment_answered() else {
            return;
        };
        if self.answered.0 != segment {
            self.answered = (segment, 0);
        }
        match tag {
            b'1' | b'2' | b'3' | b'T' | b'n' | b'C' | b'I' | b's' => self.answered.1 += 1,
            b'E' => self.refused_at = Some(self.answered),
            _ => {}
        }
    }

    /// Client segments answered (or dropped, as the Syncs a COPY ignores): the number of the one
    /// being answered now.
    pub fn segments_done(&self) -> u64 {
        self.segments_sent - self.client_segments_due() as u64
    }

    /// [`Attached::segments_done`], except while a proxy command's stand-in answers: it is due
    /// as the client's without a segment of its own, and then no client segment is answered.
    pub fn segment_answered(&self) -> Option<u64> {
        self.segments_sent
            .checked_sub(self.client_segments_due() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::Batch;

    /// A flight ending in Flush opens a batch with its unsynced tail due; another adds to it;
    /// one whose Sync or Query ends the batch starts afresh behind it; a bare Flush leaves
    /// nothing open. A BEGIN run by any Execute of the batch is remembered until it ends.
    #[test]
    fn flushes_open_grow_and_end_the_batch() {
        let mut batch = Batch::Synced;
        batch.flushed(false, 0, 0, None);
        assert_eq!(batch, Batch::Synced, "a bare Flush");
        batch.flushed(false, 2, 1, Some(true));
        assert_eq!(
            batch,
            Batch::Open {
                due: 2,
                executes: 1,
                skipping: false,
                executed: Some(true)
            }
        );
        batch.flushed(false, 1, 0, Some(false));
        assert_eq!(
            batch,
            Batch::Open {
                due: 3,
                executes: 1,
                skipping: false,
                executed: Some(true)
            }
        );
        batch.heard(b'E');
        batch.flushed(false, 0, 0, None);
        assert_eq!(
            batch,
            Batch::Open {
                due: 0,
                executes: 0,
                skipping: true,
                executed: Some(true)
            },
            "a Flush behind a failed message keeps the batch skipping"
        );
        batch.flushed(true, 1, 1, Some(false));
        assert_eq!(
            batch,
            Batch::Open {
                due: 1,
                executes: 1,
                skipping: false,
                executed: Some(false)
            },
            "a Sync in the flight ended the old batch; its tail opens a new one"
        );
        batch.flushed(true, 0, 0, None);
        assert_eq!(batch, Batch::Synced);
    }

    /// Only answers to extended messages count down; an error makes the server skip.
    #[test]
    fn replies_count_down_what_is_due() {
        let mut batch = Batch::Open {
            due: 3,
            executes: 1,
            skipping: false,
            executed: Some(false),
        };
        batch.heard(b'2');
        batch.heard(b'D');
        batch.heard(b'C');
        assert_eq!(batch.executes_due(), 0, "an Execute's CommandComplete");
        assert_eq!(
            batch,
            Batch::Open {
                due: 1,
                executes: 0,
                skipping: false,
                executed: Some(false)
            }
        );
        let mut batch = Batch::Open {
            due: 2,
            executes: 0,
            skipping: false,
            executed: None,
        };
        batch.heard(b'D');
        batch.heard(b'N');
        batch.heard(b'1');
        assert_eq!(
            batch,
            Batch::Open {
                due: 1,
                executes: 0,
                skipping: false,
                executed: None
            }
        );
        batch.heard(b'2');
        batch.heard(b'2');
        assert_eq!(
            batch,
            Batch::Open {
                due: 0,
                executes: 0,
                skipping: false,
                executed: None
            }
        );
        assert!(batch.open_and_sound());
        batch.heard(b'E');
        assert!(!batch.open_and_sound() && batch.is_open());
        let mut synced = Batch::Synced;
        synced.heard(b'E');
        assert_eq!(synced, Batch::Synced);
        synced.open();
        assert_eq!(synced, Batch::FRESH);
    }
}
