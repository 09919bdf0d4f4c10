//! The statements the proxy adds to a backend flight, as frames, and how their answers read.
//! Position statements are prepared once per server connection (a named statement the
//! connection's `prepared` map tracks, so `DISCARD ALL` and resets forget it like any other) and
//! run through a named portal, so they never touch the client's unnamed statement or portal.
//! The statement texts and how their answers read are `lsngate_core::probe`'s (shared with the
//! library); this module only frames them (the DataRows they answer are decoded by `net::backend::data_row`).

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use lsngate_core::Lsn;
use lsngate_core::probe::{INSERT_POSITION_SQL, REPLAY_SQL, write_wait_for_sql};
use smallvec::SmallVec;

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

/// What a probe's segment is made of, each message framed once per process (a clone of a
/// frame is a reference count, not a copy): the statement's Close and Parse (sent when the
/// connection lacks it), then Close of the portal, Bind, Execute and Sync (sent every time).
struct ProbeFrames {
    /// The statement's name on server connections, and its text.
    statement: &'static str,
    sql: &'static str,
    prepare: [Frame; 2],
    run: [Frame; 4],
}

impl ProbeFrames {
    fn new(statement: &'static str, sql: &'static str) -> ProbeFrames {
        ProbeFrames {
            statement,
            sql,
            prepare: [
                close(b'S', statement),
                FrontendMessage::Parse {
                    statement: statement.into(),
                    query: sql.into(),
                    param_types: Vec::new(),
                }
                .to_frame(),
            ],
            run: run_portal(statement),
        }
    }
}

fn close(kind: u8, name: &str) -> Frame {
    FrontendMessage::Close {
        kind,
        name: name.into(),
    }
    .to_frame()
}

/// Close of the proxy's portal, Bind of `statement` to it, Execute, Sync.
fn run_portal(statement: &str) -> [Frame; 4] {
    [
        close(b'P', PORTAL),
        FrontendMessage::Bind {
            portal: PORTAL.into(),
            statement: statement.into(),
            // no parameter formats, no parameters, no result formats (all text)
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

fn probe_frames(probe: Probe) -> &'static ProbeFrames {
    static POSITION: LazyLock<ProbeFrames> =
        LazyLock::new(|| ProbeFrames::new(POSITION_STATEMENT, INSERT_POSITION_SQL));
    static REPLAY: LazyLock<ProbeFrames> =
        LazyLock::new(|| ProbeFrames::new(REPLAY_STATEMENT, REPLAY_SQL));
    match probe {
        Probe::Position => &POSITION,
        Probe::Replay => &REPLAY,
    }
}

/// A probe's or a wait's frames: six at most, kept inline.
pub type Segment = SmallVec<[Frame; 6]>;

/// Frames running `probe` as one Sync-terminated segment; `prepared` is the connection's map
/// of named statements (the probe's statement is parsed when missing).
pub fn probe_segment(probe: Probe, prepared: &mut HashMap<String, String>) -> Segment {
    let frames = probe_frames(probe);
    let mut segment = Segment::new();
    if prepared.get(frames.statement).map(String::as_str) != Some(frames.sql) {
        segment.extend(frames.prepare.iter().cloned());
        prepared.insert(frames.statement.into(), frames.sql.into());
    }
    segment.extend(frames.run.iter().cloned());
    segment
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
/// statement and portal survive it; a simple Query would drop them. Only the Parse is built
/// here; the other five frames are built once per process.
pub fn wait_for(floor: Lsn, timeout: Duration) -> Segment {
    static CLOSE: LazyLock<Frame> = LazyLock::new(|| close(b'S', WAIT_STATEMENT));
    static RUN: LazyLock<[Frame; 4]> = LazyLock::new(|| run_portal(WAIT_STATEMENT));
    // Parse: statement name, query text, no parameter types; written in place.
    let mut body = BytesMut::with_capacity(WAIT_STATEMENT.len() + 100);
    body.put_slice(WAIT_STATEMENT.as_bytes());
    body.put_u8(0);
    write_wait_for_sql(&mut body, floor, timeout).expect("BytesMut takes any text");
    body.put_u8(0);
    body.put_i16(0);
    let parse = Frame::new(b'P', body.freeze());
    let mut segment = Segment::new();
    segment.push(CLOSE.clone());
    segment.push(parse);
    segment.extend(RUN.iter().cloned());
    segment
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
