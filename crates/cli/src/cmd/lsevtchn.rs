//! `pvio lsevtchn DOMID`: list a domain's event-channel ports in the format
//! of Xen's `lsevtchn`.

use anyhow::Context;
use clap::Args as ClapArgs;
use pvio_abi::event_channel::EvtchnStat;
use pvio_hv::proto::PortStatus;
use pvio_hv::HvClient;

/// Options of `pvio lsevtchn`.
#[derive(ClapArgs, Debug)]
#[command(about = "List a domain's event-channel ports, like Xen's lsevtchn")]
pub struct Args {
    /// The domain whose ports to list.
    #[arg(default_value_t = 0)]
    pub domid: u16,
    /// hvd's socket.
    #[arg(long, env = "PVIO_HVD_SOCKET", default_value = "/run/pvio/hvd.sock")]
    pub socket: std::path::PathBuf,
    /// Also show the pid of the process that owns each port.
    #[arg(long)]
    pub pids: bool,
}

/// One line as Xen's lsevtchn prints it.
pub fn format_port(p: &PortStatus, pids: bool) -> String {
    let mut s = format!("{:4}: VCPU 0: ", p.port);
    match p.state {
        EvtchnStat::Unbound => s.push_str(&format!(
            "Interdomain (Waiting connection) - Remote Domain {}",
            p.remote_dom
        )),
        EvtchnStat::Interdomain => s.push_str(&format!(
            "Interdomain (Connected) - Remote Domain {}, Port {}",
            p.remote_dom, p.remote_port
        )),
        EvtchnStat::Pirq => s.push_str("Physical IRQ"),
        EvtchnStat::Virq => s.push_str("Virtual IRQ"),
        EvtchnStat::Ipi => s.push_str("IPI"),
        EvtchnStat::Closed => s.push_str("Unknown"),
    }
    if pids && p.owner_pid != 0 {
        s.push_str(&format!(" [pid {}]", p.owner_pid));
    }
    s
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let client = HvClient::connect_host(&args.socket)?;
    let ports = client
        .evtchn_list(args.domid)
        .with_context(|| format!("listing the ports of domain {}", args.domid))?;
    for p in &ports {
        println!("{}", format_port(p, args.pids));
    }
    Ok(())
}
