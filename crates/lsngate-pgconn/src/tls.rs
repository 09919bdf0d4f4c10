//! TLS towards PostgreSQL servers with rustls (ring), as libpq's `sslmode` describes it:
//!
//! | sslmode | TLS | certificate check |
//! |---|---|---|
//! | `disable` | never | — |
//! | `allow` | only when the server refuses plaintext (pg_hba.conf `hostssl`) | as `require` |
//! | `prefer` (default) | when the server offers it | as `require` |
//! | `require` | always | none; with `sslrootcert`, the chain (as libpq) |
//! | `verify-ca` | always | chain against `sslrootcert` |
//! | `verify-full` | always | chain and host name |
//!
//! Also the SSLRequest exchange for code that speaks the protocol itself (the proxy), and
//! messages for handshake failures that name the cause and the fix. Nothing here reads libpq's
//! default files (`~/.postgresql/root.crt`): certificates come only from the URL.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::client::WebPkiServerVerifier;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::crypto::{CryptoProvider, ring};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio_rustls::rustls::{self, CertificateError, ClientConfig, DigitallySignedStruct};

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Plaintext only.
    Disable,
    /// Plaintext first; TLS when the server's pg_hba.conf refuses plaintext.
    Allow,
    /// TLS when the server offers it, else plaintext (libpq's default).
    #[default]
    Prefer,
    /// TLS or nothing; no certificate check unless `sslrootcert` is given.
    Require,
    /// TLS, certificate chain checked against `sslrootcert`.
    VerifyCa,
    /// TLS, chain and host name checked.
    VerifyFull,
}

