//! Client TLS: the `tls_mode` policy and the rustls acceptor built from `tls_cert` / `tls_key`,
//! checked when the config is built so a bad certificate fails the start (or the reload), not
//! the first client that asks for TLS. TLS towards servers is the node URLs' `sslmode`
//! (`node_url`).

use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use super::{ConfigError, FileConfig};

/// Whether clients may, must or must not use TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// SSLRequest is answered 'N' (default without a certificate).
    Disable,
    /// TLS when the client asks (default with a certificate).
    Allow,
    /// Clients that do not start TLS are refused.
    Require,
}

/// The server side of TLS, ready to accept clients.
#[derive(Clone)]
pub struct TlsSettings {
    /// Acceptor built from tls_cert / tls_key.
    pub acceptor: tokio_rustls::TlsAcceptor,
    /// Refuse clients that do not upgrade.
    pub required: bool,
}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("required", &self.required)
            .finish_non_exhaustive()
    }
}

fn tls_settings(cert: &Path, key: &Path, required: bool) -> Result<TlsSettings, ConfigError> {
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let tls = |what: &str, e: &dyn std::fmt::Display| ConfigError::Tls(format!("{what}: {e}"));
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| tls(&cert.display().to_string(), &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls(&cert.display().to_string(), &e))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| tls(&key.display().to_string(), &e))?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls("protocol versions", &e))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| tls("certificate/key pair", &e))?;
    Ok(TlsSettings {
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        required,
    })
}

/// Client TLS as the file asks for it: `tls_mode` (default: allow with a certificate, disable
/// without) over `tls_cert` and `tls_key`.
pub(super) fn client_tls(file: &FileConfig) -> Result<Option<TlsSettings>, ConfigError> {
    let mode = file.tls_mode.unwrap_or(if file.tls_cert.is_some() {
        TlsMode::Allow
    } else {
        TlsMode::Disable
    });
    match (mode, &file.tls_cert, &file.tls_key) {
        (TlsMode::Disable, _, _) => Ok(None),
        (_, Some(cert), Some(key)) => tls_settings(cert, key, mode == TlsMode::Require).map(Some),
        _ => Err(ConfigError::Tls(format!(
            "tls_mode {mode:?} needs both tls_cert and tls_key"
        ))),
    }
}
