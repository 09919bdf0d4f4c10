//! Statement classification: where may this SQL run? Conservative by construction — anything
//! the parser does not understand, or that might write, goes to the primary; only plain queries
//! without locking clauses, data-modifying CTEs or effectful functions may go to a replica. Also
//! recognises the proxy's own commands (`SET/SHOW/RESET lsngate.route`) and route hints in
//! comments. Pure and cached per statement text; it does not choose a node (the session does).

use std::collections::HashMap;
use std::sync::Mutex;

use sqlparser::ast::Statement;
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

/// Functions that write, take locks or depend on session state created on the primary.
const EFFECT_FUNCTIONS: &[&str] = &[
    "nextval",
    "setval",
    "currval",
    "lastval",
    "pg_advisory_lock",
    "pg_advisory_xact_lock",
    "pg_advisory_lock_shared",
    "pg_advisory_xact_lock_shared",
    "pg_try_advisory_lock",
    "pg_try_advisory_xact_lock",
    "pg_try_advisory_lock_shared",
    "pg_try_advisory_xact_lock_shared",
    "pg_advisory_unlock",
    "pg_advisory_unlock_all",
    "pg_advisory_unlock_shared",
    "txid_current",
    "pg_current_xact_id",
    "set_config",
    "pg_notify",
    "lo_create",
    "lo_import",
    "lo_unlink",
    "lo_put",
    "lo_from_bytea",
    "pg_logical_emit_message",
    "dblink_exec",
    "pg_current_wal_lsn",
    "pg_current_wal_insert_lsn",
    "pg_current_wal_flush_lsn",
];

/// What a statement (or a multi-statement string) needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)] // variant fields are described by the variant docs
pub enum Class {
    /// Only reads: a replica may serve it outside a transaction block.
    Read,
    /// May write, lock or is not understood: the primary.
    Write,
    /// Opens a transaction block; `read_only` blocks may go to a replica.
    Begin { read_only: bool },
    /// COMMIT / ROLLBACK: goes wherever the transaction is, and ends it.
    TransactionControl,
    /// Changes only the transaction it runs in (SAVEPOINT, RELEASE, SET LOCAL, SET TRANSACTION,
    /// SET CONSTRAINTS): goes wherever the transaction is — a block, or the implicit one of an
    /// extended batch still open on a replica — and ends nothing.
    TransactionLocal,
    /// Session state (SET, RESET, DISCARD, DEALLOCATE): runs on the primary and is re-applied
    /// on every backend the client later uses.
    SessionState,
    /// LISTEN, SQL-level PREPARE, DECLARE (cursors WITH HOLD): state the proxy cannot move
    /// between backends, so the client stays on one primary backend from now on.
    Pin,
}

/// A routing hint given by the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteHint {
    /// Route as classified.
    Auto,
    /// Always the primary.
    Primary,
    /// A replica even for what looks like a write (the replica will refuse real writes).
    Replica,
}

impl RouteHint {
    /// Parses `primary`, `replica` or `auto` (quotes allowed).
    pub fn parse(text: &str) -> Option<RouteHint> {
        match text
            .trim()
            .trim_matches(|c| c == '\'' || c == '"')
            .to_ascii_lowercase()
            .as_str()
        {
            "primary" => Some(RouteHint::Primary),
            "replica" => Some(RouteHint::Replica),
            "auto" | "default" => Some(RouteHint::Auto),
            _ => None,
        }
    }

    /// The name shown by `SHOW lsngate.route`.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteHint::Auto => "auto",
            RouteHint::Primary => "primary",
            RouteHint::Replica => "replica",
        }
    }
}

/// What a proxy command does with its setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verb {
    /// `SET [SESSION] lsngate.x = value` / `TO value` (the value as written, quotes kept).
    Set(String),
    /// `RESET lsngate.x` (also `SET lsngate.x TO DEFAULT`).
    Reset,
    /// `SHOW lsngate.x`.
    Show,
}

/// A statement the proxy answers itself and never forwards: `SET/RESET/SHOW lsngate.<name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalCommand {
    /// The setting, lower case, without the `lsngate.` prefix.
    pub name: String,
    /// What to do with it.
    pub verb: Verb,
}

