//! Causal reads, client side: each client's floor (its own commits, the primary's position behind
//! its primary reads, floors it set), the replica server its last read ran on (what keeps its
//! reads monotonic without a position, [`ClientFloors::served`]), where a read goes for it, and
//! what happens when a replica cannot show the floor in time. The proxy segments themselves (a
//! wait in front of a read, a position behind a commit) are added by `flight.rs`; their answers
//! arrive here from `replies.rs`.
//!
//! A read is only ever re-run when it is a read: a standalone read-only statement outside a
//! transaction block (or a `BEGIN READ ONLY`), whose replica answer was discarded unseen.

use std::sync::Arc;
use std::time::Duration;

use lsngate_core::probe::{REPLAY_SQL, wait_for_sql};
use lsngate_core::{
    Decision, Fallback, Lsn, PrimaryReason, ReadRequest, Verdict, WhenGuarded, route,
};
use tokio::time::Instant;

use super::error::ClientError;
use super::flight::{Replan, Route};
use super::pipeline::FlightLog;
use super::plan::{Plan, SessionView, plan};
use super::session::Session;
use crate::backend::replay::ServerId;
use crate::backend::timeline::Need;
use crate::backend::{NodeState, Target};
use crate::causal::{Floor, Outcome, SQLSTATE_GUARDED, SQLSTATE_NOT_CAUGHT_UP};
use crate::config::{Consistency, Level};
use crate::net::backend::build;
use crate::net::sqlstate;
use crate::net::{ErrorFields, FrontendMessage};
use crate::statement::{Class, RouteHint};

/// Extra time past the wait budget before a silent replica is given up (the server's own
/// TIMEOUT normally answers first).
const GRACE: Duration = Duration::from_millis(100);

/// One client's floors.
#[derive(Debug, Clone, Default)]
pub struct ClientFloors {
    /// The client's consistency mode.
    pub mode: Consistency,
    /// Raised by the client's commits, by the primary's position behind each primary read, and
    /// when a read leaves the server of [`ClientFloors::served`].
    pub auto: Option<Floor>,
    /// The replica server the client's last replica read ran on, until a position taken on the
    /// primary after it covers it. No position is taken behind a replica read: replay only rises
    /// on a running server (a restarted one is a new [`ServerId`]), so the next read on the same
    /// server sees at least as much. A read placed on any other server first raises `auto` to
    /// the primary's position (`Session::settle_served`), which that server cannot have passed.
    pub served: Option<ServedOn>,
    /// Set by `SET lsngate.min_lsn` or the startup options.
    pub explicit: Option<Floor>,
    /// The causal scope set by `SET lsngate.scope` or the startup options (see `scopes.rs`).
    pub scope: Option<lsngate_core::ScopeName>,
    /// Position of the client's last commit that wrote.
    pub commit: Option<Floor>,
    /// `lsngate.stale` was last reported `on`.
    pub stale_reported: bool,
    /// A primary-guard slot is held by the fallback read in flight.
    pub guard_slot: bool,
    /// A commit was acknowledged whose position never arrived (its probe failed, or the
    /// connection was lost after the commit's replies): until the primary's position is
    /// learned again, the client's floor does not cover it.
    pub commit_unknown: bool,
}

/// Where a replica read ran (see [`ClientFloors::served`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedOn {
    /// The node (config index) it was placed on.
    pub node: usize,
    /// The server its connection reached (never unknown).
    pub server: ServerId,
    /// When the client's reads came to this server: they stay at most [`STICKY_FOR`].
    pub since: Instant,
}

/// How long a client's reads stay on one replica server with nothing taken behind them: the
/// first read after it carries the replay position behind it, as its floor, and the next read is
/// placed afresh (the least busy replica that has that position, else the closest), so a
/// replica that comes back, or one less busy, gets its share of long-lived clients' reads.
pub const STICKY_FOR: Duration = Duration::from_secs(1);

impl ClientFloors {
    /// The client's commit was acknowledged and its position lost ([`ClientFloors::commit_unknown`]):
    /// its next read asks the primary for one, and so does the next `global` read of any client.
    /// Returns what to tell the client before the commit's ReadyForQuery: where its mode reports
    /// commit positions, an empty `lsngate.commit_lsn` and `lsngate.commit_token` (unknown), so
    /// a driver does not keep the previous commit's as this one's.
    pub fn commit_lost(&mut self, causal: &crate::causal::Causal) -> Vec<crate::net::Frame> {
        self.commit_unknown = true;
        causal.committed_unknown();
        if !self.mode.reports_commits() {
            return Vec::new();
        }
        ["lsngate.commit_lsn", "lsngate.commit_token"]
            .into_iter()
            .map(|name| build::parameter_status(name, ""))
            .collect()
    }

