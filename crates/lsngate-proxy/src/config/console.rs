//! Who may use the admin console — the virtual database `lsngate` (alias `pgbouncer`) that the
//! proxy serves itself: `admin_users` run every command, `stats_users` only SHOW. Both name
//! users clients may log in as (they authenticate like any client, see `users`); a name that is
//! no such user is refused when the config is loaded.

use super::{ClientUser, ConfigError};

/// The databases a client names to reach the admin console instead of a server.
pub const CONSOLE_DATABASES: [&str; 2] = ["lsngate", "pgbouncer"];

/// Whether `database` is the admin console.
pub fn is_console_database(database: &str) -> bool {
    CONSOLE_DATABASES.contains(&database)
}

/// What a console user may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsoleAccess {
    /// Every command (`admin_users`).
    Admin,
    /// SHOW commands only (`stats_users`).
    Stats,
}

/// Checks that every console user is a login user.
pub(super) fn check_console_users(
    users: &[ClientUser],
    admin_users: &[String],
    stats_users: &[String],
) -> Result<(), ConfigError> {
    let lists = [("admin_users", admin_users), ("stats_users", stats_users)];
    for (key, names) in lists {
        for name in names {
            if !users.iter().any(|u| &u.name == name) {
                return Err(ConfigError::User {
                    user: name.clone(),
                    why: format!(
                        "listed in {key} but no client may log in as it; add it under [[users]] \
                         (without [[users]], the one login is the primary URL's user)"
                    ),
                });
            }
        }
    }
    Ok(())
}
