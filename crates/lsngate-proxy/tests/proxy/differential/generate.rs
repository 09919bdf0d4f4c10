//! The differential checker's cases: random but valid client message sequences, made from a seed
//! by a PRNG of our own (splitmix64), so a seed gives the same case on every machine and with any
//! version of any crate. A case mixes the simple and the extended protocol, Flush and Sync in any
//! order, pipelines, errors in the middle of a batch, transaction blocks, SQL and protocol
//! prepared statements, COPY in both directions and the statements the proxy answers itself. Its
//! SQL touches only the case's own table (`{t}`, filled with rows 1..=3 before the case), with
//! fixed values, so PostgreSQL answers it the same way every time: any difference between the
//! direct and the proxied reply streams is the proxy's.
//!
//! The generator keeps a rough model (which statements and portals exist, whether a transaction
//! block or an unsynced extended batch is open) only to make the sequences meaningful; a wrong
//! guess makes a deterministic error, which is as good a test as a success.

use std::fmt;

use bytes::{BufMut, Bytes, BytesMut};
use lsngate_proxy::net::FrontendMessage;

/// splitmix64: tiny, fast, and fixed forever (a seed printed today replays next year).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// 0..n.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True `percent` times in 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// One client message, in a form that prints readably; `{t}` in SQL is the case's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    Query(String),
    Parse {
        name: String,
        sql: String,
        types: Vec<u32>,
    },
    Bind {
        portal: String,
        statement: String,
        params: Vec<Option<String>>,
        binary_results: bool,
    },
    Describe {
        kind: char,
        name: String,
    },
    Execute {
        portal: String,
        max_rows: i32,
    },
    Close {
        kind: char,
        name: String,
    },
    Sync,
    Flush,
    CopyData(String),
    CopyDone,
    CopyFail(String),
}

impl Msg {
    /// The wire message, with `{t}` replaced by `table`.
    pub fn to_frontend(&self, table: &str) -> FrontendMessage {
        let sql = |s: &str| s.replace("{t}", table);
        match self {
            Msg::Query(q) => FrontendMessage::Query(sql(q)),
            Msg::Parse {
                name,
                sql: q,
                types,
            } => FrontendMessage::Parse {
                statement: name.clone(),
                query: sql(q),
                param_types: types.clone(),
            },
            Msg::Bind {
                portal,
                statement,
                params,
                binary_results,
            } => {
                let mut rest = BytesMut::new();
                rest.put_i16(0); // parameter formats: all text
                rest.put_i16(params.len() as i16);
                for p in params {
                    match p {
                        Some(v) => {
                            rest.put_i32(v.len() as i32);
                            rest.put_slice(v.as_bytes());
                        }
                        None => rest.put_i32(-1),
                    }
                }
                if *binary_results {
                    rest.put_i16(1);
                    rest.put_i16(1);
                } else {
                    rest.put_i16(0);
                }
                FrontendMessage::Bind {
                    portal: portal.clone(),
                    statement: statement.clone(),
                    rest: Bytes::from(rest),
                }
            }
            Msg::Describe { kind, name } => FrontendMessage::Describe {
                kind: *kind as u8,
                name: name.clone(),
            },
            Msg::Execute { portal, max_rows } => FrontendMessage::Execute {
                portal: portal.clone(),
                max_rows: *max_rows,
            },
            Msg::Close { kind, name } => FrontendMessage::Close {
                kind: *kind as u8,
                name: name.clone(),
            },
            Msg::Sync => FrontendMessage::Sync,
            Msg::Flush => FrontendMessage::Flush,
            Msg::CopyData(data) => FrontendMessage::CopyData(Bytes::from(sql(data))),
            Msg::CopyDone => FrontendMessage::CopyDone,
            Msg::CopyFail(reason) => FrontendMessage::CopyFail(reason.clone()),
        }
    }

    /// Sync and Query are the messages PostgreSQL answers with a ReadyForQuery.
    pub fn ends_in_ready(&self) -> bool {
        matches!(self, Msg::Sync | Msg::Query(_))
    }
}

