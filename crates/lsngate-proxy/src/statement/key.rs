//! The cache key of a statement: its text with numbers and simple string literals replaced by
//! placeholders, so `WHERE aid = 42` and `WHERE aid = 43` share one classification. It runs for
//! every statement the proxy routes, so it is one pass that copies the text in runs (sixteen
//! bytes a step with SSE2) and stops only at the bytes that matter; on the same pass it notices
//! what the pass-through must know (a NUL, a mention of lsngate, non-ASCII bytes). Whatever would
//! make the lexing ambiguous — comments, backslashes, dollar quotes, prefixed strings — makes the
//! key the text itself: a key may be too specific, never too general.

use super::class::is_ident;

/// The cache key for `sql`: numbers and simple string literals replaced by placeholders, so
/// statements that differ only in literal values (`WHERE aid = 42` / `= 43`) share one
/// classification. Literals cannot change what a statement does; texts whose lexing could be
/// ambiguous (comments, backslashes, dollar quotes, E'' / U&'' strings) are used verbatim.
/// The sessions key through [`ClassMemo`](super::ClassMemo), which reuses its buffer and
/// notices on the same pass; this form is the tests' reference.
#[cfg(test)]
pub fn cache_key(sql: &str) -> std::borrow::Cow<'_, str> {
    let mut out = String::new();
    if cache_key_into(sql, &mut out) {
        std::borrow::Cow::Owned(out)
    } else {
        std::borrow::Cow::Borrowed(sql)
    }
}

/// Bytes the key scan stops at: quotes, digits, and the first byte of anything that makes the
/// lexing ambiguous; and, for the pass-through's checks, NUL and non-ASCII bytes. An `l`/`L` is
/// a stop too when an `s`/`S` follows it (a mention of lsngate starts so; see [`special_at`]):
/// a lone `l`, as in `SELECT` or `balance`, is copied with the rest. Everything else is copied in
/// runs.
static KEY_SPECIAL: [bool; 256] = {
    let mut table = [false; 256];
    let mut digit = b'0';
    while digit <= b'9' {
        table[digit as usize] = true;
        digit += 1;
    }
    let mut high = 0x80;
    while high <= 0xff {
        table[high] = true;
        high += 1;
    }
    table[0] = true;
    table[b'\'' as usize] = true;
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table[b'$' as usize] = true;
    table[b'-' as usize] = true;
    table[b'/' as usize] = true;
    table
};

/// Whether the scan stops at `bytes[i]`: a [`KEY_SPECIAL`] byte, or `ls` in any case.
fn special_at(bytes: &[u8], i: usize) -> bool {
    KEY_SPECIAL[bytes[i] as usize]
        || (bytes[i] | 0x20 == b'l' && bytes.get(i + 1).is_some_and(|&next| next | 0x20 == b's'))
}

/// The index of the first byte at or after `from` the scan stops at ([`special_at`]), or
/// `bytes.len()`. Sixteen bytes per step with SSE2 (part of every x86-64 CPU): most statement
/// text is plain words that the scan only copies.
#[cfg(target_arch = "x86_64")]
fn next_special(bytes: &[u8], from: usize) -> usize {
    use std::arch::x86_64::*;
    // SAFETY (both): SSE2 is part of the x86-64 baseline, and the callers keep the unaligned
    // 16-byte load inside `bytes`.
    // The stops among the 16 bytes at `at`, one bit each; an `l` in the last lane counts when
    // `then_s`, the byte after them, is an `s`.
    let stops = |at: usize, then_s: bool| unsafe {
        let v = _mm_loadu_si128(bytes.as_ptr().add(at).cast());
        let is = |b: u8| _mm_cmpeq_epi8(v, _mm_set1_epi8(b as i8));
        // A digit: v - '0' (wrapping) is at most 9, i.e. min(v - '0', 9) == v - '0'.
        let from_zero = _mm_sub_epi8(v, _mm_set1_epi8(b'0' as i8));
        let digit = _mm_cmpeq_epi8(_mm_min_epu8(from_zero, _mm_set1_epi8(9)), from_zero);
        let quotes = _mm_or_si128(_mm_or_si128(is(b'\''), is(b'"')), is(b'\\'));
        let comments = _mm_or_si128(_mm_or_si128(is(b'$'), is(b'-')), is(b'/'));
        let marks = _mm_or_si128(_mm_or_si128(quotes, comments), _mm_or_si128(is(0), digit));
        // Bytes of 0x80 and above carry their own top bit.
        let plain_stops = _mm_movemask_epi8(_mm_or_si128(marks, v)) as u32;
        // Lower case by setting 0x20: only `L` and `l` become `l`, only `S` and `s` become `s`.
        let lower = _mm_or_si128(v, _mm_set1_epi8(0x20));
        let l = _mm_movemask_epi8(_mm_cmpeq_epi8(lower, _mm_set1_epi8(b'l' as i8))) as u32;
        let s = _mm_movemask_epi8(_mm_cmpeq_epi8(lower, _mm_set1_epi8(b's' as i8))) as u32;
        plain_stops | (l & ((s >> 1) | (u32::from(then_s) << 15)))
    };
    let mut i = from;
    while i + 16 <= bytes.len() {
        let then_s = bytes.get(i + 16).is_some_and(|&next| next | 0x20 == b's');
        let mask = stops(i, then_s);
        if mask != 0 {
            return i + mask.trailing_zeros() as usize;
        }
        i += 16;
    }
    if i == bytes.len() {
        return i;
    }
    if bytes.len() >= 16 {
        // The last 16 bytes, overlapping what was scanned: lanes before `i` are masked off.
        let at = bytes.len() - 16;
        let mask = stops(at, false) >> (i - at);
        return if mask != 0 {
            i + mask.trailing_zeros() as usize
        } else {
            bytes.len()
        };
    }
    (i..bytes.len())
        .find(|&j| special_at(bytes, j))
        .unwrap_or(bytes.len())
}

