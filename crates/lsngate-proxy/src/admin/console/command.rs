//! The admin console's commands as text: `SHOW POOLS`, `PAUSE app`, `SET pool_size = 10`, ...
//! parsed into [`Command`] — pure, no state. Words are case-insensitive, a trailing `;` is
//! allowed, and a database name may be double-quoted. Anything else is an error that names the
//! text and lists the valid commands (what `SHOW HELP` prints).

use crate::proxy::Drain;

/// What `SHOW` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Show {
    /// The commands.
    Help,
    /// One row per pool (node, database, role).
    Pools,
    /// One row per connected client.
    Clients,
    /// One row per open server connection.
    Servers,
    /// Per database: server assignments, transactions, queries, bytes and times, totals and
    /// averages.
    Stats,
    /// The same totals under PgBouncer's STATS_TOTALS names.
    StatsTotals,
    /// The averages under PgBouncer's STATS_AVERAGES names.
    StatsAverages,
    /// One row per database clients used (and the console's).
    Databases,
    /// One row per login user.
    Users,
    /// Every setting with its value, default and whether SET can change it.
    Config,
    /// Counts of the proxy's lists.
    Lists,
    /// The version.
    Version,
    /// Paused, draining.
    State,
    /// lsngate's own: every replica's role, health, replayed position, lag and load.
    Replicas,
    /// lsngate's own: causal-read mode, budget, outcomes and breaker.
    Causal,
    /// lsngate's own: the budget advice from the replay lag observed.
    Budget,
    /// lsngate's own: the topology source's members, roles, states, lag, tags, node set.
    Topology,
}

impl Show {
    /// Every SHOW, by its word.
    pub const ALL: [(&'static str, Show); 17] = [
        ("HELP", Show::Help),
        ("POOLS", Show::Pools),
        ("CLIENTS", Show::Clients),
        ("SERVERS", Show::Servers),
        ("STATS", Show::Stats),
        ("STATS_TOTALS", Show::StatsTotals),
        ("STATS_AVERAGES", Show::StatsAverages),
        ("DATABASES", Show::Databases),
        ("USERS", Show::Users),
        ("CONFIG", Show::Config),
        ("LISTS", Show::Lists),
        ("VERSION", Show::Version),
        ("STATE", Show::State),
        ("REPLICAS", Show::Replicas),
        ("CAUSAL", Show::Causal),
        ("BUDGET", Show::Budget),
        ("TOPOLOGY", Show::Topology),
    ];
}

/// One console command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `SHOW what`.
    Show(Show),
    /// `PAUSE [db]`: new transactions wait; those in progress finish.
    Pause(Option<String>),
    /// `RESUME [db]`.
    Resume(Option<String>),
    /// `RECONNECT [db]`: server connections are replaced (idle ones now, busy ones when done).
    Reconnect(Option<String>),
    /// `DISABLE db`: new logins to it are refused.
    Disable(String),
    /// `ENABLE db`.
    Enable(String),
    /// `KILL [db]`: its clients are disconnected and its server connections closed.
    Kill(Option<String>),
    /// `KILL_CLIENT id`.
    KillClient(u64),
    /// `RELOAD`: the config file is read again (as on SIGHUP).
    Reload,
    /// `SHUTDOWN [WAIT_FOR_SERVERS]`: stop accepting, close each client once its transaction is
    /// over, exit (as on SIGTERM); `SHUTDOWN WAIT_FOR_CLIENTS`: stop accepting, exit once every
    /// client left. Both bounded by `shutdown_timeout_ms`.
    Shutdown(crate::proxy::Drain),
    /// `SET key = value`.
    Set {
        /// Setting name, lower case.
        key: String,
        /// Its new value as written (quotes removed).
        value: String,
    },
}

impl Command {
    /// Whether a stats user may run it (SHOW only).
    pub fn is_show(&self) -> bool {
        matches!(self, Command::Show(_))
    }

