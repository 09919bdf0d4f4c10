//! `lsngate config import pgbouncer.ini`: a PgBouncer config as the equivalent lsngate proxy
//! TOML, and every setting that does not carry over, named with the reason — so moving from
//! PgBouncer is a config change someone can review. Pure: the ini text in, the TOML text and
//! the notes out; nothing is read besides the ini itself (`auth_file` is referred to, not read).

use std::collections::BTreeMap;

/// The TOML for the lsngate proxy, and what could not be carried over.
#[derive(Debug)]
pub struct Imported {
    /// The config file, with a comment naming the PgBouncer setting behind each key.
    pub toml: String,
    /// One line per PgBouncer setting (or database, or user) not carried over, with why.
    pub not_carried: Vec<String>,
}

/// PgBouncer settings with an lsngate key of the same meaning: (PgBouncer, lsngate, seconds →
/// milliseconds).
const SAME: &[(&str, &str, bool)] = &[
    ("default_pool_size", "pool_size", false),
    ("max_client_conn", "max_client_connections", false),
    ("query_wait_timeout", "acquire_timeout_ms", true),
    ("client_login_timeout", "client_login_timeout_ms", true),
    (
        "idle_transaction_timeout",
        "idle_transaction_timeout_ms",
        true,
    ),
    ("client_idle_timeout", "client_idle_timeout_ms", true),
    ("server_idle_timeout", "server_idle_timeout_ms", true),
    ("server_lifetime", "server_lifetime_ms", true),
    ("server_connect_timeout", "connect_timeout_ms", true),
    ("max_db_connections", "max_db_connections", false),
    ("max_user_connections", "max_user_connections", false),
    (
        "max_db_client_connections",
        "max_db_client_connections",
        false,
    ),
    (
        "max_user_client_connections",
        "max_user_client_connections",
        false,
    ),
    ("reserve_pool_size", "reserve_pool_size", false),
    ("reserve_pool_timeout", "reserve_pool_timeout_ms", true),
    ("stats_period", "stats_period_ms", true),
];

/// PgBouncer settings lsngate has no use for, with why (not an error: the proxy works without).
const MOOT: &[(&str, &str)] = &[
    (
        "logfile",
        "lsngate logs to stderr (LSNGATE_LOG sets the level); redirect it",
    ),
    (
        "pidfile",
        "lsngate does not daemonize; run it under systemd or a supervisor",
    ),
    ("syslog", "lsngate logs to stderr"),
    ("syslog_ident", "lsngate logs to stderr"),
    ("syslog_facility", "lsngate logs to stderr"),
    (
        "user",
        "lsngate does not switch users; start it as the user it should run as",
    ),
    ("unix_socket_dir", "lsngate listens on TCP only"),
    ("unix_socket_mode", "lsngate listens on TCP only"),
    ("unix_socket_group", "lsngate listens on TCP only"),
    (
        "log_connections",
        "lsngate logs at the level LSNGATE_LOG sets",
    ),
    (
        "log_disconnections",
        "lsngate logs at the level LSNGATE_LOG sets",
    ),
    (
        "log_pooler_errors",
        "lsngate logs at the level LSNGATE_LOG sets",
    ),
    (
        "server_reset_query",
        "lsngate resets server connections itself (DISCARD ALL for pinned sessions, settings re-applied per client)",
    ),
    (
        "server_check_query",
        "lsngate checks servers with its own health check (health_interval_ms)",
    ),
    (
        "server_check_delay",
        "lsngate checks servers with its own health check (health_interval_ms)",
    ),
    (
        "ignore_startup_parameters",
        "lsngate carries every startup parameter to the servers as SETs",
    ),
    ("application_name_add_host", "not supported"),
];

