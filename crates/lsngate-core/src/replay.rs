//! What is known about replay, per *server*: the highest position each server reported having
//! replayed, which servers were seen behind each configured replica address (a *slot*) and when,
//! and the primary's [`WalClock`]. The library's watcher and the proxy's keep one [`ReplayBook`]
//! each, behind a lock, and feed it from their own connections (monitor polls, waits, checks,
//! the position trailing a read).
//!
//! Two rules make a shortcut taken from it ("already replayed, read at once") never wrong:
//! positions are only ever recorded for the server that reported them ([`ServerId`], never the
//! address), and they only rise (replay is monotonic on a running server; a restarted server is a
//! new id). Routing sees the *lowest* position over the servers recently seen behind a slot, so
//! an address that fronts several servers (a load balancer) cannot make a read skip its wait; a
//! server not heard of for [`SERVER_FORGOTTEN_AFTER`] stops holding its slot back.
//!
//! Not here: health, roles and timelines of slots (the adapters keep those in their own shape),
//! waiting, and any I/O. Times are durations since an origin the caller keeps.

use std::collections::HashMap;
use std::time::Duration;

use foldhash::fast::RandomState;

use crate::budget::LagWindow;
use crate::clock::WalClock;
use crate::lsn::Lsn;
use crate::server::ServerId;

/// A server not heard of for this long no longer counts for its slot (it was restarted — a new
/// postmaster start time is a new server — or a load balancer stopped sending there). Only
/// routing forgets it; a read that reaches it again is checked against its own position.
pub const SERVER_FORGOTTEN_AFTER: Duration = Duration::from_secs(5);

/// Samples of the primary's WAL clock kept. The library samples at every commit as well as at
/// every poll, so a busy writer fills the window fastest there; 4096 samples (about 100 KiB,
/// searched by bisection) keep a lag measurable over a longer gap than the 2048 the library kept.
pub const CLOCK_SAMPLES: usize = 4096;

/// Replay knowledge of one gate or proxy.
#[derive(Debug, Clone)]
pub struct ReplayBook {
    // foldhash, not SipHash: every routed read looks a server up here, under the book's lock,
    // and the keys come from the servers' own answers, not from clients.
    replayed: HashMap<ServerId, Lsn, RandomState>,
    /// Per slot: the servers seen behind it, with when each last reported.
    seen: HashMap<usize, HashMap<ServerId, Duration, RandomState>, RandomState>,
    clock: WalClock,
    /// Per slot: how long each newly replayed position took to become visible there.
    visible: HashMap<usize, LagWindow, RandomState>,
    /// Whether visibility lags are sampled (see [`ReplayBook::sampling_visibility`]).
    sample_visible: bool,
}

/// How far back the visibility-lag samples of a slot reach (the budget advice's window).
pub const VISIBLE_SPAN: Duration = Duration::from_secs(15 * 60);

/// Most samples one rise of replay adds (a replica catching up passes many commits at once).
pub const VISIBLE_PER_RISE: usize = 32;

/// Visibility-lag samples kept per slot: ten a second over [`VISIBLE_SPAN`] (about 140 KiB).
pub const VISIBLE_SAMPLES: usize = 9000;

impl Default for ReplayBook {
    fn default() -> Self {
        ReplayBook {
            replayed: HashMap::default(),
            seen: HashMap::default(),
            clock: WalClock::new(CLOCK_SAMPLES),
            visible: HashMap::default(),
            sample_visible: false,
        }
    }
}

impl ReplayBook {
    /// `server`, reached through `slot`, reported at `now` having replayed `lsn` (never lowers).
    /// When the position rose, how long each primary position it passed (as the WAL clock
    /// sampled them: commits, polls) took to become visible is a sample for the budget advice:
    /// what a token read right after that commit waited. Replay positions themselves are no
    /// tokens: with `recovery_min_apply_delay` a transaction's records replay at once and only
    /// its commit waits, so a position short of the commit says nothing of a token's wait.
    pub fn observe_replayed(&mut self, slot: usize, server: &ServerId, lsn: Lsn, now: Duration) {
        let known = self.replayed.entry(server.clone()).or_insert(lsn);
        let before = *known;
        *known = (*known).max(lsn);
        if self.sample_visible && lsn > before {
            let reported = self.seen.get(&slot).and_then(|s| s.get(server)).copied();
            let ages = self
                .clock
                .ages_between(before, lsn, reported, now, VISIBLE_PER_RISE);
            let window = self
                .visible
                .entry(slot)
                .or_insert_with(|| LagWindow::new(VISIBLE_SPAN, VISIBLE_SAMPLES));
            ages.into_iter().for_each(|age| window.push(now, age));
        }
        self.seen
            .entry(slot)
            .or_default()
            .insert(server.clone(), now);
    }

