//! `pvio tapdisk`: the block backend of one virtual disk.

use clap::Args as ClapArgs;
use pvio_blk::back::{policy_from, TapdiskConfig};
use pvio_blk::engine::EngineChoice;
use pvio_blk::image::DirectIo;
use pvio_blk::split::SplitSize;

/// Options of `pvio tapdisk`.
#[derive(ClapArgs, Debug)]
#[command(
    about = "Serve one virtual disk to a guest: the blkif backend (like tapdisk3)",
    long_about = "Serves the VBD whose backend directory the toolstack wrote \
                  (/local/domain/0/backend/vbd/<domid>/<devid>): reads params (the image), \
                  mode, and the per-VBD settings pvio-polling, polling-duration, \
                  polling-idle-threshold, pvio-split-size and pvio-io-engine, which override \
                  the options below. Runs until the VBD is unplugged (online = 0), its \
                  directory is removed, or SIGTERM."
)]
pub struct Args {
    /// The VBD's backend directory in the xenstore.
    #[arg(long)]
    pub backend: String,
    /// hvd's socket.
    #[arg(long, env = "PVIO_HVD_SOCKET", default_value = "/run/pvio/hvd.sock")]
    pub hvd_socket: std::path::PathBuf,
    /// xenstored's socket.
    #[arg(
        long,
        env = "PVIO_XENSTORED_SOCKET",
        default_value = "/run/pvio/xenstored.sock"
    )]
    pub xenstore_socket: std::path::PathBuf,
    /// Polling policy: off, spin, tapdisk3 or adaptive.
    #[arg(long, env = "PVIO_TAPDISK_POLLING", default_value = "adaptive")]
    pub polling: String,
    /// tapdisk3's polling window in µs (with --polling tapdisk3).
    #[arg(long, default_value_t = 1000)]
    pub polling_duration: u64,
    /// tapdisk3's idle-CPU threshold in percent (with --polling tapdisk3).
    #[arg(long, default_value_t = 50.0)]
    pub polling_idle_threshold: f32,
    /// Split large requests: off, auto, or a part size such as 8k.
    #[arg(long, default_value = "off")]
    pub split_size: SplitSize,
    /// I/O engine: auto, uring or threads.
    #[arg(long, default_value = "auto")]
    pub io_engine: String,
    /// Queues offered (multi-queue-max-queues); default: the number of CPUs.
    #[arg(long)]
    pub max_queues: Option<u32>,
    /// Largest ring, as a page order (max-ring-page-order).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(0..=4))]
    pub max_ring_order: u32,
    /// Segments per indirect request offered (0: no indirect requests).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(0..=4096))]
    pub max_indirect_segments: u32,
    /// Do not offer persistent grants.
    #[arg(long)]
    pub no_persistent: bool,
    /// Never open the image with O_DIRECT.
    #[arg(long)]
    pub buffered: bool,
    /// Rewrite this file with the disk's counters (JSON) every second.
    #[arg(long)]
    pub stats_file: Option<std::path::PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    // `ps`, `top` and `perf` show it as tapdisk, as on a XenServer host.
    let _ = rustix::thread::set_name(c"tapdisk");
    let mut cfg = TapdiskConfig::new(a.backend, a.hvd_socket, a.xenstore_socket);
    cfg.poll = policy_from(&a.polling, a.polling_duration, a.polling_idle_threshold)
        .map_err(anyhow::Error::msg)?;
    cfg.split = a.split_size;
    cfg.io_engine = a
        .io_engine
        .parse::<EngineChoice>()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if let Some(q) = a.max_queues {
        cfg.max_queues = q.max(1);
    }
    cfg.max_ring_order = a.max_ring_order;
    cfg.max_indirect_segments = a.max_indirect_segments;
    cfg.persistent = !a.no_persistent;
    if a.buffered {
        cfg.direct_io = DirectIo::Off;
    }
    cfg.stats_file = a.stats_file;
    pvio_blk::back::run(cfg)?;
    Ok(())
}