/// Reads a pgbouncer.ini.
pub fn import(ini: &str) -> Result<Imported, String> {
    let sections = parse_ini(ini)?;
    let mut out = Toml::default();
    let mut not_carried = Vec::new();
    let empty = BTreeMap::new();
    let settings = sections.get("pgbouncer").unwrap_or(&empty);

    let listen_addr = settings.get("listen_addr").map(String::as_str);
    let port = settings.get("listen_port").map_or("6432", String::as_str);
    match listen_addr {
        None | Some("") => not_carried.push(
            "listen_addr: not set (PgBouncer then listens on its Unix socket only); lsngate listens on TCP: listen = \"127.0.0.1:6432\" is its default".into(),
        ),
        Some(addr) => {
            let first = addr.split(',').next().unwrap_or(addr).trim();
            let host = if first == "*" { "0.0.0.0" } else { first };
            if addr.contains(',') {
                not_carried.push(format!(
                    "listen_addr = {addr}: lsngate listens on one address; took {host}"
                ));
            }
            let host = if host.contains(':') { format!("[{host}]") } else { host.to_string() };
            out.string("listen", &format!("{host}:{port}"), "listen_addr, listen_port");
        }
    }

    databases(
        sections.get("databases").unwrap_or(&empty),
        &mut out,
        &mut not_carried,
    )?;

    match settings.get("pool_mode").map(String::as_str) {
        Some(mode @ ("session" | "transaction")) => out.string("pool_mode", mode, "pool_mode"),
        Some(other) => not_carried.push(format!(
            "pool_mode = {other}: lsngate pools by session or transaction only"
        )),
        None => not_carried.push(
            "pool_mode: not set (PgBouncer's default is session); lsngate's default is transaction, so the import says session".into(),
        ),
    }
    if !settings.contains_key("pool_mode") {
        out.string("pool_mode", "session", "PgBouncer's default");
    }
    for (bouncer, key, seconds) in SAME {
        let Some(value) = settings.get(*bouncer) else {
            continue;
        };
        if *bouncer == "query_wait_timeout" && number(value, true) == Some(0) {
            // PgBouncer's 0 waits forever; lsngate's wait always has a bound.
            not_carried.push(format!(
                "query_wait_timeout = {value}: 0 (wait forever) has no lsngate equivalent; acquire_timeout_ms bounds every wait (set it high instead)"
            ));
            continue;
        }
        match number(value, *seconds) {
            Some(n) => out.number(key, n, bouncer),
            None => {
                return Err(format!(
                    "{bouncer} = {value:?} is not a number; fix it in the ini"
                ));
            }
        }
    }
    auth(settings, &mut out, &mut not_carried);
    tls(settings, &mut out, &mut not_carried);
    for (name, value) in settings {
        let known = [
            "listen_addr",
            "listen_port",
            "pool_mode",
            "auth_type",
            "auth_file",
            "auth_user",
            "auth_query",
            "auth_dbname",
            "auth_hba_file",
            "admin_users",
            "stats_users",
            "client_tls_sslmode",
            "client_tls_cert_file",
            "client_tls_key_file",
            "server_tls_sslmode",
        ];
        if known.contains(&name.as_str()) || SAME.iter().any(|(b, _, _)| b == name) {
            continue;
        }
        match MOOT.iter().find(|(b, _)| b == name) {
            Some((_, why)) => not_carried.push(format!("{name} = {value}: {why}")),
            None => not_carried.push(format!(
                "{name} = {value}: no lsngate equivalent yet (see the proxy guide's Limits)"
            )),
        }
    }
    if let Some(users) = sections.get("users") {
        for (user, value) in users {
            not_carried.push(format!(
                "[users] {user} = {value}: per-user pool settings are not carried over; lsngate's pools are per (node, database, role)"
            ));
        }
    }
    for (section, _) in sections.iter() {
        if !["pgbouncer", "databases", "users"].contains(&section.as_str()) {
            not_carried.push(format!(
                "[{section}]: not a PgBouncer section lsngate knows"
            ));
        }
    }
    Ok(Imported {
        toml: out.text,
        not_carried,
    })
}

