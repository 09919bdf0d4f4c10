//! The advice as it is shown: `lsngate lag --advise --json`, the proxy's `/status` under
//! `budget`, its console's `SHOW BUDGET` and the what-if page all serialize [`AdviceReport`].

use std::time::Duration;

use super::{Advice, Candidate, ReplicaLag};

/// One replica's lag distribution as the advice reports it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ReplicaSummary {
    /// The replica's name (`host:port`).
    pub name: String,
    /// Samples taken over the window.
    pub samples: usize,
    /// Median lag, ms (`None` with no samples).
    pub p50_ms: Option<f64>,
    /// 99th percentile lag, ms.
    pub p99_ms: Option<f64>,
    /// Worst lag, ms.
    pub max_ms: Option<f64>,
}

impl ReplicaLag {
    /// Its distribution in a few numbers.
    pub fn summary(&self) -> ReplicaSummary {
        let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1000.0);
        ReplicaSummary {
            name: self.name.clone(),
            samples: self.samples.len(),
            p50_ms: ms(self.quantile(0.5)),
            p99_ms: ms(self.quantile(0.99)),
            max_ms: ms(self.quantile(1.0)),
        }
    }
}

/// The window the samples cover.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Window {
    /// Its length, in seconds.
    pub seconds: f64,
    /// How a sample was taken: `heartbeat` or `wal_clock`.
    pub source: &'static str,
}

/// The advice as `lsngate lag --advise --json`, the proxy's `/status` and its console give it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AdviceReport {
    /// What was measured, over how long.
    pub window: Window,
    /// Per replica lag distribution.
    pub replicas: Vec<ReplicaSummary>,
    /// One row per candidate budget.
    pub candidates: Vec<Candidate>,
    /// The pick.
    pub recommended_budget_ms: u64,
    /// Why, in one line.
    pub reason: String,
}

impl AdviceReport {
    /// The report of `advice` computed from `replicas` over `window`.
    pub fn new(window: Window, replicas: &[ReplicaLag], advice: Advice) -> AdviceReport {
        AdviceReport {
            window,
            replicas: replicas.iter().map(ReplicaLag::summary).collect(),
            candidates: advice.candidates,
            recommended_budget_ms: advice.recommended_budget_ms,
            reason: advice.reason,
        }
    }
}