    /// The floor a read needs from the client's own state (without global/universal).
    pub fn own(&self) -> Option<Floor> {
        Floor::merge(self.auto, self.explicit)
    }

    /// A replica read goes to `server` through node `node` (`several`: the node showed more than
    /// one server lately). Returns whether the replay position must be read behind it (its
    /// answer raises the floor): where the server is unknown, behind an address that fronts
    /// several servers (reads move between them on their own, and a mark would cost each move the
    /// primary's position), and once the client's reads have stayed [`STICKY_FOR`] on this
    /// server, which frees the next read to move. Otherwise the server is marked
    /// ([`ClientFloors::served`]) and nothing is read behind it.
    pub fn replica_read_sent(&mut self, node: usize, server: &ServerId, several: bool) -> bool {
        let since = match self.served.take() {
            Some(on) if on.server == *server => on.since,
            _ => Instant::now(),
        };
        if server.is_unknown() || several || since.elapsed() >= STICKY_FOR {
            return true;
        }
        self.served = Some(ServedOn {
            node,
            server: server.clone(),
            since,
        });
        false
    }
}

/// A read placed on a replica by the causal planner (with its floor, if any): until the client
/// has seen its answer it can run elsewhere (`Session::fall_back`), from the flight its
/// connection keeps ([`Attached::rerun`](super::attached::Attached::rerun)), not a copy.
#[derive(Debug, Clone, Copy)]
pub struct PlacedRead {
    /// What the read must see; `None` = any replica will do.
    pub floor: Option<Floor>,
    /// Whether it may wait there for its floor: not in the fast modes, unless the primary guard
    /// refused it the primary.
    pub waits: bool,
    /// The end of the guard's queue for the primary, where the read queued before a replica
    /// was seen to have its floor (`Session::fall_back`): falling back again, it queues only
    /// until then, and does not leave the queue a second time.
    pub queue_deadline: Option<Instant>,
}

/// A read routed by floor, with the client's messages, while it is not sent (and again when it
/// runs elsewhere).
#[derive(Debug)]
pub struct CausalRead {
    /// What the read must see; `None` = any replica will do.
    pub floor: Option<Floor>,
    /// The client's messages, for a re-run elsewhere.
    pub flight: Vec<FrontendMessage>,
    /// Their class.
    pub class: Option<Class>,
    /// How the client's statements stood before the flight, when it runs again after other
    /// messages were received (see [`Route::log`]); `None` while it is the flight being
    /// assembled.
    pub log: Option<Box<FlightLog>>,
    /// See [`PlacedRead::queue_deadline`].
    pub queue_deadline: Option<Instant>,
}

/// The wait or check sent in front of a replica read, until its [`Verdict`] arrives.
#[derive(Debug, Clone)]
pub struct PendingVerdict {
    /// The position waited for.
    pub floor: Floor,
    /// `WAIT FOR LSN` (true) or a replay check (false).
    pub wait: bool,
    /// Whether a failed check is followed by polling the server (PostgreSQL ≤ 18), or the read
    /// falls back at once (the fast modes).
    pub polls: bool,
    /// When it was sent.
    pub sent: Instant,
    /// When the proxy stops waiting for an answer and gives the replica up.
    pub deadline: Instant,
}

impl PendingVerdict {
    /// A wait or check for `floor` sent now.
    pub fn new(floor: Floor, wait: bool, polls: bool, budget: Duration) -> PendingVerdict {
        let sent = Instant::now();
        PendingVerdict {
            floor,
            wait,
            polls,
            sent,
            deadline: sent + budget + GRACE,
        }
    }
}

/// Where the wait (or replay check) in front of a replica read stands while it matters: sent and
/// undecided, or failed. A read with no wait, or whose wait passed, has none.
#[derive(Debug, Clone)]
pub enum ReadWait {
    /// Sent; its verdict has not arrived.
    Pending(PendingVerdict),
    /// It failed: the read's replies are dropped unseen, and then this happens.
    Failed(Discard),
}

/// What becomes of the client's replies after a failed verdict: they are dropped unseen, then…
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discard {
    /// …the read goes to the fallback policy (primary, or an error).
    Rerun,
    /// …the same server is polled for the floor and read again (PostgreSQL ≤ 18).
    Poll(Floor, Instant),
    /// …the client gets this error: its cancel request hit the wait in front of its read.
    Cancelled(String),
}

impl Session {
    /// What the routing plan reads of the session.
    pub(super) fn view(&self) -> SessionView {
        SessionView {
            status: self.status,
            pinned: self.pinned,
            mid_batch: self
                .backend
                .as_ref()
                .is_some_and(|b| b.batch.is_open() || b.copy.running),
            attached: self.backend.is_some(),
            hint: self.hint,
        }
    }

