//! The statements lsngate adds to a server's traffic to learn positions — the replay check, the
//! primary's insert position, the commit position, `WAIT FOR LSN` — and how their answers read,
//! down to the [`Verdict`] on a read's floor. The library and the proxy send these texts through
//! their own connections (tokio-postgres, raw frames); both hand the answer row back here as text
//! columns (`None` for NULL). No I/O; how a statement travels (prepared, pipelined, a named
//! portal) is the caller's business.
//!
//! LSN text in SQL always comes from [`Lsn`]'s `Display` (a number), never from client text.

use std::time::Duration;

use crate::lsn::Lsn;
use crate::route::Role;

/// On a replica: still in recovery, and how far replay got ([`Replay::from_row`]).
pub const REPLAY_SQL: &str = "SELECT pg_is_in_recovery()::text, pg_last_wal_replay_lsn()::text";

/// The primary's insert position alone, for a connection that already knows its timeline and
/// WAL sizes (mapped back from page headers with [`crate::reachable_insert_position`]).
pub const INSERT_POSITION_SQL: &str = "SELECT pg_current_wal_insert_lsn()::text";

/// Token position and timeline on the primary, read after a commit: the insert position (at or
/// past the end of every committed record), the timeline (the first 8 hex digits of a WAL file
/// name), and the WAL page and segment sizes to map a page-start position back to the boundary a
/// replica can reach ([`commit_position`]).
pub const COMMIT_POSITION_SQL: &str = "SELECT l::text, substr(pg_walfile_name(l), 1, 8), \
     current_setting('wal_block_size'), pg_size_bytes(current_setting('wal_segment_size'))::text \
     FROM pg_current_wal_insert_lsn() AS l";

/// `WAIT FOR LSN` (PostgreSQL ≥ 19) for `floor` in `standby_replay` mode (the only one that makes
/// a write visible), at most `timeout`, answering a status row instead of raising (`NO_THROW`).
/// The timeout is clamped to 1 ms at least — `TIMEOUT 0` would mean "wait forever" — and to
/// `u32::MAX` ms at most.
pub fn wait_for_sql(floor: Lsn, timeout: Duration) -> String {
    let mut sql = String::with_capacity(96);
    write_wait_for_sql(&mut sql, floor, timeout).expect("a String takes any text");
    sql
}

/// [`wait_for_sql`] written into `out` (the proxy writes it straight into a Parse message).
pub fn write_wait_for_sql(
    out: &mut impl std::fmt::Write,
    floor: Lsn,
    timeout: Duration,
) -> std::fmt::Result {
    let millis = timeout.as_millis().clamp(1, u128::from(u32::MAX));
    write!(
        out,
        "WAIT FOR LSN '{floor}' WITH (MODE 'standby_replay', TIMEOUT '{millis}ms', NO_THROW)"
    )
}

/// The monitors' poll of a node, whatever its role, in one statement: role, position (replay
/// position on a replica, insert position on a primary) and timeline — on a replica its WAL
/// receiver's (`0` when the receiver runs but the role asking may not see its timeline, which
/// takes `pg_read_all_stats`; NULL when no receiver runs), on a primary the one it writes (hex,
/// from the WAL file name). Read with [`Poll::from_row`].
pub const POLL_SQL: &str = "SELECT pg_is_in_recovery()::text, \
     (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_insert_lsn() END)::text, \
     CASE WHEN pg_is_in_recovery() THEN (SELECT coalesce(received_tli, 0) FROM pg_stat_wal_receiver)::text \
          ELSE substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END";

/// What one [`POLL_SQL`] said about a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Poll {
    /// [`Role::Replica`] in recovery, else [`Role::Primary`].
    pub role: Role,
    /// The replay position of a replica (`None` if it never replayed anything), or the insert
    /// position of a primary (not mapped back from a page header: see
    /// [`crate::ServerFacts::reachable`]).
    pub position: Option<Lsn>,
    /// A replica's WAL receiver timeline — `Some(0)` when hidden from the monitor's role, `None`
    /// when no receiver runs (see [`crate::timeline::Receiver::from_received`]) — or the timeline a
    /// primary writes.
    pub timeline: Option<u32>,
}

