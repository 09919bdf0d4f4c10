//! Flights: what the session sends to a backend in one write, and how the replies come back.
//! A flight is a list of segments, each ending in Sync or a Query, owned either by the client or
//! by the proxy. Proxy segments (settings a fresh backend must carry, prepared statements it
//! lacks) ride in front of the client's messages in the same write, and their replies never
//! reach the client — the same mechanism causal reads will use to put a wait in front of a read.
//! Replies of a replica read outside a transaction are held back (up to `retry_buffer_size`) so
//! a 25006 "read-only transaction" error can be re-run on the primary without the client seeing it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use super::Proxy;
use super::causal::{CausalRead, Discard, PendingVerdict};
use super::copy::CopyGate;
use super::pipeline::{At, Effect, Unconfirmed};
use super::session::{ClientStatement, Session};
use crate::backend::{BackendConn, NodeState, PooledConn, Role, Settings, Target};
use crate::causal::sql::{Probe, probe_segment, wait_for};
use crate::config::ServerLogin;
use crate::net::{ErrorFields, Frame, FrontendMessage};
use crate::statement::{Class, session_set, setting_reset};

/// What a proxy-owned segment is for; its replies are consumed here, never relayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Duty {
    /// Settings and prepared statements a fresh backend must carry.
    Prepare,
    /// The wait (or replay check) in front of a replica read.
    Verdict,
    /// The replay position after a replica read: the client's next floor.
    Served,
    /// The insert position after a primary flight (a commit, or a read there).
    Position {
        /// The flight may have written: the position is a commit token.
        wrote: bool,
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
}

/// What [`Duty::Abort`] sends: fails at once, and says why in the server's log.
const ABORT_SQL: &str = "DO $$BEGIN RAISE EXCEPTION 'lsngate: the client''s transaction block failed at a statement the proxy answered'; END$$";

/// The session-level settings of a server connection: after the client's transaction is over,
/// exactly the client's (the proxy resets anyone else's before the client's first statement).
pub(super) const RESYNC_SQL: &str =
    "SELECT name, setting FROM pg_catalog.pg_settings WHERE source = 'session'";

/// Who is waiting for the replies of one segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The proxy's own statements.
    Proxy(Duty),
    /// The client's: replies are relayed.
    Client,
}

/// Where a flight should go.
#[derive(Debug, Default)]
pub struct Route {
    /// Primary or replica; `None` = wherever the session already is.
    pub target: Option<Target>,
    /// A specific replica chosen by the causal planner.
    pub node: Option<Arc<NodeState>>,
    /// The causal read this flight is, when routed by floor.
    pub read: Option<CausalRead>,
}

impl Route {
    /// A route by target only.
    pub fn to(target: Option<Target>) -> Route {
        Route {
            target,
            ..Route::default()
        }
    }
}

/// Replies held back while a replica read may still need a re-run on the primary.
#[derive(Debug)]
pub struct RetryBuffer {
    pub(super) flight: Vec<FrontendMessage>,
    pub(super) class: Option<Class>,
    pub(super) frames: Vec<Frame>,
    pub(super) bytes: usize,
    pub(super) read_only_violation: bool,
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

/// A backend attached to the session.
#[derive(Debug)]
pub struct Attached {
    /// The pooled connection.
    pub conn: PooledConn,
    /// What it serves as (by detected role at attach time).
    pub target: Target,
    /// One entry per ReadyForQuery still to come, oldest first.
    pub expect: VecDeque<Owner>,
    /// The server awaits a Sync (a flight ended with Flush, or an extended COPY finished).
    pub open: bool,
    /// COPY FROM STDIN in progress (the server sent CopyInResponse, and not its end yet).
    pub copy_in: bool,
    /// What the proxy sent of a COPY FROM STDIN, and its own frames held behind it.
    pub copy: CopyGate,
    /// Held-back replies of a replica read.
    pub retry: Option<RetryBuffer>,
    /// The client already got an error for the segment in progress (a FATAL before a crash).
    pub error_relayed: bool,
    /// The server sent FATAL: this connection is closing and takes no further flights.
    pub doomed: bool,
    /// The causal read in flight on this backend (its flight, for a fallback re-run).
    pub read: Option<CausalRead>,
    /// The wait or check in front of the read, until decided.
    pub verdict: Option<PendingVerdict>,
    /// What happens to the client's replies after a failed verdict.
    pub discard: Option<Discard>,
    /// Values of the DataRow of the proxy segment in progress.
    pub probe_row: Option<Vec<Option<String>>>,
    /// A cancel request (57014 "user request") hit the proxy segment in progress.
    pub probe_cancelled: Option<String>,
    /// A client ReadyForQuery held until the proxy segment trailing its flight (see
    /// [`Attached::trailing_segment_next`]) has answered.
    pub held_ready: Option<Frame>,
    /// A write ran in an extended batch a later flight's Sync ends (a flight ending in Flush, a
    /// COPY over the extended protocol): that flight takes the position behind it.
    pub position_owed: bool,
    /// The proxy's own answer to a simple Query it took over inside an extended batch still open
    /// (see `Session::answer_query`): the server runs a stand-in Query, whose answer this
    /// replaces, so its transaction moves as it would for the client's Query.
    pub substitute: Option<Substitute>,
    /// The client segment (by number, see `segments_done`) behind statements the proxy could
    /// not prepare because the block was aborted (their Parse met 25P02): the server's 26000
    /// for a Bind or Describe of one is relayed as the 25P02 PostgreSQL gives (it finds the
    /// statement before it refuses the message for the aborted block).
    pub unprepared_in_aborted_block: Option<u64>,
    /// What the Executes sent since the last Sync (while `open`) ran: `None` when there were
    /// none, else whether one of them was a BEGIN (see `Session::answer_query`).
    pub unsynced_executed: Option<bool>,
    /// `name, setting` rows of a [`Duty::Resync`] under way, and whether it failed.
    pub resync_rows: Vec<Vec<Option<String>>>,
    pub resync_failed: bool,
    /// A flight sent here may commit (it ran outside a transaction block, or may end one): if
    /// the connection is lost before its replies, its outcome is unknown.
    pub may_commit: bool,
    /// Answers still due to the extended-protocol messages sent since the last Sync (while
    /// `open`): one per Parse, Bind, Describe, Close and Execute.
    pub unsynced_due: usize,
    /// One of those failed: the server now skips every message up to the next Sync — a simple
    /// Query included.
    pub skipping: bool,
    /// Per Describe of the client's still to be answered, the statement whose result shape
    /// its answer shows, when the proxy wants to know it (see `shapes.rs`).
    pub describing: VecDeque<Option<String>>,
    /// A Bind of a changed statement was sent (see `shapes.rs`).
    pub plan_changed_sent: bool,
    /// Client segments (ending in Sync or a Query) sent here since the connection was attached;
    /// those not due any more (see [`Attached::segments_done`]) are answered.
    pub segments_sent: u64,
    /// The client's Parses and Closes not answered yet, oldest first (see `pipeline.rs`).
    pub unconfirmed: VecDeque<super::pipeline::Unconfirmed>,
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
    /// The `conn.reported_version` the client's reported values were last compared with (see
    /// `Session::report_changes`); none yet on a fresh attachment.
    pub reported_seen: Option<u64>,
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

