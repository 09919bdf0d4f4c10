//! What each `SHOW` answers, as a table read from the proxy's live state: the pools and their
//! queues, the client registry, the server connections each node holds, the config, and for
//! lsngate's own `SHOW REPLICAS` / `SHOW CAUSAL` the very views `/status` serves
//! (`Watcher::views`, `admin::causal_status`). Columns carry PgBouncer's names where the
//! concept is the same, so scripts and exporters written for it read them; columns of concepts
//! lsngate lacks are left out rather than filled with zeros.

use std::time::{SystemTime, UNIX_EPOCH};

use super::command::{HELP, Show};
use super::settings;
use crate::net::backend::build::{INT8_OID, TEXT_OID};
use crate::proxy::Proxy;

/// A result set: columns (name, type OID) and rows of text values.
#[derive(Debug, Default)]
pub struct Table {
    /// (name, type OID).
    pub columns: Vec<(&'static str, u32)>,
    /// Values as text, NULL as None.
    pub rows: Vec<Vec<Option<String>>>,
}

impl Table {
    fn new(columns: &[(&'static str, u32)]) -> Table {
        Table {
            columns: columns.to_vec(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, values: Vec<Option<String>>) {
        debug_assert_eq!(values.len(), self.columns.len());
        self.rows.push(values);
    }
}

const T: u32 = TEXT_OID;
const N: u32 = INT8_OID;

fn text(v: impl ToString) -> Option<String> {
    Some(v.to_string())
}

/// `2026-12-05 03:12:09 UTC`, as PgBouncer prints times.
fn utc(time: SystemTime) -> String {
    let secs = time
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// The table a SHOW answers.
pub fn show(proxy: &Proxy, what: Show) -> Table {
    match what {
        Show::Help => help(),
        Show::Pools => pools(proxy),
        Show::Clients => clients(proxy),
        Show::Servers => servers(proxy),
        Show::Stats => stats(proxy, StatsView::Both),
        Show::StatsTotals => stats(proxy, StatsView::Totals),
        Show::StatsAverages => stats(proxy, StatsView::Averages),
        Show::Databases => databases(proxy),
        Show::Users => users(proxy),
        Show::Config => config(proxy),
        Show::Lists => lists(proxy),
        Show::Version => version(),
        Show::State => state(proxy),
        Show::Replicas => replicas(proxy),
        Show::Causal => causal(proxy),
        Show::Budget => budget(proxy),
        Show::Topology => topology(proxy),
    }
}

/// One row per candidate budget (`guard_cap_hit`: the primary guard's cap would be hit in a lag
/// event as bad as the worst sample); the recommended one is marked and carries the reason. Before
/// any lag is sampled, one row whose reason says why there is no advice.
fn budget(proxy: &Proxy) -> Table {
    let mut table = Table::new(&[
        ("budget_ms", N),
        ("replica_share", T),
        ("fallbacks_per_s", T),
        ("held_connections_mean", T),
        ("held_connections_p99", T),
        ("guard_cap_hit", T),
        ("recommended", T),
        ("reason", T),
    ]);
    match super::super::budget::current(proxy) {
        Ok(report) => {
            for c in &report.candidates {
                let pick = c.budget_ms == report.recommended_budget_ms;
                table.row(vec![
                    text(c.budget_ms),
                    text(format!("{:.3}", c.replica_share)),
                    text(format!("{:.1}", c.fallbacks_per_s)),
                    text(format!("{:.2}", c.held_connections_mean)),
                    text(format!("{:.2}", c.held_connections_p99)),
                    text(if c.guard_cap_hit { "yes" } else { "no" }),
                    text(if pick { "yes" } else { "no" }),
                    pick.then(|| report.reason.clone()),
                ]);
            }
        }
        Err(e) => table.row(vec![None, None, None, None, None, None, None, text(e)]),
    }
    table
}

fn help() -> Table {
    let mut table = Table::new(&[("command", T)]);
    HELP.iter().for_each(|line| table.row(vec![text(line)]));
    table
}

/// The role a login user's statements run as: its `server_user`, else the node URLs' user.
fn server_role(proxy: &Proxy, user: &str) -> String {
    let config = proxy.config();
    config
        .user(user)
        .and_then(|u| u.server_login.as_ref())
        .map(|l| l.user.clone())
        .unwrap_or_else(|| config.nodes[0].user.clone())
}

fn pools(proxy: &Proxy) -> Table {
    let mut table = Table::new(&[
        ("database", T),
        ("user", T),
        ("cl_active", N),
        ("cl_waiting", N),
        ("sv_active", N),
        ("sv_idle", N),
        ("maxwait", N),
        ("maxwait_us", N),
        ("pool_mode", T),
        ("node", T),
        ("node_role", T),
        ("paused", N),
    ]);
    let config = proxy.config();
    let clients = proxy.registry.all();
    for node in proxy.nodes.all().iter() {
        for pool in node.pools() {
            let activity = pool.activity();
            let logged_in = clients
                .iter()
                .filter(|c| {
                    c.database == pool.database() && server_role(proxy, &c.user) == pool.role()
                })
                .count();
            let wait = activity.longest_wait;
            table.row(vec![
                text(pool.database()),
                text(pool.role()),
                text(logged_in),
                text(activity.waiting),
                text(activity.lent),
                text(activity.idle),
                text(wait.as_secs()),
                text(wait.subsec_micros()),
                text(format!("{:?}", config.pool_mode).to_lowercase()),
                text(node.url.address()),
                text(node.role().as_str()),
                text(u8::from(activity.paused)),
            ]);
        }
    }
    table
}

fn clients(proxy: &Proxy) -> Table {
    let mut table = Table::new(&[
        ("type", T),
        ("user", T),
        ("database", T),
        ("state", T),
        ("addr", T),
        ("port", N),
        ("local_addr", T),
        ("local_port", N),
        ("connect_time", T),
        ("id", N),
        ("tls", T),
        ("application_name", T),
    ]);
    for client in proxy.registry.all() {
        table.row(vec![
            text("C"),
            text(&client.user),
            text(&client.database),
            text(client.state()),
            client.peer.map(|a| a.ip().to_string()),
            client.peer.map(|a| a.port().to_string()),
            client.local.map(|a| a.ip().to_string()),
            client.local.map(|a| a.port().to_string()),
            text(utc(client.connected_at)),
            text(client.id),
            text(if client.tls { "yes" } else { "" }),
            text(&client.application_name),
        ]);
    }
    table
}

fn servers(proxy: &Proxy) -> Table {
    let mut table = Table::new(&[
        ("type", T),
        ("user", T),
        ("database", T),
        ("state", T),
        ("addr", T),
        ("port", N),
        ("connect_time", T),
        ("remote_pid", N),
        ("node_role", T),
    ]);
    for node in proxy.nodes.all().iter() {
        let idle: Vec<i32> = node
            .pools()
            .iter()
            .flat_map(|p| p.activity().idle_pids)
            .collect();
        let (host, port) = node.url.address().rsplit_once(':').map_or_else(
            || (node.url.address(), String::new()),
            |(h, p)| (h.to_string(), p.to_string()),
        );
        for connection in node.connections.open() {
            let Some(label) = connection.label.get() else {
                continue;
            };
            let state = if idle.contains(&label.pid) {
                "idle"
            } else {
                "active"
            };
            table.row(vec![
                text("S"),
                text(&label.role),
                text(&label.database),
                text(state),
                text(&host),
                text(&port),
                text(utc(label.opened_at)),
                text(label.pid),
                text(node.role().as_str()),
            ]);
        }
    }
    table
}

/// Which of PgBouncer's three stats tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StatsView {
    /// SHOW STATS: `total_*` then `avg_*`.
    Both,
    /// SHOW STATS_TOTALS: the totals, unprefixed.
    Totals,
    /// SHOW STATS_AVERAGES: the averages, unprefixed.
    Averages,
}

/// Per database: server assignments (checkouts), transactions, queries, bytes and the time
/// they took and queued, as PgBouncer's SHOW STATS / STATS_TOTALS / STATS_AVERAGES name them.
/// Averages are over the last complete `stats_period_ms` (see `crate::stats`).
fn stats(proxy: &Proxy, view: StatsView) -> Table {
    const NAMES: [&str; 8] = [
        "server_assignment_count",
        "xact_count",
        "query_count",
        "bytes_received",
        "bytes_sent",
        "xact_time",
        "query_time",
        "wait_time",
    ];
    // SHOW STATS' own names (its byte columns are total_received/avg_recv).
    const TOTAL: [&str; 8] = [
        "total_server_assignment_count",
        "total_xact_count",
        "total_query_count",
        "total_received",
        "total_sent",
        "total_xact_time",
        "total_query_time",
        "total_wait_time",
    ];
    const AVG: [&str; 8] = [
        "avg_server_assignment_count",
        "avg_xact_count",
        "avg_query_count",
        "avg_recv",
        "avg_sent",
        "avg_xact_time",
        "avg_query_time",
        "avg_wait_time",
    ];
    let mut columns = vec![("database", T)];
    match view {
        StatsView::Both => columns.extend(TOTAL.iter().chain(&AVG).map(|name| (*name, N))),
        StatsView::Totals | StatsView::Averages => {
            columns.extend(NAMES.iter().map(|name| (*name, N)))
        }
    }
    let mut table = Table::new(&columns);
    let by_database = proxy.database_stats();
    let averages = proxy.stats_periods.lock().expect("stats lock").averages(
        &by_database,
        proxy.traffic.since,
        std::time::Instant::now(),
    );
    for (database, figures) in by_database {
        let average = averages.get(&database).copied().unwrap_or_default();
        let values: Vec<u64> = match view {
            StatsView::Both => [figures.totals(), average].concat(),
            StatsView::Totals => figures.totals().to_vec(),
            StatsView::Averages => average.to_vec(),
        };
        let mut row = vec![text(database)];
        row.extend(values.into_iter().map(text));
        table.row(row);
    }
    table
}

fn databases(proxy: &Proxy) -> Table {
    let mut table = Table::new(&[
        ("name", T),
        ("host", T),
        ("port", N),
        ("database", T),
        ("force_user", T),
        ("pool_size", N),
        ("reserve_pool", N),
        ("pool_mode", T),
        ("max_connections", N),
        ("current_connections", N),
        ("paused", N),
        ("disabled", N),
    ]);
    let config = proxy.config();
    let primary = &config.nodes[0];
    let (host, port) = primary
        .address()
        .rsplit_once(':')
        .map(|(h, p)| (h.to_string(), p.to_string()))
        .unwrap_or_default();
    let mut names: std::collections::BTreeSet<String> = proxy
        .nodes
        .pools_of(None)
        .iter()
        .map(|p| p.database().to_string())
        .collect();
    names.extend(proxy.nodes.gates.named());
    let gates = &proxy.nodes.gates;
    let mode = format!("{:?}", config.pool_mode).to_lowercase();
    for name in names {
        let open: usize = proxy
            .nodes
            .pools_of(Some(&name))
            .iter()
            .map(|p| p.stats().0)
            .sum();
        table.row(vec![
            text(&name),
            text(&host),
            text(&port),
            text(&name),
            text(&primary.user),
            text(config.pool_size),
            text(config.reserve_pool_size),
            text(&mode),
            text(config.max_db_connections),
            text(open),
            text(u8::from(gates.is_paused(&name))),
            text(u8::from(gates.is_disabled(&name))),
        ]);
    }
    for name in crate::config::CONSOLE_DATABASES {
        table.row(vec![
            text(name),
            None,
            text(config.listen.port()),
            text(name),
            None,
            text(0),
            text(0),
            text("statement"),
            text(0),
            text(0),
            text(0),
            text(0),
        ]);
    }
    table
}

fn users(proxy: &Proxy) -> Table {
    let mut table = Table::new(&[
        ("name", T),
        ("pool_mode", T),
        ("server_user", T),
        ("console", T),
    ]);
    let config = proxy.config();
    for user in &config.users {
        let console = match config.console_access(&user.name) {
            Some(crate::config::ConsoleAccess::Admin) => "admin",
            Some(crate::config::ConsoleAccess::Stats) => "stats",
            None => "",
        };
        table.row(vec![
            text(&user.name),
            None,
            text(server_role(proxy, &user.name)),
            text(console),
        ]);
    }
    table
}

fn config(proxy: &Proxy) -> Table {
    let mut table = Table::new(&[("key", T), ("value", T), ("default", T), ("changeable", T)]);
    for row in settings::rows(&proxy.config()) {
        table.row(row.into_iter().map(Some).collect());
    }
    table
}

fn lists(proxy: &Proxy) -> Table {
    let mut table = Table::new(&[("list", T), ("items", N)]);
    let pools = proxy.nodes.pools_of(None);
    let databases: std::collections::BTreeSet<&str> = pools.iter().map(|p| p.database()).collect();
    let servers: usize = pools.iter().map(|p| p.stats().0).sum();
    let config = proxy.config();
    let counts = [
        ("databases", databases.len()),
        ("users", config.users.len()),
        ("pools", pools.len()),
        ("used_clients", proxy.registry.all().len()),
        ("used_servers", servers),
        ("nodes", proxy.nodes.all().len()),
    ];
    for (list, items) in counts {
        table.row(vec![text(list), text(items)]);
    }
    table
}

fn version() -> Table {
    let mut table = Table::new(&[("version", T)]);
    table.row(vec![text(format!("lsngate {}", env!("CARGO_PKG_VERSION")))]);
    table
}

fn state(proxy: &Proxy) -> Table {
    let mut table = Table::new(&[("key", T), ("value", T)]);
    let yes = |b: bool| text(if b { "yes" } else { "no" });
    let drain = proxy.draining();
    let draining = drain != crate::proxy::Drain::Serving;
    let paused = proxy.nodes.gates.all_paused();
    table.row(vec![text("active"), yes(!paused && !draining)]);
    table.row(vec![text("paused"), yes(paused)]);
    table.row(vec![text("draining"), yes(draining)]);
    table.row(vec![text("shutdown"), text(drain.name())]);
    table
}

fn replicas(proxy: &Proxy) -> Table {
    let mut table = Table::new(&[
        ("node", T),
        ("role", T),
        ("healthy", T),
        ("replayed_lsn", T),
        ("lag_bytes", N),
        ("lag_ms", T),
        ("busy", N),
        ("timeline", N),
        ("receiver", T),
        ("last_error", T),
    ]);
    let views = proxy.causal.watcher.views(&proxy.nodes);
    for node in proxy.nodes.all().iter() {
        let view = views.iter().find(|v| v.node == node.index);
        table.row(vec![
            text(node.url.address()),
            text(node.role().as_str()),
            text(if node.healthy() { "yes" } else { "no" }),
            view.and_then(|v| v.replayed.clone()),
            view.and_then(|v| v.lag_bytes).map(|b| b.to_string()),
            view.and_then(|v| v.lag_ms).map(|ms| format!("{ms:.1}")),
            text(node.busy()),
            view.and_then(|v| v.timeline).map(|t| t.to_string()),
            view.map(|v| v.receiver.to_string()),
            node.last_error.lock().expect("error lock").clone(),
        ]);
    }
    table
}

/// One row per member the topology source lists (none for a static topology).
fn topology(proxy: &Proxy) -> Table {
    let mut table = Table::new(&[
        ("source", T),
        ("member", T),
        ("address", T),
        ("role", T),
        ("state", T),
        ("timeline", N),
        ("lag_bytes", N),
        ("nofailover", T),
        ("noloadbalance", T),
        ("in_node_set", T),
        ("last_poll_ms_ago", N),
        ("last_error", T),
    ]);
    let source = proxy.config().topology.source.as_str();
    let (last_poll, last_error) = proxy.topology.last_poll();
    let ago = last_poll.map(|t| t.elapsed().as_millis().to_string());
    let yes_no = |b: bool| text(if b { "yes" } else { "no" });
    for (member, in_set) in proxy.topology.members() {
        table.row(vec![
            text(source),
            text(&member.name),
            text(crate::config::host_port(&member.host, member.port)),
            text(&member.role),
            text(&member.state),
            member.timeline.map(|t| t.to_string()),
            member.lag.map(|l| l.to_string()),
            yes_no(member.nofailover),
            yes_no(member.noloadbalance),
            yes_no(in_set),
            ago.clone(),
            last_error.clone(),
        ]);
    }
    table
}

/// One row from the causal part of `/status`, the same document the dashboard reads.
fn causal(proxy: &Proxy) -> Table {
    let status = super::super::causal_status(proxy);
    let field = |path: &[&str]| {
        let mut value = &status;
        for key in path {
            value = &value[*key];
        }
        match value {
            serde_json::Value::Null => None,
            serde_json::Value::String(s) => Some(s.clone()),
            other => Some(other.to_string()),
        }
    };
    let mut columns = vec![("consistency", T), ("wait_timeout_ms", N), ("fallback", T)];
    let mut row = vec![
        field(&["consistency"]),
        field(&["wait_timeout_ms"]),
        field(&["fallback"]),
    ];
    // Read outcomes as `reads_<outcome>`: `fallback` alone is the policy column.
    const READS: [&str; 6] = [
        "reads_replica",
        "reads_waited",
        "reads_fallback",
        "reads_no_replica",
        "reads_stale",
        "reads_error",
    ];
    for (outcome, column) in crate::causal::Outcome::ALL.iter().zip(READS) {
        debug_assert_eq!(column, format!("reads_{}", outcome.as_str()));
        columns.push((column, N));
        row.push(field(&["outcomes", outcome.as_str()]));
    }
    let wait_total = status["wait_total_ms"]
        .as_f64()
        .map(|ms| format!("{ms:.3}"));
    columns.extend([
        ("wait_total_ms", T),
        ("breaker_open", T),
        ("fallbacks_in_flight", N),
        ("fallback_rate", T),
        ("refused_reads", N),
        ("rescued_reads", N),
        ("primary_position", T),
    ]);
    row.extend([
        wait_total,
        field(&["breaker", "open"]),
        field(&["breaker", "fallbacks_in_flight"]),
        field(&["breaker", "fallback_rate"]),
        field(&["breaker", "refused_reads"]),
        field(&["breaker", "rescued_reads"]),
        field(&["primary", "position"]),
    ]);
    Table {
        columns,
        rows: vec![row],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn times_print_as_pgbouncer_prints_them() {
        assert_eq!(utc(UNIX_EPOCH), "1970-01-01 00:00:00 UTC");
        let t = UNIX_EPOCH + Duration::from_secs(1_796_440_329);
        assert_eq!(utc(t), "2026-12-05 03:12:09 UTC");
    }
}
