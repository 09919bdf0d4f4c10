pub async fn run(_args: BenchArgs) -> anyhow::Result<()> {
    Ok(())
}
#[derive(Debug, clap::Args)]
pub struct BenchArgs {}
