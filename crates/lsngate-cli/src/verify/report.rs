//! What a verify run prints: the summary (a table, or with `--json` one JSON object), the
//! verdict line, and each violation with its session's operations around it and the faults
//! active then. Presentation only: the counts come from the checker and the history.

use std::collections::BTreeMap;

use serde::Serialize;

use super::checker::{Verdict, Violation};
use super::history::{FaultWindow, Op, OpKind, Outcome};
use crate::table;

/// Violations shown in full (the counts include them all).
const SHOWN: usize = 5;

/// The in-process proxy's primary guard over a run (its `/status` `breaker` counts).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct GuardCounts {
    /// Fallback reads refused a primary slot.
    pub refused_reads: u64,
    /// Of those, reads a replica took once it had caught up.
    pub rescued_reads: u64,
}

/// The run in numbers; also the `--json` object.
#[derive(Debug, Default, Serialize)]
pub struct Summary {
    pub mode: String,
    pub seed: u64,
    pub target: String,
    pub server_version: String,
    pub seconds: f64,
    pub workers: usize,
    pub ops: u64,
    pub ops_per_s: f64,
    pub reads: u64,
    pub writes: u64,
    /// Read-only transactions (each of their reads is counted in `reads`).
    pub transactions: u64,
    /// Reads a replica answered (`pg_is_in_recovery()` true in the answer).
    pub replica_reads: u64,
    /// Reads the in-process proxy or the library sent to the primary because no replica had the
    /// floor in time or none was up (None through `--proxy`: its counters are not ours to read).
    pub fallbacks: Option<u64>,
    /// The in-process proxy's primary guard: fallback reads it refused a slot, and of those the
    /// reads a replica took once it had caught up (None for the library or `--proxy`).
    pub guard: Option<GuardCounts>,
    pub stale: u64,
    pub nonmonotonic: u64,
    pub lost: u64,
    pub duplicated: u64,
    /// Writes reported as certainly failed that are on the primary.
    pub phantom: u64,
    pub indeterminate: u64,
    pub indeterminate_committed: u64,
    pub hangs: u64,
    /// Failed operations by SQLSTATE (`connection` without one, `hang` past the limit).
    pub errors: BTreeMap<String, u64>,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Replica reads that were owed a write: the reads that could have been stale.
    pub owed_replica_reads: u64,
    pub violations: u64,
    /// Whether the run could have caught a stale read at all (some replica read was owed one).
    pub proved: bool,
    /// The first violations in full.
    pub examples: Vec<Example>,
}

/// One violation with its surroundings.
#[derive(Debug, Serialize)]
pub struct Example {
    pub kind: &'static str,
    pub explanation: String,
    pub op: Op,
    pub session: Vec<Op>,
    pub faults: Vec<FaultWindow>,
}

/// Everything of the summary the history and the verdict say.
pub struct Facts<'a> {
    pub ops: &'a [Op],
    pub faults: &'a [FaultWindow],
    pub verdict: &'a Verdict,
}

impl Facts<'_> {
    pub fn fill(&self, summary: &mut Summary) {
        let ops = self.ops;
        let counts = &self.verdict.counts;
        summary.ops = ops.len() as u64;
        summary.ops_per_s = ops.len() as f64 / summary.seconds.max(1e-9);
        summary.reads = ops.iter().filter(|o| o.kind == OpKind::Read).count() as u64;
        summary.writes = ops.iter().filter(|o| o.kind == OpKind::Write).count() as u64;
        let transactions: std::collections::HashSet<&str> =
            ops.iter().filter_map(|o| o.txn.as_deref()).collect();
        summary.transactions = transactions.len() as u64;
        summary.replica_reads = ops
            .iter()
            .filter(|o| o.read_version().is_some() && o.server.is_some_and(|s| s.in_recovery))
            .count() as u64;
        summary.stale = counts.stale;
        summary.nonmonotonic = counts.nonmonotonic;
        summary.lost = counts.lost;
        summary.duplicated = counts.duplicated;
        summary.phantom = counts.phantom;
        summary.indeterminate = counts.indeterminate;
        summary.indeterminate_committed = counts.indeterminate_committed;
        summary.hangs = counts.hangs;
        summary.owed_replica_reads = counts.owed_replica_reads;
        summary.violations = counts.violations();
        summary.proved = counts.owed_replica_reads > 0;
        summary.errors = BTreeMap::new();
        for op in ops
            .iter()
            .filter(|o| o.outcome != Outcome::Ok || o.sqlstate.is_some())
        {
            let code = op.sqlstate.clone().unwrap_or_else(|| "none".into());
            *summary.errors.entry(code).or_default() += 1;
        }
        summary.faults = BTreeMap::new();
        for fault in self.faults {
            *summary.faults.entry(fault.kind.clone()).or_default() += 1;
        }
        summary.examples = self
            .verdict
            .violations
            .iter()
            .take(SHOWN)
            .map(|v| self.example(v))
            .collect();
    }

    fn example(&self, violation: &Violation) -> Example {
        Example {
            kind: violation.kind.name(),
            explanation: violation.explanation.clone(),
            op: self.ops[violation.op].clone(),
            session: violation
                .context
                .iter()
                .map(|&i| self.ops[i].clone())
                .collect(),
            faults: violation
                .faults
                .iter()
                .map(|&i| self.faults[i].clone())
                .collect(),
        }
    }
}

