//! The statements the differential checker's cases are made of: reads, writes, settings,
//! transaction control and the proxy's own statements, all on the case's table `{t}` with fixed
//! values, so PostgreSQL answers each the same way every time. Parameters are `$n` for the
//! extended protocol and written in as literals for the simple one.

use super::case::Rng;

/// A statement and the values of its `$n` parameters.
pub struct Sql {
    pub text: String,
    pub params: Vec<Option<String>>,
}

impl Sql {
    pub fn new(text: &str, params: &[&str]) -> Sql {
        Sql {
            text: text.to_string(),
            params: params.iter().map(|p| Some(p.to_string())).collect(),
        }
    }

    /// The statement with its parameters written in as literals, for the simple protocol.
    pub fn inline(&self) -> String {
        let mut text = self.text.clone();
        // Backwards, so `$1` does not match the front of `$10`.
        for (i, value) in self.params.iter().enumerate().rev() {
            let literal = value.as_ref().map_or("NULL".into(), |v| format!("'{v}'"));
            text = text.replace(&format!("${}", i + 1), &literal);
        }
        text
    }
}

pub const STATEMENT_NAMES: &[&str] = &["s1", "s2", "s3"];
pub const PORTAL_NAMES: &[&str] = &["p1", "p2"];
pub const TRANSACTION_CONTROL: &[&str] = &[
    "BEGIN",
    "BEGIN",
    "BEGIN ISOLATION LEVEL REPEATABLE READ",
    "BEGIN READ ONLY",
    "START TRANSACTION",
    "COMMIT",
    "COMMIT",
    "END",
    "ROLLBACK",
    "ROLLBACK",
    "SAVEPOINT sp1",
    "SAVEPOINT sp2",
    "RELEASE SAVEPOINT sp1",
    "ROLLBACK TO SAVEPOINT sp1",
    "COMMIT AND CHAIN",
];
/// Statements the proxy answers itself (or whose comment it strips); PostgreSQL answers them as
/// custom settings, with the same messages.
pub const PROXY_HANDLED: &[&str] = &[
    // Quoted: `primary` is a reserved word to PostgreSQL.
    "SET lsngate.route = 'primary'",
    "SET lsngate.route = auto",
    "RESET lsngate.route",
    "SET lsngate.consistency = session",
];

/// A read: rows, no rows, an empty query, a division by zero in the middle of a result, a
/// locking read, settings read back; now and then behind a route hint.
pub fn read(rng: &mut Rng) -> Sql {
    let existing = (1 + rng.below(3)).to_string();
    let mut sql = match rng.below(11) {
        0 | 1 => Sql::new("SELECT id, v FROM {t} ORDER BY id", &[]),
        2 => Sql::new("SELECT v FROM {t} WHERE id = $1", &[&existing]),
        3 => Sql::new("SELECT count(*) AS n, sum(v) AS total FROM {t}", &[]),
        4 => Sql::new(
            "SELECT g AS n, g * $1 AS m FROM generate_series(1, 4) g",
            &["7"],
        ),
        5 => Sql::new("VALUES (1, 'one'), (2, NULL)", &[]),
        // Rows, then 22012 in the middle of the result.
        6 => Sql::new(
            "SELECT id, 100 / (id - $1) AS q FROM {t} ORDER BY id",
            &[&existing],
        ),
        7 => Sql::new("SELECT 10 / $1::int AS q", &["0"]),
        8 => Sql::new("", &[]),
        9 => Sql::new("SELECT id FROM {t} ORDER BY id LIMIT 1 FOR UPDATE", &[]),
        _ => Sql::new(
            "SELECT current_setting('work_mem') AS work_mem, current_setting('application_name') AS app",
            &[],
        ),
    };
    if !sql.text.is_empty() && rng.chance(10) {
        sql.text = format!("/* lsngate:route=primary */ {}", sql.text);
    }
    sql
}

/// A write: inserts of fresh ids (`fresh`) and of existing ones (23505), updates, deletes,
/// RETURNING, a data-modifying CTE.
pub fn write(rng: &mut Rng, fresh: String) -> Sql {
    let existing = (1 + rng.below(3)).to_string();
    match rng.below(9) {
        0 | 1 => Sql::new("INSERT INTO {t} (id, v) VALUES ($1, $2)", &[&fresh, "5"]),
        // 23505 unless the row was deleted.
        2 => Sql::new("INSERT INTO {t} (id, v) VALUES ($1, $2)", &[&existing, "6"]),
        3 => Sql::new(
            "INSERT INTO {t} (id, v) VALUES ($1, $2) RETURNING id, v",
            &[&fresh, "7"],
        ),
        4 => Sql::new(
            "UPDATE {t} SET v = v + $1 WHERE id <= $2",
            &["1", &existing],
        ),
        5 => Sql::new(
            "UPDATE {t} SET v = v * 2 WHERE id = $1 RETURNING id, v",
            &[&existing],
        ),
        6 => Sql::new("DELETE FROM {t} WHERE id = $1", &[&existing]),
        7 => Sql::new(
            "WITH moved AS (UPDATE {t} SET v = v - 1 WHERE id = $1 RETURNING v) SELECT v FROM moved",
            &[&existing],
        ),
        _ => Sql {
            text: "INSERT INTO {t} (id, v) VALUES ($1, $2)".into(),
            params: vec![Some(fresh), None],
        },
    }
}

/// A session or local SET, RESET or SHOW (application_name is reported by ParameterStatus).
pub fn setting(rng: &mut Rng) -> Sql {
    let n = (1 + rng.below(8)).to_string();
    match rng.below(7) {
        0 => Sql::new(&format!("SET work_mem = '{n}MB'"), &[]),
        1 => Sql::new("RESET work_mem", &[]),
        2 => Sql::new("SET LOCAL work_mem = '3MB'", &[]),
        3 => Sql::new("SHOW work_mem", &[]),
        4 => Sql::new(&format!("SET application_name = 'diff-{n}'"), &[]),
        5 => Sql::new("SHOW application_name", &[]),
        _ => Sql::new("RESET application_name", &[]),
    }
}
