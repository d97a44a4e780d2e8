//! One VM's lifecycle, like xenopsd's VM_start and VM_shutdown:
//!
//! * start: the datapath CPU cgroup, domain in hvd, xenstore home (with the
//!   start-in-progress marker) and XS_INTRODUCE, every VBD plugged in
//!   parallel (at most `max_parallel_per_vm` of this VM at once and
//!   `worker_pool_size` host-wide), the guest process, then every frontend
//!   connected; the marker is removed last.
//! * teardown (shutdown, and the clean-up of a failed start): ask the guest
//!   (`control/shutdown`), wait with a deadline, kill it; unplug every VBD
//!   in parallel; destroy the domain; remove its xenstore nodes. Teardown
//!   works from whatever exists, so a start that failed
//!   anywhere leaves nothing behind.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use pvio_abi::xenbus::XenbusState;
use pvio_hv::HvClient;
use pvio_xenstore::Client;
use tokio::sync::Semaphore;

use crate::process::{log_tail, Proc};
use crate::spec::{VbdSpec, VmSpec, Workload};
use crate::supervise::{self, Supervised, TapdiskEvent};
use crate::vbd::{self, PlugContext, PluggedVbd};
use crate::xs_tree;
use crate::{RunningVm, VmEvent, XenopsConfig, XenopsError};

/// Most VBDs a VM may have (xvda..xvdiu).
pub const MAX_VBDS: usize = 255;
/// How long the frontends may take to connect once the guest runs.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// Where a VM is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Starting,
    Running,
    Stopping,
}

/// Connections to the hypervisor services, shared by every operation.
#[derive(Clone)]
pub struct Conn {
    pub hv: Arc<HvClient>,
    pub xs: Client,
    /// This host's wake-up cost, measured once and handed to every tapdisk
    /// and guest (`PVIO_WAKE_COST_NS`) so they need not calibrate.
    pub wake_cost_ns: Option<u64>,
}

/// A VM the engine owns, from the first step of its start to the last
/// step of its teardown.
pub struct Vm {
    pub spec: VmSpec,
    pub dir: PathBuf,
    pub phase: Cell<Phase>,
    /// An operation (start, shutdown, plug, unplug) is running.
    pub busy: Cell<bool>,
    pub domid: Cell<Option<u16>>,
    pub per_vm: Arc<Semaphore>,
    pub vbds: RefCell<BTreeMap<u32, PluggedVbd>>,
    pub guest: RefCell<Option<Proc>>,
    /// Where [`crate::placement`] puts the VM's processes.
    pub slot: Cell<usize>,
}

impl Vm {
    /// The pids of the VM's guest and tapdisks.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.guest.borrow().iter().map(Proc::pid).collect();
        pids.extend(self.vbds.borrow().values().map(|v| v.tapdisk.pid()));
        pids
    }

    pub fn new(spec: VmSpec, cfg: &XenopsConfig) -> Self {
        Self {
            dir: cfg.state_dir.join("vms").join(&spec.uuid),
            spec,
            phase: Cell::new(Phase::Starting),
            busy: Cell::new(true),
            domid: Cell::new(None),
            per_vm: Arc::new(Semaphore::new(cfg.max_parallel_per_vm.max(1))),
            vbds: RefCell::new(BTreeMap::new()),
            guest: RefCell::new(None),
            slot: Cell::new(0),
        }
    }

    pub fn running(&self) -> Option<RunningVm> {
        Some(RunningVm {
            uuid: self.spec.uuid.clone(),
            domid: self.domid.get()?,
            guest_pid: self.guest.borrow().as_ref()?.pid(),
            vbds: self.vbds.borrow().keys().copied().collect(),
        })
    }

    fn vbd_error(&self, devid: u32, reason: impl Into<String>) -> XenopsError {
        XenopsError::Vbd {
            vm: self.spec.name.clone(),
            devid,
            reason: reason.into(),
        }
    }
}

