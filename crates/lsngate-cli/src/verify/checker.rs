//! The history checker: given every operation the clients ran, the faults injected and the op ids
//! found on the primary at the end, says which reads broke read-your-writes or monotonic reads,
//! which acknowledged writes were lost or applied twice, which writes ended with an unknown
//! outcome, and which operations hung. Pure: no I/O, no clock — the same history always gives
//! the same verdict, so a failing run's `--history` file (which ends with the op ids found on
//! the primary) can be checked again and again.
//!
//! The registers make the check exact: every committed write raises its key's version by one
//! under the row lock, so "read saw version v" means "saw exactly the writes to that key up to
//! v" — a read below the version of a write it was owed is stale, whatever the timing.

use std::collections::HashMap;

use lsngate_core::Lsn;

use super::history::{FaultWindow, Op, OpKind, Outcome};

/// What the mode under test promises, beyond a session's own writes and monotonic reads (which
/// every mode but `eventual` promises, and which the checker holds `eventual` to as well: that is
/// what the self-test shows failing). A session is one connection of a process (`Op::session`):
/// neither the proxy nor the library can know that a new connection is the same client, so
/// those two promises start afresh when a process connects again. What a token, a scope or
/// `global` promises spans connections.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rules {
    /// `session`, `global`, `eventual`: a process's reads see its own acknowledged writes. Not in
    /// `token` mode, where a process writes and reads on two connections and only the floor it
    /// hands over counts (see `token_floors`).
    pub own_writes: bool,
    /// `global` / `universal`: a read sees every write acknowledged (to anyone) before it began.
    /// A read of a read-only transaction began with the transaction's `BEGIN`.
    pub all_acknowledged: bool,
    /// `token`: a read carrying a floor sees every write whose commit position is at or below it.
    pub token_floors: bool,
    /// `scope`: a read under a scope sees every write acknowledged under the same scope (by any
    /// process) before it began.
    pub scope_floors: bool,
    /// A process never reads an older version of a key than it already read. Every mode of the
    /// proxy promises it (its token mode is session plus tokens); the library's bare token reads
    /// (`Gate::read().after(token)`) do not — they remember nothing — so `--library --mode token`
    /// is held to its tokens alone.
    pub monotonic: bool,
    /// An operation that took longer than this (the wait budget plus a grace) hung.
    pub hang_after_ms: f64,
}

/// What the primary holds at the end: how many times each op id is in the log.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FinalState {
    pub committed: HashMap<String, u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ViolationKind {
    /// A read missed a write it was owed (its own, a handed-off token's, or under `global` any
    /// acknowledged before it).
    Stale,
    /// A read saw an older version of a key than the same process had already read.
    NonMonotonic,
    /// An acknowledged write is not on the primary.
    Lost,
    /// A write's op id is on the primary more than once.
    Duplicated,
    /// A write reported as certainly failed (an `ERROR`, see `Outcome::Failed`) is on the
    /// primary: the target said "not committed" about a write that was — an outcome it could not
    /// know, reported as known.
    Phantom,
    /// An operation past the hang limit.
    Hang,
}

impl ViolationKind {
    pub fn name(self) -> &'static str {
        match self {
            ViolationKind::Stale => "stale",
            ViolationKind::NonMonotonic => "nonmonotonic",
            ViolationKind::Lost => "lost",
            ViolationKind::Duplicated => "duplicated",
            ViolationKind::Phantom => "phantom",
            ViolationKind::Hang => "hang",
        }
    }
}

/// One violation, with what a reader needs to see it happen.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    pub kind: ViolationKind,
    /// Index of the offending operation in the history.
    pub op: usize,
    /// What was expected and what was seen.
    pub explanation: String,
    /// The same process's operations around it (indices, in order, the offender included).
    pub context: Vec<usize>,
    /// Faults active while it ran (indices).
    pub faults: Vec<usize>,
}

/// Counts per class; `violations()` is what decides the exit status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub stale: u64,
    pub nonmonotonic: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub phantom: u64,
    pub hangs: u64,
    /// Writes with an unknown outcome: neither lost nor acknowledged.
    pub indeterminate: u64,
    /// Of those, how many the primary holds at the end (for information only).
    pub indeterminate_committed: u64,
    /// Reads a replica served that were owed a version above 0: the reads that could have been
    /// stale. With none, the run proved nothing about read-your-writes.
    pub owed_replica_reads: u64,
}

