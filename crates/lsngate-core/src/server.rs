//! Which server a connection really reached, and what stays fixed for the life of that
//! connection: learned once per connection, right after login, by [`IDENTITY_SQL`]. The library
//! and the proxy key everything they know about replay by [`ServerId`] — never by the URL or
//! address they dialled — so "this address has replayed X" is only ever applied to the server
//! that said so, even behind a load balancer or DNS round robin. No I/O: the caller runs the
//! statement and hands the row to [`ServerFacts::from_row`].

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use crate::lsn::Lsn;
use crate::probe::{text, timeline_of_walfile};

/// The lowest `server_version_num` with `WAIT FOR LSN` (PostgreSQL 19).
pub const WAIT_FOR_MIN_VERSION: u32 = 190_000;

/// Identity, version and WAL layout of the server behind a connection (one row):
///
/// 0. `system_identifier/postmaster start/address:port` ([`ServerId`]): replicas of one primary
///    share the system identifier, so the address tells them apart and the start time a
///    restarted server (whose replay position may have gone back). The start time is the epoch
///    in seconds: its text form follows the session's `TimeZone` and `DateStyle`, which would
///    give one server as many identities as there are session settings.
/// 1. `server_version_num` ([`WAIT_FOR_MIN_VERSION`] and up have `WAIT FOR LSN`);
/// 2. and 3. `wal_block_size` and `wal_segment_size` in bytes (set at initdb), to map a
///    page-start insert position back to what a replica can reach;
/// 4. on a primary, its timeline (a running primary never changes timeline); NULL on a standby.
pub const IDENTITY_SQL: &str = "SELECT system_identifier::text || '/' || extract(epoch FROM pg_postmaster_start_time())::text || '/' || \
     coalesce(host(inet_server_addr()), 'local') || ':' || coalesce(inet_server_port()::text, ''), \
     current_setting('server_version_num'), current_setting('wal_block_size'), \
     pg_size_bytes(current_setting('wal_segment_size'))::text, \
     CASE WHEN pg_is_in_recovery() THEN NULL ELSE substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END \
     FROM pg_control_system()";

/// A server's identity, `system_identifier/postmaster start epoch/address:port`; empty when it
/// could not be learned (nothing known about replay is then applied to it). Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ServerId(Arc<str>);

impl ServerId {
    /// Whether the identity is unknown (the identity query gave nothing).
    pub fn is_unknown(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<&str> for ServerId {
    fn from(text: &str) -> Self {
        ServerId(text.into())
    }
}

impl Deref for ServerId {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for ServerId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ServerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What [`IDENTITY_SQL`] tells about the server behind a connection.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServerFacts {
    /// Who the server is.
    pub server: ServerId,
    /// `server_version_num`, e.g. 190000 (0 when unknown).
    pub version_num: u32,
    /// `wal_block_size` in bytes (0 when unknown).
    pub wal_block: u64,
    /// `wal_segment_size` in bytes (0 when unknown).
    pub wal_segment: u64,
    /// The timeline a primary writes (`None` on a standby).
    pub timeline: Option<u32>,
}

impl ServerFacts {
    /// Reads [`IDENTITY_SQL`]'s row; missing or malformed columns read as unknown.
    pub fn from_row(row: &[Option<&str>]) -> ServerFacts {
        let number = |i: usize| {
            text(row, i)
                .and_then(|t| t.parse::<u64>().ok())
                .unwrap_or(0)
        };
        ServerFacts {
            server: ServerId::from(text(row, 0).unwrap_or_default()),
            version_num: text(row, 1).and_then(|t| t.parse().ok()).unwrap_or(0),
            wal_block: number(2),
            wal_segment: number(3),
            timeline: text(row, 4).and_then(timeline_of_walfile),
        }
    }

    /// Whether `WAIT FOR LSN` exists on this server.
    pub fn has_wait_for(&self) -> bool {
        self.version_num >= WAIT_FOR_MIN_VERSION
    }

    /// The smallest position standing for the same writes as insert position `insert` on this
    /// server (see [`crate::reachable_insert_position`]).
    pub fn reachable(&self, insert: Lsn) -> Lsn {
        crate::reachable_insert_position(insert, self.wal_block, self.wal_segment)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_read_from_the_identity_row() {
        let primary = ServerFacts::from_row(&[
            Some("7345/1764470000.123456/127.0.0.1:5432"),
            Some("190000"),
            Some("8192"),
            Some("16777216"),
            Some("0000000A"),
        ]);
        assert_eq!(&*primary.server, "7345/1764470000.123456/127.0.0.1:5432");
        assert!(primary.has_wait_for());
        assert_eq!(primary.timeline, Some(10));
        assert_eq!(
            primary.reachable(Lsn::parse("0/03020018").unwrap()),
            Lsn::parse("0/03020000").unwrap()
        );
        let standby = ServerFacts::from_row(&[Some("7345/1/x:1"), Some("150004"), None, None]);
        assert!(!standby.has_wait_for());
        assert_eq!(standby.timeline, None);
        assert_eq!(standby.reachable(Lsn::new(0x18)), Lsn::new(0x18));
        let nothing = ServerFacts::from_row(&[]);
        assert!(nothing.server.is_unknown());
        assert_eq!(nothing, ServerFacts::default());
    }
}
