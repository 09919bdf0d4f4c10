//! The admin console: the virtual database `lsngate` (alias `pgbouncer`) that the proxy serves
//! itself over the PostgreSQL protocol, as PgBouncer serves its `pgbouncer` database. A client
//! logs in as to any database (the same users, passwords and methods, see `frontend::handshake`)
//! and must be in `admin_users` (every command) or `stats_users` (SHOW only); its login never
//! reaches a server and makes no pool. Commands come as simple queries (psql `-c`, several per
//! string separated by `;`); like PgBouncer's console this one speaks only the simple query
//! protocol, and extended-protocol messages get an error saying so.
//!
//! `command` parses, `show` builds the SHOW tables, `settings` is SHOW CONFIG and SET, and
//! `control` carries out the commands that change things.

mod command;
mod control;
mod settings;
mod show;

use std::sync::Arc;

use tokio::sync::watch;

use crate::config::ConsoleAccess;
use crate::frontend::client_io::ClientIo;
use crate::frontend::error::ClientError;
use crate::frontend::handshake::ConsoleLogin;
use crate::net::backend::TxStatus;
use crate::net::backend::build;
use crate::net::error_fields::ErrorFields;
use crate::net::{FrontendMessage, sqlstate};
use crate::proxy::Proxy;

use command::Command;

