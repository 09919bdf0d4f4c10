//! Finding a PostgreSQL installation to run: an explicit bin dir, or auto-detection in the
//! order the installer promises (the PostgreSQL 19 bundle first, then `pg_config --bindir`, then
//! `/usr/lib/postgresql/*/bin`, highest version first).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Error;

/// Where `scripts/install-postgres.sh` puts the PostgreSQL 19 bundle.
pub const BUNDLE_BIN: &str = "/opt/lsngate/pg19/bin";

/// Environment variable that overrides auto-detection (used by the test command to run the suite
/// once per server version).
pub const PG_BIN_ENV: &str = "LSNGATE_PG_BIN";

/// A PostgreSQL bin directory and the server version in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgBin {
    /// The bin directory.
    pub dir: PathBuf,
    /// `postgres --version`'s version word, e.g. `19rc1` or `15.18`.
    pub version: String,
    /// The major version, e.g. 19 or 15.
    pub major: u32,
}

impl PgBin {
    /// `explicit`, else `$LSNGATE_PG_BIN`, else auto-detection.
    pub fn find(explicit: Option<&Path>) -> Result<PgBin, Error> {
        if let Some(dir) = explicit {
            return PgBin::at(dir);
        }
        if let Some(dir) = std::env::var_os(PG_BIN_ENV).filter(|d| !d.is_empty()) {
            return PgBin::at(Path::new(&dir));
        }
        PgBin::detect()
    }

    /// The first usable installation in the documented order.
    pub fn detect() -> Result<PgBin, Error> {
        let mut candidates = vec![PathBuf::from(BUNDLE_BIN)];
        if let Ok(out) = Command::new("pg_config").arg("--bindir").output()
            && out.status.success()
        {
            candidates.push(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
        }
        let mut debian: Vec<PgBin> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| PgBin::at(&entry.path().join("bin")).ok())
            .collect();
        debian.sort_by_key(|bin| std::cmp::Reverse(bin.major));
        candidates.extend(debian.into_iter().map(|bin| bin.dir));
        candidates
            .iter()
            .find_map(|dir| PgBin::at(dir).ok())
            .ok_or(Error::NoPostgres)
    }

    /// The installation in `dir`, which must hold `postgres`, `initdb`, `pg_ctl`,
    /// `pg_basebackup` and `psql`.
    pub fn at(dir: &Path) -> Result<PgBin, Error> {
        for tool in ["postgres", "initdb", "pg_ctl", "pg_basebackup", "psql"] {
            if !dir.join(tool).is_file() {
                return Err(Error::BadPgBin {
                    dir: dir.to_path_buf(),
                    why: format!("no {tool} there"),
                });
            }
        }
        let out = Command::new(dir.join("postgres"))
            .arg("--version")
            .output()
            .map_err(|e| Error::BadPgBin {
                dir: dir.to_path_buf(),
                why: format!("postgres --version failed: {e}"),
            })?;
        let text = String::from_utf8_lossy(&out.stdout);
        let version = text
            .split_whitespace()
            .nth(2)
            .unwrap_or_default()
            .to_string();
        let major: u32 = version
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .map_err(|_| Error::BadPgBin {
                dir: dir.to_path_buf(),
                why: format!("cannot read a version from {text:?}"),
            })?;
        Ok(PgBin {
            dir: dir.to_path_buf(),
            version,
            major,
        })
    }

    /// Path of program `name` in this bin dir.
    pub fn tool(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// PostgreSQL ≥ 19 has `WAIT FOR LSN`.
    pub fn has_wait_for(&self) -> bool {
        self.major >= 19
    }
}
