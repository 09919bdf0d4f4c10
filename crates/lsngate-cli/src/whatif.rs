//! `lsngate lag --advise --serve ADDR`: the proxy's `/budget` what-if page for library users,
//! who have no proxy to observe their cluster. Beats the heartbeat of `--advise` without end,
//! keeps the samples in core's bounded `LagWindow`s (15 minutes), reads the replicas' replay
//! positions, and serves the same page and `/budget.json` document as the proxy
//! (`lsngate_proxy::whatif`), for the read rate and pool size given on the command line.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lsngate_core::budget::{LagWindow, ReplicaLag, Window, Workload};
use lsngate_core::replay::{VISIBLE_SAMPLES, VISIBLE_SPAN};
use lsngate_core::{Lsn, sync::lock};
use lsngate_proxy::whatif;
use tokio_postgres::Client;

use crate::advise::sample;

/// One heartbeat round of sampling between two refreshes of the positions.
const ROUND: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct Seen {
    started: Instant,
    primary: Option<Lsn>,
    replicas: Vec<(String, Option<Lsn>)>,
    windows: Vec<LagWindow>,
}

/// Samples and serves until interrupted (or a server error).
pub async fn serve(
    listen: SocketAddr,
    primary: Client,
    replicas: Vec<(String, Option<Client>)>,
    workload: Workload,
    configured_ms: u64,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
        anyhow::anyhow!("cannot listen on {listen} for --serve: {e}; pick a free address, e.g. --serve 127.0.0.1:7070")
    })?;
    eprintln!(
        "serving the what-if page on http://{}/budget (Ctrl-C stops)",
        listener.local_addr()?
    );
    let seen = Arc::new(Mutex::new(Seen {
        started: Instant::now(),
        primary: None,
        replicas: replicas
            .iter()
            .map(|(name, _)| (name.clone(), None))
            .collect(),
        windows: replicas
            .iter()
            .map(|_| LagWindow::new(VISIBLE_SPAN, VISIBLE_SAMPLES))
            .collect(),
    }));
    let sampling = {
        let seen = Arc::clone(&seen);
        async move {
            loop {
                let lags = sample(&primary, &replicas, ROUND).await?;
                let primary_at = position(&primary, "pg_current_wal_lsn()").await;
                let mut replayed = Vec::new();
                for (_, client) in &replicas {
                    replayed.push(match client {
                        Some(client) => position(client, "pg_last_wal_replay_lsn()").await,
                        None => None,
                    });
                }
                let mut seen = lock(&seen);
                let at = seen.started.elapsed();
                for (window, lag) in seen.windows.iter_mut().zip(&lags) {
                    lag.samples.iter().for_each(|&l| window.push(at, l));
                }
                seen.primary = primary_at;
                for ((_, position), now) in seen.replicas.iter_mut().zip(replayed) {
                    *position = now;
                }
            }
            #[allow(unreachable_code)]
            anyhow::Ok(())
        }
    };
    let serving = async {
        loop {
            let (stream, _) = listener.accept().await?;
            let body = document(&lock(&seen), &workload, configured_ms);
            tokio::spawn(whatif::answer(
                stream,
                "/budget or /budget.json",
                move |path| match path {
                    "/budget" | "/" => Some(("text/html; charset=utf-8", whatif::PAGE.to_string())),
                    "/budget.json" => Some(("application/json", body)),
                    _ => None,
                },
            ));
        }
        #[allow(unreachable_code)]
        anyhow::Ok(())
    };
    tokio::select! {
        result = sampling => result,
        result = serving => result,
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}

async fn position(client: &Client, function: &str) -> Option<Lsn> {
    let row = client
        .query_one(&format!("SELECT {function}::text"), &[])
        .await
        .ok()?;
    row.get::<_, Option<String>>(0)
        .and_then(|text| Lsn::parse(&text).ok())
}

fn document(seen: &Seen, workload: &Workload, configured_ms: u64) -> String {
    let now = seen.started.elapsed();
    let lags: Vec<ReplicaLag> = seen
        .replicas
        .iter()
        .zip(&seen.windows)
        .map(|((name, _), window)| ReplicaLag {
            name: name.clone(),
            samples: window.lags(now),
        })
        .collect();
    let facts = whatif::Facts {
        primary: seen.primary,
        replicas: seen
            .replicas
            .iter()
            .zip(&lags)
            .map(|((name, replayed), lag)| (name.clone(), *replayed, lag.samples.last().copied()))
            .collect(),
        lags: &lags,
        window: Window {
            seconds: seen
                .windows
                .iter()
                .filter_map(|w| w.reach(now))
                .max()
                .unwrap_or_default()
                .as_secs_f64(),
            source: "heartbeat",
        },
        workload: *workload,
        configured_ms,
    };
    serde_json::to_string(&whatif::document(&facts)).unwrap_or_default()
}
