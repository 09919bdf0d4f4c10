//! The clients connected right now, for the admin console: who logged in to which database,
//! from where and since when (`SHOW CLIENTS`), whether a statement of theirs is on a server
//! (their cancel slot says), and the switch that ends one (`KILL_CLIENT`, `KILL`). A session
//! registers after its login and is removed when it ends; nothing here runs per statement.
//! Registering is also where the per-database and per-user client limits
//! (`max_db_client_connections`, `max_user_client_connections`) are held: the count and the
//! insert happen under one lock, so two logins at once cannot both take the last place.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::proxy::CancelSlot;

/// One connected client.
#[derive(Debug)]
pub struct ClientEntry {
    /// Its number on the admin console (`SHOW CLIENTS` column `id`, `KILL_CLIENT id`).
    pub id: u64,
    /// Login name.
    pub user: String,
    /// Database it logged in to.
    pub database: String,
    /// Its address, and the proxy's address it connected to.
    pub peer: Option<SocketAddr>,
    /// The proxy's address it connected to.
    pub local: Option<SocketAddr>,
    /// When it logged in.
    pub connected_at: SystemTime,
    /// `application_name` from its startup packet.
    pub application_name: String,
    /// Whether the connection is TLS.
    pub tls: bool,
    /// Its cancel slot: a statement on a server while `target` is set.
    pub cancel: CancelSlot,
    /// Fired to end the session (`KILL_CLIENT`, `KILL`, a drain past its bound).
    pub kill: tokio::sync::Notify,
    /// Why it was ended, when not by a KILL (see [`ClientEntry::kill_message`]).
    ended_by: std::sync::OnceLock<&'static str>,
}

impl ClientEntry {
    /// The FATAL message a killed session sends (57P01).
    pub fn kill_message(&self) -> &'static str {
        self.ended_by
            .get()
            .copied()
            .unwrap_or("terminating connection due to a KILL on the lsngate admin console")
    }

    /// `active` while a statement of the client's runs on a server, else `idle`.
    pub fn state(&self) -> &'static str {
        let running = self
            .cancel
            .lock()
            .map(|slot| slot.target.is_some())
            .unwrap_or(false);
        if running { "active" } else { "idle" }
    }
}

/// Every connected client, by id.
#[derive(Debug, Default)]
pub struct Clients {
    next_id: AtomicU64,
    connected: Mutex<BTreeMap<u64, Arc<ClientEntry>>>,
}

/// What a client is registered with (its id is given by the registry).
#[derive(Debug)]
pub struct NewClient {
    /// Login name.
    pub user: String,
    /// Database.
    pub database: String,
    /// Its address.
    pub peer: Option<SocketAddr>,
    /// The proxy's address it reached.
    pub local: Option<SocketAddr>,
    /// `application_name` it sent.
    pub application_name: String,
    /// Over TLS.
    pub tls: bool,
    /// Its cancel slot.
    pub cancel: CancelSlot,
}

/// Removes a client from the registry when dropped (however its session ended).
#[derive(Debug)]
pub struct Registered<'a> {
    clients: &'a Clients,
    /// The entry.
    pub entry: Arc<ClientEntry>,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.clients
            .connected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.entry.id);
    }
}

/// Limits on the clients of one database and of one user; 0 = unlimited.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClientLimits {
    /// `max_db_client_connections`.
    pub per_database: usize,
    /// `max_user_client_connections`.
    pub per_user: usize,
}

/// A login refused by [`ClientLimits`], worded as PostgreSQL words its own limits (SQLSTATE
/// 53300), with the key that set it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverLimit {
    /// The database has `max_db_client_connections` clients already.
    #[error(
        "too many connections for database \"{database}\": max_db_client_connections = {limit} reached on lsngate"
    )]
    Database {
        /// The database.
        database: String,
        /// The limit.
        limit: usize,
    },
    /// The user has `max_user_client_connections` clients already.
    #[error(
        "too many connections for role \"{user}\": max_user_client_connections = {limit} reached on lsngate"
    )]
    User {
        /// The login name.
        user: String,
        /// The limit.
        limit: usize,
    },
}

