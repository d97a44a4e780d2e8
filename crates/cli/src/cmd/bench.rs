//! `pvio bench ...`: benchmarks that run a baseline and pvio side by side.
//! Each benchmark's options and code live in the `pvio-bench` crate.

use clap::Subcommand;

/// The benchmarks.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Ring round trips (event and poll modes) against raw eventfd and cache-line ping-pong.
    Ring(pvio_bench::ring::Args),
    /// Xenstore read/write round trips and aggregate reads per second.
    Xenstore(pvio_bench::xenstore::Args),
    /// Block datapath vs fio: QD1/QD32 reads, gap sweep, idle cost, request splitting.
    Blk(pvio_bench::blk::Args),
    /// VM start time against the number of VBDs: sequential against parallel plug.
    Plug(pvio_bench::plug::Args),
    /// Start many VMs a batch at a time; time to the n-th ready VM and per-VM boot time.
    Bootstorm(pvio_bench::bootstorm::Args),
    /// vm-list latency while guests saturate the datapath, with and without the control slice.
    ControlLatency(pvio_bench::control_latency::Args),
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Ring(a) => pvio_bench::ring::run(a),
        BenchCommand::Xenstore(a) => pvio_bench::xenstore::run(a),
        BenchCommand::Blk(a) => pvio_bench::blk::run(a),
        BenchCommand::Plug(a) => pvio_bench::plug::run(a),
        BenchCommand::Bootstorm(a) => pvio_bench::bootstorm::run(a),
        BenchCommand::ControlLatency(a) => pvio_bench::control_latency::run(a),
    }
}
