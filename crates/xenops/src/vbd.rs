//! Plugging and unplugging one VBD: the SR's attach (and detach) delay, the
//! xenstore directories, and the VBD's tapdisk process, which is plugged
//! when its backend reaches InitWait (ready for a frontend).

use std::path::PathBuf;
use std::time::Duration;

use pvio_abi::xenbus::XenbusState;
use pvio_xenstore::Client;

use std::rc::Rc;

use crate::cgroup::CpuGroup;
use crate::process::{log_tail, Proc};
use crate::spec::VbdSpec;
use crate::supervise::Tapdisk;
use crate::xs_tree::{self, VbdPaths};

/// How long a tapdisk may take to reach InitWait.
pub const PLUG_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a tapdisk may take to close with its frontend on unplug.
pub const UNPLUG_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a tapdisk gets after SIGTERM before SIGKILL.
pub const TERM_GRACE: Duration = Duration::from_secs(5);

/// A VBD whose tapdisk was started.
#[derive(Debug, Clone)]
pub struct PluggedVbd {
    pub spec: VbdSpec,
    pub paths: VbdPaths,
    /// Its tapdisk, restarted by [`crate::supervise`] when it dies.
    pub tapdisk: Rc<Tapdisk>,
    pub log: PathBuf,
}

/// Everything needed to start a VBD's tapdisk, again if need be: the same
/// command line, environment, log and cgroup every time.
#[derive(Debug, Clone)]
pub struct TapdiskLaunch {
    pub pvio_bin: PathBuf,
    pub backend: String,
    pub hvd_socket: PathBuf,
    pub xenstore_socket: PathBuf,
    pub stats_file: PathBuf,
    pub log: PathBuf,
    pub wake_cost_ns: Option<u64>,
    pub cgroup: Option<CpuGroup>,
}

impl TapdiskLaunch {
    fn command(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.pvio_bin);
        cmd.arg("tapdisk")
            .arg("--backend")
            .arg(&self.backend)
            .arg("--hvd-socket")
            .arg(&self.hvd_socket)
            .arg("--xenstore-socket")
            .arg(&self.xenstore_socket)
            .arg("--stats-file")
            .arg(&self.stats_file)
            .env(
                "PVIO_LOG",
                std::env::var("PVIO_LOG").unwrap_or_else(|_| "info".into()),
            );
        if let Some(ns) = self.wake_cost_ns {
            cmd.env(pvio_poll::calibrate::WAKE_COST_ENV, ns.to_string());
        }
        // Every CPU, whatever the toolstack's own affinity (the control slice's).
        cmd.env(crate::affinity::CPUS_ENV, "all");
        cmd
    }

    /// Starts a tapdisk.
    pub async fn spawn(&self) -> std::io::Result<Proc> {
        Proc::spawn_in_background(self.command(), self.log.clone(), self.cgroup.clone()).await
    }
}

/// What plugging needs from the engine.
pub struct PlugContext<'a> {
    pub xs: &'a Client,
    pub pvio_bin: &'a std::path::Path,
    pub hvd_socket: &'a std::path::Path,
    pub xenstore_socket: &'a std::path::Path,
    /// The VM's directory for logs and stats.
    pub dir: &'a std::path::Path,
    pub cgroup: Option<&'a CpuGroup>,
    pub domid: u16,
    /// Handed to the tapdisk as `PVIO_WAKE_COST_NS`.
    pub wake_cost_ns: Option<u64>,
}

/// Why a plug failed. `started` is the tapdisk if one was started (the
/// caller must still clean it up).
#[derive(Debug)]
pub struct PlugError {
    pub reason: String,
    pub started: Option<PluggedVbd>,
}

