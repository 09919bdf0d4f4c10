//! tokio-postgres connections with lsngate's TLS: the rustls connector from
//! [`crate::ServerTls`] (through `tokio-postgres-rustls`, which also gives SCRAM channel
//! binding), `allow`'s plaintext-then-TLS retry that tokio-postgres lacks, and errors that
//! carry the server's message and the fix instead of tokio-postgres' bare "db error".

use tokio_postgres::Client;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::tls::{PLAINTEXT_REFUSED_FIX, ServerTls, SslMode, refuses_plaintext};

/// Opens a connection with `config` (its `ssl_mode` is replaced by `tls`'s) and spawns its
/// connection task on the current runtime. The error names the cause and, for TLS failures
/// and plaintext refused by pg_hba.conf, the fix.
pub async fn connect(config: &tokio_postgres::Config, tls: &ServerTls) -> Result<Client, String> {
    let mut config = config.clone();
    config.ssl_mode(tls.mode().driver_mode());
    let host = first_host(&config);
    let make = MakeRustlsConnect::new((*tls.client_config()).clone());
    let result = match config.connect(make.clone()).await {
        Err(e) if tls.retry_with_tls(&describe(&e)) => {
            config.ssl_mode(tokio_postgres::config::SslMode::Require);
            config.connect(make).await
        }
        other => other,
    };
    match result {
        Ok((client, connection)) => {
            tokio::spawn(async move {
                let _ = connection.await;
            });
            Ok(client)
        }
        Err(e) => Err(explain(&e, tls, &host)),
    }
}

/// The error with the fix: TLS failures explained by [`ServerTls::explain`], plaintext
/// refused by pg_hba.conf with [`PLAINTEXT_REFUSED_FIX`].
pub fn explain(error: &tokio_postgres::Error, tls: &ServerTls, host: &str) -> String {
    if let Some(why) = tls.explain(error, host) {
        return why;
    }
    let text = describe(error);
    if text.contains("server does not support TLS") {
        return format!(
            "the server does not offer TLS, but sslmode={} requires it; set ssl = on in the server's postgresql.conf, or use sslmode=prefer to accept plaintext",
            tls.mode()
        );
    }
    if refuses_plaintext(&text) && tls.mode() == SslMode::Disable {
        return format!("{text}; {PLAINTEXT_REFUSED_FIX}");
    }
    text
}

/// The error with its causes: tokio-postgres says only "db error" and keeps the server's
/// message (e.g. `FATAL: password authentication failed ...`) in the source.
pub fn describe(error: &tokio_postgres::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn first_host(config: &tokio_postgres::Config) -> String {
    match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(name)) => name.clone(),
        #[cfg(unix)]
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => String::new(),
    }
}
