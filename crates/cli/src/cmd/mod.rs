//! One module per `pvio` subcommand.

pub mod bench;
pub mod guest_shell;
pub mod host;
pub mod hvd;
pub mod internal;
pub mod lsevtchn;
pub mod tapdisk;
pub mod toolstack;
pub mod xenstored;
pub mod xs_guest;

/// Logs go to stderr, filtered by `PVIO_LOG` (e.g. `PVIO_LOG=debug`), `info` by default.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PVIO_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}
