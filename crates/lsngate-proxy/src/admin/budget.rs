//! The budget advisor on the admin side, fed from what this proxy observed: the advice `/status`
//! carries under `budget` and the console's `SHOW BUDGET` prints, the `/budget.json` document the
//! what-if page (`crate::whatif`) polls, and `/history` (the dashboard's charts). Every number
//! comes from the causal state (replay book samples, the history's read rate) through core's
//! model; nothing is computed here but which facts to hand over.

use lsngate_core::budget::{self, AdviceError, AdviceReport, ReplicaLag, Window, Workload};

use crate::proxy::Proxy;
use crate::whatif;

/// What the proxy knows for the advice: lag samples, their window, and its workload.
fn observed(proxy: &Proxy) -> (Vec<ReplicaLag>, Window, Workload, u64) {
    let config = proxy.config();
    let causal = &proxy.causal;
    let (lags, window) = causal.watcher.visible_lags(&proxy.nodes);
    let workload = Workload {
        reads_per_second: causal.history.read_rate(),
        pool_size: config.pool_size,
        guard_cap: config.causal.guard.max_concurrent,
        primary_read: budget::TYPICAL_PRIMARY_READ,
    };
    let window = Window {
        seconds: window.as_secs_f64(),
        source: "wal_clock",
    };
    let configured = config.causal.wait_timeout.as_millis() as u64;
    (lags, window, workload, configured)
}

/// The advice for the standard candidates and the configured budget: the console's `SHOW
/// BUDGET`.
pub fn current(proxy: &Proxy) -> Result<AdviceReport, AdviceError> {
    let (lags, window, workload, configured) = observed(proxy);
    let advice = budget::advise(&lags, &workload, &whatif::candidate_budgets_ms(configured))?;
    Ok(AdviceReport::new(window, &lags, advice))
}

/// `/status`'s `budget`: the advice, or `{"error": why}` before there are samples.
pub fn status(proxy: &Proxy) -> serde_json::Value {
    let (lags, window, workload, configured) = observed(proxy);
    whatif::advice_json(&lags, window, &workload, configured)
}

/// What `/budget` polls.
pub fn page_data(proxy: &Proxy) -> serde_json::Value {
    let (lags, window, workload, configured_ms) = observed(proxy);
    whatif::document(&whatif::Facts {
        primary: proxy.causal.watcher.primary_position(),
        replicas: proxy.causal.watcher.lags(&proxy.nodes),
        lags: &lags,
        window,
        workload,
        configured_ms,
    })
}

/// `/history`: the chart points of the last 15 minutes.
pub fn history(proxy: &Proxy) -> serde_json::Value {
    serde_json::json!({
        "every_ms": crate::causal::history::POINT_EVERY.as_millis() as u64,
        "points": proxy.causal.history.points(),
    })
}
