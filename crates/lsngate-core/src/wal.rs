//! WAL layout facts needed to turn a primary's insert position into a token a replica can reach.
//!
//! `pg_current_wal_insert_lsn()` names where the *next* record will go. When that is the very
//! start of a WAL page, the position points past the page header (24 bytes, or 40 on the first
//! page of a segment), while a replica's replay position stops at the end of the last record —
//! the page boundary — and would not reach the token until some later WAL arrives (seen here:
//! token `0/03020018`, primary flushed and replica replayed `0/03020000`, the wait timed out).
//! No record byte lies between the boundary and the header's end, so the boundary stands for
//! exactly the same writes. Pure arithmetic, no I/O.

use crate::lsn::Lsn;

/// Size of a WAL page header (`SizeOfXLogShortPHD`).
pub const SHORT_PAGE_HEADER: u64 = 24;
/// Size of the header of a segment's first page (`SizeOfXLogLongPHD`).
pub const LONG_PAGE_HEADER: u64 = 40;

/// The smallest position standing for the same writes as insert position `insert`, given the
/// server's `wal_block_size` and `wal_segment_size` in bytes. Positions inside a page are
/// returned unchanged; sizes of 0 disable the mapping.
pub fn reachable_insert_position(insert: Lsn, block_size: u64, segment_size: u64) -> Lsn {
    let position = insert.as_u64();
    if segment_size > 0 && position % segment_size == LONG_PAGE_HEADER {
        return Lsn::new(position - LONG_PAGE_HEADER);
    }
    let in_segment = if segment_size > 0 {
        position % segment_size
    } else {
        position
    };
    if block_size > 0 && in_segment >= block_size && position % block_size == SHORT_PAGE_HEADER {
        return Lsn::new(position - SHORT_PAGE_HEADER);
    }
    insert
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BLOCK: u64 = 8192;
    const SEGMENT: u64 = 16 << 20;

    #[test]
    fn page_start_maps_to_the_boundary() {
        let token = Lsn::parse("0/03020018").unwrap();
        assert_eq!(
            reachable_insert_position(token, BLOCK, SEGMENT),
            Lsn::parse("0/03020000").unwrap()
        );
    }

    #[test]
    fn segment_start_maps_past_the_long_header() {
        let token = Lsn::parse("0/04000028").unwrap();
        assert_eq!(
            reachable_insert_position(token, BLOCK, SEGMENT),
            Lsn::parse("0/04000000").unwrap()
        );
        // 24 bytes into a segment is inside the long header: never an insert position, and
        // not mistaken for a short header.
        let odd = Lsn::parse("0/04000018").unwrap();
        assert_eq!(reachable_insert_position(odd, BLOCK, SEGMENT), odd);
    }

    #[test]
    fn positions_inside_a_page_are_unchanged() {
        for text in ["0/03020020", "0/0302FFF8", "0/03021FF0", "1/00002030"] {
            let lsn = Lsn::parse(text).unwrap();
            assert_eq!(
                reachable_insert_position(lsn, BLOCK, SEGMENT),
                lsn,
                "{text}"
            );
        }
        let lsn = Lsn::parse("0/03020018").unwrap();
        assert_eq!(reachable_insert_position(lsn, 0, 0), lsn);
    }

    proptest! {
        /// Never raises a token, and lowers it by at most one page header.
        #[test]
        fn never_raises_and_moves_at_most_a_header(position: u64) {
            let lsn = Lsn::new(position);
            let mapped = reachable_insert_position(lsn, BLOCK, SEGMENT);
            prop_assert!(mapped <= lsn);
            prop_assert!(lsn.bytes_since(mapped) == 0
                || lsn.bytes_since(mapped) == SHORT_PAGE_HEADER
                || lsn.bytes_since(mapped) == LONG_PAGE_HEADER);
            if mapped != lsn {
                prop_assert_eq!(mapped.as_u64() % BLOCK, 0);
            }
        }
    }
}