/// Recognises the proxy's own commands.
pub fn local_command(sql: &str) -> Option<LocalCommand> {
    if !mentions_lsngate_setting(sql) {
        return None;
    }
    let text = sql.trim().trim_end_matches(';').trim();
    let (head, rest) = text.split_once(char::is_whitespace)?;
    let rest = rest.trim_start();
    let head = head.to_ascii_lowercase();
    let rest = match head.as_str() {
        "set" => {
            let after = rest.get(..8).filter(|p| p.eq_ignore_ascii_case("session "));
            if after.is_some() {
                rest[8..].trim_start()
            } else {
                rest
            }
        }
        _ => rest,
    };
    let name_end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        .unwrap_or(rest.len());
    let name = rest[..name_end].to_ascii_lowercase();
    let name = name.strip_prefix("lsngate.")?.to_string();
    let tail = rest[name_end..].trim();
    let verb = match head.as_str() {
        "show" if tail.is_empty() => Verb::Show,
        "reset" if tail.is_empty() => Verb::Reset,
        "set" => {
            let value = tail.strip_prefix('=').map(str::trim).or_else(|| {
                tail.get(..3)
                    .filter(|p| p.eq_ignore_ascii_case("to "))
                    .map(|_| tail[3..].trim())
            })?;
            if value.eq_ignore_ascii_case("default") {
                Verb::Reset
            } else {
                Verb::Set(value.to_string())
            }
        }
        _ => return None,
    };
    Some(LocalCommand { name, verb })
}

/// Cheap pre-check on the hot path: does this look like `SET/SHOW/RESET lsngate.*`?
pub fn mentions_lsngate_setting(sql: &str) -> bool {
    let head = sql.trim_start().as_bytes();
    let starts = |kw: &[u8]| head.len() > kw.len() && head[..kw.len()].eq_ignore_ascii_case(kw);
    (starts(b"set") || starts(b"show") || starts(b"reset"))
        && sql.to_ascii_lowercase().contains("lsngate.")
}

/// Per-statement hints found in comments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hints {
    /// `/* lsngate:route=primary */` (or `lsngate_route='replica'`).
    pub route: Option<RouteHint>,
    /// `/* lsngate_min_lsn='0/3F8A120' */`: the raw value, validated by the session.
    pub min_lsn: Option<String>,
}

/// Finds lsngate hints in the statement's comments: `/* lsngate:route=primary */` and
/// sqlcommenter-style `/*lsngate_min_lsn='0/3F8A120',lsngate_route='replica'*/`. Returns them
/// with the SQL minus every comment that held only lsngate keys (so statements that differ only
/// in their floor share one classification). String literals are skipped; `None` when no hint.
pub fn comment_hints(sql: &str) -> Option<(Hints, String)> {
    if !sql.contains("lsngate") {
        return None;
    }
    let bytes = sql.as_bytes();
    let mut hints = Hints::default();
    let mut keep = String::with_capacity(sql.len());
    let mut copied = 0;
    let mut found = false;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\'' => {
                i += 1;
                while i < bytes.len() {
                    if bytes[i] == b'\'' && bytes.get(i + 1) == Some(&b'\'') {
                        i += 2;
                    } else if bytes[i] == b'\'' {
                        break;
                    } else {
                        i += 1;
                    }
                }
                i += 1;
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                let Some(len) = sql[i + 2..].find("*/") else {
                    break;
                };
                let inner = &sql[i + 2..i + 2 + len];
                let end = i + 2 + len + 2;
                if let Some(found_here) = parse_hint_comment(inner) {
                    found = true;
                    hints.route = found_here.route.or(hints.route);
                    hints.min_lsn = found_here.min_lsn.or(hints.min_lsn);
                    keep.push_str(&sql[copied..i]);
                    copied = end;
                }
                i = end;
            }
            _ => i += 1,
        }
    }
    if !found {
        return None;
    }
    keep.push_str(&sql[copied.min(sql.len())..]);
    Some((hints, keep))
}

