//! `pvio bench ...`: benchmarks that run a baseline and pvio side by side.

use clap::Subcommand;

/// The benchmarks.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {}
}
