//! Timelines: which replicas may serve a read after a failover. Pure rules, no I/O; the library
//! and the proxy feed them what their monitors see.
//!
//! A WAL position means nothing without the history it belongs to. After a promotion the new
//! primary writes timeline N+1 from the fork point on, while a replica that did not follow it
//! (an *orphan*) may have replayed the old timeline past the fork point: positions it reports
//! are numerically comparable with the new primary's and describe writes that no longer exist.
//! `WAIT FOR LSN` and `pg_last_wal_replay_lsn()` compare numbers only, so the proxy must keep
//! orphans out by timeline before a position is ever compared:
//!
//! - a replica known to be on an older timeline than the newest primary seen serves nothing;
//! - a read with a floor is served only by a replica whose timeline is known and at least the
//!   floor's; a floor without a timeline (a bare `X/Y`) counts as taken on the newest primary
//!   timeline the proxy has seen — if the write it stands for was on an older timeline past the
//!   fork point, it was lost with the old primary, and the new primary's history is the truth;
//! - a replica whose timeline was never learned and whose WAL receiver is not running (it
//!   follows nobody, so it may be an orphan) serves nothing.
//!
//! A replica's timeline is its WAL receiver's (`pg_stat_wal_receiver.received_tli`). The last one
//! seen is kept while the receiver is down (a primary restart must not stop replicas serving).
//! Without `pg_read_all_stats` the monitor sees that a receiver runs but not its timeline: such a
//! replica is admitted as before, and the proxy warns that it cannot tell an orphan.

/// What a replica's WAL receiver looked like at the last poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Receiver {
    /// Not polled as a replica yet.
    #[default]
    Unseen,
    /// Streaming on a known timeline.
    Streaming,
    /// Running, timeline hidden (the monitor's role lacks `pg_read_all_stats`).
    Hidden,
    /// No WAL receiver: the replica follows nobody right now.
    Down,
}

/// A replica's timeline as far as the monitor knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReplicaTimeline {
    /// The last timeline its receiver reported (kept while the receiver is down).
    pub last_known: Option<u32>,
    /// Its receiver at the last poll.
    pub receiver: Receiver,
}

/// What a read asks of a replica's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// No floor: any replica that is not an orphan.
    Any,
    /// A floor taken on this primary timeline (`None`: a bare `X/Y`).
    Floor(Option<u32>),
}

/// Whether a replica on `replica` may serve a read needing `need`, the newest primary timeline
/// seen being `newest`.
pub fn admits(replica: ReplicaTimeline, newest: Option<u32>, need: Need) -> bool {
    if let (Some(on), Some(newest)) = (replica.last_known, newest)
        && on < newest
    {
        return false;
    }
    let unknown_ok = replica.receiver == Receiver::Hidden;
    match need {
        Need::Any => replica.last_known.is_some() || replica.receiver != Receiver::Down,
        Need::Floor(taken_on) => match (replica.last_known, taken_on.max(newest)) {
            (Some(on), Some(needed)) => on >= needed,
            (Some(_), None) => true,
            (None, _) => unknown_ok,
        },
    }
}

/// Whether a read with a floor taken on `taken_on` goes to the primary whatever the replicas
/// say: the floor predates the newest primary timeline seen, so its write may have been lost at
/// the fork and only the current primary's history answers for it. A floor from a timeline
/// *newer* than any primary seen (the router has not seen the promotion yet) does not: [`admits`]
/// lets only replicas already on that timeline serve it. The library and the proxy both ask this.
pub fn floor_predates(taken_on: Option<u32>, newest: Option<u32>) -> bool {
    matches!((taken_on, newest), (Some(taken_on), Some(newest)) if taken_on < newest)
}

impl Receiver {
    /// What a poll's `received_tli` said: `Some(timeline)` (0 when the timeline is hidden from
    /// the role asking) for a running receiver, `None` for none.
    pub fn from_received(received: Option<u32>) -> Receiver {
        match received {
            None => Receiver::Down,
            Some(0) => Receiver::Hidden,
            Some(_) => Receiver::Streaming,
        }
    }

    /// Its name, for status pages: `unseen`, `streaming`, `hidden`, `down`.
    pub fn as_str(self) -> &'static str {
        match self {
            Receiver::Unseen => "unseen",
            Receiver::Streaming => "streaming",
            Receiver::Hidden => "hidden",
            Receiver::Down => "down",
        }
    }
}

