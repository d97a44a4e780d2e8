//! `pvio toolstackd`: the daemon. It opens the database, records every VM
//! halted (after a restart nothing of the old run is running), starts the
//! lifecycle engine, and serves JSON-RPC on its Unix socket: a task per
//! connection, requests on one connection answered in order, any number of
//! connections at once, on a multi-thread tokio runtime. The engine's
//! events (a guest that died) update the database as they come.
//!
//! On SIGTERM or SIGINT it stops accepting, shuts every VM down, removes
//! its socket and exits 0.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use pvio_xenops::cgroup::{CpuGroup, Hierarchy};
use pvio_xenops::{Xenops, XenopsConfig};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::signal::unix::{signal, SignalKind};

use crate::api::Toolstack;
use crate::db::{self, Db, HostFacts};
use crate::rpc::{self, Response};

/// The socket's file name in the state directory.
pub const SOCKET_FILE: &str = "toolstackd.sock";

/// Settings of `pvio toolstackd`.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Where to listen (default `<state>/toolstackd.sock`).
    pub socket: Option<PathBuf>,
    /// The state directory: database, SRs, per-VM files.
    pub state_dir: PathBuf,
    pub hvd_socket: PathBuf,
    pub xenstore_socket: PathBuf,
    pub pvio_bin: PathBuf,
    pub worker_pool_size: usize,
    pub max_parallel_per_vm: usize,
    pub shutdown_timeout: Duration,
    /// A CPU cgroup to put every VM's datapath processes in.
    pub datapath_cgroup: Option<PathBuf>,
    /// Place VMs' processes on their CPUs under contention
    /// ([`pvio_xenops::placement`]).
    pub vm_placement: bool,
}

/// Why the daemon could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    #[error(transparent)]
    Db(#[from] db::DbError),
    #[error("database: {0}")]
    Api(#[from] crate::error::ApiError),
    #[error("lifecycle engine: {0}")]
    Xenops(#[from] pvio_xenops::XenopsError),
    #[error("{0}")]
    Config(String),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> DaemonError {
    let what = what.into();
    move |source| DaemonError::Io { what, source }
}

/// The host's measured facts.
pub fn host_facts() -> HostFacts {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    // The host's CPUs, not this daemon's affinity (the control slice pins
    // it to a few).
    let cpu_count = pvio_xenops::affinity::online_cpus() as u32;
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_default();
    HostFacts {
        hostname,
        cpu_count,
        cpu_model,
        memory_total: crate::api::meminfo("MemTotal:").unwrap_or(0),
    }
}

/// Runs the daemon until SIGTERM or SIGINT.
pub fn run(cfg: DaemonConfig) -> Result<(), DaemonError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("toolstackd")
        .build()
        .map_err(io_err("starting the runtime"))?;
    let r = rt.block_on(serve(cfg));
    rt.shutdown_timeout(Duration::from_secs(2));
    r
}

async fn serve(cfg: DaemonConfig) -> Result<(), DaemonError> {
    std::fs::create_dir_all(&cfg.state_dir)
        .map_err(io_err(format!("creating {}", cfg.state_dir.display())))?;
    let socket = cfg
        .socket
        .clone()
        .unwrap_or_else(|| cfg.state_dir.join(SOCKET_FILE));
    // One daemon per state directory, held until this function returns.
    let _lock = lock_state(&cfg.state_dir)?;
    // Signals first, so that one arriving during start-up is not lost.
    let mut sigterm = signal(SignalKind::terminate()).map_err(io_err("SIGTERM handler"))?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(io_err("SIGINT handler"))?;

    let db_path = cfg.state_dir.join(db::DB_FILE);
    let db = Arc::new(Db::open(&db_path)?);
    let facts = host_facts();
    let (host, was_running) =
        db.write(|tx| Ok((db::ensure_host(tx, &facts)?, db::halt_all(tx)?)))?;
    for vm in &was_running {
        tracing::warn!(
            vm,
            "VM was recorded running by an earlier toolstackd: now halted"
        );
    }

    let datapath_cgroup = match &cfg.datapath_cgroup {
        None => None,
        Some(p) => {
            let h = Hierarchy::detect().ok_or_else(|| {
                DaemonError::Config("no CPU cgroup controller on this host".into())
            })?;
            Some(
                CpuGroup::open_or_recreate(&h, p.clone(), pvio_xenops::cgroup::DATAPATH_SHARES)
                    .map_err(io_err(format!("cgroup {}", p.display())))?,
            )
        }
    };
    let (xenops, mut events) = Xenops::start(XenopsConfig {
        hvd_socket: cfg.hvd_socket.clone(),
        xenstore_socket: cfg.xenstore_socket.clone(),
        pvio_bin: cfg.pvio_bin.clone(),
        state_dir: cfg.state_dir.join("vms"),
        worker_pool_size: cfg.worker_pool_size,
        max_parallel_per_vm: cfg.max_parallel_per_vm,
        shutdown_timeout: cfg.shutdown_timeout,
        datapath_cgroup,
        placement: cfg.vm_placement,
    })?;
    let ts = Toolstack::new(db.clone(), xenops.clone(), cfg.state_dir.join("sr"));

    let listener = bind(&socket)?;
    tracing::info!(
        socket = %socket.display(),
        db = %db_path.display(),
        host = %host,
        "toolstackd ready"
    );

    let ev_ts = ts.clone();
    tokio::spawn(async move {
        while let Some(ev) = events.recv().await {
            ev_ts.on_event(ev).await;
        }
    });

    let signal_name = loop {
        tokio::select! {
            _ = sigterm.recv() => break "SIGTERM",
            _ = sigint.recv() => break "SIGINT",
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let ts = ts.clone();
                    tokio::spawn(async move {
                        if let Err(e) = serve_connection(ts, stream).await {
                            tracing::debug!(error = %e, "connection ended");
                        }
                    });
                }
                Err(e) => {
                    // Out of descriptors and the like: keep serving the others.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::task::yield_now().await;
                }
            },
        }
    };
    tracing::info!(signal = signal_name, "shutting down every VM");
    drop(listener);
    let _ = std::fs::remove_file(&socket);
    // Give the engine its own per-VM timeout plus a margin.
    let deadline = cfg.shutdown_timeout + Duration::from_secs(30);
    match tokio::time::timeout(deadline, xenops.shutdown_all()).await {
        Ok(Ok(())) => {
            let halted = db.write(db::halt_all)?;
            tracing::info!(vms = halted.len(), "every VM halted");
        }
        Ok(Err(e)) => tracing::warn!(error = %e, "shutting the VMs down"),
        Err(_) => tracing::warn!("shutting the VMs down timed out"),
    }
    tracing::info!("toolstackd stopped");
    Ok(())
}