/// The index of the first byte at or after `from` the scan stops at ([`special_at`]), or
/// `bytes.len()`.
#[cfg(not(target_arch = "x86_64"))]
fn next_special(bytes: &[u8], from: usize) -> usize {
    (from..bytes.len())
        .find(|&j| special_at(bytes, j))
        .unwrap_or(bytes.len())
}

/// What the key scan noticed on the way, for the pass-through (`frontend/passthrough.rs`): a text with a
/// NUL, a mention of lsngate in any case, or bytes that are not valid UTF-8 must take the
/// general path. The scan stops early once one of them is seen, or when the key is the text
/// itself; only what it passed is reported.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Noticed {
    /// A NUL byte.
    pub nul: bool,
    /// "lsngate" in any case.
    pub lsngate: bool,
    /// A byte above 0x7f (the text may not be UTF-8; validate it).
    pub non_ascii: bool,
}

impl Noticed {
    /// Notes what a span the scan passes over whole (a literal, a quoted identifier) holds; true
    /// when that ends the scan (`stop_at_notice` and a NUL or a mention of lsngate).
    fn passed_over(&mut self, span: &[u8], stop_at_notice: bool) -> bool {
        self.non_ascii |= !span.is_ascii();
        self.nul |= span.contains(&0);
        self.lsngate |= mentions_lsngate(span);
        stop_at_notice && (self.nul || self.lsngate)
    }
}

/// How a key scan ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scan {
    /// `out` holds the key.
    Keyed,
    /// The key is the text itself.
    Verbatim,
    /// A NUL or a mention of lsngate was seen (with `stop_at_notice`); no key.
    Stopped,
}

/// [`cache_key`] written into `out` (cleared first, its allocation reused); false when the key
/// is `sql` itself.
#[cfg(test)]
pub fn cache_key_into(sql: &str, out: &mut String) -> bool {
    let mut key = std::mem::take(out).into_bytes();
    let keyed = scan_key(sql.as_bytes(), &mut key, &mut Noticed::default(), false) == Scan::Keyed;
    // Built from whole runs of `sql` cut at ASCII bytes, and ASCII placeholders: UTF-8.
    *out = String::from_utf8(key).expect("a key cut at ASCII bytes of UTF-8 text");
    keyed
}

