//! Metric names, exported through the `metrics` facade (install any recorder, e.g. a
//! Prometheus exporter, to see them). Not a recorder itself.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `lsngate_reads_total` | counter | `outcome` | `replica_at_once`, `replica_after_wait`, `primary_fallback`, `stale`, `error` |
//! | `lsngate_fallbacks_total` | counter | `reason` | why reads left the replicas |
//! | `lsngate_guard_rescued_reads_total` | counter | | fallbacks refused a primary slot that a replica then served, seen to have caught up while they queued |
//! | `lsngate_wait_seconds` | histogram | | time a token read spent before its replica proved it fresh (or gave up) |
//! | `lsngate_replica_replayed_lsn` | gauge | `replica` | lowest known replay position (as a number) |
//! | `lsngate_replica_lag_bytes` | gauge | `replica` | bytes behind the primary |
//! | `lsngate_replica_lag_seconds` | gauge | `replica` | time behind the primary (WAL clock) |
//! | `lsngate_replica_up` | gauge | `replica` | 1 healthy standby, 0 otherwise |
//! | `lsngate_fallback_rate` | gauge | | share of recent reads that fell back |
//! | `lsngate_breaker_open` | gauge | | 1 while the fallback breaker is open |
//! | `lsngate_promotions_total` | counter | `replica` | replicas found promoted |

/// Reads by outcome.
pub const READS: &str = "lsngate_reads_total";
/// Fallbacks by reason.
pub const FALLBACKS: &str = "lsngate_fallbacks_total";
/// Refused fallbacks a replica served after all.
pub const RESCUED: &str = "lsngate_guard_rescued_reads_total";
/// Wait time histogram, seconds.
pub const WAIT_SECONDS: &str = "lsngate_wait_seconds";
/// Per-replica replay position.
pub const REPLAYED_LSN: &str = "lsngate_replica_replayed_lsn";
/// Per-replica lag in bytes.
pub const LAG_BYTES: &str = "lsngate_replica_lag_bytes";
/// Per-replica lag in seconds.
pub const LAG_SECONDS: &str = "lsngate_replica_lag_seconds";
/// Per-replica health.
pub const REPLICA_UP: &str = "lsngate_replica_up";
/// Recent fallback share.
pub const FALLBACK_RATE: &str = "lsngate_fallback_rate";
/// Breaker state.
pub const BREAKER_OPEN: &str = "lsngate_breaker_open";
/// Promotions detected.
pub const PROMOTIONS: &str = "lsngate_promotions_total";

/// Registers descriptions once (harmless to repeat).
pub(crate) fn describe() {
    metrics::describe_counter!(READS, "Reads by outcome");
    metrics::describe_counter!(FALLBACKS, "Reads that left the replicas, by reason");
    metrics::describe_counter!(
        RESCUED,
        "Fallbacks refused a primary slot that a replica served after catching up"
    );
    metrics::describe_histogram!(
        WAIT_SECONDS,
        metrics::Unit::Seconds,
        "Time token reads waited for a replica"
    );
    metrics::describe_gauge!(REPLAYED_LSN, "Known replay position per replica");
    metrics::describe_gauge!(LAG_BYTES, metrics::Unit::Bytes, "Replica lag in WAL bytes");
    metrics::describe_gauge!(LAG_SECONDS, metrics::Unit::Seconds, "Replica lag in time");
    metrics::describe_gauge!(REPLICA_UP, "1 when the replica is a healthy standby");
    metrics::describe_gauge!(
        FALLBACK_RATE,
        "Share of recent reads that fell back to the primary"
    );
    metrics::describe_gauge!(BREAKER_OPEN, "1 while the fallback circuit breaker is open");
    metrics::describe_counter!(PROMOTIONS, "Replicas detected as promoted");
}
