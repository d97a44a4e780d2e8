//! `pvio lsevtchn DOMID`: list a domain's event-channel ports.

use clap::Args as ClapArgs;

/// Options of `pvio lsevtchn`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// The domain whose ports to list.
    pub domid: u16,
    /// hvd's socket.
    #[arg(long, env = "PVIO_HVD_SOCKET", default_value = "/run/pvio/hvd.sock")]
    pub socket: std::path::PathBuf,
}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("lsevtchn is not implemented yet")
}
