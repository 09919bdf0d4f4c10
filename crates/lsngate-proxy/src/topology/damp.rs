//! Hysteresis for the node set: a member's change (joined, left, moved, tags changed) applies
//! only once the topology source showed it in `settle` consecutive polls, so a member flapping
//! between states faster than that never moves the node set. Pure: observations in, the set to
//! apply out; the first observation applies at once (there is nothing to damp against).
//!
//! Roles are not damped here: which node takes writes is what the server itself says
//! (`pg_is_in_recovery()`, the monitor), and a role change Patroni reports only makes the
//! monitors look at once.

use std::collections::BTreeMap;

/// What the node set needs of a member: where it is and whether it takes reads.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Placement {
    /// PostgreSQL's host.
    pub host: String,
    /// PostgreSQL's port.
    pub port: u16,
    /// False for `noloadbalance` members.
    pub reads: bool,
}

/// The damped node set, by member name.
#[derive(Debug)]
pub struct Damper {
    settle: u32,
    applied: Option<BTreeMap<String, Placement>>,
    /// A change seen but not applied yet: the state it changes to (None: leaves) and the
    /// consecutive polls it was seen in.
    pending: BTreeMap<String, (Option<Placement>, u32)>,
}

impl Damper {
    /// A damper that applies a change seen in `settle` consecutive polls.
    pub fn new(settle: u32) -> Damper {
        Damper {
            settle: settle.max(1),
            applied: None,
            pending: BTreeMap::new(),
        }
    }

    /// Takes one poll's members; true when the applied set changed.
    pub fn observe(&mut self, seen: &BTreeMap<String, Placement>) -> bool {
        let Some(applied) = &mut self.applied else {
            self.applied = Some(seen.clone());
            return true;
        };
        // Pending names too: a member that came and went before it settled is in neither set,
        // and its count must still be reset, or a later sighting would finish an old count.
        let names: std::collections::BTreeSet<String> = applied
            .keys()
            .chain(seen.keys())
            .chain(self.pending.keys())
            .cloned()
            .collect();
        let mut changed = false;
        for name in names {
            let now = seen.get(&name).cloned();
            if applied.get(&name) == now.as_ref() {
                self.pending.remove(&name);
                continue;
            }
            let count = match self.pending.get(&name) {
                Some((pending, count)) if *pending == now => count + 1,
                _ => 1,
            };
            if count >= self.settle {
                self.pending.remove(&name);
                match now {
                    Some(placement) => applied.insert(name, placement),
                    None => applied.remove(&name),
                };
                changed = true;
            } else {
                self.pending.insert(name, (now, count));
            }
        }
        changed
    }

    /// The node set as applied, by member name (empty before the first observation).
    pub fn applied(&self) -> BTreeMap<String, Placement> {
        self.applied.clone().unwrap_or_default()
    }

    /// Changes seen but not applied yet: member, what it changes to (None: leaves), polls seen.
    pub fn pending(&self) -> Vec<(String, Option<Placement>, u32)> {
        self.pending
            .iter()
            .map(|(name, (to, count))| (name.clone(), to.clone(), *count))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(members: &[(&str, u16)]) -> BTreeMap<String, Placement> {
        members
            .iter()
            .map(|(name, port)| {
                let placement = Placement {
                    host: "127.0.0.1".into(),
                    port: *port,
                    reads: true,
                };
                (name.to_string(), placement)
            })
            .collect()
    }

    #[test]
    fn the_first_poll_applies_and_a_change_needs_settle_polls() {
        let mut damper = Damper::new(3);
        assert!(damper.observe(&set(&[("m1", 1), ("m2", 2)])));
        let three = set(&[("m1", 1), ("m2", 2), ("m3", 3)]);
        assert!(!damper.observe(&three));
        assert!(!damper.observe(&three));
        assert_eq!(damper.pending().len(), 1);
        assert!(damper.observe(&three), "third consecutive poll applies");
        assert_eq!(damper.applied().len(), 3);
        assert!(damper.pending().is_empty());
    }

    #[test]
    fn a_flapping_member_never_moves_the_set() {
        let mut damper = Damper::new(3);
        let (two, three) = (
            set(&[("m1", 1), ("m2", 2)]),
            set(&[("m1", 1), ("m2", 2), ("m3", 3)]),
        );
        damper.observe(&two);
        for _ in 0..10 {
            assert!(!damper.observe(&three));
            assert!(!damper.observe(&three));
            assert!(
                !damper.observe(&two),
                "back before it settled: nothing applies"
            );
        }
        assert_eq!(damper.applied(), two);
        // Leaving is damped the same way.
        assert!(!damper.observe(&set(&[("m1", 1)])));
        assert!(!damper.observe(&two));
        assert_eq!(damper.applied(), two);
    }

    #[test]
    fn a_tag_change_is_a_change() {
        let mut damper = Damper::new(2);
        let two = set(&[("m1", 1), ("m2", 2)]);
        damper.observe(&two);
        let mut tagged = two.clone();
        tagged.get_mut("m2").unwrap().reads = false;
        assert!(!damper.observe(&tagged));
        assert!(damper.observe(&tagged));
        assert!(!damper.applied()["m2"].reads);
    }
}
