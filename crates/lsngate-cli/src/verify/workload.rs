//! The verify workload: concurrent clients ("processes") over a small key space of versioned
//! registers, each through a proxy in the mode under test, recording every operation into the
//! history. A write raises a key's version and appends its unique op id to a log in the *same*
//! statement (so the same transaction); a read returns the key's version and which server
//! answered, as PostgreSQL itself says. Reads go to keys the process wrote (read-your-writes)
//! and to any key (monotonic reads, others' writes); in `token` mode a process writes on one
//! connection and reads on another, carrying the commit position the proxy reported, and hands
//! it to the other processes too. Every operation is bounded by the hang limit. Not the checker:
//! nothing here decides whether what was seen is right.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use lsngate_core::Lsn;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, SimpleQueryMessage, Statement};

use super::history::{Op, OpKind, Outcome, Server};
use crate::inproc_proxy;

pub const REGISTER_TABLE: &str = "lsngate_verify_register";
pub const LOG_TABLE: &str = "lsngate_verify_log";

/// Raises the key's version and logs the op id in one statement: one transaction, so the log
/// holds an op id exactly when its register change committed.
const WRITE_SQL: &str = "WITH changed AS (
        UPDATE lsngate_verify_register SET version = version + 1, last_op = $1
        WHERE key = $2 RETURNING version)
    INSERT INTO lsngate_verify_log (op_id, key, version, process)
    SELECT $1, $2, version, $3 FROM changed RETURNING version";

/// The read, and who served it in the server's own words.
const READ_SQL: &str = "SELECT version, pg_is_in_recovery(), inet_server_port()
    FROM lsngate_verify_register WHERE key = $1";

