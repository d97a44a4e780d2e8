//! `pvio bench ring`: queue-depth-1 round trips through a shared ring and
//! event channels, against raw eventfd and cache-line ping-pong baselines.

/// Options of `pvio bench ring`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs the benchmark.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("bench ring is not implemented yet")
}
