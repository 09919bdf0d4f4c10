//! The proxy's own settings, answered by the proxy and never forwarded, over the simple and the
//! extended protocol:
//!
//! | setting | SET / RESET | SHOW |
//! |---|---|---|
//! | `lsngate.route` | `primary`, `replica`, `auto` | the hint in force |
//! | `lsngate.consistency` | a mode (see `causal::mode`) | the client's mode |
//! | `lsngate.min_lsn` | `'X/Y'` or a signed token: a floor for every later read | the floor set |
//! | `lsngate.scope` | a causal scope name (`'user:42'`): reads see its writes from any client | the scope set |
//! | `lsngate.floor` | — | what the next read must see (own writes, reads, min_lsn) |
//! | `lsngate.commit_lsn` | — | position of the client's last commit that wrote |
//! | `lsngate.commit_token` | — | the same with the primary's timeline, `X/Y.tN` (signed with `token_secret`) |
//! | `lsngate.stale` | — | `on` when the last read was served stale |
//!
//! RESET (one, `RESET ALL`, `DISCARD ALL`) returns a setting to the client's login value. In a
//! string of several statements the commands must lead (`MixedCommands`): they are answered,
//! then the rest is forwarded.

use bytes::Bytes;

use super::causal::ClientFloors;
use super::error::ClientError;
use super::session::Session;
use crate::config::{Config, Consistency};
use crate::net::backend::TxStatus;
use crate::net::backend::build;
use crate::net::sqlstate;
use crate::net::{ErrorFields, Frame, FrontendMessage};
use crate::statement::{LocalCommand, MixedCommands, RouteHint, Verb};