/// The key scan. One pass that copies the text in runs between the bytes that matter (this runs
/// for every statement the proxy routes); `noticed` collects what the pass-through must know
/// about the text, and with `stop_at_notice` a NUL or a mention of lsngate ends the scan.
pub(super) fn scan_key(
    bytes: &[u8],
    out: &mut Vec<u8>,
    noticed: &mut Noticed,
    stop_at_notice: bool,
) -> Scan {
    out.clear();
    // A byte before `i` that glues a literal to a word: `E'..'`, `t1`, `"x"1`.
    let glued = |i: usize| i > 0 && (is_ident(bytes[i - 1]) || bytes[i - 1] == b'"');
    let mut i = 0;
    let mut copied = 0;
    loop {
        i = next_special(bytes, i);
        let Some(&b) = bytes.get(i) else {
            break;
        };
        match b {
            b'l' | b'L' => {
                if bytes
                    .get(i..i + 7)
                    .is_some_and(|w| w.eq_ignore_ascii_case(b"lsngate"))
                {
                    noticed.lsngate = true;
                    if stop_at_notice {
                        return Scan::Stopped;
                    }
                }
                i += 1;
            }
            0 => {
                noticed.nul = true;
                if stop_at_notice {
                    return Scan::Stopped;
                }
                i += 1;
            }
            0x80.. => {
                noticed.non_ascii = true;
                i += 1;
            }
            b'\\' | b'$' => return Scan::Verbatim,
            b'-' | b'/' => {
                let second = if b == b'-' { b'-' } else { b'*' };
                if bytes.get(i + 1) == Some(&second) {
                    return Scan::Verbatim; // a comment
                }
                i += 1;
            }
            b'"' => {
                // A quoted identifier stays as it is, through its closing quote; what it holds
                // is checked here.
                let end = memchr::memchr(b'"', &bytes[i + 1..]).map_or(bytes.len(), |e| i + 2 + e);
                if noticed.passed_over(&bytes[i..end], stop_at_notice) {
                    return Scan::Stopped;
                }
                i = end;
            }
            b'\'' => {
                if glued(i) {
                    return Scan::Verbatim; // E'..', U&'..', B'..', X'..' prefixes
                }
                let mut j = i + 1;
                loop {
                    match memchr::memchr2(b'\'', b'\\', &bytes[j..]) {
                        None => return Scan::Verbatim,
                        Some(k) if bytes[j + k] == b'\\' => return Scan::Verbatim,
                        Some(k) if bytes.get(j + k + 1) == Some(&b'\'') => j += k + 2,
                        Some(k) => {
                            j += k;
                            break;
                        }
                    }
                }
                // The literal is replaced: what it holds is checked here.
                if noticed.passed_over(&bytes[i..j], stop_at_notice) {
                    return Scan::Stopped;
                }
                out.extend_from_slice(&bytes[copied..i]);
                out.extend_from_slice(b"'?'");
                i = j + 1;
                copied = i;
            }
            _ if glued(i) => i += 1, // a digit inside a word (`t1`) or after `"x"`
            _ => {
                out.extend_from_slice(&bytes[copied..i]);
                out.push(b'0');
                while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
                    i += 1;
                }
                copied = i;
            }
        }
    }
    out.extend_from_slice(&bytes[copied..]);
    Scan::Keyed
}