/// Checks a spec before anything is created.
pub fn validate(spec: &VmSpec) -> Result<(), XenopsError> {
    let bad = |reason: String| XenopsError::Invalid(reason);
    if spec.uuid.is_empty()
        || !spec
            .uuid
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        return Err(bad(format!("bad VM uuid {:?}", spec.uuid)));
    }
    if spec.vbds.len() > MAX_VBDS {
        return Err(bad(format!(
            "{} VBDs: a VM has at most {MAX_VBDS}",
            spec.vbds.len()
        )));
    }
    if spec.memory_mib == 0 || spec.memory_mib > 1 << 20 {
        return Err(bad(format!("memory of {} MiB", spec.memory_mib)));
    }
    let mut seen = HashSet::new();
    for v in &spec.vbds {
        if !seen.insert(v.devid) {
            return Err(bad(format!("device id {} is used twice", v.devid)));
        }
    }
    if !matches!(spec.workload, Workload::Idle) && spec.vbds.is_empty() {
        return Err(bad(format!(
            "workload {} needs a disk and the VM has none",
            spec.workload
        )));
    }
    Ok(())
}

/// The engine-wide context an operation needs.
#[derive(Clone)]
pub struct Ctx {
    pub cfg: Arc<XenopsConfig>,
    pub pool: Arc<Semaphore>,
    pub conn: Conn,
    /// Where events the toolstack did not ask for go.
    pub events: tokio::sync::mpsc::UnboundedSender<VmEvent>,
}

/// Runs the start steps. On error the caller runs [`teardown`].
pub async fn start(ctx: &Ctx, vm: &Rc<Vm>) -> Result<RunningVm, XenopsError> {
    let spec = &vm.spec;
    std::fs::create_dir_all(&vm.dir)?;
    if let Some(dp) = &ctx.cfg.datapath_cgroup {
        // Every VM's processes share the datapath group, as tapdisks and
        // qemus share one on XenServer: with a group per VM the kernel's
        // per-CPU split of each group's share fed on itself (a VM that ran
        // more got a larger share), and in a bootstorm one VM of 25 booted
        // twice as fast as the rest (docs/benchmarks.md).
        if !dp.path().exists() {
            // Removed by another host that stopped while it was empty.
            dp.recreate(crate::cgroup::DATAPATH_SHARES).map_err(|e| {
                XenopsError::Io(std::io::Error::new(
                    e.kind(),
                    format!("recreating the datapath cgroup: {e}"),
                ))
            })?;
        }
    }
    let frames = spec.memory_mib * 256;
    let t0 = std::time::Instant::now();
    let d = ctx.conn.hv.create_domain(&spec.name, frames)?;
    vm.domid.set(Some(d.domid));
    let xs = &ctx.conn.xs;
    xs_tree::write_domain(xs, d.domid, spec).await?;
    xs.introduce(
        d.domid,
        u64::from(pvio_hv::memory::STORE_FRAME),
        d.store_port,
    )
    .await?;
    let t_domain = t0.elapsed();
    plug_all(ctx, vm, spec.vbds.clone()).await?;
    let t_plug = t0.elapsed();
    let guest = spawn_guest(ctx, vm, d.domid, d.token).await?;
    *vm.guest.borrow_mut() = Some(guest.clone());
    wait_frontends(xs, vm, &guest).await?;
    let t_connect = t0.elapsed();
    // The domain is survivable now.
    xs.rm(&xs_tree::action_request(d.domid)).await?;
    // xenopsd logs its atoms' durations; so do we, per phase.
    tracing::info!(
        vm = %spec.name,
        domid = d.domid,
        vbds = spec.vbds.len(),
        domain_ms = t_domain.as_millis() as u64,
        plug_ms = (t_plug - t_domain).as_millis() as u64,
        guest_ms = (t_connect - t_plug).as_millis() as u64,
        "started"
    );
    vm.phase.set(Phase::Running);
    vm.running().ok_or_else(|| XenopsError::Guest {
        vm: spec.name.clone(),
        reason: "the guest went away during the start".into(),
    })
}

