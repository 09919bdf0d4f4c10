//! Flights: what the session sends to a backend in one write, and how the replies come back.
//! A flight is a list of segments, each ending in Sync or a Query, owned either by the client or
//! by the proxy. Proxy segments (settings a fresh backend must carry, prepared statements it
//! lacks) ride in front of the client's messages in the same write, and their replies never
//! reach the client — the same mechanism causal reads will use to put a wait in front of a read.
//! Replies of a replica read outside a transaction are held back (up to `retry_buffer_size`) so
//! a 25006 "read-only transaction" error can be re-run on the primary without the client seeing it.

use std::sync::Arc;

use super::attached::{Attached, Batch, Duty, Owner, RetryBuffer};
use super::causal::{CausalRead, PendingVerdict, PlacedRead, ReadWait};
use super::effects::reset_tags;
use super::error::{ClientError, NoBackend};
use super::pipeline::{At, FlightLog, statements_at};
use super::preparation::{ClientView, closes_unnamed, preparation, settings_sql};
use super::session::Session;
use crate::backend::{NodeState, PooledConn, Role, Target};
use crate::causal::sql::{Probe, wait_for};
use crate::causal::{Floor, Outcome};
use crate::net::backend::TxStatus;
use crate::net::sqlstate;
use crate::net::{ErrorFields, FrontendMessage};
use crate::statement::{Class, RouteHint};

/// Where a flight should go.
#[derive(Debug, Default)]
pub struct Route {
    /// Primary or replica; `None` = wherever the session already is.
    pub target: Option<Target>,
    /// A specific replica chosen by the causal planner.
    pub node: Option<Arc<NodeState>>,
    /// The causal read this flight is, when placed by the causal planner.
    pub read: Option<PlacedRead>,
    /// How the read ended, counted when the flight is sent (a read routed by floor is counted
    /// by its wait instead).
    pub count: Option<Outcome>,
    /// A read planned to stay on the session's connection (inside a block, a COPY, a pin): what
    /// it was planned with, to plan it again if the replies heard before it is sent end that
    /// state and the connection is let go (see `Session::dispatch_to`).
    pub replan: Option<Replan>,
    /// A flight run again (after a failed wait, a lost replica, a write refused with 25006):
    /// how the client's statements stood before it. Its messages are read against this, not
    /// against the messages received since (see [`FlightLog::under`]).
    pub log: Option<Box<FlightLog>>,
}

