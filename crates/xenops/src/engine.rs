//! The engine thread: a current-thread tokio runtime in a `LocalSet`, one
//! local task per operation, so operations on different VMs run
//! concurrently; semaphores bound device operations host-wide (the worker
//! pool) and per VM. At most one operation runs on a VM at a time.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::vm::{self, Conn, Ctx, Phase, Vm};
use crate::{RunningVm, VbdSpec, VmEvent, VmSpec, XenopsConfig, XenopsError};

type Reply<T> = oneshot::Sender<Result<T, XenopsError>>;

/// A request to the engine.
pub enum Command {
    Start {
        spec: VmSpec,
        reply: Reply<RunningVm>,
    },
    Shutdown {
        uuid: String,
        force: bool,
        reply: Reply<()>,
    },
    Plug {
        uuid: String,
        vbd: VbdSpec,
        reply: Reply<()>,
    },
    Unplug {
        uuid: String,
        devid: u32,
        force: bool,
        reply: Reply<()>,
    },
    List {
        reply: Reply<Vec<RunningVm>>,
    },
    GuestMetrics {
        uuid: String,
        reply: Reply<BTreeMap<String, String>>,
    },
    ShutdownAll {
        reply: Reply<()>,
    },
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Command::Start { .. } => "Start",
            Command::Shutdown { .. } => "Shutdown",
            Command::Plug { .. } => "Plug",
            Command::Unplug { .. } => "Unplug",
            Command::List { .. } => "List",
            Command::GuestMetrics { .. } => "GuestMetrics",
            Command::ShutdownAll { .. } => "ShutdownAll",
        };
        f.write_str(name)
    }
}

/// The engine's state, shared by its tasks (all on one thread).
struct Engine {
    cfg: Arc<XenopsConfig>,
    pool: Arc<Semaphore>,
    conn: tokio::sync::Mutex<Option<Conn>>,
    vms: RefCell<HashMap<String, Rc<Vm>>>,
    events: mpsc::UnboundedSender<VmEvent>,
    slots: RefCell<crate::placement::Slots>,
}

/// Starts the engine thread and returns its command queue and event stream.
#[allow(clippy::type_complexity)]
pub fn spawn(
    cfg: XenopsConfig,
) -> Result<
    (
        mpsc::UnboundedSender<Command>,
        mpsc::UnboundedReceiver<VmEvent>,
    ),
    XenopsError,
> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Command>();
    let (etx, erx) = mpsc::unbounded_channel();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("xenops".into())
        .spawn(move || {
            let local = tokio::task::LocalSet::new();
            let engine = Rc::new(Engine {
                pool: Arc::new(Semaphore::new(cfg.worker_pool_size.max(1))),
                cfg: Arc::new(cfg),
                conn: tokio::sync::Mutex::new(None),
                vms: RefCell::new(HashMap::new()),
                events: etx,
                slots: RefCell::new(crate::placement::Slots::default()),
            });
            local.block_on(&rt, async move {
                if engine.cfg.placement {
                    tokio::task::spawn_local(engine.clone().place());
                }
                while let Some(cmd) = rx.recv().await {
                    tracing::debug!(?cmd, "xenops");
                    tokio::task::spawn_local(engine.clone().handle(cmd));
                }
                // Every handle is gone: take the VMs down with us.
                engine.shutdown_all().await;
            });
        })?;
    Ok((tx, erx))
}

impl Engine {
    async fn handle(self: Rc<Self>, cmd: Command) {
        match cmd {
            Command::Start { spec, reply } => {
                let _ = reply.send(self.start(spec).await);
            }
            Command::Shutdown { uuid, force, reply } => {
                let _ = reply.send(self.shutdown(&uuid, force).await);
            }
            Command::Plug { uuid, vbd, reply } => {
                let _ = reply.send(self.plug(&uuid, vbd).await);
            }
            Command::Unplug {
                uuid,
                devid,
                force,
                reply,
            } => {
                let _ = reply.send(self.unplug(&uuid, devid, force).await);
            }
            Command::List { reply } => {
                let vms = self.vms.borrow();
                let mut list: Vec<RunningVm> = vms
                    .values()
                    .filter(|v| v.phase.get() == Phase::Running)
                    .filter_map(|v| v.running())
                    .collect();
                list.sort_by(|a, b| a.uuid.cmp(&b.uuid));
                let _ = reply.send(Ok(list));
            }
            Command::GuestMetrics { uuid, reply } => {
                let _ = reply.send(self.guest_metrics(&uuid).await);
            }
            Command::ShutdownAll { reply } => {
                self.shutdown_all().await;
                let _ = reply.send(Ok(()));
            }
        }
    }