impl Counts {
    pub fn violations(&self) -> u64 {
        self.stale + self.nonmonotonic + self.lost + self.duplicated + self.phantom + self.hangs
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub counts: Counts,
    pub violations: Vec<Violation>,
}

/// Operations of the same process shown before a violation (and one after).
const CONTEXT_BEFORE: usize = 4;

/// Checks a history. `ops` in any order; each process's operations must not overlap in time.
pub fn check(
    ops: &[Op],
    faults: &[FaultWindow],
    final_state: &FinalState,
    rules: &Rules,
) -> Verdict {
    let by_process = by_process(ops);
    let owed_by_others = owed_by_others(ops, rules);
    let mut found: Vec<(ViolationKind, usize, String)> = Vec::new();
    let mut counts = Counts::default();

    for indices in by_process.values() {
        // Per key: the newest own acknowledged write, the newest version read — in the
        // current session: a process that connects again starts a new one.
        let mut own_floor: HashMap<i32, i64> = HashMap::new();
        let mut seen: HashMap<i32, i64> = HashMap::new();
        let mut session = None;
        for &i in indices {
            let op = &ops[i];
            if session != Some(op.session) {
                session = Some(op.session);
                own_floor.clear();
                seen.clear();
            }
            if let (true, Some(version)) =
                (op.is_acknowledged_write() && rules.own_writes, op.version)
            {
                let floor = own_floor.entry(op.key).or_default();
                *floor = (*floor).max(version);
            }
            let Some(version) = op.read_version() else {
                continue;
            };
            let own = own_floor.get(&op.key).copied().unwrap_or(0);
            let (others, whose) = owed_by_others.get(&i).copied().unwrap_or((0, ""));
            let owed = own.max(others);
            if owed > 0 && op.server.is_some_and(|s| s.in_recovery) {
                counts.owed_replica_reads += 1;
            }
            let before = seen.get(&op.key).copied().unwrap_or(0);
            if version < owed {
                let source = if own >= others {
                    "its own write"
                } else {
                    whose
                };
                found.push((
                    ViolationKind::Stale,
                    i,
                    format!(
                        "read key {} and saw version {version}, but {source} had made it version {owed}",
                        op.key
                    ),
                ));
            } else if rules.monotonic && version < before {
                found.push((
                    ViolationKind::NonMonotonic,
                    i,
                    format!(
                        "read key {} and saw version {version} after this process had already read version {before}",
                        op.key
                    ),
                ));
            }
            seen.insert(op.key, before.max(version));
        }
    }

    for (i, op) in ops.iter().enumerate() {
        if op.outcome == Outcome::Hang || op.complete_ms - op.invoke_ms > rules.hang_after_ms {
            found.push((
                ViolationKind::Hang,
                i,
                format!(
                    "took {:.0} ms, past the hang limit of {:.0} ms",
                    op.complete_ms - op.invoke_ms,
                    rules.hang_after_ms
                ),
            ));
        }
        if op.kind != OpKind::Write {
            continue;
        }
        let committed = op
            .op_id
            .as_ref()
            .and_then(|id| final_state.committed.get(id))
            .copied()
            .unwrap_or(0);
        if op.outcome == Outcome::Indeterminate {
            counts.indeterminate += 1;
            counts.indeterminate_committed += u64::from(committed > 0);
        }
        if op.outcome == Outcome::Ok && committed == 0 {
            found.push((
                ViolationKind::Lost,
                i,
                format!(
                    "write {} was acknowledged (version {}) but is not on the primary",
                    op.op_id.as_deref().unwrap_or("?"),
                    op.version.unwrap_or(0)
                ),
            ));
        }
        if op.outcome == Outcome::Failed && committed > 0 {
            found.push((
                ViolationKind::Phantom,
                i,
                format!(
                    "write {} was reported failed [{}] but is on the primary",
                    op.op_id.as_deref().unwrap_or("?"),
                    op.sqlstate.as_deref().unwrap_or("?")
                ),
            ));
        }
        if committed > 1 {
            found.push((
                ViolationKind::Duplicated,
                i,
                format!(
                    "write {} is on the primary {committed} times",
                    op.op_id.as_deref().unwrap_or("?")
                ),
            ));
        }
    }

    let position = positions(&by_process);
    let mut violations: Vec<Violation> = found
        .into_iter()
        .map(|(kind, i, explanation)| {
            match kind {
                ViolationKind::Stale => counts.stale += 1,
                ViolationKind::NonMonotonic => counts.nonmonotonic += 1,
                ViolationKind::Lost => counts.lost += 1,
                ViolationKind::Duplicated => counts.duplicated += 1,
                ViolationKind::Phantom => counts.phantom += 1,
                ViolationKind::Hang => counts.hangs += 1,
            }
            let op = &ops[i];
            let (process_ops, at) = (&by_process[&op.process], position[&i]);
            let context = process_ops
                [at.saturating_sub(CONTEXT_BEFORE)..(at + 2).min(process_ops.len())]
                .to_vec();
            let faults = faults
                .iter()
                .enumerate()
                .filter(|(_, f)| f.overlaps(op.invoke_ms, op.complete_ms))
                .map(|(j, _)| j)
                .collect();
            Violation {
                kind,
                op: i,
                explanation,
                context,
                faults,
            }
        })
        .collect();
    violations.sort_by(|a, b| ops[a.op].invoke_ms.total_cmp(&ops[b.op].invoke_ms));
    Verdict { counts, violations }
}

/// Each process's operations, in the order it ran them.
fn by_process(ops: &[Op]) -> HashMap<usize, Vec<usize>> {
    let mut by_process: HashMap<usize, Vec<usize>> = HashMap::new();
    for (i, op) in ops.iter().enumerate() {
        by_process.entry(op.process).or_default().push(i);
    }
    for indices in by_process.values_mut() {
        indices.sort_by(|&a, &b| ops[a].invoke_ms.total_cmp(&ops[b].invoke_ms));
    }
    by_process
}

/// Where each operation stands in its process's list.
fn positions(by_process: &HashMap<usize, Vec<usize>>) -> HashMap<usize, usize> {
    by_process
        .values()
        .flat_map(|indices| indices.iter().enumerate().map(|(at, &i)| (i, at)))
        .collect()
}

/// For each read (by index): the highest version of its key that writes of *other* rules owe it
/// (`global`: every write acknowledged before the read began; `token`: every write whose commit
/// position its floor covers and that was acknowledged before the read began), and which rule
/// owes it.
///
/// Why a token owes only acknowledged writes: a write still in flight when the read began may
/// have its commit record below the floor (another client's token, taken after that record, can
/// even be the same position) and still be invisible on the primary, where a transaction shows
/// once its backend has left the proc array, after its commit record. A read that falls back to
/// the primary may then miss it, and rightly: it was concurrent with the read.
fn owed_by_others(ops: &[Op], rules: &Rules) -> HashMap<usize, (i64, &'static str)> {
    let mut owed: HashMap<usize, (i64, &'static str)> = HashMap::new();
    let acknowledged: Vec<&Op> = ops.iter().filter(|op| op.is_acknowledged_write()).collect();
    let reads: Vec<usize> = (0..ops.len())
        .filter(|&i| ops[i].read_version().is_some())
        .collect();
    let mut raise = |i: usize, version: i64, whose: &'static str| {
        let entry = owed.entry(i).or_insert((0, whose));
        if version > entry.0 {
            *entry = (version, whose);
        }
    };
    let before_start = if rules.all_acknowledged || rules.token_floors {
        acknowledged_before_start(ops, &acknowledged, &reads)
    } else {
        HashMap::new()
    };
    if rules.scope_floors {
        let mut scopes: HashMap<&str, (Vec<&Op>, Vec<usize>)> = HashMap::new();
        for w in &acknowledged {
            if let Some(scope) = w.scope.as_deref() {
                scopes.entry(scope).or_default().0.push(w);
            }
        }
        for &i in &reads {
            if let Some(scope) = ops[i].scope.as_deref() {
                scopes.entry(scope).or_default().1.push(i);
            }
        }
        for (writes, scope_reads) in scopes.values() {
            for (i, version) in acknowledged_before_start(ops, writes, scope_reads) {
                raise(
                    i,
                    version,
                    "a write acknowledged under its scope before the read began",
                );
            }
        }
    }
    if rules.all_acknowledged {
        for &i in &reads {
            let version = before_start.get(&i).copied().unwrap_or(0);
            raise(i, version, "a write acknowledged before the read began");
        }
    }
    if rules.token_floors {
        for (i, covered) in covered_by_floor(ops, &acknowledged, &reads) {
            // Per key, versions follow commit order: the newest write acknowledged before the
            // read (version a) committed before the read began, and the newest one under the
            // floor (version b) has its commit record below it. The older of the two committed
            // no later than either, so it is both visible on the primary when the read began
            // and replayed by any replica at the floor: owed. (Both facts hold for min(a, b).)
            let acknowledged_by_then = before_start.get(&i).copied().unwrap_or(0);
            raise(
                i,
                covered.min(acknowledged_by_then),
                "a write its token covers, acknowledged before the read began,",
            );
        }
    }
    owed
}

/// Per read: the newest version of its key among the writes acknowledged before it began
/// (a sweep of reads by start time over writes by acknowledgement time).
fn acknowledged_before_start(
    ops: &[Op],
    acknowledged: &[&Op],
    reads: &[usize],
) -> HashMap<usize, i64> {
    let mut writes = acknowledged.to_vec();
    writes.sort_by(|a, b| a.complete_ms.total_cmp(&b.complete_ms));
    let mut reads = reads.to_vec();
    reads.sort_by(|&a, &b| ops[a].invoke_ms.total_cmp(&ops[b].invoke_ms));
    let mut newest: HashMap<i32, i64> = HashMap::new();
    let mut next = 0;
    let mut found = HashMap::new();
    for i in reads {
        while next < writes.len() && writes[next].complete_ms < ops[i].invoke_ms {
            let w = writes[next];
            let v = newest.entry(w.key).or_default();
            *v = (*v).max(w.version.unwrap_or(0));
            next += 1;
        }
        found.insert(i, newest.get(&ops[i].key).copied().unwrap_or(0));
    }
    found
}

/// Per read carrying a floor: the newest version of its key among the writes whose commit
/// position is at or below the floor (a sweep of reads by floor over writes by position).
fn covered_by_floor(ops: &[Op], acknowledged: &[&Op], reads: &[usize]) -> Vec<(usize, i64)> {
    let lsn = |op: &Op| op.lsn.as_deref().and_then(|text| Lsn::parse(text).ok());
    let mut writes: Vec<(Lsn, &Op)> = acknowledged
        .iter()
        .filter_map(|w| Some((lsn(w)?, *w)))
        .collect();
    writes.sort_by_key(|(at, _)| *at);
    let mut reads: Vec<(Lsn, usize)> = reads
        .iter()
        .filter_map(|&i| Some((lsn(&ops[i])?, i)))
        .collect();
    reads.sort_by_key(|(at, _)| *at);
    let mut newest: HashMap<i32, i64> = HashMap::new();
    let mut next = 0;
    let mut found = Vec::with_capacity(reads.len());
    for (floor, i) in reads {
        while next < writes.len() && writes[next].0 <= floor {
            let w = writes[next].1;
            let v = newest.entry(w.key).or_default();
            *v = (*v).max(w.version.unwrap_or(0));
            next += 1;
        }
        found.push((i, newest.get(&ops[i].key).copied().unwrap_or(0)));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::super::history::Server;
    use super::*;

    const SESSION: Rules = Rules {
        own_writes: true,
        all_acknowledged: false,
        token_floors: false,
        scope_floors: false,
        monotonic: true,
        hang_after_ms: 1000.0,
    };

    fn write(process: usize, key: i32, id: &str, at: f64, version: i64) -> Op {
        Op {
            process,
            session: 1,
            kind: OpKind::Write,
            key,
            scope: None,
            op_id: Some(id.into()),
            txn: None,
            invoke_ms: at,
            complete_ms: at + 1.0,
            outcome: Outcome::Ok,
            version: Some(version),
            server: None,
            lsn: None,
            sqlstate: None,
            error: None,
        }
    }

    fn read(process: usize, key: i32, at: f64, version: i64, replica: bool) -> Op {
        Op {
            process,
            session: 1,
            kind: OpKind::Read,
            key,
            scope: None,
            op_id: None,
            txn: None,
            invoke_ms: at,
            complete_ms: at + 1.0,
            outcome: Outcome::Ok,
            version: Some(version),
            server: Some(Server {
                in_recovery: replica,
                port: Some(if replica { 5433 } else { 5432 }),
            }),
            lsn: None,
            sqlstate: None,
            error: None,
        }
    }

    /// Every write of the history committed exactly once.
    fn all_committed(ops: &[Op]) -> FinalState {
        FinalState {
            committed: ops
                .iter()
                .filter_map(|op| Some((op.op_id.clone()?, 1)))
                .collect(),
        }
    }

    fn kinds(verdict: &Verdict) -> Vec<ViolationKind> {
        verdict.violations.iter().map(|v| v.kind).collect()
    }

    #[test]
    fn a_correct_history_passes_and_counts_the_reads_that_could_have_been_stale() {
        let ops = vec![
            write(1, 0, "p1-0", 0.0, 1),
            read(1, 0, 2.0, 1, true),
            read(1, 1, 4.0, 0, true),
            write(2, 0, "p2-0", 5.0, 2),
            read(1, 0, 7.0, 1, true), // p2's write is not owed to p1 in session mode
            read(1, 0, 9.0, 2, false),
        ];
        let verdict = check(&ops, &[], &all_committed(&ops), &SESSION);
        assert_eq!(verdict.violations, vec![]);
        assert_eq!(verdict.counts.violations(), 0);
        assert_eq!(verdict.counts.owed_replica_reads, 2);
    }

    #[test]
    fn a_read_missing_its_own_write_is_stale_and_shows_the_session_and_the_fault() {
        let ops = vec![
            read(1, 0, 0.0, 0, true),
            write(1, 0, "p1-1", 2.0, 1),
            read(1, 0, 4.0, 0, true),
            read(1, 0, 6.0, 1, true),
        ];
        let faults = vec![
            FaultWindow {
                kind: "pause".into(),
                node: "replica1".into(),
                detail: String::new(),
                start_ms: 3.0,
                end_ms: 4.5,
            },
            FaultWindow {
                kind: "stop".into(),
                node: "replica1".into(),
                detail: String::new(),
                start_ms: 10.0,
                end_ms: 11.0,
            },
        ];
        let verdict = check(&ops, &faults, &all_committed(&ops), &SESSION);
        assert_eq!(kinds(&verdict), vec![ViolationKind::Stale]);
        let v = &verdict.violations[0];
        assert_eq!(v.op, 2);
        assert_eq!(v.context, vec![0, 1, 2, 3]);
        assert_eq!(v.faults, vec![0]);
        assert!(v.explanation.contains("its own write"), "{}", v.explanation);
    }

    #[test]
    fn going_back_to_an_older_version_is_nonmonotonic() {
        let ops = vec![
            write(2, 5, "p2-0", 0.0, 1),
            write(2, 5, "p2-1", 2.0, 2),
            read(1, 5, 4.0, 2, false),
            read(1, 5, 6.0, 1, true),
        ];
        let verdict = check(&ops, &[], &all_committed(&ops), &SESSION);
        assert_eq!(kinds(&verdict), vec![ViolationKind::NonMonotonic]);
        assert_eq!(verdict.violations[0].op, 3);
    }

    /// Found by `verify --mode token` on 15.18 (seed 20261213206): a process read version 2329
    /// of a key on one replica, lost its connections while the primary was killed, connected
    /// again and read 2328 on the other replica, which had its token but not that version. A new
    /// connection is a new session to the proxy: nothing told it what the old one had read, and
    /// the token promises only the process's own commits. Within one session going back stays a
    /// violation; so does a token missed after a reconnect.
    #[test]
    fn a_session_promise_starts_afresh_when_the_process_connects_again() {
        let mut again = read(1, 5, 6.0, 1, true);
        again.session = 2;
        let ops = vec![
            write(2, 5, "p2-0", 0.0, 1),
            write(2, 5, "p2-1", 2.0, 2),
            read(1, 5, 4.0, 2, false),
            again,
        ];
        let verdict = check(&ops, &[], &all_committed(&ops), &SESSION);
        assert_eq!(kinds(&verdict), vec![], "{verdict:?}");

        // Its own write, acknowledged in the session before: not owed to the new one either.
        let mut after = read(1, 5, 6.0, 0, true);
        after.session = 2;
        let ops = vec![write(1, 5, "p1-0", 0.0, 1), after];
        let verdict = check(&ops, &[], &all_committed(&ops), &SESSION);
        assert_eq!(kinds(&verdict), vec![], "{verdict:?}");

        // A token spans sessions: the floor it carries is still owed.
        let token = Rules {
            own_writes: false,
            token_floors: true,
            ..SESSION
        };
        let mut carried = write(1, 5, "p1-0", 0.0, 1);
        carried.lsn = Some("0/10".into());
        let mut owed = read(1, 5, 6.0, 0, true);
        owed.session = 2;
        owed.lsn = Some("0/10".into());
        let ops = vec![carried, owed];
        let verdict = check(&ops, &[], &all_committed(&ops), &token);
        assert_eq!(kinds(&verdict), vec![ViolationKind::Stale], "{verdict:?}");
    }

    #[test]
    fn global_owes_every_write_acknowledged_before_the_read_began() {
        let ops = vec![
            write(2, 0, "p2-0", 0.0, 1), // acknowledged at 1.0
            read(1, 0, 0.5, 0, true),    // began before the ack: not owed
            read(1, 0, 2.0, 0, true),    // owed
        ];
        let global = Rules {
            all_acknowledged: true,
            ..SESSION
        };
        assert_eq!(
            check(&ops, &[], &all_committed(&ops), &SESSION)
                .violations
                .len(),
            0
        );
        let verdict = check(&ops, &[], &all_committed(&ops), &global);
        assert_eq!(kinds(&verdict), vec![ViolationKind::Stale]);
        assert_eq!(verdict.violations[0].op, 2);
    }

    #[test]
    fn a_token_owes_the_writes_at_or_below_its_floor() {
        let mut w1 = write(2, 0, "p2-0", 0.0, 1);
        w1.lsn = Some("0/3000100".into());
        let mut w2 = write(2, 0, "p2-1", 2.0, 2);
        w2.lsn = Some("0/3000200".into());
        let mut covered = read(1, 0, 4.0, 1, true);
        covered.lsn = Some("0/3000150".into());
        let mut stale = read(3, 0, 4.0, 1, true);
        stale.lsn = Some("0/3000200".into());
        let ops = vec![w1, w2, covered, stale];
        let token = Rules {
            own_writes: false,
            token_floors: true,
            ..SESSION
        };
        let verdict = check(&ops, &[], &all_committed(&ops), &token);
        assert_eq!(kinds(&verdict), vec![ViolationKind::Stale]);
        assert_eq!(verdict.violations[0].op, 3);
        assert!(verdict.violations[0].explanation.contains("token"));
    }

    #[test]
    fn a_token_does_not_owe_a_write_still_in_flight_when_the_read_began() {
        // Found by `lsngate verify --library --mode token --faults kill,net-delay --seed 11`:
        // p2's write committed below p1's floor (both tokens are the same insert position) but
        // was acknowledged only after p1's read, which fell back to the primary, began.
        let mut concurrent = write(2, 4, "p2-166", 627.8, 93);
        concurrent.complete_ms = 637.0;
        concurrent.lsn = Some("0/3034DB8".into());
        let mut floor_from = write(1, 7, "p1-222", 636.5, 113);
        floor_from.complete_ms = 636.7;
        floor_from.lsn = Some("0/3034DB8".into());
        let mut on_primary = read(1, 4, 636.74, 92, false);
        on_primary.lsn = Some("0/3034DB8".into());
        let mut later = read(1, 4, 637.5, 92, true);
        later.lsn = Some("0/3034DB8".into());
        let token = Rules {
            own_writes: false,
            token_floors: true,
            monotonic: false,
            ..SESSION
        };
        let mut ops = vec![write(2, 4, "p2-165", 600.0, 92), concurrent, floor_from];
        ops.push(on_primary);
        let verdict = check(&ops, &[], &all_committed(&ops), &token);
        assert_eq!(verdict.violations, vec![]);
        // Once it was acknowledged, a read at that floor owes it.
        ops.push(later);
        let verdict = check(&ops, &[], &all_committed(&ops), &token);
        assert_eq!(kinds(&verdict), vec![ViolationKind::Stale]);
        assert_eq!(verdict.violations[0].op, 4);
    }

    #[test]
    fn without_the_monotonic_rule_going_back_is_allowed_but_a_missed_token_is_not() {
        let mut write_at = write(2, 0, "p2-0", 0.0, 1);
        write_at.lsn = Some("0/3000100".into());
        let mut newer = read(1, 0, 2.0, 1, false);
        newer.lsn = Some("0/3000100".into());
        let older = read(1, 0, 4.0, 0, true); // no floor: owed nothing, but went back
        let ops = vec![write_at, newer, older];
        let token = Rules {
            own_writes: false,
            token_floors: true,
            ..SESSION
        };
        let verdict = check(&ops, &[], &all_committed(&ops), &token);
        assert_eq!(kinds(&verdict), vec![ViolationKind::NonMonotonic]);
        let bare_tokens = Rules {
            monotonic: false,
            ..token
        };
        let verdict = check(&ops, &[], &all_committed(&ops), &bare_tokens);
        assert_eq!(verdict.violations, vec![]);
        // The floor still binds: the same read carrying the write's position is stale.
        let mut ops = ops;
        ops[2].lsn = Some("0/3000100".into());
        let verdict = check(&ops, &[], &all_committed(&ops), &bare_tokens);
        assert_eq!(kinds(&verdict), vec![ViolationKind::Stale]);
    }

    #[test]
    fn the_reads_of_a_read_only_transaction_are_owed_what_was_acknowledged_before_its_begin() {
        // p2's write is acknowledged at 3.0, between the transaction's BEGIN (2.0) and its
        // second SELECT: under global the transaction is not owed it, but the first read of
        // the same key in it is owed p2's earlier write, and going back inside it is caught.
        let global = Rules {
            all_acknowledged: true,
            ..SESSION
        };
        let in_txn = |key, complete_ms, version| {
            let mut op = read(1, key, 2.0, version, true);
            op.txn = Some("p1-t1".into());
            op.complete_ms = complete_ms;
            op
        };
        let ops = vec![
            write(2, 0, "p2-0", 0.0, 1),
            write(2, 0, "p2-1", 2.0, 2),
            in_txn(0, 2.5, 1),
            in_txn(0, 3.5, 1),
        ];
        let verdict = check(&ops, &[], &all_committed(&ops), &global);
        assert_eq!(verdict.violations, vec![]);
        let ops = vec![
            write(2, 0, "p2-0", 0.0, 1),
            in_txn(0, 2.5, 0),
            in_txn(0, 3.5, 1),
        ];
        let verdict = check(&ops, &[], &all_committed(&ops), &global);
        assert_eq!(kinds(&verdict), vec![ViolationKind::Stale]);
        assert_eq!(verdict.violations[0].op, 1);
        let ops = vec![
            write(2, 0, "p2-0", 0.0, 1),
            write(2, 0, "p2-1", 2.0, 2),
            in_txn(0, 2.5, 2),
            in_txn(0, 3.5, 1),
        ];
        let verdict = check(&ops, &[], &all_committed(&ops), &global);
        assert_eq!(kinds(&verdict), vec![ViolationKind::NonMonotonic]);
        assert_eq!(verdict.violations[0].op, 3);
    }

    #[test]
    fn lost_and_duplicated_writes_are_found_on_the_primary_and_indeterminate_ones_are_neither() {
        let mut unknown = write(1, 0, "p1-2", 4.0, 0);
        unknown.outcome = Outcome::Indeterminate;
        unknown.version = None;
        let mut unknown_gone = write(1, 0, "p1-3", 6.0, 0);
        unknown_gone.outcome = Outcome::Indeterminate;
        unknown_gone.version = None;
        let ops = vec![
            write(1, 0, "p1-0", 0.0, 1),
            write(1, 0, "p1-1", 2.0, 2),
            unknown,
            unknown_gone,
        ];
        let final_state = FinalState {
            committed: [("p1-1".to_string(), 2), ("p1-2".to_string(), 1)].into(),
        };
        let verdict = check(&ops, &[], &final_state, &SESSION);
        assert_eq!(
            kinds(&verdict),
            vec![ViolationKind::Lost, ViolationKind::Duplicated]
        );
        assert_eq!(verdict.counts.lost, 1);
        assert_eq!(verdict.counts.duplicated, 1);
        assert_eq!(verdict.counts.indeterminate, 2);
        assert_eq!(verdict.counts.indeterminate_committed, 1);
    }

    #[test]
    fn an_operation_past_the_limit_or_given_up_hung() {
        let mut slow = read(1, 0, 0.0, 0, true);
        slow.complete_ms = 1500.0;
        let mut given_up = read(1, 0, 2000.0, 0, true);
        given_up.outcome = Outcome::Hang;
        given_up.version = None;
        let ops = vec![slow, given_up, read(1, 0, 3000.0, 0, true)];
        let verdict = check(&ops, &[], &FinalState::default(), &SESSION);
        assert_eq!(verdict.counts.hangs, 2);
        assert_eq!(verdict.counts.violations(), 2);
    }

    #[test]
    fn failed_reads_and_unacknowledged_writes_owe_nothing() {
        let mut failed = write(1, 0, "p1-0", 0.0, 0);
        failed.outcome = Outcome::Failed;
        failed.version = None;
        let mut unknown = write(1, 0, "p1-1", 2.0, 0);
        unknown.outcome = Outcome::Indeterminate;
        unknown.version = None;
        let ops = vec![failed, unknown, read(1, 0, 4.0, 0, true)];
        let verdict = check(&ops, &[], &FinalState::default(), &SESSION);
        assert_eq!(verdict.counts.violations(), 0, "{:?}", verdict.violations);
        assert_eq!(verdict.counts.owed_replica_reads, 0);
    }

    #[test]
    fn a_write_reported_failed_that_is_on_the_primary_is_a_phantom_and_an_unknown_one_is_not() {
        let mut refused = write(1, 0, "p1-0", 0.0, 0);
        refused.outcome = Outcome::Failed;
        refused.version = None;
        refused.sqlstate = Some("40001".into());
        let mut unknown = write(1, 0, "p1-1", 2.0, 0);
        unknown.outcome = Outcome::Indeterminate;
        unknown.version = None;
        let mut refused_for_real = write(1, 0, "p1-2", 4.0, 0);
        refused_for_real.outcome = Outcome::Failed;
        refused_for_real.version = None;
        let final_state = FinalState {
            committed: [("p1-0".to_string(), 1), ("p1-1".to_string(), 1)].into(),
        };
        let verdict = check(
            &[refused, unknown, refused_for_real],
            &[],
            &final_state,
            &SESSION,
        );
        assert_eq!(kinds(&verdict), vec![ViolationKind::Phantom]);
        assert!(
            verdict.violations[0].explanation.contains("p1-0")
                && verdict.violations[0].explanation.contains("40001"),
            "{:?}",
            verdict.violations
        );
        assert_eq!(verdict.counts.phantom, 1);
        assert_eq!(verdict.counts.indeterminate_committed, 1);
    }

    #[test]
    fn a_read_under_a_scope_is_owed_the_writes_acknowledged_under_it_and_no_others() {
        let under = |mut op: Op, scope: &str| {
            op.scope = Some(scope.into());
            op
        };
        let ops = vec![
            // Process 0 writes key 0 under s0; its scope partner 1 must see it...
            under(write(0, 0, "p0-0", 0.0, 1), "s0"),
            under(read(1, 0, 2.0, 0, true), "s0"),
            // ...but process 2, under another scope, need not.
            under(read(2, 0, 2.0, 0, true), "s1"),
            // A write still in flight when the read began is not owed.
            under(write(0, 1, "p0-1", 3.0, 1), "s0"),
            under(read(1, 1, 3.5, 0, true), "s0"),
        ];
        let scope = Rules {
            scope_floors: true,
            ..SESSION
        };
        let verdict = check(&ops, &[], &all_committed(&ops), &scope);
        assert_eq!(kinds(&verdict), vec![ViolationKind::Stale]);
        assert_eq!(verdict.violations[0].op, 1);
        assert!(
            verdict.violations[0]
                .explanation
                .contains("acknowledged under its scope"),
            "{:?}",
            verdict.violations
        );
        // Without the rule (session mode) nothing is owed across processes.
        let verdict = check(&ops, &[], &all_committed(&ops), &SESSION);
        assert_eq!(verdict.counts.violations(), 0);
    }
}