/// What [`Session::dispatch`] planned a flight with.
#[derive(Debug, Clone, Copy)]
pub struct Replan {
    /// The statement's route hint.
    pub hint: Option<RouteHint>,
    /// The floor the statement itself names (`lsngate.min_lsn`).
    pub statement_floor: Option<Floor>,
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

/// How many answers the messages after a flight's last Sync (or Query) are due, and how many of
/// them are Executes', when it ends unsynced (with Flush); `None` when it ends synced.
fn unsynced_tail(flight: &[FrontendMessage]) -> Option<(usize, usize)> {
    if !matches!(flight.last(), Some(FrontendMessage::Flush)) {
        return None;
    }
    let tail = flight.iter().rev().take_while(|m| {
        !matches!(
            m,
            FrontendMessage::Sync | FrontendMessage::Query(_) | FrontendMessage::FunctionCall(_)
        )
    });
    Some(tail.fold((0, 0), |(due, executes), m| match m {
        FrontendMessage::Execute { .. } => (due + 1, executes + 1),
        FrontendMessage::Parse { .. }
        | FrontendMessage::Bind { .. }
        | FrontendMessage::Describe { .. }
        | FrontendMessage::Close { .. } => (due + 1, executes),
        _ => (due, executes),
    }))
}

pub(super) fn segment_ends(flight: &[FrontendMessage]) -> usize {
    flight.iter().filter(|m| m.ends_segment()).count()
}

impl Session {
    /// Sends a flight where `route` says, attaching (or switching) a backend if needed.
    pub(super) async fn dispatch_to(
        &mut self,
        flight: Vec<FrontendMessage>,
        class: Option<Class>,
        mut route: Route,
    ) -> Result<(), ClientError> {
        if let Some(log) = route.log.take() {
            // Everything that reads the flight's record, here and in what this calls, reads the
            // re-run's; the record of the messages received since comes back after it.
            let log = log.under(&self.log);
            let later = std::mem::replace(&mut self.log, log);
            let result = Box::pin(self.dispatch_to(flight, class, route)).await;
            self.log = later;
            return result;
        }
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
            let in_block =
                self.status != TxStatus::Idle || b.batch.is_open() || b.copy.running || self.pinned;
            let same_node = route.node.as_ref().is_none_or(|n| n.index == b.conn.node);
            // Not behind a read whose wait is undecided: if it fails, that read's answer is
            // thrown away and the read runs again, and what went behind it would be lost with
            // it (a Sync behind `BEGIN READ ONLY`) or run in the block it opened.
            let compatible = want.is_none_or(|w| w == b.target)
                && same_node
                && b.retry.is_none()
                && b.wait.is_none();
            // Ended too where the flight binds a statement of the client's the replica's
            // connection lacks: nothing can go in front inside the batch, and the Bind would get
            // 26000 where PostgreSQL binds it (seed 555792: the statement was parsed on the
            // primary, then a Parse and Flush opened a batch on the replica).
            let leaves = b.batch.is_open()
                && b.target == Target::Replica
                && ((!compatible && want == Some(Target::Primary))
                    || (compatible && self.binds_statement_missing_there(&flight)));
            if leaves && self.may_leave_open_replica_batch(&flight) {
                if self.settle_unsynced().await? {
                    // The server skips to the client's Sync: so does this flight, there.
                    break;
                }
                // What the client sent on the replica were reads, answered now: its batch ends
                // here, with the proxy's Sync, and the flight opens a new one on the primary.
                let attached = self.backend.as_mut().expect("checked");
                attached.expect.push_back(Owner::Proxy(Duty::Prepare));
                attached.batch = Batch::Synced;
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
            && want == Some(Target::Replica)
            && self.status == TxStatus::Idle
            && !self.pinned
            && let Some(replan) = route.replan
        {
            // A read planned to stay on the session's connection, which the replies heard since
            // let go: they ended its block, COPY or pin. Sent on as planned it went to a replica
            // with no floor (seed 20261214754: the read-back of a RESET pipelined between a
            // COPY's end and the read was heard first). It is a standalone read now.
            return Box::pin(self.dispatch(flight, class, replan.hint, replan.statement_floor))
                .await;
        }
        if self.backend.is_none()
            && let Err(e) = self
                .attach(want.unwrap_or(Target::Primary), route.node.clone())
                .await
        {
            return self.no_backend(e, segment_ends(&flight)).await;
        }
        let mut route = route;
        if route.node.is_some() && self.left_served_server() {
            // Routing meant the server of the client's last replica read, and the connection
            // reached another (restarted, or behind a load balancer): its floor first.
            if let Err(e) = self.settle_served().await {
                tracing::warn!(
                    "a read moved to another replica server and the primary cannot be asked for a position past the client's last read ({e}); reading the primary"
                );
                self.release_backend();
                let primary = Route {
                    count: Some(Outcome::NoReplica),
                    ..Route::to(Some(Target::Primary))
                };
                return Box::pin(self.dispatch_to(flight, class, primary)).await;
            }
            let floor = self.floors.own();
            route.count = None;
            route.read = Some(PlacedRead {
                floor: Floor::merge(route.read.and_then(|read| read.floor), floor),
                waits: route.read.map_or(!self.floors.mode.fast, |read| read.waits),
                queue_deadline: route.read.and_then(|read| read.queue_deadline),
            });
        }
        if let Some(outcome) = route.count {
            self.record_read(outcome);
        }
        self.send_flight(flight, class, route.read).await
    }

    /// Whether the attached replica connection, outside a transaction, reached another server
    /// than the client's last replica read ran on (`ClientFloors::served`), in a mode that keeps
    /// reads monotonic.
    fn left_served_server(&self) -> bool {
        let Some(attached) = self.backend.as_ref() else {
            return false;
        };
        attached.target == Target::Replica
            && self.status == TxStatus::Idle
            && self.floors.mode.tracks_positions()
            && self
                .floors
                .served
                .as_ref()
                .is_some_and(|s| s.server != attached.conn.facts.server)
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
        if b.expect.is_empty() || b.batch.is_open() {
            return false;
        }
        // The read-back behind a Query that may have reset a setting, and the startup values it
        // may apply again, go before this flight (`Session::on_resync`). Behind a COPY the
        // client ended whose answer is still to come (`copy.running`) too: a flight sent there made
        // the Query's ReadyForQuery not the last due, and the read-back was never sent (seed
        // 777188, under load).
        if b.reset_in_doubt && b.may_add_frames() {
            return true;
        }
        if b.copy.running {
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

    /// Whether `flight` binds or describes, before parsing it itself, a statement the client
    /// holds that the attached connection does not hold under that name (the unnamed one
    /// included): the preparation would put its Parse in front, where it can.
    fn binds_statement_missing_there(&self, flight: &[FrontendMessage]) -> bool {
        let Some(b) = self.backend.as_ref() else {
            return false;
        };
        let mut parsed = crate::net::NameMap::default();
        flight
            .iter()
            .zip(self.statement_per_message(flight))
            .any(|(m, s)| match m {
                FrontendMessage::Parse { statement, .. } => {
                    parsed.insert(statement.as_str(), ());
                    false
                }
                FrontendMessage::Bind { statement, .. }
                | FrontendMessage::Describe {
                    kind: b'S',
                    name: statement,
                } if !parsed.contains(statement) => s.is_some_and(|s| {
                    let held = if statement.is_empty() {
                        b.conn.unnamed.as_deref()
                    } else {
                        b.conn.prepared.get(statement).map(String::as_str)
                    };
                    held != Some(s.identity())
                }),
                _ => false,
            })
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
        if !(b.batch.is_open() && b.target == Target::Replica && self.status == TxStatus::Idle)
            || b.copy.running
            || b.doomed
            || self.pinned
            // A BEGIN among the unsynced messages opened a block there (`BEGIN READ ONLY`,
            // routed to the replica): the write belongs to it, and fails there as it would.
            || matches!(b.batch, Batch::Open { executed: Some(true), .. })
        {
            return false;
        }
        let mut bound = crate::net::NameMap::default();
        flight.iter().all(|m| match m {
            FrontendMessage::Bind { portal, .. } => {
                bound.insert(portal, ());
                true
            }
            FrontendMessage::Execute { portal, .. }
            | FrontendMessage::Describe {
                kind: b'P',
                name: portal,
            } => bound.contains(portal),
            _ => true,
        })
    }

    /// No server connection could be had: each of the flight's `segments` gets the reason, as
    /// 08001 and saying that nothing was sent — a write that got it certainly had no effect and
    /// may be run again, unlike one lost mid-statement (08006, outcome unknown).
    pub(super) async fn no_backend(
        &mut self,
        e: NoBackend,
        segments: usize,
    ) -> Result<(), ClientError> {
        metrics::counter!("lsngate_proxy_errors_total", "kind" => "no_backend").increment(1);
        let message = format!("{e}; the statement was not sent to any server");
        for _ in 0..segments.max(1) {
            self.io.queue(
                &ErrorFields::new(
                    "ERROR",
                    sqlstate::UNABLE_TO_ESTABLISH_CONNECTION,
                    message.clone(),
                )
                .to_frame(b'E'),
            );
            self.queue_ready(self.status);
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
        let spares = std::mem::take(&mut self.spares);
        self.backend = Some(Attached::new(conn, serves, spares));
    }

    pub(super) async fn attach(
        &mut self,
        target: Target,
        chosen: Option<Arc<NodeState>>,
    ) -> Result<(), NoBackend> {
        let config = Arc::clone(&self.config);
        let mut target = target;
        let mut chosen = chosen;
        loop {
            let node = match chosen.take() {
                Some(node) => node,
                None => self.proxy.nodes.pick(target).ok_or(NoBackend::NoPrimary)?,
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
        self.spares = attached.take_spares();
        attached.conn.release();
        self.backend = None;
    }

    pub(super) fn maybe_release(&mut self) {
        let idle = self
            .backend
            .as_ref()
            .is_some_and(|b| !b.awaiting_replies() && b.retry.is_none() && !b.discarding());
        if idle && self.status == TxStatus::Idle && !self.pinned {
            self.release_backend();
        }
    }

    async fn send_flight(
        &mut self,
        flight: Vec<FrontendMessage>,
        class: Option<Class>,
        read: Option<PlacedRead>,
    ) -> Result<(), ClientError> {
        let synced = flight.last().is_some_and(FrontendMessage::ends_segment);
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
            let waits = read.as_ref().is_some_and(|r| r.waits);
            let settled = self.settle_floor(floor, deadline, waits).await;
            self.proxy.causal.stats.record_wait(started.elapsed());
            if settled != super::causal::Settled::Passed {
                self.record_read(crate::causal::Outcome::Fallback);
                self.release_backend();
                let route = Route::to(Some(Target::Primary));
                return Box::pin(self.dispatch_to(flight, class, route)).await;
            }
            self.record_read(crate::causal::Outcome::Waited);
            needs_verdict = false;
        } else if read.as_ref().is_some_and(|r| r.floor.is_some()) && !needs_verdict {
            // The server this connection reached already has the floor: no wait.
            self.record_read(crate::causal::Outcome::Replica);
        }
        let attached = self.backend.as_ref().expect("attached before send");
        let (target, node) = (attached.target, attached.conn.node);
        if !attached.batch.is_open()
            && !attached.copy.running
            && let Some(lost) = self.recheck_moved(&flight).await?
        {
            self.backend = None;
            // Nothing of the flight was sent, and outside a transaction block nothing of the
            // session's lived on that connection: a read meant for a replica runs on the primary
            // (found by `lsngate verify` killing a replica: the read got the loss as 08006).
            if target == Target::Replica && self.status == TxStatus::Idle && !self.pinned {
                metrics::counter!("lsngate_proxy_retries_total", "reason" => "replica_lost")
                    .increment(1);
                tracing::warn!(
                    "replica connection lost before the read was sent ({lost}); reading the primary"
                );
                if let Some(n) = self.proxy.nodes.get(node) {
                    n.request_check();
                }
                // As when the connection is lost before the read's answer (`backend_lost`).
                if let Some(read) = read {
                    let read = CausalRead {
                        floor: read.floor,
                        flight,
                        class,
                        log: None,
                        queue_deadline: read.queue_deadline,
                    };
                    return Box::pin(self.fall_back(read)).await;
                }
                let route = Route::to(Some(Target::Primary));
                return Box::pin(self.dispatch_to(flight, class, route)).await;
            }
            if self.status != TxStatus::Idle || self.pinned {
                return self.lost_before_sending(lost, segment_ends(&flight)).await;
            }
            return self.no_backend(lost.into(), segment_ends(&flight)).await;
        }
        if self.backend.is_none() {
            return self
                .no_backend(NoBackend::NoPrimary, segment_ends(&flight))
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
        // The statement behind each message as of its position, read once for the preparation
        // and the three questions after it.
        let in_block = self.status != TxStatus::Idle;
        let owed_at_block_end = self.backend.as_ref().expect("attached").owed_at_block_end;
        let (unsynced, effects, copy_start, kept, may_end_block) = {
            let (at, after) =
                statements_at(&self.statements, self.unnamed.as_ref(), &self.log, &flight);
            let attached = self.backend.as_mut().expect("attached before send");
            let client = ClientView {
                settings: &self.settings,
                closing: &self.closing,
                statements: &self.statements,
                unnamed: self.unnamed.as_ref(),
                log: &self.log,
            };
            frames.extend(preparation(attached, client, &flight, &at, after.is_some()));
            if std::mem::take(&mut self.failed_block_first) {
                // Behind the settings and statements the flight needs, which run outside it.
                for (sql, duty) in [
                    ("BEGIN", Duty::Begin),
                    (super::answers::ABORT_SQL, Duty::Abort),
                ] {
                    frames.push(FrontendMessage::Query(sql.into()).to_frame());
                    attached.conn.unnamed = None;
                    attached.expect.push_back(Owner::Proxy(duty));
                }
            }
            let per_message: Vec<_> = at.into_iter().map(At::statement).collect();
            let copy_start = attached
                .copy
                .copy_start(&flight, |i| per_message[i].is_some_and(|s| s.copies_in));
            // What the client holds after a DEALLOCATE ALL that ran in the flight: the names
            // parsed after it, nothing else.
            let kept = after.map(|after| {
                after
                    .into_iter()
                    .map(|(name, s)| (name, Arc::clone(s)))
                    .collect::<std::collections::HashMap<_, _>>()
            });
            let may_end_block =
                (in_block || owed_at_block_end) && may_end_block(&flight, class, &per_message);
            (
                // Still inside the block a batch opened, unless this flight may end it.
                Session::unsynced_run(&flight, &per_message, owed_at_block_end && !may_end_block),
                self.session_effects(&flight, class, &per_message),
                copy_start,
                kept,
                may_end_block,
            )
        };
        // A re-run changed the view when it was first sent (messages received since may have
        // changed it again).
        if let Some(kept) = kept.filter(|_| !self.log.rerun) {
            self.statements = kept;
        }
        if closes_unnamed(&flight) && !self.log.rerun {
            self.unnamed = None;
        }
        if self.note_session_effects(&flight, effects) {
            self.settings_in_doubt = true;
        }
        if let [FrontendMessage::Query(sql)] = flight.as_slice()
            && crate::statement::may_reset_in_parts(sql.as_bytes())
        {
            self.backend.as_mut().expect("attached").reset_in_doubt = true;
        }
        let attached = self.backend.as_mut().expect("attached before send");
        let retry_allowed = self.config.retry_buffer_size > 0;
        let status = self.status;
        if attached.target == Target::Primary && matches!(class, Some(Class::Write) | None) {
            self.scopes.note_write(self.floors.scope.as_ref());
        }
        let tracks =
            self.floors.mode.tracks_positions() || self.scopes.active(self.floors.scope.as_ref());
        let budget = self.config.causal.wait_timeout;
        let ends = segment_ends(&flight);
        if self.resets_parsed {
            let mut portals = std::mem::take(&mut self.reset_portals);
            let tags = reset_tags(&flight, &self.statement_per_message(&flight), &mut portals);
            self.reset_portals = portals;
            let attached = self.backend.as_mut().expect("attached before send");
            if attached.reset_tags.is_empty() && tags.contains(&Some(true)) {
                // The answers of the client's segments already under way come first, then those
                // of the Executes of a batch still open (seed 333584: the RESET's label landed on
                // an earlier, unanswered Execute's CommandComplete).
                let due = attached.client_segments_due();
                let executes = attached.batch.executes_due();
                attached.reset_tags.extend(std::iter::repeat_n(None, due));
                attached
                    .reset_tags
                    .extend(std::iter::repeat_n(Some(false), executes));
                attached.reset_tags.extend(tags);
            } else if !attached.reset_tags.is_empty() {
                attached.reset_tags.extend(tags);
            }
        }
        let attached = self.backend.as_mut().expect("attached before send");
        self.proxy.queries[usize::from(attached.target == Target::Replica)].add(ends.max(1) as u64);
        let standalone_read =
            matches!(class, Some(Class::Read)) && ends == 1 && status == TxStatus::Idle;
        // The flight itself is kept (moved in just before it is sent, not copied).
        let keep_for_retry = retry_allowed
            && standalone_read
            && attached.target == Target::Replica
            && attached.expect.iter().all(|o| matches!(o, Owner::Proxy(_)));
        if needs_verdict
            && let Some(PlacedRead {
                floor: Some(floor),
                waits,
                ..
            }) = read
        {
            let wait = attached.conn.facts.has_wait_for() && waits;
            if wait {
                frames.extend(wait_for(floor.lsn, budget));
            } else {
                frames.extend(attached.probe(Probe::Replay));
            }
            attached.expect.push_back(Owner::Proxy(Duty::Verdict));
            let verdict = PendingVerdict::new(floor, wait, waits, budget);
            attached.wait = Some(ReadWait::Pending(verdict));
        }
        // The client's messages go between the frames before and after them: as rebuilt, or
        // as they are, encoded at the send.
        let client_at = match client_frames {
            Some(rebuilt) => {
                frames.extend(rebuilt);
                None
            }
            None => Some(frames.len()),
        };
        if let Some(start) = copy_start {
            let clients_due = attached.client_segments_due();
            attached.copy.started_by(&flight, start, clients_due);
        }
        // The block the client last heard of may be over when this flight runs: a flight still
        // due here may end it (CI's seed 20261394: an INSERT sent right behind a COMMIT was
        // planned as inside the block and took no position).
        let may_run_outside_block =
            status == TxStatus::Idle || (attached.may_commit && attached.client_segments_due() > 0);
        attached
            .expect
            .extend(std::iter::repeat_n(Owner::Client, ends));
        attached.segments_sent += ends as u64;
        match flight.last() {
            Some(FrontendMessage::Flush) => {
                let ended = flight.iter().any(FrontendMessage::ends_segment);
                let (tail, executes) = unsynced_tail(&flight).unwrap_or_default();
                attached
                    .batch
                    .flushed(ended, tail, executes, unsynced.executed);
            }
            // A simple Query also ends an unsynced extended batch (asyncpg sends Parse/Describe/
            // Flush, then a Query); the session sends none while the server skips to a Sync.
            Some(FrontendMessage::Sync | FrontendMessage::Query(_)) => {
                attached.batch = Batch::Synced;
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
        let batch_goes_on =
            attached.batch.is_open() || (attached.copy.closed && attached.copy.extended);
        if tracks && batch_goes_on {
            // Its transaction ends, and its position can be taken, behind a later flight's Sync
            // (or behind the end of the block it opened: `Attached::owed_at_block_end`).
            attached.owed_at_block_end = unsynced.in_block;
            attached.position_owed |= may_run_outside_block
                && attached.target == Target::Primary
                && class == Some(Class::Write)
                && (copy_start.is_some()
                    || flight
                        .iter()
                        .any(|m| matches!(m, FrontendMessage::Execute { .. })));
        } else if tracks && synced {
            let ends_block = status != TxStatus::Idle && class == Some(Class::TransactionControl);
            // Not while a COPY may still be running: its data is still to come. Nor inside a
            // block the batch opened, before a flight that may end it.
            let deferred = attached.owed_at_block_end && !may_end_block;
            attached.owed_at_block_end = deferred;
            let owed =
                !deferred && !attached.copy.closed && std::mem::take(&mut attached.position_owed);
            let probe = match attached.target {
                Target::Replica if standalone_read || ends_block || read.is_some() => {
                    let node = attached.conn.node;
                    let several = self.proxy.causal.watcher.several_servers(node);
                    if self
                        .floors
                        .replica_read_sent(node, &attached.conn.facts.server, several)
                    {
                        let segment = attached.probe(Probe::Replay);
                        attached.expect.push_back(Owner::Proxy(Duty::Served));
                        Some(segment)
                    } else {
                        None
                    }
                }
                Target::Primary
                    if ends_block
                        || owed
                        || (may_run_outside_block
                            && (matches!(class, Some(Class::Read | Class::Write))
                                || state_then_more(class, &flight))) =>
                {
                    let wrote = ends_block
                        || owed
                        || class == Some(Class::Write)
                        || state_then_more(class, &flight);
                    Some(attached.position_probe(&mut self.scopes, wrote))
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
        attached.may_commit |= status == TxStatus::Idle || may_end_block;
        let sent = match client_at {
            Some(at) => attached.conn.send_around(&frames, at, &flight).await,
            None => attached.conn.send(&frames).await,
        };
        // Kept before a lost connection is handled: `backend_lost` re-runs the read from it.
        if keep_for_retry {
            attached.retry = Some(RetryBuffer {
                held: std::mem::take(&mut self.spare_held),
                read_only_violation: false,
            });
        }
        if keep_for_retry || attached.read.is_some() {
            // The flight's record goes with it, swapped, not copied (a copy cost every replica
            // read about 1,000 instructions in callgrind, 2026-12-07): nothing reads the record
            // of a flight once it is sent, and the next flight starts from an empty one.
            std::mem::swap(&mut attached.rerun_log, &mut self.log);
            self.log.clear();
            attached.rerun = Some((flight, class));
        } else if attached.retry.is_none() {
            // A flight sent behind a read still held back (inside the batch its unsynced tail
            // opened) leaves that read's flight for its re-run.
            attached.rerun = None;
        }
        if let Err(e) = sent {
            return self.backend_lost(e).await;
        }
        Ok(())
    }
}

/// A simple Query classified by its first statement as session state or a pin (`SET …;
/// INSERT …`, `PREPARE …; EXECUTE …`) that holds more statements: those may write, so its
/// position is taken as a write's (differential seed 20261213921: without it the next read
/// went to a replica that lacked the INSERT).
fn state_then_more(class: Option<Class>, flight: &[FrontendMessage]) -> bool {
    matches!(class, Some(Class::SessionState | Class::Pin))
        && flight.iter().any(|m| {
            matches!(m, FrontendMessage::Query(sql) if crate::statement::several_statements(sql))
        })
}

/// Whether a flight sent inside a transaction block may end it (see
/// [`crate::statement::may_end_block`]): a flight of `COMMIT` or `ROLLBACK`, one the proxy could
/// not classify, a Query with such a statement among others (`INSERT …; COMMIT`), or a Bind of
/// one, or of a statement the client does not hold (`per_message` is the flight's
/// [`At::statement`]s). Flights classified read, `BEGIN` or transaction-local end nothing, nor
/// does one that runs no statement (a bare Sync: seed 20261245900, where a position deferred to
/// the block's end was taken there, inside the failed block, and the probe pipelined behind it,
/// built as if the first had prepared its statement, failed inside the block `COMMIT AND CHAIN`
/// opened next).
fn may_end_block(
    flight: &[FrontendMessage],
    class: Option<Class>,
    per_message: &[Option<&super::client_statement::ClientStatement>],
) -> bool {
    let runs = flight.iter().any(|m| {
        matches!(
            m,
            FrontendMessage::Query(_)
                | FrontendMessage::Execute { .. }
                | FrontendMessage::FunctionCall(_)
        )
    });
    if !runs {
        return false;
    }
    match class {
        Some(Class::Read | Class::Begin { .. } | Class::TransactionLocal) => false,
        Some(Class::TransactionControl) | None => true,
        Some(Class::Write | Class::SessionState | Class::Pin) => {
            flight.iter().zip(per_message).any(|(m, s)| match m {
                FrontendMessage::Query(sql) => crate::statement::may_end_block(sql),
                FrontendMessage::Bind { .. } => {
                    s.is_none_or(|s| crate::statement::may_end_block(&s.query))
                }
                _ => false,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