    /// hvd and xenstored, connected on first use (so a toolstack can run
    /// and answer for its objects before the hypervisor services are up).
    async fn conn(&self) -> Result<Conn, XenopsError> {
        let mut c = self.conn.lock().await;
        if let Some(conn) = c.as_ref() {
            return Ok(conn.clone());
        }
        let hv = Arc::new(pvio_hv::HvClient::connect_host(&self.cfg.hvd_socket)?);
        let xs = pvio_xenstore::Client::connect(&self.cfg.xenstore_socket).await?;
        let wake_cost_ns =
            tokio::task::spawn_blocking(|| pvio_poll::calibrate::host_wake_cost_ns(60))
                .await
                .ok()
                .and_then(Result::ok);
        tracing::info!(?wake_cost_ns, "connected to hvd and xenstored");
        let conn = Conn {
            hv,
            xs,
            wake_cost_ns,
        };
        *c = Some(conn.clone());
        Ok(conn)
    }

    async fn ctx(&self) -> Result<Ctx, XenopsError> {
        Ok(Ctx {
            cfg: self.cfg.clone(),
            pool: self.pool.clone(),
            conn: self.conn().await?,
            events: self.events.clone(),
        })
    }

    /// Marks the VM busy for one operation (refusing a second one).
    fn claim(&self, uuid: &str) -> Result<Rc<Vm>, XenopsError> {
        let vms = self.vms.borrow();
        let vm = vms
            .get(uuid)
            .ok_or_else(|| XenopsError::NotRunning(uuid.to_string()))?;
        if vm.busy.get() || vm.phase.get() != Phase::Running {
            return Err(XenopsError::Busy(vm.spec.name.clone()));
        }
        vm.busy.set(true);
        Ok(vm.clone())
    }

    async fn start(self: &Rc<Self>, spec: VmSpec) -> Result<RunningVm, XenopsError> {
        vm::validate(&spec)?;
        let vm = {
            let mut vms = self.vms.borrow_mut();
            if vms.contains_key(&spec.uuid) {
                return Err(XenopsError::AlreadyRunning(spec.name.clone()));
            }
            let vm = Rc::new(Vm::new(spec, &self.cfg));
            vms.insert(vm.spec.uuid.clone(), vm.clone());
            vm
        };
        let ctx = match self.ctx().await {
            Ok(c) => c,
            Err(e) => {
                self.vms.borrow_mut().remove(&vm.spec.uuid);
                return Err(e);
            }
        };
        let t0 = std::time::Instant::now();
        match vm::start(&ctx, &vm).await {
            Ok(r) => {
                tracing::debug!(vm = %vm.spec.name, domid = r.domid, secs = t0.elapsed().as_secs_f64(), "start done");
                let cpus = crate::affinity::online_cpus();
                vm.slot
                    .set(self.slots.borrow_mut().assign(vm.spec.vcpus as usize, cpus));
                vm.busy.set(false);
                self.watch_guest(vm);
                Ok(r)
            }
            Err(e) => {
                tracing::warn!(vm = %vm.spec.name, "start failed, cleaning up: {e}");
                vm::teardown(&ctx, &vm, false).await;
                self.vms.borrow_mut().remove(&vm.spec.uuid);
                Err(e)
            }
        }
    }

    /// Places the running VMs' processes ([`crate::placement`]): while CPU
    /// pressure says tasks wait for CPUs, each VM's guest and tapdisks on
    /// the VM's CPUs, moving on every period; once the host has been quiet
    /// for a while, every CPU again (where both ends can poll).
    async fn place(self: Rc<Self>) {
        use crate::placement::{cpus_for, pin_process, ROTATE_PERIOD, ROTATE_PRESSURE_PCT};
        let cpus = crate::affinity::online_cpus();
        if cpus < 2 {
            return;
        }
        let stall = || pvio_poll::load::cpu_stall_us().map(|us| (us, std::time::Instant::now()));
        let Some(mut prev) = stall() else {
            tracing::info!("no CPU pressure figures (PSI): VMs are not placed");
            return;
        };
        let mut epoch = 0usize;
        let mut pinned = false;
        let mut quiet = 0u32;
        loop {
            tokio::time::sleep(ROTATE_PERIOD).await;
            let Some(cur) = stall() else { return };
            let dt = cur.1.duration_since(prev.1).as_micros().max(1) as f32;
            let pct = 100.0 * cur.0.saturating_sub(prev.0) as f32 / dt;
            prev = cur;
            let contended = pct >= ROTATE_PRESSURE_PCT;
            quiet = if contended { 0 } else { quiet + 1 };
            // Quiet for ten periods (2 s): free the VMs once.
            let free = pinned && quiet >= 10;
            if !contended && !free {
                continue;
            }
            epoch = epoch.wrapping_add(1);
            let work: Vec<(Vec<u32>, Option<Vec<usize>>)> = self
                .vms
                .borrow()
                .values()
                .filter(|v| v.phase.get() == Phase::Running)
                .map(|v| {
                    let set = if free {
                        None
                    } else {
                        cpus_for(v.slot.get(), v.spec.vcpus as usize, epoch, cpus)
                    };
                    (v.pids(), set)
                })
                .collect();
            pinned = contended;
            // Hundreds of affinity calls: off the engine's thread.
            let _ = tokio::task::spawn_blocking(move || {
                for (pids, set) in work {
                    for pid in pids {
                        let _ = pin_process(pid, set.as_deref());
                    }
                }
            })
            .await;
        }
    }

