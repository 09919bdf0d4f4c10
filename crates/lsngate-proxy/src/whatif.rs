//! The what-if page for the wait budget (`whatif.html`) and the document it polls, shared by the
//! proxy's admin port (`/budget`, fed from what the proxy observed) and `lsngate lag --advise
//! --serve` (fed from the heartbeat, for library users); plus the one-request HTTP/1.1 exchange
//! both answer with. Builds JSON from facts handed in; the numbers are core's budget model's.

use std::time::Duration;

use lsngate_core::Lsn;
use lsngate_core::budget::{self, AdviceReport, ReplicaLag, Window, Workload};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The page: self-contained (markup, style and script inline, nothing from elsewhere); it polls
/// `/budget.json` every second.
pub const PAGE: &str = include_str!("whatif.html");

/// Stops of the page's TIMEOUT slider: 1 ms to 10 s, 24 stops a decade (log scale).
pub fn slider_budgets_ms() -> Vec<u64> {
    let mut stops: Vec<u64> = (0..=96)
        .map(|i| 10f64.powf(f64::from(i) / 24.0).round() as u64)
        .collect();
    stops.dedup();
    stops
}

/// The budgets the advice tries: the standard candidates and the configured one.
pub fn candidate_budgets_ms(configured_ms: u64) -> Vec<u64> {
    let mut budgets = budget::CANDIDATE_BUDGETS_MS.to_vec();
    budgets.push(configured_ms.max(1));
    budgets
}

/// The advice for the standard candidates and `configured_ms`, as JSON: the report, or
/// `{"error": why}` before there are samples.
pub fn advice_json(
    lags: &[ReplicaLag],
    window: Window,
    workload: &Workload,
    configured_ms: u64,
) -> serde_json::Value {
    match budget::advise(lags, workload, &candidate_budgets_ms(configured_ms)) {
        Ok(advice) => {
            serde_json::to_value(AdviceReport::new(window, lags, advice)).unwrap_or_default()
        }
        Err(e) => serde_json::json!({ "error": e.to_string() }),
    }
}

/// What the page shows, as its caller knows it.
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    /// The primary's position.
    pub primary: Option<Lsn>,
    /// Each replica: address, replayed position, current lag.
    pub replicas: Vec<(String, Option<Lsn>, Option<Duration>)>,
    /// Lag samples per replica.
    pub lags: &'a [ReplicaLag],
    /// What the samples cover.
    pub window: Window,
    /// Read rate, pool size, guard cap.
    pub workload: Workload,
    /// The budget in force (the proxy's `wait_timeout`), ms.
    pub configured_ms: u64,
}

/// The `/budget.json` document.
pub fn document(facts: &Facts) -> serde_json::Value {
    let replicas: Vec<_> = facts
        .replicas
        .iter()
        .map(|(address, replayed, lag)| {
            serde_json::json!({
                "address": address,
                "replayed": replayed.map(|l| l.to_string()),
                "replayed_bytes": replayed.map(|l| l.as_u64()),
                "lag_ms": lag.map(|l| l.as_secs_f64() * 1000.0),
            })
        })
        .collect();
    // The distribution as 101 quantiles per replica: enough for the page's curve, bounded in size.
    let quantiles: serde_json::Map<_, _> = facts
        .lags
        .iter()
        .map(|lag| {
            let qs: Vec<_> = (0..=100)
                .filter_map(|q| lag.quantile(f64::from(q) / 100.0))
                .map(|d| d.as_secs_f64() * 1000.0)
                .collect();
            (lag.name.clone(), serde_json::json!(qs))
        })
        .collect();
    let slider = match budget::advise(facts.lags, &facts.workload, &slider_budgets_ms()) {
        Ok(advice) => serde_json::to_value(advice.candidates).unwrap_or_default(),
        Err(e) => serde_json::json!({ "error": e.to_string() }),
    };
    serde_json::json!({
        "primary": {
            "position": facts.primary.map(|l| l.to_string()),
            "position_bytes": facts.primary.map(|l| l.as_u64()),
        },
        "replicas": replicas,
        "wait_timeout_ms": facts.configured_ms,
        "reads_per_second": facts.workload.reads_per_second,
        "pool_size": facts.workload.pool_size,
        "guard_cap": facts.workload.guard_cap,
        "lag_quantiles_ms": quantiles,
        "advice": advice_json(facts.lags, facts.window.clone(), &facts.workload, facts.configured_ms),
        "slider": slider,
    })
}

/// Reads one GET request from `stream` and answers it with `route(path)`: `Some((content
/// type, body))`, or a 404 listing `known` paths. One request per connection; not a web server.
pub async fn answer(
    mut stream: TcpStream,
    known: &str,
    route: impl FnOnce(&str) -> Option<(&'static str, String)>,
) -> std::io::Result<()> {
    let mut request = Vec::new();
    let mut chunk = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 8192 {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&chunk[..n]);
    }
    let line = String::from_utf8_lossy(&request)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    let target = line.split_whitespace().nth(1).unwrap_or("/");
    let path = target.split('?').next().unwrap_or(target);
    let (code, content_type, body) = match route(path) {
        Some((content_type, body)) => ("200 OK", content_type, body),
        None => ("404 Not Found", "text/plain", format!("try {known}\n")),
    };
    let head = format!(
        "HTTP/1.1 {code}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
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