impl ReplicaTimeline {
    /// Takes in a poll's `received_tli` (see [`Receiver::from_received`]); the last known
    /// timeline stays while the receiver is down or hides it. True when the timeline became
    /// hidden with this poll (worth a warning).
    pub fn observe(&mut self, received: Option<u32>) -> bool {
        let receiver = Receiver::from_received(received);
        if let Some(timeline) = received.filter(|t| *t != 0) {
            self.last_known = Some(timeline);
        }
        let newly_hidden = receiver == Receiver::Hidden && self.receiver != Receiver::Hidden;
        self.receiver = receiver;
        newly_hidden
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(last_known: Option<u32>, receiver: Receiver) -> ReplicaTimeline {
        ReplicaTimeline {
            last_known,
            receiver,
        }
    }

    #[test]
    fn an_orphan_serves_nothing() {
        let orphan = replica(Some(1), Receiver::Down);
        for need in [
            Need::Any,
            Need::Floor(None),
            Need::Floor(Some(1)),
            Need::Floor(Some(2)),
        ] {
            assert!(!admits(orphan, Some(2), need), "{need:?}");
        }
        // Streaming the old timeline from somewhere (a cascade off the old primary): still old.
        assert!(!admits(
            replica(Some(1), Receiver::Streaming),
            Some(2),
            Need::Any
        ));
    }

    #[test]
    fn only_a_floor_older_than_the_newest_primary_timeline_predates_it() {
        assert!(floor_predates(Some(1), Some(2)));
        assert!(!floor_predates(Some(2), Some(2)));
        // Newer than any primary seen: replicas on it may serve (admits decides), not forced.
        assert!(!floor_predates(Some(3), Some(2)));
        assert!(!admits(
            replica(Some(2), Receiver::Streaming),
            Some(2),
            Need::Floor(Some(3))
        ));
        assert!(admits(
            replica(Some(3), Receiver::Streaming),
            Some(2),
            Need::Floor(Some(3))
        ));
        // Unknown on either side: nothing to compare, the replica rules apply.
        assert!(!floor_predates(None, Some(2)));
        assert!(!floor_predates(Some(1), None));
    }

    #[test]
    fn a_bare_floor_counts_as_the_newest_primary_timeline() {
        let follower = replica(Some(2), Receiver::Streaming);
        assert!(admits(follower, Some(2), Need::Floor(None)));
        assert!(admits(follower, Some(2), Need::Floor(Some(1))));
        // A floor from a failover the proxy has not seen yet: only replicas already past it.
        assert!(!admits(follower, Some(2), Need::Floor(Some(3))));
        assert!(admits(
            replica(Some(3), Receiver::Streaming),
            Some(2),
            Need::Floor(Some(3))
        ));
        // Before any primary was seen, a replica with a known timeline serves a bare floor.
        assert!(admits(follower, None, Need::Floor(None)));
    }

    #[test]
    fn an_unknown_timeline_serves_a_floor_only_when_hidden_by_privileges() {
        for receiver in [Receiver::Unseen, Receiver::Down, Receiver::Streaming] {
            assert!(!admits(replica(None, receiver), Some(1), Need::Floor(None)));
        }
        assert!(admits(
            replica(None, Receiver::Hidden),
            Some(1),
            Need::Floor(None)
        ));
        // Without a floor: only a replica that follows nobody and was never seen following is out.
        assert!(!admits(replica(None, Receiver::Down), Some(1), Need::Any));
        assert!(admits(replica(None, Receiver::Hidden), Some(1), Need::Any));
        assert!(admits(replica(None, Receiver::Unseen), Some(1), Need::Any));
        // A primary restart: receivers down, last timeline kept, replicas go on serving.
        assert!(admits(
            replica(Some(1), Receiver::Down),
            Some(1),
            Need::Floor(Some(1))
        ));
    }

    #[test]
    fn a_replica_timeline_keeps_the_last_one_seen() {
        let mut seen = ReplicaTimeline::default();
        assert!(!seen.observe(Some(1)));
        assert!(!seen.observe(None));
        assert_eq!(seen, replica(Some(1), Receiver::Down));
        assert!(seen.observe(Some(0)), "hidden is worth a warning once");
        assert!(!seen.observe(Some(0)));
        assert_eq!(seen, replica(Some(1), Receiver::Hidden));
        assert!(!seen.observe(Some(2)));
        assert_eq!(seen, replica(Some(2), Receiver::Streaming));
    }
}
