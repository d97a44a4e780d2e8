//! `pvio`: one binary for every daemon, tool and benchmark of the host.
//!
//! Each subcommand lives in its own file under `cmd/`; this file only parses
//! the command line and dispatches.

mod cmd;

use clap::{Parser, Subcommand};

/// pvio: a userspace paravirtual I/O host with Xen's wire formats.
#[derive(Parser, Debug)]
#[command(
    name = "pvio",
    version,
    about = "pvio: a userspace paravirtual I/O host with Xen's wire formats"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the hypervisor services daemon (domains, grant tables, event channels).
    Hvd(cmd::hvd::Args),
    /// List a domain's event-channel ports, like Xen's lsevtchn.
    Lsevtchn(cmd::lsevtchn::Args),
    /// Run the xenstore daemon.
    Xenstored(cmd::xenstored::Args),
    /// Serve one virtual disk to a guest (the blkif backend, like tapdisk3).
    Tapdisk(cmd::tapdisk::Args),
    /// Run a guest domain: frontends for its disks and one workload.
    Guest(pvio_guest::domain::GuestArgs),
    /// Run a benchmark that compares pvio with its baseline in the same run.
    #[command(subcommand)]
    Bench(cmd::bench::BenchCommand),
    /// Hidden helpers that benchmarks and tests spawn as separate processes.
    #[command(hide = true, subcommand)]
    Internal(cmd::internal::InternalCommand),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    cmd::init_logging();
    let result = match cli.command {
        Command::Hvd(a) => cmd::hvd::run(a),
        Command::Lsevtchn(a) => cmd::lsevtchn::run(a),
        Command::Xenstored(a) => cmd::xenstored::run(a),
        Command::Tapdisk(a) => cmd::tapdisk::run(a),
        Command::Guest(a) => pvio_guest::domain::run(a),
        Command::Bench(b) => cmd::bench::run(b),
        Command::Internal(i) => cmd::internal::run(i),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pvio: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