impl SslMode {
    /// Parses libpq's spelling.
    pub fn parse(text: &str) -> Option<SslMode> {
        Some(match text {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    /// libpq's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// Whether a connection without TLS is refused.
    pub fn requires_tls(self) -> bool {
        matches!(
            self,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull
        )
    }

    /// The nearest of tokio-postgres' three modes, for the first attempt (`allow` starts in
    /// plaintext, see [`crate::connect`]).
    pub fn driver_mode(self) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode as Driver;
        match self {
            SslMode::Disable | SslMode::Allow => Driver::Disable,
            SslMode::Prefer => Driver::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => Driver::Require,
        }
    }
}

impl std::fmt::Display for SslMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The TLS parameters of one connection string.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TlsOptions {
    /// `sslmode`.
    pub mode: SslMode,
    /// `sslrootcert`: a PEM file of trusted CAs, or `system` for the system's CA bundle.
    pub root_cert: Option<String>,
    /// `sslcert`: the client certificate chain (PEM).
    pub cert: Option<PathBuf>,
    /// `sslkey`: the client certificate's private key (PEM).
    pub key: Option<PathBuf>,
}

impl TlsOptions {
    /// Refuses combinations libpq refuses, before any file is read.
    fn check(&self) -> Result<(), TlsFileError> {
        let conflict = |s: String| Err(TlsFileError(s));
        if matches!(self.mode, SslMode::VerifyCa | SslMode::VerifyFull) && self.root_cert.is_none()
        {
            return conflict(format!(
                "sslmode={} needs sslrootcert=<file>, the PEM file of the CA that signed the server's certificate (lsngate does not read ~/.postgresql/root.crt)",
                self.mode
            ));
        }
        if self.root_cert.as_deref() == Some("system") && self.mode != SslMode::VerifyFull {
            return conflict(format!(
                "sslmode={} is too weak for sslrootcert=system (any public CA could vouch for any name); use sslmode=verify-full",
                self.mode
            ));
        }
        match (&self.cert, &self.key) {
            (Some(_), None) => conflict("sslcert is set but sslkey is not; give both".into()),
            (None, Some(_)) => conflict("sslkey is set but sslcert is not; give both".into()),
            _ => Ok(()),
        }
    }
}

/// Why the TLS settings cannot be used: a combination libpq refuses, or a file that cannot be
/// read or used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TlsFileError(pub String);

/// Where `sslrootcert=system` looks: `SSL_CERT_FILE`, then the usual bundle locations.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// A connection string's TLS, ready to connect: the options and the rustls configuration built
/// from them (files read once). Equal when the options are.
#[derive(Clone)]
pub struct ServerTls {
    options: TlsOptions,
    config: Arc<ClientConfig>,
}

impl PartialEq for ServerTls {
    fn eq(&self, other: &ServerTls) -> bool {
        self.options == other.options
    }
}

impl Eq for ServerTls {}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// What the first attempt on a server does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// Plaintext (`disable`, and `allow` first).
    Plain,
    /// SSLRequest; plaintext if the server declines (`prefer`).
    TlsIfOffered,
    /// SSLRequest; an error if the server declines.
    TlsRequired,
}

/// A server connection after the SSLRequest exchange.
#[derive(Debug)]
pub enum Negotiated {
    /// No TLS.
    Plain(TcpStream),
    /// TLS established.
    Tls(Box<TlsStream<TcpStream>>),
}

impl ServerTls {
    /// Checks the options, reads the files they name and builds the rustls configuration.
    pub fn new(options: TlsOptions) -> Result<ServerTls, TlsFileError> {
        options.check()?;
        let provider = Arc::new(ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsFileError(format!("rustls protocol versions: {e}")))?;
        let verifier: Arc<dyn ServerCertVerifier> = match &options.root_cert {
            _ if options.mode == SslMode::Disable => Arc::new(AnyCertificate(provider.clone())),
            None => Arc::new(AnyCertificate(provider.clone())),
            Some(root) => {
                let roots = Arc::new(root_store(root)?);
                let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                    .build()
                    .map_err(|e| TlsFileError(format!("sslrootcert={root}: {e}")))?;
                if options.mode == SslMode::VerifyFull {
                    webpki
                } else {
                    Arc::new(ChainOnly(webpki))
                }
            }
        };
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = match (&options.cert, &options.key) {
            (Some(cert), Some(key)) => {
                let chain = read_certs("sslcert", cert)?;
                let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    TlsFileError(format!(
                        "sslkey={}: {e}; it must be a PEM private key (PKCS#8, PKCS#1 or SEC1)",
                        key.display()
                    ))
                })?;
                builder.with_client_auth_cert(chain, key_der).map_err(|e| {
                    TlsFileError(format!(
                        "sslcert={} with sslkey={}: {e}; the key must belong to the certificate",
                        cert.display(),
                        key.display()
                    ))
                })?
            }
            _ => builder.with_no_client_auth(),
        };
        // What libpq 17+ sends; older servers ignore it.
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        Ok(ServerTls {
            options,
            config: Arc::new(config),
        })
    }

    /// The options this was built from.
    pub fn options(&self) -> &TlsOptions {
        &self.options
    }

    /// `sslmode`.
    pub fn mode(&self) -> SslMode {
        self.options.mode
    }

    /// The rustls configuration.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        Arc::clone(&self.config)
    }

    /// A tokio-rustls connector on this configuration.
    pub fn connector(&self) -> TlsConnector {
        TlsConnector::from(self.client_config())
    }

    /// What the first attempt on a server does under this `sslmode`.
    pub fn first_attempt(&self) -> Attempt {
        match self.options.mode {
            SslMode::Disable | SslMode::Allow => Attempt::Plain,
            SslMode::Prefer => Attempt::TlsIfOffered,
            _ => Attempt::TlsRequired,
        }
    }

    /// Whether a plaintext attempt refused with `message` (a startup error from the server)
    /// is to be retried with TLS: `allow`, against a pg_hba.conf that wants TLS.
    pub fn retry_with_tls(&self, message: &str) -> bool {
        self.options.mode == SslMode::Allow && refuses_plaintext(message)
    }

    /// The SSLRequest exchange on a fresh TCP connection to `host`, then the handshake when the
    /// server agrees. `Plain` returns the stream as it is.
    pub async fn negotiate(
        &self,
        mut stream: TcpStream,
        host: &str,
        attempt: Attempt,
    ) -> Result<Negotiated, String> {
        if attempt == Attempt::Plain {
            return Ok(Negotiated::Plain(stream));
        }
        // SSLRequest: length 8, code 1234.5679.
        let request = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
        stream
            .write_all(&request)
            .await
            .map_err(|e| format!("sending the SSL request: {e}"))?;
        // Exactly one byte: anything the server sent after 'S' belongs to the handshake, so a
        // man in the middle cannot slip plaintext in front of it.
        let answer = stream
            .read_u8()
            .await
            .map_err(|e| format!("the server closed the connection after the SSL request: {e}"))?;
        match answer {
            b'S' => {
                let name = server_name(host)?;
                let tls = self
                    .connector()
                    .connect(name, stream)
                    .await
                    .map_err(|e| self.explain_io(&e, host))?;
                Ok(Negotiated::Tls(Box::new(tls)))
            }
            b'N' if attempt == Attempt::TlsRequired => Err(format!(
                "the server does not offer TLS, but sslmode={} requires it; set ssl = on in the server's postgresql.conf, or use sslmode=prefer to accept plaintext",
                self.options.mode
            )),
            b'N' => Ok(Negotiated::Plain(stream)),
            other => Err(format!(
                "the server answered the SSL request with {:?}, not S or N; is this a PostgreSQL server?",
                other as char
            )),
        }
    }

    /// The cause and fix of a TLS failure found anywhere in `error`'s chain, if it is one.
    pub fn explain(&self, error: &(dyn std::error::Error + 'static), host: &str) -> Option<String> {
        let mut next = Some(error);
        while let Some(e) = next {
            if let Some(tls) = e.downcast_ref::<rustls::Error>() {
                return Some(self.explain_rustls(tls, host));
            }
            if let Some(io) = e.downcast_ref::<std::io::Error>()
                && let Some(tls) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>())
            {
                return Some(self.explain_rustls(tls, host));
            }
            next = e.source();
        }
        None
    }

    fn explain_io(&self, error: &std::io::Error, host: &str) -> String {
        self.explain(error, host)
            .unwrap_or_else(|| format!("TLS handshake failed: {error}"))
    }

    fn explain_rustls(&self, error: &rustls::Error, host: &str) -> String {
        let root = self.options.root_cert.as_deref().unwrap_or("(none)");
        match error {
            rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            ) => format!(
                "server certificate is not valid for host {host:?} ({error}); connect with a host name the certificate lists, or use sslmode=verify-ca to check only that a trusted CA signed it"
            ),
            rustls::Error::InvalidCertificate(
                CertificateError::Expired
                | CertificateError::ExpiredContext { .. }
                | CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. },
            ) => format!(
                "server certificate is outside its validity period ({error}); renew the server's certificate or fix its clock"
            ),
            rustls::Error::InvalidCertificate(_) => format!(
                "server certificate not trusted by sslrootcert={root} ({error}); set sslrootcert to the PEM file of the CA that signed the server's certificate"
            ),
            rustls::Error::AlertReceived(_) => format!(
                "the server refused the TLS handshake ({error}); if it wants a client certificate, set sslcert and sslkey to one signed by a CA in its ssl_ca_file"
            ),
            _ => format!("TLS handshake failed: {error}"),
        }
    }
}

