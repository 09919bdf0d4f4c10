//! The statements the proxy must recognise by their text rather than classify: its own commands
//! (`SET/SHOW/RESET lsngate.<name>`), which it answers itself and never forwards, and the ones
//! that change a session setting, whose value the proxy re-applies on every server connection
//! the client later uses (or reads back, when a multi-statement string may have changed one).
//! Plain text checks, not the SQL parser: they run on the hot path before classification, and a
//! doubt costs only a read-back or a wait.

use super::class::has_word;
use super::split::statements;

/// What a proxy command does with its setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verb {
    /// `SET [SESSION] lsngate.x = value` / `TO value` (the value as written, quotes kept).
    Set(String),
    /// `RESET lsngate.x` (also `SET lsngate.x TO DEFAULT`).
    Reset,
    /// `SHOW lsngate.x`.
    Show,
}

/// A statement the proxy answers itself and never forwards: `SET/RESET/SHOW lsngate.<name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalCommand {
    /// The setting, lower case, without the `lsngate.` prefix.
    pub name: String,
    /// What to do with it.
    pub verb: Verb,
}

/// Recognises the proxy's own commands.
pub fn local_command(sql: &str) -> Option<LocalCommand> {
    if !mentions_lsngate_setting(sql) {
        return None;
    }
    let text = sql.trim().trim_end_matches(';').trim();
    let (head, rest) = text.split_once(char::is_whitespace)?;
    let rest = rest.trim_start();
    let head = head.to_ascii_lowercase();
    let rest = match head.as_str() {
        "set" => {
            let after = rest.get(..8).filter(|p| p.eq_ignore_ascii_case("session "));
            if after.is_some() {
                rest[8..].trim_start()
            } else {
                rest
            }
        }
        _ => rest,
    };
    let name_end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        .unwrap_or(rest.len());
    let name = rest[..name_end].to_ascii_lowercase();
    let name = name.strip_prefix("lsngate.")?.to_string();
    let tail = rest[name_end..].trim();
    let verb = match head.as_str() {
        "show" if tail.is_empty() => Verb::Show,
        "reset" if tail.is_empty() => Verb::Reset,
        "set" => {
            let value = tail.strip_prefix('=').map(str::trim).or_else(|| {
                tail.get(..3)
                    .filter(|p| p.eq_ignore_ascii_case("to "))
                    .map(|_| tail[3..].trim())
            })?;
            if value.eq_ignore_ascii_case("default") {
                Verb::Reset
            } else {
                Verb::Set(value.to_string())
            }
        }
        _ => return None,
    };
    Some(LocalCommand { name, verb })
}

/// A simple Query string of several statements with proxy commands among them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MixedCommands<'a> {
    /// The commands lead: the proxy answers them in order, then forwards `rest` (the string
    /// from the first other statement on; empty when there is none).
    Leading(Vec<LocalCommand>, &'a str),
    /// A proxy command (or what looks like one) that does not lead: its text. The proxy answers
    /// its commands itself, so it cannot run one between statements the server runs.
    Misplaced(&'a str),
}

/// Finds proxy commands in a string of several statements (`SET lsngate.scope = 'user:7';
/// INSERT ...`); `None` for one statement, or several without a proxy command.
pub fn mixed_commands(sql: &str) -> Option<MixedCommands<'_>> {
    if !sql.contains(';') || !sql.to_ascii_lowercase().contains("lsngate.") {
        return None;
    }
    let parts = statements(sql);
    if parts.len() < 2 || !parts.iter().any(|p| mentions_lsngate_setting(p)) {
        return None;
    }
    let mut commands = Vec::new();
    let mut rest = "";
    for (i, part) in parts.iter().enumerate() {
        match local_command(part) {
            Some(command) if i == commands.len() => commands.push(command),
            _ if mentions_lsngate_setting(part) => return Some(MixedCommands::Misplaced(part)),
            _ if rest.is_empty() => {
                // `statements` hands out slices of `sql`.
                let offset = part.as_ptr() as usize - sql.as_ptr() as usize;
                rest = &sql[offset..];
            }
            _ => {}
        }
    }
    Some(MixedCommands::Leading(commands, rest))
}

/// Whether a string of several statements runs `RESET ALL` or `DISCARD ALL` among them.
pub fn resets_all_in_parts(sql: &str) -> bool {
    statements(sql).iter().any(|part| {
        let words: Vec<&str> = part.split_whitespace().collect();
        matches!(words.as_slice(), [verb, all]
            if (verb.eq_ignore_ascii_case("reset") || verb.eq_ignore_ascii_case("discard"))
                && all.eq_ignore_ascii_case("all"))
    })
}

/// Cheap pre-check on the hot path: does this look like `SET/SHOW/RESET lsngate.*`?
pub fn mentions_lsngate_setting(sql: &str) -> bool {
    let head = sql.trim_start().as_bytes();
    let starts = |kw: &[u8]| head.len() > kw.len() && head[..kw.len()].eq_ignore_ascii_case(kw);
    (starts(b"set") || starts(b"show") || starts(b"reset"))
        && sql.to_ascii_lowercase().contains("lsngate.")
}

