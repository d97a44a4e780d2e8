//! `pvio bench xenstore`: read and write round trips and aggregate read rate.

/// Options of `pvio bench xenstore`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs the benchmark.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("bench xenstore is not implemented yet")
}
