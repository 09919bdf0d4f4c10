//! The console commands that change things — PAUSE, RESUME, RECONNECT, DISABLE, ENABLE, KILL,
//! KILL_CLIENT, RELOAD, SHUTDOWN, SET — each carried out by the part of the proxy that owns
//! the state: the pools (pause, reconnect), the gates (pause, disable), the client registry
//! (kill), `Proxy::reload` (RELOAD, SET) and `Proxy::request_drain` (SHUTDOWN). Admin users only; the
//! caller checked.

use std::sync::Arc;
use std::time::Duration;

use super::{Answer, Command, settings};
use crate::config::is_console_database;
use crate::frontend::handshake::ConsoleLogin;
use crate::net::sqlstate;
use crate::proxy::Proxy;

/// How often a PAUSE looks whether the transactions in progress finished.
const PAUSE_POLL: Duration = Duration::from_millis(10);

fn done(tag: &'static str) -> Answer {
    Answer::Done {
        tag,
        notices: Vec::new(),
    }
}

fn refused(code: &'static str, message: String) -> Answer {
    Answer::Error(code, message)
}

/// The admin console itself cannot be paused, disabled or killed by name.
fn not_console(command: &str, database: Option<&str>) -> Result<(), Answer> {
    match database {
        Some(db) if is_console_database(db) => Err(refused(
            sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("{command} {db}: \"{db}\" is the admin console, not a database of the servers"),
        )),
        _ => Ok(()),
    }
}

/// Runs one control command.
pub async fn run(proxy: &Arc<Proxy>, login: &ConsoleLogin, command: Command) -> Answer {
    match command {
        Command::Show(_) => unreachable!("SHOW is answered by show.rs"),
        Command::Pause(db) => pause(proxy, db.as_deref()).await,
        Command::Resume(db) => resume(proxy, db.as_deref()),
        Command::Reconnect(db) => {
            if let Err(e) = not_console("RECONNECT", db.as_deref()) {
                return e;
            }
            let pools = proxy.nodes.pools_of(db.as_deref());
            pools.iter().for_each(|p| p.retire_all());
            Answer::Done {
                tag: "RECONNECT",
                notices: vec![format!(
                    "{} pool(s): idle server connections closed, busy ones close when their \
                     transaction ends",
                    pools.len()
                )],
            }
        }
        Command::Disable(db) | Command::Enable(db) if is_console_database(&db) => {
            not_console("DISABLE/ENABLE", Some(&db)).unwrap_err()
        }
        Command::Disable(db) => {
            proxy.nodes.gates.set_disabled(&db, true);
            done("DISABLE")
        }
        Command::Enable(db) => {
            proxy.nodes.gates.set_disabled(&db, false);
            done("ENABLE")
        }
        Command::Kill(db) => {
            if let Err(e) = not_console("KILL", db.as_deref()) {
                return e;
            }
            let doomed: Vec<_> = proxy
                .registry
                .all()
                .into_iter()
                .filter(|c| !is_console_database(&c.database))
                .filter(|c| db.as_deref().is_none_or(|db| c.database == db))
                .collect();
            doomed.iter().for_each(|c| c.kill.notify_one());
            let pools = proxy.nodes.pools_of(db.as_deref());
            pools.iter().for_each(|p| p.retire_all());
            Answer::Done {
                tag: "KILL",
                notices: vec![format!(
                    "{} client(s) disconnected, server connections of {} pool(s) closed",
                    doomed.len(),
                    pools.len()
                )],
            }
        }
        Command::KillClient(id) => {
            if id == login.entry.id {
                return refused(
                    sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
                    format!("KILL_CLIENT {id} is this console session; disconnect instead"),
                );
            }
            if proxy.registry.kill(id) {
                done("KILL_CLIENT")
            } else {
                refused(
                    sqlstate::UNDEFINED_OBJECT,
                    format!("no client with id {id}; SHOW CLIENTS lists them"),
                )
            }
        }
        Command::Reload => match proxy.reload_from_source() {
            Ok(()) => done("RELOAD"),
            Err(e) => refused(
                sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("config not reloaded: {e}"),
            ),
        },
        Command::Shutdown(drain) => {
            proxy.request_drain(drain);
            done("SHUTDOWN")
        }
        Command::Set { key, value } => match settings::set(&proxy.config(), &key, &value) {
            Ok(config) => {
                proxy.reload(config);
                done("SET")
            }
            Err((code, message)) => refused(code, message),
        },
    }
}

/// PAUSE: new transactions on the database wait (queued in its pools, each for at most
/// `acquire_timeout_ms`, as for a full pool); then waits, for at most `acquire_timeout_ms`
/// too, for the transactions in progress to finish, as PgBouncer's PAUSE does.
async fn pause(proxy: &Arc<Proxy>, db: Option<&str>) -> Answer {
    if let Err(e) = not_console("PAUSE", db) {
        return e;
    }
    proxy.nodes.pause(db);
    let bound = proxy.config().acquire_timeout;
    let in_use = || -> usize {
        proxy
            .nodes
            .pools_of(db)
            .iter()
            .map(|p| p.activity().lent)
            .sum()
    };
    let drained = crate::timer::timeout(bound, async {
        while in_use() > 0 {
            crate::timer::sleep(PAUSE_POLL).await;
        }
    })
    .await
    .is_ok();
    let notices = if drained {
        Vec::new()
    } else {
        vec![format!(
            "paused, but {} server connection(s) are still in use after {} ms (open \
             transactions, or session-mode clients); new transactions wait until RESUME",
            in_use(),
            bound.as_millis()
        )]
    };
    Answer::Done {
        tag: "PAUSE",
        notices,
    }
}

fn resume(proxy: &Arc<Proxy>, db: Option<&str>) -> Answer {
    let gates = &proxy.nodes.gates;
    let paused = match db {
        Some(db) => gates.is_paused(db),
        None => gates.all_paused() || gates.named().iter().any(|d| gates.is_paused(d)),
    };
    if !paused {
        let what = db.map_or("nothing".to_string(), |db| format!("database \"{db}\""));
        return refused(
            sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("RESUME: {what} is not paused"),
        );
    }
    proxy.nodes.resume(db);
    done("RESUME")
}