/// Parses a session `SET name = value` / `SET name TO value` into (name, value as SQL text).
pub fn session_set(sql: &str) -> Option<(String, String)> {
    let text = sql.trim().trim_end_matches(';').trim();
    let lower = text.to_ascii_lowercase();
    let rest = lower.strip_prefix("set ")?;
    if rest.starts_with("local ")
        || rest.starts_with("transaction")
        || rest.starts_with("constraints")
    {
        return None;
    }
    let offset = text.len() - rest.len();
    let rest_orig = &text[offset..];
    let rest_orig = rest_orig
        .strip_prefix("session ")
        .or_else(|| rest_orig.strip_prefix("SESSION "))
        .unwrap_or(rest_orig);
    let name_end =
        rest_orig.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))?;
    let name = rest_orig[..name_end].to_ascii_lowercase();
    let value = rest_orig[name_end..].trim_start();
    let value = value.strip_prefix('=').map(str::trim_start).or_else(|| {
        value
            .get(..3)
            .filter(|p| p.eq_ignore_ascii_case("to "))
            .map(|_| value[3..].trim_start())
    })?;
    if name.is_empty() || value.is_empty() || value.contains(';') {
        return None;
    }
    Some((name, value.to_string()))
}

/// The setting one statement returns to its default: `RESET name`, or `SET [SESSION] name TO
/// DEFAULT` (`= DEFAULT`), which means the same. The name, lower case, and the tag the server's
/// CommandComplete carries for it (`RESET` or `SET`). Not `RESET ALL`.
pub fn setting_reset(sql: &str) -> Option<(String, &'static str)> {
    let text = sql.trim().trim_end_matches(';').trim_end();
    if let Some(name) = text
        .get(..6)
        .filter(|p| p.eq_ignore_ascii_case("reset "))
        .map(|_| text[6..].trim().to_ascii_lowercase())
    {
        let setting = !name.is_empty()
            && name != "all"
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
        return setting.then_some((name, "RESET"));
    }
    let (name, value) = session_set(text)?;
    value
        .eq_ignore_ascii_case("default")
        .then_some((name, "SET"))
}

/// Whether a multi-statement string may return a setting to its default among its parts (a
/// RESET, a DISCARD or a `SET ... TO DEFAULT`). Split naively on `;`, like
/// [`sets_session_in_parts`]: a false positive only costs a wait.
pub fn may_reset_in_parts(sql: &[u8]) -> bool {
    sql.contains(&b';')
        && parts(sql).any(|(word, part)| match word.as_slice() {
            b"reset" | b"discard" => true,
            b"set" => has_word(
                &String::from_utf8_lossy(part).to_ascii_lowercase(),
                "default",
            ),
            _ => false,
        })
}

/// The parts of a string split naively on `;`, each with its first word in lower case.
fn parts(sql: &[u8]) -> impl Iterator<Item = (Vec<u8>, &[u8])> {
    sql.split(|&b| b == b';').map(|part| {
        let word = part
            .iter()
            .skip_while(|b| b.is_ascii_whitespace())
            .take_while(|b| b.is_ascii_alphabetic())
            .map(u8::to_ascii_lowercase)
            .collect();
        (word, part)
    })
}