/// The hints of one comment body when every key in it is an lsngate key.
fn parse_hint_comment(inner: &str) -> Option<Hints> {
    let mut hints = Hints::default();
    let mut any = false;
    for pair in inner.split(',') {
        let pair = pair.trim();
        if pair.is_empty() {
            continue;
        }
        let (key, value) = pair.split_once('=')?;
        let value = value.trim().trim_matches('\'').trim();
        match key.trim().to_ascii_lowercase().as_str() {
            "lsngate:route" | "lsngate_route" => hints.route = Some(RouteHint::parse(value)?),
            "lsngate_min_lsn" | "lsngate:min_lsn" => {
                hints.min_lsn = Some(crate::config::percent_decode(value))
            }
            _ => return None,
        }
        any = true;
    }
    any.then_some(hints)
}

/// Parses a session `SET name = value` / `SET name TO value` into (name, value as SQL text).
pub fn session_set(sql: &str) -> Option<(String, String)> {
    let text = sql.trim().trim_end_matches(';').trim();
    let lower = text.to_ascii_lowercase();
    let rest = lower.strip_prefix("set ")?;
    if rest.starts_with("local ")
        || rest.starts_with("transaction")
        || rest.starts_with("constraints")
    {
        return None;
    }
    let offset = text.len() - rest.len();
    let rest_orig = &text[offset..];
    let rest_orig = rest_orig
        .strip_prefix("session ")
        .or_else(|| rest_orig.strip_prefix("SESSION "))
        .unwrap_or(rest_orig);
    let name_end =
        rest_orig.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))?;
    let name = rest_orig[..name_end].to_ascii_lowercase();
    let value = rest_orig[name_end..].trim_start();
    let value = value.strip_prefix('=').map(str::trim_start).or_else(|| {
        value
            .get(..3)
            .filter(|p| p.eq_ignore_ascii_case("to "))
            .map(|_| value[3..].trim_start())
    })?;
    if name.is_empty() || value.is_empty() || value.contains(';') {
        return None;
    }
    Some((name, value.to_string()))
}

/// The setting one statement returns to its default: `RESET name`, or `SET [SESSION] name TO
/// DEFAULT` (`= DEFAULT`), which means the same. The name, lower case, and the tag the server's
/// CommandComplete carries for it (`RESET` or `SET`). Not `RESET ALL`.
pub fn setting_reset(sql: &str) -> Option<(String, &'static str)> {
    let text = sql.trim().trim_end_matches(';').trim_end();
    if let Some(name) = text
        .get(..6)
        .filter(|p| p.eq_ignore_ascii_case("reset "))
        .map(|_| text[6..].trim().to_ascii_lowercase())
    {
        let setting = !name.is_empty()
            && name != "all"
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
        return setting.then_some((name, "RESET"));
    }
    let (name, value) = session_set(text)?;
    value
        .eq_ignore_ascii_case("default")
        .then_some((name, "SET"))
}

/// Whether a multi-statement string may return a setting to its default among its parts (a
/// RESET, a DISCARD or a `SET ... TO DEFAULT`). Split naively on `;`, like
/// [`sets_session_in_parts`]: a false positive only costs a wait.
pub fn may_reset_in_parts(sql: &[u8]) -> bool {
    sql.contains(&b';')
        && parts(sql).any(|(word, part)| match word.as_slice() {
            b"reset" | b"discard" => true,
            b"set" => has_word(
                &String::from_utf8_lossy(part).to_ascii_lowercase(),
                "default",
            ),
            _ => false,
        })
}

/// The parts of a string split naively on `;`, each with its first word in lower case.
fn parts(sql: &[u8]) -> impl Iterator<Item = (Vec<u8>, &[u8])> {
    sql.split(|&b| b == b';').map(|part| {
        let word = part
            .iter()
            .skip_while(|b| b.is_ascii_whitespace())
            .take_while(|b| b.is_ascii_alphabetic())
            .map(u8::to_ascii_lowercase)
            .collect();
        (word, part)
    })
}

/// Whether a multi-statement string has a statement among its parts that changes session
/// settings (`UPDATE t ...; SET application_name = 'x'`). Such a string is classified by its
/// other statements (a write stays a write, for its commit position), but PostgreSQL applies the
/// SET for the session all the same: the proxy must then read the server's settings back, or the
/// server connection goes back to the pool with a setting the next client's `settings_sql` does
/// not undo. Split naively on `;` (a `;` inside a literal only costs a needless read-back).
pub fn sets_session_in_parts(sql: &[u8]) -> bool {
    sql.contains(&b';')
        && parts(sql).any(|(word, _)| matches!(word.as_slice(), b"set" | b"reset" | b"discard"))
}