/// The consistency mode the clients ask the proxy for (`lsngate.consistency`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Each connection reads its own writes and never goes back in time.
    Session,
    /// Writes on one connection, reads on another with the reported commit position.
    Token,
    /// Every read waits for the primary's position when it starts.
    Global,
    /// No floors at all: the self-test control, which must be caught.
    Eventual,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Session => "session",
            Mode::Token => "token",
            Mode::Global => "global",
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
    /// Where clients log in (the proxy), without the consistency option.
    pub endpoint: tokio_postgres::Config,
    pub keys: usize,
    pub start: Instant,
    pub deadline: Instant,
    /// Set once every requested fault was injected and healed at least once: the run goes on
    /// past the deadline until then (so a short run still meets every fault).
    pub faults_covered: Arc<AtomicBool>,
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
pub async fn run(plan: Arc<Plan>, workers: usize, bar: ProgressBar) -> Vec<Op> {
    let shared = Arc::new(Shared::default());
    let mut tasks = Vec::new();
    for process in 0..workers {
        let (plan, shared, bar) = (Arc::clone(&plan), Arc::clone(&shared), bar.clone());
        tasks.push(tokio::spawn(async move {
            Process::new(process, plan, shared, bar).run().await
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

/// One process's connections through the proxy.
struct Conn {
    main: Client,
    write: Statement,
    read: Statement,
    /// Token mode: the connection reads go to, with a floor in a comment.
    reader: Option<Client>,
}

impl Conn {
    async fn open(plan: &Plan) -> anyhow::Result<Conn> {
        let main = inproc_proxy::connect(&plan.endpoint, plan.mode.name()).await?;
        let reader = match plan.mode {
            Mode::Token => Some(inproc_proxy::connect(&plan.endpoint, "token").await?),
            _ => None,
        };
        let write = main
            .prepare_typed(WRITE_SQL, &[Type::TEXT, Type::INT4, Type::INT4])
            .await?;
        let read = main.prepare_typed(READ_SQL, &[Type::INT4]).await?;
        Ok(Conn {
            main,
            write,
            read,
            reader,
        })
    }

    fn is_closed(&self) -> bool {
        self.main.is_closed() || self.reader.as_ref().is_some_and(Client::is_closed)
    }
}

/// What a finished operation adds to its record.
struct Answer {
    version: Option<i64>,
    server: Option<Server>,
    lsn: Option<String>,
}

struct Process {
    id: usize,
    plan: Arc<Plan>,
    shared: Arc<Shared>,
    bar: ProgressBar,
    rng: StdRng,
    conn: Option<Conn>,
    /// Keys this process has written (acknowledged or not).
    written: Vec<i32>,
    /// Token mode: the newest commit position of this process's writes.
    token: Option<Lsn>,
    writes: u64,
    ops: Vec<Op>,
}

impl Process {
    fn new(id: usize, plan: Arc<Plan>, shared: Arc<Shared>, bar: ProgressBar) -> Process {
        let rng =
            StdRng::seed_from_u64(plan.seed ^ (id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        Process {
            id,
            plan,
            shared,
            bar,
            rng,
            conn: None,
            written: Vec::new(),
            token: None,
            writes: 0,
            ops: Vec::new(),
        }
    }

    fn ms(&self) -> f64 {
        self.plan.start.elapsed().as_secs_f64() * 1e3
    }

    fn may_go_on(&self) -> bool {
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
            let (kind, key, own) = self.choose();
            let op_id = (kind == OpKind::Write).then(|| {
                self.writes += 1;
                format!("p{}-{}", self.id, self.writes)
            });
            let invoke_ms = self.ms();
            let mut op = Op {
                process: self.id,
                kind,
                key,
                op_id,
                invoke_ms,
                complete_ms: invoke_ms,
                outcome: Outcome::Ok,
                version: None,
                server: None,
                lsn: None,
                sqlstate: None,
                error: None,
            };
            if self.conn.is_none() {
                match tokio::time::timeout(self.plan.hang_after, Conn::open(&self.plan)).await {
                    Ok(Ok(conn)) => self.conn = Some(conn),
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
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                }
            }
            if kind == OpKind::Write {
                self.written.push(key);
            }
            let answer = tokio::time::timeout(self.plan.hang_after, self.execute(&op, own)).await;
            op.complete_ms = self.ms();
            match answer {
                Ok(Ok(answer)) if kind == OpKind::Read && answer.version.is_none() => {
                    op.outcome = Outcome::Failed;
                    op.sqlstate = Some("no-row".into());
                    op.error = Some(format!("no row for key {key}: the table was not there"));
                }
                Ok(Ok(answer)) => {
                    op.version = answer.version;
                    op.server = answer.server;
                    op.lsn = answer.lsn;
                }
                Ok(Err(e)) => {
                    op.outcome = match kind {
                        OpKind::Write => Outcome::Indeterminate,
                        OpKind::Read => Outcome::Failed,
                    };
                    op.sqlstate = Some(sqlstate(&e));
                    op.error = Some(message(&e));
                    if self.conn.as_ref().is_some_and(Conn::is_closed) {
                        self.conn = None;
                    }
                }
                Err(_) => {
                    op.outcome = Outcome::Hang;
                    op.sqlstate = Some("hang".into());
                    // Nobody knows what the connection is doing now: give it up.
                    self.conn = None;
                }
            }
            self.record(op);
        }
        self.ops
    }

    fn record(&mut self, op: Op) {
        self.bar.inc(1);
        self.ops.push(op);
    }

    /// Write 40 %, read a key this process wrote 35 %, read any key 25 %.
    fn choose(&mut self) -> (OpKind, i32, bool) {
        let any_key = self.rng.random_range(0..self.plan.keys as i32);
        let roll = self.rng.random_range(0..100);
        if roll < 40 || (roll < 75 && self.written.is_empty()) {
            (OpKind::Write, any_key, true)
        } else if roll < 75 {
            let at = self.rng.random_range(0..self.written.len());
            (OpKind::Read, self.written[at], true)
        } else {
            (OpKind::Read, any_key, false)
        }
    }

    async fn execute(&mut self, op: &Op, own: bool) -> Result<Answer, tokio_postgres::Error> {
        let conn = self.conn.as_ref().expect("connected before executing");
        match op.kind {
            OpKind::Write => {
                let id = op.op_id.as_deref().unwrap_or_default();
                let row = conn
                    .main
                    .query_one(&conn.write, &[&id, &op.key, &(self.id as i32)])
                    .await?;
                let lsn = match self.plan.mode {
                    Mode::Token => commit_lsn(&conn.main).await?,
                    _ => None,
                };
                if let Some(lsn) = lsn {
                    self.token = self.token.max(Some(lsn));
                    let mut board = self.shared.board.lock().unwrap_or_else(|p| p.into_inner());
                    *board = (*board).max(Some(lsn));
                }
                Ok(Answer {
                    version: Some(row.get(0)),
                    server: None,
                    lsn: lsn.map(|l| l.to_string()),
                })
            }
            OpKind::Read => {
                let (row, floor) = match &conn.reader {
                    Some(reader) => {
                        // Own keys carry this process's token; others' keys the newest anyone
                        // handed over (which covers this process's own too).
                        let floor = if own {
                            self.token
                        } else {
                            let board =
                                *self.shared.board.lock().unwrap_or_else(|p| p.into_inner());
                            board.max(self.token)
                        };
                        let sql = match floor {
                            Some(floor) => format!("/* lsngate_min_lsn='{floor}' */ {READ_SQL}"),
                            None => READ_SQL.to_string(),
                        };
                        let row = reader
                            .query_typed_opt(&sql, &[(&op.key, Type::INT4)])
                            .await?;
                        (row, floor)
                    }
                    None => (conn.main.query_opt(&conn.read, &[&op.key]).await?, None),
                };
                Ok(match row {
                    Some(row) => Answer {
                        version: Some(row.get(0)),
                        server: Some(Server {
                            in_recovery: row.get(1),
                            port: row.get(2),
                        }),
                        lsn: floor.map(|l| l.to_string()),
                    },
                    // The registers exist from the start: no row means the table was not there.
                    None => Answer {
                        version: None,
                        server: None,
                        lsn: None,
                    },
                })
            }
        }
    }
}

/// `SHOW lsngate.commit_lsn`: the position of this connection's last commit, from the proxy.
async fn commit_lsn(client: &Client) -> Result<Option<Lsn>, tokio_postgres::Error> {
    let messages = client.simple_query("SHOW lsngate.commit_lsn").await?;
    Ok(messages.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => row.get(0).and_then(|text| Lsn::parse(text).ok()),
        _ => None,
    }))
}

/// The server's (or the proxy's) message, not tokio-postgres's bare "db error".
fn message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => db.message().to_string(),
        None => e.to_string(),
    }
}

/// The SQLSTATE, or `connection` for an error without one (the connection broke).
fn sqlstate(e: &tokio_postgres::Error) -> String {
    match e.code() {
        Some(code) => code.code().to_string(),
        None => "connection".to_string(),
    }
}
