//! Where the proxy learns its node set: `static` (the configured primary and replicas, changed
//! by a reload), `patroni` (the members Patroni's REST API lists, followed live) or `discover`
//! (the replicas streaming from the primary, in its `pg_stat_replication`, placed by a mapping
//! or template of their `application_name`) or `dns` (the A/AAAA or SRV records of a name, such
//! as a Kubernetes headless service, re-resolved at every poll).

use std::time::Duration;

use super::{ConfigError, FileConfig, defaults};

/// The source of the node set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TopologySource {
    /// The configured `primary` and `replicas`.
    #[default]
    Static,
    /// Patroni's `/cluster` on the `patroni_urls`.
    Patroni,
    /// The primary's `pg_stat_replication`.
    Discover,
    /// The records of `dns_name`.
    Dns,
}

impl TopologySource {
    /// `static` or `patroni`, as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            TopologySource::Static => "static",
            TopologySource::Patroni => "patroni",
            TopologySource::Discover => "discover",
            TopologySource::Dns => "dns",
        }
    }
}

/// How the node set is found and followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyConfig {
    /// Where the node set comes from.
    pub source: TopologySource,
    /// Patroni REST API bases (`http://host:port`), tried in order until one answers.
    pub patroni_urls: Vec<(String, u16)>,
    /// Time between two polls of `/cluster`.
    pub poll: Duration,
    /// Bound of one `/cluster` request (connect, send, read), per URL.
    pub request_timeout: Duration,
    /// Consecutive polls a member must show a changed state in before the change applies.
    pub settle_polls: u32,
    /// `discover`: where a replica with this `application_name` listens.
    pub discover_map: Vec<(String, (String, u16))>,
    /// `discover`: `host[:port]` with `{application_name}` in it, for names not in the map.
    pub discover_template: Option<String>,
    /// `dns`: the name, its port for A/AAAA records and the server asked.
    pub dns: Option<DnsConfig>,
}

/// Where `topology = "dns"` finds the members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsConfig {
    /// The name: A/AAAA records, or SRV records when it starts with `_`.
    pub name: String,
    /// The members' port for A/AAAA records.
    pub port: u16,
    /// The server asked; None = the system's resolver (A/AAAA) or resolv.conf's (SRV).
    pub server: Option<std::net::SocketAddr>,
}

impl DnsConfig {
    /// Whether the name asks for SRV records (`_service._proto.name`).
    pub fn is_srv(&self) -> bool {
        self.name.starts_with('_')
    }
}

impl Default for TopologyConfig {
    fn default() -> Self {
        TopologyConfig {
            source: TopologySource::Static,
            patroni_urls: Vec::new(),
            poll: Duration::from_millis(defaults::TOPOLOGY_POLL_MS),
            request_timeout: Duration::from_millis(defaults::PATRONI_TIMEOUT_MS),
            settle_polls: defaults::TOPOLOGY_SETTLE_POLLS,
            discover_map: Vec::new(),
            discover_template: None,
            dns: None,
        }
    }
}

impl TopologyConfig {
    /// Where the replica streaming as `application_name` listens (`default_port` when the
    /// template names none), or None when neither the map nor the template places it.
    pub fn place(&self, application_name: &str, default_port: u16) -> Option<(String, u16)> {
        if let Some((_, address)) = self
            .discover_map
            .iter()
            .find(|(n, _)| n == application_name)
        {
            return Some(address.clone());
        }
        let filled = self
            .discover_template
            .as_ref()?
            .replace("{application_name}", application_name);
        parse_address(&filled, default_port).ok()
    }
}

