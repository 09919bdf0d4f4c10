//! The proxy as a standalone program, exactly what `lsngate proxy` runs:
//! `cargo run -p lsngate-proxy --example proxy_cli -- --primary postgres://... --replica ...`.

use clap::Parser;

/// lsngate proxy: PostgreSQL wire-protocol proxy with read/write splitting.
#[derive(Parser)]
#[command(name = "lsngate proxy")]
struct Cli {
    #[command(flatten)]
    args: lsngate_proxy::ProxyArgs,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    lsngate_proxy::main(Cli::parse().args)
}
