//! Which databases the admin console paused or disabled (`PAUSE`/`RESUME`, `DISABLE`/`ENABLE`).
//! A pause is carried out by the pools (a paused pool lends no slot, so checkouts queue); this
//! keeps the decision so that a pool made after the `PAUSE` is paused too. A disabled database
//! refuses new logins; the handshake asks here. State only: the commands are the console's.

use std::collections::BTreeSet;
use std::sync::Mutex;

/// Databases held by PAUSE (or all of them) and refused by DISABLE.
#[derive(Debug, Default)]
pub struct Gates {
    state: Mutex<GateState>,
}

#[derive(Debug, Default)]
struct GateState {
    /// `PAUSE` without a database: every database, present and future.
    all_paused: bool,
    paused: BTreeSet<String>,
    disabled: BTreeSet<String>,
}

impl Gates {
    fn state(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a PAUSE of `database` (None: every database).
    pub fn pause(&self, database: Option<&str>) {
        let mut state = self.state();
        match database {
            Some(db) => {
                state.paused.insert(db.to_string());
            }
            None => state.all_paused = true,
        }
    }

    /// Records a RESUME of `database` (None: every database, including those paused by name).
    pub fn resume(&self, database: Option<&str>) {
        let mut state = self.state();
        match database {
            Some(db) => {
                state.paused.remove(db);
            }
            None => {
                state.all_paused = false;
                state.paused.clear();
            }
        }
    }

    /// Whether new transactions on `database` must wait.
    pub fn is_paused(&self, database: &str) -> bool {
        let state = self.state();
        state.all_paused || state.paused.contains(database)
    }

    /// Whether PAUSE without a database is in force.
    pub fn all_paused(&self) -> bool {
        self.state().all_paused
    }

    /// DISABLE (true) or ENABLE (false) logins to `database`.
    pub fn set_disabled(&self, database: &str, disabled: bool) {
        let mut state = self.state();
        if disabled {
            state.disabled.insert(database.to_string());
        } else {
            state.disabled.remove(database);
        }
    }

    /// Whether logins to `database` are refused.
    pub fn is_disabled(&self, database: &str) -> bool {
        self.state().disabled.contains(database)
    }

    /// Databases named in a PAUSE or DISABLE, for SHOW DATABASES.
    pub fn named(&self) -> Vec<String> {
        let state = self.state();
        state.paused.union(&state.disabled).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_of_all_covers_every_database_until_resumed() {
        let gates = Gates::default();
        gates.pause(Some("a"));
        assert!(gates.is_paused("a") && !gates.is_paused("b"));
        gates.pause(None);
        assert!(gates.is_paused("b"));
        gates.resume(Some("a"));
        assert!(
            gates.is_paused("a"),
            "still under the PAUSE of every database"
        );
        gates.resume(None);
        assert!(!gates.is_paused("a") && !gates.is_paused("b"));
        gates.set_disabled("a", true);
        assert!(gates.is_disabled("a") && !gates.is_disabled("b"));
        gates.set_disabled("a", false);
        assert!(!gates.is_disabled("a"));
    }
}