    /// Its name as the user knows it, for errors.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Show(_) => "SHOW",
            Command::Pause(_) => "PAUSE",
            Command::Resume(_) => "RESUME",
            Command::Reconnect(_) => "RECONNECT",
            Command::Disable(_) => "DISABLE",
            Command::Enable(_) => "ENABLE",
            Command::Kill(_) => "KILL",
            Command::KillClient(_) => "KILL_CLIENT",
            Command::Reload => "RELOAD",
            Command::Shutdown(_) => "SHUTDOWN",
            Command::Set { .. } => "SET",
        }
    }
}

/// The commands, one a line: `SHOW HELP`'s text and the tail of every parse error.
pub const HELP: &[&str] = &[
    "SHOW HELP|POOLS|CLIENTS|SERVERS|STATS|STATS_TOTALS|STATS_AVERAGES|DATABASES|USERS|CONFIG|LISTS|VERSION|STATE",
    "SHOW REPLICAS|CAUSAL|BUDGET|TOPOLOGY",
    "SET key = value",
    "RELOAD",
    "PAUSE [<db>]",
    "RESUME [<db>]",
    "DISABLE <db>",
    "ENABLE <db>",
    "RECONNECT [<db>]",
    "KILL [<db>]",
    "KILL_CLIENT <id>",
    "SHUTDOWN [WAIT_FOR_SERVERS|WAIT_FOR_CLIENTS]",
];

/// A text that is no command, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid command '{text}': {why}; the admin console knows: {}", HELP.join("; "))]
pub struct CommandError {
    /// The text as sent.
    pub text: String,
    /// What is wrong with it.
    pub why: String,
}

/// A database name: a word, or a double-quoted name.
fn database(word: &str) -> String {
    word.strip_prefix('"')
        .and_then(|w| w.strip_suffix('"'))
        .map(|w| w.replace("\"\"", "\""))
        .unwrap_or_else(|| word.to_string())
}

/// Parses one command (one statement of a simple Query).
pub fn parse(text: &str) -> Result<Command, CommandError> {
    let statement = text.trim().trim_end_matches(';').trim();
    let error = |why: &str| CommandError {
        text: statement.to_string(),
        why: why.to_string(),
    };
    let words: Vec<&str> = statement.split_whitespace().collect();
    let Some(verb) = words.first() else {
        return Err(error("empty command"));
    };
    let verb = verb.to_ascii_uppercase();
    let optional_db = || match words.len() {
        1 => Ok(None),
        2 => Ok(Some(database(words[1]))),
        _ => Err(error(&format!("{verb} takes at most one database name"))),
    };
    let required_db = || match words.len() {
        2 => Ok(database(words[1])),
        _ => Err(error(&format!("{verb} takes one database name"))),
    };
    match verb.as_str() {
        "SHOW" => {
            let [_, what] = words[..] else {
                return Err(error("SHOW takes one word"));
            };
            let what = what.to_ascii_uppercase();
            Show::ALL
                .iter()
                .find(|(word, _)| *word == what)
                .map(|(_, show)| Command::Show(*show))
                .ok_or_else(|| error(&format!("there is no SHOW {what}")))
        }
        "PAUSE" => optional_db().map(Command::Pause),
        "RESUME" => optional_db().map(Command::Resume),
        "RECONNECT" => optional_db().map(Command::Reconnect),
        "KILL" => optional_db().map(Command::Kill),
        "DISABLE" => required_db().map(Command::Disable),
        "ENABLE" => required_db().map(Command::Enable),
        "KILL_CLIENT" => match words[..] {
            [_, id] => id
                .parse()
                .map(Command::KillClient)
                .map_err(|_| error("KILL_CLIENT takes a client id from SHOW CLIENTS")),
            _ => Err(error("KILL_CLIENT takes a client id from SHOW CLIENTS")),
        },
        "RELOAD" if words.len() == 1 => Ok(Command::Reload),
        "SHUTDOWN" => match words[..] {
            [_] => Ok(Command::Shutdown(Drain::WaitForServers)),
            [_, mode] if mode.eq_ignore_ascii_case("WAIT_FOR_SERVERS") => {
                Ok(Command::Shutdown(Drain::WaitForServers))
            }
            [_, mode] if mode.eq_ignore_ascii_case("WAIT_FOR_CLIENTS") => {
                Ok(Command::Shutdown(Drain::WaitForClients))
            }
            _ => Err(error(
                "SHUTDOWN takes nothing, WAIT_FOR_SERVERS (the same: each client is closed once \
                 its transaction is over) or WAIT_FOR_CLIENTS (the proxy exits once every client \
                 left)",
            )),
        },
        "SET" => parse_set(statement).ok_or_else(|| error("expected SET key = value")),
        _ => Err(error(&format!("unknown command {verb}"))),
    }
}