/// The state directory's lock file.
pub const LOCK_FILE: &str = "toolstackd.lock";

/// Takes the state directory's lock, or says who holds it: a second
/// daemon on the same database would record the first one's VMs halted.
fn lock_state(state: &Path) -> Result<std::fs::File, DaemonError> {
    let path = state.join(LOCK_FILE);
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_err(format!("opening {}", path.display())))?;
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(f),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(DaemonError::Config(format!(
            "another toolstackd is running on {}",
            state.display()
        ))),
        Err(e) => Err(DaemonError::Io {
            what: format!("locking {}", path.display()),
            source: e.into(),
        }),
    }
}

/// Binds the socket, replacing a stale one but never a live daemon's.
fn bind(socket: &Path) -> Result<UnixListener, DaemonError> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(io_err(format!("creating {}", dir.display())))?;
    }
    if socket.exists() {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Err(DaemonError::Config(format!(
                "another toolstackd is listening on {}",
                socket.display()
            )));
        }
        std::fs::remove_file(socket)
            .map_err(io_err(format!("removing stale {}", socket.display())))?;
    }
    UnixListener::bind(socket).map_err(io_err(format!("listening on {}", socket.display())))
}

async fn serve_connection(ts: Arc<Toolstack>, stream: UnixStream) -> io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut reader)
            .take(rpc::MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .await?;
        if n == 0 {
            return Ok(());
        }
        if line.len() > rpc::MAX_LINE {
            let resp =
                Response::protocol_error(Value::Null, rpc::INVALID_REQUEST, "request too long");
            send(&mut write, &resp).await?;
            return Ok(());
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        let resp = match rpc::parse_request(text) {
            Err(resp) => Some(*resp),
            Ok(req) => {
                let result = ts.call(&req.method, req.params).await;
                if let Err(e) = &result {
                    tracing::debug!(method = %req.method, error = %e.code, params = ?e.params, "call refused");
                }
                req.id.map(|id| match result {
                    Ok(v) => Response::ok(id, v),
                    Err(e) => Response::api_error(id, e),
                })
            }
        };
        if let Some(resp) = resp {
            send(&mut write, &resp).await?;
        }
    }
}

async fn send(w: &mut tokio::net::unix::OwnedWriteHalf, resp: &Response) -> io::Result<()> {
    let mut out = serde_json::to_vec(resp).map_err(io::Error::other)?;
    out.push(b'\n');
    w.write_all(&out).await
}