/// The summary as a table, the violations shown in full, and the verdict line.
pub fn print(summary: &Summary) {
    let mut t = table::new(["", "value"]);
    let count = |n: u64| n.to_string();
    let joined = |map: &BTreeMap<String, u64>| {
        if map.is_empty() {
            "none".to_string()
        } else {
            map.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let mut rows: Vec<(&str, String)> = vec![
        ("target", summary.target.clone()),
        ("server", summary.server_version.clone()),
        (
            "mode / seed",
            format!("{} / {}", summary.mode, summary.seed),
        ),
        (
            "operations",
            format!(
                "{} in {:.1} s ({:.0}/s, {} workers)",
                summary.ops, summary.seconds, summary.ops_per_s, summary.workers
            ),
        ),
        (
            "reads / writes",
            format!(
                "{} / {} ({} read-only transactions)",
                summary.reads, summary.writes, summary.transactions
            ),
        ),
        (
            "reads on replicas",
            format!(
                "{} ({} owed a write)",
                summary.replica_reads, summary.owed_replica_reads
            ),
        ),
        (
            "fallbacks to the primary",
            summary
                .fallbacks
                .map_or("not known (external proxy)".into(), count),
        ),
    ];
    if let Some(g) = &summary.guard {
        let guard = format!(
            "{} reads refused a slot, {} of them then served by a replica",
            g.refused_reads, g.rescued_reads
        );
        rows.push(("primary guard", guard));
    }
    rows.extend([
        ("errors by SQLSTATE", joined(&summary.errors)),
        ("faults injected", joined(&summary.faults)),
        ("stale reads (read-your-writes)", count(summary.stale)),
        ("non-monotonic reads", count(summary.nonmonotonic)),
        ("lost writes", count(summary.lost)),
        ("duplicated writes", count(summary.duplicated)),
        ("failed writes found committed", count(summary.phantom)),
        (
            "indeterminate writes",
            format!(
                "{} ({} found committed)",
                summary.indeterminate, summary.indeterminate_committed
            ),
        ),
        ("hangs", count(summary.hangs)),
    ]);
    for (name, value) in rows {
        t.add_row(vec![name.to_string(), value]);
    }
    println!("{t}");
    for example in &summary.examples {
        print_example(example);
    }
    if summary.violations > SHOWN as u64 {
        println!(
            "\n… and {} more violations (--history FILE keeps them all).",
            summary.violations - SHOWN as u64
        );
    }
    println!("\n{}", verdict_line(summary));
}

fn print_example(example: &Example) {
    let op = &example.op;
    println!(
        "\n{} at {:.1} ms, process {}: {}",
        example.kind.to_uppercase(),
        op.invoke_ms,
        op.process,
        example.explanation
    );
    for fault in &example.faults {
        println!(
            "  fault active: {} on {} ({}) {:.1}–{:.1} ms",
            fault.kind, fault.node, fault.detail, fault.start_ms, fault.end_ms
        );
    }
    if example.faults.is_empty() {
        println!("  no fault active");
    }
    for other in &example.session {
        let marker = if other == op { "->" } else { "  " };
        println!("  {marker} {}", describe(other));
    }
}

/// One operation on a line: `12.3–14.0 ms write key 3 p1-7 ok v=5`.
fn describe(op: &Op) -> String {
    let kind = match op.kind {
        OpKind::Write => "write",
        OpKind::Read => "read ",
    };
    let mut line = format!(
        "{:.1}–{:.1} ms {kind} key {}",
        op.invoke_ms, op.complete_ms, op.key
    );
    if let Some(id) = &op.op_id {
        line.push_str(&format!(" {id}"));
    }
    if let Some(txn) = &op.txn {
        line.push_str(&format!(" in {txn}"));
    }
    line.push_str(&format!(" {:?}", op.outcome).to_lowercase());
    if let Some(v) = op.version {
        line.push_str(&format!(" v={v}"));
    }
    if let Some(server) = op.server {
        let role = if server.in_recovery {
            "replica"
        } else {
            "primary"
        };
        match server.port {
            Some(port) => line.push_str(&format!(" on {role} :{port}")),
            None => line.push_str(&format!(" on {role}")),
        }
    }
    if let Some(lsn) = &op.lsn {
        line.push_str(&format!(" lsn {lsn}"));
    }
    if let Some(code) = &op.sqlstate {
        line.push_str(&format!(" [{code}]"));
    }
    line
}

/// The one-line conclusion.
pub fn verdict_line(summary: &Summary) -> String {
    if summary.violations > 0 {
        format!(
            "FAILED: {} violations in {} checked operations (seed {}).",
            summary.violations, summary.ops, summary.seed
        )
    } else if !summary.proved {
        format!(
            "PROVED NOTHING: 0 violations, but no replica served a read that was owed a write, so \
             no stale read could have been seen (mode {}; were the replicas in use and behind? \
             hold them back with --apply-delay or faults).",
            summary.mode
        )
    } else if summary.mode == "eventual" {
        format!(
            "PROVED NOTHING: mode eventual showed no violation in {} replica reads owed a write: \
             the replicas kept up, so the checker could not catch a stale read; hold them back \
             with --apply-delay.",
            summary.owed_replica_reads
        )
    } else {
        format!(
            "OK: 0 violations in {} checked operations; {} replica reads were owed a write.",
            summary.ops, summary.owed_replica_reads
        )
    }
}
