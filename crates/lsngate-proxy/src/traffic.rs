//! What clients asked of each database, for SHOW STATS: queries and transactions (with their
//! durations) and bytes in each direction, counted as PgBouncer counts them — a query is a
//! client round trip that ends in ReadyForQuery (a simple Query, or an extended-protocol batch
//! up to its Sync), a transaction ends when ReadyForQuery says idle again, bytes are what the
//! client sent and was sent. The session's client socket (`ClientIo`) counts; here is only the
//! store: one set of relaxed atomics per database, found once per session, so counting costs
//! a few atomic adds per query and no lock. A leaf.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One database's counters.
#[derive(Debug, Default)]
pub struct Traffic {
    queries: AtomicU64,
    query_us: AtomicU64,
    transactions: AtomicU64,
    transaction_us: AtomicU64,
    received: AtomicU64,
    sent: AtomicU64,
}

/// A reading of [`Traffic`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrafficTotals {
    /// Queries answered (ReadyForQuery sent).
    pub queries: u64,
    /// Microseconds from a query's first message to its ReadyForQuery, summed.
    pub query_us: u64,
    /// Transactions ended (ReadyForQuery idle after a query).
    pub transactions: u64,
    /// Microseconds from a transaction's first message to its end, summed.
    pub transaction_us: u64,
    /// Bytes received from clients.
    pub received: u64,
    /// Bytes sent to clients.
    pub sent: u64,
}

impl Traffic {
    /// Bytes read from a client.
    pub fn received(&self, bytes: usize) {
        self.received.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Bytes written to a client.
    pub fn sent(&self, bytes: usize) {
        self.sent.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// A query answered after `query_us`; with `transaction_us` it also ended a transaction.
    pub fn answered(&self, query_us: u64, transaction_us: Option<u64>) {
        self.queries.fetch_add(1, Ordering::Relaxed);
        self.query_us.fetch_add(query_us, Ordering::Relaxed);
        if let Some(us) = transaction_us {
            self.transactions.fetch_add(1, Ordering::Relaxed);
            self.transaction_us.fetch_add(us, Ordering::Relaxed);
        }
    }

    /// The counters now.
    pub fn totals(&self) -> TrafficTotals {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        TrafficTotals {
            queries: read(&self.queries),
            query_us: read(&self.query_us),
            transactions: read(&self.transactions),
            transaction_us: read(&self.transaction_us),
            received: read(&self.received),
            sent: read(&self.sent),
        }
    }
}

/// A session's clock for what it counts: when its current query and transaction began.
#[derive(Debug)]
pub struct QueryClock {
    traffic: Arc<Traffic>,
    query_began: Option<Instant>,
    transaction_began: Option<Instant>,
}

impl QueryClock {
    /// A clock counting into `traffic`.
    pub fn new(traffic: Arc<Traffic>) -> QueryClock {
        QueryClock {
            traffic,
            query_began: None,
            transaction_began: None,
        }
    }

    /// The counters it adds to.
    pub fn traffic(&self) -> &Traffic {
        &self.traffic
    }

    /// A message came from the client: a query (and a transaction) begins unless one runs.
    pub fn message(&mut self) {
        if self.query_began.is_none() {
            let now = Instant::now();
            self.query_began = Some(now);
            self.transaction_began.get_or_insert(now);
        }
    }

    /// ReadyForQuery went to the client; `idle` when no transaction is open any more. One the
    /// client asked nothing for (the one after login) counts nothing.
    pub fn ready(&mut self, idle: bool) {
        let Some(began) = self.query_began.take() else {
            return;
        };
        let now = Instant::now();
        let micros = |since: Instant| now.duration_since(since).as_micros() as u64;
        let transaction = if idle {
            self.transaction_began.take().map(micros)
        } else {
            None
        };
        self.traffic.answered(micros(began), transaction);
    }
}

/// Every database's counters (made at a database's first login, kept while the proxy runs).
#[derive(Debug)]
pub struct TrafficByDatabase {
    databases: Mutex<HashMap<String, Arc<Traffic>>>,
    /// When counting began, for the per-second averages.
    pub since: Instant,
}

impl Default for TrafficByDatabase {
    fn default() -> Self {
        TrafficByDatabase {
            databases: Mutex::default(),
            since: Instant::now(),
        }
    }
}

impl TrafficByDatabase {
    /// The counters of `database`.
    pub fn of(&self, database: &str) -> Arc<Traffic> {
        let mut databases = self.databases.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(databases.entry(database.to_string()).or_default())
    }

    /// Every database's counters now.
    pub fn totals(&self) -> Vec<(String, TrafficTotals)> {
        let databases = self.databases.lock().unwrap_or_else(|p| p.into_inner());
        databases
            .iter()
            .map(|(name, traffic)| (name.clone(), traffic.totals()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_and_transactions_are_counted_at_ready_for_query() {
        let traffic = Arc::new(Traffic::default());
        let mut clock = QueryClock::new(Arc::clone(&traffic));
        clock.ready(true);
        assert_eq!(
            traffic.totals(),
            TrafficTotals::default(),
            "login's ReadyForQuery"
        );
        // An autocommit statement: one query, one transaction.
        clock.message();
        clock.ready(true);
        // BEGIN; SELECT; COMMIT as three queries: one transaction.
        for idle in [false, false, true] {
            clock.message();
            clock.message(); // an extended-protocol batch: several messages, one query
            clock.ready(idle);
        }
        clock.traffic().received(10);
        clock.traffic().sent(25);
        let totals = traffic.totals();
        assert_eq!(
            (
                totals.queries,
                totals.transactions,
                totals.received,
                totals.sent
            ),
            (4, 2, 10, 25)
        );
    }

    #[test]
    fn each_database_has_its_counters() {
        let all = TrafficByDatabase::default();
        all.of("a").sent(1);
        all.of("a").sent(2);
        all.of("b").received(5);
        let mut totals = all.totals();
        totals.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(totals[0].1.sent, 3);
        assert_eq!(totals[1].1.received, 5);
    }
}