impl fmt::Display for Msg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Msg::Query(q) => write!(f, "Query {q:?}"),
            Msg::Parse { name, sql, types } if types.is_empty() => {
                write!(f, "Parse {name:?} {sql:?}")
            }
            Msg::Parse { name, sql, types } => write!(f, "Parse {name:?} {sql:?} types {types:?}"),
            Msg::Bind {
                portal,
                statement,
                params,
                binary_results,
            } => {
                let params: Vec<String> = params
                    .iter()
                    .map(|p| p.as_ref().map_or("NULL".into(), |v| format!("{v:?}")))
                    .collect();
                write!(
                    f,
                    "Bind portal {portal:?} statement {statement:?} [{}]{}",
                    params.join(", "),
                    if *binary_results {
                        " binary results"
                    } else {
                        ""
                    }
                )
            }
            Msg::Describe { kind, name } => write!(f, "Describe {kind} {name:?}"),
            Msg::Execute { portal, max_rows } => {
                write!(f, "Execute {portal:?} max_rows {max_rows}")
            }
            Msg::Close { kind, name } => write!(f, "Close {kind} {name:?}"),
            Msg::Sync => write!(f, "Sync"),
            Msg::Flush => write!(f, "Flush"),
            Msg::CopyData(data) => write!(f, "CopyData {data:?}"),
            Msg::CopyDone => write!(f, "CopyDone"),
            Msg::CopyFail(reason) => write!(f, "CopyFail {reason:?}"),
        }
    }
}

/// What the client does next: send a message, or end the current network write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Send(Msg),
    /// The messages so far go out in one write; the next ones in another, at once.
    Write,
    /// The messages so far go out in one write, and the client waits for what the server answers
    /// to them before it sends more (Flush-then-wait, psql waiting for CopyInResponse, ...).
    Wait,
}

/// One generated case. The harness appends `Sync` and [`END_QUERY`] to its steps.
#[derive(Debug, Clone)]
pub struct Case {
    pub steps: Vec<Step>,
}

/// The last message of every case, after a Sync: the Sync ends any skip-till-Sync state, the
/// ROLLBACK any transaction block (so the marker cannot fail with 25P02), and the marker's row
/// tells the reader that every reply before it has arrived.
pub const END_QUERY: &str = "ROLLBACK; SELECT 'lsngate-diff-end' AS marker";
/// The value of the marker's row.
pub const MARKER: &str = "lsngate-diff-end";

impl Case {
    /// The case without `i..j` of its steps, still valid: a wait only where the protocol promises
    /// replies (see `Generator::end_write`), no write boundary without messages before it.
    pub fn without(&self, i: usize, j: usize) -> Case {
        let mut steps: Vec<Step> = Vec::new();
        for step in self.steps[..i].iter().chain(&self.steps[j..]) {
            match (step, steps.last()) {
                (Step::Write | Step::Wait, None | Some(Step::Write | Step::Wait)) => {}
                (Step::Wait, Some(Step::Send(Msg::Flush | Msg::Sync | Msg::Query(_)))) => {
                    steps.push(Step::Wait)
                }
                (Step::Wait, _) => steps.push(Step::Write),
                (step, _) => steps.push(step.clone()),
            }
        }
        Case { steps }
    }

    pub fn messages(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s, Step::Send(_)))
            .count()
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut n = 0;
        for step in &self.steps {
            match step {
                Step::Send(m) => {
                    n += 1;
                    writeln!(f, "  {n:>3}  {m}")?;
                }
                Step::Write => writeln!(f, "       -- end of write")?,
                Step::Wait => writeln!(f, "       -- end of write; wait for the replies")?,
            }
        }
        writeln!(
            f,
            "  {:>3}  Sync\n  {:>3}  Query {END_QUERY:?}   (the harness's end marker)",
            n + 1,
            n + 2
        )
    }
}

/// Patterns the generator can leave out while a known bug is being fixed (env
/// `LSNGATE_DIFF_EXCLUDE`, comma-separated); by default nothing is left out.
#[derive(Debug, Clone, Default)]
pub struct Exclusions {
    /// A simple Query while extended messages are unsynced: a Sync is put in front of it.
    pub query_after_unsynced: bool,
    /// COPY FROM STDIN, over either protocol.
    pub copy_in: bool,
}

