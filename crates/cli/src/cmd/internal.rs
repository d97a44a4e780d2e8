//! Hidden subcommands that benchmarks and tests spawn as helper processes
//! (for example the frontend domain of `pvio bench ring`). Not a user interface.

use clap::Subcommand;

/// Helper processes.
#[derive(Subcommand, Debug)]
pub enum InternalCommand {}

pub fn run(cmd: InternalCommand) -> anyhow::Result<()> {
    match cmd {}
}
