//! `JobContext` over the real `lsngate` gate: a job's first read honours the payload's token,
//! waiting within the budget and then reading the primary; its writes raise the token that
//! follow-up jobs carry. Own cluster: replay is paused on the replica.

use std::time::Duration;

use lsngate::{Config, FallbackReason, Gate};
use lsngate_cluster::{Cluster, ClusterConfig};
use lsngate_http::{JobContext, JobPayload};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct ShipOrder {
    order_id: i64,
}

const ORDER_SQL: &str = "SELECT id FROM orders WHERE id = $1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_reads_wait_for_the_payload_token_then_fall_back_to_the_primary() {
    let cluster =
        tokio::task::spawn_blocking(|| Cluster::start(&ClusterConfig::default().replicas(1)))
            .await
            .unwrap()
            .unwrap();
    let config = Config::new(cluster.primary_url()).replicas(cluster.replica_urls());
    let gate = Gate::connect(config).await.unwrap();
    let (_, created) = gate
        .transaction(|tx| {
            Box::pin(tx.batch_execute("CREATE TABLE orders (id bigint PRIMARY KEY, state text)"))
        })
        .await
        .unwrap();
    tokio::task::spawn_blocking({
        let replica = cluster.replica(0).clone();
        move || {
            replica
                .wait_replayed(&created.lsn.to_string(), Duration::from_secs(30))
                .unwrap()
        }
    })
    .await
    .unwrap();
    cluster.replica(0).pause_replay().unwrap();

    let written = gate
        .write("INSERT INTO orders VALUES (1, 'new')", &[])
        .await
        .unwrap();
    // Through the queue as JSON, like a real job.
    let text = serde_json::to_string(&JobPayload::new(
        ShipOrder { order_id: 1 },
        Some(written.token),
    ))
    .unwrap();
    let payload: JobPayload<ShipOrder> = serde_json::from_str(&text).unwrap();

    // Replay is paused: the budget runs out and the primary serves the row.
    let mut job = JobContext::new(&gate, payload.clone()).with_budget(Duration::from_millis(300));
    let read = job.query(ORDER_SQL, &[&job.job().order_id]).await.unwrap();
    assert_eq!(
        read.rows.len(),
        1,
        "the job must find the row its request wrote"
    );
    assert_eq!(read.served.node, "primary");
    assert_eq!(read.served.fallback, Some(FallbackReason::BudgetSpent));

    // The same job without the token reads the paused replica and misses the row.
    let naive = JobContext::new(&gate, JobPayload::new(ShipOrder { order_id: 1 }, None));
    let read = naive.query(ORDER_SQL, &[&1i64]).await.unwrap();
    assert_eq!(
        (read.rows.len(), read.served.node.as_str()),
        (0, "replica0")
    );

    // The job writes; the follow-up carries the max of the payload token and that write.
    let shipped = job
        .write("UPDATE orders SET state = 'shipped' WHERE id = 1", &[])
        .await
        .unwrap();
    assert!(shipped.token.lsn > written.token.lsn);
    assert_eq!(job.token().map(|t| t.lsn), Some(shipped.token.lsn));
    let follow_up = job.follow_up("send mail");
    assert_eq!(follow_up.token.map(|t| t.lsn), Some(shipped.token.lsn));

    // Once the replica replays, the job's read is served there, after waiting for the token.
    cluster.replica(0).resume_replay().unwrap();
    let next = JobContext::new(&gate, follow_up);
    let read = next
        .query("SELECT state FROM orders WHERE id = 1", &[])
        .await
        .unwrap();
    assert_eq!(read.rows[0].get::<_, String>(0), "shipped");
    assert_eq!(read.served.node, "replica0", "{:?}", read.served);
}