/// Classifies SQL text conservatively.
pub fn classify(sql: &str, write_functions: &[String]) -> Class {
    let lower = sql.to_ascii_lowercase();
    let first = lower
        .trim_start()
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or_default()
        .to_string();
    if first == "set" && transaction_local_set(&lower) {
        return Class::TransactionLocal;
    }
    match first.as_str() {
        "set" | "reset" | "discard" | "deallocate" => return Class::SessionState,
        "listen" | "unlisten" | "prepare" | "declare" => return Class::Pin,
        "show" => return Class::Read,
        "savepoint" | "release" if !several_statements(&lower) => {
            return Class::TransactionLocal;
        }
        _ => {}
    }
    if calls(&lower, "set_config") && !set_config_local_only(&lower) {
        // A setting changed by a function for the session: session state like SET (the
        // server's settings are read back afterwards).
        return Class::SessionState;
    }
    let Ok(statements) = Parser::parse_sql(&PostgreSqlDialect {}, sql) else {
        return Class::Write;
    };
    let mut class = None;
    for statement in &statements {
        let this = match statement {
            Statement::Query(_) if reads_only(&lower, write_functions) => Class::Read,
            Statement::Copy { .. }
                if lower.contains(" to stdout") && reads_only(&lower, write_functions) =>
            {
                Class::Read
            }
            Statement::StartTransaction { .. } => Class::Begin {
                read_only: is_read_only_begin(&lower),
            },
            Statement::Commit { .. } | Statement::Rollback { .. } => Class::TransactionControl,
            _ => Class::Write,
        };
        class = Some(match (class, this) {
            (None, c) => c,
            (Some(Class::Read), Class::Read) => Class::Read,
            (Some(Class::TransactionControl), Class::TransactionControl) => {
                Class::TransactionControl
            }
            _ => Class::Write,
        });
    }
    class.unwrap_or(Class::Read)
}

/// Whether a string holds more than one statement, split naively on `;` (a `;` inside a literal
/// only makes a statement count as several, the conservative side).
fn several_statements(lower: &str) -> bool {
    lower.trim().trim_end_matches(';').contains(';')
}

/// A single `SET LOCAL`, `SET TRANSACTION` or `SET CONSTRAINTS`: its effect ends with the
/// transaction it runs in.
fn transaction_local_set(lower: &str) -> bool {
    let words: Vec<&str> = lower.split_whitespace().take(2).collect();
    !several_statements(lower)
        && matches!(
            words.as_slice(),
            ["set", "local" | "transaction" | "constraints"]
        )
}

fn is_read_only_begin(lower: &str) -> bool {
    let squashed = lower.split_whitespace().collect::<Vec<_>>().join(" ");
    squashed.contains("read only") && !squashed.contains("read write")
}

fn reads_only(lower: &str, write_functions: &[String]) -> bool {
    const LOCKS: &[&str] = &[
        "for update",
        "for share",
        "for no key update",
        "for key share",
    ];
    const MODIFYING: &[&str] = &["insert", "update", "delete", "merge", "into"];
    let squashed = lower.split_whitespace().collect::<Vec<_>>().join(" ");
    if LOCKS.iter().any(|l| squashed.contains(l)) {
        return false;
    }
    if MODIFYING.iter().any(|kw| has_word(&squashed, kw)) {
        return false;
    }
    let extra = write_functions.iter().map(String::as_str);
    !EFFECT_FUNCTIONS
        .iter()
        .copied()
        .chain(extra)
        .any(|f| calls(&squashed, f))
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$'
}

fn has_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(i, _)| {
        let before = i == 0 || !is_ident(text.as_bytes()[i - 1]);
        let after = text
            .as_bytes()
            .get(i + word.len())
            .is_none_or(|&c| !is_ident(c));
        before && after
    })
}

