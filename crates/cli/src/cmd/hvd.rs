//! `pvio hvd`: the hypervisor services daemon.

use clap::Args as ClapArgs;

/// Options of `pvio hvd`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Unix socket to listen on.
    #[arg(long, env = "PVIO_HVD_SOCKET", default_value = "/run/pvio/hvd.sock")]
    pub socket: std::path::PathBuf,
}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("hvd is not implemented yet")
}
