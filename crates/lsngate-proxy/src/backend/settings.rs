//! Session settings, interned. A client's settings are compared with its server connection's on
//! every statement; the sets themselves change only on SET, RESET or a read-back. So every
//! distinct set exists once in the process (equal contents share one allocation), and the
//! comparison is a pointer comparison; each change pays for a lookup in the intern table instead.

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;
use std::sync::{Arc, LazyLock, Mutex, Weak};

type Map = BTreeMap<String, String>;

/// Session settings: name → the statement that gives the setting its value (`SET name = value`
/// as the client wrote it, or a `set_config` call for a startup parameter, which PostgreSQL parses
/// like the server does at startup, lists included). Two `Settings` are equal exactly when they
/// hold the same statements.
#[derive(Clone)]
pub struct Settings(Arc<Map>);

/// Every live set of settings, by hash of its contents.
struct Interned {
    sets: HashMap<u64, Vec<Weak<Map>>>,
    hasher: std::hash::RandomState,
    /// Entries at which the next sweep of dead sets runs.
    sweep_at: usize,
    entries: usize,
}

static INTERNED: LazyLock<Mutex<Interned>> = LazyLock::new(|| {
    Mutex::new(Interned {
        sets: HashMap::new(),
        hasher: std::hash::RandomState::new(),
        sweep_at: 64,
        entries: 0,
    })
});

static EMPTY: LazyLock<Settings> = LazyLock::new(|| Settings::intern(Map::new()));

impl Settings {
    /// No settings.
    pub fn new() -> Settings {
        EMPTY.clone()
    }

    /// The one shared copy of `map`.
    fn intern(map: Map) -> Settings {
        let mut interned = INTERNED.lock().expect("settings intern lock");
        let hash = interned.hasher.hash_one(&map);
        if let Some(live) = interned
            .sets
            .get(&hash)
            .into_iter()
            .flatten()
            .filter_map(Weak::upgrade)
            .find(|live| **live == map)
        {
            return Settings(live);
        }
        if interned.entries >= interned.sweep_at {
            interned.sets.retain(|_, sets| {
                sets.retain(|w| w.strong_count() > 0);
                !sets.is_empty()
            });
            interned.entries = interned.sets.values().map(Vec::len).sum();
            interned.sweep_at = (interned.entries * 2).max(64);
        }
        let set = Arc::new(map);
        interned
            .sets
            .entry(hash)
            .or_default()
            .push(Arc::downgrade(&set));
        interned.entries += 1;
        Settings(set)
    }

    /// A changed copy.
    fn changed(&mut self, change: impl FnOnce(&mut Map)) {
        let mut map = (*self.0).clone();
        change(&mut map);
        if map != *self.0 {
            *self = Settings::intern(map);
        }
    }

    /// The statement that set `name`.
    pub fn get(&self, name: &str) -> Option<&String> {
        self.0.get(name)
    }

    /// Whether `name` is set.
    pub fn contains_key(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    /// The names set, in order.
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.keys()
    }

    /// (name, statement) pairs, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &String)> {
        self.0.iter()
    }

    /// How many settings are set.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Sets `name` by `statement`.
    pub fn insert(&mut self, name: String, statement: String) {
        if self.get(&name) != Some(&statement) {
            self.changed(|map| {
                map.insert(name, statement);
            });
        }
    }

    /// Unsets `name`.
    pub fn remove(&mut self, name: &str) {
        if self.contains_key(name) {
            self.changed(|map| {
                map.remove(name);
            });
        }
    }

    /// Unsets everything.
    pub fn clear(&mut self) {
        *self = Settings::new();
    }
}

impl Default for Settings {
    fn default() -> Settings {
        Settings::new()
    }
}

impl PartialEq for Settings {
    /// Interned: the same contents are the same allocation.
    fn eq(&self, other: &Settings) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Settings {}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl FromIterator<(String, String)> for Settings {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(pairs: I) -> Settings {
        Settings::intern(pairs.into_iter().collect())
    }
}

impl<const N: usize> From<[(String, String); N]> for Settings {
    fn from(pairs: [(String, String); N]) -> Settings {
        pairs.into_iter().collect()
    }
}

impl<'a> IntoIterator for &'a Settings {
    type Item = (&'a String, &'a String);
    type IntoIter = std::collections::btree_map::Iter<'a, String, String>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(pairs: &[(&str, &str)]) -> Settings {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn equal_exactly_when_the_statements_are() {
        let a = set(&[("search_path", "SET search_path = a")]);
        let mut b = Settings::new();
        assert_ne!(a, b);
        b.insert("search_path".into(), "SET search_path = a".into());
        assert_eq!(a, b, "built two ways, one set");
        b.insert("work_mem".into(), "SET work_mem = '8MB'".into());
        assert_ne!(a, b);
        b.remove("work_mem");
        assert_eq!(a, b);
        b.insert("search_path".into(), "SET search_path = b".into());
        assert_ne!(a, b, "same names, other statement");
        b.clear();
        assert_eq!(b, Settings::new());
        assert!(b.is_empty() && a.len() == 1);
    }

    #[test]
    fn dead_sets_are_swept_and_live_ones_kept() {
        let kept = set(&[("application_name", "SET application_name = kept")]);
        for i in 0..1000 {
            let _ = set(&[("application_name", &format!("SET application_name = x{i}"))]);
        }
        let entries = INTERNED.lock().unwrap().entries;
        assert!(entries < 1000, "dead sets were swept: {entries} entries");
        assert_eq!(
            kept,
            set(&[("application_name", "SET application_name = kept")])
        );
    }

    #[test]
    fn agrees_with_comparing_the_contents() {
        use proptest::prelude::*;
        let pairs = proptest::collection::vec(("[ab]{1,2}", "[xy]{0,2}"), 0..4);
        proptest!(|(a in pairs.clone(), b in pairs)| {
            let map_a: Map = a.iter().cloned().collect();
            let map_b: Map = b.iter().cloned().collect();
            let (sa, sb): (Settings, Settings) = (a.into_iter().collect(), b.into_iter().collect());
            prop_assert_eq!(sa == sb, map_a == map_b);
        });
    }
}
