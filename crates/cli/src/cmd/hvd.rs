//! `pvio hvd`: the hypervisor services daemon.

use std::os::fd::AsFd;

use anyhow::Context;
use clap::Args as ClapArgs;
use pvio_hv::daemon::{Config, EvtchnAbi};

/// Options of `pvio hvd`.
#[derive(ClapArgs, Debug)]
#[command(
    about = "Run the hypervisor services daemon: domains, guest memory, grant tables, event channels",
    long_about = "Runs in the foreground until SIGTERM or Ctrl-C. Processes connect to the \
                  socket to become domains (domain 0 is the host); guests get their memory and \
                  grant table as memfds. When a process exits, everything it held is released."
)]
pub struct Args {
    /// Unix socket to listen on.
    #[arg(long, env = "PVIO_HVD_SOCKET", default_value = "/run/pvio/hvd.sock")]
    pub socket: std::path::PathBuf,
    /// Grant-table frames per domain (512 grant refs each); Xen's gnttab_max_frames.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_grant_frames: u32,
    /// Simultaneous grant mappings per mapping domain (Xen: 1024 maptrack frames x 256).
    #[arg(long, default_value_t = 262_144, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_maptrack_entries: u32,
    /// Event-channel ABI: `2l` (4096 ports per domain) or `fifo` (131072 ports).
    #[arg(long, default_value = "2l")]
    pub evtchn_abi: EvtchnAbi,
    /// Largest guest memory in MiB.
    #[arg(long, default_value_t = 16384, value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    pub max_domain_mib: u32,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(dir) = args.socket.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let stop = pvio_hv::sys::termination_signalfd().context("setting up signal handling")?;
    let nofile = pvio_hv::sys::raise_nofile_limit();
    tracing::debug!(nofile, "open-file limit");
    let mut config = Config::new(&args.socket);
    config.max_grant_frames = args.max_grant_frames;
    config.max_maptrack_entries = args.max_maptrack_entries;
    config.evtchn_abi = args.evtchn_abi;
    config.max_domain_frames = args.max_domain_mib * 256;
    pvio_hv::daemon::run(config, stop.as_fd())?;
    Ok(())
}