/// `SET key = value` or `SET key TO value`, the value bare or single-quoted.
fn parse_set(statement: &str) -> Option<Command> {
    let rest = statement.get(3..)?.trim_start();
    let (key, value) = match rest.split_once('=') {
        Some((key, value)) => (key.trim(), value.trim()),
        None => {
            let (key, value) = rest.split_once(char::is_whitespace)?;
            let value = value.trim_start();
            let to = value.get(..2)?;
            if !to.eq_ignore_ascii_case("to") {
                return None;
            }
            (key.trim(), value[2..].trim())
        }
    };
    let value = value
        .strip_prefix('\'')
        .and_then(|v| v.strip_suffix('\''))
        .map(|v| v.replace("''", "'"))
        .unwrap_or_else(|| value.to_string());
    if key.is_empty() || key.contains(char::is_whitespace) || value.is_empty() {
        return None;
    }
    Some(Command::Set {
        key: key.to_ascii_lowercase(),
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_case_insensitively_with_optional_databases() {
        assert_eq!(parse("show pools;"), Ok(Command::Show(Show::Pools)));
        assert_eq!(
            parse("SHOW stats_totals"),
            Ok(Command::Show(Show::StatsTotals))
        );
        assert_eq!(parse("PAUSE"), Ok(Command::Pause(None)));
        assert_eq!(parse("pause app"), Ok(Command::Pause(Some("app".into()))));
        assert_eq!(
            parse("RESUME \"My Db\"").unwrap_err().why,
            "RESUME takes at most one database name"
        );
        assert_eq!(
            parse("RESUME \"app\""),
            Ok(Command::Resume(Some("app".into())))
        );
        assert_eq!(parse("DISABLE app"), Ok(Command::Disable("app".into())));
        assert_eq!(parse("KILL_CLIENT 12"), Ok(Command::KillClient(12)));
        assert_eq!(parse("reload"), Ok(Command::Reload));
        assert_eq!(
            parse("SET pool_size = 7"),
            Ok(Command::Set {
                key: "pool_size".into(),
                value: "7".into()
            })
        );
        assert_eq!(
            parse("set Acquire_Timeout_Ms to '250'"),
            Ok(Command::Set {
                key: "acquire_timeout_ms".into(),
                value: "250".into()
            })
        );
        assert!(parse("SHOW POOLS").unwrap().is_show() && !parse("PAUSE").unwrap().is_show());
    }

    #[test]
    fn a_wrong_command_is_named_and_the_valid_ones_listed() {
        let error = parse("SHOW FOO").unwrap_err().to_string();
        assert!(error.starts_with("invalid command 'SHOW FOO': there is no SHOW FOO; the admin console knows: SHOW HELP|POOLS"), "{error}");
        assert!(error.contains("KILL_CLIENT <id>"), "{error}");
        assert_eq!(parse("SELECT 1").unwrap_err().why, "unknown command SELECT");
        assert_eq!(
            parse("DISABLE").unwrap_err().why,
            "DISABLE takes one database name"
        );
        assert!(parse("KILL_CLIENT x").is_err() && parse("SET pool_size").is_err());
        assert_eq!(
            parse("shutdown wait_for_clients;"),
            Ok(Command::Shutdown(Drain::WaitForClients))
        );
        assert_eq!(
            parse("SHUTDOWN WAIT_FOR_SERVERS"),
            parse("SHUTDOWN").map(|_| Command::Shutdown(Drain::WaitForServers))
        );
        assert!(
            parse("SHUTDOWN NOW")
                .unwrap_err()
                .why
                .starts_with("SHUTDOWN takes nothing, WAIT_FOR_SERVERS")
        );
    }
}
