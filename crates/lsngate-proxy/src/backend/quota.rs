//! A limit on open server connections shared by several pools of one node: PgBouncer's
//! `max_db_connections` (one quota per database, shared by that database's pools of every role)
//! and `max_user_connections` (one per role, shared by that role's pools of every database).
//! A unit of the quota is an open server connection, idle or lent, or one being opened: the
//! servers count their backends that way, so the limit holds on the server (pg_stat_activity).
//!
//! It is not a pool's size: a pool reuses its own idle connections without touching its quotas;
//! only opening a connection takes a unit and only closing one gives it back. A pool whose
//! checkout found its quota full queues the checkout as for a full pool and is listed here;
//! a unit given back wakes the listed pools oldest first (first come, first served across
//! pools), each of which takes the unit if its other quota lets it. The quota knows its pools
//! only as weak references; a pool's own lock is never taken under the quota's, so the quota's
//! lock is a leaf (two quotas are locked together only in `take_both`, database before role).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// One shared limit and the pools under it.
#[derive(Debug)]
pub struct Quota<P> {
    state: Mutex<State<P>>,
    /// Whether a pool is listed as waiting: read without the lock on every connection given
    /// back, so an uncontended quota costs a pool's return one atomic load.
    has_waiters: AtomicBool,
}

#[derive(Debug)]
struct State<P> {
    /// Most units; 0 = unlimited (PgBouncer's meaning).
    limit: usize,
    /// Units taken: connections open or being opened.
    open: usize,
    /// Pools with a checkout queued because this quota was full, oldest first.
    waiting: Vec<Weak<P>>,
    /// Every pool under this quota (to find an idle connection to close for a waiter).
    members: Vec<Weak<P>>,
}

impl<P> State<P> {
    fn has_room(&self) -> bool {
        self.limit == 0 || self.open < self.limit
    }
}

/// Pools that may now take a unit, oldest waiter first: the caller calls each outside any lock.
pub type Wake<P> = Vec<Arc<P>>;

impl<P> Default for Quota<P> {
    fn default() -> Self {
        Quota {
            state: Mutex::new(State {
                limit: 0,
                open: 0,
                waiting: Vec::new(),
                members: Vec::new(),
            }),
            has_waiters: AtomicBool::new(false),
        }
    }
}

impl<P> Quota<P> {
    fn lock(&self) -> std::sync::MutexGuard<'_, State<P>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts `pool` as one of its pools.
    pub fn join(&self, pool: &Arc<P>) {
        let mut state = self.lock();
        state.members.retain(|m| m.strong_count() > 0);
        state.members.push(Arc::downgrade(pool));
    }

    /// Applies a reloaded limit (0 = unlimited); a larger one wakes the waiting pools.
    pub fn set_limit(&self, limit: usize) -> Wake<P> {
        let mut state = self.lock();
        if state.limit == limit {
            return Vec::new();
        }
        let grew = limit == 0 || (state.limit != 0 && limit > state.limit);
        state.limit = limit;
        if grew { wake(&mut state) } else { Vec::new() }
    }

    /// Gives back `units` (connections closed, or slots that never opened theirs) and says which
    /// waiting pools to wake.
    pub fn give_back(&self, units: usize) -> Wake<P> {
        let mut state = self.lock();
        state.open = state.open.saturating_sub(units);
        wake(&mut state)
    }

    /// Lists `pool` as waiting for a unit, once.
    pub fn wait(&self, pool: &Arc<P>) {
        let mut state = self.lock();
        let listed = state
            .waiting
            .iter()
            .any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(pool)));
        if !listed {
            state.waiting.push(Arc::downgrade(pool));
        }
        self.has_waiters.store(true, Ordering::Relaxed);
    }

    /// Takes `pool` off the waiting list (it has no checkout queued any more).
    pub fn stop_waiting(&self, pool: &P) {
        let mut state = self.lock();
        state
            .waiting
            .retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), pool));
        self.has_waiters
            .store(!state.waiting.is_empty(), Ordering::Relaxed);
    }

    /// Whether no live pool is under it and no unit is taken (it can be forgotten).
    pub fn is_unused(&self) -> bool {
        let state = self.lock();
        state.open == 0 && state.members.iter().all(|m| m.strong_count() == 0)
    }

    /// Whether no unit is free.
    pub fn is_full(&self) -> bool {
        !self.lock().has_room()
    }

    /// Whether it is full and a pool other than `besides` waits on it: then a connection given
    /// back to `besides` is closed instead of reused, so the other pool can open one (pools
    /// under a full quota take turns instead of one keeping every unit).
    pub fn others_wait(&self, besides: &P) -> bool {
        if !self.has_waiters.load(Ordering::Relaxed) {
            return false;
        }
        let state = self.lock();
        !state.has_room()
            && state
                .waiting
                .iter()
                .any(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), besides))
    }

    /// Its pools other than `besides`, to look for an idle connection in.
    pub fn members_besides(&self, besides: &P) -> Vec<Arc<P>> {
        self.lock()
            .members
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|m| !std::ptr::eq(Arc::as_ptr(m), besides))
            .collect()
    }

    /// (units taken, limit), for the admin console.
    pub fn usage(&self) -> (usize, usize) {
        let state = self.lock();
        (state.open, state.limit)
    }
}