    /// Takes a VM down when its guest exits on its own.
    fn watch_guest(self: &Rc<Self>, vm: Rc<Vm>) {
        let Some(guest) = vm.guest.borrow().clone() else {
            return;
        };
        let engine = self.clone();
        tokio::task::spawn_local(async move {
            let st = guest.wait().await;
            // A shutdown or another operation owns the VM: it handles this.
            // An operation in progress (a plug) finds the guest gone and
            // fails; the VM is taken down when the guest is seen gone again.
            loop {
                if vm.phase.get() != Phase::Running {
                    return;
                }
                if !vm.busy.get() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            vm.busy.set(true);
            let reason = format!(
                "the guest exited ({st}): {}",
                crate::process::log_tail(&vm.dir.join("guest.log"), 300)
            );
            tracing::warn!(vm = %vm.spec.name, "{reason}");
            if let Ok(ctx) = engine.ctx().await {
                vm::teardown(&ctx, &vm, false).await;
            }
            engine.vms.borrow_mut().remove(&vm.spec.uuid);
            let _ = engine.events.send(VmEvent::Halted {
                uuid: vm.spec.uuid.clone(),
                reason,
            });
        });
    }

    async fn shutdown(self: &Rc<Self>, uuid: &str, force: bool) -> Result<(), XenopsError> {
        let vm = self.claim(uuid)?;
        let ctx = self.ctx().await?;
        vm::teardown(&ctx, &vm, !force).await;
        self.vms.borrow_mut().remove(uuid);
        Ok(())
    }

    async fn shutdown_all(self: &Rc<Self>) {
        let uuids: Vec<String> = self.vms.borrow().keys().cloned().collect();
        let mut set = tokio::task::JoinSet::new();
        for uuid in uuids {
            let engine = self.clone();
            set.spawn_local(async move {
                // A VM in the middle of an operation is waited for.
                let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
                loop {
                    match engine.shutdown(&uuid, false).await {
                        Err(XenopsError::Busy(_)) if tokio::time::Instant::now() < deadline => {
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        }
                        Err(XenopsError::NotRunning(_)) | Ok(()) => return,
                        Err(e) => {
                            tracing::warn!(%uuid, "shutdown: {e}");
                            return;
                        }
                    }
                }
            });
        }
        while set.join_next().await.is_some() {}
    }

    async fn plug(self: &Rc<Self>, uuid: &str, spec: VbdSpec) -> Result<(), XenopsError> {
        let vm = self.claim(uuid)?;
        let r = self.plug_claimed(&vm, spec).await;
        vm.busy.set(false);
        r
    }

    async fn plug_claimed(&self, vm: &Rc<Vm>, spec: VbdSpec) -> Result<(), XenopsError> {
        let devid = spec.devid;
        if vm.vbds.borrow().contains_key(&devid) {
            return Err(XenopsError::Invalid(format!(
                "device {devid} of VM {} is already plugged",
                vm.spec.name
            )));
        }
        if vm.vbds.borrow().len() >= vm::MAX_VBDS {
            return Err(XenopsError::Invalid(format!(
                "VM {} has {} VBDs plugged already",
                vm.spec.name,
                vm::MAX_VBDS
            )));
        }
        let ctx = self.ctx().await?;
        let domid = vm
            .domid
            .get()
            .ok_or_else(|| XenopsError::NotRunning(vm.spec.name.clone()))?;
        let result = match vm::plug_all(&ctx, vm, vec![spec]).await {
            Ok(()) => {
                let guest = vm.guest.borrow().clone();
                vm::wait_connected(
                    &ctx.conn.xs,
                    vm,
                    domid,
                    &[devid],
                    guest.as_ref(),
                    vm::CONNECT_TIMEOUT,
                )
                .await
            }
            Err(e) => Err(e),
        };
        if result.is_err() {
            vm::unplug_all(&ctx, vm, vec![devid], true).await;
        }
        result
    }

    async fn unplug(
        self: &Rc<Self>,
        uuid: &str,
        devid: u32,
        force: bool,
    ) -> Result<(), XenopsError> {
        let vm = self.claim(uuid)?;
        let r = async {
            if !vm.vbds.borrow().contains_key(&devid) {
                return Err(XenopsError::Invalid(format!(
                    "device {devid} of VM {} is not plugged",
                    vm.spec.name
                )));
            }
            let ctx = self.ctx().await?;
            vm::unplug_all(&ctx, &vm, vec![devid], force).await;
            Ok(())
        }
        .await;
        vm.busy.set(false);
        r
    }

    async fn guest_metrics(&self, uuid: &str) -> Result<BTreeMap<String, String>, XenopsError> {
        let domid = {
            let vms = self.vms.borrow();
            match vms.get(uuid) {
                Some(vm) if vm.phase.get() == Phase::Running => vm.domid.get(),
                _ => None,
            }
        };
        let Some(domid) = domid else {
            return Ok(BTreeMap::new());
        };
        let conn = self.conn().await?;
        Ok(crate::xs_tree::read_tree(
            &conn.xs,
            &format!("{}/data", crate::xs_tree::home(domid)),
            3,
        )
        .await?)
    }
}