    /// `expect` is an empty queue to reuse (it keeps its allocation from client to client).
    pub(super) fn new(conn: PooledConn, target: Target, expect: VecDeque<Owner>) -> Attached {
        debug_assert!(expect.is_empty());
        Attached {
            conn,
            target,
            expect,
            open: false,
            copy_in: false,
            copy: CopyGate::default(),
            retry: None,
            error_relayed: false,
            doomed: false,
            read: None,
            verdict: None,
            discard: None,
            probe_row: None,
            probe_cancelled: None,
            held_ready: None,
            position_owed: false,
            substitute: None,
            unprepared_in_aborted_block: None,
            unsynced_executed: None,
            resync_rows: Vec::new(),
            resync_failed: false,
            may_commit: false,
            unsynced_due: 0,
            skipping: false,
            describing: VecDeque::new(),
            plan_changed_sent: false,
            segments_sent: 0,
            unconfirmed: VecDeque::new(),
            reset_rewritten: None,
            reported_seen: None,
            reset_tags: VecDeque::new(),
            reset_in_doubt: false,
            pin_unconfirmed: None,
            effects_due: false,
            foreign_closed: false,
        }
    }

    /// Whether replies are still due (the backend must not be reused or released yet).
    pub fn awaiting_replies(&self) -> bool {
        !self.expect.is_empty() || self.open || self.copy_in
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
        !(self.open || self.copy.inside(self.copy_in))
    }

    /// Client segments answered (or dropped, as the Syncs a COPY ignores): the number of the one
    /// being answered now.
    pub fn segments_done(&self) -> u64 {
        self.segments_sent - self.client_segments_due() as u64
    }
}

/// How many answers the messages after a flight's last Sync (or Query) are due, when it ends
/// unsynced (with Flush); `None` when it ends synced.
fn unsynced_tail(flight: &[FrontendMessage]) -> Option<usize> {
    if !matches!(flight.last(), Some(FrontendMessage::Flush)) {
        return None;
    }
    let tail = flight.iter().rev().take_while(|m| {
        !matches!(
            m,
            FrontendMessage::Sync | FrontendMessage::Query(_) | FrontendMessage::FunctionCall(_)
        )
    });
    Some(
        tail.filter(|m| {
            matches!(
                m,
                FrontendMessage::Parse { .. }
                    | FrontendMessage::Bind { .. }
                    | FrontendMessage::Describe { .. }
                    | FrontendMessage::Close { .. }
                    | FrontendMessage::Execute { .. }
            )
        })
        .count(),
    )
}

pub(super) fn segment_ends(flight: &[FrontendMessage]) -> usize {
    flight
        .iter()
        .filter(|m| {
            matches!(
                m,
                FrontendMessage::Sync
                    | FrontendMessage::Query(_)
                    | FrontendMessage::FunctionCall(_)
            )
        })
        .count()
}

/// The statements that make a backend carry exactly the client's settings: the setting
/// statements that differ, `RESET` for leftovers.
fn settings_sql(wanted: &Settings, applied: &Settings) -> Option<String> {
    let mut sql = String::new();
    for (name, statement) in wanted {
        if applied.get(name) != Some(statement) {
            sql.push_str(statement);
            sql.push(';');
        }
    }
    for name in applied.keys().filter(|n| !wanted.contains_key(n)) {
        sql.push_str(&format!("RESET {name};"));
    }
    (!sql.is_empty()).then_some(sql)
}

/// The `Parse ""` a flight needs in front when it binds or describes the unnamed statement without
/// parsing it, and the server's unnamed statement is not the client's (another client parsed
/// one there, a simple Query dropped it, or the client parsed it on another connection). Tracks
/// what `conn`'s unnamed statement is once the flight has run; injects nothing unless `may_inject`.
/// When the client has no unnamed statement (a simple Query dropped it) and the server has one,
/// it is a `Close S ""` instead, so the server answers 26000 as it would directly.
fn unnamed_preparation(
    conn: &mut BackendConn,
    client: Option<&ClientStatement>,
    flight: &[FrontendMessage],
    may_inject: bool,
) -> Option<Frame> {
    // Only a Bind or Describe before the flight's first `Parse ""` needs the client's (after it,
    // the flight's own is there).
    let mut checked = !may_inject;
    let mut parse = None;
    for m in flight {
        match m {
            FrontendMessage::Parse {
                statement,
                query,
                param_types,
            } if statement.is_empty() => {
                checked = true;
                conn.unnamed = Some(super::session::statement_identity(param_types, query))
            }
            FrontendMessage::Bind { statement, .. }
            | FrontendMessage::Describe {
                kind: b'S',
                name: statement,
            } if statement.is_empty() && !checked => {
                checked = true;
                let Some(s) = client else {
                    // The client has none (a simple Query dropped it): neither may the server,
                    // which then answers 26000 as it would directly.
                    if may_inject && conn.unnamed.take().is_some() {
                        parse = Some(
                            FrontendMessage::Close {
                                kind: b'S',
                                name: String::new(),
                            }
                            .to_frame(),
                        );
                    }
                    continue;
                };
                if conn.unnamed.as_deref() != Some(s.identity()) {
                    let message = FrontendMessage::Parse {
                        statement: String::new(),
                        query: s.query.clone(),
                        param_types: s.param_types.clone(),
                    };
                    parse = Some(message.to_frame());
                    conn.unnamed = Some(s.identity().to_string());
                }
            }
            FrontendMessage::Close { kind: b'S', name } if name.is_empty() => conn.unnamed = None,
            FrontendMessage::Query(_) => conn.unnamed = None,
            _ => {}
        }
    }
    parse
}

/// [`Attached::reset_tags`] entries for a flight: per Execute whether its portal (bound in this
/// flight or before, as `portals` records) runs a RESET sent as SET; `None` per Sync or Query.
fn reset_tags(
    flight: &[FrontendMessage],
    statements: &[Option<&ClientStatement>],
    portals: &mut HashSet<String>,
) -> Vec<Option<bool>> {
    let mut tags = Vec::new();
    for (m, s) in flight.iter().zip(statements) {
        match m {
            FrontendMessage::Bind { portal, .. } => {
                if s.is_some_and(|s| s.reset_as_set) {
                    portals.insert(portal.clone());
                } else if !portals.is_empty() {
                    portals.remove(portal);
                }
            }
            FrontendMessage::Close { kind: b'P', name } => {
                portals.remove(name);
            }
            FrontendMessage::Execute { portal, .. } => tags.push(Some(portals.contains(portal))),
            FrontendMessage::Sync
            | FrontendMessage::Query(_)
            | FrontendMessage::FunctionCall(_) => tags.push(None),
            _ => {}
        }
    }
    tags
}

/// The identity recorded for a statement a connection may or may not hold: no statement's
/// (`statement_identity` always has a `|`).
pub(super) const IN_DOUBT: &str = "";

/// The effects of a `DEALLOCATE ALL` (or `DISCARD ALL`) on the statements the client `held`
/// before it: every one gone from the client's view, put back if the server does not confirm it
/// ran (`replies.rs` `undo_unconfirmed`).
fn all_dropped(held: impl IntoIterator<Item = (String, ClientStatement)>) -> Vec<Effect> {
    held.into_iter()
        .map(|(name, s)| Effect {
            name,
            view_before: Some(s),
            view_after: None,
            held_before: None,
            held_after: None,
        })
        .collect()
}

/// A `DEALLOCATE ALL` (or `DISCARD ALL`) sent on `conn`: the server drops every named statement
/// there, the proxy's own included, unless it skips or refuses the statement (after an error in
/// its batch, or in an aborted block), and only its CommandComplete says which. Each is kept with
/// an identity no statement has, so whatever needs one there next closes and parses it again,
/// and a Parse of its name closes it first.
fn all_in_doubt(conn: &mut BackendConn) {
    conn.prepared
        .values_mut()
        .for_each(|identity| *identity = IN_DOUBT.to_string());
}

/// Named statements a server connection may hold before those not in use are closed.
const MAX_PREPARED_PER_CONNECTION: usize = 256;

fn close_statement(name: &str) -> Frame {
    FrontendMessage::Close {
        kind: b'S',
        name: name.to_string(),
    }
    .to_frame()
}

/// Whether the flight leaves the client without an unnamed statement (its last `Parse ""` is
/// followed by a `Close` of it).
fn closes_unnamed(flight: &[FrontendMessage]) -> bool {
    flight
        .iter()
        .rev()
        .find_map(|m| match m {
            FrontendMessage::Parse { statement, .. } if statement.is_empty() => Some(false),
            FrontendMessage::Close { kind: b'S', name } if name.is_empty() => Some(true),
            _ => None,
        })
        .unwrap_or(false)
}

impl Proxy {
    /// ParameterStatus values to report at login: those the primary sent the pool's newest
    /// connection (a checkout only before there was one).
    pub async fn server_params(
        &self,
        database: &str,
        login: Option<&ServerLogin>,
    ) -> anyhow::Result<Vec<(String, String)>> {
        let config = self.config();
        let node = self
            .nodes
            .pick(Target::Primary)
            .ok_or_else(|| anyhow::anyhow!(no_primary()))?;
        let pool = node.pool(database, login, config.pool_limits());
        // Known once the pool opened a connection: a login does not wait for a busy pool.
        if let Some(params) = pool.server_params() {
            return Ok(params.to_vec());
        }
        let mut conn = pool
            .acquire(
                &node.url,
                login,
                config.acquire_timeout,
                config.connect_timeout,
            )
            .await?;
        let params = conn.server_params.clone();
        conn.release();
        Ok(params)
    }
}

fn no_primary() -> String {
    "no primary is reachable: every configured node is down or in recovery; check /status on the admin port".into()
}

impl Session {
    /// Sends a flight where `route` says, attaching (or switching) a backend if needed.
    pub(super) async fn dispatch_to(
        &mut self,
        flight: Vec<FrontendMessage>,
        class: Option<Class>,
        route: Route,
    ) -> anyhow::Result<()> {
        let want = route.target;
        while let Some(b) = self.backend.as_ref() {
            if b.doomed {
                // Wait for the close so the replies still due get their errors, then attach anew.
                self.drain().await?;
                if self.backend.as_ref().is_some_and(|b| b.doomed) {
                    self.backend = None;
                }
                continue;
            }
            let in_block = self.status != b'I' || b.open || b.copy_in || self.pinned;
            let same_node = route.node.as_ref().is_none_or(|n| n.index == b.conn.node);
            // Not behind a read whose wait is undecided: if it fails, that read's answer is
            // thrown away and the read runs again, and what went behind it would be lost with
            // it (a Sync behind `BEGIN READ ONLY`) or run in the block it opened.
            let compatible = want.is_none_or(|w| w == b.target)
                && same_node
                && b.retry.is_none()
                && b.discard.is_none()
                && b.verdict.is_none();
            if !compatible
                && want == Some(Target::Primary)
                && self.may_leave_open_replica_batch(&flight)
            {
                if self.settle_unsynced().await? {
                    // The server skips to the client's Sync: so does this flight, there.
                    break;
                }
                // What the client sent on the replica were reads, answered now: its batch ends
                // here, with the proxy's Sync, and the flight opens a new one on the primary.
                let attached = self.backend.as_mut().expect("checked");
                attached.expect.push_back(Owner::Proxy(Duty::Prepare));
                attached.open = false;
                attached.unsynced_due = 0;
                attached.unsynced_executed = None;
                if let Err(e) = attached
                    .conn
                    .send(&[FrontendMessage::Sync.to_frame()])
                    .await
                {
                    return self.backend_lost(e).await;
                }
                continue;
            }
            if self.hear_first(b, &flight, want, compatible, in_block) {
                self.drain().await?;
                continue;
            }
            if in_block || compatible {
                break;
            }
            if b.awaiting_replies() {
                self.drain().await?;
                continue;
            }
            self.release_backend();
        }
        if self.backend.is_none()
            && let Err(e) = self
                .attach(want.unwrap_or(Target::Primary), route.node.clone())
                .await
        {
            return self.no_backend(e, segment_ends(&flight)).await;
        }
        self.send_flight(flight, class, route.read).await
    }

