//! Where the proxy learns its node set: `static` (the configured primary and replicas, changed
//! by a reload), `patroni` (the members Patroni's REST API lists, followed live) or `discover`
//! (the replicas streaming from the primary, in its `pg_stat_replication`, placed by a mapping
//! or template of their `application_name`). `dns` is named by the interface but not built:
//! choosing it is refused at startup with an error that says so, rather than silently running
//! static.

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
}

impl TopologySource {
    /// `static` or `patroni`, as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            TopologySource::Static => "static",
            TopologySource::Patroni => "patroni",
            TopologySource::Discover => "discover",
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

/// The topology keys of `file`, checked.
pub(super) fn topology_config(file: &FileConfig) -> Result<TopologyConfig, ConfigError> {
    let bad = |why: String| ConfigError::Topology(why);
    let source = match file.topology.as_deref().unwrap_or("static") {
        "static" => TopologySource::Static,
        "patroni" => TopologySource::Patroni,
        "discover" => TopologySource::Discover,
        "dns" => {
            return Err(bad(
                "topology = \"dns\" is not built yet (issue #26); use \"patroni\" with \
                 --patroni-url, \"discover\" with --discover-replica, or \"static\" with --replica"
                    .into(),
            ));
        }
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
    })
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
        let config =
            topology_config(&file("patroni", &["http://127.0.0.1:8008", "http://db2/"])).unwrap();
        assert_eq!(config.source, TopologySource::Patroni);
        assert_eq!(
            config.patroni_urls,
            vec![("127.0.0.1".into(), 8008), ("db2".into(), 8008)]
        );
        let error = topology_config(&file("patroni", &[]))
            .unwrap_err()
            .to_string();
        assert!(error.contains("--patroni-url"), "{error}");
        let error = topology_config(&file("patroni", &["https://db:8008"]))
            .unwrap_err()
            .to_string();
        assert!(error.contains("must start with http://"), "{error}");
    }

    #[test]
    fn discover_places_replicas_by_map_then_template() {
        let mut f = file("discover", &[]);
        let error = topology_config(&f).unwrap_err().to_string();
        assert!(error.contains("--discover-replica"), "{error}");
        f.discover_replicas = vec!["replica1=127.0.0.1:5433".into()];
        f.discover_template = Some("{application_name}.db:6543".into());
        let config = topology_config(&f).unwrap();
        assert_eq!(
            config.place("replica1", 5432),
            Some(("127.0.0.1".into(), 5433))
        );
        assert_eq!(config.place("r9", 5432), Some(("r9.db".into(), 6543)));
        f.discover_template = Some("db.internal".into());
        let error = topology_config(&f).unwrap_err().to_string();
        assert!(error.contains("has no {application_name}"), "{error}");
        f.discover_template = None;
        f.discover_replicas = vec!["replica1".into()];
        let error = topology_config(&f).unwrap_err().to_string();
        assert!(
            error.contains("expected application_name=host:port"),
            "{error}"
        );
    }

    #[test]
    fn unbuilt_and_unknown_sources_are_refused_by_name() {
        let error = topology_config(&file("dns", &[])).unwrap_err().to_string();
        assert!(error.contains("not built yet"), "{error}");
        let error = topology_config(&file("consul", &[]))
            .unwrap_err()
            .to_string();
        assert!(error.contains("expected static, patroni"), "{error}");
        assert_eq!(
            topology_config(&FileConfig::default()).unwrap().source,
            TopologySource::Static
        );
    }
}
