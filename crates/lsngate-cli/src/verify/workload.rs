//! The verify workload: concurrent clients ("processes") over a small key space of versioned
//! registers, each through the target (a proxy or the library, see [`super::client`]) in the mode
//! under test, recording every operation into the history. A write raises a key's version and
//! appends its unique op id to a log in the *same* statement (so the same transaction); a read
//! returns the key's version and which server answered, as PostgreSQL itself says. Reads go to
//! keys the process wrote (read-your-writes) and to any key (monotonic reads, others' writes),
//! alone or two in a read-only transaction; in `token` mode a process carries the commit
//! position of its writes to its reads and hands it to the other processes too. Every operation
//! is bounded by the hang limit. Not the checker: nothing here decides whether what was seen is
//! right.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lsngate_core::Lsn;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::client::{Client, Effect, Failure, Seen, Via};
use super::history::{Op, OpKind, Outcome};

pub const REGISTER_TABLE: &str = "lsngate_verify_register";
pub const LOG_TABLE: &str = "lsngate_verify_log";

/// The consistency mode the clients ask for (the proxy's `lsngate.consistency`; what the
/// library offers for it, see [`super::library_client`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Each client reads its own writes and never goes back in time.
    Session,
    /// Writes on one connection, reads on another with the reported commit position.
    Token,
    /// Every read sees every write committed through the proxy before it began.
    Global,
    /// Every read sees every write committed on the primary before it began (the primary's
    /// position is read before each read).
    Universal,
    /// Processes in pairs share a causal scope (`SET lsngate.scope`); each writes on one
    /// connection and reads on another, so only the scope carries its writes to its reads, and
    /// each read sees every write acknowledged under its scope before it began.
    Scope,
    /// As `session`, through the proxy's `fast` mode: a read goes to a replica only when the
    /// proxy knows it has the floor, else to the primary while the primary guard admits it, and
    /// waits on a replica when the guard refuses (proxy only).
    Fast,
    /// No floors at all: the self-test control, which must be caught.
    Eventual,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Session => "session",
            Mode::Token => "token",
            Mode::Global => "global",
            Mode::Universal => "universal",
            Mode::Scope => "scope",
            Mode::Fast => "fast",
            Mode::Eventual => "eventual",
        }
    }
}

/// The schema, recreated on the primary for each run.
pub fn schema_sql(keys: usize) -> String {
    format!(
        "DROP TABLE IF EXISTS {LOG_TABLE}, {REGISTER_TABLE};
         CREATE TABLE {REGISTER_TABLE} (key int PRIMARY KEY, version bigint NOT NULL, last_op text);
         CREATE TABLE {LOG_TABLE} (op_id text NOT NULL, key int NOT NULL, version bigint NOT NULL, process int NOT NULL);
         INSERT INTO {REGISTER_TABLE} SELECT k, 0, NULL FROM generate_series(0, {}) k;",
        keys.saturating_sub(1)
    )
}

/// What every process shares.
pub struct Plan {
    pub mode: Mode,
    /// What the clients talk to.
    pub via: Via,
    pub keys: usize,
    /// Whether reads also run two at a time in read-only transactions (not through the library,
    /// which has no transactions on replicas).
    pub transactions: bool,
    pub start: Instant,
    pub deadline: Instant,
    /// Set once every requested fault was injected and healed at least once: the run goes on
    /// past the deadline until then (so a short run still meets every fault).
    pub faults_covered: Arc<AtomicBool>,
    /// Set when injecting or healing a fault failed: the run stops (its cluster is no longer
    /// what the schedule says) and reports the error.
    pub faults_failed: Arc<AtomicBool>,
    /// Stop after this many operations in all (None: only the deadline).
    pub max_ops: Option<u64>,
    pub hang_after: Duration,
    pub seed: u64,
}

/// The run's shared counters and the token board.
#[derive(Default)]
pub struct Shared {
    tickets: AtomicU64,
    /// The newest commit position any process published (token mode).
    board: Mutex<Option<Lsn>>,
}