impl Exclusions {
    pub fn parse(list: &str) -> Result<Exclusions, String> {
        let mut exclusions = Exclusions::default();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "query-after-unsynced" => exclusions.query_after_unsynced = true,
                "copy-in" => exclusions.copy_in = true,
                other => {
                    return Err(format!(
                        "LSNGATE_DIFF_EXCLUDE: unknown pattern {other:?}; known: query-after-unsynced, copy-in"
                    ));
                }
            }
        }
        Ok(exclusions)
    }
}

impl Exclusions {
    /// Whether `case` (a candidate of the minimizer, which drops steps at will) is free of the
    /// excluded patterns, as every generated case is.
    pub fn admit(&self, case: &Case) -> bool {
        let mut unsynced = false;
        for step in &case.steps {
            let Step::Send(msg) = step else { continue };
            match msg {
                Msg::Query(_) if unsynced && self.query_after_unsynced => return false,
                Msg::Query(_) | Msg::CopyData(_) | Msg::CopyDone | Msg::CopyFail(_) => {}
                Msg::Sync => unsynced = false,
                _ => unsynced = true,
            }
            let copy_in = match msg {
                Msg::Query(q) | Msg::Parse { sql: q, .. } => q.contains("FROM STDIN"),
                _ => false,
            };
            if copy_in && self.copy_in {
                return false;
            }
        }
        true
    }
}

/// The case for `seed`.
pub fn generate(seed: u64, exclusions: &Exclusions) -> Case {
    let mut generator = Generator {
        rng: Rng::new(seed),
        exclusions: exclusions.clone(),
        steps: Vec::new(),
        next_id: 100,
        statements: Vec::new(),
        portals: Vec::new(),
        sql_prepared: Vec::new(),
        unsynced: false,
        in_block: false,
    };
    // 5-40 messages in all, with the harness's two.
    let target = 3 + generator.rng.below(23);
    while generator.messages() < target {
        generator.action();
    }
    Case {
        steps: generator.steps,
    }
}

/// A statement and the values of its `$n` parameters.
struct Sql {
    text: String,
    params: Vec<Option<String>>,
}

impl Sql {
    fn new(text: &str, params: &[&str]) -> Sql {
        Sql {
            text: text.to_string(),
            params: params.iter().map(|p| Some(p.to_string())).collect(),
        }
    }

    /// The statement with its parameters written in as literals, for the simple protocol.
    fn inline(&self) -> String {
        let mut text = self.text.clone();
        // Backwards, so `$1` does not match the front of `$10`.
        for (i, value) in self.params.iter().enumerate().rev() {
            let literal = value.as_ref().map_or("NULL".into(), |v| format!("'{v}'"));
            text = text.replace(&format!("${}", i + 1), &literal);
        }
        text
    }
}

const STATEMENT_NAMES: &[&str] = &["s1", "s2", "s3"];
const PORTAL_NAMES: &[&str] = &["p1", "p2"];
const TRANSACTION_CONTROL: &[&str] = &[
    "BEGIN",
    "BEGIN",
    "BEGIN ISOLATION LEVEL REPEATABLE READ",
    "BEGIN READ ONLY",
    "START TRANSACTION",
    "COMMIT",
    "COMMIT",
    "END",
    "ROLLBACK",
    "ROLLBACK",
    "SAVEPOINT sp1",
    "SAVEPOINT sp2",
    "RELEASE SAVEPOINT sp1",
    "ROLLBACK TO SAVEPOINT sp1",
    "COMMIT AND CHAIN",
];
/// Statements the proxy answers itself (or whose comment it strips); PostgreSQL answers them as
/// custom settings, with the same messages.
const PROXY_HANDLED: &[&str] = &[
    // Quoted: `primary` is a reserved word to PostgreSQL.
    "SET lsngate.route = 'primary'",
    "SET lsngate.route = auto",
    "RESET lsngate.route",
    "SET lsngate.consistency = session",
];

struct Generator {
    rng: Rng,
    exclusions: Exclusions,
    steps: Vec<Step>,
    /// Ids for inserts that should succeed; the setup rows are 1..=3.
    next_id: u32,
    /// Protocol-level named statements believed to exist, with their parameter counts.
    statements: Vec<(String, usize)>,
    /// Named portals believed to exist.
    portals: Vec<String>,
    /// SQL PREPAREd statements believed to exist, with their parameter counts.
    sql_prepared: Vec<(String, usize)>,
    /// Extended-protocol messages sent since the last Sync.
    unsynced: bool,
    /// A BEGIN was sent and no COMMIT/ROLLBACK since (a guess: errors are not modelled).
    in_block: bool,
}