/// `[databases]`: lsngate proxies one primary (plus replicas PgBouncer does not know of), and a
/// client's database name reaches the server as it is.
fn databases(
    databases: &BTreeMap<String, String>,
    out: &mut Toml,
    not_carried: &mut Vec<String>,
) -> Result<(), String> {
    let mut primary: Option<(String, BTreeMap<String, String>)> = None;
    for (name, connstr) in databases {
        let params = libpq_params(connstr).map_err(|why| format!("[databases] {name}: {why}"))?;
        let host = params
            .get("host")
            .cloned()
            .unwrap_or_else(|| "127.0.0.1".into());
        let port = params.get("port").cloned().unwrap_or_else(|| "5432".into());
        let at = format!("{host}:{port}");
        if let Some(dbname) = params.get("dbname").filter(|d| *d != name && name != "*") {
            not_carried.push(format!(
                "[databases] {name} = … dbname={dbname}: lsngate does not rename databases; clients must connect to {dbname} itself"
            ));
        }
        for key in params.keys() {
            if !["host", "port", "dbname", "user", "password"].contains(&key.as_str()) {
                not_carried.push(format!(
                    "[databases] {name}: {key}={}: per-database pool settings are not carried over",
                    params[key]
                ));
            }
        }
        match &primary {
            None => primary = Some((at, params)),
            Some((seen, _)) if *seen == at => {}
            Some((seen, _)) => not_carried.push(format!(
                "[databases] {name} at {at}: lsngate proxies one primary ({seen}); serve {at} from another lsngate"
            )),
        }
    }
    let Some((at, params)) = primary else {
        return Err(
            "[databases] is empty: name at least one database so the primary's address is known"
                .into(),
        );
    };
    let user = params.get("user").map_or("postgres", String::as_str);
    let credentials = match params.get("password") {
        Some(password) => format!("{}:{}", percent(user), percent(password)),
        None => percent(user),
    };
    let database = params.get("dbname").map_or("postgres", String::as_str);
    let missing_user = if params.contains_key("user") {
        ""
    } else {
        " (user: PgBouncer logs in as each client; lsngate as this role — set it)"
    };
    out.string(
        "primary",
        &format!("postgres://{credentials}@{at}/{}", percent(database)),
        &format!("[databases]{missing_user}"),
    );
    out.line("replicas = []                            # PgBouncer knows none: list them to spread reads");
    Ok(())
}

fn auth(settings: &BTreeMap<String, String>, out: &mut Toml, not_carried: &mut Vec<String>) {
    match settings.get("auth_type").map(String::as_str) {
        None | Some("scram-sha-256" | "md5" | "plain") => {}
        Some("hba") => match settings.get("auth_hba_file") {
            Some(file) => out.string("auth_hba_file", file, "auth_type = hba, auth_hba_file"),
            None => not_carried.push(
                "auth_type = hba without auth_hba_file: name the file (auth_hba_file) for lsngate to apply it".into(),
            ),
        },
        Some(other) => not_carried.push(format!(
            "auth_type = {other}: lsngate authenticates with the auth_file's secrets (SCRAM, or MD5 for md5 hashes) or [[users]]"
        )),
    }
    if let (Some(file), false) = (
        settings.get("auth_hba_file"),
        settings.get("auth_type").is_some_and(|t| t == "hba"),
    ) {
        not_carried.push(format!(
            "auth_hba_file = {file}: PgBouncer applies it only with auth_type = hba; set auth_hba_file in lsngate to apply it"
        ));
    }
    if let Some(file) = settings.get("auth_file") {
        out.string("auth_file", file, "auth_file");
    }
    // The same keys and meaning: logins not in the file checked against the server's secrets,
    // the proxy logging in to the servers as the client's role (lsngate's default too).
    for key in ["auth_user", "auth_query", "auth_dbname"] {
        if let Some(value) = settings.get(key) {
            out.string(key, value, key);
        }
    }
    for (bouncer, key) in [
        ("admin_users", "admin_users"),
        ("stats_users", "stats_users"),
    ] {
        if let Some(list) = settings.get(bouncer) {
            let names: Vec<String> = list
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(quote)
                .collect();
            out.line(&format!("{key} = [{}]  # {bouncer}", names.join(", ")));
        }
    }
}

