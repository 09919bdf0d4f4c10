//! The PostgreSQL protocol-3 message codec: bytes in, frames out, nothing else. No sockets, no
//! state beyond the caller's buffer, so the decoder can be fuzzed and property-tested. It is not a
//! client or a server: sessions in `frontend/` and connections in `backend/` drive it.
//!
//! Every decoder takes the caller's `BytesMut`, returns `Ok(None)` while a message is incomplete
//! and consumes bytes only when it returns a whole message. A declared length below the minimum or
//! above the configured limit is an error for that connection only — the caller closes it.

pub mod backend;
pub mod error_fields;
pub mod frontend;
pub mod sqlstate;
pub mod startup;

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub use backend::BackendMessage;
pub use error_fields::ErrorFields;
pub use frontend::FrontendMessage;
pub use startup::StartupFrame;

/// Default ceiling for one message (bytes, length word included). PostgreSQL itself accepts up
/// to 1 GiB for some messages; a proxy that buffers flights wants a tighter default.
pub const DEFAULT_MAX_MESSAGE_LEN: usize = 64 * 1024 * 1024;

/// What can be wrong with bytes a peer sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[allow(missing_docs)] // variant fields are described by the variant docs
pub enum ProtocolError {
    /// The length word is below 4 (it counts itself) or otherwise impossible.
    #[error(
        "message '{tag}' declares length {len}, below the minimum of 4: the peer is not speaking PostgreSQL protocol 3"
    )]
    LengthTooSmall { tag: char, len: u32 },
    /// The message is larger than the configured limit.
    #[error(
        "message '{tag}' of {len} bytes exceeds the limit of {limit} bytes; raise max_message_size if this client is legitimate"
    )]
    TooLarge { tag: char, len: usize, limit: usize },
    /// The tag byte names no message this side of the protocol may send.
    #[error("unknown message type '{}' (0x{:02x}); the client is not speaking PostgreSQL protocol 3", *.0 as char, .0)]
    UnknownTag(u8),
    /// The body of a known message does not match its format.
    #[error("malformed '{tag}' message: {why}")]
    Malformed { tag: char, why: &'static str },
    /// The startup packet asks for a protocol this proxy does not speak.
    #[error(
        "unsupported protocol version {major}.{minor}; lsngate speaks protocol 3.0 (and accepts 3.2 as 3.0)"
    )]
    UnsupportedVersion { major: u16, minor: u16 },
}

/// One tagged message: the tag byte and the body after the length word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The message type byte, e.g. `b'Q'`.
    pub tag: u8,
    /// The message body, without tag and length.
    pub body: Bytes,
}

impl Frame {
    /// A frame from a tag and a body.
    pub fn new(tag: u8, body: impl Into<Bytes>) -> Frame {
        Frame {
            tag,
            body: body.into(),
        }
    }

    /// Appends the wire form (tag, length, body) to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        out.reserve(5 + self.body.len());
        out.put_u8(self.tag);
        out.put_u32((self.body.len() + 4) as u32);
        out.put_slice(&self.body);
    }

    /// The wire form as fresh bytes.
    pub fn to_bytes(&self) -> Bytes {
        let mut out = BytesMut::new();
        self.encode(&mut out);
        out.freeze()
    }
}

/// Takes one tagged message off the front of `buf` when it is complete.
pub fn decode_frame(buf: &mut BytesMut, max_len: usize) -> Result<Option<Frame>, ProtocolError> {
    let Some(whole) = whole_frame(buf, max_len)? else {
        return Ok(None);
    };
    let tag = buf[0];
    buf.advance(5);
    let body = buf.split_to(whole - 5).freeze();
    Ok(Some(Frame { tag, body }))
}