impl Generator {
    fn messages(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s, Step::Send(_)))
            .count()
    }

    fn fresh_id(&mut self) -> String {
        self.next_id += 1;
        self.next_id.to_string()
    }

    fn send(&mut self, msg: Msg) {
        match &msg {
            Msg::Query(q) => {
                if self.unsynced && self.exclusions.query_after_unsynced {
                    self.send(Msg::Sync);
                }
                // A simple Query drops the unnamed statement and portal; so does PostgreSQL.
                self.note_transaction_control(q);
            }
            Msg::Sync => {
                self.unsynced = false;
                if !self.in_block {
                    self.portals.clear();
                }
            }
            Msg::CopyData(_) | Msg::CopyDone | Msg::CopyFail(_) => {}
            Msg::Parse { name, .. } if !name.is_empty() => {
                self.unsynced = true;
            }
            _ => self.unsynced = true,
        }
        self.steps.push(Step::Send(msg));
    }

    fn note_transaction_control(&mut self, sql: &str) {
        for statement in sql.split(';') {
            let s = statement.trim().to_ascii_uppercase();
            if s.starts_with("BEGIN") || s.starts_with("START") {
                self.in_block = true;
            } else if s.starts_with("COMMIT AND CHAIN") {
                self.in_block = true;
            } else if s.starts_with("COMMIT") || s.starts_with("END") || s == "ROLLBACK" {
                self.in_block = false;
            } else if s.starts_with("DEALLOCATE ALL") {
                // Drops protocol-level statements too.
                self.statements.clear();
                self.sql_prepared.clear();
            }
        }
    }

    /// Ends the current write. The client waits for replies only where the protocol promises
    /// some: after a Flush, a Sync or a Query (PostgreSQL also flushes every ErrorResponse at
    /// once, but a client cannot count on that, and a proxy need not copy it).
    fn end_write(&mut self, wait: bool) {
        let Some(Step::Send(last)) = self.steps.last() else {
            return;
        };
        let promised = matches!(last, Msg::Flush | Msg::Sync | Msg::Query(_));
        self.steps.push(if wait && promised {
            Step::Wait
        } else {
            Step::Write
        });
    }

    fn action(&mut self) {
        match self.rng.below(100) {
            0..=13 => {
                let sql = self.any_statement().inline();
                self.send(Msg::Query(sql));
            }
            14..=18 => self.multi_statement_query(),
            19..=36 => self.extended_statement(),
            37..=41 => self.bind_existing(),
            42..=51 => self.send(Msg::Sync),
            52..=57 => {
                self.send(Msg::Flush);
                let wait = self.rng.chance(70);
                self.end_write(wait);
            }
            58..=61 => {
                let wait = self.rng.chance(60);
                self.end_write(wait);
            }
            62..=65 => self.close(),
            66..=67 => self.describe_existing(),
            68..=73 => {
                let sql = self.rng.pick(TRANSACTION_CONTROL).to_string();
                if self.rng.chance(60) {
                    self.send(Msg::Query(sql));
                } else {
                    self.note_transaction_control(&sql);
                    self.extended_run(Sql::new(&sql, &[]), "");
                }
            }
            74..=79 => self.sql_prepare(),
            80..=82 if !self.exclusions.copy_in => self.copy_in_simple(),
            83..=85 => self.copy_out_simple(),
            86 => self.copy_out_extended(),
            87 if !self.exclusions.copy_in => self.copy_in_extended(),
            80..=82 | 87 => {}
            88..=91 => self.proxy_handled(),
            92..=94 => self.autosave(),
            _ => {
                // Several Executes of one statement before one Sync (a pipeline).
                let sql = self.read_statement();
                self.extended_run(sql, "");
                let extra = 1 + self.rng.below(2);
                for _ in 0..extra {
                    let sql = self.any_statement();
                    self.extended_run(sql, "");
                }
                self.send(Msg::Sync);
            }
        }
        if matches!(self.steps.last(), Some(Step::Send(m)) if m.ends_in_ready())
            && self.rng.chance(20)
        {
            self.end_write(true);
        }
    }

    /// A statement of any kind the protocols can carry as an ordinary statement.
    fn any_statement(&mut self) -> Sql {
        match self.rng.below(10) {
            0..=3 => self.read_statement(),
            4..=7 => self.write_statement(),
            8 => self.setting_statement(),
            _ => Sql::new(*self.rng.pick(TRANSACTION_CONTROL), &[]),
        }
    }

    fn read_statement(&mut self) -> Sql {
        let existing = (1 + self.rng.below(3)).to_string();
        let mut sql = match self.rng.below(11) {
            0 | 1 => Sql::new("SELECT id, v FROM {t} ORDER BY id", &[]),
            2 => Sql::new("SELECT v FROM {t} WHERE id = $1", &[&existing]),
            3 => Sql::new("SELECT count(*) AS n, sum(v) AS total FROM {t}", &[]),
            4 => Sql::new(
                "SELECT g AS n, g * $1 AS m FROM generate_series(1, 4) g",
                &["7"],
            ),
            5 => Sql::new("VALUES (1, 'one'), (2, NULL)", &[]),
            // Rows, then 22012 in the middle of the result.
            6 => Sql::new(
                "SELECT id, 100 / (id - $1) AS q FROM {t} ORDER BY id",
                &[&existing],
            ),
            7 => Sql::new("SELECT 10 / $1::int AS q", &["0"]),
            8 => Sql::new("", &[]),
            9 => Sql::new("SELECT id FROM {t} ORDER BY id LIMIT 1 FOR UPDATE", &[]),
            _ => Sql::new(
                "SELECT current_setting('work_mem') AS work_mem, current_setting('application_name') AS app",
                &[],
            ),
        };
        if !sql.text.is_empty() && self.rng.chance(10) {
            sql.text = format!("/* lsngate:route=primary */ {}", sql.text);
        }
        sql
    }

    fn write_statement(&mut self) -> Sql {
        let fresh = self.fresh_id();
        let existing = (1 + self.rng.below(3)).to_string();
        match self.rng.below(9) {
            0 | 1 => Sql::new("INSERT INTO {t} (id, v) VALUES ($1, $2)", &[&fresh, "5"]),
            // 23505 unless the row was deleted.
            2 => Sql::new("INSERT INTO {t} (id, v) VALUES ($1, $2)", &[&existing, "6"]),
            3 => Sql::new(
                "INSERT INTO {t} (id, v) VALUES ($1, $2) RETURNING id, v",
                &[&fresh, "7"],
            ),
            4 => Sql::new(
                "UPDATE {t} SET v = v + $1 WHERE id <= $2",
                &["1", &existing],
            ),
            5 => Sql::new(
                "UPDATE {t} SET v = v * 2 WHERE id = $1 RETURNING id, v",
                &[&existing],
            ),
            6 => Sql::new("DELETE FROM {t} WHERE id = $1", &[&existing]),
            7 => Sql::new(
                "WITH moved AS (UPDATE {t} SET v = v - 1 WHERE id = $1 RETURNING v) SELECT v FROM moved",
                &[&existing],
            ),
            _ => Sql {
                text: "INSERT INTO {t} (id, v) VALUES ($1, $2)".into(),
                params: vec![Some(fresh), None],
            },
        }
    }

    fn setting_statement(&mut self) -> Sql {
        let n = (1 + self.rng.below(8)).to_string();
        match self.rng.below(7) {
            0 => Sql::new(&format!("SET work_mem = '{n}MB'"), &[]),
            1 => Sql::new("RESET work_mem", &[]),
            2 => Sql::new("SET LOCAL work_mem = '3MB'", &[]),
            3 => Sql::new("SHOW work_mem", &[]),
            4 => Sql::new(&format!("SET application_name = 'diff-{n}'"), &[]),
            5 => Sql::new("SHOW application_name", &[]),
            _ => Sql::new("RESET application_name", &[]),
        }
    }

    fn multi_statement_query(&mut self) {
        let count = 2 + self.rng.below(2);
        let parts: Vec<String> = (0..count)
            .map(|_| {
                let sql = self.any_statement();
                sql.inline()
            })
            .filter(|s| !s.is_empty())
            .collect();
        let mut text = parts.join("; ");
        if self.rng.chance(30) {
            text.push(';');
        }
        self.send(Msg::Query(text));
    }

    /// Parse (unnamed or named), maybe Describe S, Bind, maybe Describe P, Execute(s); no Sync.
    fn extended_statement(&mut self) {
        let sql = self.any_statement();
        let name = if self.rng.chance(60) {
            String::new()
        } else {
            self.rng.pick(STATEMENT_NAMES).to_string()
        };
        let portal = if self.rng.chance(70) {
            String::new()
        } else {
            self.rng.pick(PORTAL_NAMES).to_string()
        };
        self.extended_run(sql, &name);
        // Reuse of the statement through another portal, sometimes.
        if !portal.is_empty() && self.rng.chance(30) {
            let count = self.param_count(&name);
            self.bind_and_execute(&name, &portal, count);
        }
    }

    fn param_count(&self, name: &str) -> usize {
        self.statements
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, c)| *c)
    }

    /// Parse `sql` as `name`, then Bind it into the unnamed portal and Execute it.
    fn extended_run(&mut self, sql: Sql, name: &str) {
        let types = if !sql.params.is_empty() && self.rng.chance(20) {
            vec![0; sql.params.len()] // unspecified: the server infers them
        } else {
            Vec::new()
        };
        self.send(Msg::Parse {
            name: name.to_string(),
            sql: sql.text.clone(),
            types,
        });
        if !name.is_empty() {
            self.statements.retain(|(n, _)| n != name);
            self.statements.push((name.to_string(), sql.params.len()));
        }
        if self.rng.chance(20) {
            self.send(Msg::Describe {
                kind: 'S',
                name: name.to_string(),
            });
        }
        let binary_results = self.rng.chance(8);
        self.send(Msg::Bind {
            portal: String::new(),
            statement: name.to_string(),
            params: sql.params,
            binary_results,
        });
        self.execute("");
    }

    /// Describe P sometimes, then one Execute, or several with a row limit.
    fn execute(&mut self, portal: &str) {
        if self.rng.chance(20) {
            self.send(Msg::Describe {
                kind: 'P',
                name: portal.to_string(),
            });
        }
        let max_rows = if self.rng.chance(70) {
            0
        } else {
            1 + self.rng.below(2) as i32
        };
        self.send(Msg::Execute {
            portal: portal.to_string(),
            max_rows,
        });
        if max_rows > 0 && self.rng.chance(60) {
            let rest = *self.rng.pick(&[0, 1, 2]);
            self.send(Msg::Execute {
                portal: portal.to_string(),
                max_rows: rest,
            });
        }
    }

    fn bind_and_execute(&mut self, statement: &str, portal: &str, params: usize) {
        let values = (0..params).map(|_| Some(self.fresh_id())).collect();
        self.send(Msg::Bind {
            portal: portal.to_string(),
            statement: statement.to_string(),
            params: values,
            binary_results: false,
        });
        if !portal.is_empty() && !self.portals.iter().any(|p| p == portal) {
            self.portals.push(portal.to_string());
        }
        self.execute(portal);
        if !portal.is_empty() && self.rng.chance(30) {
            self.send(Msg::Close {
                kind: 'P',
                name: portal.to_string(),
            });
            self.portals.retain(|p| p != portal);
        }
    }

    /// Bind a named statement made earlier (maybe in an earlier transaction, maybe closed since:
    /// then 26000) and run it.
    fn bind_existing(&mut self) {
        let (name, params) = if !self.statements.is_empty() && self.rng.chance(85) {
            self.rng.pick(&self.statements).clone()
        } else {
            (self.rng.pick(STATEMENT_NAMES).to_string(), 0)
        };
        let portal = if self.rng.chance(50) {
            String::new()
        } else {
            self.rng.pick(PORTAL_NAMES).to_string()
        };
        self.bind_and_execute(&name, &portal, params);
    }

    /// Close a statement or portal; a closed statement's name is often parsed again at once.
    fn close(&mut self) {
        if self.rng.chance(65) {
            let name = if !self.statements.is_empty() && self.rng.chance(80) {
                self.rng.pick(&self.statements).0.clone()
            } else {
                self.rng.pick(STATEMENT_NAMES).to_string()
            };
            self.send(Msg::Close {
                kind: 'S',
                name: name.clone(),
            });
            self.statements.retain(|(n, _)| *n != name);
            if self.rng.chance(60) {
                if self.rng.chance(40) {
                    self.send(Msg::Sync);
                }
                let sql = self.any_statement();
                self.extended_run(sql, &name);
            }
        } else {
            let name = if !self.portals.is_empty() && self.rng.chance(70) {
                self.rng.pick(&self.portals).clone()
            } else {
                self.rng.pick(&["", "p1"]).to_string()
            };
            self.send(Msg::Close {
                kind: 'P',
                name: name.clone(),
            });
            self.portals.retain(|p| *p != name);
        }
    }

    fn describe_existing(&mut self) {
        let (kind, name) = if self.rng.chance(60) {
            let name = if !self.statements.is_empty() && self.rng.chance(80) {
                self.rng.pick(&self.statements).0.clone()
            } else {
                String::new()
            };
            ('S', name)
        } else {
            let name = if !self.portals.is_empty() && self.rng.chance(70) {
                self.rng.pick(&self.portals).clone()
            } else {
                String::new()
            };
            ('P', name)
        };
        self.send(Msg::Describe { kind, name });
    }

    /// SQL PREPARE / EXECUTE / DEALLOCATE, over either protocol.
    fn sql_prepare(&mut self) {
        let name = self.rng.pick(&["q1", "q2"]).to_string();
        let sql = match self.rng.below(6) {
            0 => {
                self.sql_prepared.retain(|(n, _)| *n != name);
                self.sql_prepared.push((name.clone(), 1));
                format!("PREPARE {name} (int) AS SELECT v FROM {{t}} WHERE id = $1")
            }
            1 => {
                self.sql_prepared.retain(|(n, _)| *n != name);
                self.sql_prepared.push((name.clone(), 2));
                format!("PREPARE {name} AS INSERT INTO {{t}} (id, v) VALUES ($1, $2)")
            }
            2 | 3 => {
                let (name, params) = if !self.sql_prepared.is_empty() && self.rng.chance(85) {
                    self.rng.pick(&self.sql_prepared).clone()
                } else {
                    (name, 0)
                };
                if params == 0 {
                    format!("EXECUTE {name}")
                } else {
                    let values: Vec<String> = (0..params).map(|_| self.fresh_id()).collect();
                    format!("EXECUTE {name}({})", values.join(", "))
                }
            }
            4 => {
                self.sql_prepared.retain(|(n, _)| *n != name);
                format!("DEALLOCATE {name}")
            }
            _ => "DEALLOCATE ALL".to_string(),
        };
        if self.rng.chance(70) {
            self.send(Msg::Query(sql));
        } else {
            self.note_transaction_control(&sql);
            self.extended_run(Sql::new(&sql, &[]), "");
        }
    }

    /// COPY FROM STDIN over the simple protocol: rows (split across CopyData messages anywhere),
    /// sometimes a bad row or a duplicate key, then CopyDone or CopyFail; the client waits for
    /// CopyInResponse first (psql) or sends it all at once (asyncpg).
    fn copy_in_simple(&mut self) {
        self.send(Msg::Query("COPY {t} (id, v) FROM STDIN".into()));
        if self.rng.chance(50) {
            self.end_write(true);
        }
        let data = self.copy_rows();
        self.copy_data(&data);
    }

    fn copy_rows(&mut self) -> String {
        let rows = 1 + self.rng.below(3);
        let mut data = String::new();
        for _ in 0..rows {
            let id = match self.rng.below(10) {
                0 => "1".to_string(),    // 23505
                1 => "oops".to_string(), // 22P02
                _ => self.fresh_id(),
            };
            let v = if self.rng.chance(20) {
                "\\N".to_string()
            } else {
                self.rng.below(50).to_string()
            };
            data.push_str(&format!("{id}\t{v}\n"));
        }
        data
    }

    fn copy_data(&mut self, data: &str) {
        // Cut the stream anywhere, even inside a row: CopyData is a byte stream.
        let mut rest = data;
        for chunk in 0.. {
            if rest.is_empty() {
                break;
            }
            let cut = if chunk == 2 || self.rng.chance(50) {
                rest.len()
            } else {
                1 + self.rng.below(rest.len())
            };
            self.send(Msg::CopyData(rest[..cut].to_string()));
            rest = &rest[cut..];
        }
        if self.rng.chance(85) {
            self.send(Msg::CopyDone);
        } else {
            self.send(Msg::CopyFail(
                "the differential checker aborts this COPY".into(),
            ));
        }
    }

    fn copy_out_sql(&mut self) -> &'static str {
        *self.rng.pick(&[
            "COPY (SELECT id, v FROM {t} ORDER BY id) TO STDOUT",
            "COPY (SELECT id, v FROM {t} ORDER BY id) TO STDOUT (FORMAT csv, HEADER)",
            "COPY (SELECT g FROM generate_series(1, 3) g) TO STDOUT",
        ])
    }

    fn copy_out_simple(&mut self) {
        let sql = self.copy_out_sql();
        self.send(Msg::Query(sql.into()));
    }

    fn copy_out_extended(&mut self) {
        let sql = self.copy_out_sql();
        self.extended_run(Sql::new(sql, &[]), "");
    }

    /// COPY FROM STDIN over the extended protocol: Parse/Bind/Execute, CopyData, CopyDone, Sync.
    fn copy_in_extended(&mut self) {
        self.send(Msg::Parse {
            name: String::new(),
            sql: "COPY {t} (id, v) FROM STDIN".into(),
            types: Vec::new(),
        });
        self.send(Msg::Bind {
            portal: String::new(),
            statement: String::new(),
            params: Vec::new(),
            binary_results: false,
        });
        self.send(Msg::Execute {
            portal: String::new(),
            max_rows: 0,
        });
        if self.rng.chance(30) {
            self.send(Msg::Flush);
            self.end_write(true);
        }
        let data = self.copy_rows();
        self.copy_data(&data);
        self.send(Msg::Sync);
    }

    /// A statement the proxy answers itself: as a simple Query, or alone in an extended batch
    /// (the README's limit: a `SET lsngate.*` must not share a Sync with SQL statements).
    fn proxy_handled(&mut self) {
        let sql = self.rng.pick(PROXY_HANDLED).to_string();
        if self.rng.chance(60) {
            self.send(Msg::Query(sql));
        } else {
            if self.unsynced {
                self.send(Msg::Sync);
            }
            self.extended_run(Sql::new(&sql, &[]), "");
            self.send(Msg::Sync);
        }
    }

    /// pgjdbc's autosave: an unsynced extended BEGIN, a simple-Query SAVEPOINT, the statement
    /// and its Sync, all in one write.
    fn autosave(&mut self) {
        if !self.in_block {
            self.in_block = true;
            self.extended_run(Sql::new("BEGIN", &[]), "");
        }
        self.send(Msg::Query("SAVEPOINT PGJDBC_AUTOSAVE".into()));
        let sql = self.any_statement();
        self.extended_run(sql, "");
        self.send(Msg::Sync);
        if self.rng.chance(50) {
            self.send(Msg::Query("RELEASE SAVEPOINT PGJDBC_AUTOSAVE".into()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_case_and_cases_stay_small() {
        for seed in 0..500 {
            let a = generate(seed, &Exclusions::default());
            let b = generate(seed, &Exclusions::default());
            assert_eq!(a.steps, b.steps);
            let total = a.messages() + 2;
            assert!(
                (5..=40).contains(&total),
                "seed {seed}: {total} messages\n{a}"
            );
        }
    }

    #[test]
    fn cases_generated_without_a_pattern_are_admitted_and_others_are_not_all() {
        let all = Exclusions::parse("query-after-unsynced,copy-in").unwrap();
        let mut refused = 0;
        for seed in 0..500 {
            assert!(all.admit(&generate(seed, &all)), "seed {seed}");
            refused += usize::from(!all.admit(&generate(seed, &Exclusions::default())));
        }
        assert!(
            refused > 50,
            "only {refused} of 500 default cases had an excluded pattern"
        );
    }
}
