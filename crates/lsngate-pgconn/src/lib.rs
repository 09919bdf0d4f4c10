//! lsngate-pgconn: how lsngate reaches PostgreSQL servers — libpq connection strings (URL or
//! key/value form, with libpq's `sslmode`, `sslrootcert`, `sslcert`, `sslkey` and
//! `connect_timeout`, which tokio-postgres 0.7 does not all know) and TLS with rustls.
//!
//! One implementation for the library (whose connections are tokio-postgres') and the proxy
//! (whose pooled connections speak the protocol themselves, and whose monitor uses
//! tokio-postgres). It is its own crate because lsngate-core is I/O-free and must not pull in
//! rustls and tokio, and because the library must not depend on the proxy or the proxy on the
//! library.

#![warn(missing_docs)]

mod client;
mod params;
mod tls;

pub use client::{connect, describe, explain};
pub use params::{ALL_PARAMETERS, ConnString, ParamError, redact};
pub use tls::{
    Attempt, Negotiated, PLAINTEXT_REFUSED_FIX, ServerTls, SslMode, TlsFileError, TlsOptions,
    refuses_plaintext,
};
