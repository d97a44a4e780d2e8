//! `pvio xenstored`: the xenstore daemon (Xen's wire protocol on a Unix
//! socket for dom0 tools and, with `--hvd-socket`, on introduced guests'
//! xenbus rings). Runs in the foreground until SIGTERM, SIGINT or SIGHUP,
//! then removes its socket and exits 0.

use clap::Args as ClapArgs;
use pvio_xenstore::daemon::{self, Config, Limits};
use pvio_xenstore::store::quota::Quotas;
use std::time::Duration;

/// Options of `pvio xenstored`. Quotas default to C xenstored 4.17's and
/// bind unprivileged (guest) connections only; the socket's clients are
/// dom0 and exempt, as in C xenstored.
#[derive(ClapArgs, Debug)]
#[command(
    after_help = "Clients find the daemon through XENSTORED_PATH, e.g.\n  \
    XENSTORED_PATH=/run/pvio/xenstored.sock xenstore-ls /\n\
    Quotas can also be read and changed at run time: xenstore-control quota [set NAME VALUE]"
)]
pub struct Args {
    /// Unix socket to serve dom0 clients on (libxenstore finds it via XENSTORED_PATH).
    #[arg(
        long,
        env = "PVIO_XENSTORED_SOCKET",
        default_value = "/run/pvio/xenstored.sock"
    )]
    pub socket: std::path::PathBuf,

    /// hvd's socket: connect as dom0 and serve each domain that XS_INTRODUCE
    /// names on its xenbus ring (frame and event channel from the request).
    /// Without it, XS_INTRODUCE only records domains.
    #[arg(long, value_name = "PATH")]
    pub hvd_socket: Option<std::path::PathBuf>,

    /// Nodes a domain may own (quota "nodes"; ENOSPC beyond).
    #[arg(long, default_value_t = 1000, value_name = "N")]
    pub quota_nodes: usize,

    /// Largest node in bytes, header + permissions + value + child names (quota "node-size"; ENOSPC).
    #[arg(long, default_value_t = 2048, value_name = "BYTES")]
    pub quota_node_size: usize,

    /// Watches per domain (quota "watches"; E2BIG beyond).
    #[arg(long, default_value_t = 128, value_name = "N")]
    pub quota_watches: usize,

    /// Open transactions per domain (quota "transactions"; ENOSPC beyond).
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub quota_transactions: usize,

    /// Unanswered requests per domain before its input is no longer read (quota "outstanding").
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub quota_outstanding: usize,

    /// Nodes one transaction may touch (quota "transaction-nodes"; ENOSPC).
    #[arg(long, default_value_t = 1024, value_name = "N")]
    pub quota_transaction_nodes: usize,

    /// Entries in a permission list (quota "permissions"; ENOSPC).
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub quota_perms: usize,

    /// Longest path below /local/domain/<d>/ or absolute, at most 2048 (quota "path-max"; EINVAL).
    #[arg(long, default_value_t = 2048, value_name = "BYTES",
          value_parser = clap::value_parser!(u16).range(1..=2048))]
    pub quota_path_max: u16,

    /// Drop a client whose queued replies and watch events exceed this many bytes.
    #[arg(long, default_value_t = 8 * 1024 * 1024, value_name = "BYTES")]
    pub max_output_bytes: usize,

    /// Drop a guest whose oldest undelivered watch event is older than this many seconds.
    #[arg(long, default_value_t = 20, value_name = "SECONDS")]
    pub watch_event_timeout: u64,

    /// Log level (error, warn, info, debug, trace); overrides PVIO_LOG.
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    // The daemon is single-threaded, so a thread-local subscriber covers it.
    let _log = args.log_level.as_deref().map(|level| {
        let filter = tracing_subscriber::EnvFilter::new(level);
        let sub = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_target(false)
            .finish();
        tracing::subscriber::set_default(sub)
    });
    let quotas = Quotas {
        nodes_per_domain: args.quota_nodes,
        node_size: args.quota_node_size,
        watches_per_domain: args.quota_watches,
        transactions_per_domain: args.quota_transactions,
        outstanding_per_domain: args.quota_outstanding,
        nodes_per_transaction: args.quota_transaction_nodes,
        perms_per_node: args.quota_perms,
        path_max: usize::from(args.quota_path_max),
    };
    let limits = Limits {
        max_output_bytes: args.max_output_bytes,
        event_timeout: Duration::from_secs(args.watch_event_timeout),
        ..Limits::default()
    };
    daemon::serve(Config {
        socket: args.socket,
        quotas,
        limits,
        hvd_socket: args.hvd_socket,
    })?;
    Ok(())
}
