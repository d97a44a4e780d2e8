//! `pvio`: one binary for every daemon, tool and benchmark of the host.
//!
//! Each subcommand lives in its own file under `cmd/`; this file only parses
//! the command line and dispatches.

mod cmd;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

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
    /// Run a host: hvd, xenstored and toolstackd under one supervisor.
    #[command(subcommand)]
    Host(cmd::host::HostCommand),
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
    /// Run the toolstack daemon (VM/SR/VDI/VBD/VIF objects, lifecycles, JSON-RPC).
    Toolstackd(cmd::toolstack::DaemonArgs),
    /// Run a benchmark that compares pvio with its baseline in the same run.
    #[command(subcommand)]
    Bench(cmd::bench::BenchCommand),
    /// Hidden helpers that benchmarks and tests spawn as separate processes.
    #[command(hide = true, subcommand)]
    Internal(cmd::internal::InternalCommand),
}

fn main() -> std::process::ExitCode {
    // Before any thread exists: the CPUs the toolstack chose for this
    // process (a tapdisk or guest gets every CPU back from a host whose
    // control slice is pinned).
    if let Err(e) = pvio_xenops::affinity::apply_env() {
        eprintln!("pvio: warning: {e}");
    }
    // The xe-style commands (vm-list, vdi-create, ...) are registered from
    // the toolstack's own table and take their key=value words unparsed.
    let matches = Cli::command()
        .subcommands(cmd::toolstack::xe_subcommands())
        .get_matches();
    if let Some((name, sub)) = matches.subcommand() {
        if let Some(code) = cmd::toolstack::run_xe(name, sub) {
            return code;
        }
    }
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    cmd::init_logging();
    let result = match cli.command {
        Command::Host(h) => cmd::host::run(h),
        Command::Hvd(a) => cmd::hvd::run(a),
        Command::Lsevtchn(a) => cmd::lsevtchn::run(a),
        Command::Xenstored(a) => cmd::xenstored::run(a),
        Command::Tapdisk(a) => cmd::tapdisk::run(a),
        Command::Guest(a) => pvio_guest::domain::run(a),
        Command::Toolstackd(a) => cmd::toolstack::run_daemon(a),
        Command::Bench(b) => cmd::bench::run(b),
        Command::Internal(i) => cmd::internal::run(i),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pvio: error: {}", error_text(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, each cause once: a cause whose
/// text its wrapper already shows (`image: {0}` around the image error) is
/// not repeated.
fn error_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::error_text;

    #[derive(Debug, thiserror::Error)]
    #[error("image {0:?} does not exist")]
    struct Missing(&'static str);

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("image: {0}")]
        Image(#[from] Missing),
    }

    #[test]
    fn each_cause_is_said_once() {
        let e = anyhow::Error::from(Outer::from(Missing("/x.raw")));
        assert_eq!(error_text(&e), "image: image \"/x.raw\" does not exist");
        let e = anyhow::Error::from(Missing("/y")).context("starting tapdisk");
        assert_eq!(
            error_text(&e),
            "starting tapdisk: image \"/y\" does not exist"
        );
    }
}