fn tls(settings: &BTreeMap<String, String>, out: &mut Toml, not_carried: &mut Vec<String>) {
    let mode = settings.get("client_tls_sslmode").map(String::as_str);
    let cert = settings.get("client_tls_cert_file");
    let key = settings.get("client_tls_key_file");
    if let (Some(cert), Some(key)) = (cert, key) {
        out.string("tls_cert", cert, "client_tls_cert_file");
        out.string("tls_key", key, "client_tls_key_file");
    }
    match mode {
        None => {}
        Some("disable") => out.string("tls_mode", "disable", "client_tls_sslmode"),
        Some("allow" | "prefer") => out.string("tls_mode", "allow", "client_tls_sslmode"),
        Some("require") => out.string("tls_mode", "require", "client_tls_sslmode"),
        Some(other) => {
            out.string("tls_mode", "require", "client_tls_sslmode");
            not_carried.push(format!(
                "client_tls_sslmode = {other}: lsngate requires TLS but does not check client certificates"
            ));
        }
    }
    if let Some(mode) = settings.get("server_tls_sslmode") {
        not_carried.push(format!(
            "server_tls_sslmode = {mode}: put sslmode={mode} in the primary (and replica) URLs"
        ));
    }
}

/// A seconds value (PgBouncer allows fractions) as milliseconds, or a count as it is.
fn number(value: &str, seconds: bool) -> Option<u64> {
    if seconds {
        let s: f64 = value.trim().parse().ok()?;
        (s >= 0.0).then(|| (s * 1000.0).round() as u64)
    } else {
        value.trim().parse().ok()
    }
}

/// Sections of an ini: `[name]`, then `key = value` lines; `;` and `#` start comment lines.
fn parse_ini(text: &str) -> Result<BTreeMap<String, BTreeMap<String, String>>, String> {
    let mut sections: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        if line.starts_with("%include") {
            return Err(format!(
                "line {}: %include is not followed; import the included file's settings into this one first",
                number + 1
            ));
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = Some(name.trim().to_ascii_lowercase());
            sections
                .entry(name.trim().to_ascii_lowercase())
                .or_default();
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(format!(
                "line {}: expected key = value, got {line:?}",
                number + 1
            ));
        };
        let Some(section) = &current else {
            return Err(format!(
                "line {}: a setting before any [section]",
                number + 1
            ));
        };
        let key = key.trim();
        let key = if section == "pgbouncer" {
            key.to_ascii_lowercase()
        } else {
            key.to_string()
        };
        sections
            .get_mut(section)
            .expect("entered above")
            .insert(key, value.trim().to_string());
    }
    Ok(sections)
}

/// A libpq `key=value` string (values may be single-quoted, `\'` and `\\` escaped).
fn libpq_params(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut params = BTreeMap::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Ok(params);
        }
        let key: String =
            std::iter::from_fn(|| chars.next_if(|c| *c != '=' && !c.is_whitespace())).collect();
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('=') {
            return Err(format!("expected key=value after {key:?}"));
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            loop {
                match chars.next() {
                    Some('\\') => value.extend(chars.next()),
                    Some('\'') => break,
                    Some(c) => value.push(c),
                    None => return Err(format!("unterminated quote in {key}=")),
                }
            }
        } else {
            value = std::iter::from_fn(|| chars.next_if(|c| !c.is_whitespace())).collect();
        }
        params.insert(key, value);
    }
}

