//! The routing plan of one flight: a pure function from what the session knows — its
//! transaction status, whether it is pinned or mid-batch, its route hint — and the statement's
//! class and hint to where the flight goes. No I/O and no node choice: a read planned for a
//! replica is then placed by its floor (`causal.rs`, which asks `lsngate_core::route`), anything
//! else goes to a target (`flight.rs`). The pass-through (`passthrough.rs`) is the same plan's
//! fast branch for a `Class::Write` (or a read with no replica serving) planned as `Send`.

use crate::backend::Target;
use crate::net::backend::TxStatus;
use crate::statement::{Class, RouteHint};

/// What the plan reads of the session.
#[derive(Debug, Clone, Copy)]
pub(super) struct SessionView {
    /// The transaction status the client last saw.
    pub status: TxStatus,
    /// The session stays on one backend (session pooling, LISTEN, PREPARE, cursors).
    pub pinned: bool,
    /// The attached backend is inside an extended batch not yet synced, or a COPY.
    pub mid_batch: bool,
    /// A server connection is attached to the session.
    pub attached: bool,
    /// The session's route hint (`SET lsngate.route`).
    pub hint: RouteHint,
}

/// Where a flight goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Plan {
    /// A read outside any transaction: a replica that has the client's floor serves it, or
    /// the fallback policy decides (`Session::dispatch_read`).
    ReplicaRead,
    /// To this target; `None` = wherever the session already is (transaction control).
    Send(Option<Target>),
}

/// Where a statement of `class` should run after the hints: the statement's own (a comment)
/// before the session's.
pub(super) fn target(
    class: Option<Class>,
    hint: Option<RouteHint>,
    session: RouteHint,
) -> Option<Target> {
    match hint.unwrap_or(session) {
        RouteHint::Primary => return Some(Target::Primary),
        RouteHint::Replica if class.is_some() => return Some(Target::Replica),
        _ => {}
    }
    match class? {
        Class::Read | Class::Begin { read_only: true } => Some(Target::Replica),
        Class::TransactionControl | Class::TransactionLocal => None,
        _ => Some(Target::Primary),
    }
}

/// The plan of a flight of `class` with the statement's `hint`, for a session in `view`.
pub(super) fn plan(view: SessionView, class: Option<Class>, hint: Option<RouteHint>) -> Plan {
    let want = target(class, hint, view.hint);
    if view.pinned
        && !view.attached
        && want == Some(Target::Replica)
        && hint.unwrap_or(view.hint) != RouteHint::Replica
    {
        // A pinned session with no connection yet (session pooling's first statement) is
        // pinned to a primary connection: "stay where the session is" means nothing here, and
        // a replica chosen for it would hold the client's writes and skip its floors.
        return Plan::Send(Some(Target::Primary));
    }
    let standalone = view.status == TxStatus::Idle && !view.pinned && !view.mid_batch;
    if want == Some(Target::Replica) && standalone {
        Plan::ReplicaRead
    } else {
        Plan::Send(want)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle() -> SessionView {
        SessionView {
            status: TxStatus::Idle,
            pinned: false,
            mid_batch: false,
            attached: true,
            hint: RouteHint::Auto,
        }
    }

    #[test]
    fn reads_outside_a_transaction_go_to_a_replica_read_and_writes_to_the_primary() {
        assert_eq!(plan(idle(), Some(Class::Read), None), Plan::ReplicaRead);
        let begin_ro = Some(Class::Begin { read_only: true });
        assert_eq!(plan(idle(), begin_ro, None), Plan::ReplicaRead);
        for class in [
            Class::Write,
            Class::Begin { read_only: false },
            Class::SessionState,
            Class::Pin,
        ] {
            assert_eq!(
                plan(idle(), Some(class), None),
                Plan::Send(Some(Target::Primary))
            );
        }
        for class in [Class::TransactionControl, Class::TransactionLocal] {
            assert_eq!(
                plan(idle(), Some(class), None),
                Plan::Send(None),
                "{class:?}"
            );
        }
        // Nothing classified (a Sync alone, a Describe): wherever the session is.
        assert_eq!(plan(idle(), None, None), Plan::Send(None));
    }

    #[test]
    fn a_read_inside_a_block_a_pin_or_an_open_batch_stays_where_the_session_is_sent() {
        let cases = [
            SessionView {
                status: TxStatus::InBlock,
                ..idle()
            },
            SessionView {
                status: TxStatus::Failed,
                ..idle()
            },
            SessionView {
                pinned: true,
                ..idle()
            },
            SessionView {
                mid_batch: true,
                ..idle()
            },
        ];
        for view in cases {
            // Not a replica read placed by floor: sent to the replica target only as the
            // session's own (flight.rs keeps a block on its backend).
            assert_eq!(
                plan(view, Some(Class::Read), None),
                Plan::Send(Some(Target::Replica)),
                "{view:?}"
            );
        }
    }

    #[test]
    fn a_pinned_session_without_a_connection_starts_on_the_primary() {
        let fresh = SessionView {
            pinned: true,
            attached: false,
            ..idle()
        };
        assert_eq!(
            plan(fresh, Some(Class::Read), None),
            Plan::Send(Some(Target::Primary))
        );
        // An explicit replica hint is honoured: the client asked for it.
        assert_eq!(
            plan(fresh, Some(Class::Read), Some(RouteHint::Replica)),
            Plan::Send(Some(Target::Replica))
        );
        // Attached: the read stays on the pinned connection.
        let pinned = SessionView {
            pinned: true,
            ..idle()
        };
        assert_eq!(
            plan(pinned, Some(Class::Read), None),
            Plan::Send(Some(Target::Replica))
        );
    }

    #[test]
    fn the_statements_hint_wins_over_the_sessions_and_primary_wins_over_class() {
        let to_replica = SessionView {
            hint: RouteHint::Replica,
            ..idle()
        };
        assert_eq!(
            plan(to_replica, Some(Class::Write), None),
            Plan::ReplicaRead
        );
        assert_eq!(
            plan(to_replica, Some(Class::Read), Some(RouteHint::Primary)),
            Plan::Send(Some(Target::Primary))
        );
        let to_primary = SessionView {
            hint: RouteHint::Primary,
            ..idle()
        };
        assert_eq!(
            plan(to_primary, Some(Class::Read), None),
            Plan::Send(Some(Target::Primary))
        );
        assert_eq!(
            plan(to_primary, Some(Class::Read), Some(RouteHint::Auto)),
            Plan::ReplicaRead
        );
        // A replica hint needs a statement: a bare Sync is not sent anywhere new.
        assert_eq!(plan(to_replica, None, None), Plan::Send(None));
        assert_eq!(
            plan(to_primary, None, None),
            Plan::Send(Some(Target::Primary))
        );
    }
}