/// Plugs VBDs in parallel; waits for all of them (siblings of a failed plug
/// are not cancelled, as in xenopsd) and returns the first error. Every
/// started tapdisk is recorded in the VM, failed or not, for teardown.
pub async fn plug_all(ctx: &Ctx, vm: &Rc<Vm>, specs: Vec<VbdSpec>) -> Result<(), XenopsError> {
    let Some(domid) = vm.domid.get() else {
        return Err(XenopsError::NotRunning(vm.spec.name.clone()));
    };
    let plugs = specs.into_iter().map(|spec| {
        let vm = vm.clone();
        let per_vm = vm.per_vm.clone();
        let pool = ctx.pool.clone();
        let (cfg, xs, ctx) = (ctx.cfg.clone(), ctx.conn.xs.clone(), ctx.clone());
        async move {
            // This VM's limit first, so a VM waiting on its own limit never
            // holds a host-wide worker.
            let _vm_slot = per_vm.acquire_owned().await.ok();
            let _worker = pool.acquire_owned().await.ok();
            let pctx = PlugContext {
                xs: &xs,
                pvio_bin: &cfg.pvio_bin,
                hvd_socket: &cfg.hvd_socket,
                xenstore_socket: &cfg.xenstore_socket,
                dir: &vm.dir,
                cgroup: cfg.datapath_cgroup.as_ref(),
                domid,
                wake_cost_ns: ctx.conn.wake_cost_ns,
            };
            let devid = spec.devid;
            match vbd::plug(&pctx, &spec).await {
                Ok(p) => {
                    watch_tapdisk(&ctx, &vm, &p);
                    vm.vbds.borrow_mut().insert(devid, p);
                    Ok(())
                }
                Err(e) => {
                    if let Some(p) = e.started {
                        vm.vbds.borrow_mut().insert(devid, p);
                    }
                    Err(vm.vbd_error(devid, e.reason))
                }
            }
        }
    });
    let results = join_all_local(plugs).await;
    results
        .into_iter()
        .collect::<Result<Vec<()>, _>>()
        .map(drop)
}

/// Starts the supervisor of a plugged VBD's tapdisk ([`supervise`]): it
/// restarts the tapdisk when it dies while the VBD is plugged and the VM
/// is not being taken down, and tells the toolstack.
fn watch_tapdisk(ctx: &Ctx, vm: &Rc<Vm>, p: &PluggedVbd) {
    let weak = Rc::downgrade(vm);
    let (events, uuid, devid) = (ctx.events.clone(), vm.spec.uuid.clone(), p.spec.devid);
    let s = Supervised {
        xs: ctx.conn.xs.clone(),
        vm: vm.spec.name.clone(),
        devid,
        backend: p.paths.backend.clone(),
        log: p.log.clone(),
        tapdisk: p.tapdisk.clone(),
        vm_stopping: Box::new(move || {
            weak.upgrade()
                .is_none_or(|vm| vm.phase.get() == Phase::Stopping)
        }),
        notify: Box::new(move |ev| {
            let _ = events.send(match ev {
                TapdiskEvent::Restarted { restarts, status } => VmEvent::TapdiskRestarted {
                    uuid: uuid.clone(),
                    devid,
                    restarts,
                    status,
                },
                TapdiskEvent::Failed { reason } => VmEvent::VbdFailed {
                    uuid: uuid.clone(),
                    devid,
                    reason,
                },
            });
        }),
    };
    tokio::task::spawn_local(supervise::supervise(s));
}

/// Runs futures concurrently on this thread and returns their results in
/// order.
async fn join_all_local<F, T>(futs: impl IntoIterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + 'static,
    T: 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for (i, f) in futs.into_iter().enumerate() {
        set.spawn_local(async move { (i, f.await) });
    }
    let mut out = Vec::with_capacity(set.len());
    while let Some(r) = set.join_next().await {
        match r {
            Ok(v) => out.push(v),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, v)| v).collect()
}