    /// Routes a flight and sends it. A read that may go to a replica is placed by its floor.
    pub(super) async fn dispatch(
        &mut self,
        flight: Vec<FrontendMessage>,
        class: Option<Class>,
        hint: Option<RouteHint>,
        statement_floor: Option<Floor>,
    ) -> Result<(), ClientError> {
        let mut heard = false;
        loop {
            match plan(self.view(), class, hint) {
                Plan::ReplicaRead => {
                    return self.dispatch_read(flight, class, statement_floor).await;
                }
                // A read kept on the session's connection only by a pin the server may have
                // skipped (`pin_unconfirmed`): the replies due decide whether the session stays
                // pinned, so they are heard and the flight planned again. Planned on the old
                // state, the read went on to a replica with no floor once the pin was undone
                // and the connection let go (seed 20261363, under load: a stale read).
                Plan::Send(Some(Target::Replica))
                    if !heard
                        && self.backend.as_ref().is_some_and(|b| {
                            b.pin_unconfirmed.is_some() && !b.batch.is_open() && !b.copy.running
                        }) =>
                {
                    heard = true;
                    self.drain().await?;
                }
                // Anything else: `dispatch_to` plans it again if the connection it was planned
                // to stay on is let go.
                Plan::Send(target) => {
                    let route = Route {
                        replan: Some(Replan {
                            hint,
                            statement_floor,
                        }),
                        ..Route::to(target)
                    };
                    return self.dispatch_to(flight, class, route).await;
                }
            }
        }
    }

    /// A read no replica can be chosen for because the primary, which would say where it may
    /// go, cannot be asked (`why`): it runs on the primary, counted as finding no replica.
    async fn read_primary_unplaced(
        &mut self,
        flight: Vec<FrontendMessage>,
        class: Option<Class>,
        why: &str,
    ) -> Result<(), ClientError> {
        tracing::warn!("{why}; reading the primary");
        self.record_read(Outcome::NoReplica);
        self.dispatch_to(flight, class, Route::to(Some(Target::Primary)))
            .await
    }