impl ClientLimits {
    /// Whether one more client of `database` as `user` would go over a limit, given those
    /// connected (admin-console clients are not counted: the console is no pool).
    fn check<'a>(
        &self,
        connected: impl Iterator<Item = &'a ClientEntry> + Clone,
        user: &str,
        database: &str,
    ) -> Result<(), OverLimit> {
        if crate::config::is_console_database(database) {
            return Ok(());
        }
        let over = |limit: usize, count: usize| limit > 0 && count >= limit;
        let pooled = connected.filter(|c| !crate::config::is_console_database(&c.database));
        let of_database = pooled.clone().filter(|c| c.database == database).count();
        if over(self.per_database, of_database) {
            return Err(OverLimit::Database {
                database: database.to_string(),
                limit: self.per_database,
            });
        }
        if over(self.per_user, pooled.filter(|c| c.user == user).count()) {
            return Err(OverLimit::User {
                user: user.to_string(),
                limit: self.per_user,
            });
        }
        Ok(())
    }
}

impl Clients {
    /// Registers a client that logged in, unless it would go over `limits` (a client of the
    /// admin console never does).
    pub fn register_within(
        &self,
        client: NewClient,
        limits: ClientLimits,
    ) -> Result<Registered<'_>, OverLimit> {
        let mut connected = self.connected.lock().unwrap_or_else(|p| p.into_inner());
        limits.check(
            connected.values().map(|c| &**c),
            &client.user,
            &client.database,
        )?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let entry = Arc::new(ClientEntry {
            id,
            user: client.user,
            database: client.database,
            peer: client.peer,
            local: client.local,
            connected_at: SystemTime::now(),
            application_name: client.application_name,
            tls: client.tls,
            cancel: client.cancel,
            kill: tokio::sync::Notify::new(),
            ended_by: std::sync::OnceLock::new(),
        });
        connected.insert(id, Arc::clone(&entry));
        Ok(Registered {
            clients: self,
            entry,
        })
    }

    /// Every connected client, by id.
    pub fn all(&self) -> Vec<Arc<ClientEntry>> {
        self.connected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Ends every client, saying `why`; how many there were.
    pub fn end_all(&self, why: &'static str) -> usize {
        let all = self.all();
        for entry in &all {
            let _ = entry.ended_by.set(why);
            entry.kill.notify_one();
        }
        all.len()
    }

    /// Ends client `id`; false when there is none.
    pub fn kill(&self, id: u64) -> bool {
        let entry = self
            .connected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned();
        entry.inspect(|e| e.kill.notify_one()).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(user: &str, database: &str) -> NewClient {
        NewClient {
            user: user.into(),
            database: database.into(),
            peer: None,
            local: None,
            application_name: String::new(),
            tls: false,
            cancel: Default::default(),
        }
    }

    #[test]
    fn client_limits_count_per_database_and_per_user_and_free_on_leaving() {
        let clients = Clients::default();
        let limits = ClientLimits {
            per_database: 2,
            per_user: 3,
        };
        let a1 = clients.register_within(client("ann", "a"), limits).unwrap();
        let _a2 = clients.register_within(client("bob", "a"), limits).unwrap();
        assert_eq!(
            clients
                .register_within(client("cid", "a"), limits)
                .err()
                .unwrap()
                .to_string(),
            "too many connections for database \"a\": max_db_client_connections = 2 reached on lsngate"
        );
        let _b1 = clients.register_within(client("ann", "b"), limits).unwrap();
        let _c1 = clients.register_within(client("ann", "c"), limits).unwrap();
        assert_eq!(
            clients.register_within(client("ann", "d"), limits).err(),
            Some(OverLimit::User {
                user: "ann".into(),
                limit: 3
            })
        );
        // The console is no pool: its clients count for neither limit.
        let _console = clients
            .register_within(client("ann", "pgbouncer"), limits)
            .unwrap();
        drop(a1);
        assert!(clients.register_within(client("ann", "a"), limits).is_ok());
        assert!(
            clients
                .register_within(client("eve", "z"), ClientLimits::default())
                .is_ok()
        );
    }
}
