//! VM lifecycle, like xenopsd: create a domain in hvd, write its xenstore
//! tree, plug its virtual disks (in parallel on a worker pool, at most
//! [`XenopsConfig::max_parallel_per_vm`] at once per VM), start its guest
//! process, and wait for its frontends; shut it down (ask, wait with a
//! deadline, force) and unplug its disks in parallel. A failure anywhere in
//! a start is cleaned up completely: no tapdisk, domain, xenstore node or
//! cgroup is left behind.
//!
//! This crate owns running VMs and their processes; it never stores objects
//! (that is the toolstack's SQLite database) and never parses user input.

/// Nodes a guest may own in the xenstore of a pvio host: a VM of 255
/// disks needs about 3,000 (Xen's default quota, 1,000, is for a few).
pub const GUEST_XS_QUOTA_NODES: u32 = 8192;
/// Watches a guest may hold: its frontends watch one or two nodes per
/// disk, so 255 disks need more than Xen's default of 128.
pub const GUEST_XS_QUOTA_WATCHES: u32 = 1024;

pub mod affinity;
pub mod cgroup;
pub mod placement;
pub mod process;
pub mod spec;
pub mod supervise;
pub mod vbd;
pub mod vm;
pub mod xs_tree;

pub use spec::{BootRead, VbdSpec, VmSpec, Workload};

use std::path::PathBuf;
use std::time::Duration;

/// Settings of the lifecycle engine.
#[derive(Debug, Clone)]
pub struct XenopsConfig {
    pub hvd_socket: PathBuf,
    pub xenstore_socket: PathBuf,
    /// The `pvio` binary (tapdisk and guest processes are `pvio tapdisk`
    /// and `pvio guest`).
    pub pvio_bin: PathBuf,
    /// Where per-VM files (logs, tapdisk stats) go.
    pub state_dir: PathBuf,
    /// Device operations in flight host-wide (xenopsd's worker-pool-size).
    pub worker_pool_size: usize,
    /// Device operations in flight per VM (xenopsd's max_parallel_atoms).
    pub max_parallel_per_vm: usize,
    /// How long a guest may take to shut down before it is killed.
    pub shutdown_timeout: Duration,
    /// Put every VM's guest and tapdisks in this CPU cgroup (None: leave
    /// them where the toolstack is).
    pub datapath_cgroup: Option<cgroup::CpuGroup>,
    /// While the host's CPUs are contended, keep each VM's guest and
    /// tapdisks on the VM's own CPUs and rotate them ([`placement`]).
    pub placement: bool,
}

/// Why a lifecycle operation failed.
#[derive(Debug, thiserror::Error)]
pub enum XenopsError {
    #[error("hvd: {0}")]
    Hv(#[from] pvio_hv::HvError),
    #[error("xenstore: {0}")]
    Xenstore(#[from] pvio_xenstore::Error),
    #[error("VM {0} is not running")]
    NotRunning(String),
    #[error("VM {0} is already running")]
    AlreadyRunning(String),
    #[error("VM {0} is busy with another operation")]
    Busy(String),
    #[error("{0}")]
    Invalid(String),
    #[error("disk {devid} of VM {vm}: {reason}")]
    Vbd {
        vm: String,
        devid: u32,
        reason: String,
    },
    #[error("the guest of VM {vm}: {reason}")]
    Guest { vm: String, reason: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("timed out: {0}")]
    Timeout(String),
}

/// A VM that is running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningVm {
    /// The toolstack's VM uuid.
    pub uuid: String,
    pub domid: u16,
    /// Pid of the `pvio guest` process.
    pub guest_pid: u32,
    /// Device ids of the plugged disks.
    pub vbds: Vec<u32>,
}

mod engine;

/// Something that happened to a VM without being asked through this handle
/// (xenopsd's events): the toolstack updates its records from these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmEvent {
    /// The VM's guest exited (its workload ended with an error, it crashed
    /// or it was killed) and the VM was cleaned up: it is halted now.
    Halted { uuid: String, reason: String },
    /// A VBD's tapdisk died and was started again ([`supervise`]);
    /// `restarts` counts them since the VBD was plugged.
    TapdiskRestarted {
        uuid: String,
        devid: u32,
        restarts: u32,
        status: String,
    },
    /// A VBD's tapdisk died too often and is left dead: the disk is gone
    /// from the guest until it is unplugged and plugged again.
    VbdFailed {
        uuid: String,
        devid: u32,
        reason: String,
    },
}

