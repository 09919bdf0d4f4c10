//! `lsngate`: one binary for every lsngate command — local clusters (`cluster`), the
//! read-your-writes benchmark (`bench`), the checker of the guarantee under faults (`verify`),
//! replica lag diagnostics (`lag`), the wire-protocol proxy (`proxy`) and the import of a
//! PgBouncer config (`config import`).

mod advise;
mod bench;
mod cluster;
mod duration;
mod inproc_proxy;
mod lag;
mod pg;
mod pgbouncer_import;
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
    /// library, under faults, from a recorded history (exit status 1 on any violation, 2 when
    /// the run could not be done).
    Verify(verify::VerifyArgs),
    /// Explain where each replica's lag comes from (network/disk, replay, conflicts); with
    /// --advise, recommend a wait budget from the lag measured.
    Lag(lag::LagArgs),
    /// A PostgreSQL wire-protocol proxy that pools connections and splits reads from writes.
    Proxy(Box<lsngate_proxy::ProxyArgs>),
    /// Proxy configuration tools.
    #[command(subcommand)]
    Config(ConfigCommand),
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Print a PgBouncer config (pgbouncer.ini) as the equivalent lsngate proxy TOML, every
    /// setting that does not carry over named at the end with why.
    Import {
        /// The pgbouncer.ini to read.
        file: std::path::PathBuf,
    },
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
            // The cluster and the proxy are gone by the time run returns. Exit status 1 means
            // the history holds a violation; 2 that the run itself could not be done, so a
            // script never reads a broken run as a checked one (or the other way round).
            match runtime()?.block_on(verify::run(args)) {
                Ok(true) => Ok(()),
                Ok(false) => std::process::exit(1),
                Err(error) => {
                    eprintln!("Error: {error:?}");
                    std::process::exit(2);
                }
            }
        }
        Command::Proxy(args) => lsngate_proxy::main(*args),
        Command::Config(ConfigCommand::Import { file }) => import_pgbouncer(&file),
    }
}

fn import_pgbouncer(path: &std::path::Path) -> anyhow::Result<()> {
    let ini = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    let imported = pgbouncer_import::import(&ini)
        .map_err(|why| anyhow::anyhow!("{}: {why}", path.display()))?;
    println!("# lsngate proxy config imported from {}", path.display());
    print!("{}", imported.toml);
    if !imported.not_carried.is_empty() {
        println!("\n# Not carried over from {}:", path.display());
        for note in &imported.not_carried {
            println!("# - {note}");
        }
        eprintln!(
            "{} PgBouncer setting(s) not carried over; listed at the end of the output",
            imported.not_carried.len()
        );
    }
    Ok(())
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}