    /// Whether the replies due on the attached connection `b` must come in before `flight` is
    /// routed (the routing loop then looks again): what they say decides where the flight goes,
    /// or what must go in front of it. Never into an extended batch the client left open, or a
    /// COPY the client has not ended: the server answers nothing more until the client goes on.
    fn hear_first(
        &self,
        b: &Attached,
        flight: &[FrontendMessage],
        want: Option<Target>,
        compatible: bool,
        in_block: bool,
    ) -> bool {
        if b.expect.is_empty() || b.open {
            return false;
        }
        // The read-back behind a Query that may have reset a setting, and the startup values it
        // may apply again, go before this flight (`Session::on_resync`). Behind a COPY the
        // client ended whose answer is still to come (`copy_in`) too: a flight sent there made
        // the Query's ReadyForQuery not the last due, and the read-back was never sent (seed
        // 777188, under load).
        if b.reset_in_doubt && b.may_add_frames() {
            return true;
        }
        if b.copy_in {
            return false;
        }
        // A write behind a read-only block on a replica whose end (COMMIT, ROLLBACK) is still
        // unanswered: the status the block is judged by is the last one heard. Once the answers
        // are in, an ended block lets the write go to the primary; inside a block still open it
        // fails on the replica as PostgreSQL fails it (25006).
        let replica_block_ending = in_block
            && !compatible
            && want == Some(Target::Primary)
            && b.target == Target::Replica
            && !self.pinned;
        // Pinned by a statement the server may have skipped (`pin_unconfirmed`): its answer
        // decides whether this flight must stay on the connection.
        let pin_in_doubt = b.pin_unconfirmed.is_some() && !compatible;
        // The shape check before the flight (`recheck_moved`) needs the connection to itself,
        // and the last reply due may hand it back to the pool: heard here, where a released
        // connection is attached anew (the flight got 08006 "no primary is reachable" there,
        // seed 111291).
        replica_block_ending || pin_in_doubt || !self.moved_statements(flight).is_empty()
    }

    /// Whether the extended batch open on the attached replica may end before `flight`, which
    /// needs the primary, instead of holding the flight there to fail with 25006 (psycopg's
    /// pipeline mode reads with a Flush, then writes before its Sync). Only outside a
    /// transaction block, where the batch's implicit transaction holds nothing but reads, and
    /// when the flight uses no portal bound before it (those live on the replica, and end with
    /// its batch).
    fn may_leave_open_replica_batch(&self, flight: &[FrontendMessage]) -> bool {
        let Some(b) = self.backend.as_ref() else {
            return false;
        };
        if !(b.open && b.target == Target::Replica && self.status == b'I')
            || b.copy_in
            || b.doomed
            || self.pinned
            // A BEGIN among the unsynced messages opened a block there (`BEGIN READ ONLY`,
            // routed to the replica): the write belongs to it, and fails there as it would.
            || b.unsynced_executed == Some(true)
        {
            return false;
        }
        let mut bound = HashSet::new();
        flight.iter().all(|m| match m {
            FrontendMessage::Bind { portal, .. } => {
                bound.insert(portal.as_str());
                true
            }
            FrontendMessage::Execute { portal, .. }
            | FrontendMessage::Describe {
                kind: b'P',
                name: portal,
            } => bound.contains(portal.as_str()),
            _ => true,
        })
    }