    async fn dispatch_read(
        &mut self,
        flight: Vec<FrontendMessage>,
        class: Option<Class>,
        statement_floor: Option<Floor>,
    ) -> Result<(), ClientError> {
        self.scopes.reading = !self.scopes.current(self.floors.scope.as_ref()).is_empty();
        if self.backend.as_ref().is_some_and(|b| b.awaiting_replies()) {
            // A commit position or served position of an earlier flight may still be on its way.
            // This also keeps a server connection to one routed read at a time, with nothing
            // pipelined behind it undecided: `Attached`'s single `read`/`verdict`/`discard`
            // slots rely on that (a failed wait drops every reply due and re-runs that one read).
            self.drain().await?;
        }
        let settled = match self.settle_commit_unknown().await? {
            Ok(()) => self.settle_global_unknown().await,
            unknown => unknown,
        };
        if let Err(why) = settled {
            return self.read_primary_unplaced(flight, class, &why).await;
        }
        // Reads stay on the server of the client's last replica read while it serves: anywhere
        // else they would first need the primary's position (a round trip).
        let sticky = self.sticky_node();
        if sticky.is_none()
            && let Err(e) = self.settle_served().await
        {
            let why = format!(
                "the client's last read ran on a replica it cannot read again, and the primary cannot be asked for a position past it ({e})"
            );
            return self.read_primary_unplaced(flight, class, &why).await;
        }
        let floor = match self.read_floor(statement_floor).await {
            Ok(floor) => floor,
            Err(e) => {
                return self
                    .answer_flight_error(&flight, sqlstate::CONNECTION_FAILURE, &e.to_string())
                    .await;
            }
        };
        let lag_bound = self.config.causal.lag_bound;
        let bounded = lag_bound.max_bytes.is_some() || lag_bound.max_lag.is_some();
        if floor.is_none() && !bounded {
            // Any healthy replica will do (no watcher lookups on this path).
            let node = sticky
                .clone()
                .or_else(|| self.proxy.nodes.pick(Target::Replica));
            let outcome = match &node {
                Some(n) if n.role() == crate::backend::Role::Replica => Outcome::Replica,
                _ => Outcome::NoReplica,
            };
            let route = match node.filter(|_| outcome == Outcome::Replica) {
                Some(node) => Route {
                    target: Some(Target::Replica),
                    node: Some(node),
                    read: None,
                    count: Some(outcome),
                    replan: None,
                    log: None,
                },
                None => Route {
                    count: Some(outcome),
                    ..Route::to(Some(Target::Primary))
                },
            };
            return self.dispatch_to(flight, class, route).await;
        }
        let causal = &self.proxy.causal;
        let older_timeline = lsngate_core::timeline::floor_predates(
            floor.and_then(|f| f.timeline),
            self.proxy.nodes.newest_timeline.get(),
        );
        let need = match floor {
            Some(floor) => Need::Floor(floor.timeline),
            None => Need::Any,
        };
        let mut replicas = causal.watcher.replicas(&self.proxy.nodes, need, bounded);
        if let Some(sticky) = &sticky
            && replicas.iter().any(|(n, _)| n.index == sticky.index)
        {
            // Only there: this read may wait on it rather than move (see `sticky_node`).
            replicas.retain(|(n, _)| n.index == sticky.index);
        }
        let states: Vec<_> = replicas.iter().map(|(_, s)| *s).collect();
        // A flight ending in Flush (Parse/Describe before a later Bind/Execute/Sync) cannot be
        // discarded and re-run: it waits first (`send_flight`) and never falls back by policy.
        let synced = matches!(
            flight.last(),
            Some(FrontendMessage::Sync | FrontendMessage::Query(_))
        );
        let request = ReadRequest {
            floor: floor.map(|f| f.lsn),
            may_wait: !self.floors.mode.fast,
            lag_bound,
            spin: rand::random::<u32>() as usize,
        };
        let read = CausalRead {
            floor,
            flight,
            class,
            log: None,
            queue_deadline: None,
        };
        match route(&request, &states) {
            _ if older_timeline => {
                tracing::debug!("read floor is from an older timeline; reading the primary");
                self.record_read(Outcome::Fallback);
                self.read_primary(read).await
            }
            Decision::Replica { index, .. } if floor.is_none() => {
                // No floor, only a lag bound: nothing to wait for.
                let route = Route {
                    target: Some(Target::Replica),
                    node: Some(replicas[index].0.clone()),
                    read: None,
                    count: Some(Outcome::Replica),
                    replan: None,
                    log: None,
                };
                self.dispatch_to(read.flight, read.class, route).await
            }
            Decision::Replica { index, .. } => {
                // Counted where it is decided: `send_flight` (no wait needed on the server the
                // connection reached), the verdict (waited or not), or the fallback.
                let route = Route {
                    target: Some(Target::Replica),
                    node: Some(replicas[index].0.clone()),
                    read: Some(PlacedRead {
                        floor: read.floor,
                        waits: !self.floors.mode.fast,
                        queue_deadline: None,
                    }),
                    count: None,
                    replan: None,
                    log: None,
                };
                self.dispatch_to(read.flight, read.class, route).await
            }
            // A Flush-ended flight in a fast mode: no policy answer fits a half flight.
            Decision::Primary(PrimaryReason::NotCaughtUp) if !synced => {
                self.read_primary(read).await
            }
            // The fast modes read the primary where no replica is known to have the floor, while
            // the guard lets them. Refused, the read waits on a replica within the budget, as in
            // the waiting modes: after every write the breaker would otherwise fail the reads that
            // follow (LG002) for want of the primary, though the replica replays the write within
            // a millisecond (a fast proxy under pgbench's write-then-read script, 2026-12-07).
            // With `when_guarded = "fail"` the refusal fails the read at once, as asked.
            Decision::Primary(PrimaryReason::NotCaughtUp)
                if self.floors.mode.fast
                    && self.config.causal.fallback != Fallback::Error
                    && self.config.causal.when_guarded == WhenGuarded::Wait =>
            {
                let refusal = match self.proxy.causal.admit() {
                    Ok(()) => return self.read_primary_admitted(read).await,
                    Err(refusal) => refusal,
                };
                let waiting = ReadRequest {
                    may_wait: true,
                    ..request
                };
                let Decision::Replica { index, .. } = route(&waiting, &states) else {
                    return self.fall_back(read).await;
                };
                tracing::debug!("{refusal}: the fast read waits on a replica instead");
                let route = Route {
                    target: Some(Target::Replica),
                    node: Some(replicas[index].0.clone()),
                    read: Some(PlacedRead {
                        floor: read.floor,
                        waits: true,
                        queue_deadline: None,
                    }),
                    count: None,
                    replan: None,
                    log: None,
                };
                self.dispatch_to(read.flight, read.class, route).await
            }
            Decision::Primary(PrimaryReason::NotCaughtUp) => self.fall_back(read).await,
            Decision::Primary(_) => {
                self.record_read(Outcome::NoReplica);
                self.read_primary(read).await
            }
        }
    }

    /// The floor of the next read: the client's own, plus what its scopes and its mode add.
    async fn read_floor(&mut self, statement: Option<Floor>) -> anyhow::Result<Option<Floor>> {
        // A universal read waits for the primary's current position, past every scope's writes:
        // no scope floor to look up (nor a round trip to the scope store).
        let scoped = match self.floors.mode.level {
            Level::Universal => None,
            _ => self.scope_floor().await?,
        };
        let own = Floor::merge(Floor::merge(self.floors.own(), statement), scoped);
        let causal = &self.proxy.causal;
        Ok(match self.floors.mode.level {
            Level::Global => Floor::merge(own, causal.global_floor()),
            Level::Universal => Floor::merge(own, Some(self.primary_position().await?)),
            _ => own,
        })
    }