/// Whether every `set_config(...)` call in `lower` passes a literal `true` as its last argument
/// (`is_local`: the value ends with the transaction, as PostgREST and row-level-security setups
/// use it on every request).
fn set_config_local_only(lower: &str) -> bool {
    lower.match_indices("set_config").all(|(i, _)| {
        let Some(args) = lower[i + "set_config".len()..]
            .trim_start()
            .strip_prefix('(')
        else {
            return true; // not a call
        };
        let (mut depth, mut quoted, mut last_comma) = (0usize, false, None);
        for (j, c) in args.char_indices() {
            match c {
                '\'' => quoted = !quoted,
                _ if quoted => {}
                '(' => depth += 1,
                ')' if depth == 0 => {
                    return last_comma.is_some_and(|k: usize| args[k + 1..j].trim() == "true");
                }
                ')' => depth -= 1,
                ',' if depth == 0 => last_comma = Some(j),
                _ => {}
            }
        }
        false
    })
}

fn calls(text: &str, function: &str) -> bool {
    text.match_indices(function).any(|(i, _)| {
        let before = i == 0 || !is_ident(text.as_bytes()[i - 1]) || text.as_bytes()[i - 1] == b'.';
        before && text[i + function.len()..].trim_start().starts_with('(')
    })
}

/// The cache key for `sql`: numbers and simple string literals replaced by placeholders, so
/// statements that differ only in literal values (`WHERE aid = 42` / `= 43`) share one
/// classification. Literals cannot change what a statement does; texts whose lexing could be
/// ambiguous (comments, backslashes, dollar quotes, E'' / U&'' strings) are used verbatim.
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

/// What the key scan noticed on the way, for the pass-through (`passthrough.rs`): a text with a
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
enum Scan {
    /// `out` holds the key.
    Keyed,
    /// The key is the text itself.
    Verbatim,
    /// A NUL or a mention of lsngate was seen (with `stop_at_notice`); no key.
    Stopped,
}