impl Poll {
    /// Reads [`POLL_SQL`]'s row; `None` when it does not say whether the node is in recovery.
    pub fn from_row(row: &[Option<&str>]) -> Option<Poll> {
        let replica = Replay::from_row(row).in_recovery?;
        let timeline = text(row, 2);
        Some(Poll {
            role: if replica {
                Role::Replica
            } else {
                Role::Primary
            },
            position: lsn(row, 1),
            timeline: if replica {
                timeline.and_then(|t| t.parse().ok())
            } else {
                timeline.and_then(timeline_of_walfile)
            },
        })
    }
}

/// What a replica said to [`REPLAY_SQL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Replay {
    /// `pg_is_in_recovery()`, when answered (false: the server was promoted).
    pub in_recovery: Option<bool>,
    /// `pg_last_wal_replay_lsn()`, when answered and not NULL.
    pub replayed: Option<Lsn>,
}

impl Replay {
    /// Reads [`REPLAY_SQL`]'s row (any row whose first two columns are those).
    pub fn from_row(row: &[Option<&str>]) -> Replay {
        Replay {
            in_recovery: match text(row, 0) {
                Some("true" | "t") => Some(true),
                Some("false" | "f") => Some(false),
                _ => None,
            },
            replayed: lsn(row, 1),
        }
    }
}

/// What the server answered about a read's floor, from a `WAIT FOR LSN` status or a replay check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The floor is replayed: a read whose snapshot is taken after it is fresh.
    Passed,
    /// Not (yet) replayed — the wait timed out, the check fell short, or no answer came;
    /// `replayed` is the server's replay position when it said.
    NotYet {
        /// The server's replay position, when known.
        replayed: Option<Lsn>,
    },
    /// The server is not in recovery: it was promoted, and its answers are not a replica's.
    NotInRecovery,
}

impl Verdict {
    /// A `WAIT FOR LSN … NO_THROW` status: `success`, `not in recovery`, anything else (`timeout`,
    /// no row) not yet. On promotion `WAIT FOR` answers `success` when the floor was replayed
    /// before it, which is still a true answer for that floor.
    pub fn of_wait(status: Option<&str>) -> Verdict {
        match status {
            Some("success") => Verdict::Passed,
            Some("not in recovery") => Verdict::NotInRecovery,
            _ => Verdict::NotYet { replayed: None },
        }
    }

    /// A replay check against `floor`: promoted beats everything; replay only moves forward on a
    /// running server, so a position at or past the floor stays true for its later statements.
    pub fn of_replay(replay: Replay, floor: Lsn) -> Verdict {
        match replay {
            Replay {
                in_recovery: Some(false),
                ..
            } => Verdict::NotInRecovery,
            Replay {
                replayed: Some(replayed),
                ..
            } if replayed >= floor => Verdict::Passed,
            Replay { replayed, .. } => Verdict::NotYet { replayed },
        }
    }

    /// The verdict in an answer row: a `WAIT FOR LSN` status row when `wait`, else a
    /// [`REPLAY_SQL`] row; no row is not yet.
    pub fn from_row(row: Option<&[Option<&str>]>, wait: bool, floor: Lsn) -> Verdict {
        match row {
            None => Verdict::NotYet { replayed: None },
            Some(row) if wait => Verdict::of_wait(text(row, 0)),
            Some(row) => Verdict::of_replay(Replay::from_row(row), floor),
        }
    }
}

/// A commit position: the token's position (already mapped back from a page header) and the
/// primary's timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitPosition {
    /// Where the token points.
    pub lsn: Lsn,
    /// The primary's timeline, when the answer had it.
    pub timeline: Option<u32>,
}

/// Reads [`COMMIT_POSITION_SQL`]'s row; `None` without a position.
pub fn commit_position(row: &[Option<&str>]) -> Option<CommitPosition> {
    let insert = lsn(row, 0)?;
    let size = |i: usize| {
        text(row, i)
            .and_then(|t| t.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Some(CommitPosition {
        lsn: crate::reachable_insert_position(insert, size(2), size(3)),
        timeline: text(row, 1).and_then(timeline_of_walfile),
    })
}

/// A timeline from the first 8 hex digits of a WAL file name (`substr(pg_walfile_name(…), 1, 8)`).
pub fn timeline_of_walfile(hex: &str) -> Option<u32> {
    u32::from_str_radix(hex, 16).ok()
}

/// Column `i` as text, `None` for NULL or a missing column.
pub(crate) fn text<'a>(row: &[Option<&'a str>], i: usize) -> Option<&'a str> {
    row.get(i).copied().flatten()
}