/// What one command answered: a table, a tag, notices, or an error (SQLSTATE, message).
#[derive(Debug)]
pub(crate) enum Answer {
    /// Rows, then `SHOW`.
    Table(show::Table),
    /// A command tag alone (`PAUSE`, `SET`, ...), after these notices.
    Done {
        tag: &'static str,
        notices: Vec<String>,
    },
    /// An ERROR.
    Error(&'static str, String),
}

/// Serves one logged-in console client until it leaves, is killed, or the proxy drains (the
/// admin layer's half of `handshake::ConsoleFn`).
pub(crate) fn serve(
    proxy: Arc<Proxy>,
    io: ClientIo,
    login: ConsoleLogin,
    shutdown: watch::Receiver<bool>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ClientError>> + Send>> {
    Box::pin(run(proxy, io, login, shutdown))
}

/// The ParameterStatus a console client is told at login: what psql and drivers read.
fn greeting(io: &mut ClientIo, login: &ConsoleLogin) {
    let client_value = |name: &str, default: &str| {
        login
            .params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map_or(default.to_string(), |(_, v)| v.clone())
    };
    let version = format!("{}/lsngate", env!("CARGO_PKG_VERSION"));
    let params = [
        ("server_version", version),
        ("server_encoding", "UTF8".to_string()),
        ("client_encoding", client_value("client_encoding", "UTF8")),
        ("DateStyle", "ISO, MDY".to_string()),
        ("TimeZone", "UTC".to_string()),
        ("integer_datetimes", "on".to_string()),
        ("standard_conforming_strings", "on".to_string()),
        ("is_superuser", "off".to_string()),
        ("application_name", client_value("application_name", "")),
        ("session_authorization", login.user.clone()),
    ];
    for (name, value) in &params {
        io.queue(&build::parameter_status(name, value));
    }
    io.queue(&build::backend_key_data(
        login.cancel_key.0,
        login.cancel_key.1,
    ));
    io.queue_ready(TxStatus::Idle);
}

async fn run(
    proxy: Arc<Proxy>,
    mut io: ClientIo,
    login: ConsoleLogin,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ClientError> {
    greeting(&mut io, &login);
    io.flush().await?;
    tracing::info!(user = %login.user, database = %login.database, access = ?login.access, "admin console login");
    // After an extended-protocol message: everything up to the next Sync is ignored.
    let mut skipping = false;
    loop {
        if *shutdown.borrow() {
            io.queue(&build::fatal(
                sqlstate::ADMIN_SHUTDOWN,
                "lsngate proxy is shutting down; reconnect",
            ));
            io.flush().await?;
            return Ok(());
        }
        let frame = tokio::select! {
            frame = io.recv() => frame?,
            _ = login.entry.kill.notified() => {
                io.queue(&build::fatal(
                    sqlstate::ADMIN_SHUTDOWN,
                    login.entry.kill_message(),
                ));
                io.flush().await?;
                return Ok(());
            }
            _ = shutdown.changed() => continue,
        };
        let Some(frame) = frame else {
            return Ok(());
        };
        let message = match FrontendMessage::parse(&frame) {
            Ok(message) => message,
            Err(e) => {
                io.queue(&build::fatal(sqlstate::PROTOCOL_VIOLATION, &e.to_string()));
                let _ = io.flush().await;
                return Err(e.into());
            }
        };
        match message {
            FrontendMessage::Terminate => return Ok(()),
            FrontendMessage::Query(sql) => {
                for answer in answer_query(&proxy, &login, &sql).await {
                    queue_answer(&mut io, answer);
                }
                io.queue_ready(TxStatus::Idle);
            }
            FrontendMessage::Sync => {
                skipping = false;
                io.queue_ready(TxStatus::Idle);
            }
            FrontendMessage::Flush => {}
            _ if skipping => {}
            _ => {
                // PgBouncer's console refuses the extended protocol the same way.
                skipping = true;
                io.queue(
                    &ErrorFields::new(
                        "ERROR",
                        sqlstate::PROTOCOL_VIOLATION,
                        "extended query protocol not supported by the lsngate admin console; \
                         send commands as simple queries (psql does; in pgx use \
                         QueryExecModeSimpleProtocol / PreferSimpleProtocol)",
                    )
                    .to_frame(b'E'),
                );
            }
        }
        io.flush().await?;
    }
}

/// The answers to a simple Query: one per `;`-separated command, stopping at the first error
/// (as a server stops a multi-statement string).
async fn answer_query(proxy: &Arc<Proxy>, login: &ConsoleLogin, sql: &str) -> Vec<Answer> {
    let statements: Vec<&str> = sql
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if statements.is_empty() {
        return Vec::new();
    }
    let mut answers = Vec::new();
    for statement in statements {
        let answer = answer_one(proxy, login, statement).await;
        let failed = matches!(answer, Answer::Error(..));
        answers.push(answer);
        if failed {
            break;
        }
    }
    answers
}

async fn answer_one(proxy: &Arc<Proxy>, login: &ConsoleLogin, statement: &str) -> Answer {
    let command = match command::parse(statement) {
        Ok(command) => command,
        Err(e) => return Answer::Error(sqlstate::SYNTAX_ERROR, e.to_string()),
    };
    if login.access == ConsoleAccess::Stats && !command.is_show() {
        return Answer::Error(
            sqlstate::INSUFFICIENT_PRIVILEGE,
            format!(
                "admin access needed: {} is for admin_users; user \"{}\" is in stats_users (SHOW only)",
                command.name(),
                login.user
            ),
        );
    }
    tracing::info!(user = %login.user, command = %statement, "admin console command");
    match command {
        Command::Show(what) => Answer::Table(show::show(proxy, what)),
        other => control::run(proxy, login, other).await,
    }
}

fn queue_answer(io: &mut ClientIo, answer: Answer) {
    match answer {
        Answer::Table(table) => {
            io.queue(&build::row_description(&table.columns));
            for row in &table.rows {
                let values: Vec<Option<&str>> = row.iter().map(Option::as_deref).collect();
                io.queue(&build::text_data_row(&values));
            }
            io.queue(&build::command_complete("SHOW"));
        }
        Answer::Done { tag, notices } => {
            for notice in notices {
                io.queue(&ErrorFields::new("NOTICE", "00000", notice).to_frame(b'N'));
            }
            io.queue(&build::command_complete(tag));
        }
        Answer::Error(code, message) => {
            io.queue(&ErrorFields::new("ERROR", code, message).to_frame(b'E'));
        }
    }
}
