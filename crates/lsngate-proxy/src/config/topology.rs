//! Where the proxy learns its node set: `static` (the configured primary and replicas, changed
//! by a reload) or `patroni` (the members Patroni's REST API lists, followed live). `discover`
//! and `dns` are named by the interface but not built: choosing them is refused at startup with
//! an error that says so, rather than silently running static.

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
}

impl TopologySource {
    /// `static` or `patroni`, as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            TopologySource::Static => "static",
            TopologySource::Patroni => "patroni",
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
}

impl Default for TopologyConfig {
    fn default() -> Self {
        TopologyConfig {
            source: TopologySource::Static,
            patroni_urls: Vec::new(),
            poll: Duration::from_millis(defaults::TOPOLOGY_POLL_MS),
            request_timeout: Duration::from_millis(defaults::PATRONI_TIMEOUT_MS),
            settle_polls: defaults::TOPOLOGY_SETTLE_POLLS,
        }
    }
}

/// The topology keys of `file`, checked.
pub(super) fn topology_config(file: &FileConfig) -> Result<TopologyConfig, ConfigError> {
    let bad = |why: String| ConfigError::Topology(why);
    let source = match file.topology.as_deref().unwrap_or("static") {
        "static" => TopologySource::Static,
        "patroni" => TopologySource::Patroni,
        unbuilt @ ("discover" | "dns") => {
            return Err(bad(format!(
                "topology = \"{unbuilt}\" is not built yet (issue #26); use \"patroni\" with \
                 --patroni-url, or \"static\" with --replica"
            )));
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
    })
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