    async fn read_primary(&mut self, read: CausalRead) -> Result<(), ClientError> {
        let route = Route {
            log: read.log,
            ..Route::to(Some(Target::Primary))
        };
        self.dispatch_to(read.flight, read.class, route).await
    }

    /// No replica showed the floor in time: the fallback policy decides (`stale` was handled
    /// where a replica answered; here none did, so it reads the primary).
    pub(super) async fn fall_back(&mut self, read: CausalRead) -> Result<(), ClientError> {
        let causal = &self.proxy.causal;
        if self.config.causal.fallback == Fallback::Error {
            self.record_read(Outcome::Error);
            let message = self.not_caught_up(read.floor);
            return self
                .answer_flight_error(&read.flight, SQLSTATE_NOT_CAUGHT_UP, &message)
                .await;
        }
        let deadline = read
            .queue_deadline
            .unwrap_or_else(|| Instant::now() + self.config.causal.wait_timeout);
        let mut logged = false;
        loop {
            match causal.admit() {
                Ok(()) => break,
                Err(refusal) => {
                    if !std::mem::replace(&mut logged, true) {
                        tracing::warn!("primary guard refused a fallback read: {refusal}");
                        causal.stats.refused.add(1);
                    }
                    // A replica that catches up while the read queues serves it (once): in a
                    // lag event the guard refuses most fallbacks, and the replicas' recovery
                    // would otherwise not reach the reads already queued (LG002 at the
                    // deadline). Not with `when_guarded = "fail"`, which asked for the refusal.
                    if read.queue_deadline.is_none()
                        && self.config.causal.when_guarded == WhenGuarded::Wait
                        && let Some(node) = self.replica_known_at(&read)
                    {
                        tracing::info!(node = %node.url.address(), "a replica replayed the floor of a read queued for the primary; reading it there");
                        causal.stats.rescued.add(1);
                        let route = Route {
                            target: Some(Target::Replica),
                            node: Some(node),
                            read: Some(PlacedRead {
                                floor: read.floor,
                                waits: false,
                                queue_deadline: Some(deadline),
                            }),
                            count: None,
                            replan: None,
                            log: read.log,
                        };
                        return self.dispatch_to(read.flight, read.class, route).await;
                    }
                    let left = deadline.saturating_duration_since(Instant::now());
                    let when_guarded = self.config.causal.when_guarded;
                    let Some(pause) = lsngate_core::pace::guard_queue_pause(when_guarded, left)
                    else {
                        self.record_read(Outcome::Error);
                        let message = format!(
                            "lsngate: this read needs position {} and no replica had it; {refusal}",
                            read.floor.map(|f| f.to_string()).unwrap_or_default()
                        );
                        return self
                            .answer_flight_error(&read.flight, SQLSTATE_GUARDED, &message)
                            .await;
                    };
                    crate::timer::sleep(pause).await;
                }
            }
        }
        self.read_primary_admitted(read).await
    }

    /// A replica the replay book knows has `read`'s floor now, where the planner would place
    /// it without a wait; none for a read without a floor, a Flush-ended flight (it cannot be
    /// run again elsewhere), or a floor from an older timeline than the newest primary's.
    fn replica_known_at(&self, read: &CausalRead) -> Option<Arc<NodeState>> {
        let floor = read.floor?;
        let synced = matches!(
            read.flight.last(),
            Some(FrontendMessage::Sync | FrontendMessage::Query(_))
        );
        let nodes = &self.proxy.nodes;
        if !synced
            || lsngate_core::timeline::floor_predates(floor.timeline, nodes.newest_timeline.get())
        {
            return None;
        }
        let lag_bound = self.config.causal.lag_bound;
        let bounded = lag_bound.max_bytes.is_some() || lag_bound.max_lag.is_some();
        let replicas =
            self.proxy
                .causal
                .watcher
                .replicas(nodes, Need::Floor(floor.timeline), bounded);
        let states: Vec<_> = replicas.iter().map(|(_, s)| *s).collect();
        let request = ReadRequest {
            floor: Some(floor.lsn),
            may_wait: false,
            lag_bound,
            spin: rand::random::<u32>() as usize,
        };
        match route(&request, &states) {
            Decision::Replica { index, .. } => Some(replicas[index].0.clone()),
            Decision::Primary(_) => None,
        }
    }

    /// A fallback read the guard gave a slot: on the primary, the slot held until it is done.
    async fn read_primary_admitted(&mut self, read: CausalRead) -> Result<(), ClientError> {
        self.record_read(Outcome::Fallback);
        self.floors.guard_slot = true;
        self.read_primary(read).await
    }

    /// Returns the guard slot of a finished fallback read.
    pub(super) fn end_fallback(&mut self) {
        if std::mem::take(&mut self.floors.guard_slot) {
            self.proxy.causal.release();
        }
    }