/// The length (tag and length field included) of the message at the front of `buf` when all of
/// it is there; None while more must be read (room for it is reserved). The same checks as
/// [`decode_frame`], without taking the message out.
pub fn whole_frame(buf: &mut BytesMut, max_len: usize) -> Result<Option<usize>, ProtocolError> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let tag = buf[0];
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
    if len < 4 {
        return Err(ProtocolError::LengthTooSmall {
            tag: tag as char,
            len,
        });
    }
    let len = len as usize;
    if len + 1 > max_len {
        return Err(ProtocolError::TooLarge {
            tag: tag as char,
            len,
            limit: max_len,
        });
    }
    if buf.len() < len + 1 {
        buf.reserve(len + 1 - buf.len());
        return Ok(None);
    }
    Ok(Some(len + 1))
}

/// Makes room for the next read into `buf`. A read buffer is consumed from the front, so the room
/// left at its end shrinks with every message; a read into a few bytes of room returns part of a
/// message and costs a second read for the rest. Below 2 KiB of room, the consumed front is
/// reclaimed (the unread bytes, usually none, move to the start) or the buffer grows.
pub fn room_to_read(buf: &mut BytesMut) {
    if buf.capacity() - buf.len() < 2 * 1024 {
        buf.reserve(8 * 1024);
    }
}

/// A cursor over a message body that reads PostgreSQL's field types.
pub(crate) struct Fields<'a> {
    tag: u8,
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    pub(crate) fn new(tag: u8, body: &'a [u8]) -> Fields<'a> {
        Fields { tag, rest: body }
    }

    fn malformed(&self, why: &'static str) -> ProtocolError {
        ProtocolError::Malformed {
            tag: self.tag as char,
            why,
        }
    }

    /// A NUL-terminated string (must be UTF-8).
    pub(crate) fn cstr(&mut self) -> Result<&'a str, ProtocolError> {
        // memchr: a byte-at-a-time search showed under callgrind for every query text.
        let end = memchr::memchr(0, self.rest)
            .ok_or_else(|| self.malformed("string without NUL terminator"))?;
        let s = std::str::from_utf8(&self.rest[..end])
            .map_err(|_| {
                self.malformed(
                    "string is not UTF-8: lsngate relays client_encoding UTF8 only; connect with client_encoding=UTF8",
                )
            })?;
        self.rest = &self.rest[end + 1..];
        Ok(s)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, ProtocolError> {
        let (&b, rest) = self
            .rest
            .split_first()
            .ok_or(self.malformed("truncated byte"))?;
        self.rest = rest;
        Ok(b)
    }

    pub(crate) fn i16(&mut self) -> Result<i16, ProtocolError> {
        let bytes = self.take(2)?;
        Ok(i16::from_be_bytes([bytes[0], bytes[1]]))
    }

    pub(crate) fn i32(&mut self) -> Result<i32, ProtocolError> {
        let bytes = self.take(4)?;
        Ok(i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], ProtocolError> {
        if self.rest.len() < n {
            return Err(self.malformed("truncated field"));
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    pub(crate) fn rest(&self) -> &'a [u8] {
        self.rest
    }

    pub(crate) fn finish(&self) -> Result<(), ProtocolError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(self.malformed("trailing bytes after the last field"))
        }
    }
}

/// Whether two strings off the wire are equal — statement and portal names, parameter values —
/// without handing glibc's `memcmp` an empty string. An empty `String` points at the dangling
/// address 1, and `str`'s `==` calls `memcmp` even for length 0: glibc's AVX-512 `memcmp` then
/// issues a masked load from that unmapped page, which the CPU completes through a
/// fault-suppression assist. On the Xeon this was measured on, one such comparison took 119 ns
/// against 2.5 ns for one byte, and the unnamed statement and portal (`""`) are what most
/// drivers use: before this, `memcmp` was 12% of the proxy's CPU under pgbench.
/// The same holds for any slice of integers (a Parse's parameter types): see [`same`].
#[inline]
pub fn same_text(a: &str, b: &str) -> bool {
    same(a.as_bytes(), b.as_bytes())
}

/// Slice equality that never calls `memcmp` for two empty slices (see [`same_text`]).
#[inline]
pub fn same<T: PartialEq>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len() && (a.is_empty() || a == b)
}

