//! `lsngate lag --advise`: which wait budget to choose, from replay lag measured now.
//!
//! Beats the heartbeat of `lsngate lag --heartbeat` over a window — a write on the primary, then
//! the time until each replica shows it, which is exactly what a token read right after its write
//! waits for — and hands the samples, with the read rate and pool size the user gives, to the
//! advisor's model (`lsngate_core::budget`). Only the sampling is here; every number in the table
//! comes from the model the proxy's `/status` and console use too.

use std::time::{Duration, Instant};

use clap::Args;
use lsngate_core::budget::{self, AdviceReport, ReplicaLag, Window, Workload};
use tokio_postgres::Client;

use crate::duration;
use crate::lag::{Heartbeat, host_port};
use crate::pg;

#[derive(Debug, Args)]
pub struct AdviseArgs {
    /// Recommend a wait budget: sample the replay lag with a heartbeat over --window and print
    /// what each candidate budget would do for --reads-per-second token reads on pools of
    /// --pool-size connections.
    #[arg(long, conflicts_with_all = ["watch", "heartbeat"])]
    pub advise: bool,
    /// Token reads per second the application sends (the whole cluster), e.g. 400.
    #[arg(long, requires = "advise", value_parser = positive_rate)]
    pub reads_per_second: Option<f64>,
    /// Server connections in one replica's pool (the proxy's pool_size, the library's
    /// max_connections per replica), e.g. 20.
    #[arg(long, requires = "advise", value_parser = clap::value_parser!(u64).range(1..))]
    pub pool_size: Option<u64>,
    /// How long to sample the lag for (e.g. 10s, 1m).
    #[arg(long, requires = "advise", value_parser = positive_duration, default_value = "10s")]
    pub window: Duration,
    /// The primary guard's cap on concurrent fallback reads (the proxy's
    /// max_concurrent_fallbacks; 32 by default there and in the library).
    #[arg(long, requires = "advise", value_parser = clap::value_parser!(u64).range(1..), default_value_t = 32)]
    pub guard_cap: u64,
    /// How long one read takes on the primary (a fallback holds a guard slot that long).
    #[arg(long, requires = "advise", value_parser = positive_duration, default_value = "1ms")]
    pub primary_read: Duration,
    /// Serve the what-if page on this address (e.g. 127.0.0.1:7070) at /budget, sampling
    /// without end, instead of printing once: for library users, what the proxy's admin port
    /// shows at /budget.
    #[arg(long, requires = "advise", value_name = "ADDR")]
    pub serve: Option<std::net::SocketAddr>,
    /// The budget the application uses now, marked on the page (--serve).
    #[arg(long, requires = "serve", value_parser = positive_duration, default_value = "100ms")]
    pub current_budget: Duration,
    /// Candidate budgets, comma-separated (e.g. 5ms,20ms,500ms); by default 1 ms to 5 s.
    #[arg(long, requires = "advise", value_parser = duration::parse, value_delimiter = ',')]
    pub budgets: Vec<Duration>,
}

fn positive_rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        _ => Err(format!(
            "invalid read rate {text:?}: expected a positive number of token reads per second, e.g. 400"
        )),
    }
}

fn positive_duration(text: &str) -> Result<Duration, String> {
    let parsed = duration::parse(text)?;
    if parsed.is_zero() {
        return Err(format!("invalid duration {text:?}: must be more than zero"));
    }
    Ok(parsed)
}