/// Whether a server's startup error says pg_hba.conf refused the connection for not using TLS
/// (PostgreSQL 14+ says "no encryption", older ones "SSL off").
pub fn refuses_plaintext(message: &str) -> bool {
    message.contains("pg_hba.conf")
        && (message.contains("no encryption") || message.contains("SSL off"))
}

/// The fix to show with a plaintext connection that pg_hba.conf refused.
pub const PLAINTEXT_REFUSED_FIX: &str = "the server's pg_hba.conf requires SSL for this connection; set sslmode=require or stronger (or prefer, the default) in the URL";

fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(host.to_string()).map_err(|e| {
        format!("host {host:?} is neither a DNS name nor an IP address usable for TLS: {e}")
    })
}

fn read_certs(key: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let bad = |e: &dyn std::fmt::Display| {
        TlsFileError(format!(
            "{key}={}: {e}; it must be a PEM file of certificates",
            path.display()
        ))
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(&e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(&e))?;
    if certs.is_empty() {
        return Err(bad(&"no certificate in it"));
    }
    Ok(certs)
}

fn root_store(root: &str) -> Result<rustls::RootCertStore, TlsFileError> {
    let path = if root == "system" {
        let from_env = std::env::var_os("SSL_CERT_FILE").map(PathBuf::from);
        from_env
            .into_iter()
            .chain(SYSTEM_BUNDLES.iter().map(PathBuf::from))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                TlsFileError(format!(
                    "sslrootcert=system: no CA bundle found (SSL_CERT_FILE, {}); install ca-certificates or give the CA file",
                    SYSTEM_BUNDLES.join(", ")
                ))
            })?
    } else {
        PathBuf::from(root)
    };
    let mut store = rustls::RootCertStore::empty();
    for cert in read_certs("sslrootcert", &path)? {
        store.add(cert).map_err(|e| {
            TlsFileError(format!(
                "sslrootcert={}: a certificate in it is not a usable CA: {e}",
                path.display()
            ))
        })?;
    }
    Ok(store)
}

/// `allow`, `prefer` and `require` without `sslrootcert`: encryption without authentication of
/// the server, as libpq. The handshake signatures are still checked.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca` (and weaker modes given `sslrootcert`): the chain must lead to a trusted CA, the
/// name is not looked at. rustls checks the chain before the name, so a name error means the
/// chain was good.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_bad_files_are_named() {
        let options = |root: &str| TlsOptions {
            mode: SslMode::VerifyCa,
            root_cert: Some(root.into()),
            ..Default::default()
        };
        let e = ServerTls::new(options("/nonexistent/ca.pem")).unwrap_err();
        assert!(e.0.contains("sslrootcert=/nonexistent/ca.pem"), "{e}");
        let dir = std::env::temp_dir().join(format!("lsngate-pgconn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = ServerTls::new(options(empty.to_str().unwrap())).unwrap_err();
        assert!(e.0.contains("no certificate in it"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn modes_choose_the_first_attempt() {
        let first = |mode| {
            ServerTls::new(TlsOptions {
                mode,
                ..Default::default()
            })
            .unwrap()
            .first_attempt()
        };
        assert_eq!(first(SslMode::Disable), Attempt::Plain);
        assert_eq!(first(SslMode::Allow), Attempt::Plain);
        assert_eq!(first(SslMode::Prefer), Attempt::TlsIfOffered);
        assert_eq!(first(SslMode::Require), Attempt::TlsRequired);
        assert!(refuses_plaintext(
            "pg_hba.conf rejects connection for host \"127.0.0.1\", user \"a\", database \"b\", no encryption"
        ));
        assert!(!refuses_plaintext("password authentication failed"));
    }
}
