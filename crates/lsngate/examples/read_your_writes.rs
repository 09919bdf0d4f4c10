//! Runnable example: starts a throwaway cluster (primary + 2 streaming replicas) with the
//! lsngate-cluster, then does what an application does with lsngate — write, carry the token, read it
//! back from a replica — and prints how each read was served.
//!
//! ```sh
//! cargo run -p lsngate --example read_your_writes
//! # or against your own servers:
//! LSNGATE_PRIMARY=postgres://app@primary/db LSNGATE_REPLICAS=postgres://app@r1/db,postgres://app@r2/db \
//!     cargo run -p lsngate --example read_your_writes
//! ```

use std::time::Duration;

use lsngate::{Config, Fallback, Gate};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Your own servers, or a throwaway local cluster (kept alive until the end of main).
    let (_cluster, primary, replicas) = match std::env::var("LSNGATE_PRIMARY") {
        Ok(primary) => {
            let replicas = std::env::var("LSNGATE_REPLICAS").unwrap_or_default();
            let replicas = replicas
                .split(',')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            (None, primary, replicas)
        }
        Err(_) => {
            let cluster = lsngate_cluster::Cluster::start(
                &lsngate_cluster::ClusterConfig::default()
                    .replicas(2)
                    .apply_delay(Duration::from_millis(30)),
            )?;
            let (primary, replicas) = (cluster.primary_url(), cluster.replica_urls());
            (Some(cluster), primary, replicas)
        }
    };

    let gate = Gate::connect(
        Config::new(primary)
            .replicas(replicas)
            .budget(Duration::from_millis(500))
            .fallback(Fallback::Primary),
    )
    .await?;

    // 1. Write: one statement, token in the same network flight.
    gate.write(
        "CREATE TABLE IF NOT EXISTS notes (id bigint PRIMARY KEY, body text NOT NULL)",
        &[],
    )
    .await?;
    let written = gate
        .write(
            "INSERT INTO notes VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET body = $2",
            &[&1i64, &"hello"],
        )
        .await?;
    println!("wrote {} row, token {}", written.rows, written.token.lsn);

    // 2. Carry the token (cookie, header, job payload) as text, and read it back.
    let text = gate.issue(&written.token);
    let token = gate.verify(&text)?;

    // 3. Read with it: a replica that has replayed it, or the fallback.
    for attempt in 1..=3 {
        let read = gate
            .query_after(&token, "SELECT body FROM notes WHERE id = $1", &[&1i64])
            .await?;
        let body: String = read.rows[0].get(0);
        let s = &read.served;
        println!(
            "read {attempt}: {body:?} from {} (waited: {}, wait {:?}, fallback: {:?}, stale: {})",
            s.node, s.waited, s.wait_time, s.fallback, s.stale
        );
    }

    // 4. A transaction, and a session whose reads never go back in time.
    let session = gate.session();
    let count = session
        .transaction(|tx| {
            Box::pin(async move {
                tx.execute(
                    "INSERT INTO notes VALUES (2, 'second') ON CONFLICT DO NOTHING",
                    &[],
                )
                .await?;
                tx.query_one("SELECT count(*) FROM notes", &[])
                    .await
                    .map(|r| r.get::<_, i64>(0))
            })
        })
        .await?;
    let read = session.query("SELECT count(*) FROM notes", &[]).await?;
    println!(
        "session: wrote (count {count}), read count {} from {}",
        read.rows[0].get::<_, i64>(0),
        read.served.node
    );

    for replica in gate.replicas() {
        println!("{replica:?}");
    }
    Ok(())
}