/// Whether `bytes` mention lsngate in any case (a hint comment or a proxy command).
pub fn mentions_lsngate(bytes: &[u8]) -> bool {
    memchr::memchr2_iter(b'l', b'L', bytes).any(|i| {
        bytes
            .get(i..i + 7)
            .is_some_and(|w| w.eq_ignore_ascii_case(b"lsngate"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::statement::class::classify;
    use proptest::prelude::*;

    #[test]
    fn cache_keys_ignore_literal_values_but_not_structure() {
        assert_eq!(
            cache_key("SELECT a FROM t WHERE id = 42"),
            cache_key("SELECT a FROM t WHERE id = 7")
        );
        assert_eq!(
            cache_key("SELECT 'x' FROM t1"),
            cache_key("SELECT 'it''s' FROM t1")
        );
        assert_ne!(cache_key("SELECT a FROM t1"), cache_key("SELECT a FROM t2"));
        assert_ne!(
            cache_key("SELECT 'a'; DELETE FROM t"),
            cache_key("SELECT 'a'")
        );
        assert_eq!(cache_key("SELECT E'\\x' FROM t"), "SELECT E'\\x' FROM t");
        assert_eq!(cache_key("SELECT $1 FROM t"), "SELECT $1 FROM t");
        assert_eq!(cache_key("SELECT 'open"), "SELECT 'open");
    }

    /// The straightforward byte-at-a-time key scan that `cache_key_into` must match.
    fn reference_key_into(sql: &str, out: &mut String) -> bool {
        out.clear();
        let bytes = sql.as_bytes();
        // One pass: anything that could make the lexing ambiguous ends it with the verbatim text.
        let ambiguous = |i: usize| match bytes[i] {
            b'\\' | b'$' => true,
            b'-' => bytes.get(i + 1) == Some(&b'-'),
            b'/' => bytes.get(i + 1) == Some(&b'*'),
            _ => false,
        };
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            let prev_ident = i > 0 && (is_ident(bytes[i - 1]) || bytes[i - 1] == b'"');
            if b == b'\'' {
                if prev_ident {
                    return false; // E'..', U&'..', B'..', X'..' prefixes
                }
                let mut j = i + 1;
                loop {
                    match bytes.get(j) {
                        None | Some(b'\\') => return false,
                        Some(b'\'') if bytes.get(j + 1) == Some(&b'\'') => j += 2,
                        Some(b'\'') => break,
                        Some(_) => j += 1,
                    }
                }
                out.push_str("'?'");
                i = j + 1;
            } else if b.is_ascii_digit() && !prev_ident {
                while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
                    i += 1;
                }
                out.push('0');
            } else if b == b'"' {
                let end = sql[i + 1..]
                    .find('"')
                    .map(|e| i + 2 + e)
                    .unwrap_or(bytes.len());
                out.push_str(&sql[i..end]);
                i = end;
            } else {
                let start = i;
                if ambiguous(i) {
                    return false;
                }
                i += 1;
                while i < bytes.len()
                    && !matches!(bytes[i], b'\'' | b'"')
                    && (!bytes[i].is_ascii_digit() || is_ident(bytes[i - 1]))
                {
                    if ambiguous(i) {
                        return false;
                    }
                    i += 1;
                }
                out.push_str(&sql[start..i]);
            }
        }
        true
    }

    fn reference_key(sql: &str) -> Option<String> {
        let mut out = String::new();
        reference_key_into(sql, &mut out).then_some(out)
    }

    fn fast_key(sql: &str) -> Option<String> {
        let mut out = String::from("leftover");
        cache_key_into(sql, &mut out).then_some(out)
    }

    #[test]
    fn the_run_copying_key_scan_matches_the_reference() {
        for sql in [
            "SELECT abalance FROM pgbench_accounts WHERE aid = 12345;",
            "SELECT t1.a, \"c2\"3, x.5 FROM t1 WHERE s = 'it''s' AND n = 1.5e3",
            "SELECT 'a' || E'b'",
            "SELECT 1 - 2 / 3 -- c",
            "SELECT 1 /* c */",
            "SELECT $1",
            "SELECT 'open",
            "SELECT 'x\\'",
            "SELECT \"unterminated",
            "INSERT INTO t VALUES (1, 'é', '')",
            "",
        ] {
            assert_eq!(fast_key(sql), reference_key(sql), "{sql:?}");
        }
    }

    proptest! {
        #[test]
        fn the_wide_skip_finds_the_first_special_byte(
            text in proptest::collection::vec(any::<u8>(), 0..80),
            plain in proptest::collection::vec(prop::sample::select(b"SELECT abc FROM tl WHERE x = ;sS".to_vec()), 0..80),
            from in 0usize..80,
        ) {
            // Random bytes (specials everywhere) and plain words with a few specials appended.
            for bytes in [text.clone(), [plain.clone(), text].concat()] {
                let from = from.min(bytes.len());
                let expected = (from..bytes.len())
                    .find(|&i| {
                        let b = bytes[i];
                        b.is_ascii_digit()
                            || b >= 0x80
                            || b"\0'\"\\$-/".contains(&b)
                            || (b"lL".contains(&b) && bytes.get(i + 1).is_some_and(|n| b"sS".contains(n)))
                    })
                    .unwrap_or(bytes.len());
                prop_assert_eq!(next_special(&bytes, from), expected);
            }
        }

        /// Texts with the same cache key (not verbatim) always classify the same.
        #[test]
        fn same_key_same_class(a in 0u32..1000, b in 0u32..1000, s in "[a-z ]{0,12}", kw in prop::sample::select(vec!["SELECT", "INSERT INTO t VALUES", "SELECT nextval", "DELETE FROM t WHERE x ="])) {
            let x = format!("{kw} ({a}, '{s}')");
            let y = format!("{kw} ({b}, 'other')");
            prop_assert_eq!(cache_key(&x), cache_key(&y));
            prop_assert_eq!(classify(&x, &[]), classify(&y, &[]));
        }

        #[test]
        fn key_scans_agree(sql in "([a-z0-9_ .,;()=*/\\-]|'|\"|\\$|\\\\|é){0,60}") {
            prop_assert_eq!(fast_key(&sql), reference_key(&sql));
        }
    }
}
