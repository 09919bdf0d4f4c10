//! The differential checker's cases as data: the client messages (`Msg`, printed readably, with
//! `{t}` for the case's own table), the write boundaries and waits between them (`Step`), the
//! end marker every case gets, the patterns that can be left out while a known bug is fixed
//! (`Exclusions`), and the PRNG the generator draws from.

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

    /// One of `words`.
    pub fn word(&mut self, words: &[&'static str]) -> &'static str {
        words[self.below(words.len())]
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
    /// The client ends (with Sync and the end marker, like every case) and a new client
    /// connects: what one client leaves behind must not reach the next.
    Reconnect,
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
                (
                    Step::Write | Step::Wait,
                    None | Some(Step::Write | Step::Wait | Step::Reconnect),
                ) => {}
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
                Step::Reconnect => {
                    n += 2;
                    writeln!(
                        f,
                        "       -- Sync, the end marker; the client leaves and a new one connects"
                    )?
                }
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
    /// A simple Query behind an unsynced Execute outside a BEGIN in the same batch: on
    /// PostgreSQL 19rc1 the Query keeps that implicit transaction open and the Sync that ends it
    /// leaves the server unable to start its next transaction (`XX000 StartTransactionCommand:
    /// unexpected state STARTED`), so the direct run is no oracle there. Set for 19 prereleases.
    pub query_after_unsynced_execute: bool,
}

/// What the extended messages since the last Sync did, as far as the exclusions care.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    /// An Execute was sent.
    pub executed: bool,
    /// An Execute ran a portal bound, in this batch, to a BEGIN or START TRANSACTION parsed in
    /// it: the batch opened an explicit block. A BEGIN only parsed, or replaced before it was
    /// bound, opens none (seed 20261215436: `Parse "" "BEGIN"`, then another `Parse ""`).
    pub begins: bool,
    /// Statements parsed in this batch, by name: whether each is a BEGIN.
    statements: Vec<(String, bool)>,
    /// Portals bound in this batch, by name: whether each runs a BEGIN.
    portals: Vec<(String, bool)>,
}

fn set(named: &mut Vec<(String, bool)>, name: &str, begin: bool) {
    named.retain(|(n, _)| n != name);
    named.push((name.to_string(), begin));
}

fn get(named: &[(String, bool)], name: &str) -> bool {
    named.iter().any(|(n, begin)| n == name && *begin)
}

impl Batch {
    pub fn note(&mut self, msg: &Msg) {
        match msg {
            Msg::Execute { portal, .. } => {
                self.executed = true;
                self.begins |= get(&self.portals, portal);
            }
            Msg::Parse { name, sql, .. } => {
                let upper = sql.trim_start().to_ascii_uppercase();
                let begin = upper.starts_with("BEGIN") || upper.starts_with("START");
                set(&mut self.statements, name, begin);
            }
            Msg::Bind {
                portal, statement, ..
            } => {
                let begin = get(&self.statements, statement);
                set(&mut self.portals, portal, begin);
            }
            // A Query that may end the block (seed 20261215436: `ROLLBACK` behind an executed
            // BEGIN, then an Execute and a Query outside any block): what runs after it is
            // outside the block unless another BEGIN runs.
            Msg::Query(q) => {
                let upper = q.to_ascii_uppercase();
                if ["COMMIT", "ROLLBACK", "END", "ABORT", "PREPARE TRANSACTION"]
                    .iter()
                    .any(|word| upper.contains(word))
                {
                    self.begins = false;
                }
            }
            _ => {}
        }
    }
}

impl Exclusions {
    pub fn parse(list: &str) -> Result<Exclusions, String> {
        let mut exclusions = Exclusions::default();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "query-after-unsynced" => exclusions.query_after_unsynced = true,
                "copy-in" => exclusions.copy_in = true,
                "query-after-unsynced-execute" => exclusions.query_after_unsynced_execute = true,
                other => {
                    return Err(format!(
                        "LSNGATE_DIFF_EXCLUDE: unknown pattern {other:?}; known: query-after-unsynced, query-after-unsynced-execute, copy-in"
                    ));
                }
            }
        }
        Ok(exclusions)
    }
}

impl Exclusions {
    /// Whether a simple Query may not follow the unsynced messages `batch` describes.
    pub fn excludes_query_after(&self, batch: &Batch) -> bool {
        self.query_after_unsynced
            || (self.query_after_unsynced_execute && batch.executed && !batch.begins)
    }

    /// Whether `case` (a candidate of the minimizer, which drops steps at will) is free of the
    /// excluded patterns and within the proxy's documented limits, as every generated case is.
    pub fn admit(&self, case: &Case) -> bool {
        let mut unsynced = false;
        let mut batch = Batch::default();
        // Whether the current Sync batch parses one of the proxy's own SET/RESET statements, and
        // whether it parses or binds any other: the README's documented limit refuses the two
        // together (0A000).
        let (mut own, mut other) = (false, false);
        for step in case.steps.iter().chain([&Step::Send(Msg::Sync)]) {
            if *step == Step::Reconnect {
                (unsynced, own, other) = (false, false, false);
                batch = Batch::default();
            }
            let Step::Send(msg) = step else { continue };
            match msg {
                Msg::Parse { sql, .. } if sql.contains("lsngate.") => own = true,
                Msg::Parse { .. } => other = true,
                Msg::Bind { statement, .. } if !statement.is_empty() => other = true,
                Msg::Sync if own && other => return false,
                Msg::Sync => (own, other) = (false, false),
                _ => {}
            }
            match msg {
                Msg::Query(_) if unsynced && self.excludes_query_after(&batch) => return false,
                Msg::Query(_) => batch.note(msg),
                Msg::CopyData(_) | Msg::CopyDone | Msg::CopyFail(_) => {}
                Msg::Sync => {
                    unsynced = false;
                    batch = Batch::default();
                }
                _ => {
                    unsynced = true;
                    batch.note(msg);
                }
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
