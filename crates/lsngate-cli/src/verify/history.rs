//! What a verify run did and saw, one record per operation and per fault, and last what the
//! primary held at the end: the input of the checker and the `--history FILE` format (JSON
//! lines, one [`Entry`] a line, in completion order). Records only what the clients observed — which server answered comes from PostgreSQL
//! itself (`pg_is_in_recovery()`, `inet_server_port()`), never from the proxy's counters.
//! Not the checker: nothing here judges an operation.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// A line of the history file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Entry {
    Op(Op),
    Fault(FaultWindow),
    /// The last line: each write's op id found on the primary at the end, with how many times
    /// (what the lost, duplicated and phantom verdicts are read from; before 2026-12-06 it was
    /// not written, so a history could not show them again).
    Committed {
        committed: std::collections::BTreeMap<String, u32>,
    },
}

/// What an operation does to its register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// Raises the key's version by one and appends the op id to the log, in one transaction.
    Write,
    /// Reads the key's version.
    Read,
}

/// How an operation ended, as far as the client can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Acknowledged: a write committed, a read returned a row. Also a write whose call failed
    /// after the target said it committed (the library's `TokenUnavailable`): its version is
    /// unknown and its error is kept.
    Ok,
    /// Certainly had no effect: never sent (no connection could be opened), or refused with an
    /// `ERROR` (which rolls its transaction back); or a read that failed.
    Failed,
    /// A write whose statement was sent and then the connection broke, the session ended
    /// (`FATAL`) or the answer was a connection exception (class 08): it may or may not have
    /// committed.
    Indeterminate,
    /// No answer within the hang limit; the client gave the connection up.
    Hang,
}

/// The server that answered a read, in its own words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Server {
    /// `pg_is_in_recovery()`: a replica answered.
    pub in_recovery: bool,
    /// `inet_server_port()` (None over a Unix socket).
    pub port: Option<i32>,
}

/// One operation of one process (a client running one operation at a time).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Op {
    /// The client that ran it; its operations never overlap.
    pub process: usize,
    /// Which of the process's sessions ran it: 1 for its first connection, one more each time it
    /// connects again after giving a connection up (0 in histories written before it was
    /// recorded: one session). A session's own promises (its own writes, monotonic reads) hold
    /// within it; a new connection is a new session to the proxy and the library alike.
    #[serde(default)]
    pub session: u32,
    pub kind: OpKind,
    /// The register.
    pub key: i32,
    /// Scope mode: the causal scope the operation ran under (shared by a pair of processes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Writes: the unique id committed with the register change (`p3-17`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op_id: Option<String>,
    /// A read inside a read-only transaction: the transaction (`p3-t4`), shared by its reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub txn: Option<String>,
    /// Milliseconds since the run started, when the client sent it and when it had the answer.
    /// The reads of a read-only transaction all start when its `BEGIN` was sent: what they are
    /// owed is fixed then (the floor is waited for at the `BEGIN`), whenever each `SELECT` ran.
    pub invoke_ms: f64,
    pub complete_ms: f64,
    pub outcome: Outcome,
    /// An acknowledged write: the version it created; a read: the version it saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<i64>,
    /// A read: the server that answered it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<Server>,
    /// A token-mode write: the commit position the proxy reported; a token-mode read: the floor
    /// it carried (`X/Y`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lsn: Option<String>,
    /// The SQLSTATE of the error, or `connection` / `hang` when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sqlstate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Op {
    /// Whether this is an acknowledged write.
    pub fn is_acknowledged_write(&self) -> bool {
        self.kind == OpKind::Write && self.outcome == Outcome::Ok
    }

    /// A read that returned a version.
    pub fn read_version(&self) -> Option<i64> {
        match (self.kind, self.outcome) {
            (OpKind::Read, Outcome::Ok) => self.version,
            _ => None,
        }
    }
}

/// A fault the schedule injected, from when it began to when it was healed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultWindow {
    /// `pause`, `delay`, `stop`, `kill`, `net-delay`, `blackhole`.
    pub kind: String,
    /// The node it hit (`replica1`).
    pub node: String,
    /// What exactly (`recovery_min_apply_delay = 400ms`).
    pub detail: String,
    pub start_ms: f64,
    pub end_ms: f64,
}

impl FaultWindow {
    /// Whether the fault was active at some point in `[from_ms, to_ms]`.
    pub fn overlaps(&self, from_ms: f64, to_ms: f64) -> bool {
        self.start_ms <= to_ms && from_ms <= self.end_ms
    }
}

/// Writes the history as JSON lines, ending with the op ids `committed` on the primary.
pub fn write(
    path: &Path,
    ops: &[Op],
    faults: &[FaultWindow],
    committed: &std::collections::HashMap<String, u32>,
) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut entries: Vec<(f64, Entry)> = ops
        .iter()
        .map(|op| (op.complete_ms, Entry::Op(op.clone())))
        .chain(faults.iter().map(|f| (f.end_ms, Entry::Fault(f.clone()))))
        .collect();
    entries.sort_by(|a, b| a.0.total_cmp(&b.0));
    let committed = Entry::Committed {
        committed: committed.iter().map(|(k, v)| (k.clone(), *v)).collect(),
    };
    for entry in entries.into_iter().map(|(_, e)| e).chain([committed]) {
        serde_json::to_writer(&mut out, &entry)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

/// What a history written by [`write`] holds: operations, faults, and the op ids committed.
#[cfg(test)]
pub type Parsed = (
    Vec<Op>,
    Vec<FaultWindow>,
    std::collections::BTreeMap<String, u32>,
);

/// Reads a history written by [`write`].
#[cfg(test)]
pub fn parse(text: &str) -> anyhow::Result<Parsed> {
    let mut ops = Vec::new();
    let mut faults = Vec::new();
    let mut committed = std::collections::BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str(line)? {
            Entry::Op(op) => ops.push(op),
            Entry::Fault(fault) => faults.push(fault),
            Entry::Committed { committed: c } => committed = c,
        }
    }
    Ok((ops, faults, committed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_round_trips_through_json_lines() {
        let ops = vec![Op {
            process: 1,
            session: 2,
            kind: OpKind::Read,
            key: 3,
            scope: None,
            op_id: None,
            txn: Some("p1-t1".into()),
            invoke_ms: 1.0,
            complete_ms: 2.5,
            outcome: Outcome::Ok,
            version: Some(7),
            server: Some(Server {
                in_recovery: true,
                port: Some(5433),
            }),
            lsn: None,
            sqlstate: None,
            error: None,
        }];
        let faults = vec![FaultWindow {
            kind: "pause".into(),
            node: "replica1".into(),
            detail: "pg_wal_replay_pause()".into(),
            start_ms: 0.5,
            end_ms: 3.0,
        }];
        let committed =
            std::collections::HashMap::from([("p1-1".to_string(), 1), ("p2-4".into(), 2)]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.jsonl");
        write(&path, &ops, &faults, &committed).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.lines().next().unwrap().contains(r#""type":"op""#),
            "{text}"
        );
        assert!(
            text.lines()
                .last()
                .unwrap()
                .contains(r#""type":"committed""#),
            "{text}"
        );
        let expected = committed.into_iter().collect();
        assert_eq!(parse(&text).unwrap(), (ops, faults, expected));
    }
}
