//! `pvio xenstored`: the xenstore daemon.

use clap::Args as ClapArgs;

/// Options of `pvio xenstored`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Unix socket to serve dom0 clients on (libxenstore finds it via XENSTORED_PATH).
    #[arg(
        long,
        env = "PVIO_XENSTORED_SOCKET",
        default_value = "/run/pvio/xenstored.sock"
    )]
    pub socket: std::path::PathBuf,
}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("xenstored is not implemented yet")
}