/// An error answer: SQLSTATE and message.
pub type Refused = (&'static str, String);

/// The proxy settings a client can SET and RESET.
const SETTABLE: [&str; 4] = ["route", "consistency", "min_lsn", "scope"];

const KNOWN: &str = "lsngate.route, lsngate.consistency, lsngate.min_lsn, lsngate.scope (SET/RESET/SHOW); lsngate.floor, lsngate.commit_lsn, lsngate.commit_token, lsngate.stale (SHOW)";

/// Sets (`Some`) or resets (`None`) one proxy setting of a client.
pub fn apply(
    floors: &mut ClientFloors,
    hint: &mut RouteHint,
    config: &Config,
    name: &str,
    value: Option<&str>,
) -> Result<(), Refused> {
    match (name, value) {
        ("route", None) => *hint = RouteHint::Auto,
        ("route", Some(v)) => {
            *hint = RouteHint::parse(v).ok_or_else(|| {
                (
                    sqlstate::INVALID_PARAMETER_VALUE,
                    format!("invalid value {v:?} for lsngate.route; use primary, replica or auto"),
                )
            })?
        }
        ("consistency", None) => floors.mode = config.causal.consistency,
        ("consistency", Some(v)) => {
            floors.mode = Consistency::parse(v).map_err(|e| {
                (
                    sqlstate::INVALID_PARAMETER_VALUE,
                    format!("lsngate.consistency: {e}"),
                )
            })?
        }
        ("min_lsn", None) => floors.explicit = None,
        ("min_lsn", Some(v)) => {
            floors.explicit = Some(
                config
                    .causal
                    .parse_floor(v)
                    .map_err(|e| (sqlstate::INVALID_PARAMETER_VALUE, e))?,
            )
        }
        ("scope", None) => floors.scope = None,
        ("scope", Some(v)) => {
            floors.scope = Some(config.causal.parse_scope(v).map_err(|e| {
                (
                    sqlstate::INVALID_PARAMETER_VALUE,
                    format!("invalid lsngate.scope: {e}"),
                )
            })?)
        }
        ("floor" | "commit_lsn" | "commit_token" | "stale", _) => {
            return Err((
                sqlstate::CANT_CHANGE_RUNTIME_PARAM,
                format!("lsngate.{name} is reported by the proxy and cannot be set"),
            ));
        }
        _ => {
            return Err((
                sqlstate::UNDEFINED_OBJECT,
                format!(
                    "unrecognized configuration parameter \"lsngate.{name}\"; the proxy knows {KNOWN}"
                ),
            ));
        }
    }
    Ok(())
}

/// The value `SHOW lsngate.<name>` answers.
fn show(session: &Session, name: &str) -> Result<String, Refused> {
    let floors = &session.floors;
    let text = |f: Option<crate::causal::Floor>| f.map(|f| f.to_string()).unwrap_or_default();
    Ok(match name {
        "route" => session.hint.as_str().to_string(),
        "consistency" => floors.mode.to_string(),
        "min_lsn" => text(floors.explicit),
        "scope" => floors
            .scope
            .as_ref()
            .map(|s| s.to_string())
            .unwrap_or_default(),
        "floor" => text(floors.own()),
        "commit_lsn" | "commit_token" if floors.commit_unknown => {
            return Err((
                sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!(
                    "lsngate.{name} is unknown: the client's last commit went through, but its position was lost with the primary connection and the primary cannot be asked now; SHOW it again once the primary answers (the previous commit's position does not cover this commit)"
                ),
            ));
        }
        "commit_lsn" => text(floors.commit),
        "commit_token" => floors
            .commit
            .and_then(|f| session.config.causal.issue(f))
            .unwrap_or_default(),
        "stale" => (if floors.stale_reported { "on" } else { "off" }).to_string(),
        _ => {
            return Err((
                sqlstate::UNDEFINED_OBJECT,
                format!(
                    "unrecognized configuration parameter \"lsngate.{name}\"; the proxy knows {KNOWN}"
                ),
            ));
        }
    })
}

/// What a proxy command answered.
enum Answered {
    /// SET / RESET went through: the command tag.
    Done(&'static str),
    /// SHOW: the setting's name and value.
    Shown(String, String),
}

/// What the server says to anything but the end of an aborted transaction block.
pub(super) const ABORTED: (&str, &str) = (
    sqlstate::IN_FAILED_SQL_TRANSACTION,
    "current transaction is aborted, commands ignored until end of transaction block",
);

fn empty(tag: u8) -> Frame {
    Frame::new(tag, Bytes::new())
}

impl Session {
    fn run_command(&mut self, command: &LocalCommand) -> Result<Answered, Refused> {
        let name = command.name.as_str();
        match &command.verb {
            Verb::Show => Ok(Answered::Shown(
                format!("lsngate.{name}"),
                show(self, name)?,
            )),
            Verb::Set(value) => {
                let config = std::sync::Arc::clone(&self.config);
                apply(&mut self.floors, &mut self.hint, &config, name, Some(value))?;
                Ok(Answered::Done("SET"))
            }
            Verb::Reset => {
                self.reset_proxy_setting(name)?;
                Ok(Answered::Done("RESET"))
            }
        }
    }

    /// Returns one proxy setting to the value the client logged in with (its startup options),
    /// else to the proxy's default — what RESET does to a setting on a direct connection.
    fn reset_proxy_setting(&mut self, name: &str) -> Result<(), Refused> {
        let config = std::sync::Arc::clone(&self.config);
        apply(&mut self.floors, &mut self.hint, &config, name, None)?;
        let login = self.startup_proxy.iter().rev().find(|(n, _)| n == name);
        if let Some((_, value)) = login {
            // Checked at login: the value applies again.
            apply(&mut self.floors, &mut self.hint, &config, name, Some(value))?;
        }
        Ok(())
    }

    /// `RESET ALL` or `DISCARD ALL` went to the server: the proxy's settings return to their
    /// login values as well. Pools that hand a connection to the next borrower reset it this
    /// way; a leftover `eventual` would let that borrower read stale data, a leftover scope
    /// would file its writes under another user's.
    pub(super) fn reset_proxy_settings(&mut self) {
        for name in SETTABLE {
            self.reset_proxy_setting(name)
                .expect("every settable name resets");
        }
    }

    /// A proxy command sent as a simple query.
    pub(super) async fn answer_locally(
        &mut self,
        command: LocalCommand,
    ) -> Result<(), ClientError> {
        // Earlier replies first, and with them any commit position SHOW must report.
        self.drain().await?;
        // A commit whose position was lost gets one now if the primary answers (SHOW refuses
        // to name it otherwise); the reason it stays unknown is SHOW's to give.
        let _ = self.settle_commit_unknown().await?;
        // In an aborted block the server refuses it, unless unsynced messages in front of it
        // end the block (`END` over the extended protocol): then the server's answer to a
        // stand-in says which, and a SET takes effect only if the block has ended.
        let judged = self.status == TxStatus::Failed;
        if judged && !self.stand_in_due() {
            return self.answer_error(ABORTED.0, ABORTED.1).await;
        }
        let before = judged.then(|| (self.floors.clone(), self.hint));
        let ran = self.run_command(&command);
        let installs = before.map(|(floors, hint)| {
            let after = (std::mem::replace(&mut self.floors, floors), self.hint);
            self.hint = hint;
            after
        });
        let answer = match ran {
            Ok(Answered::Done(tag)) => vec![build::command_complete(tag)],
            Ok(Answered::Shown(name, value)) => {
                let mut frames = build::single_text_row(&name, &value);
                frames.push(build::command_complete("SHOW"));
                frames
            }
            Err((code, message)) => return self.answer_error(code, &message).await,
        };
        self.answer_query_installing(answer, false, installs).await
    }

    /// A simple Query of several statements with proxy commands among them. Leading ones are
    /// answered in order, as the server would run them; returns the statements to forward
    /// behind their answers, or `None` when the Query is answered (all commands, an error).
    /// After a statement for the server a command cannot run in its place in the string: the
    /// Query is refused before anything runs, rather than the command dropped or sent to the
    /// server (which would take `lsngate.*` as a setting of its own and ignore it).
    pub(super) async fn answer_leading_commands(
        &mut self,
        mixed: MixedCommands<'_>,
    ) -> Result<Option<String>, ClientError> {
        let (commands, rest) = match mixed {
            MixedCommands::Leading(commands, rest) => (commands, rest.to_string()),
            MixedCommands::Misplaced(text) => {
                let message = format!(
                    "cannot run {text:?} in this query: proxy commands (SET lsngate.<name> = 'value', RESET lsngate.<name>, SHOW lsngate.<name>), which the proxy answers itself, must come first in a string of several statements; nothing was run — put them first, or in a query of their own"
                );
                self.answer_error(sqlstate::FEATURE_NOT_SUPPORTED, &message)
                    .await?;
                return Ok(None);
            }
        };
        // In an aborted block the server refuses a string's first statement and skips the rest.
        // Behind unsynced extended messages, only `answer_locally`'s stand-in knows whether
        // they ended the block; that path takes one command at a time.
        if self.status == TxStatus::Failed {
            self.answer_error(ABORTED.0, ABORTED.1).await?;
            return Ok(None);
        }
        if self.stand_in_due() {
            let message = "proxy commands in a string of several statements cannot follow extended-protocol messages not yet ended by a Sync; send a Sync first, or each proxy command in a query of its own";
            self.answer_error(sqlstate::FEATURE_NOT_SUPPORTED, message)
                .await?;
            return Ok(None);
        }
        self.drain().await?;
        let _ = self.settle_commit_unknown().await?;
        let mut answer = Vec::new();
        for command in commands {
            match self.run_command(&command) {
                Ok(Answered::Done(tag)) => answer.push(build::command_complete(tag)),
                Ok(Answered::Shown(name, value)) => {
                    answer.extend(build::single_text_row(&name, &value));
                    answer.push(build::command_complete("SHOW"));
                }
                Err((code, message)) => {
                    // The server stops a string at its first error; in a block the block fails.
                    answer.push(ErrorFields::new("ERROR", code, message).to_frame(b'E'));
                    self.answer_query(answer, true).await?;
                    return Ok(None);
                }
            }
        }
        if rest.is_empty() {
            self.answer_query(answer, false).await?;
            return Ok(None);
        }
        for frame in &answer {
            self.io.queue(frame);
        }
        Ok(Some(rest))
    }

    /// An extended-protocol flight made only of proxy commands, answered message by message
    /// as a server would (after an error, everything up to Sync is skipped).
    pub(super) async fn answer_extended_locally(
        &mut self,
        flight: Vec<FrontendMessage>,
    ) -> Result<(), ClientError> {
        self.drain().await?;
        let _ = self.settle_commit_unknown().await?;
        let command_of = |session: &Session, statement: &str| {
            let s = if statement.is_empty() {
                session.unnamed.as_ref()
            } else {
                session.statements.get(statement)
            };
            s.and_then(|s| s.local.clone())
        };
        let mut failed = false;
        // Portals of SET/RESET run to completion in this flight: a second Execute fails.
        let mut spent: Vec<String> = Vec::new();
        let aborted = |session: &mut Session, failed: &mut bool| {
            session
                .io
                .queue(&ErrorFields::new("ERROR", ABORTED.0, ABORTED.1).to_frame(b'E'));
            *failed = true;
        };
        for m in flight {
            if failed && !matches!(m, FrontendMessage::Sync) {
                continue;
            }
            match m {
                // In an aborted transaction block the server refuses Parse, Bind and Execute.
                FrontendMessage::Parse { .. } | FrontendMessage::Bind { .. }
                    if self.status == TxStatus::Failed =>
                {
                    aborted(self, &mut failed)
                }
                FrontendMessage::Parse { .. } => self.io.queue(&empty(b'1')),
                FrontendMessage::Bind {
                    portal, statement, ..
                } => {
                    spent.retain(|p| p != &portal);
                    if let Some(command) = command_of(self, &statement) {
                        self.local_portals.insert(portal, command);
                    }
                    self.io.queue(&empty(b'2'));
                }
                FrontendMessage::Describe { kind, name } => {
                    let command = if kind == b'S' {
                        self.io
                            .queue(&Frame::new(b't', Bytes::from_static(&[0, 0])));
                        command_of(self, &name)
                    } else {
                        self.local_portals.get(&name).cloned()
                    };
                    match command {
                        Some(LocalCommand {
                            name,
                            verb: Verb::Show,
                        }) => {
                            let columns = build::single_text_row(&format!("lsngate.{name}"), "");
                            self.io.queue(&columns[0]);
                        }
                        _ => self.io.queue(&empty(b'n')),
                    }
                }
                FrontendMessage::Execute { portal, .. } => {
                    if spent.contains(&portal) {
                        let message = format!("portal \"{portal}\" cannot be run");
                        self.io.queue(
                            &ErrorFields::new(
                                "ERROR",
                                sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
                                message,
                            )
                            .to_frame(b'E'),
                        );
                        failed = true;
                        continue;
                    }
                    let Some(command) = self.local_portals.get(&portal).cloned() else {
                        continue;
                    };
                    if self.status == TxStatus::Failed {
                        aborted(self, &mut failed);
                        continue;
                    }
                    match self.run_command(&command) {
                        Ok(Answered::Done(tag)) => {
                            spent.push(portal);
                            self.io.queue(&build::command_complete(tag))
                        }
                        Ok(Answered::Shown(name, value)) => {
                            self.io.queue(&build::single_text_row(&name, &value)[1]);
                            self.io.queue(&build::command_complete("SHOW"));
                        }
                        Err((code, message)) => {
                            self.io
                                .queue(&ErrorFields::new("ERROR", code, message).to_frame(b'E'));
                            failed = true;
                        }
                    }
                }
                FrontendMessage::Close { kind, name } => {
                    // A statement's Close took it out of the client's view when it arrived
                    // (`session.rs`); removing it again here would drop one parsed after it.
                    if kind == b'P' {
                        self.local_portals.remove(&name);
                    }
                    self.io.queue(&empty(b'3'));
                }
                FrontendMessage::Sync => {
                    if std::mem::take(&mut failed) && self.status == TxStatus::InBlock {
                        self.abort_server_block().await?;
                    }
                    if self.status == TxStatus::Idle {
                        // The implicit transaction ends here, and every portal with it.
                        self.local_portals.clear();
                    }
                    self.queue_ready(self.status);
                }
                _ => {}
            }
        }
        self.io.flush().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FileConfig;
    use crate::config::Level;

    fn config() -> Config {
        Config::build(FileConfig {
            primary: Some("postgres://postgres@127.0.0.1:5432/postgres".into()),
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn settings_apply_and_bad_values_name_the_fix() {
        let config = config();
        let mut floors = ClientFloors::default();
        let mut hint = RouteHint::Auto;
        apply(
            &mut floors,
            &mut hint,
            &config,
            "consistency",
            Some("'global'"),
        )
        .unwrap();
        assert_eq!(floors.mode.level, Level::Global);
        apply(
            &mut floors,
            &mut hint,
            &config,
            "min_lsn",
            Some("'0/3000060'"),
        )
        .unwrap();
        assert_eq!(floors.explicit.unwrap().to_string(), "0/03000060");
        let (code, message) =
            apply(&mut floors, &mut hint, &config, "min_lsn", Some("'banana'")).unwrap_err();
        assert_eq!(code, sqlstate::INVALID_PARAMETER_VALUE);
        assert!(message.contains("banana"), "{message}");
        assert_eq!(
            floors.explicit.unwrap().to_string(),
            "0/03000060",
            "a refused value changes nothing"
        );
        apply(&mut floors, &mut hint, &config, "min_lsn", None).unwrap();
        assert_eq!(floors.explicit, None);
        assert_eq!(
            apply(&mut floors, &mut hint, &config, "commit_lsn", Some("1"))
                .unwrap_err()
                .0,
            sqlstate::CANT_CHANGE_RUNTIME_PARAM
        );
        assert_eq!(
            apply(&mut floors, &mut hint, &config, "nope", None)
                .unwrap_err()
                .0,
            sqlstate::UNDEFINED_OBJECT
        );
        apply(&mut floors, &mut hint, &config, "scope", Some("'user:42'")).unwrap();
        assert_eq!(floors.scope.as_ref().unwrap().as_str(), "user:42");
        let (code, message) =
            apply(&mut floors, &mut hint, &config, "scope", Some("'user 42'")).unwrap_err();
        assert_eq!(code, sqlstate::INVALID_PARAMETER_VALUE);
        assert!(message.contains("letters, digits"), "{message}");
        assert_eq!(
            floors.scope.as_ref().unwrap().as_str(),
            "user:42",
            "a refused name changes nothing"
        );
        apply(&mut floors, &mut hint, &config, "scope", None).unwrap();
        assert_eq!(floors.scope, None);
        apply(&mut floors, &mut hint, &config, "route", Some("primary")).unwrap();
        assert_eq!(hint, RouteHint::Primary);
    }
}
