//! Running one strategy: W workers, each with its own connections, sharing N insert-then-read
//! operations; every operation timed from the moment its COMMIT returned.

use std::time::{Duration, Instant};

use futures_util::future::try_join_all;
use indicatif::ProgressBar;

use super::strategy::{ReadResult, Session, Strategy, read_back, write};

/// One timed operation.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// From the start of the write until it returned (with the library, its token included).
    pub write: Duration,
    /// From the write's COMMIT returning to the read's result (token capture included).
    pub read_path: Duration,
    /// From the start of the write to the read's result.
    pub end_to_end: Duration,
    pub result: ReadResult,
}

/// How to run one strategy.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub ops: usize,
    /// Per-read wait budget for the strategies that wait.
    pub budget: Duration,
    /// Operations per worker run first and not counted (connections and caches warm up).
    pub warmup_per_worker: usize,
}

/// Runs `plan.ops` operations of `strategy` over `sessions` (one per worker).
pub async fn run(
    strategy: &Strategy,
    sessions: &[Session],
    plan: Plan,
    progress: &ProgressBar,
) -> anyhow::Result<Vec<Sample>> {
    for session in sessions {
        session
            .set_synchronous_commit(strategy.synchronous_commit())
            .await?;
    }
    let workers = sessions.len();
    let per_worker = try_join_all(sessions.iter().enumerate().map(|(worker, session)| {
        let ops: Vec<usize> = (worker..plan.ops).step_by(workers).collect();
        async move {
            for warmup in 0..plan.warmup_per_worker {
                one_op(strategy, session, worker, warmup, plan.budget).await?;
            }
            let mut samples = Vec::with_capacity(ops.len());
            for op in ops {
                samples.push(one_op(strategy, session, worker, op, plan.budget).await?);
                progress.inc(1);
            }
            anyhow::Ok(samples)
        }
    }))
    .await?;
    Ok(per_worker.into_iter().flatten().collect())
}

async fn one_op(
    strategy: &Strategy,
    session: &Session,
    worker: usize,
    op: usize,
    budget: Duration,
) -> anyhow::Result<Sample> {
    // Replicas in turn; the synchronous strategies read the synchronous standby (replica 0).
    let replica = if strategy.needs_sync_standby() {
        0
    } else {
        op % session.replicas.len()
    };
    let payload = format!("w{worker}-op{op}-{:016x}", rand::random::<u64>());
    let started = Instant::now();
    let written = write(strategy, session, &payload).await?;
    let committed = Instant::now();
    let result = read_back(strategy, session, replica, written, &payload, budget).await?;
    let done = Instant::now();
    Ok(Sample {
        write: committed - started,
        read_path: done - committed,
        end_to_end: done - started,
        result,
    })
}
