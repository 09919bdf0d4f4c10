//! `lsngate`: one binary for every lsngate command — local clusters (`cluster`), the
//! read-your-writes benchmark (`bench`), the checker of the guarantee under faults (`verify`),
//! replica lag diagnostics (`lag`) and the wire-protocol
//! proxy (`proxy`).

mod advise;
mod bench;
mod cluster;
mod duration;
mod inproc_proxy;
mod lag;
mod pg;
mod table;
mod verify;
mod whatif;

use clap::{Parser, Subcommand};

/// Read-your-writes consistency on PostgreSQL read replicas.
#[derive(Debug, Parser)]
#[command(name = "lsngate", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start, inspect and stop a local primary + streaming replicas.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Measure stale reads and read latency per strategy, side by side, on one cluster.
    Bench(bench::BenchArgs),
    /// Check read-your-writes, monotonic reads and write durability through a proxy or the
    /// library, under faults, from a recorded history (exit status 1 on any violation).
    Verify(verify::VerifyArgs),
    /// Explain where each replica's lag comes from (network/disk, replay, conflicts); with
    /// --advise, recommend a wait budget from the lag measured.
    Lag(lag::LagArgs),
    /// A PostgreSQL wire-protocol proxy that pools connections and splits reads from writes.
    Proxy(Box<lsngate_proxy::ProxyArgs>),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LSNGATE_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Cluster(command) => cluster::run(command),
        Command::Bench(args) => runtime()?.block_on(bench::run(args)),
        Command::Lag(args) => runtime()?.block_on(lag::run(args)),
        Command::Verify(args) => {
            // The cluster and the proxy are gone by the time run returns.
            if !runtime()?.block_on(verify::run(args))? {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Proxy(args) => lsngate_proxy::main(*args),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}