    /// What `server` is known to have replayed.
    pub fn replayed(&self, server: &str) -> Option<Lsn> {
        self.replayed.get(server).copied()
    }

    /// The lowest position over the servers seen behind `slot` within
    /// [`SERVER_FORGOTTEN_AFTER`] of `now`; `None` when none was, or one of them has no position.
    pub fn slot_replayed(&self, slot: usize, now: Duration) -> Option<Lsn> {
        let mut positions = self
            .recent(slot, now)
            .map(|server| self.replayed.get(server).copied());
        let first = positions.next()??;
        positions.try_fold(first, |low, p| p.map(|p| low.min(p)))
    }

    /// Whether more than one server reported behind `slot` within [`SERVER_FORGOTTEN_AFTER`] of
    /// `now` (a load balancer in front of several, or a restart just now).
    pub fn several_servers(&self, slot: usize, now: Duration) -> bool {
        self.recent(slot, now).nth(1).is_some()
    }

    /// The servers seen behind `slot` within [`SERVER_FORGOTTEN_AFTER`] of `now`.
    fn recent(&self, slot: usize, now: Duration) -> impl Iterator<Item = &ServerId> {
        self.seen
            .get(&slot)
            .into_iter()
            .flatten()
            .filter(move |(_, seen)| now.saturating_sub(**seen) < SERVER_FORGOTTEN_AFTER)
            .map(|(server, _)| server)
    }

    /// Distinct servers ever seen behind `slot` (more than one: a load balancer, or restarts).
    pub fn servers_seen(&self, slot: usize) -> usize {
        self.seen.get(&slot).map_or(0, HashMap::len)
    }

    /// A book that also samples visibility lags for the budget advice (the proxy's; at most
    /// [`VISIBLE_SAMPLES`] per slot). Off by default: a book whose owner never asks for advice
    /// keeps no samples.
    pub fn sampling_visibility() -> ReplayBook {
        ReplayBook {
            sample_visible: true,
            ..ReplayBook::default()
        }
    }

    /// How far back before `now` the visibility lags of `slot` reach; `None` with none.
    pub fn visible_reach(&self, slot: usize, now: Duration) -> Option<Duration> {
        self.visible.get(&slot).and_then(|w| w.reach(now))
    }

    /// The visibility lags sampled behind `slot` within [`VISIBLE_SPAN`] of `now`.
    pub fn visible_lags(&self, slot: usize, now: Duration) -> Vec<Duration> {
        self.visible
            .get(&slot)
            .map_or_else(Vec::new, |w| w.lags(now))
    }

    /// The primary was at `lsn` at `now` (a WAL clock sample).
    pub fn observe_primary(&mut self, now: Duration, lsn: Lsn) {
        self.clock.observe(now, lsn);
    }

    /// The primary's last sampled position.
    pub fn primary_position(&self) -> Option<Lsn> {
        self.clock.latest()
    }

    /// Bytes a replica at `replayed` is behind the primary's last sampled position.
    pub fn lag_bytes(&self, replayed: Lsn) -> Option<u64> {
        self.primary_position().map(|p| p.bytes_since(replayed))
    }