/// Attaches the VDI (the SR's delay), writes the VBD's directories, starts
/// its tapdisk and waits for InitWait.
pub async fn plug(ctx: &PlugContext<'_>, spec: &VbdSpec) -> Result<PluggedVbd, PlugError> {
    let fail = |reason: String| PlugError {
        reason,
        started: None,
    };
    let t0 = std::time::Instant::now();
    // SR.attach: slow storage layers take this long.
    if !spec.attach_delay.is_zero() {
        tokio::time::sleep(spec.attach_delay).await;
    }
    let t_attach = t0.elapsed();
    let paths = xs_tree::write_vbd(
        ctx.xs,
        ctx.domid,
        spec.devid,
        &spec.image,
        spec.writable,
        &spec.backend_keys,
    )
    .await
    .map_err(|e| fail(format!("writing its xenstore directories: {e}")))?;
    let t_write = t0.elapsed();
    let log = ctx.dir.join(format!("tapdisk-{}.log", spec.devid));
    let launch = TapdiskLaunch {
        pvio_bin: ctx.pvio_bin.to_path_buf(),
        backend: paths.backend.clone(),
        hvd_socket: ctx.hvd_socket.to_path_buf(),
        xenstore_socket: ctx.xenstore_socket.to_path_buf(),
        stats_file: ctx.dir.join(format!("tapdisk-{}.json", spec.devid)),
        log: log.clone(),
        wake_cost_ns: ctx.wake_cost_ns,
        cgroup: ctx.cgroup.cloned(),
    };
    let first = launch
        .spawn()
        .await
        .map_err(|e| fail(format!("starting its tapdisk: {e}")))?;
    let t_spawn = t0.elapsed();
    let plugged = PluggedVbd {
        spec: spec.clone(),
        paths,
        tapdisk: Rc::new(Tapdisk::new(first, launch)),
        log,
    };
    match wait_backend(ctx.xs, &plugged, PLUG_TIMEOUT, |s| {
        s >= XenbusState::InitWait && s <= XenbusState::Connected
    })
    .await
    {
        Ok(()) => {
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            tracing::debug!(
                devid = spec.devid,
                attach_ms = ms(t_attach),
                xenstore_ms = ms(t_write - t_attach),
                spawn_ms = ms(t_spawn - t_write),
                initwait_ms = ms(t0.elapsed() - t_spawn),
                "plugged"
            );
            Ok(plugged)
        }
        Err(reason) => Err(PlugError {
            reason,
            started: Some(plugged),
        }),
    }
}

/// Waits until the backend's state satisfies `ok`, failing early when the
/// tapdisk exits or writes an `error` key.
pub async fn wait_backend(
    xs: &Client,
    vbd: &PluggedVbd,
    timeout: Duration,
    ok: impl Fn(XenbusState) -> bool,
) -> Result<(), String> {
    let be = &vbd.paths.backend;
    let state_key = format!("{be}/state");
    let mut w = xs
        .watch(&state_key)
        .await
        .map_err(|e| format!("watching {state_key}: {e}"))?;
    let deadline = tokio::time::Instant::now() + timeout;
    let result = loop {
        if let Some(st) = vbd.tapdisk.exit_status() {
            break Err(format!(
                "its tapdisk exited ({st}): {}",
                log_tail(&vbd.log, 400)
            ));
        }
        let state = match pvio_xenstore::xenbus::read_state(xs, be).await {
            Ok(s) => s,
            Err(e) => break Err(format!("reading {state_key}: {e}")),
        };
        if ok(state) {
            break Ok(());
        }
        if let Ok(Some(err)) = xs.try_read(&format!("{be}/error")).await {
            break Err(format!(
                "the backend failed: {}",
                String::from_utf8_lossy(&err)
            ));
        }
        let tapdisk = vbd.tapdisk.proc();
        tokio::select! {
            ev = w.next() => if ev.is_none() {
                break Err("the xenstore connection was lost".into());
            },
            _ = tapdisk.wait() => {}
            _ = tokio::time::sleep_until(deadline) => {
                break Err(format!("its backend did not become ready within {timeout:?}"));
            }
        }
    };
    let _ = w.unwatch().await;
    result
}

/// Unplugs a VBD: asks the tapdisk to close (`online = 0`) and waits for it
/// to go, or with `force` stops it at once; then detaches the VDI (the SR's
/// delay) and removes both directories. Never fails: what cannot be done
/// cleanly is done by force, and the reason is logged.
pub async fn unplug(xs: &Client, vbd: &PluggedVbd, force: bool) {
    let devid = vbd.spec.devid;
    // Before anything else: its supervisor must not restart it now.
    vbd.tapdisk.set_stopping();
    let tapdisk = vbd.tapdisk.proc();
    if tapdisk.exit_status().is_none() {
        if force {
            tapdisk.stop(TERM_GRACE).await;
        } else {
            let online = format!("{}/online", vbd.paths.backend);
            if let Err(e) = xs.write(&online, "0").await {
                tracing::warn!(devid, "writing {online}: {e}");
            }
            if tapdisk.wait_timeout(UNPLUG_TIMEOUT).await.is_none() {
                tracing::warn!(devid, "the tapdisk did not close in time: stopping it");
                tapdisk.stop(TERM_GRACE).await;
            }
        }
    }
    // SR.detach.
    if !vbd.spec.attach_delay.is_zero() {
        tokio::time::sleep(vbd.spec.attach_delay).await;
    }
    for p in [&vbd.paths.backend, &vbd.paths.frontend] {
        if let Err(e) = xs_tree::rm_quiet(xs, p).await {
            tracing::warn!(devid, "removing {p}: {e}");
        }
    }
}
