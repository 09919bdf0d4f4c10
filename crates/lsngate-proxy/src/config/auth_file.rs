//! `auth_file`: users from a file in PgBouncer's `userlist.txt` format, so a PgBouncer
//! deployment's file works unchanged. Each line that starts with `"` holds two double-quoted
//! fields, the user name and its password — plain text, an MD5 hash (`md5` and 32 hex digits, as
//! in `pg_shadow`) or a SCRAM secret (`SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`)
//! — and PgBouncer ignores the rest of the line; a `"` inside a field is written `""`. Other lines
//! (comments, blank) are ignored. Read at startup and at every reload.

use std::path::Path;

use super::ConfigError;
use super::users::UserEntry;

/// The users of an auth file, each as a `[[users]]` entry would give it: a SCRAM secret or a
/// plain password logs in with SCRAM, an MD5 hash with MD5.
pub(super) fn read(path: &Path) -> Result<Vec<UserEntry>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::AuthFile {
        path: path.display().to_string(),
        why: format!("cannot read it: {e}"),
    })?;
    parse(&text).map_err(|why| ConfigError::AuthFile {
        path: path.display().to_string(),
        why,
    })
}

fn parse(text: &str) -> Result<Vec<UserEntry>, String> {
    let mut entries = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim_start();
        if !line.starts_with('"') {
            continue;
        }
        let at = |why: &str| format!("line {}: {why}", number + 1);
        let (name, rest) = quoted(line).ok_or_else(|| {
            at("the user name's closing quote is missing; write \"user\" \"password\"")
        })?;
        let (secret, _ignored) = quoted(rest.trim_start()).ok_or_else(|| {
            at("expected a double-quoted password after the user name; write \"user\" \"password\"")
        })?;
        if name.is_empty() {
            return Err(at("empty user name"));
        }
        if secret.is_empty() {
            return Err(at(&format!(
                "user {name:?} has an empty password; lsngate logs nobody in without one from the auth file (use [[users]] with auth = \"trust\" for that)"
            )));
        }
        let is_md5 = secret.len() == 35
            && secret.starts_with("md5")
            && secret[3..].bytes().all(|b| b.is_ascii_hexdigit());
        let entry = if secret.starts_with("SCRAM-SHA-256$") {
            UserEntry {
                verifier: Some(secret),
                ..UserEntry::new(&name, None, "scram-sha-256")
            }
        } else if is_md5 {
            UserEntry {
                verifier: Some(secret),
                ..UserEntry::new(&name, None, "md5")
            }
        } else {
            UserEntry::new(&name, Some(&secret), "scram-sha-256")
        };
        entries.push(entry);
    }
    Ok(entries)
}

/// A double-quoted field at the start of `text` (`""` inside is one `"`), and what follows it.
fn quoted(text: &str) -> Option<(String, &str)> {
    let mut chars = text.strip_prefix('"')?.char_indices().peekable();
    let mut field = String::new();
    while let Some((i, c)) = chars.next() {
        if c != '"' {
            field.push(c);
        } else if chars.peek().is_some_and(|(_, next)| *next == '"') {
            field.push('"');
            chars.next();
        } else {
            return Some((field, &text[i + 2..]));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgbouncer_userlist_lines_become_users() {
        let text = concat!(
            "; written by mkauth\n",
            "\"plain\" \"pa\"\"ss word\" ignored rest\n",
            "  \"hashed\" \"md5f6a9ba2ab4a30f1bf36e57e7fc5df1b2\"\n",
            "\n# a comment\n",
            "\"salted\" \"SCRAM-SHA-256$4096:c2FsdA==$c3RvcmVk:c2VydmVy\"\n",
        );
        let users = parse(text).unwrap();
        let got: Vec<(&str, Option<&str>, Option<&str>, &str)> = users
            .iter()
            .map(|u| {
                (
                    u.name.as_str(),
                    u.password.as_deref(),
                    u.verifier.as_deref(),
                    u.auth.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("plain", Some("pa\"ss word"), None, "scram-sha-256"),
                (
                    "hashed",
                    None,
                    Some("md5f6a9ba2ab4a30f1bf36e57e7fc5df1b2"),
                    "md5"
                ),
                (
                    "salted",
                    None,
                    Some("SCRAM-SHA-256$4096:c2FsdA==$c3RvcmVk:c2VydmVy"),
                    "scram-sha-256"
                ),
            ]
        );
    }

    #[test]
    fn a_broken_line_is_named_by_its_number() {
        let error = parse("\"ok\" \"pw\"\n\"broken \"pw\"\n").unwrap_err();
        assert!(error.starts_with("line 2:"), "{error}");
        let error = parse("\"nopw\"\n").unwrap_err();
        assert!(
            error.contains("line 1") && error.contains("password"),
            "{error}"
        );
        let error = parse("\"empty\" \"\"\n").unwrap_err();
        assert!(error.contains("empty password"), "{error}");
    }
}