/// The waiting pools when a unit is free (they stay listed until they stop waiting).
fn wake<P>(state: &mut State<P>) -> Wake<P> {
    state.waiting.retain(|w| w.strong_count() > 0);
    if !state.has_room() {
        return Vec::new();
    }
    state.waiting.iter().filter_map(Weak::upgrade).collect()
}

/// Takes one unit of both quotas, or none: the database's and the role's limit must both have
/// room. Locks the database's quota, then the role's (the one order used anywhere).
pub fn take_both<P>(database: &Quota<P>, role: &Quota<P>) -> bool {
    let mut db = database.lock();
    if std::ptr::eq(database, role) {
        // Only in tests: one quota standing for both.
        return db.has_room() && {
            db.open += 1;
            true
        };
    }
    let mut user = role.lock();
    if db.has_room() && user.has_room() {
        db.open += 1;
        user.open += 1;
        true
    } else {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in pool.
    #[derive(Debug)]
    struct P(&'static str);

    fn names(wake: &Wake<P>) -> Vec<&'static str> {
        wake.iter().map(|p| p.0).collect()
    }

    #[test]
    fn zero_is_unlimited_and_units_are_counted_anyway() {
        let (db, role) = (Quota::<P>::default(), Quota::<P>::default());
        for _ in 0..100 {
            assert!(take_both(&db, &role));
        }
        assert_eq!(db.usage(), (100, 0));
        // A limit set below what is open lets nothing more in until enough are closed.
        assert!(db.set_limit(99).is_empty());
        assert!(!take_both(&db, &role) && db.is_full());
        assert_eq!(role.usage(), (100, 0), "a refused take takes nothing");
        db.give_back(2);
        assert!(take_both(&db, &role));
        assert!(!take_both(&db, &role));
    }

    #[test]
    fn both_limits_must_have_room() {
        let (db, role) = (Quota::<P>::default(), Quota::<P>::default());
        db.set_limit(3);
        role.set_limit(1);
        assert!(take_both(&db, &role));
        assert!(!take_both(&db, &role), "the role's limit binds");
        assert_eq!(db.usage(), (1, 3), "the database's unit is not kept");
    }

    #[test]
    fn a_unit_given_back_wakes_the_waiting_pools_oldest_first() {
        let quota = Quota::<P>::default();
        let (a, b) = (Arc::new(P("a")), Arc::new(P("b")));
        quota.set_limit(1);
        assert!(take_both(&quota, &quota));
        quota.wait(&b);
        quota.wait(&a);
        quota.wait(&b);
        assert!(quota.set_limit(1).is_empty());
        assert_eq!(names(&quota.give_back(1)), ["b", "a"], "listed once each");
        assert!(take_both(&quota, &quota));
        assert!(quota.give_back(0).is_empty(), "full: nobody to wake");
        quota.stop_waiting(&b);
        assert_eq!(names(&quota.give_back(1)), ["a"]);
        drop(a);
        assert!(quota.give_back(0).is_empty(), "a dropped pool is forgotten");
    }

    #[test]
    fn a_larger_limit_wakes_waiters_and_a_smaller_does_not() {
        let quota = Quota::<P>::default();
        let a = Arc::new(P("a"));
        quota.set_limit(1);
        assert!(take_both(&quota, &quota));
        quota.wait(&a);
        assert!(quota.set_limit(1).is_empty(), "unchanged");
        assert_eq!(names(&quota.set_limit(2)), ["a"]);
        assert!(take_both(&quota, &quota));
        assert!(quota.set_limit(1).is_empty());
        assert_eq!(names(&quota.set_limit(0)), ["a"], "unlimited wakes too");
    }

    #[test]
    fn others_wait_only_on_a_full_quota_and_not_for_themselves() {
        let quota = Quota::<P>::default();
        let (a, b) = (Arc::new(P("a")), Arc::new(P("b")));
        quota.set_limit(1);
        quota.wait(&b);
        assert!(!quota.others_wait(&a), "not full");
        assert!(take_both(&quota, &quota));
        assert!(quota.others_wait(&a) && !quota.others_wait(&b));
        drop(b);
        assert!(!quota.others_wait(&a), "the waiter is gone");
    }

    #[test]
    fn members_are_the_other_live_pools() {
        let quota = Quota::<P>::default();
        let (a, b, c) = (Arc::new(P("a")), Arc::new(P("b")), Arc::new(P("c")));
        quota.join(&a);
        quota.join(&b);
        quota.join(&c);
        drop(c);
        assert_eq!(names(&quota.members_besides(&a)), ["b"]);
        assert!(!quota.is_unused());
        drop((a, b));
        assert!(quota.is_unused(), "no live pool, no unit taken");
    }
}