/// A handle on the lifecycle engine, cheap to clone and `Send`: the engine
/// itself runs on a thread of its own (like xenopsd beside xapi), and every
/// call is a message to it.
#[derive(Clone, Debug)]
pub struct Xenops {
    tx: tokio::sync::mpsc::UnboundedSender<engine::Command>,
}

impl Xenops {
    /// Starts the engine thread. The receiver yields [`VmEvent`]s.
    pub fn start(
        cfg: XenopsConfig,
    ) -> Result<(Self, tokio::sync::mpsc::UnboundedReceiver<VmEvent>), XenopsError> {
        let (tx, events) = engine::spawn(cfg)?;
        Ok((Self { tx }, events))
    }

    async fn call<T>(
        &self,
        make: impl FnOnce(tokio::sync::oneshot::Sender<Result<T, XenopsError>>) -> engine::Command,
    ) -> Result<T, XenopsError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tx
            .send(make(tx))
            .map_err(|_| XenopsError::Io(std::io::Error::other("the lifecycle engine stopped")))?;
        rx.await
            .map_err(|_| XenopsError::Io(std::io::Error::other("the lifecycle engine stopped")))?
    }

    /// Starts a VM: domain, xenstore tree, disks plugged in parallel, guest
    /// process, frontends connected. On failure, everything is undone.
    pub async fn start_vm(&self, spec: VmSpec) -> Result<RunningVm, XenopsError> {
        self.call(|reply| engine::Command::Start { spec, reply })
            .await
    }

    /// Shuts a VM down: asks the guest, waits up to the configured timeout
    /// (none with `force`), kills it, unplugs its disks in parallel and
    /// destroys the domain.
    pub async fn shutdown_vm(&self, uuid: &str, force: bool) -> Result<(), XenopsError> {
        let uuid = uuid.to_string();
        self.call(|reply| engine::Command::Shutdown { uuid, force, reply })
            .await
    }

    /// Plugs a disk into a running VM.
    pub async fn plug_vbd(&self, uuid: &str, vbd: VbdSpec) -> Result<(), XenopsError> {
        let uuid = uuid.to_string();
        self.call(|reply| engine::Command::Plug { uuid, vbd, reply })
            .await
    }

    /// Unplugs a disk from a running VM.
    pub async fn unplug_vbd(&self, uuid: &str, devid: u32, force: bool) -> Result<(), XenopsError> {
        let uuid = uuid.to_string();
        self.call(|reply| engine::Command::Unplug {
            uuid,
            devid,
            force,
            reply,
        })
        .await
    }

    /// The running VMs.
    pub async fn list(&self) -> Result<Vec<RunningVm>, XenopsError> {
        self.call(|reply| engine::Command::List { reply }).await
    }

    /// What the VM's guest reports in its xenstore `data/` directory (the
    /// guest agent's keys, e.g. `workload/iops`), flattened to
    /// `workload/iops = 1234`; empty when the VM is not running.
    pub async fn guest_metrics(
        &self,
        uuid: &str,
    ) -> Result<std::collections::BTreeMap<String, String>, XenopsError> {
        let uuid = uuid.to_string();
        self.call(|reply| engine::Command::GuestMetrics { uuid, reply })
            .await
    }

    /// Shuts every VM down (host shutdown).
    pub async fn shutdown_all(&self) -> Result<(), XenopsError> {
        self.call(|reply| engine::Command::ShutdownAll { reply })
            .await
    }
}
