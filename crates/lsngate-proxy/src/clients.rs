//! The clients connected right now, for the admin console: who logged in to which database,
//! from where and since when (`SHOW CLIENTS`), whether a statement of theirs is on a server
//! (their cancel slot says), and the switch that ends one (`KILL_CLIENT`, `KILL`). A session
//! registers after its login and is removed when it ends; nothing here runs per statement.

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

impl Clients {
    /// Registers a client that logged in.
    pub fn register(&self, client: NewClient) -> Registered<'_> {
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
        self.connected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, Arc::clone(&entry));
        Registered {
            clients: self,
            entry,
        }
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