fn percent(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn quote(text: &str) -> String {
    let escaped: String = text
        .chars()
        .flat_map(|c| match c {
            '"' => vec!['\\', '"'],
            '\\' => vec!['\\', '\\'],
            c => vec![c],
        })
        .collect();
    format!("\"{escaped}\"")
}

/// The TOML being written, one commented key per line.
#[derive(Default)]
struct Toml {
    text: String,
}

impl Toml {
    fn line(&mut self, line: &str) {
        self.text.push_str(line);
        self.text.push('\n');
    }

    fn string(&mut self, key: &str, value: &str, from: &str) {
        self.line(&format!("{key} = {}  # {from}", quote(value)));
    }

    fn number(&mut self, key: &str, value: u64, from: &str) {
        self.line(&format!("{key} = {value}  # {from}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_map_and_the_rest_is_named() {
        let ini = "\
[databases]
app = host=10.0.0.1 port=5433 dbname=app user=app_rw password='s3cr\\'et'
reports = host=10.0.0.1 port=5433 dbname=reporting pool_size=5
other = host=10.0.0.9 dbname=other

[pgbouncer]
listen_addr = *
listen_port = 6432
pool_mode = transaction
default_pool_size = 25
max_client_conn = 500
query_wait_timeout = 2.5
server_idle_timeout = 600
auth_type = hba
auth_hba_file = /etc/pgbouncer/hba.conf
auth_file = /etc/pgbouncer/userlist.txt
auth_user = pgbouncer
auth_query = SELECT usename, passwd FROM public.user_lookup($1)
admin_users = ops, root
logfile = /var/log/pgbouncer.log
max_db_connections = 50
max_user_connections = 40
max_db_client_connections = 300
max_user_client_connections = 200
reserve_pool_size = 5
reserve_pool_timeout = 2.5
stats_period = 30
client_tls_sslmode = verify-full

[users]
app_rw = pool_mode=session
";
        let imported = import(ini).unwrap();
        let toml = &imported.toml;
        for line in [
            "listen = \"0.0.0.0:6432\"",
            "primary = \"postgres://app_rw:s3cr%27et@10.0.0.1:5433/app\"",
            "pool_mode = \"transaction\"",
            "pool_size = 25",
            "max_client_connections = 500",
            "acquire_timeout_ms = 2500",
            "server_idle_timeout_ms = 600000",
            "auth_file = \"/etc/pgbouncer/userlist.txt\"",
            "auth_user = \"pgbouncer\"",
            "auth_hba_file = \"/etc/pgbouncer/hba.conf\"",
            "auth_query = \"SELECT usename, passwd FROM public.user_lookup($1)\"",
            "admin_users = [\"ops\", \"root\"]",
            "tls_mode = \"require\"",
            "max_db_connections = 50  # max_db_connections",
            "max_user_connections = 40  # max_user_connections",
            "max_db_client_connections = 300  # max_db_client_connections",
            "max_user_client_connections = 200  # max_user_client_connections",
            "reserve_pool_size = 5  # reserve_pool_size",
            "reserve_pool_timeout_ms = 2500  # reserve_pool_timeout",
            "stats_period_ms = 30000  # stats_period",
        ] {
            assert!(toml.contains(line), "{line} in:\n{toml}");
        }
        let notes = imported.not_carried.join("\n");
        for says in [
            "reports = … dbname=reporting",
            "pool_size=5",
            "other at 10.0.0.9:5432",
            "logfile",
            "verify-full",
            "[users] app_rw",
        ] {
            assert!(notes.contains(says), "{says} in:\n{notes}");
        }
    }

    #[test]
    fn a_query_wait_timeout_of_0_is_named_not_turned_into_no_wait() {
        let imported =
            import("[databases]\napp = host=db dbname=app\n[pgbouncer]\nquery_wait_timeout = 0\n")
                .unwrap();
        assert!(
            !imported.toml.contains("acquire_timeout_ms"),
            "{}",
            imported.toml
        );
        let notes = imported.not_carried.join("\n");
        assert!(
            notes.contains("query_wait_timeout = 0: 0 (wait forever) has no lsngate equivalent"),
            "{notes}"
        );
    }

    #[test]
    fn a_broken_ini_is_named_by_its_line() {
        assert!(
            import("[pgbouncer]\nnonsense\n")
                .unwrap_err()
                .contains("line 2")
        );
        assert!(
            import("[pgbouncer]\nlisten_port = 1\n")
                .unwrap_err()
                .contains("[databases] is empty")
        );
        assert!(
            import("[databases]\na = host=x\n[pgbouncer]\ndefault_pool_size = lots\n")
                .unwrap_err()
                .contains("default_pool_size")
        );
    }
}