/// The topology keys of `file`, checked; `primary_port` is the port A/AAAA members default to.
pub(super) fn topology_config(
    file: &FileConfig,
    primary_port: u16,
) -> Result<TopologyConfig, ConfigError> {
    let bad = |why: String| ConfigError::Topology(why);
    let source = match file.topology.as_deref().unwrap_or("static") {
        "static" => TopologySource::Static,
        "patroni" => TopologySource::Patroni,
        "discover" => TopologySource::Discover,
        "dns" => TopologySource::Dns,
        other => {
            return Err(bad(format!(
                "unknown topology {other:?}; expected static, patroni, discover or dns"
            )));
        }
    };
    let patroni_urls = file
        .patroni_urls
        .iter()
        .map(|url| parse_http_url(url).map_err(bad))
        .collect::<Result<Vec<_>, _>>()?;
    if source == TopologySource::Patroni && patroni_urls.is_empty() {
        return Err(bad(
            "topology = \"patroni\" needs at least one Patroni REST API URL: pass \
             --patroni-url http://host:8008 (repeat for each member) or set patroni_urls"
                .into(),
        ));
    }
    let discover_map = file
        .discover_replicas
        .iter()
        .map(|entry| {
            let (name, address) = entry.split_once('=').ok_or_else(|| {
                bad(format!(
                    "discover_replicas entry {entry:?}: expected application_name=host:port, \
                     e.g. replica1=10.0.0.2:5432"
                ))
            })?;
            let address = parse_address(address, 5432)
                .map_err(|why| bad(format!("discover_replicas entry {entry:?}: {why}")))?;
            Ok((name.to_string(), address))
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    if let Some(template) = &file.discover_template
        && !template.contains("{application_name}")
    {
        return Err(bad(format!(
            "discover_template {template:?} has no {{application_name}}: every replica would get \
             one address; e.g. \"{{application_name}}.db.internal:5432\""
        )));
    }
    if source == TopologySource::Discover
        && discover_map.is_empty()
        && file.discover_template.is_none()
    {
        return Err(bad(
            "topology = \"discover\" needs to know where each replica listens: pass \
             --discover-replica application_name=host:port (repeat) or --discover-template \
             '{application_name}.db.internal:5432'"
                .into(),
        ));
    }
    let dns = dns_config(file, source, primary_port).map_err(bad)?;
    if source == TopologySource::Static && !patroni_urls.is_empty() {
        return Err(bad(
            "patroni_urls are given but topology is static: add --topology patroni".into(),
        ));
    }
    Ok(TopologyConfig {
        source,
        patroni_urls,
        poll: Duration::from_millis(
            file.topology_poll_ms
                .unwrap_or(defaults::TOPOLOGY_POLL_MS)
                .max(50),
        ),
        request_timeout: Duration::from_millis(defaults::PATRONI_TIMEOUT_MS),
        settle_polls: file
            .topology_settle_polls
            .unwrap_or(defaults::TOPOLOGY_SETTLE_POLLS)
            .max(1),
        discover_map,
        discover_template: file.discover_template.clone(),
        dns,
    })
}

/// The `dns_*` keys: only with `topology = "dns"`, which needs `dns_name`.
fn dns_config(
    file: &FileConfig,
    source: TopologySource,
    primary_port: u16,
) -> Result<Option<DnsConfig>, String> {
    if source != TopologySource::Dns {
        let set = [
            ("dns_name", file.dns_name.is_some()),
            ("dns_port", file.dns_port.is_some()),
            ("dns_server", file.dns_server.is_some()),
        ];
        return match set.iter().find(|(_, is_set)| *is_set) {
            Some((key, _)) => Err(format!(
                "{key} is set but topology is {}; add --topology dns",
                source.as_str()
            )),
            None => Ok(None),
        };
    }
    let name = file.dns_name.clone().filter(|n| !n.is_empty()).ok_or(
        "topology = \"dns\" needs the name whose records are the members: pass \
                --dns-name pg.default.svc.cluster.local (A/AAAA) or \
                --dns-name _postgresql._tcp.pg.default.svc.cluster.local (SRV)",
    )?;
    let server = file
        .dns_server
        .as_deref()
        .map(|text| {
            text.parse::<std::net::SocketAddr>()
                .or_else(|_| text.parse::<std::net::IpAddr>().map(|ip| (ip, 53).into()))
                .map_err(|_| format!("dns_server {text:?} is not IP[:PORT], e.g. 10.96.0.10:53"))
        })
        .transpose()?;
    let config = DnsConfig {
        port: file.dns_port.unwrap_or(primary_port),
        name,
        server,
    };
    if config.is_srv() && file.dns_port.is_some() {
        return Err(format!(
            "dns_port is set but {} asks for SRV records, which carry each member's port; \
             remove dns_port",
            config.name
        ));
    }
    Ok(Some(config))
}

/// `host[:port]` (`[v6]:port` too), with `default_port` when none is given.
fn parse_address(text: &str, default_port: u16) -> Result<(String, u16), String> {
    let (host, port) = match text.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') || host.ends_with(']') => (
            host,
            port.parse()
                .map_err(|_| format!("port {port:?} in {text:?} is not a number"))?,
        ),
        _ => (text, default_port),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("{text:?} has no host"));
    }
    Ok((host.to_string(), port))
}

