//! `pvio toolstackd` and the xe-style commands (`pvio vm-list`, ...). The
//! logic is in `pvio-toolstack`; this file only turns command lines into
//! its calls.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args as ClapArgs;
use pvio_toolstack::server::{self, DaemonConfig};
use pvio_toolstack::xe;

/// Options of `pvio toolstackd`.
#[derive(ClapArgs, Debug)]
#[command(
    about = "Run the toolstack daemon: VM, SR, VDI, VBD and VIF objects, VM lifecycles, JSON-RPC",
    long_about = "Runs in the foreground until SIGTERM or Ctrl-C, then shuts every VM down and \
                  exits 0. The objects live in <state>/toolstack.db; clients (the xe-style \
                  commands: pvio vm-list, pvio vdi-create, ...) speak JSON-RPC to the socket."
)]
pub struct DaemonArgs {
    /// The state directory: database, SRs, per-VM files.
    #[arg(long = "state", env = "PVIO_STATE", value_name = "DIR")]
    pub state: PathBuf,
    /// Unix socket to serve JSON-RPC on [default: <state>/toolstackd.sock].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// hvd's socket (used when a VM starts).
    #[arg(
        long,
        env = "PVIO_HVD_SOCKET",
        default_value = "/run/pvio/hvd.sock",
        value_name = "PATH"
    )]
    pub hvd_socket: PathBuf,
    /// xenstored's socket (used when a VM starts).
    #[arg(
        long,
        env = "PVIO_XENSTORED_SOCKET",
        default_value = "/run/pvio/xenstored.sock",
        value_name = "PATH"
    )]
    pub xenstore_socket: PathBuf,
    /// Device operations in flight host-wide (xenopsd's worker-pool-size).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub worker_pool_size: u32,
    /// Device operations in flight per VM (xenopsd's max_parallel_atoms).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_parallel_per_vm: u32,
    /// Seconds a guest may take to shut down before it is killed.
    #[arg(
        long = "shutdown-timeout-s",
        default_value_t = 30,
        value_name = "SECONDS"
    )]
    pub shutdown_timeout_s: u64,
    /// A CPU cgroup (a directory in the cgroup filesystem) to put every
    /// VM's guest and tapdisks in.
    #[arg(long, value_name = "PATH")]
    pub datapath_cgroup: Option<PathBuf>,
    /// Leave VMs' processes wherever the scheduler puts them, even when the
    /// CPUs are contended (by default each VM's guest and tapdisks then
    /// share the VM's CPU, and the VMs rotate over the CPUs).
    #[arg(long)]
    pub no_vm_placement: bool,
    /// The pvio binary that runs tapdisks and guests [default: this one].
    #[arg(long, value_name = "PATH")]
    pub pvio_bin: Option<PathBuf>,
}

pub fn run_daemon(args: DaemonArgs) -> anyhow::Result<()> {
    let pvio_bin = match args.pvio_bin {
        Some(p) => p,
        None => std::env::current_exe().context("finding the pvio binary")?,
    };
    server::run(DaemonConfig {
        socket: args.socket,
        state_dir: args.state,
        hvd_socket: args.hvd_socket,
        xenstore_socket: args.xenstore_socket,
        pvio_bin,
        worker_pool_size: args.worker_pool_size as usize,
        max_parallel_per_vm: args.max_parallel_per_vm as usize,
        shutdown_timeout: Duration::from_secs(args.shutdown_timeout_s),
        datapath_cgroup: args.datapath_cgroup,
        vm_placement: !args.no_vm_placement,
    })?;
    Ok(())
}

/// The xe commands as clap subcommands: they show in `pvio --help` and
/// `pvio help CMD`, and take their words unparsed (xe's `key=value`
/// syntax and `--help` are the toolstack's to read).
pub fn xe_subcommands() -> Vec<clap::Command> {
    xe::commands()
        .iter()
        .map(|c| {
            clap::Command::new(c.name.as_str())
                .about(c.summary().to_string())
                .long_about(c.help_text())
                .disable_help_flag(true)
                .arg(
                    clap::Arg::new("args")
                        .value_name("KEY=VALUE")
                        .num_args(0..)
                        .trailing_var_arg(true)
                        .allow_hyphen_values(true),
                )
        })
        .collect()
}

/// Runs xe command `name` if that is what `matches` holds.
pub fn run_xe(name: &str, matches: &clap::ArgMatches) -> Option<std::process::ExitCode> {
    xe::find(name)?;
    let words: Vec<String> = matches
        .get_many::<String>("args")
        .map(|v| v.cloned().collect())
        .unwrap_or_default();
    let code = xe::main(name, &words);
    Some(std::process::ExitCode::from(code as u8))
}