    /// The message of a read that no replica could serve in time.
    pub(super) fn not_caught_up(&self, floor: Option<Floor>) -> String {
        let positions: Vec<String> = self
            .proxy
            .causal
            .watcher
            .views(&self.proxy.nodes)
            .into_iter()
            .map(|v| {
                format!(
                    "{} at {}",
                    v.address,
                    v.replayed.unwrap_or_else(|| "unknown".into())
                )
            })
            .collect();
        format!(
            "lsngate: no replica replayed the read's floor {} within {} ms (replicas: {}); the read was not run. Raise wait_timeout_ms, use fallback = primary, or retry",
            floor.map(|f| f.to_string()).unwrap_or_else(|| "?".into()),
            self.config.causal.wait_timeout.as_millis(),
            if positions.is_empty() {
                "none".into()
            } else {
                positions.join(", ")
            }
        )
    }

    /// Answers every segment of `flight` with an error, without running it.
    pub(super) async fn answer_flight_error(
        &mut self,
        flight: &[FrontendMessage],
        code: &str,
        message: &str,
    ) -> Result<(), ClientError> {
        let ends =
            |m: &FrontendMessage| matches!(m, FrontendMessage::Sync | FrontendMessage::Query(_));
        for _ in flight.iter().filter(|m| ends(m)) {
            self.io
                .queue(&ErrorFields::new("ERROR", code, message).to_frame(b'E'));
            self.queue_ready(self.status);
        }
        if !flight.last().is_some_and(ends) {
            // Messages behind the last Sync (a flight ending in Flush): the error, then nothing
            // until the client's Sync, which gets the ReadyForQuery.
            self.io
                .queue(&ErrorFields::new("ERROR", code, message).to_frame(b'E'));
            self.skip_to_sync = true;
        }
        self.io.flush().await?;
        Ok(())
    }

    /// When the client's last commit has no position ([`ClientFloors::commit_unknown`]), asks the
    /// primary for one, which is past that commit, and takes it as the commit's (reported like
    /// any commit position). The inner `Err` says why it is still unknown.
    pub(super) async fn settle_commit_unknown(
        &mut self,
    ) -> Result<Result<(), String>, ClientError> {
        if !self.floors.commit_unknown {
            return Ok(Ok(()));
        }
        match self.primary_position().await {
            Ok(floor) => {
                self.floors.commit_unknown = false;
                self.on_position(floor, true).await?;
                Ok(Ok(()))
            }
            Err(e) => Ok(Err(format!(
                "the position of the client's last commit is unknown and the primary cannot be asked ({e})"
            ))),
        }
    }

    /// In `global` mode, when some client's commit has no position
    /// ([`crate::causal::Causal::global_uncovered`]), raises the proxy-wide floor to a primary
    /// position, which is past it. `Err` says why it is still unknown.
    async fn settle_global_unknown(&mut self) -> Result<(), String> {
        let Some(mark) = self
            .proxy
            .causal
            .global_uncovered()
            .filter(|_| self.floors.mode.level == Level::Global)
        else {
            return Ok(());
        };
        match self.primary_position().await {
            Ok(floor) => {
                self.proxy.causal.global_covered(mark, floor);
                Ok(())
            }
            Err(e) => Err(format!(
                "a commit acknowledged through the proxy has an unknown position and the primary cannot be asked ({e})"
            )),
        }
    }