/// `http://host[:port][/]` into host and port (8008, Patroni's default, when left out).
fn parse_http_url(url: &str) -> Result<(String, u16), String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        format!(
            "Patroni URL {url:?} must start with http:// (the proxy does not speak HTTPS to \
             Patroni); e.g. http://10.0.0.1:8008"
        )
    })?;
    let authority = rest.trim_end_matches('/');
    if authority.contains('/') {
        return Err(format!(
            "Patroni URL {url:?} has a path; give the API's base, e.g. http://10.0.0.1:8008 \
             (the proxy asks /cluster itself)"
        ));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || authority.starts_with('[') => {
            let port = port
                .parse()
                .map_err(|_| format!("Patroni URL {url:?}: port {port:?} is not a number"))?;
            (host, port)
        }
        _ => (authority, 8008),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("Patroni URL {url:?} has no host"));
    }
    Ok((host.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(topology: &str, urls: &[&str]) -> FileConfig {
        FileConfig {
            topology: Some(topology.into()),
            patroni_urls: urls.iter().map(|u| u.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn patroni_needs_urls_and_reads_them() {
        let config = topology_config(
            &file("patroni", &["http://127.0.0.1:8008", "http://db2/"]),
            5432,
        )
        .unwrap();
        assert_eq!(config.source, TopologySource::Patroni);
        assert_eq!(
            config.patroni_urls,
            vec![("127.0.0.1".into(), 8008), ("db2".into(), 8008)]
        );
        let error = topology_config(&file("patroni", &[]), 5432)
            .unwrap_err()
            .to_string();
        assert!(error.contains("--patroni-url"), "{error}");
        let error = topology_config(&file("patroni", &["https://db:8008"]), 5432)
            .unwrap_err()
            .to_string();
        assert!(error.contains("must start with http://"), "{error}");
    }

    #[test]
    fn discover_places_replicas_by_map_then_template() {
        let mut f = file("discover", &[]);
        let error = topology_config(&f, 5432).unwrap_err().to_string();
        assert!(error.contains("--discover-replica"), "{error}");
        f.discover_replicas = vec!["replica1=127.0.0.1:5433".into()];
        f.discover_template = Some("{application_name}.db:6543".into());
        let config = topology_config(&f, 5432).unwrap();
        assert_eq!(
            config.place("replica1", 5432),
            Some(("127.0.0.1".into(), 5433))
        );
        assert_eq!(config.place("r9", 5432), Some(("r9.db".into(), 6543)));
        f.discover_template = Some("db.internal".into());
        let error = topology_config(&f, 5432).unwrap_err().to_string();
        assert!(error.contains("has no {application_name}"), "{error}");
        f.discover_template = None;
        f.discover_replicas = vec!["replica1".into()];
        let error = topology_config(&f, 5432).unwrap_err().to_string();
        assert!(
            error.contains("expected application_name=host:port"),
            "{error}"
        );
    }

    #[test]
    fn dns_needs_a_name_and_takes_a_port_and_a_server() {
        let mut f = file("dns", &[]);
        let error = topology_config(&f, 5432).unwrap_err().to_string();
        assert!(error.contains("--dns-name"), "{error}");
        f.dns_name = Some("pg.svc".into());
        let dns = topology_config(&f, 6543).unwrap().dns.unwrap();
        assert_eq!((dns.port, dns.server, dns.is_srv()), (6543, None, false));
        f.dns_server = Some("127.0.0.1".into());
        f.dns_port = Some(5433);
        let dns = topology_config(&f, 6543).unwrap().dns.unwrap();
        assert_eq!(dns.server, Some("127.0.0.1:53".parse().unwrap()));
        assert_eq!(dns.port, 5433);
        f.dns_name = Some("_postgresql._tcp.pg.svc".into());
        let error = topology_config(&f, 5432).unwrap_err().to_string();
        assert!(error.contains("carry each member's port"), "{error}");
        f.dns_port = None;
        f.dns_server = Some("dns.local".into());
        let error = topology_config(&f, 5432).unwrap_err().to_string();
        assert!(error.contains("is not IP[:PORT]"), "{error}");
        let mut stray = file("static", &[]);
        stray.dns_name = Some("pg.svc".into());
        let error = topology_config(&stray, 5432).unwrap_err().to_string();
        assert!(error.contains("add --topology dns"), "{error}");
    }

    #[test]
    fn unknown_sources_are_refused_by_name() {
        let error = topology_config(&file("consul", &[]), 5432)
            .unwrap_err()
            .to_string();
        assert!(error.contains("expected static, patroni"), "{error}");
        assert_eq!(
            topology_config(&FileConfig::default(), 5432)
                .unwrap()
                .source,
            TopologySource::Static
        );
    }
}
