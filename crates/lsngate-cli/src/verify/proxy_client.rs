//! A verify process's connections through an lsngate proxy, in the consistency mode under test
//! (`lsngate.consistency` at login). In `token` mode a process writes on one connection and
//! reads on another, carrying the commit position the proxy reported (`SHOW
//! lsngate.commit_lsn`) in a `/* lsngate_min_lsn='X/Y' */` comment; in every other mode it reads
//! and writes on one connection and the proxy keeps the floor — except in `scope` mode, where it
//! writes on one connection and reads on another, both under the scope it shares with another
//! process (`SET lsngate.scope`), so only the scope carries its writes to its reads. Read-only
//! transactions are plain
//! `BEGIN READ ONLY … COMMIT` blocks, which the proxy routes to a replica as a whole.
//! Not the workload: which floor a read carries is decided there.

use std::time::Duration;

use lsngate_core::Lsn;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, SimpleQueryMessage, Statement};

use super::client::{Effect, Failure, READ_SQL, Seen, WRITE_SQL, Written, seen};
use super::workload::Mode;
use crate::inproc_proxy;

pub struct ProxyClient {
    mode: Mode,
    main: Client,
    write: Statement,
    read: Statement,
    /// Token mode: the connection reads go to, with a floor in a comment.
    reader: Option<Client>,
}

impl ProxyClient {
    pub async fn open(
        endpoint: &tokio_postgres::Config,
        mode: Mode,
        scope: Option<&str>,
    ) -> anyhow::Result<Self> {
        // Scope mode is the proxy's session mode plus the scope.
        let consistency = match mode {
            Mode::Scope => Mode::Session.name(),
            _ => mode.name(),
        };
        let main = inproc_proxy::connect(endpoint, consistency).await?;
        let reader = match mode {
            Mode::Token => Some(inproc_proxy::connect(endpoint, "token").await?),
            Mode::Scope => Some(inproc_proxy::connect(endpoint, consistency).await?),
            _ => None,
        };
        if let Some(scope) = scope {
            // A name the workload makes: letters, digits and ':' only.
            let set = format!("SET lsngate.scope = '{scope}'");
            main.batch_execute(&set).await?;
            if let Some(reader) = &reader {
                reader.batch_execute(&set).await?;
            }
        }
        let write = main
            .prepare_typed(WRITE_SQL, &[Type::TEXT, Type::INT4, Type::INT4])
            .await?;
        let read = main.prepare_typed(READ_SQL, &[Type::INT4]).await?;
        Ok(ProxyClient {
            mode,
            main,
            write,
            read,
            reader,
        })
    }

    pub fn is_closed(&self) -> bool {
        self.main.is_closed() || self.reader.as_ref().is_some_and(Client::is_closed)
    }

    pub async fn write(&mut self, op_id: &str, key: i32, process: i32) -> Result<Written, Failure> {
        let row = self
            .main
            .query_one(&self.write, &[&op_id, &key, &process])
            .await?;
        let commit = match self.mode {
            Mode::Token => commit_lsn_once_known(&self.main)
                .await
                .map_err(committed_without_position)?,
            _ => None,
        };
        Ok(Written {
            version: row.get(0),
            commit,
        })
    }

    pub async fn read(&mut self, key: i32, floor: Option<Lsn>) -> Result<Seen, Failure> {
        let row = match &self.reader {
            Some(reader) => {
                reader
                    .query_typed_opt(&with_floor(READ_SQL, floor), &[(&key, Type::INT4)])
                    .await?
            }
            None => self.main.query_opt(&self.read, &[&key]).await?,
        };
        Ok(seen(row.as_ref()))
    }

    /// `BEGIN READ ONLY` on the connection reads go to; in token mode the floor rides on it
    /// (the proxy waits for a transaction's floor before its first statement).
    pub async fn begin_read_only(&mut self, floor: Option<Lsn>) -> Result<(), Failure> {
        let begin = with_floor("BEGIN READ ONLY", floor);
        self.reads().batch_execute(&begin).await?;
        Ok(())
    }

    pub async fn read_in_transaction(&mut self, key: i32) -> Result<Seen, Failure> {
        let row = match &self.reader {
            Some(reader) => {
                reader
                    .query_typed_opt(READ_SQL, &[(&key, Type::INT4)])
                    .await?
            }
            None => self.main.query_opt(&self.read, &[&key]).await?,
        };
        Ok(seen(row.as_ref()))
    }

    pub async fn commit(&mut self) -> Result<(), Failure> {
        self.reads().batch_execute("COMMIT").await?;
        Ok(())
    }

    fn reads(&self) -> &Client {
        self.reader.as_ref().unwrap_or(&self.main)
    }
}