/// A map key for a name off the wire, compared with [`same_text`].
#[derive(Debug, Clone, Copy, Eq)]
pub struct NameKey<'a>(pub &'a str);

impl PartialEq for NameKey<'_> {
    fn eq(&self, other: &Self) -> bool {
        same_text(self.0, other.0)
    }
}

/// Hashes and compares as the `str` it holds, so a map keyed by `NameKey`s is searched with a
/// `&str` of any lifetime.
impl std::borrow::Borrow<str> for NameKey<'_> {
    fn borrow(&self) -> &str {
        self.0
    }
}

impl std::hash::Hash for NameKey<'_> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state)
    }
}

/// Names off the wire mapped to values for one flight (the portals it binds, the statements it
/// defines). A flight names one or a few (drivers bind and execute the unnamed portal), so the
/// entries are kept inline and found with [`same_text`]: no hashing, and no allocation for the
/// first four. Past [`NameMap::SPILL`] entries (a pipeline naming many portals) a
/// hash map takes over, so a long flight stays linear. Replaced per-flight `HashMap`s that
/// callgrind showed hashing and rehashing on every flight (2026-12-06).
#[derive(Debug)]
pub struct NameMap<'a, V> {
    small: smallvec::SmallVec<[(&'a str, V); 4]>,
    large: Option<std::collections::HashMap<NameKey<'a>, V>>,
}

impl<V> Default for NameMap<'_, V> {
    fn default() -> Self {
        NameMap {
            small: smallvec::SmallVec::new(),
            large: None,
        }
    }
}

impl<'a, V> NameMap<'a, V> {
    /// Entries kept in the vector before the map switches to hashing.
    pub const SPILL: usize = 16;

    /// The value under `name`.
    pub fn get(&self, name: &str) -> Option<&V> {
        match &self.large {
            Some(map) => map.get(name),
            None => self
                .small
                .iter()
                .find(|(n, _)| same_text(n, name))
                .map(|(_, v)| v),
        }
    }

    /// Whether there is a value under `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Sets the value under `name`, replacing the one there.
    pub fn insert(&mut self, name: &'a str, value: V) {
        if let Some(map) = &mut self.large {
            map.insert(NameKey(name), value);
            return;
        }
        if let Some(entry) = self.small.iter_mut().find(|(n, _)| same_text(n, name)) {
            entry.1 = value;
            return;
        }
        if self.small.len() < Self::SPILL {
            self.small.push((name, value));
            return;
        }
        let mut map: std::collections::HashMap<NameKey<'a>, V> =
            self.small.drain(..).map(|(n, v)| (NameKey(n), v)).collect();
        map.insert(NameKey(name), value);
        self.large = Some(map);
    }