async fn spawn_guest(ctx: &Ctx, vm: &Vm, domid: u16, token: u64) -> Result<Proc, XenopsError> {
    let mut cmd = tokio::process::Command::new(&ctx.cfg.pvio_bin);
    cmd.arg("guest")
        .arg("--hvd-socket")
        .arg(&ctx.cfg.hvd_socket)
        .arg("--xenstore-socket")
        .arg(&ctx.cfg.xenstore_socket)
        .arg("--domid")
        .arg(domid.to_string())
        .arg("--token")
        .arg(token.to_string())
        .arg("--stay")
        .arg("--json")
        .env(
            "PVIO_LOG",
            std::env::var("PVIO_LOG").unwrap_or_else(|_| "info".into()),
        );
    if let Some(ns) = ctx.conn.wake_cost_ns {
        cmd.env(pvio_poll::calibrate::WAKE_COST_ENV, ns.to_string());
    }
    // Every CPU, whatever the toolstack's own affinity (the control slice's).
    cmd.env(crate::affinity::CPUS_ENV, "all");
    match &vm.spec.workload {
        Workload::Idle => cmd.arg("--idle"),
        Workload::Job(s) => cmd.arg("--job").arg(s),
        Workload::BootRead(b) => cmd
            .arg("--boot-read")
            .arg(b.mib.to_string())
            .arg("--boot-read-bs")
            .arg(b.bs.to_string())
            .arg("--boot-read-depth")
            .arg(b.depth.to_string()),
        Workload::Nbd(p) => cmd.arg("--nbd").arg(p),
    };
    Proc::spawn_in_background(
        cmd,
        vm.dir.join("guest.log"),
        ctx.cfg.datapath_cgroup.clone(),
    )
    .await
    .map_err(|e| XenopsError::Guest {
        vm: vm.spec.name.clone(),
        reason: format!("cannot start the guest process: {e}"),
    })
}

/// Waits until every plugged VBD's backend is Connected, failing early when
/// the guest or a tapdisk exits.
pub async fn wait_frontends(xs: &Client, vm: &Vm, guest: &Proc) -> Result<(), XenopsError> {
    let Some(domid) = vm.domid.get() else {
        return Err(XenopsError::NotRunning(vm.spec.name.clone()));
    };
    let devids: Vec<u32> = vm.vbds.borrow().keys().copied().collect();
    wait_connected(xs, vm, domid, &devids, Some(guest), CONNECT_TIMEOUT).await
}

