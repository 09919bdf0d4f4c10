//! The demo's request log: per read, which node served it, with which token, after how long a
//! wait. Shown on `/requests`; kept in memory (the last 200), nothing else.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lsngate_core::Token;

use super::Verdict;

/// One served read.
#[derive(Debug, Clone)]
pub struct Served {
    /// `primary`, `replica0`, ...
    pub node: String,
    /// Time spent waiting for the replica to replay the token.
    pub wait: Duration,
    /// Why the primary served it, when it did.
    pub fallback: Option<String>,
}

/// A logged request.
#[derive(Debug, Clone)]
pub struct Entry {
    pub at: SystemTime,
    pub what: String,
    pub mode: &'static str,
    pub token: Option<Token>,
    pub served: Served,
    /// For item pages: fresh, stale or missing, against the last save.
    pub verdict: Option<Verdict>,
}

/// The last [`RequestLog::KEEP`] entries, newest first.
#[derive(Debug, Default)]
pub struct RequestLog {
    entries: Mutex<VecDeque<Entry>>,
}

impl RequestLog {
    const KEEP: usize = 200;

    pub fn push(
        &self,
        what: String,
        mode: &'static str,
        token: Option<Token>,
        served: &Served,
        verdict: Option<Verdict>,
    ) {
        let mut entries = self.entries.lock().unwrap();
        entries.push_front(Entry {
            at: SystemTime::now(),
            what,
            mode,
            token,
            served: served.clone(),
            verdict,
        });
        entries.truncate(Self::KEEP);
    }

    pub fn entries(&self) -> Vec<Entry> {
        self.entries.lock().unwrap().iter().cloned().collect()
    }
}

/// `HH:MM:SS.mmm` UTC, enough to tell requests apart.
pub fn clock(at: SystemTime) -> String {
    let millis = at
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
        % 86_400_000;
    let (h, rest) = (millis / 3_600_000, millis % 3_600_000);
    let (m, rest) = (rest / 60_000, rest % 60_000);
    format!("{h:02}:{m:02}:{:02}.{:03}", rest / 1000, rest % 1000)
}