    /// Keeps the entries `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(&str, &V) -> bool) {
        match &mut self.large {
            Some(map) => map.retain(|n, v| keep(n.0, v)),
            None => self.small.retain(|(n, v)| keep(n, v)),
        }
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> Box<dyn Iterator<Item = (&'a str, &V)> + '_> {
        match &self.large {
            Some(map) => Box::new(map.iter().map(|(n, v)| (n.0, v))),
            None => Box::new(self.small.iter().map(|(n, v)| (*n, v))),
        }
    }
}

/// Appends a NUL-terminated string.
pub(crate) fn put_cstr(out: &mut BytesMut, s: &str) {
    out.put_slice(s.as_bytes());
    out.put_u8(0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// `same_text` is `==`, and a `NameKey` map finds what a `&str` map finds, empty
        /// names (a `String::new()`, dangling pointer and all) included.
        #[test]
        fn same_text_is_equality(a in "[ab]{0,3}", b in "[ab]{0,3}") {
            let (a, b) = (a.clone(), b.clone());
            prop_assert_eq!(same_text(&a, &b), a == b);
            prop_assert_eq!(same(a.as_bytes(), b.as_bytes()), a == b);
            let map: std::collections::HashMap<NameKey<'_>, u8> = [(NameKey(a.as_str()), 1)].into();
            prop_assert_eq!(map.contains_key(&NameKey(&b)), a == b);
        }
    }

    proptest::proptest! {
        /// A `NameMap` answers as a `HashMap` does, before and after it spills into one.
        #[test]
        fn a_name_map_is_a_map(ops in proptest::collection::vec((0u8..3, 0usize..40, 0u8..9), 0..120)) {
            let names: Vec<String> = (0..40).map(|i| if i == 0 { String::new() } else { format!("p{i}") }).collect();
            let mut map = NameMap::default();
            let mut model = std::collections::HashMap::new();
            for (op, name, value) in ops {
                let name = names[name].as_str();
                match op {
                    0 => {
                        map.insert(name, value);
                        model.insert(name, value);
                    }
                    1 => {
                        map.retain(|_, v| *v != value);
                        model.retain(|_, v| *v != value);
                    }
                    _ => prop_assert_eq!(map.get(name), model.get(name)),
                }
                prop_assert_eq!(map.contains(name), model.contains_key(name));
            }
            let mut entries: Vec<(&str, u8)> = map.iter().map(|(n, v)| (n, *v)).collect();
            let mut expected: Vec<(&str, u8)> = model.into_iter().collect();
            entries.sort_unstable();
            expected.sort_unstable();
            prop_assert_eq!(entries, expected);
        }
    }

    #[test]
    fn empty_strings_from_anywhere_are_the_same_text() {
        let parsed = String::from_utf8(Vec::new()).unwrap();
        for empty in [String::new(), String::with_capacity(8), parsed] {
            assert!(same_text(&empty, ""));
            assert!(same_text("", &empty));
            assert!(!same_text(&empty, "x"));
        }
        assert!(same::<u32>(&[], &Vec::new()));
        assert!(!same(&[23u32][..], &[]));
    }

    #[test]
    fn incomplete_frame_waits_and_consumes_nothing() {
        let mut buf = BytesMut::from(&b"Q\x00\x00\x00\x09SEL"[..]);
        assert_eq!(decode_frame(&mut buf, 1024).unwrap(), None);
        assert_eq!(buf.len(), 8);
        buf.extend_from_slice(b"\0\0");
        let frame = decode_frame(&mut buf, 1024).unwrap().unwrap();
        assert_eq!(frame.tag, b'Q');
        assert_eq!(&frame.body[..], b"SEL\0\0");
    }

    #[test]
    fn oversized_and_undersized_lengths_are_errors() {
        let mut buf = BytesMut::from(&b"Q\x7f\xff\xff\xff"[..]);
        assert!(matches!(
            decode_frame(&mut buf, 1024),
            Err(ProtocolError::TooLarge { .. })
        ));
        let mut buf = BytesMut::from(&b"Q\x00\x00\x00\x02"[..]);
        assert!(matches!(
            decode_frame(&mut buf, 1024),
            Err(ProtocolError::LengthTooSmall { .. })
        ));
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            // Same property as the cargo-fuzz target in crates/lsngate-proxy/fuzz.
            let mut buf = BytesMut::from(&bytes[..]);
            let _ = startup::decode_startup(&mut buf.clone(), 1024);
            while let Ok(Some(frame)) = decode_frame(&mut buf, 1024) {
                if let Ok(message) = FrontendMessage::parse(&frame) {
                    prop_assert_eq!(FrontendMessage::parse(&message.to_frame()).ok(), Some(message));
                }
                let _ = BackendMessage::parse(&frame);
            }
        }

        #[test]
        fn frames_round_trip(tag in any::<u8>(), body in proptest::collection::vec(any::<u8>(), 0..300)) {
            let frame = Frame::new(tag, body);
            let mut buf = BytesMut::from(&frame.to_bytes()[..]);
            prop_assert_eq!(decode_frame(&mut buf, 4096).unwrap(), Some(frame));
            prop_assert!(buf.is_empty());
        }
    }
}