/// Waits until the backends of `devids` are Connected.
pub async fn wait_connected(
    xs: &Client,
    vm: &Vm,
    domid: u16,
    devids: &[u32],
    guest: Option<&Proc>,
    timeout: Duration,
) -> Result<(), XenopsError> {
    let mut pending: HashSet<u32> = devids.iter().copied().collect();
    if pending.is_empty() {
        return Ok(());
    }
    let dir = xs_tree::vbd_backends(domid);
    // One watch on the whole backend directory; each event names the node.
    let mut w = xs.watch(&dir).await?;
    let deadline = tokio::time::Instant::now() + timeout;
    let mut check: Vec<u32> = pending.iter().copied().collect();
    let result = loop {
        if let Some(g) = guest {
            if let Some(st) = g.exit_status() {
                break Err(XenopsError::Guest {
                    vm: vm.spec.name.clone(),
                    reason: format!(
                        "the guest exited ({st}) before its disks connected: {}",
                        log_tail(&vm.dir.join("guest.log"), 600)
                    ),
                });
            }
        }
        let mut failed = None;
        for devid in check.drain(..) {
            let Some(v) = vm.vbds.borrow().get(&devid).cloned() else {
                continue;
            };
            if let Some(st) = v.tapdisk.exit_status() {
                failed = Some(vm.vbd_error(
                    devid,
                    format!("its tapdisk exited ({st}): {}", log_tail(&v.log, 400)),
                ));
                break;
            }
            let s = pvio_xenstore::xenbus::read_state(xs, &v.paths.backend).await?;
            if s == XenbusState::Connected {
                pending.remove(&devid);
            } else if s >= XenbusState::Closing {
                let err = xs
                    .try_read(&format!("{}/error", v.paths.backend))
                    .await?
                    .map(|e| String::from_utf8_lossy(&e).into_owned());
                failed = Some(vm.vbd_error(
                    devid,
                    format!(
                        "the backend closed ({s}) instead of connecting{}",
                        err.map(|e| format!(": {e}")).unwrap_or_default()
                    ),
                ));
                break;
            }
        }
        if let Some(e) = failed {
            break Err(e);
        }
        if pending.is_empty() {
            break Ok(());
        }
        let guest_exit = async {
            match guest {
                Some(g) => {
                    g.wait().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            ev = w.next() => match ev {
                None => break Err(XenopsError::Xenstore(pvio_xenstore::Error::Closed)),
                Some(ev) => {
                    // .../backend/vbd/<domid>/<devid>/state
                    let devid = ev
                        .path
                        .strip_prefix(&dir)
                        .and_then(|r| r.trim_start_matches('/').split('/').next())
                        .and_then(|d| d.parse::<u32>().ok());
                    match devid {
                        Some(d) if pending.contains(&d) => check.push(d),
                        Some(_) => {}
                        None => check.extend(pending.iter().copied()),
                    }
                }
            },
            _ = guest_exit => {}
            _ = tokio::time::sleep_until(deadline) => {
                let mut left: Vec<u32> = pending.iter().copied().collect();
                left.sort_unstable();
                break Err(XenopsError::Timeout(format!(
                    "disks {left:?} of VM {} did not connect within {timeout:?}",
                    vm.spec.name
                )));
            }
        }
    };
    let _ = w.unwatch().await;
    result
}

/// Unplugs VBDs in parallel (with the same limits as plugging).
pub async fn unplug_all(ctx: &Ctx, vm: &Rc<Vm>, devids: Vec<u32>, force: bool) {
    let unplugs = devids.into_iter().filter_map(|devid| {
        let v = vm.vbds.borrow().get(&devid).cloned()?;
        let per_vm = vm.per_vm.clone();
        let pool = ctx.pool.clone();
        let xs = ctx.conn.xs.clone();
        let vm = vm.clone();
        Some(async move {
            let _vm_slot = per_vm.acquire_owned().await.ok();
            let _worker = pool.acquire_owned().await.ok();
            vbd::unplug(&xs, &v, force).await;
            vm.vbds.borrow_mut().remove(&devid);
        })
    });
    join_all_local(unplugs).await;
}

/// Takes everything down that exists. With `ask`, the guest is asked to shut
/// down and gets `cfg.shutdown_timeout`; otherwise (or after that) it is
/// killed. Never fails; problems are logged.
pub async fn teardown(ctx: &Ctx, vm: &Rc<Vm>, ask: bool) {
    vm.phase.set(Phase::Stopping);
    let name = &vm.spec.name;
    let xs = &ctx.conn.xs;
    let guest = vm.guest.borrow().clone();
    let mut clean = false;
    if let Some(g) = &guest {
        if g.exit_status().is_none() && ask {
            if let Some(domid) = vm.domid.get() {
                let key = format!("{}/control/shutdown", xs_tree::home(domid));
                match xs.write(&key, "poweroff").await {
                    Ok(()) => {
                        if let Some(st) = g.wait_timeout(ctx.cfg.shutdown_timeout).await {
                            clean = st.success();
                        } else {
                            tracing::warn!(vm = %name, "the guest did not shut down in time: killing it");
                        }
                    }
                    Err(e) => tracing::warn!(vm = %name, "asking the guest to shut down: {e}"),
                }
            }
        }
        if g.exit_status().is_none() {
            g.kill().await;
        }
    }
    // A guest that shut down cleanly closed its disks: the tapdisks go when
    // told. Otherwise they are stopped.
    let devids: Vec<u32> = vm.vbds.borrow().keys().copied().collect();
    unplug_all(ctx, vm, devids, !clean).await;
    if let Some(domid) = vm.domid.get() {
        if let Err(e) = ctx.conn.hv.destroy_domain(domid) {
            // A claimed domain dies with its guest process.
            tracing::debug!(domid, "destroy: {e}");
        }
        if let Err(e) = xs.release(domid).await {
            tracing::debug!(domid, "release: {e}");
        }
        if let Err(e) = xs_tree::remove_domain(xs, domid, &vm.spec.uuid).await {
            tracing::warn!(vm = %name, "removing the domain's xenstore nodes: {e}");
        }
    }
    tracing::info!(vm = %name, clean, "stopped");
}