/// Column `i` as an LSN, `None` for NULL, a missing column or malformed text.
pub(crate) fn lsn(row: &[Option<&str>], i: usize) -> Option<Lsn> {
    text(row, i).and_then(|t| Lsn::parse(t).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_never_ask_for_forever() {
        let text = wait_for_sql(Lsn::new(0x3000060), Duration::ZERO);
        assert_eq!(
            text,
            "WAIT FOR LSN '0/03000060' WITH (MODE 'standby_replay', TIMEOUT '1ms', NO_THROW)"
        );
        let long = wait_for_sql(Lsn::new(1), Duration::from_secs(u64::MAX / 2));
        assert!(
            long.contains(&format!("TIMEOUT '{}ms'", u32::MAX)),
            "{long}"
        );
        let usual = wait_for_sql(Lsn::new(1), Duration::from_micros(250_900));
        assert!(usual.contains("TIMEOUT '250ms'"), "{usual}");
    }

    #[test]
    fn verdict_rows_read_right() {
        let floor = Lsn::new(100);
        let row = |a: &'static str, b: Option<&'static str>| vec![Some(a), b];
        let read = |r: Vec<Option<&str>>, wait| Verdict::from_row(Some(&r), wait, floor);
        assert_eq!(read(row("success", None), true), Verdict::Passed);
        assert_eq!(
            read(row("timeout", None), true),
            Verdict::NotYet { replayed: None }
        );
        assert_eq!(
            read(row("not in recovery", None), true),
            Verdict::NotInRecovery
        );
        assert_eq!(read(row("true", Some("0/64")), false), Verdict::Passed);
        assert_eq!(
            read(row("true", Some("0/63")), false),
            Verdict::NotYet {
                replayed: Some(Lsn::new(99))
            }
        );
        assert_eq!(
            read(row("false", Some("0/64")), false),
            Verdict::NotInRecovery
        );
        assert_eq!(
            read(vec![Some("true"), None], false),
            Verdict::NotYet { replayed: None },
            "a server that never was a standby has no replay position"
        );
        assert_eq!(
            Verdict::from_row(None, true, floor),
            Verdict::NotYet { replayed: None }
        );
    }

    #[test]
    fn polls_read_role_position_and_the_timeline_in_its_role_s_base() {
        assert_eq!(
            Poll::from_row(&[Some("true"), Some("0/64"), Some("12")]),
            Some(Poll {
                role: Role::Replica,
                position: Some(Lsn::new(100)),
                timeline: Some(12)
            }),
            "a receiver's timeline is decimal"
        );
        assert_eq!(
            Poll::from_row(&[Some("true"), None, None]),
            Some(Poll {
                role: Role::Replica,
                position: None,
                timeline: None
            })
        );
        assert_eq!(
            Poll::from_row(&[Some("false"), Some("0/64"), Some("00000012")]),
            Some(Poll {
                role: Role::Primary,
                position: Some(Lsn::new(100)),
                timeline: Some(18)
            }),
            "a primary's comes from a WAL file name, in hex"
        );
        assert_eq!(Poll::from_row(&[None, Some("0/64")]), None);
    }

    #[test]
    fn commit_positions_map_page_starts_and_read_the_timeline() {
        let row = [
            Some("0/03020018"),
            Some("00000002"),
            Some("8192"),
            Some("16777216"),
        ];
        assert_eq!(
            commit_position(&row),
            Some(CommitPosition {
                lsn: Lsn::parse("0/03020000").unwrap(),
                timeline: Some(2)
            })
        );
        assert_eq!(commit_position(&[None]), None);
        assert_eq!(
            commit_position(&[Some("0/10"), None]),
            Some(CommitPosition {
                lsn: Lsn::new(16),
                timeline: None
            }),
            "without sizes the position is taken as is"
        );
    }
}