/// [`cache_key`] written into `out` (cleared first, its allocation reused); false when the key
/// is `sql` itself.
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
fn scan_key(bytes: &[u8], out: &mut Vec<u8>, noticed: &mut Noticed, stop_at_notice: bool) -> Scan {
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

/// A bounded cache of classifications keyed by statement text.
#[derive(Debug, Default)]
pub struct ClassCache {
    entries: Mutex<HashMap<String, Class, foldhash::fast::RandomState>>,
}

const CACHE_LIMIT: usize = 10_000;

/// A session's last few classifications, in front of the shared [`ClassCache`]: an application
/// sends the same few statement shapes over and over, and a hit here takes no lock and allocates
/// nothing. Cleared when the config changes (it may change `write_functions`).
#[derive(Debug, Default)]
pub struct ClassMemo {
    key: Vec<u8>,
    entries: Vec<(Vec<u8>, Class)>,
    next: usize,
}

const MEMO_SIZE: usize = 8;

impl ClassMemo {
    /// Classifies `sql` through the memo, then the shared cache.
    pub fn classify(&mut self, cache: &ClassCache, sql: &str, write_functions: &[String]) -> Class {
        let scan = scan_key(
            sql.as_bytes(),
            &mut self.key,
            &mut Noticed::default(),
            false,
        );
        self.lookup(cache, sql.as_bytes(), scan, write_functions)
    }

    /// Classifies the text of a simple Query (`text`: the bytes before its NUL) for the
    /// pass-through, in the same pass as its checks: None when the text holds a NUL, mentions
    /// lsngate, or is not UTF-8 (the general path then handles it and reports what is wrong).
    pub fn classify_query(
        &mut self,
        cache: &ClassCache,
        text: &[u8],
        write_functions: &[String],
    ) -> Option<Class> {
        let mut noticed = Noticed::default();
        let scan = scan_key(text, &mut self.key, &mut noticed, true);
        if scan == Scan::Stopped {
            return None;
        }
        if scan == Scan::Verbatim {
            // The scan stopped before the end: check the rest as the general path would.
            noticed.nul |= text.contains(&0);
            noticed.lsngate |= mentions_lsngate(text);
            noticed.non_ascii = true;
        }
        if noticed.nul || noticed.lsngate {
            return None;
        }
        if noticed.non_ascii && std::str::from_utf8(text).is_err() {
            return None;
        }
        Some(self.lookup(cache, text, scan, write_functions))
    }

    /// The class of `text` (UTF-8), whose scan ended as `scan` with its key in `self.key`.
    fn lookup(
        &mut self,
        cache: &ClassCache,
        text: &[u8],
        scan: Scan,
        write_functions: &[String],
    ) -> Class {
        let key: &[u8] = if scan == Scan::Keyed { &self.key } else { text };
        if let Some((_, class)) = self.entries.iter().find(|(k, _)| k == key) {
            return *class;
        }
        // UTF-8 (checked by the callers); the key is cut at ASCII bytes of it, with ASCII
        // placeholders, so it is UTF-8 too.
        let sql = std::str::from_utf8(text).expect("UTF-8 text");
        let key_text = std::str::from_utf8(key).expect("a key cut at ASCII bytes of UTF-8 text");
        let class = cache.classify_keyed(key_text, sql, write_functions);
        if self.entries.len() < MEMO_SIZE {
            self.entries.push((key.to_vec(), class));
        } else {
            self.entries[self.next] = (key.to_vec(), class);
            self.next = (self.next + 1) % MEMO_SIZE;
        }
        class
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.next = 0;
    }
}

impl ClassCache {
    /// Classifies `sql`, whose [`cache_key`] is `key`, through the cache.
    pub fn classify_keyed(&self, key: &str, sql: &str, write_functions: &[String]) -> Class {
        if let Some(c) = self.entries.lock().expect("cache lock").get(key) {
            return *c;
        }
        let class = classify(sql, write_functions);
        let mut entries = self.entries.lock().expect("cache lock");
        if entries.len() >= CACHE_LIMIT {
            entries.clear();
        }
        entries.insert(key.to_string(), class);
        class
    }

    /// Forgets everything (after a reload changed `write_functions`).
    pub fn clear(&self) {
        self.entries.lock().expect("cache lock").clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn c(sql: &str) -> Class {
        classify(sql, &["audit".to_string()])
    }

    #[test]
    fn a_set_among_the_parts_of_a_string_is_noticed() {
        let s = |sql: &str| sets_session_in_parts(sql.as_bytes());
        assert!(s("UPDATE t SET v = 1; SET application_name = 'x'"));
        assert!(s("SELECT 1;\n  reset work_mem;"));
        assert!(s("discard all; select 1"));
        assert!(!s("UPDATE t SET v = 1 WHERE id = 2"), "one statement");
        assert!(!s("UPDATE t SET v = 1; SELECT settings FROM t"));
    }

    #[test]
    fn a_reset_of_one_setting_is_told_apart_from_other_statements() {
        let reset = |name: &str, tag| Some((name.to_string(), tag));
        assert_eq!(
            setting_reset("RESET application_name"),
            reset("application_name", "RESET")
        );
        assert_eq!(
            setting_reset(" reset  Work_Mem ;"),
            reset("work_mem", "RESET")
        );
        assert_eq!(
            setting_reset("SET application_name TO DEFAULT"),
            reset("application_name", "SET")
        );
        assert_eq!(
            setting_reset("set session work_mem = default"),
            reset("work_mem", "SET")
        );
        assert_eq!(setting_reset("RESET ALL"), None);
        assert_eq!(setting_reset("RESET SESSION AUTHORIZATION"), None);
        assert_eq!(setting_reset("SET LOCAL work_mem TO DEFAULT"), None);
        assert_eq!(
            setting_reset("SET work_mem = 'default'"),
            None,
            "a quoted value"
        );
        assert_eq!(setting_reset("SET work_mem = '4MB'"), None);
    }

    #[test]
    fn a_reset_among_the_parts_of_a_string_is_noticed() {
        let r = |sql: &str| may_reset_in_parts(sql.as_bytes());
        assert!(r("RESET application_name; SELECT 1"));
        assert!(r("SELECT 1;\n  reset all"));
        assert!(r("SET work_mem TO DEFAULT; SELECT 1"));
        assert!(r("select 1; discard plans"));
        assert!(
            !r("RESET application_name"),
            "one statement is sent as the startup value"
        );
        assert!(!r("SET application_name = 'x'; SELECT 1"));
        assert!(!r("UPDATE t SET v = 1; SELECT 2"));
    }

    #[test]
    fn plain_reads_go_to_replicas() {
        assert_eq!(c("SELECT 1"), Class::Read);
        assert_eq!(c("select * from t where id = $1"), Class::Read);
        assert_eq!(c("SELECT a FROM t; SELECT b FROM u"), Class::Read);
        assert_eq!(c("WITH x AS (SELECT 1) SELECT * FROM x"), Class::Read);
        assert_eq!(c("SHOW server_version"), Class::Read);
        assert_eq!(c("COPY t TO STDOUT"), Class::Read);
        assert_eq!(c("select updated_at from t"), Class::Read);
    }

    #[test]
    fn anything_that_may_write_goes_to_the_primary() {
        for sql in [
            "INSERT INTO t VALUES (1)",
            "SELECT 1; DELETE FROM t",
            "SELECT nextval('s')",
            "select pg_advisory_lock(1)",
            "SELECT * FROM t FOR UPDATE",
            "SELECT * FROM t for  no key update",
            "WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d",
            "SELECT * INTO new_t FROM t",
            "SELECT audit(1)",
            "SELECT public.setval('s', 1)",
            "CREATE TABLE x (a int)",
            "COPY t FROM STDIN",
            "this is not sql",
            "WAIT FOR LSN '0/1'",
        ] {
            assert_eq!(c(sql), Class::Write, "{sql}");
        }
    }

    #[test]
    fn transactions_session_state_and_local_commands() {
        assert_eq!(c("BEGIN"), Class::Begin { read_only: false });
        assert_eq!(c("BEGIN READ ONLY"), Class::Begin { read_only: true });
        assert_eq!(
            c("START TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"),
            Class::Begin { read_only: true }
        );
        assert_eq!(c("COMMIT"), Class::TransactionControl);
        for local in [
            "SAVEPOINT sp1",
            "release savepoint sp1;",
            "SET LOCAL work_mem = '3MB'",
            "set  local statement_timeout to 5",
            "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
            "SET CONSTRAINTS ALL DEFERRED",
        ] {
            assert_eq!(c(local), Class::TransactionLocal, "{local}");
        }
        // Among other statements, the string is judged by all of them.
        assert_eq!(
            c("SET LOCAL work_mem = '3MB'; INSERT INTO t VALUES (1)"),
            Class::SessionState
        );
        assert_eq!(c("SAVEPOINT a; INSERT INTO t VALUES (1)"), Class::Write);
        assert_eq!(c("SET search_path = app"), Class::SessionState);
        assert_eq!(
            c("SELECT pg_catalog.set_config('search_path', 'app', false)"),
            Class::SessionState
        );
        assert_eq!(c("SELECT current_setting('search_path')"), Class::Read);
        assert_eq!(
            c("SELECT set_config('a.b', 'x,(y)', is_local => false)"),
            Class::SessionState
        );
        for local in [
            "SELECT set_config('request.jwt.claims', '{\"a\": 1}', true)",
            "select set_config('role', 'x', TRUE), set_config('a.b', format('%s', 1), true)",
        ] {
            assert_ne!(c(local), Class::SessionState, "{local}");
        }
        assert_eq!(c("LISTEN jobs"), Class::Pin);
        assert_eq!(c("PREPARE q AS SELECT 1"), Class::Pin);
        let cmd = |name: &str, verb: Verb| {
            Some(LocalCommand {
                name: name.into(),
                verb,
            })
        };
        assert_eq!(
            local_command("SET lsngate.route = primary;"),
            cmd("route", Verb::Set("primary".into()))
        );
        assert_eq!(
            local_command("set session lsngate.min_lsn to '0/1'"),
            cmd("min_lsn", Verb::Set("'0/1'".into()))
        );
        assert_eq!(
            local_command("RESET lsngate.route"),
            cmd("route", Verb::Reset)
        );
        assert_eq!(
            local_command("SET lsngate.consistency TO DEFAULT"),
            cmd("consistency", Verb::Reset)
        );
        assert_eq!(
            local_command("SHOW lsngate.commit_lsn"),
            cmd("commit_lsn", Verb::Show)
        );
        assert_eq!(local_command("SET search_path = x"), None);
        assert_eq!(local_command("SHOW lsngate.route extra"), None);
        assert_eq!(comment_hints("/*/ SELECT lsngate"), None);
        let (hints, rest) = comment_hints("/* lsngate:route=primary */ SELECT 1").unwrap();
        assert_eq!(
            (hints.route, rest.trim()),
            (Some(RouteHint::Primary), "SELECT 1")
        );
        let (hints, rest) =
            comment_hints("SELECT 1 /*lsngate_min_lsn='0%2F3F8A120',lsngate_route='replica'*/")
                .unwrap();
        assert_eq!(hints.min_lsn.as_deref(), Some("0/3F8A120"));
        assert_eq!(hints.route, Some(RouteHint::Replica));
        assert_eq!(rest.trim(), "SELECT 1");
        assert_eq!(
            comment_hints("SELECT '/* lsngate:route=replica */' /*controller='x'*/"),
            None,
            "hints inside literals and foreign sqlcommenter keys are left alone"
        );
        assert_eq!(
            session_set("SET search_path TO app, public"),
            Some(("search_path".into(), "app, public".into()))
        );
        assert_eq!(
            session_set("set application_name = 'x'"),
            Some(("application_name".into(), "'x'".into()))
        );
        assert_eq!(session_set("SET LOCAL work_mem = '1MB'"), None);
    }

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

    /// What the pass-through must get from `classify_query`: the class, only for text with no
    /// NUL, no mention of lsngate and valid UTF-8.
    fn expected_query_class(text: &[u8]) -> Option<Class> {
        let sql = std::str::from_utf8(text).ok()?;
        (!text.contains(&0) && !mentions_lsngate(text)).then(|| classify(sql, &[]))
    }

    #[test]
    fn the_pass_through_scan_refuses_nul_lsngate_and_bad_utf8_wherever_they_are() {
        let cache = ClassCache::default();
        let mut memo = ClassMemo::default();
        for (text, expected) in [
            (
                &b"SELECT abalance FROM pgbench_accounts WHERE aid = 12345"[..],
                Some(Class::Read),
            ),
            (
                b"UPDATE t SET a = 'caf\xc3\xa9' WHERE id = 1",
                Some(Class::Write),
            ),
            (b"SELECT 1 \0 x", None),
            (b"SELECT '\0'", None),
            (b"SELECT \"a\0\"", None),
            (b"SET LSNGATE.route = primary", None),
            (b"/* lsngate:route=replica */ SELECT 1", None),
            (b"SELECT 'lsngate'", None),
            (b"SELECT \"LsnGate\" FROM t", None),
            (b"SELECT 1 -- lsngate", None),
            (b"SELECT $1 -- lsngate", None),
            (b"SELECT '\xff'", None),
            (b"SELECT \xff", None),
            (b"SELECT \"\xff\"", None),
            (b"SELECT E'\xff'", None),
            (b"SELECT 'l', lsn FROM lag", Some(Class::Read)),
        ] {
            assert_eq!(
                memo.classify_query(&cache, text, &[]),
                expected,
                "{:?}",
                String::from_utf8_lossy(text)
            );
            assert_eq!(
                expected_query_class(text),
                expected,
                "{:?}",
                String::from_utf8_lossy(text)
            );
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

        #[test]
        fn the_pass_through_scan_agrees_with_checking_separately(
            text in proptest::collection::vec(prop::sample::select(b"SELECT lsngate L'\"$-/*\\0 1\x00\xc3\xa9\xff;=".to_vec()), 0..50)
        ) {
            let cache = ClassCache::default();
            let mut memo = ClassMemo::default();
            prop_assert_eq!(memo.classify_query(&cache, &text, &[]), expected_query_class(&text));
            // And again through the memo.
            prop_assert_eq!(memo.classify_query(&cache, &text, &[]), expected_query_class(&text));
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

        #[test]
        fn classification_never_panics(sql in ".{0,200}") {
            let _ = classify(&sql, &[]);
            let _ = local_command(&sql);
            let _ = comment_hints(&sql);
            let _ = session_set(&sql);
            let _ = cache_key(&sql);
        }
    }
}