    /// The primary's current position, past every commit acknowledged before this call
    /// (concurrent callers share one query; bounded by the connect timeout).
    pub(super) fn primary_position(
        &self,
    ) -> impl std::future::Future<Output = anyhow::Result<Floor>> + Send + 'static {
        let proxy = Arc::clone(&self.proxy);
        let timeout = self.config.connect_timeout;
        async move { proxy.causal.primary_position(&proxy.nodes, timeout).await }
    }

    /// The client committed (or read on the primary) at `floor`: a position taken after its
    /// last replica read, so past what that read saw (`ClientFloors::served`).
    pub(super) async fn on_position(
        &mut self,
        floor: Floor,
        wrote: bool,
    ) -> Result<(), ClientError> {
        if self.floors.mode.tracks_positions() {
            self.floors.auto = Floor::merge(self.floors.auto, Some(floor));
            self.floors.served = None;
        }
        if wrote {
            self.floors.commit = Some(floor);
            self.proxy.causal.committed(floor);
            if self.floors.mode.reports_commits() {
                self.io.queue(&build::parameter_status(
                    "lsngate.commit_lsn",
                    &floor.to_string(),
                ));
                if let Some(token) = self.config.causal.issue(floor) {
                    self.io
                        .queue(&build::parameter_status("lsngate.commit_token", &token));
                }
            }
        }
        Ok(())
    }

    /// A replica read was served at `lsn` (the replay position right after it), where its
    /// server's identity was unknown and no [`ServedOn`] could stand for it.
    pub(super) fn on_served(&mut self, lsn: Lsn) {
        if !self.floors.mode.tracks_positions() {
            return;
        }
        self.floors.auto = Floor::merge(self.floors.auto, Some(Floor::at(lsn)));
    }

    /// The node of the client's last replica read ([`ClientFloors::served`]) while it still
    /// serves reads and its monitor still reaches that same server: the next read goes there,
    /// and needs nothing of the last one. `None` without such a read, or once the mode does not
    /// keep reads monotonic.
    fn sticky_node(&self) -> Option<Arc<NodeState>> {
        let served = self.floors.served.as_ref()?;
        if !self.floors.mode.tracks_positions() {
            return None;
        }
        let node = self.proxy.nodes.get(served.node)?;
        let same_server = self
            .proxy
            .causal
            .watcher
            .monitors(served.node, &served.server);
        (same_server && self.proxy.nodes.serves(&node, Need::Any)).then_some(node)
    }

    /// Before a read on a server other than that of the client's last replica read: the
    /// primary's position now, which no replica had passed when that read ran, becomes part of
    /// the client's floor and the mark goes. Nothing to do without the mark (or in a mode that
    /// does not keep reads monotonic); an error when the primary cannot be asked (the mark stays).
    pub(super) async fn settle_served(&mut self) -> anyhow::Result<()> {
        if self.floors.served.is_none() || !self.floors.mode.tracks_positions() {
            return Ok(());
        }
        let primary = self.primary_position().await?;
        self.floors.auto = Floor::merge(self.floors.auto, Some(primary));
        self.floors.served = None;
        Ok(())
    }

    /// Tells the client whether the answers it gets are fresh (only on change).
    pub(super) fn report_stale(&mut self, stale: bool) {
        if self.floors.stale_reported != stale {
            self.floors.stale_reported = stale;
            self.io.queue(&build::parameter_status(
                "lsngate.stale",
                if stale { "on" } else { "off" },
            ));
        }
    }

    /// Waits on the attached replica until it replays `floor` or `deadline` passes: one
    /// `WAIT FOR LSN` on PostgreSQL ≥ 19. Below, a replay check on this connection; when it fails
    /// and the node's monitor polls this very server, the read waits on the monitor's polls (fast
    /// while anyone waits: one query for all waiting reads) and confirms with one more check;
    /// otherwise (a load balancer put this connection elsewhere) it polls here with backoff. A
    /// read that may not wait (`waits` false: the fast modes) checks once. A replica that fails
    /// or stays silent past the deadline is dropped (`Settled::Lost`); a cancel request from the
    /// client ends it (`Settled::Cancelled`).
    pub(super) async fn settle_floor(
        &mut self,
        floor: Floor,
        deadline: Instant,
        waits: bool,
    ) -> Settled {
        let mut backoff = lsngate_core::pace::ReplayBackoff::default();
        let cancels = self.cancel_requests();
        loop {
            if self.cancel_requests() != cancels {
                return Settled::Cancelled;
            }
            let Some(attached) = self.backend.as_mut() else {
                return Settled::Lost;
            };
            let (node, server) = (attached.conn.node, attached.conn.facts.server.clone());
            let wait = attached.conn.facts.has_wait_for() && waits;
            let sql = if wait {
                let left = deadline.saturating_duration_since(Instant::now());
                wait_for_sql(floor.lsn, left)
            } else {
                REPLAY_SQL.to_string()
            };
            let row =
                crate::timer::timeout_at(deadline + GRACE, attached.conn.query_row(&sql)).await;
            let row = match row {
                Ok(Ok(row)) => row,
                Ok(Err(e)) => {
                    tracing::warn!("replica lost while waiting for a read's floor: {e}");
                    self.backend = None;
                    return Settled::Lost;
                }
                Err(_) => {
                    self.backend = None;
                    return Settled::Lost;
                }
            };
            let proxy = std::sync::Arc::clone(&self.proxy);
            let watcher = &proxy.causal.watcher;
            let row = crate::net::backend::columns(&row);
            match Verdict::from_row(Some(&row), wait, floor.lsn) {
                Verdict::Passed => {
                    watcher.observe_replayed(node, &server, floor.lsn);
                    return Settled::Passed;
                }
                Verdict::NotInRecovery => {
                    if let Some(n) = proxy.nodes.get(node) {
                        n.request_check();
                    }
                    return Settled::NotYet;
                }
                Verdict::NotYet { replayed } => {
                    if let Some(r) = replayed {
                        watcher.observe_replayed(node, &server, r);
                    }
                    if wait || !waits || Instant::now() >= deadline {
                        return Settled::NotYet;
                    }
                    if watcher.monitors(node, &server) {
                        if let Some(n) = proxy.nodes.get(node) {
                            n.request_check();
                        }
                        // Woken by any observation; re-checked on this connection after.
                        let until = deadline.min(Instant::now() + Duration::from_millis(100));
                        watcher.wait_replayed(node, &server, floor.lsn, until).await;
                    } else {
                        let left = deadline.saturating_duration_since(Instant::now());
                        crate::timer::sleep(backoff.next_pause(left)).await;
                    }
                }
            }
        }
    }

    /// PostgreSQL ≤ 18, after the check in front of a read failed: poll the same server until it
    /// replays `floor` or the budget (from `started`) is spent; then read there again, serve it
    /// stale, or fall back.
    pub(super) async fn poll_then_read(
        &mut self,
        read: CausalRead,
        floor: Floor,
        started: Instant,
    ) -> Result<(), ClientError> {
        let deadline = started + self.config.causal.wait_timeout;
        // Only a read that may wait polls.
        let settled = self.settle_floor(floor, deadline, true).await;
        self.proxy.causal.stats.record_wait(started.elapsed());
        let node = self
            .backend
            .as_ref()
            .and_then(|b| self.proxy.nodes.get(b.conn.node));
        let stale = self.config.causal.fallback == Fallback::Stale;
        if settled == Settled::Cancelled {
            self.release_backend();
            let message = "canceling statement due to user request (while lsngate waited for a replica to replay the read's floor)";
            return self
                .answer_flight_error(&read.flight, sqlstate::QUERY_CANCELED, message)
                .await;
        }
        match (settled, node) {
            (Settled::Passed, Some(node)) => {
                self.record_read(Outcome::Waited);
                self.report_stale(false);
                // The floor is confirmed on this server: sent as a plain read (counted above).
                let route = Route {
                    target: Some(Target::Replica),
                    node: Some(node),
                    read: None,
                    count: None,
                    replan: None,
                    log: read.log,
                };
                self.dispatch_to(read.flight, read.class, route).await
            }
            (Settled::NotYet, Some(node)) if stale => {
                self.serve_stale(&node.url.address(), floor);
                let route = Route {
                    target: Some(Target::Replica),
                    node: Some(node),
                    read: None,
                    count: None,
                    replan: None,
                    log: read.log,
                };
                self.dispatch_to(read.flight, read.class, route).await
            }
            _ => {
                self.release_backend();
                self.fall_back(read).await
            }
        }
    }

    /// Cancel requests the client has sent so far.
    pub(super) fn cancel_requests(&self) -> u64 {
        self.cancel_slot.lock().expect("cancel slot").requests
    }

    /// Flags the answer about to be relayed as possibly stale (fallback = stale).
    pub(super) fn serve_stale(&mut self, replica: &str, floor: Floor) {
        self.record_read(Outcome::Stale);
        let notice = format!(
            "lsngate: served by replica {replica} which had not replayed {floor} within {} ms; the answer may be stale",
            self.config.causal.wait_timeout.as_millis()
        );
        self.io
            .queue(&ErrorFields::new("NOTICE", sqlstate::WARNING, notice).to_frame(b'N'));
        self.report_stale(true);
    }
}