    /// No server connection could be had: each of the flight's `segments` gets the reason.
    pub(super) async fn no_backend(
        &mut self,
        e: anyhow::Error,
        segments: usize,
    ) -> anyhow::Result<()> {
        metrics::counter!("lsngate_proxy_errors_total", "kind" => "no_backend").increment(1);
        for _ in 0..segments.max(1) {
            self.io
                .queue(&ErrorFields::new("ERROR", "08006", e.to_string()).to_frame(b'E'));
            self.io.queue_ready(self.status);
        }
        self.io.flush().await?;
        self.end_fallback();
        Ok(())
    }

    /// Attaches an idle server connection of `node` if its pool has one right now: the
    /// pass-through's checkout, with no future and no waiting. False when [`Session::attach`]
    /// must open or wait for one.
    pub(super) fn attach_idle(&mut self, node: &NodeState) -> bool {
        let Some(conn) = self.known_pool(node).and_then(|pool| pool.checkout_idle()) else {
            return false;
        };
        self.attach_conn(conn, node);
        true
    }

    /// The pool of `node` this session already used, if any.
    fn known_pool(&self, node: &NodeState) -> Option<&Arc<crate::backend::Pool>> {
        self.pools
            .iter()
            .find(|(index, _)| *index == node.index)
            .map(|(_, pool)| pool)
    }

    /// Makes `conn`, checked out of `node`'s pool, the session's backend.
    fn attach_conn(&mut self, conn: PooledConn, node: &NodeState) {
        self.cancel_slot.lock().expect("cancel slot").target = Some(Arc::clone(&conn.cancel));
        let serves = if node.role() == Role::Replica {
            Target::Replica
        } else {
            Target::Primary
        };
        let expect = std::mem::take(&mut self.spare_expect);
        self.backend = Some(Attached::new(conn, serves, expect));
    }

