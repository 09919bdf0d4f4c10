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

use super::case::{Batch, Case, Exclusions, Msg, Rng, Step};
use super::statements::{
    self, PORTAL_NAMES, PROXY_HANDLED, STATEMENT_NAMES, Sql, TRANSACTION_CONTROL,
};

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
        batch: Batch::default(),
        in_block: false,
        read_only_block: false,
        read_only_segment: false,
        block_ended_in_segment: false,
        texts: Vec::new(),
        portal_texts: Vec::new(),
        unnamed_is_proxy: false,
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
    /// What those messages did (for `Exclusions::query_after_unsynced_execute`).
    batch: Batch,
    /// A BEGIN was sent and no COMMIT/ROLLBACK since (a guess: errors are not modelled).
    in_block: bool,
    /// That block began `READ ONLY` (the proxy runs it on a replica).
    read_only_block: bool,
    /// A message was sent inside such a block since the last Sync.
    read_only_segment: bool,
    /// An Execute of a statement that ends a block was sent in that segment: the README's
    /// limit (0A000) is a later Execute before the Sync, so the generator syncs first.
    block_ended_in_segment: bool,
    /// The text of each statement name parsed (the unnamed one under ""), and of each portal
    /// bound, for `block_ended_in_segment`.
    texts: Vec<(String, String)>,
    portal_texts: Vec<(String, String)>,
    /// The unnamed statement (and maybe portal) may be a statement the proxy answers itself,
    /// parsed by `proxy_handled`, until a simple Query drops them: describing it in a pipeline
    /// with SQL is the README's limit (0A000), so `describe_existing` does not.
    unnamed_is_proxy: bool,
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
        self.read_only_segment |= self.read_only_block;
        self.note_block_end(&msg);
        match &msg {
            Msg::Query(q) => {
                if self.unsynced && self.exclusions.excludes_query_after(&self.batch) {
                    self.send(Msg::Sync);
                }
                self.unnamed_is_proxy = false;
                // A simple Query drops the unnamed statement and portal; so does PostgreSQL.
                self.note_transaction_control(q);
                self.batch.note(&msg);
            }
            Msg::Sync => {
                self.unsynced = false;
                self.batch = Batch::default();
                if !self.in_block {
                    self.portals.clear();
                }
            }
            Msg::CopyData(_) | Msg::CopyDone | Msg::CopyFail(_) => {}
            Msg::Parse { name, .. } if !name.is_empty() => {
                self.unsynced = true;
                self.batch.note(&msg);
            }
            _ => {
                self.unsynced = true;
                self.batch.note(&msg);
            }
        }
        self.steps.push(Step::Send(msg));
    }

    /// Keeps `block_ended_in_segment` (see there): a Sync goes out in front of an Execute that
    /// follows one ending a read-only block.
    fn note_block_end(&mut self, msg: &Msg) {
        fn text<'a>(texts: &'a [(String, String)], name: &str) -> Option<&'a str> {
            texts
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t.as_str())
        }
        match msg {
            Msg::Parse { name, sql, .. } => {
                self.texts.retain(|(n, _)| n != name);
                self.texts.push((name.clone(), sql.clone()));
            }
            Msg::Bind {
                portal, statement, ..
            } => {
                let sql = text(&self.texts, statement).unwrap_or_default().to_string();
                self.portal_texts.retain(|(p, _)| p != portal);
                self.portal_texts.push((portal.clone(), sql));
            }
            Msg::Execute { portal, .. } => {
                if self.block_ended_in_segment {
                    self.send(Msg::Sync);
                }
                let ends = text(&self.portal_texts, portal).is_some_and(|sql| {
                    let sql = sql.trim().to_ascii_uppercase();
                    (sql.starts_with("COMMIT") || sql.starts_with("END") || sql == "ROLLBACK")
                        && !sql.contains("CHAIN")
                });
                self.block_ended_in_segment = self.read_only_segment && ends;
            }
            Msg::Query(_) => self.texts.retain(|(n, _)| !n.is_empty()),
            Msg::Sync => {
                (self.read_only_segment, self.block_ended_in_segment) = (false, false);
            }
            _ => {}
        }
    }

    fn note_transaction_control(&mut self, sql: &str) {
        for statement in sql.split(';') {
            let s = statement.trim().to_ascii_uppercase();
            if s.contains("AND CHAIN") {
                // A block chained to the one it ends is that block's kind; outside a block it is
                // an error and opens none (seed 20261481445: taken for a block's start, it hid
                // the `BEGIN READ ONLY` after it, and a Query ending that block and then needing
                // the primary, the README's refusal, went out).
            } else if s.starts_with("BEGIN") || s.starts_with("START") {
                self.read_only_block |= !self.in_block && s.contains("READ ONLY");
                self.in_block = true;
            } else if s.starts_with("COMMIT") || s.starts_with("END") || s == "ROLLBACK" {
                self.in_block = false;
                self.read_only_block = false;
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
            95 => self.reconnect(),
            _ => {
                // Several Executes of one statement before one Sync (a pipeline).
                let sql = statements::read(&mut self.rng);
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
            0..=3 => statements::read(&mut self.rng),
            4..=7 => {
                let fresh = self.fresh_id();
                statements::write(&mut self.rng, fresh)
            }
            8 => statements::setting(&mut self.rng),
            _ => Sql::new(self.rng.word(TRANSACTION_CONTROL), &[]),
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
        let mut parts = parts;
        if self.read_only_block {
            // The README's limit: in a block the proxy runs on a replica, a Query that ends the
            // block and then needs the primary is refused (0A000). The Query ends at the end.
            let ends = |p: &String| {
                let p = p.trim().to_ascii_uppercase();
                (p.starts_with("COMMIT") || p.starts_with("END") || p == "ROLLBACK")
                    && !p.contains("CHAIN")
            };
            if let Some(end) = parts.iter().position(ends) {
                parts.truncate(end + 1);
            }
        }
        // The README's limit (by design): after a `RESET` of a startup setting, the statements of
        // the same Query see the server login's value (seeds 999854, 20261209441). The Query
        // ends there.
        if let Some(reset) = parts
            .iter()
            .position(|p| p.trim().eq_ignore_ascii_case("RESET application_name"))
        {
            parts.truncate(reset + 1);
        }
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
        if self.unnamed_is_proxy {
            // Only named ones then (see `unnamed_is_proxy`).
            if let Some((name, _)) = self.statements.first().cloned() {
                self.send(Msg::Describe { kind: 'S', name });
            }
            return;
        }
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
        self.rng.word(&[
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
            self.unnamed_is_proxy = true;
        }
    }

    /// A new client. The statement names of the old one stay in the model, so the new client
    /// binds some of them: PostgreSQL says 26000, and so must the proxy, whichever server
    /// connection it lends.
    fn reconnect(&mut self) {
        self.steps.push(Step::Reconnect);
        self.portals.clear();
        self.sql_prepared.clear();
        (self.unsynced, self.in_block, self.read_only_block) = (false, false, false);
        (self.read_only_segment, self.block_ended_in_segment) = (false, false);
        self.batch = Batch::default();
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
