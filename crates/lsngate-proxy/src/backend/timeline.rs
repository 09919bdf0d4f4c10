//! Timeline knowledge per node, kept in atomics because routing reads it on every replica read:
//! the cells the node monitor writes. The rules that read them are `lsngate_core::timeline`'s.

use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};

pub use lsngate_core::timeline::{Need, Receiver, ReplicaTimeline, admits};

/// A node's timeline knowledge, kept in atomics: routing reads it on every replica read.
#[derive(Debug, Default)]
pub struct TimelineCell {
    /// The last timeline seen (0: never).
    timeline: AtomicU32,
    receiver: AtomicU8,
}

impl TimelineCell {
    /// What a replica poll saw: `Some(received_tli)`, `Some(0)` for a receiver whose timeline is
    /// hidden, `None` for no receiver. True when the receiver is running with its timeline hidden
    /// for the first time (worth a warning).
    pub fn observe_replica(&self, received: Option<u32>) -> bool {
        let receiver = Receiver::from_received(received);
        if let Some(timeline) = received.filter(|t| *t != 0) {
            self.timeline.store(timeline, Ordering::Relaxed);
        }
        let old = self.receiver.swap(receiver as u8, Ordering::Relaxed);
        receiver == Receiver::Hidden && old != Receiver::Hidden as u8
    }

    /// A poll of this node as a primary writing `timeline`.
    pub fn observe_primary(&self, timeline: Option<u32>) {
        if let Some(timeline) = timeline {
            self.timeline.store(timeline, Ordering::Relaxed);
        }
    }

    /// The node's timeline knowledge now.
    pub fn get(&self) -> ReplicaTimeline {
        let receiver = match self.receiver.load(Ordering::Relaxed) {
            1 => Receiver::Streaming,
            2 => Receiver::Hidden,
            3 => Receiver::Down,
            _ => Receiver::Unseen,
        };
        let timeline = self.timeline.load(Ordering::Relaxed);
        ReplicaTimeline {
            last_known: (timeline != 0).then_some(timeline),
            receiver,
        }
    }
}

/// The newest timeline any primary was seen writing (never lowers).
#[derive(Debug, Default)]
pub struct NewestTimeline(AtomicU32);

impl NewestTimeline {
    /// A primary was seen writing `timeline`.
    pub fn observe(&self, timeline: u32) {
        self.0.fetch_max(timeline, Ordering::Relaxed);
    }

    /// The newest seen, if any.
    pub fn get(&self) -> Option<u32> {
        let timeline = self.0.load(Ordering::Relaxed);
        (timeline != 0).then_some(timeline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cell_keeps_the_last_timeline_while_the_receiver_is_down() {
        let cell = TimelineCell::default();
        assert_eq!(cell.get(), ReplicaTimeline::default());
        assert!(!cell.observe_replica(Some(1)));
        assert!(!cell.observe_replica(None));
        assert_eq!(
            cell.get(),
            ReplicaTimeline {
                last_known: Some(1),
                receiver: Receiver::Down
            }
        );
        assert!(
            cell.observe_replica(Some(0)),
            "hidden is worth a warning once"
        );
        assert!(!cell.observe_replica(Some(0)));
        assert_eq!(
            cell.get(),
            ReplicaTimeline {
                last_known: Some(1),
                receiver: Receiver::Hidden
            }
        );
        let newest = NewestTimeline::default();
        assert_eq!(newest.get(), None);
        newest.observe(2);
        newest.observe(1);
        assert_eq!(newest.get(), Some(2));
    }
}