/// How waiting for a floor on the attached replica ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The client sent a cancel request meanwhile.
    Cancelled,
    /// The floor is replayed there.
    Passed,
    /// Not within the deadline (or the server was promoted).
    NotYet,
    /// The replica failed or went silent; the backend was dropped.
    Lost,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_stay_on_a_marked_server_and_take_a_position_when_they_must_move() {
        let (a, b) = (ServerId::from("7/1/a:1"), ServerId::from("7/1/b:1"));
        let mut floors = ClientFloors::default();
        assert!(
            !floors.replica_read_sent(0, &a, false),
            "a first read marks its server"
        );
        let since = floors.served.as_ref().expect("marked").since;
        assert!(!floors.replica_read_sent(0, &a, false));
        assert_eq!(
            floors.served.as_ref().map(|on| on.since),
            Some(since),
            "the same server keeps when the reads came to it"
        );
        assert!(!floors.replica_read_sent(1, &b, false));
        let on = floors.served.clone().expect("marked");
        assert_eq!(
            (on.node, on.server),
            (1, b.clone()),
            "another server is marked anew"
        );
        // A second on one server: this read takes the position, and the mark goes.
        floors.served.as_mut().expect("marked").since = Instant::now() - STICKY_FOR;
        assert!(floors.replica_read_sent(1, &b, false));
        assert_eq!(floors.served, None);
        assert!(
            floors.replica_read_sent(0, &a, true),
            "an address that fronts several servers takes the position"
        );
        assert_eq!(floors.served, None);
        assert!(
            floors.replica_read_sent(0, &ServerId::default(), false),
            "an unknown server takes the position"
        );
        assert_eq!(floors.served, None);
    }
}