/// Runs `workers` processes until the deadline or the op budget; returns every operation.
/// `done` counts the operations recorded so far (for the progress bar).
pub async fn run(plan: Arc<Plan>, workers: usize, done: Arc<AtomicU64>) -> Vec<Op> {
    let shared = Arc::new(Shared::default());
    let mut tasks = Vec::new();
    for process in 0..workers {
        let (plan, shared, done) = (Arc::clone(&plan), Arc::clone(&shared), Arc::clone(&done));
        tasks.push(tokio::spawn(async move {
            Process::new(process, plan, shared, done).run().await
        }));
    }
    let mut ops = Vec::new();
    for task in tasks {
        // A panicking process loses only its own records; the rest are still checked.
        if let Ok(mut process_ops) = task.await {
            ops.append(&mut process_ops);
        }
    }
    ops
}

/// What one turn of a process does.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    Write {
        key: i32,
    },
    /// `own`: a key this process wrote.
    Read {
        key: i32,
        own: bool,
    },
    /// `BEGIN READ ONLY`, a read of each key, `COMMIT`.
    ReadOnly {
        keys: [i32; 2],
    },
}

struct Process {
    id: usize,
    plan: Arc<Plan>,
    shared: Arc<Shared>,
    done: Arc<AtomicU64>,
    rng: StdRng,
    client: Option<Client>,
    /// Keys this process has written (acknowledged or not).
    written: Vec<i32>,
    /// Token mode: the newest commit position of this process's writes.
    token: Option<Lsn>,
    /// Connections opened so far: the current one's session number.
    sessions: u32,
    writes: u64,
    transactions: u64,
    ops: Vec<Op>,
}

