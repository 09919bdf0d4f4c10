//! The classification caches. Classifying runs the SQL parser, far too slow to run for every
//! statement, while an application sends the same few statement shapes over and over: a shared
//! bounded map from cache key to class (`ClassCache`, on the proxy), and in front of it a
//! session's last few answers (`ClassMemo`), which take no lock and allocate nothing on a hit.
//! Both are emptied when a reload may change `write_functions`.

use std::collections::HashMap;
use std::sync::Mutex;

use super::class::{Class, classify};
use super::key::{Noticed, Scan, mentions_lsngate, scan_key};

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
    /// Classifies `sql`, whose [`cache_key`](super::cache_key) is `key`, through the cache.
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
        fn the_pass_through_scan_agrees_with_checking_separately(
            text in proptest::collection::vec(prop::sample::select(b"SELECT lsngate L'\"$-/*\\0 1\x00\xc3\xa9\xff;=".to_vec()), 0..50)
        ) {
            let cache = ClassCache::default();
            let mut memo = ClassMemo::default();
            prop_assert_eq!(memo.classify_query(&cache, &text, &[]), expected_query_class(&text));
            // And again through the memo.
            prop_assert_eq!(memo.classify_query(&cache, &text, &[]), expected_query_class(&text));
        }

    }
}
