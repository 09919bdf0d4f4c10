//! The budget advisor on the admin side: the advice `/status` carries under `budget` and the
//! console's `SHOW BUDGET` prints, the `/budget` what-if page and the `/budget.json` it polls,
//! and `/history` (the dashboard's charts). Every number comes from the causal state's history
//! (`causal::history`) through core's model (`lsngate_core::budget`); nothing is computed here
//! but which budgets to ask about.

use lsngate_core::budget::{self, AdviceError, AdviceReport};

use crate::proxy::Proxy;

/// The what-if page: self-contained (markup, style and script inline, nothing from elsewhere);
/// it polls `/budget.json` every second. See `budget.html`.
pub const PAGE: &str = include_str!("budget.html");

/// Stops of the page's TIMEOUT slider: 1 ms to 10 s, 24 stops a decade (log scale).
fn slider_budgets_ms() -> Vec<u64> {
    let mut stops: Vec<u64> = (0..=96)
        .map(|i| 10f64.powf(f64::from(i) / 24.0).round() as u64)
        .collect();
    stops.dedup();
    stops
}

/// The budgets the advice tries: the standard candidates and the configured `wait_timeout`.
fn candidate_budgets_ms(proxy: &Proxy) -> Vec<u64> {
    let configured = proxy.config().causal.wait_timeout.as_millis() as u64;
    let mut budgets = budget::CANDIDATE_BUDGETS_MS.to_vec();
    budgets.push(configured.max(1));
    budgets
}

/// The advice for `budgets_ms` from what this proxy observed, for its configured pool size.
fn advice(proxy: &Proxy, budgets_ms: &[u64]) -> Result<AdviceReport, AdviceError> {
    let config = proxy.config();
    proxy
        .causal
        .advice(&proxy.nodes, &config.causal, config.pool_size, budgets_ms)
}

/// The advice for the standard candidates and the configured budget: `/status`'s `budget` and
/// the console's `SHOW BUDGET`.
pub fn current(proxy: &Proxy) -> Result<AdviceReport, AdviceError> {
    advice(proxy, &candidate_budgets_ms(proxy))
}

/// `/status`'s `budget`: the advice, or `{"error": why}` before there are samples.
pub fn status(proxy: &Proxy) -> serde_json::Value {
    match current(proxy) {
        Ok(report) => serde_json::to_value(report).unwrap_or_default(),
        Err(e) => serde_json::json!({ "error": e.to_string() }),
    }
}

/// What `/budget` polls: live replay positions on the LSN axis, the lag distribution, the read
/// rate and pool, the advice, and one row per slider stop.
pub fn page_data(proxy: &Proxy) -> serde_json::Value {
    let config = proxy.config();
    let causal = &proxy.causal;
    let replicas: Vec<_> = causal
        .watcher
        .lags(&proxy.nodes)
        .into_iter()
        .map(|(address, replayed, lag)| {
            serde_json::json!({
                "address": address,
                "replayed": replayed.map(|l| l.to_string()),
                "replayed_bytes": replayed.map(|l| l.as_u64()),
                "lag_ms": lag.map(|l| l.as_secs_f64() * 1000.0),
            })
        })
        .collect();
    let (lags, _) = causal.watcher.visible_lags(&proxy.nodes);
    // The distribution as 101 quantiles per replica: enough for the page's curve, bounded in size.
    let distribution: serde_json::Map<_, _> = lags
        .iter()
        .map(|lag| {
            let quantiles: Vec<_> = (0..=100)
                .filter_map(|q| lag.quantile(f64::from(q) / 100.0))
                .map(|d| d.as_secs_f64() * 1000.0)
                .collect();
            (lag.name.clone(), serde_json::json!(quantiles))
        })
        .collect();
    let slider = advice(proxy, &slider_budgets_ms());
    let primary = causal.watcher.primary_position();
    serde_json::json!({
        "primary": {
            "position": primary.map(|l| l.to_string()),
            "position_bytes": primary.map(|l| l.as_u64()),
        },
        "replicas": replicas,
        "wait_timeout_ms": config.causal.wait_timeout.as_millis() as u64,
        "reads_per_second": causal.history.read_rate(),
        "pool_size": config.pool_size,
        "guard_cap": config.causal.guard.max_concurrent,
        "lag_quantiles_ms": distribution,
        "advice": status(proxy),
        "slider": match slider {
            Ok(report) => serde_json::to_value(report.candidates).unwrap_or_default(),
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        },
    })
}

/// `/history`: the chart points of the last 15 minutes.
pub fn history(proxy: &Proxy) -> serde_json::Value {
    serde_json::json!({
        "every_ms": crate::causal::history::POINT_EVERY.as_millis() as u64,
        "points": proxy.causal.history.points(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn slider_stops_rise_from_1ms_to_10s() {
        let stops = super::slider_budgets_ms();
        assert_eq!((stops[0], *stops.last().unwrap()), (1, 10_000));
        assert!(stops.windows(2).all(|w| w[0] < w[1]));
        assert!(stops.contains(&100) && stops.contains(&1000));
    }
}
