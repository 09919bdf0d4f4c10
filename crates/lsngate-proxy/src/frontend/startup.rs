//! The client's startup packet as settings: which parameters are settings (and which are
//! connection metadata or the proxy's own `lsngate.*`), `options` split as the server splits it,
//! and the `set_config` statements that apply them on every server connection the client uses.

use std::collections::HashMap;

/// Startup parameters that are connection metadata, not settings to apply with SET.
pub(super) const NOT_SETTINGS: &[&str] = &["user", "database", "options", "replication"];

/// A string literal that reads the same whatever `standard_conforming_strings` is.
pub(super) fn quote_literal(value: &str) -> String {
    let quoted = value.replace('\'', "''");
    if value.contains('\\') {
        format!("E'{}'", quoted.replace('\\', "\\\\"))
    } else {
        format!("'{quoted}'")
    }
}

/// The statement that gives a setting a value as text: `set_config` parses it as the server
/// parses startup parameters and `pg_settings` values (`search_path=a,b` is two schemas; `SET
/// name = 'a,b'` would be one).
pub(super) fn set_config_statement(name: &str, value: &str) -> String {
    format!(
        "SELECT pg_catalog.set_config({}, {}, false)",
        quote_literal(name),
        quote_literal(value)
    )
}

pub(super) fn is_setting_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

/// The words of a startup `options` string, split as the server splits them: on whitespace,
/// with a backslash taking the next character literally (`a\ b` is the one word `a b`).
pub(super) fn option_words(options: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut chars = options.chars().peekable();
    loop {
        while chars.next_if(char::is_ascii_whitespace).is_some() {}
        if chars.peek().is_none() {
            return words;
        }
        let mut word = String::new();
        while let Some(c) = chars.next_if(|c| !c.is_ascii_whitespace()) {
            word.push(if c == '\\' {
                chars.next().unwrap_or(c)
            } else {
                c
            });
        }
        words.push(word);
    }
}

/// The `name=value` pairs of a startup `options` string (`-c name=value`, `-cname=value`,
/// `--name=value`).
pub(super) fn option_pairs(options: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut words = option_words(options).into_iter();
    while let Some(word) = words.next() {
        let pair = if word == "-c" {
            words.next()
        } else {
            word.strip_prefix("--")
                .or(word.strip_prefix("-c"))
                .map(str::to_string)
        };
        if let Some((k, v)) = pair.as_deref().and_then(|p| p.split_once('=')) {
            pairs.push((k.to_string(), v.to_string()));
        }
    }
    pairs
}

/// `-c lsngate.name=value` pairs in the startup `options`: the proxy's own settings.
pub(super) fn startup_lsngate(params: &[(String, String)]) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for (name, value) in params {
        if name == "options" {
            for (k, v) in option_pairs(value) {
                if let Some(k) = k.to_ascii_lowercase().strip_prefix("lsngate.") {
                    found.push((k.replace('-', "_"), v.clone()));
                }
            }
        } else if let Some(k) = name.to_ascii_lowercase().strip_prefix("lsngate.") {
            found.push((k.to_string(), value.clone()));
        }
    }
    found
}

/// Settings from the startup packet, including `-c name=value` in `options`: (name, value),
/// a later one of a name winning.
pub(super) fn startup_values(params: &[(String, String)]) -> HashMap<String, String> {
    let mut values = HashMap::new();
    for (name, value) in params {
        if name == "options" {
            for (k, v) in option_pairs(value) {
                if is_setting_name(&k) && !k.to_ascii_lowercase().starts_with("lsngate.") {
                    values.insert(k.to_ascii_lowercase().replace('-', "_"), v);
                }
            }
        } else if !NOT_SETTINGS.contains(&name.as_str())
            && is_setting_name(name)
            && !name.starts_with("_pq_.")
            && !name.to_ascii_lowercase().starts_with("lsngate.")
        {
            values.insert(name.to_ascii_lowercase(), value.clone());
        }
    }
    values
}

/// Settings from the startup packet, applied with `set_config`.
pub(super) fn startup_settings(params: &[(String, String)]) -> crate::backend::Settings {
    startup_values(params)
        .into_iter()
        .map(|(name, value)| {
            let statement = set_config_statement(&name, &value);
            (name, statement)
        })
        .collect()
}

/// Settings whose `SET name = 'text'` does not mean what the same text means at startup: for
/// these list settings (`GUC_LIST_QUOTE`) SET quotes a string as one element, where the server
/// splits a startup value into a list.
pub(super) const LIST_QUOTED: &[&str] = &[
    "search_path",
    "temp_tablespaces",
    "session_preload_libraries",
    "local_preload_libraries",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_split_like_the_server_splits_them() {
        assert_eq!(
            option_pairs(r"-c search_path=a,b  --work-mem=8MB -capplication_name=x\ y\\z"),
            [
                ("search_path".to_string(), "a,b".to_string()),
                ("work-mem".to_string(), "8MB".to_string()),
                ("application_name".to_string(), r"x y\z".to_string()),
            ]
        );
        assert!(option_pairs("  ").is_empty());
    }

    #[test]
    fn startup_settings_are_applied_with_set_config_and_safe_literals() {
        let params = [
            ("user".to_string(), "u".to_string()),
            (
                "options".to_string(),
                "-c search_path=a,b -c lsngate.consistency=eventual".to_string(),
            ),
            ("application_name".to_string(), r"it's\here".to_string()),
        ];
        let settings = startup_settings(&params);
        assert_eq!(
            settings.get("search_path").unwrap(),
            "SELECT pg_catalog.set_config('search_path', 'a,b', false)"
        );
        assert_eq!(
            settings.get("application_name").unwrap(),
            r"SELECT pg_catalog.set_config('application_name', E'it''s\\here', false)"
        );
        assert_eq!(
            settings.len(),
            2,
            "user and lsngate.* are not settings: {settings:?}"
        );
    }
}
