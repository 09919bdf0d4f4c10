//! The statements the proxy adds to a backend flight, as frames, and how their answers read.
//! Position statements are prepared once per server connection (a named statement the
//! connection's `prepared` map tracks, so `DISCARD ALL` and resets forget it like any other) and
//! run through a named portal, so they never touch the client's unnamed statement or portal.
//! The statement texts and how their answers read are `lsngate_core::probe`'s (shared with the
//! library); this module only frames them (the DataRows they answer are decoded by `net::backend::data_row`).

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use lsngate_core::Lsn;
use lsngate_core::probe::{INSERT_POSITION_SQL, REPLAY_SQL, wait_for_sql};

use crate::net::{Frame, FrontendMessage};

const POSITION_STATEMENT: &str = "lsngate_position";
const REPLAY_STATEMENT: &str = "lsngate_replayed";
const WAIT_STATEMENT: &str = "lsngate_wait";
const PORTAL: &str = "lsngate";

/// Whether `name` is one of the statements the proxy prepares on server connections itself.
pub fn is_proxy_statement(name: &str) -> bool {
    [POSITION_STATEMENT, REPLAY_STATEMENT, WAIT_STATEMENT].contains(&name)
}

/// Which proxy statement a segment runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// `pg_current_wal_insert_lsn()` after a commit or a primary read.
    Position,
    /// `pg_is_in_recovery(), pg_last_wal_replay_lsn()` before or after a replica read.
    Replay,
}

/// Frames running `probe` as one Sync-terminated segment; `prepared` is the connection's map
/// of named statements (the probe's statement is parsed when missing).
pub fn probe_segment(probe: Probe, prepared: &mut HashMap<String, String>) -> Vec<Frame> {
    let (name, sql) = match probe {
        Probe::Position => (POSITION_STATEMENT, INSERT_POSITION_SQL),
        Probe::Replay => (REPLAY_STATEMENT, REPLAY_SQL),
    };
    let mut frames = Vec::with_capacity(6);
    if prepared.get(name).map(String::as_str) != Some(sql) {
        frames.push(
            FrontendMessage::Close {
                kind: b'S',
                name: name.into(),
            }
            .to_frame(),
        );
        frames.push(
            FrontendMessage::Parse {
                statement: name.into(),
                query: sql.into(),
                param_types: Vec::new(),
            }
            .to_frame(),
        );
        prepared.insert(name.into(), sql.into());
    }
    frames.push(
        FrontendMessage::Close {
            kind: b'P',
            name: PORTAL.into(),
        }
        .to_frame(),
    );
    frames.push(
        FrontendMessage::Bind {
            portal: PORTAL.into(),
            statement: name.into(),
            // no parameter formats, no parameters, no result formats (all text)
            rest: Bytes::from_static(&[0, 0, 0, 0, 0, 0]),
        }
        .to_frame(),
    );
    frames.push(
        FrontendMessage::Execute {
            portal: PORTAL.into(),
            max_rows: 0,
        }
        .to_frame(),
    );
    frames.push(FrontendMessage::Sync.to_frame());
    frames
}

/// Forgets the probes' statements on a connection whose statement failed (so the next use
/// parses them again).
pub fn forget_probes(prepared: &mut HashMap<String, String>) {
    prepared.remove(POSITION_STATEMENT);
    prepared.remove(REPLAY_STATEMENT);
}

/// `WAIT FOR LSN` (PostgreSQL ≥ 19) for `floor`, at most `timeout` (see
/// `lsngate_core::probe::wait_for_sql`: never less than 1 ms), answering a status row instead of
/// raising. Sent over the extended
/// protocol as a named statement (the LSN is a literal: no parameters), so the client's unnamed
/// statement and portal survive it; a simple Query would drop them.
pub fn wait_for(floor: Lsn, timeout: Duration) -> Vec<Frame> {
    vec![
        FrontendMessage::Close {
            kind: b'S',
            name: WAIT_STATEMENT.into(),
        }
        .to_frame(),
        FrontendMessage::Parse {
            statement: WAIT_STATEMENT.into(),
            query: wait_for_sql(floor, timeout),
            param_types: Vec::new(),
        }
        .to_frame(),
        FrontendMessage::Close {
            kind: b'P',
            name: PORTAL.into(),
        }
        .to_frame(),
        FrontendMessage::Bind {
            portal: PORTAL.into(),
            statement: WAIT_STATEMENT.into(),
            rest: Bytes::from_static(&[0, 0, 0, 0, 0, 0]),
        }
        .to_frame(),
        FrontendMessage::Execute {
            portal: PORTAL.into(),
            max_rows: 0,
        }
        .to_frame(),
        FrontendMessage::Sync.to_frame(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_parse_once_per_connection() {
        let mut prepared = HashMap::new();
        let first = probe_segment(Probe::Position, &mut prepared);
        let second = probe_segment(Probe::Position, &mut prepared);
        assert_eq!(
            first.iter().map(|f| f.tag).collect::<Vec<_>>(),
            b"CPCBES".to_vec()
        );
        assert_eq!(
            second.iter().map(|f| f.tag).collect::<Vec<_>>(),
            b"CBES".to_vec()
        );
        forget_probes(&mut prepared);
        assert_eq!(probe_segment(Probe::Position, &mut prepared).len(), 6);
    }

    #[test]
    fn waits_never_ask_for_forever() {
        let frames = wait_for(Lsn::new(0x3000060), Duration::ZERO);
        assert_eq!(
            frames.iter().map(|f| f.tag).collect::<Vec<_>>(),
            b"CPCBES".to_vec()
        );
        let text = String::from_utf8_lossy(&frames[1].body).into_owned();
        assert!(
            text.contains("'0/03000060'") && text.contains("TIMEOUT '1ms'"),
            "{text}"
        );
    }
}
