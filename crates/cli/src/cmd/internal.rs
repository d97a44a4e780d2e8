//! Hidden subcommands that benchmarks and tests spawn as helper processes.
//! Not a user interface: their input and output formats serve pvio's own
//! tests and may change.

use clap::Subcommand;

/// Helper processes.
#[derive(Subcommand, Debug)]
pub enum InternalCommand {
    /// A guest domain driven line by line on stdin (tests and debugging).
    GuestShell(super::guest_shell::Args),
    /// A guest talking to xenstored over its xenbus ring, driven on stdin.
    XsGuest(super::xs_guest::Args),
    /// A dom0 process that binds a port and maps grants, then holds them
    /// until killed (tests kill it mid-mapping).
    MapAndHold(MapAndHold),
    /// The pinger of `pvio bench ring`'s raw baselines.
    RingPing(pvio_bench::ring::PingArgs),
    /// The frontend domain of `pvio bench ring`.
    RingFrontend(pvio_bench::ring::FrontendArgs),
    /// The frontend domain of `pvio bench blk`'s gap sweep.
    GapFrontend(pvio_bench::blk::gap::GapFrontendArgs),
}

/// Options of `pvio internal map-and-hold`.
#[derive(clap::Args, Debug)]
pub struct MapAndHold {
    #[arg(long, env = "PVIO_HVD_SOCKET", default_value = "/run/pvio/hvd.sock")]
    socket: std::path::PathBuf,
    /// The granting domain.
    #[arg(long)]
    domid: u16,
    /// An unbound port of that domain to bind.
    #[arg(long)]
    port: Option<u32>,
    /// Grant refs to map writable.
    refs: Vec<u32>,
}

fn map_and_hold(a: MapAndHold) -> anyhow::Result<()> {
    let host = pvio_hv::HvClient::connect_host(&a.socket)?;
    let _chan = match a.port {
        Some(p) => Some(host.evtchn_bind_interdomain(a.domid, p)?),
        None => None,
    };
    let _mem = host.foreign_memory(a.domid)?;
    let mapped = host.map_grant_refs(a.domid, &a.refs, false)?;
    println!("mapped {}", mapped.len());
    use std::io::Write;
    std::io::stdout().flush()?;
    loop {
        std::thread::park();
    }
}

pub fn run(cmd: InternalCommand) -> anyhow::Result<()> {
    match cmd {
        InternalCommand::GuestShell(a) => super::guest_shell::run(a),
        InternalCommand::XsGuest(a) => super::xs_guest::run(a),
        InternalCommand::MapAndHold(a) => map_and_hold(a),
        InternalCommand::RingPing(a) => pvio_bench::ring::ping_main(a),
        InternalCommand::RingFrontend(a) => pvio_bench::ring::frontend_main(a),
        InternalCommand::GapFrontend(a) => pvio_bench::blk::gap::frontend_main(a),
    }
}