impl Process {
    fn new(id: usize, plan: Arc<Plan>, shared: Arc<Shared>, done: Arc<AtomicU64>) -> Process {
        let rng =
            StdRng::seed_from_u64(plan.seed ^ (id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        Process {
            id,
            plan,
            shared,
            done,
            rng,
            client: None,
            written: Vec::new(),
            token: None,
            sessions: 0,
            writes: 0,
            transactions: 0,
            ops: Vec::new(),
        }
    }

    fn ms(&self) -> f64 {
        self.plan.start.elapsed().as_secs_f64() * 1e3
    }

    fn may_go_on(&self) -> bool {
        if self.plan.faults_failed.load(Ordering::SeqCst) {
            return false;
        }
        if Instant::now() >= self.plan.deadline && self.plan.faults_covered.load(Ordering::SeqCst) {
            return false;
        }
        match self.plan.max_ops {
            Some(max) => self.shared.tickets.fetch_add(1, Ordering::SeqCst) < max,
            None => true,
        }
    }

    async fn run(mut self) -> Vec<Op> {
        while self.may_go_on() {
            let step = self.choose();
            if self.client.is_none() && !self.connect(step).await {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            match step {
                Step::Write { key } => self.write(key).await,
                Step::Read { key, own } => self.read(key, own).await,
                Step::ReadOnly { keys } => self.read_only(keys).await,
            }
        }
        self.ops
    }

    /// A record of `kind` on `key`, started now.
    /// Scope mode: the scope this process shares with its pair (`verify:s0` for processes 0
    /// and 1, ...).
    fn scope(&self) -> Option<String> {
        (self.plan.mode == Mode::Scope).then(|| format!("verify:s{}", self.id / 2))
    }

    fn start(&self, kind: OpKind, key: i32) -> Op {
        let invoke_ms = self.ms();
        Op {
            process: self.id,
            session: self.sessions,
            kind,
            key,
            scope: self.scope(),
            op_id: None,
            txn: None,
            invoke_ms,
            complete_ms: invoke_ms,
            outcome: Outcome::Ok,
            version: None,
            server: None,
            lsn: None,
            sqlstate: None,
            error: None,
        }
    }

    /// Opens the client; when it cannot, records the step's operation as failed.
    async fn connect(&mut self, step: Step) -> bool {
        let (kind, key) = match step {
            Step::Write { key } => (OpKind::Write, key),
            Step::Read { key, .. } => (OpKind::Read, key),
            Step::ReadOnly { keys } => (OpKind::Read, keys[0]),
        };
        let mut op = self.start(kind, key);
        let opened = tokio::time::timeout(
            self.plan.hang_after,
            Client::open(&self.plan.via, self.plan.mode, self.scope().as_deref()),
        )
        .await;
        match opened {
            Ok(Ok(client)) => {
                self.client = Some(client);
                self.sessions += 1;
                true
            }
            failed => {
                // Never sent: a write that could not be sent certainly had no effect.
                op.outcome = Outcome::Failed;
                op.sqlstate = Some("connection".into());
                op.error = Some(match failed {
                    Ok(Err(e)) => format!("{e:#}"),
                    _ => "no connection within the hang limit".into(),
                });
                op.complete_ms = self.ms();
                self.record(op);
                false
            }
        }
    }

    async fn write(&mut self, key: i32) {
        self.writes += 1;
        let mut op = self.start(OpKind::Write, key);
        let op_id = format!("p{}-{}", self.id, self.writes);
        op.op_id = Some(op_id.clone());
        self.written.push(key);
        let client = self.client.as_mut().expect("connected before a step");
        let written = bounded(
            self.plan.hang_after,
            client.write(&op_id, key, self.id as i32),
        )
        .await;
        op.complete_ms = self.ms();
        match written {
            Ok(written) => {
                op.version = Some(written.version);
                if let Some(lsn) = written.commit {
                    self.token = self.token.max(Some(lsn));
                    let mut board = self.shared.board.lock().unwrap_or_else(|p| p.into_inner());
                    *board = (*board).max(Some(lsn));
                    op.lsn = Some(lsn.to_string());
                }
            }
            // Sent, then failed: refused with an ERROR, it certainly did not commit; when the
            // connection broke or the session ended (or nothing came back), it may have; the
            // library may say it committed and only its position was lost (version unknown).
            Err(Ended::Failed(failure)) => {
                let outcome = match failure.effect {
                    Effect::Nothing => Outcome::Failed,
                    Effect::Unknown => Outcome::Indeterminate,
                    Effect::Committed => Outcome::Ok,
                };
                self.failed(&mut op, Ended::Failed(failure), outcome)
            }
            Err(ended) => self.failed(&mut op, ended, Outcome::Indeterminate),
        }
        self.record(op);
    }

    async fn read(&mut self, key: i32, own: bool) {
        let mut op = self.start(OpKind::Read, key);
        let floor = self.floor(own);
        op.lsn = floor.map(|l| l.to_string());
        let client = self.client.as_mut().expect("connected before a step");
        let seen = bounded(self.plan.hang_after, client.read(key, floor)).await;
        op.complete_ms = self.ms();
        self.seen(&mut op, seen);
        self.record(op);
    }

    /// Two reads in one read-only transaction; both start when the `BEGIN` is sent. Any failure
    /// inside gives the connection up (what state the block is in is unknown).
    async fn read_only(&mut self, keys: [i32; 2]) {
        self.transactions += 1;
        let txn = format!("p{}-t{}", self.id, self.transactions);
        let floor = self.floor(false);
        let mut first = self.start(OpKind::Read, keys[0]);
        first.txn = Some(txn);
        first.lsn = floor.map(|l| l.to_string());
        let hang_after = self.plan.hang_after;
        let client = self.client.as_mut().expect("connected before a step");
        if let Err(ended) = bounded(hang_after, client.begin_read_only(floor)).await {
            first.complete_ms = self.ms();
            self.failed(&mut first, ended, Outcome::Failed);
            self.client = None;
            self.record(first);
            return;
        }
        for key in keys {
            let mut op = Op {
                key,
                ..first.clone()
            };
            let client = self.client.as_mut().expect("connected before a step");
            let seen = bounded(hang_after, client.read_in_transaction(key)).await;
            op.complete_ms = self.ms();
            let ok = seen.is_ok();
            self.seen(&mut op, seen);
            self.record(op);
            if !ok {
                self.client = None;
                return;
            }
        }
        let client = self.client.as_mut().expect("connected before a step");
        if let Err(ended) = bounded(hang_after, client.commit()).await {
            // What the reads saw stands (nothing of a read-only block can be undone); the
            // failed COMMIT shows on the last read and the connection is given up.
            if let Some(last) = self.ops.last_mut() {
                let (code, message) = match ended {
                    Ended::Failed(f) => (f.sqlstate, f.message),
                    Ended::Hang => ("hang".into(), "COMMIT past the hang limit".into()),
                };
                last.error = Some(format!("COMMIT failed [{code}]: {message}"));
            }
            self.client = None;
        }
    }

    /// The floor a token-mode read carries: own keys this process's token, others' keys the
    /// newest anyone handed over (which covers this process's own too).
    fn floor(&self, own: bool) -> Option<Lsn> {
        if self.plan.mode != Mode::Token {
            return None;
        }
        if own {
            return self.token;
        }
        let board = *self.shared.board.lock().unwrap_or_else(|p| p.into_inner());
        board.max(self.token)
    }

    fn seen(&mut self, op: &mut Op, seen: Result<Seen, Ended>) {
        match seen {
            Ok(Seen { version: None, .. }) => {
                op.outcome = Outcome::Failed;
                op.sqlstate = Some("no-row".into());
                op.error = Some(format!(
                    "no row for key {}: the table was not there",
                    op.key
                ));
            }
            Ok(seen) => {
                op.version = seen.version;
                op.server = seen.server;
            }
            Err(ended) => self.failed(op, ended, Outcome::Failed),
        }
    }

    /// Records how an operation ended badly; a hang or a broken connection gives the client up.
    fn failed(&mut self, op: &mut Op, ended: Ended, outcome: Outcome) {
        match ended {
            Ended::Failed(failure) => {
                op.outcome = outcome;
                op.sqlstate = Some(failure.sqlstate);
                op.error = Some(failure.message);
                if self.client.as_ref().is_some_and(Client::is_closed) {
                    self.client = None;
                }
            }
            Ended::Hang => {
                op.outcome = Outcome::Hang;
                op.sqlstate = Some("hang".into());
                // Nobody knows what the connection is doing now: give it up.
                self.client = None;
            }
        }
    }

    fn record(&mut self, op: Op) {
        self.done.fetch_add(1, Ordering::Relaxed);
        self.ops.push(op);
    }

    /// Write 40 %, read a key this process wrote 30 %, read any key 20 % (30 % without
    /// transactions), a read-only transaction reading one of each 10 %.
    fn choose(&mut self) -> Step {
        let any_key = self.rng.random_range(0..self.plan.keys as i32);
        let roll = self.rng.random_range(0..100);
        let own_key = (!self.written.is_empty())
            .then(|| self.written[self.rng.random_range(0..self.written.len())]);
        match own_key {
            _ if roll < 40 => Step::Write { key: any_key },
            None if roll < 70 => Step::Write { key: any_key },
            Some(key) if roll < 70 => Step::Read { key, own: true },
            _ if roll < 90 || !self.plan.transactions => Step::Read {
                key: any_key,
                own: false,
            },
            own => Step::ReadOnly {
                keys: [own.unwrap_or(any_key), any_key],
            },
        }
    }
}

/// How an operation ended when it did not succeed.
enum Ended {
    Failed(Failure),
    /// No answer within the hang limit.
    Hang,
}

async fn bounded<T>(
    limit: Duration,
    work: impl Future<Output = Result<T, Failure>>,
) -> Result<T, Ended> {
    match tokio::time::timeout(limit, work).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(failure)) => Err(Ended::Failed(failure)),
        Err(_) => Err(Ended::Hang),
    }
}