    pub(super) async fn attach(
        &mut self,
        target: Target,
        chosen: Option<Arc<NodeState>>,
    ) -> anyhow::Result<()> {
        let config = Arc::clone(&self.config);
        let mut target = target;
        let mut chosen = chosen;
        loop {
            let node = match chosen.take() {
                Some(node) => node,
                None => self
                    .proxy
                    .nodes
                    .pick(target)
                    .ok_or_else(|| anyhow::anyhow!(no_primary()))?,
            };
            let pool = match self.known_pool(&node) {
                Some(pool) => Arc::clone(pool),
                None => {
                    let pool = node.pool(
                        &self.database,
                        self.server_login.as_ref(),
                        config.pool_limits(),
                    );
                    self.pools.push((node.index, Arc::clone(&pool)));
                    pool
                }
            };
            match pool
                .acquire(
                    &node.url,
                    self.server_login.as_ref(),
                    config.acquire_timeout,
                    config.connect_timeout,
                )
                .await
            {
                Ok(conn) => {
                    self.attach_conn(conn, &node);
                    return Ok(());
                }
                Err(crate::backend::PoolError::Backend(e))
                    if node.role() == Role::Replica && e.server_unavailable() =>
                {
                    // Nothing of the client's was sent on a connection that never opened (refused,
                    // reset during login, the server starting up or out of slots): trying
                    // elsewhere is safe. The monitor brings the replica back later. (Refused
                    // credentials are the client's problem on every server: they are reported.)
                    tracing::warn!(node = %node.url.address(), "cannot open a connection to this replica, skipping it: {e}");
                    node.set_health(None, Some(e.to_string()));
                    target = Target::Replica;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub(super) fn release_backend(&mut self) {
        // Released where it lies: the attachment is dropped in place, not moved out first.
        let Some(attached) = self.backend.as_mut() else {
            return;
        };
        self.cancel_slot.lock().expect("cancel slot").target = None;
        if attached.expect.is_empty() {
            std::mem::swap(&mut self.spare_expect, &mut attached.expect);
        }
        attached.conn.release();
        self.backend = None;
    }

    pub(super) fn maybe_release(&mut self) {
        let idle = self
            .backend
            .as_ref()
            .is_some_and(|b| !b.awaiting_replies() && b.retry.is_none() && b.discard.is_none());
        if idle && self.status == b'I' && !self.pinned {
            self.release_backend();
        }
    }

    /// Proxy frames that make the attached backend ready for this flight: the client's settings
    /// and the prepared statements the flight uses.
    fn preparation(&mut self, flight: &[FrontendMessage]) -> Vec<Frame> {
        let attached = self.backend.as_mut().expect("attached before send");
        // The server is in the middle of an extended batch or a COPY: nothing can go in front.
        let may_inject = attached.may_add_frames();
        let conn = &mut attached.conn;
        let mut frames = Vec::new();
        if may_inject {
            let differs = self.settings != conn.applied;
            if let Some(sql) = settings_sql(&self.settings, &conn.applied).filter(|_| differs) {
                frames.push(FrontendMessage::Query(sql).to_frame());
                conn.applied = self.settings.clone();
                // A simple Query drops the unnamed statement.
                conn.unnamed = None;
                attached.expect.push_back(Owner::Proxy(Duty::Prepare));
            }
        }
        let mut statements = Vec::new();
        // The client's unnamed statement before the flight (a Parse in it replaced it since).
        let unnamed_before = match self.log.before.iter().find(|(n, _)| n.is_empty()) {
            Some((_, s)) => s.as_ref(),
            None => self.unnamed.as_ref(),
        };
        statements.extend(unnamed_preparation(
            conn,
            unnamed_before,
            flight,
            may_inject,
        ));
        // Names whose state on the server the flight itself decides from some message on (it
        // parses, closes or uses them there): nothing goes in front for them after that.
        let mut defined_here = HashSet::new();
        if may_inject {
            for name in &self.closing {
                // Names the client deallocated, as this connection may still hold them.
                if conn.prepared.remove(name).is_some() {
                    statements.push(close_statement(name));
                }
            }
        }
        let (at, after_deallocate) = super::pipeline::statements_at(
            &self.statements,
            self.unnamed.as_ref(),
            &self.log,
            flight,
        );
        // The client's statement `s` must be on the server under `name` when the flight starts.
        let ensure = |conn: &mut BackendConn,
                      statements: &mut Vec<Frame>,
                      name: &String,
                      s: &ClientStatement| {
            if conn.prepared.get(name).map(String::as_str) != Some(s.identity()) {
                statements.push(close_statement(name));
                let parse = FrontendMessage::Parse {
                    statement: name.clone(),
                    query: s.query.clone(),
                    param_types: s.param_types.clone(),
                };
                statements.push(parse.to_frame());
                conn.prepared.insert(name.clone(), s.identity().to_string());
            }
        };
        // Parses, Closes and DEALLOCATE ALLs of earlier flights not answered yet run on this same
        // connection first (a flight goes elsewhere only once every answer is in): for their
        // names, or every name behind a DEALLOCATE ALL, the server's own state decides, and
        // nothing goes in front.
        let mut server_decides = false;
        for u in &attached.unconfirmed {
            server_decides |= u.answer == b'C';
            defined_here.extend(u.effects.iter().map(|e| e.name.clone()));
        }
        let mut segment = attached.segments_sent;
        let unconfirmed = &mut attached.unconfirmed;
        let mut note = |segment: u64, answer: u8, effects: Vec<Effect>| {
            unconfirmed.push_back(Unconfirmed {
                segment,
                answer,
                effects,
            });
        };
        for (position, (m, here)) in flight.iter().zip(&at).enumerate() {
            match m {
                FrontendMessage::Sync
                | FrontendMessage::Query(_)
                | FrontendMessage::FunctionCall(_) => segment += 1,
                FrontendMessage::Parse { statement, .. } if statement.is_empty() => {
                    note(segment, b'1', Vec::new())
                }
                FrontendMessage::Close { kind, name } if *kind != b'S' || name.is_empty() => {
                    note(segment, b'3', Vec::new())
                }
                _ => {}
            }
            match (m, *here) {
                (FrontendMessage::Parse { statement, .. }, At::Duplicate(s))
                    if !statement.is_empty() =>
                {
                    note(segment, b'1', Vec::new());
                    // The client already holds the name here: the server must too, to refuse
                    // the Parse (42P05) as it would directly. It keeps what it held.
                    let first = defined_here.insert(statement.clone()) && !server_decides;
                    if may_inject && first {
                        ensure(conn, &mut statements, statement, s);
                    }
                }
                (
                    FrontendMessage::Parse {
                        statement,
                        query,
                        param_types,
                    },
                    _,
                ) if !statement.is_empty() => {
                    // The client does not hold the name here: a copy the server has (another
                    // client's, or one the client closed elsewhere) is closed in front. One
                    // the flight itself closed or deallocated earlier is gone by then.
                    let mut held_before = conn.prepared.get(statement).cloned();
                    if defined_here.insert(statement.clone())
                        && !server_decides
                        && may_inject
                        && held_before.is_some()
                    {
                        statements.push(close_statement(statement));
                        held_before = None;
                    }
                    let identity = super::session::statement_identity(param_types, query);
                    conn.prepared.insert(statement.clone(), identity.clone());
                    note(
                        segment,
                        b'1',
                        vec![Effect {
                            name: statement.clone(),
                            view_before: None,
                            view_after: Some(identity.clone()),
                            held_before,
                            held_after: Some(identity),
                        }],
                    );
                }
                (
                    FrontendMessage::Bind { statement, .. }
                    | FrontendMessage::Describe {
                        kind: b'S',
                        name: statement,
                    },
                    here,
                ) if !statement.is_empty() && defined_here.insert(statement.clone()) => {
                    if !may_inject || server_decides {
                        continue;
                    }
                    match here.statement() {
                        Some(s) => ensure(conn, &mut statements, statement, s),
                        // Not the client's here: a copy left by another client or before a
                        // DEALLOCATE is closed, so the server answers 26000 as it would
                        // directly.
                        None => {
                            if !crate::causal::sql::is_proxy_statement(statement)
                                && conn.prepared.remove(statement).is_some()
                            {
                                statements.push(close_statement(statement));
                            }
                        }
                    }
                }
                (FrontendMessage::Close { kind: b'S', name }, here) if !name.is_empty() => {
                    let held_before = conn.prepared.remove(name);
                    defined_here.insert(name.clone());
                    note(
                        segment,
                        b'3',
                        vec![Effect {
                            name: name.clone(),
                            view_before: here.statement().cloned(),
                            view_after: None,
                            held_before,
                            held_after: None,
                        }],
                    );
                }
                (FrontendMessage::Execute { .. }, At::DeallocateAll) => {
                    // What the client held just before it, restored if the server skips it.
                    let held = super::pipeline::held_after(
                        &self.statements,
                        &self.log,
                        &flight[..position],
                    );
                    note(segment, b'C', all_dropped(held));
                    all_in_doubt(conn);
                    if !may_inject {
                        continue;
                    }
                    let names: Vec<String> = self.statements.keys().cloned().collect();
                    defined_here.extend(names);
                }
                _ => {}
            }
        }
        let deallocated = after_deallocate.is_some();
        if let Some(after) = after_deallocate {
            // What the client holds after a DEALLOCATE ALL that ran in the flight: the names
            // parsed after it, nothing else.
            let kept: HashMap<String, ClientStatement> = after
                .into_iter()
                .map(|(name, s)| (name, s.clone()))
                .collect();
            self.statements = kept;
        }
        if may_inject && !attached.foreign_closed && !server_decides && !deallocated {
            // The first flight of a connection lent to this client that can add frames: the
            // statements other clients left under names the client does not hold (or holds as
            // another statement) go, so a Parse of the name later, even inside a batch the client
            // opened where nothing can go in front, finds none (a direct connection has none).
            // The client's own, under the same text, stay for it to use.
            attached.foreign_closed = true;
            let foreign: Vec<String> = conn
                .prepared
                .iter()
                .filter(|(name, identity)| {
                    !defined_here.contains(*name)
                        && !crate::causal::sql::is_proxy_statement(name)
                        && self.statements.get(*name).map(ClientStatement::identity)
                            != Some(identity.as_str())
                })
                .map(|(name, _)| name.clone())
                .collect();
            for name in foreign {
                conn.prepared.remove(&name);
                statements.push(close_statement(&name));
            }
        }
        if may_inject && conn.prepared.len() > MAX_PREPARED_PER_CONNECTION {
            // Statements of many clients and many evictions pile up on a pooled connection:
            // beyond the cap every one this flight does not use is closed (each is parsed
            // again where a client needs it).
            let keep = |name: &String| {
                defined_here.contains(name) || crate::causal::sql::is_proxy_statement(name)
            };
            let closed: Vec<String> = conn.prepared.keys().filter(|n| !keep(n)).cloned().collect();
            for name in closed {
                conn.prepared.remove(&name);
                statements.push(close_statement(&name));
            }
        }
        if !statements.is_empty() {
            frames.extend(statements);
            frames.push(FrontendMessage::Sync.to_frame());
            attached.expect.push_back(Owner::Proxy(Duty::Prepare));
        }
        if closes_unnamed(flight) {
            self.unnamed = None;
        }
        frames
    }

    /// The statements a flight runs that change session state (SET, RESET, DISCARD, DEALLOCATE,
    /// LISTEN, ...): a simple Query's text, or the statement behind each portal an
    /// extended-protocol flight executes (drivers send `SET` that way as often as not).
    fn session_effects(
        &self,
        flight: &[FrontendMessage],
        class: Option<Class>,
    ) -> Vec<(Class, String)> {
        let changes_state = |c: Class| matches!(c, Class::Pin | Class::SessionState);
        if let [FrontendMessage::Query(sql)] = flight {
            return match class {
                Some(c) if changes_state(c) => vec![(c, sql.clone())],
                // Classified by its other statements, but its SET applies all the same; with a
                // `;` in it, it is recorded as not understood (read back afterwards).
                _ if crate::statement::sets_session_in_parts(sql.as_bytes()) => {
                    vec![(Class::SessionState, sql.clone())]
                }
                _ => Vec::new(),
            };
        }
        let mut portals = HashMap::new();
        let mut effects = Vec::new();
        for (m, statement) in flight.iter().zip(self.statement_per_message(flight)) {
            match m {
                FrontendMessage::Bind { portal, .. } => {
                    portals.insert(portal.as_str(), statement);
                }
                FrontendMessage::Execute { portal, .. } => {
                    if let Some(Some(s)) = portals.get(portal.as_str())
                        && changes_state(s.class)
                    {
                        effects.push((s.class, s.query.clone()));
                    }
                }
                _ => {}
            }
        }
        effects
    }

    /// Whether the flight executes a portal after its last Sync (or Query): `None` when it does
    /// not, else whether one of those Executes runs a BEGIN.
    fn executed_after_last_sync(&self, flight: &[FrontendMessage]) -> Option<bool> {
        let ends = |m: &FrontendMessage| {
            matches!(
                m,
                FrontendMessage::Sync
                    | FrontendMessage::Query(_)
                    | FrontendMessage::FunctionCall(_)
            )
        };
        let tail = flight.iter().rposition(ends).map_or(0, |i| i + 1);
        let statements = self.statement_per_message(flight);
        let mut portals = HashMap::new();
        let mut executed = None;
        for (m, statement) in flight.iter().zip(statements).skip(tail) {
            match m {
                FrontendMessage::Bind { portal, .. } => {
                    portals.insert(portal.as_str(), statement);
                }
                FrontendMessage::Execute { portal, .. } => {
                    let begins = portals
                        .get(portal.as_str())
                        .copied()
                        .flatten()
                        .is_some_and(|s| matches!(s.class, Class::Begin { .. }));
                    executed = Some(begins || executed.unwrap_or(false));
                }
                _ => {}
            }
        }
        executed
    }

    /// Tracks the session-level effects of a flight (see [`Session::session_effects`]). True
    /// when a change of settings may yet be undone or was not understood: a SET inside a
    /// transaction block (a ROLLBACK undoes it), in a pipeline or a multi-statement string (a
    /// later error undoes it), or one the proxy cannot parse. The server's settings are then
    /// read back when the transaction is over ([`Duty::Resync`], sent at the ReadyForQuery that
    /// says idle). `SET LOCAL`, `SET TRANSACTION` and `SET CONSTRAINTS` are not session state
    /// (`Class::TransactionLocal`).
    fn note_session_effects(&mut self, flight: &[FrontendMessage], class: Option<Class>) -> bool {
        let effects = self.session_effects(flight, class);
        let executes = flight
            .iter()
            .filter(|m| matches!(m, FrontendMessage::Execute { .. }))
            .count();
        let alone = self.status == b'I' && effects.len() == 1 && executes <= 1;
        let mut doubt = false;
        let simple = matches!(flight, [FrontendMessage::Query(_)]);
        let pin_settled = self.pinned
            && self
                .backend
                .as_ref()
                .is_some_and(|b| b.pin_unconfirmed.is_none());
        let pins = effects.iter().any(|(class, _)| *class == Class::Pin);
        for (class, sql) in effects {
            if let Some(understood) = self.note_session_effect(class, &sql, simple) {
                doubt |= class == Class::SessionState && !(understood && alone);
                if class == Class::SessionState {
                    // Recorded before the server ran it: an error in its segment (its own, or
                    // one that made the server skip it) puts the settings in doubt.
                    self.backend.as_mut().expect("attached").effects_due = true;
                }
            }
        }
        if pins && !pin_settled {
            // Until one of them is confirmed, the pin lasts to the last segment of the latest
            // flight that sent a pinning statement (an earlier one the server skipped must not
            // undo the pin of a later one that ran, seeds 777336 then 777338). The flight's last
            // segment is the one still open when it ends in Flush.
            let attached = self.backend.as_mut().expect("attached");
            let ends = segment_ends(flight) as u64;
            let open_tail = !matches!(
                flight.last(),
                Some(
                    FrontendMessage::Sync
                        | FrontendMessage::Query(_)
                        | FrontendMessage::FunctionCall(_)
                )
            );
            let last = attached.segments_sent + ends + u64::from(open_tail);
            attached.pin_unconfirmed = Some(last.saturating_sub(1));
        }
        doubt
    }

    /// Records one statement's effect: `Some(false)` when it is not understood (the server's
    /// settings are then read back), `None` when nothing outlives the transaction.
    /// `simple`: the statement is a simple Query's (an extended flight's are in `preparation`,
    /// which knows their place in the flight).
    fn note_session_effect(&mut self, class: Class, sql: &str, simple: bool) -> Option<bool> {
        let lower = sql.trim().trim_end_matches(';').trim().to_ascii_lowercase();
        let conn = &mut self.backend.as_mut().expect("attached").conn;
        match class {
            Class::Pin => self.pinned = true,
            Class::SessionState if lower.contains(';') => return Some(false),
            Class::SessionState => {
                if let Some((name, _)) = setting_reset(sql) {
                    // Sent as it is (one sent as the startup value's SET is recorded as that
                    // SET): the server went back to its own login's value. A direct connection
                    // goes back to the client's startup value, which the next flight's
                    // preparation applies again.
                    conn.applied.remove(&name);
                    match self.startup_settings.get(&name) {
                        Some(statement) => {
                            self.settings.insert(name, statement.clone());
                        }
                        None => {
                            self.settings.remove(&name);
                        }
                    }
                } else if let Some((name, value)) = session_set(sql) {
                    let statement = format!("SET {name} = {value}");
                    conn.applied.insert(name.clone(), statement.clone());
                    self.settings.insert(name, statement);
                } else if lower == "reset all" || lower == "discard all" {
                    // A direct connection returns to the values the client logged in with; the
                    // server connection returns to its own login's, so the startup settings are
                    // applied again right behind (`restore_due`, before the client hears the
                    // statement is done, so it is told of no value it never had).
                    self.settings = self.startup_settings.clone();
                    conn.applied.clear();
                    self.restore_due = !self.settings.is_empty();
                    if lower == "discard all" && simple {
                        self.drop_all_unconfirmed();
                    } else if lower == "discard all" {
                        self.statements.clear();
                        conn.prepared.clear();
                    }
                } else if lower == "deallocate all" || lower == "deallocate prepare all" {
                    if simple {
                        self.drop_all_unconfirmed();
                    }
                } else {
                    return Some(lower.starts_with("deallocate") || lower.starts_with("discard"));
                }
            }
            _ => {}
        }
        Some(true)
    }

    /// A simple Query's `DEALLOCATE ALL` or `DISCARD ALL`, about to be sent: the client's
    /// statements leave its view now, and come back if the server refuses it (25P02 in an
    /// aborted block, 25001 for `DISCARD ALL` in any block) or skips it, which only the missing
    /// CommandComplete tells (`replies.rs`).
    fn drop_all_unconfirmed(&mut self) {
        let held = std::mem::take(&mut self.statements);
        let attached = self.backend.as_mut().expect("attached");
        attached.unconfirmed.push_back(Unconfirmed {
            segment: attached.segments_sent,
            answer: b'C',
            effects: all_dropped(held),
        });
        all_in_doubt(&mut attached.conn);
    }

    /// The server's session settings, read back ([`Duty::Resync`]) once the client's
    /// transaction is over; `status` is the server's status after the read. Read outside a
    /// transaction block they are the client's settings from now on; a failed read leaves them
    /// in doubt for the next transaction's end.
    ///
    /// A startup setting the server has no session value for was returned to the server login's
    /// value (a RESET, `RESET ALL` or `SET ... TO DEFAULT` the proxy could not send as the
    /// startup value's SET, such as one among the statements of a Query): a direct connection
    /// would be back at the client's startup value, so that is the client's setting. Returns
    /// those settings, to apply again ([`Session::restore_settings`]). Read inside a transaction
    /// block (behind such a Query there, `client_ready`), only that comes of it: SET is undone by
    /// a ROLLBACK just as the client's RESET is, and the read at the block's end settles the
    /// settings.
    pub(super) fn on_resync(&mut self, status: u8) -> Option<Settings> {
        let attached = self.backend.as_mut().expect("attached");
        attached.reset_in_doubt = false;
        let rows = std::mem::take(&mut attached.resync_rows);
        if std::mem::take(&mut attached.resync_failed) || !matches!(status, b'I' | b'T') {
            return None;
        }
        let settings: Settings = rows
            .into_iter()
            .filter_map(|row| match row.as_slice() {
                [Some(name), Some(value)] => {
                    let name = name.to_ascii_lowercase();
                    let statement = super::session::set_config_statement(&name, value);
                    Some((name, statement))
                }
                _ => None,
            })
            .collect();
        let missing: Settings = self
            .startup_settings
            .iter()
            .filter(|(name, _)| !settings.contains_key(name))
            .map(|(name, statement)| (name.clone(), statement.clone()))
            .collect();
        if status == b'I' {
            let mut wanted = settings.clone();
            for (name, statement) in &missing {
                wanted.insert(name.clone(), statement.clone());
            }
            attached.conn.applied = settings;
            self.settings = wanted;
            self.settings_in_doubt = false;
        }
        (!missing.is_empty()).then_some(missing)
    }

    /// After an error the proxy answered itself inside a transaction block (a proxy command
    /// that failed): a direct connection's block would now be failed, refusing every statement
    /// up to ROLLBACK. So the server's block is made to fail too, with a statement whose replies
    /// the proxy keeps, and the client's status is `E`. False (nothing done) where no server
    /// connection holds the block, or it is inside a batch or a COPY.
    pub(super) async fn abort_server_block(&mut self) -> anyhow::Result<bool> {
        let Some(attached) = self.backend.as_mut() else {
            return Ok(false);
        };
        if self.status != b'T' || !attached.may_add_frames() || attached.copy_in {
            return Ok(false);
        }
        self.status = b'E';
        if let Err(e) = attached
            .send_query(ABORT_SQL, Owner::Proxy(Duty::Abort))
            .await
        {
            self.backend_lost(e).await?;
        }
        Ok(true)
    }

    /// Applies `missing` (startup settings, see [`Session::on_resync`]) at once, behind the
    /// read-back that found them missing and before the client hears its ReadyForQuery (held
    /// while this segment trails), so it is told of no value it never had. Where the client's
    /// next flight is already on the server (or the server is inside a batch or a COPY), the
    /// connection's books say they are not applied, and that flight's preparation applies them.
    pub(super) async fn restore_settings(&mut self, missing: Settings) -> anyhow::Result<()> {
        let attached = self.backend.as_mut().expect("attached");
        if attached.client_segments_due() > 0 || !attached.may_add_frames() {
            return Ok(());
        }
        let Some(sql) = settings_sql(&missing, &Settings::new()) else {
            return Ok(());
        };
        if self.status == b'I' {
            // In a transaction block the books stay as they were until its end's read-back.
            for (name, statement) in &missing {
                attached
                    .conn
                    .applied
                    .insert(name.clone(), statement.clone());
            }
        }
        if let Err(e) = attached.send_query(&sql, Owner::Proxy(Duty::Restore)).await {
            return self.backend_lost(e).await;
        }
        Ok(())
    }

    async fn send_flight(
        &mut self,
        flight: Vec<FrontendMessage>,
        class: Option<Class>,
        read: Option<CausalRead>,
    ) -> anyhow::Result<()> {
        let synced = matches!(
            flight.last(),
            Some(
                FrontendMessage::Sync
                    | FrontendMessage::Query(_)
                    | FrontendMessage::FunctionCall(_)
            )
        );
        let attached = self.backend.as_ref().expect("attached before send");
        let needs_verdict = attached.target == Target::Replica
            && read.as_ref().and_then(|r| r.floor).is_some_and(|floor| {
                let facts = &attached.conn.facts;
                facts.server.is_empty()
                    || self
                        .proxy
                        .causal
                        .watcher
                        .replayed(&facts.server)
                        .is_none_or(|r| r < floor.lsn)
            });
        let mut needs_verdict = needs_verdict;
        if needs_verdict && !synced && !attached.awaiting_replies() {
            // A flight ending in Flush cannot be discarded and re-run after a failed wait: wait
            // first, in a round trip of its own, and send it only where the floor is.
            let floor = read.as_ref().and_then(|r| r.floor).expect("checked");
            let started = tokio::time::Instant::now();
            let deadline = started + self.config.causal.wait_timeout;
            let settled = self.settle_floor(floor, deadline).await;
            self.proxy.causal.stats.record_wait(started.elapsed());
            if settled != super::causal::Settled::Passed {
                self.proxy.causal.record(crate::causal::Outcome::Fallback);
                self.release_backend();
                let route = Route::to(Some(Target::Primary));
                return Box::pin(self.dispatch_to(flight, class, route)).await;
            }
            self.proxy.causal.record(crate::causal::Outcome::Waited);
            needs_verdict = false;
        } else if read.as_ref().is_some_and(|r| r.floor.is_some()) && !needs_verdict {
            // The server this connection reached already has the floor: no wait.
            self.proxy.causal.record(crate::causal::Outcome::Replica);
        }
        let attached = self.backend.as_ref().expect("attached before send");
        if !attached.open
            && !attached.copy_in
            && let Some(lost) = self.recheck_moved(&flight).await?
        {
            self.backend = None;
            return self.no_backend(lost.into(), segment_ends(&flight)).await;
        }
        if self.backend.is_none() {
            return self
                .no_backend(anyhow::anyhow!(no_primary()), segment_ends(&flight))
                .await;
        }
        self.expect_shapes(&flight);
        // Rebuilt only when some statement of the client's changed shape (see `shapes.rs`).
        let client_frames = self.plans_changed.then(|| {
            flight
                .iter()
                .map(|m| self.client_frame(m))
                .collect::<Vec<_>>()
        });
        // What was held behind a COPY this flight shows is over goes first (see `copy.rs`).
        let attached = self.backend.as_mut().expect("attached before send");
        let mut frames = attached.copy.before_flight(&flight);
        frames.extend(self.preparation(&flight));
        let executed = self.executed_after_last_sync(&flight);
        if self.note_session_effects(&flight, class) {
            self.settings_in_doubt = true;
        }
        if let [FrontendMessage::Query(sql)] = flight.as_slice()
            && crate::statement::may_reset_in_parts(sql.as_bytes())
        {
            self.backend.as_mut().expect("attached").reset_in_doubt = true;
        }
        let (unnamed, statements) = (&self.unnamed, &self.statements);
        let attached = self.backend.as_mut().expect("attached before send");
        let copy_start = attached.copy.copy_start(&flight, |name| {
            let s = if name.is_empty() {
                unnamed.as_ref()
            } else {
                statements.get(name)
            };
            s.map(|s| s.query.as_str())
        });
        let retry_allowed = self.config.retry_buffer_size > 0;
        let status = self.status;
        let tracks = self.floors.mode.tracks_positions();
        let fast = self.floors.mode.fast;
        let budget = self.config.causal.wait_timeout;
        let ends = segment_ends(&flight);
        if self.resets_parsed {
            let mut portals = std::mem::take(&mut self.reset_portals);
            let tags = reset_tags(&flight, &self.statement_per_message(&flight), &mut portals);
            self.reset_portals = portals;
            let attached = self.backend.as_mut().expect("attached before send");
            if attached.reset_tags.is_empty() && tags.contains(&Some(true)) {
                // The answers of the client's segments already under way come first.
                let due = attached.client_segments_due();
                attached.reset_tags.extend(std::iter::repeat_n(None, due));
                attached.reset_tags.extend(tags);
            } else if !attached.reset_tags.is_empty() {
                attached.reset_tags.extend(tags);
            }
        }
        let attached = self.backend.as_mut().expect("attached before send");
        self.proxy.queries[usize::from(attached.target == Target::Replica)].add(ends.max(1) as u64);
        let standalone_read = matches!(class, Some(Class::Read)) && ends == 1 && status == b'I';
        if retry_allowed
            && standalone_read
            && attached.target == Target::Replica
            && attached.expect.iter().all(|o| matches!(o, Owner::Proxy(_)))
        {
            attached.retry = Some(RetryBuffer {
                flight: flight.clone(),
                class,
                frames: Vec::new(),
                bytes: 0,
                read_only_violation: false,
            });
        }
        if needs_verdict && let Some(floor) = read.as_ref().and_then(|r| r.floor) {
            let facts = &attached.conn.facts;
            {
                let wait = facts.has_wait_for() && !fast;
                if wait {
                    frames.extend(wait_for(floor.lsn, budget));
                } else {
                    frames.extend(probe_segment(Probe::Replay, &mut attached.conn.prepared));
                }
                attached.expect.push_back(Owner::Proxy(Duty::Verdict));
                attached.verdict = Some(PendingVerdict::new(floor, wait, budget));
            }
        }
        match client_frames {
            Some(rebuilt) => frames.extend(rebuilt),
            None => frames.extend(flight.iter().map(FrontendMessage::to_frame)),
        }
        if let Some(start) = copy_start {
            let clients_due = attached.client_segments_due();
            attached.copy.started_by(&flight, start, clients_due);
        }
        attached
            .expect
            .extend(std::iter::repeat_n(Owner::Client, ends));
        attached.segments_sent += ends as u64;
        match flight.last() {
            Some(FrontendMessage::Flush) => {
                let ended = flight.iter().any(|m| {
                    matches!(
                        m,
                        FrontendMessage::Sync
                            | FrontendMessage::Query(_)
                            | FrontendMessage::FunctionCall(_)
                    )
                });
                if ended || !attached.open {
                    attached.unsynced_due = 0;
                    attached.skipping = false;
                    attached.unsynced_executed = None;
                }
                let tail = unsynced_tail(&flight).unwrap_or(0);
                attached.unsynced_due += tail;
                if let Some(begun) = executed {
                    attached.unsynced_executed =
                        Some(begun || attached.unsynced_executed.unwrap_or(false));
                }
                // A Flush with no extended message behind the last Sync or Query (a bare one)
                // leaves the server with nothing to sync: no batch is open on it.
                attached.open = tail > 0 || (attached.open && !ended);
            }
            // A simple Query also ends an unsynced extended batch (asyncpg sends Parse/Describe/
            // Flush, then a Query); the session sends none while the server skips to a Sync.
            Some(FrontendMessage::Sync | FrontendMessage::Query(_)) => {
                attached.open = false;
                attached.unsynced_due = 0;
                attached.skipping = false;
                attached.unsynced_executed = None;
            }
            _ => {}
        }
        if std::mem::take(&mut self.restore_due)
            && attached.may_add_frames()
            && copy_start.is_none()
            && let Some(sql) = settings_sql(&self.settings, &attached.conn.applied)
        {
            frames.push(FrontendMessage::Query(sql).to_frame());
            attached.conn.applied = self.settings.clone();
            attached.conn.unnamed = None;
            attached.expect.push_back(Owner::Proxy(Duty::Restore));
        }
        // An extended COPY's batch goes on past its Execute's Sync (ignored in COPY mode) to a
        // Sync the client sends after CopyDone.
        let batch_goes_on = attached.open || (attached.copy.closed && attached.copy.extended);
        if tracks && batch_goes_on {
            // Its transaction ends, and its position can be taken, behind a later flight's Sync.
            attached.position_owed |= status == b'I'
                && attached.target == Target::Primary
                && class == Some(Class::Write)
                && (copy_start.is_some()
                    || flight
                        .iter()
                        .any(|m| matches!(m, FrontendMessage::Execute { .. })));
        } else if tracks && synced {
            let ends_block = status != b'I' && class == Some(Class::TransactionControl);
            // Not while a COPY may still be running: its data is still to come.
            let owed = !attached.copy.closed && std::mem::take(&mut attached.position_owed);
            let probe = match attached.target {
                Target::Replica if standalone_read || ends_block || read.is_some() => {
                    attached.expect.push_back(Owner::Proxy(Duty::Served));
                    Some(probe_segment(Probe::Replay, &mut attached.conn.prepared))
                }
                Target::Primary
                    if ends_block
                        || owed
                        || (status == b'I'
                            && matches!(class, Some(Class::Read | Class::Write))) =>
                {
                    let wrote = ends_block || owed || class == Some(Class::Write);
                    attached
                        .expect
                        .push_back(Owner::Proxy(Duty::Position { wrote }));
                    Some(probe_segment(Probe::Position, &mut attached.conn.prepared))
                }
                _ => None,
            };
            match probe {
                // Behind a COPY the server would read it as COPY data: it waits for the COPY's
                // end, its replies queued where they will come.
                Some(probe) if attached.copy.closed => attached.copy.deferred.extend(probe),
                Some(probe) => frames.extend(probe),
                None => {}
            }
        }
        attached.read = read;
        if let Some(tag) = self.reset_rewritten.take() {
            attached.reset_rewritten = Some(tag);
        }
        attached.may_commit |= status == b'I'
            || !matches!(
                class,
                Some(
                    Class::Read
                        | Class::Write
                        | Class::SessionState
                        | Class::TransactionLocal
                        | Class::Begin { .. }
                )
            );
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
    fn settings_sql_sets_what_differs_and_resets_leftovers() {
        let wanted = Settings::from([(
            "application_name".to_string(),
            "SET application_name = 'app'".to_string(),
        )]);
        let applied =
            Settings::from([("search_path".to_string(), "SET search_path = x".to_string())]);
        assert_eq!(
            settings_sql(&wanted, &applied).unwrap(),
            "SET application_name = 'app';RESET search_path;"
        );
        assert_eq!(settings_sql(&wanted, &wanted), None);
    }

    #[test]
    fn closes_unnamed_looks_at_the_last_parse_or_close_of_it() {
        let parse = FrontendMessage::Parse {
            statement: String::new(),
            query: "SELECT 1".into(),
            param_types: vec![],
        };
        let close = |name: &str| FrontendMessage::Close {
            kind: b'S',
            name: name.into(),
        };
        let sync = FrontendMessage::Sync;
        assert!(closes_unnamed(&[parse.clone(), close(""), sync.clone()]));
        assert!(!closes_unnamed(&[close(""), parse, sync.clone()]));
        assert!(!closes_unnamed(&[close("s1"), sync]));
    }

    #[test]
    fn segment_ends_counts_syncs_and_queries() {
        let flight = vec![
            FrontendMessage::Sync,
            FrontendMessage::Query("x".into()),
            FrontendMessage::Flush,
        ];
        assert_eq!(segment_ends(&flight), 2);
    }
}