/// `sql` with a `lsngate_min_lsn` comment in front when there is a floor.
fn with_floor(sql: &str, floor: Option<Lsn>) -> String {
    match floor {
        Some(floor) => format!("/* lsngate_min_lsn='{floor}' */ {sql}"),
        None => sql.to_string(),
    }
}

/// How long a write waits for the proxy to learn a commit position it lost with the primary
/// connection (`SHOW lsngate.commit_lsn` refused with 55000 until the primary answers), asking
/// again every [`POSITION_RETRY`].
const POSITION_PATIENCE: Duration = Duration::from_secs(2);
const POSITION_RETRY: Duration = Duration::from_millis(100);

/// The position of the commit just acknowledged. When the proxy lost it with the primary
/// connection it says so (55000) and asks to be asked again once the primary answers: an
/// application in token mode asks again, for [`POSITION_PATIENCE`] at most.
async fn commit_lsn_once_known(client: &Client) -> Result<Option<Lsn>, tokio_postgres::Error> {
    let deadline = tokio::time::Instant::now() + POSITION_PATIENCE;
    loop {
        match commit_lsn(client).await {
            Err(e)
                if e.code() == Some(&SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE)
                    && tokio::time::Instant::now() + POSITION_RETRY < deadline =>
            {
                tokio::time::sleep(POSITION_RETRY).await;
            }
            answered => return answered,
        }
    }
}

/// A write whose statement was acknowledged (an autocommit statement: it committed) and whose
/// commit position could not be had: committed, version known to the client but not its
/// position — never "failed", whatever the position query's error says.
fn committed_without_position(e: tokio_postgres::Error) -> Failure {
    let mut failure = Failure::from(e);
    failure.effect = Effect::Committed;
    failure
}

/// `SHOW lsngate.commit_lsn`: the position of this connection's last commit, from the proxy.
async fn commit_lsn(client: &Client) -> Result<Option<Lsn>, tokio_postgres::Error> {
    let messages = client.simple_query("SHOW lsngate.commit_lsn").await?;
    Ok(messages.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => row.get(0).and_then(|text| Lsn::parse(text).ok()),
        _ => None,
    }))
}

#[cfg(test)]
mod tests {
    use lsngate_cluster::{Cluster, ClusterConfig, Fault, Forwarder};

    use super::*;
    use crate::inproc_proxy::{InProcessProxy, ProxySetup};
    use crate::verify::workload::{LOG_TABLE, schema_sql};

    /// Found by `verify --mode token` on 15.18 (seed 20261213101, a failover under way): the
    /// write was acknowledged, the proxy lost its commit position with the primary connection
    /// and refused `SHOW lsngate.commit_lsn` with 55000 ("the client's last commit went
    /// through"), and the client recorded the write as failed — so the checker called the
    /// committed row a phantom. A write acknowledged before its position was lost is committed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_whose_commit_position_the_proxy_lost_is_committed_not_failed() {
        let cluster = Cluster::start(&ClusterConfig {
            replicas: 0,
            ..ClusterConfig::default()
        })
        .unwrap();
        cluster.primary().sql(&schema_sql(1)).unwrap();
        let forwarder = Forwarder::start(cluster.primary().port()).unwrap();
        forwarder.spare("lsngate-proxy-monitor");
        let primary = format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            forwarder.port()
        );
        let setup = ProxySetup::new(
            &primary,
            &[],
            1,
            Duration::from_millis(200),
            crate::inproc_proxy::Guard::Open,
        )
        .unwrap();
        let proxy = InProcessProxy::start(&setup).await.unwrap();
        let mut client = ProxyClient::open(proxy.client_config(), Mode::Token, None)
            .await
            .unwrap();
        let first = client.write("p0-1", 0, 0).await.unwrap();
        assert!(first.commit.is_some(), "a position for a healthy commit");

        forwarder.set(Fault::CutAfterReady);
        let lost = client.write("p0-2", 0, 0).await;
        let failure = lost.err().expect(
            "the primary stays unreachable after the cut, so the position cannot be learned",
        );
        assert_eq!(failure.sqlstate, "55000", "{failure:?}");
        assert_eq!(
            failure.effect,
            Effect::Committed,
            "an acknowledged write whose position was lost: {failure:?}"
        );
        forwarder.set(Fault::None);
        let logged = cluster
            .primary()
            .sql(&format!(
                "SELECT count(*) FROM {LOG_TABLE} WHERE op_id = 'p0-2'"
            ))
            .unwrap();
        assert_eq!(logged.trim(), "1", "the write committed");
        drop(client);
        proxy.shutdown().await.unwrap();
    }
}