    /// How long before `now` the primary first wrote past `replayed` (see
    /// [`WalClock::lag_behind`]).
    pub fn lag_behind(&self, replayed: Lsn, now: Duration) -> Option<Duration> {
        self.clock.lag_behind(replayed, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lsn(n: u64) -> Lsn {
        Lsn::new(n)
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn positions_only_rise_and_stay_with_their_server() {
        let mut book = ReplayBook::default();
        let (a, b) = (ServerId::from("7/1/a:1"), ServerId::from("7/1/b:1"));
        book.observe_replayed(0, &a, lsn(100), S(0));
        book.observe_replayed(0, &a, lsn(50), S(0));
        assert_eq!(book.replayed(&a), Some(lsn(100)));
        assert_eq!(book.replayed(&b), None, "what A replayed says nothing of B");
        book.observe_replayed(0, &b, lsn(70), S(0));
        assert_eq!(
            book.slot_replayed(0, S(1)),
            Some(lsn(70)),
            "an address fronting two servers routes on the lower one"
        );
        assert_eq!(book.servers_seen(0), 2);
        assert!(book.several_servers(0, S(1)));
        assert!(
            !book.several_servers(0, S(1) + SERVER_FORGOTTEN_AFTER),
            "not once both went quiet"
        );
        book.observe_replayed(0, &b, lsn(80), S(10));
        assert!(!book.several_servers(0, S(11)), "B alone lately");
        assert_eq!(book.slot_replayed(1, S(1)), None, "nothing seen there");
        assert!(!book.several_servers(1, S(1)));
    }

    #[test]
    fn each_rise_of_replay_samples_how_long_the_write_took_to_become_visible() {
        let mut book = ReplayBook::sampling_visibility();
        let a = ServerId::from("7/1/a:1");
        book.observe_primary(S(0), lsn(100));
        book.observe_primary(S(1), lsn(200));
        book.observe_replayed(0, &a, lsn(50), S(1));
        assert!(
            book.visible_lags(0, S(1)).is_empty(),
            "a first position is no rise"
        );
        book.observe_replayed(0, &a, lsn(150), S(3));
        book.observe_replayed(0, &a, lsn(150), S(4));
        book.observe_replayed(0, &a, lsn(199), S(5));
        assert_eq!(
            book.visible_lags(0, S(5)),
            [S(2)],
            "100 (seen on the primary at 0 s) was not on the replica at 1 s and was at 3 s: about \
             2 s; 150 and 199 are no positions the primary was seen at"
        );
        let mut quiet = ReplayBook::default();
        quiet.observe_primary(S(0), lsn(100));
        quiet.observe_replayed(0, &a, lsn(50), S(1));
        quiet.observe_replayed(0, &a, lsn(150), S(3));
        assert!(quiet.visible_lags(0, S(3)).is_empty(), "sampling is opt-in");
        book.observe_replayed(0, &a, lsn(300), S(6));
        assert_eq!(
            book.visible_lags(0, S(6)),
            [S(2), Duration::from_millis(4500)],
            "200 (at 1 s): not there at 5 s, there at 6 s"
        );
    }

    #[test]
    fn a_server_gone_quiet_stops_holding_its_slot_back() {
        let mut book = ReplayBook::default();
        let (old, new) = (ServerId::from("7/1/a:1"), ServerId::from("7/2/a:1"));
        book.observe_replayed(0, &old, lsn(70), S(0));
        book.observe_replayed(0, &new, lsn(100), S(0));
        assert_eq!(book.slot_replayed(0, S(4)), Some(lsn(70)));
        book.observe_replayed(0, &new, lsn(120), S(6));
        assert_eq!(book.slot_replayed(0, S(6)), Some(lsn(120)));
        assert_eq!(
            book.replayed(&old),
            Some(lsn(70)),
            "its own position is kept"
        );
    }

    #[test]
    fn lag_comes_from_the_primary_wal_clock() {
        let mut book = ReplayBook::default();
        assert_eq!(book.lag_behind(lsn(10), S(0)), None, "no clock yet");
        book.observe_primary(S(0), lsn(100));
        book.observe_primary(S(1), lsn(200));
        book.observe_primary(S(2), lsn(300));
        assert_eq!(book.primary_position(), Some(lsn(300)));
        assert_eq!(book.lag_bytes(lsn(250)), Some(50));
        assert_eq!(book.lag_behind(lsn(300), S(3)), Some(Duration::ZERO));
        assert_eq!(book.lag_behind(lsn(150), S(3)), Some(S(2)));
    }

    proptest! {
        /// Whatever order reports arrive in, a server's position is the highest it reported, and
        /// a slot's is the lowest over its servers.
        #[test]
        fn positions_are_max_per_server_and_min_per_slot(
            reports in proptest::collection::vec((0usize..3, 0u64..1000), 1..40)
        ) {
            let mut book = ReplayBook::default();
            let id = |i: usize| ServerId::from(format!("7/1/s{i}:1").as_str());
            for &(server, position) in &reports {
                book.observe_replayed(0, &id(server), lsn(position), S(0));
            }
            let mut highest = HashMap::new();
            for &(server, position) in &reports {
                let h = highest.entry(server).or_insert(position);
                *h = (*h).max(position);
            }
            for (&server, &h) in &highest {
                prop_assert_eq!(book.replayed(&id(server)), Some(lsn(h)));
            }
            prop_assert_eq!(book.slot_replayed(0, S(0)), highest.values().min().map(|&m| lsn(m)));
        }
    }
}