/// Whether a multi-statement string has a statement among its parts that changes session
/// settings (`UPDATE t ...; SET application_name = 'x'`). Such a string is classified by its
/// other statements (a write stays a write, for its commit position), but PostgreSQL applies the
/// SET for the session all the same: the proxy must then read the server's settings back, or the
/// server connection goes back to the pool with a setting the next client's `settings_sql` does
/// not undo. Split naively on `;` (a `;` inside a literal only costs a needless read-back).
pub fn sets_session_in_parts(sql: &[u8]) -> bool {
    sql.contains(&b';')
        && parts(sql).any(|(word, _)| matches!(word.as_slice(), b"set" | b"reset" | b"discard"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_commands_may_lead_a_string_of_statements_and_nothing_else() {
        let set = |name: &str, value: &str| LocalCommand {
            name: name.into(),
            verb: Verb::Set(value.into()),
        };
        assert_eq!(
            mixed_commands("SET lsngate.scope = 'u'"),
            None,
            "one statement"
        );
        assert_eq!(mixed_commands("SELECT 1; SELECT 'lsngate.x'"), None);
        assert_eq!(
            mixed_commands(
                "SET lsngate.scope = 'a;b'; set lsngate.route to primary ;INSERT INTO t VALUES (';');"
            ),
            Some(MixedCommands::Leading(
                vec![set("scope", "'a;b'"), set("route", "primary")],
                "INSERT INTO t VALUES (';');"
            ))
        );
        assert_eq!(
            mixed_commands("RESET lsngate.scope; SHOW lsngate.scope;"),
            Some(MixedCommands::Leading(
                vec![
                    LocalCommand {
                        name: "scope".into(),
                        verb: Verb::Reset
                    },
                    LocalCommand {
                        name: "scope".into(),
                        verb: Verb::Show
                    }
                ],
                ""
            ))
        );
        assert_eq!(
            mixed_commands("INSERT INTO t VALUES (1); SHOW lsngate.commit_token"),
            Some(MixedCommands::Misplaced("SHOW lsngate.commit_token"))
        );
        assert_eq!(
            mixed_commands("SET lsngate.scope 'x'; SELECT 1"),
            Some(MixedCommands::Misplaced("SET lsngate.scope 'x'")),
            "not a command the proxy can parse"
        );
    }

    #[test]
    fn reset_all_among_statements_is_noticed() {
        assert!(resets_all_in_parts("SELECT 1; DISCARD  ALL"));
        assert!(resets_all_in_parts("reset all; select 1"));
        assert!(!resets_all_in_parts("SELECT 'reset all'; SELECT 2"));
        assert!(!resets_all_in_parts("RESET work_mem; DISCARD PLANS"));
    }

    #[test]
    fn a_set_among_the_parts_of_a_string_is_noticed() {
        let s = |sql: &str| sets_session_in_parts(sql.as_bytes());
        assert!(s("UPDATE t SET v = 1; SET application_name = 'x'"));
        assert!(s("SELECT 1;\n  reset work_mem;"));
        assert!(s("discard all; select 1"));
        assert!(!s("UPDATE t SET v = 1 WHERE id = 2"), "one statement");
        assert!(!s("UPDATE t SET v = 1; SELECT settings FROM t"));
    }

    #[test]
    fn a_reset_of_one_setting_is_told_apart_from_other_statements() {
        let reset = |name: &str, tag| Some((name.to_string(), tag));
        assert_eq!(
            setting_reset("RESET application_name"),
            reset("application_name", "RESET")
        );
        assert_eq!(
            setting_reset(" reset  Work_Mem ;"),
            reset("work_mem", "RESET")
        );
        assert_eq!(
            setting_reset("SET application_name TO DEFAULT"),
            reset("application_name", "SET")
        );
        assert_eq!(
            setting_reset("set session work_mem = default"),
            reset("work_mem", "SET")
        );
        assert_eq!(setting_reset("RESET ALL"), None);
        assert_eq!(setting_reset("RESET SESSION AUTHORIZATION"), None);
        assert_eq!(setting_reset("SET LOCAL work_mem TO DEFAULT"), None);
        assert_eq!(
            setting_reset("SET work_mem = 'default'"),
            None,
            "a quoted value"
        );
        assert_eq!(setting_reset("SET work_mem = '4MB'"), None);
    }

    #[test]
    fn a_reset_among_the_parts_of_a_string_is_noticed() {
        let r = |sql: &str| may_reset_in_parts(sql.as_bytes());
        assert!(r("RESET application_name; SELECT 1"));
        assert!(r("SELECT 1;\n  reset all"));
        assert!(r("SET work_mem TO DEFAULT; SELECT 1"));
        assert!(r("select 1; discard plans"));
        assert!(
            !r("RESET application_name"),
            "one statement is sent as the startup value"
        );
        assert!(!r("SET application_name = 'x'; SELECT 1"));
        assert!(!r("UPDATE t SET v = 1; SELECT 2"));
    }

    #[test]
    fn proxy_commands_and_session_sets_are_parsed() {
        let cmd = |name: &str, verb: Verb| {
            Some(LocalCommand {
                name: name.into(),
                verb,
            })
        };
        assert_eq!(
            local_command("SET lsngate.route = primary;"),
            cmd("route", Verb::Set("primary".into()))
        );
        assert_eq!(
            local_command("set session lsngate.min_lsn to '0/1'"),
            cmd("min_lsn", Verb::Set("'0/1'".into()))
        );
        assert_eq!(
            local_command("RESET lsngate.route"),
            cmd("route", Verb::Reset)
        );
        assert_eq!(
            local_command("SET lsngate.consistency TO DEFAULT"),
            cmd("consistency", Verb::Reset)
        );
        assert_eq!(
            local_command("SHOW lsngate.commit_lsn"),
            cmd("commit_lsn", Verb::Show)
        );
        assert_eq!(local_command("SET search_path = x"), None);
        assert_eq!(local_command("SHOW lsngate.route extra"), None);
        assert_eq!(
            session_set("SET search_path TO app, public"),
            Some(("search_path".into(), "app, public".into()))
        );
        assert_eq!(
            session_set("set application_name = 'x'"),
            Some(("application_name".into(), "'x'".into()))
        );
        assert_eq!(session_set("SET LOCAL work_mem = '1MB'"), None);
    }
}