/// Samples, advises and prints.
pub async fn run(
    args: &AdviseArgs,
    primary_url: &str,
    replica_urls: &[String],
    json: bool,
) -> anyhow::Result<()> {
    let reads_per_second = args.reads_per_second.ok_or_else(|| {
        anyhow::anyhow!(
            "--advise needs --reads-per-second N: the token reads per second your application sends (e.g. --reads-per-second 400)"
        )
    })?;
    let pool_size = args.pool_size.ok_or_else(|| {
        anyhow::anyhow!(
            "--advise needs --pool-size N: the server connections in one replica's pool (e.g. --pool-size 20)"
        )
    })?;
    let primary = pg::connect(primary_url).await?;
    let mut replicas = Vec::new();
    for url in replica_urls {
        // A replica that cannot be reached has no samples: the model leaves it out, the report
        // lists it with 0 samples.
        let client = pg::connect(url).await.ok();
        replicas.push((host_port(url), client));
    }
    let workload = Workload {
        reads_per_second,
        pool_size: pool_size as usize,
        guard_cap: args.guard_cap as usize,
        primary_read: args.primary_read,
    };
    if let Some(listen) = args.serve {
        let current = args.current_budget.as_millis() as u64;
        return crate::whatif::serve(listen, primary, replicas, workload, current).await;
    }
    let started = Instant::now();
    let lags = sample(&primary, &replicas, args.window).await?;
    let window = Window {
        seconds: started.elapsed().as_secs_f64(),
        source: "heartbeat",
    };
    let budgets: Vec<u64> = if args.budgets.is_empty() {
        budget::CANDIDATE_BUDGETS_MS.to_vec()
    } else {
        args.budgets.iter().map(|b| b.as_millis() as u64).collect()
    };
    let advice = budget::advise(&lags, &workload, &budgets)?;
    let guard_hits: Vec<bool> = advice.candidates.iter().map(|c| c.guard_cap_hit).collect();
    let worst = advice.worst_lag;
    let report = AdviceReport::new(window, &lags, advice);
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report, &workload, &guard_hits, worst);
    }
    Ok(())
}

/// Beats the heartbeat until `window` has passed, one sample per reachable replica per beat.
pub async fn sample(
    primary: &Client,
    replicas: &[(String, Option<Client>)],
    window: Duration,
) -> anyhow::Result<Vec<ReplicaLag>> {
    /// Between two beats: keeps the heartbeat to at most 50 writes a second.
    const PAUSE: Duration = Duration::from_millis(20);
    let mut lags: Vec<ReplicaLag> = replicas
        .iter()
        .map(|(name, _)| ReplicaLag {
            name: name.clone(),
            samples: Vec::new(),
        })
        .collect();
    let deadline = Instant::now() + window;
    while Instant::now() < deadline {
        let heartbeat = Heartbeat::beat(primary).await?;
        let seen = futures_util::future::join_all(replicas.iter().map(|(_, client)| async {
            match client {
                // A beat not visible within the heartbeat's give-up time counts as that long:
                // a lower bound of a lag that a budget below it cannot cover either.
                Some(client) => Some(
                    heartbeat
                        .lag_on(client)
                        .await
                        .unwrap_or(Heartbeat::GIVE_UP.as_secs_f64() * 1e3),
                ),
                None => None,
            }
        }))
        .await;
        for (lag, ms) in lags.iter_mut().zip(seen) {
            if let Some(ms) = ms {
                lag.samples.push(Duration::from_secs_f64(ms / 1e3));
            }
        }
        tokio::time::sleep(PAUSE).await;
    }
    Ok(lags)
}

fn print_report(report: &AdviceReport, workload: &Workload, guard_hits: &[bool], worst: Duration) {
    println!(
        "replay lag over {:.1} s ({}), {} token reads/s, pools of {} per replica, guard cap {}",
        report.window.seconds,
        report.window.source,
        workload.reads_per_second,
        workload.pool_size,
        workload.guard_cap
    );
    let ms = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.1}ms"));
    let mut replicas = crate::table::new(["replica", "samples", "p50 lag", "p99 lag", "max lag"]);
    for r in &report.replicas {
        replicas.add_row([
            r.name.clone(),
            r.samples.to_string(),
            ms(r.p50_ms),
            ms(r.p99_ms),
            ms(r.max_ms),
        ]);
    }
    println!("{replicas}");
    let mut table = crate::table::new([
        "budget",
        "replica share",
        "fallbacks/s",
        "held waiting (mean)",
        "held waiting (p99)",
        &format!("guard cap in a {} ms lag event", worst.as_millis()),
    ]);
    for (c, hit) in report.candidates.iter().zip(guard_hits) {
        let mark = if c.budget_ms == report.recommended_budget_ms {
            " ←"
        } else {
            ""
        };
        table.add_row([
            format!("{} ms{mark}", c.budget_ms),
            format!("{:.1}%", c.replica_share * 100.0),
            format!("{:.1}", c.fallbacks_per_s),
            format!("{:.1}", c.held_connections_mean),
            format!("{:.1}", c.held_connections_p99),
            if *hit { "hit" } else { "ok" }.to_string(),
        ]);
    }
    println!("{table}");
    println!(
        "recommended budget: {} ms — {}",
        report.recommended_budget_ms, report.reason
    );
}
