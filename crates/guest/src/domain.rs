//! `pvio guest`: a process that is a guest domain. It claims the domain the
//! toolstack created (or creates one of its own), connects a frontend to
//! each of its virtual disks through the xenstore, and runs one workload:
//!
//! * `--job SPEC`: the fio-like job runner on the disks, printing a report;
//! * `--nbd PATH`: an NBD export of the first disk until SIGTERM;
//! * `--idle`: nothing, until SIGTERM (for lifecycle tests);
//! * `--boot-read MIB`: a boot simulation — read that much from the first
//!   disk, then write `data/ready = 1` in its xenstore home.
//!
//! When the workload ends it closes its disks (Closing, Closed) and exits.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use pvio_blk::device::{BlockDevice, DeviceOp, DeviceRequest};
use pvio_blk::front::{self, BlkQueue, FrontendConfig, GuestResources};
use pvio_hv::memory::RESERVED_FRAMES;
use pvio_hv::HvClient;
use pvio_poll::PollPolicy;
use pvio_xenstore::Client;

use crate::job::{run_jobs, JobSpec, RunReport};
use crate::nbd::{NbdConfig, NbdServer};

/// Options of `pvio guest`.
#[derive(clap::Args, Debug)]
#[command(about = "Run a guest domain: frontends for its disks and one workload")]
pub struct GuestArgs {
    /// hvd's socket.
    #[arg(long, env = "PVIO_HVD_SOCKET", default_value = "/run/pvio/hvd.sock")]
    pub hvd_socket: std::path::PathBuf,
    /// xenstored's socket.
    #[arg(
        long,
        env = "PVIO_XENSTORED_SOCKET",
        default_value = "/run/pvio/xenstored.sock"
    )]
    pub xenstore_socket: std::path::PathBuf,
    /// Claim this domain (created by the toolstack).
    #[arg(long, requires = "token")]
    pub domid: Option<u16>,
    /// The claim token the toolstack got from hvd.
    #[arg(long)]
    pub token: Option<u64>,
    /// Name of a domain to create (without --domid).
    #[arg(long, default_value = "guest")]
    pub name: String,
    /// Memory in MiB of a domain to create (without --domid).
    #[arg(long, default_value_t = 256)]
    pub memory_mib: u32,
    /// Disks to connect, by device id (default: every vbd of the domain).
    #[arg(long = "disk")]
    pub disks: Vec<u32>,
    /// Queues per disk (default: the job's numjobs, else 1).
    #[arg(long)]
    pub queues: Option<u32>,
    /// Ring size per queue as a page order.
    #[arg(long, default_value_t = 2)]
    pub ring_order: u32,
    /// How the frontend waits for responses: off, spin, tapdisk3, adaptive.
    #[arg(long, env = "PVIO_GUEST_POLLING", default_value = "adaptive")]
    pub polling: String,
    /// Run this fio-like job (e.g. rw=randread,bs=4k,iodepth=32,runtime=10s).
    #[arg(long)]
    pub job: Option<String>,
    /// Print the job's report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Export the first disk over NBD on this Unix socket until SIGTERM.
    #[arg(long)]
    pub nbd: Option<std::path::PathBuf>,
    /// Export read-only.
    #[arg(long)]
    pub nbd_read_only: bool,
    /// Boot simulation: read this many MiB from the first disk, then
    /// write data/ready = 1 in the domain's xenstore home.
    #[arg(long)]
    pub boot_read: Option<u32>,
    /// Request size of the boot read in bytes, rounded up to 4 KiB
    /// (default: 128 KiB, Linux's readahead).
    #[arg(long, default_value_t = 128 << 10, value_parser = clap::value_parser!(u32).range(512..=(16 << 20)))]
    pub boot_read_bs: u32,
    /// Requests the boot read keeps in flight.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub boot_read_depth: u32,
    /// Connect the disks and wait for SIGTERM.
    #[arg(long)]
    pub idle: bool,
    /// After the workload, stay running (disks connected) until asked to
    /// shut down: SIGTERM, or `control/shutdown` for a toolstack's domain.
    #[arg(long)]
    pub stay: bool,
    /// After the workload, stay connected but idle for this many seconds
    /// (to measure what an idle guest costs the backend).
    #[arg(long, default_value_t = 0.0)]
    pub linger: f64,
}

/// Runs the guest until its workload ends.
pub fn run(args: GuestArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Frontend supervisors run as local tasks: xenstore transactions borrow
    // the client across awaits, which makes their futures !Send.
    let local = tokio::task::LocalSet::new();
    rt.block_on(local.run_until(run_async(args)))
}

async fn vbds(xs: &Client, domid: u16) -> anyhow::Result<Vec<u32>> {
    let dir = format!("/local/domain/{domid}/device/vbd");
    let mut v: Vec<u32> = match xs.directory(&dir).await {
        Ok(names) => names.iter().filter_map(|n| n.parse().ok()).collect(),
        Err(e) if e.xs() == Some(pvio_xenstore::XsError::Enoent) => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    v.sort_unstable();
    Ok(v)
}

async fn run_async(args: GuestArgs) -> anyhow::Result<()> {
    let modes = [
        args.job.is_some(),
        args.nbd.is_some(),
        args.idle,
        args.boot_read.is_some(),
    ];
    if modes.iter().filter(|m| **m).count() != 1 {
        bail!("give exactly one workload: --job, --nbd, --idle or --boot-read");
    }
    let spec = match &args.job {
        Some(s) => Some(JobSpec::parse(s).with_context(|| format!("bad --job {s:?}"))?),
        None => None,
    };
    let claimed = args.domid.is_some();
    let dom = match (args.domid, args.token) {
        (Some(d), Some(t)) => HvClient::claim_domain(&args.hvd_socket, d, t)?,
        _ => HvClient::register_guest(&args.hvd_socket, &args.name, args.memory_mib * 256)?,
    };
    let domid = dom.client.domid();
    let (res, store) = GuestResources::new(dom, RESERVED_FRAMES);
    // A domain the toolstack created was introduced to xenstored: talk to
    // it over the xenbus ring, as the guest. A domain this process created
    // itself was not (no toolstack ran), so it uses the dom0 socket: for
    // development only.
    let xs = if claimed {
        Client::connect_ring(res.memory.clone(), store)
            .await
            .context("connecting to xenstored over the xenbus ring")?
    } else {
        Client::connect(&args.xenstore_socket)
            .await
            .with_context(|| {
                format!(
                    "connecting to xenstored at {}",
                    args.xenstore_socket.display()
                )
            })?
    };
    let shutdown = ShutdownRequest::listen(&xs, domid, claimed).await?;
    let devids = if args.disks.is_empty() {
        vbds(&xs, domid).await?
    } else {
        args.disks.clone()
    };
    let needs_disk = !args.idle;
    if devids.is_empty() && needs_disk {
        bail!("domain {domid} has no virtual disk (nothing under device/vbd)");
    }
    let numjobs = spec.as_ref().map_or(1, |s| s.numjobs);
    let (iodepth, bs) = match (&spec, args.boot_read) {
        (Some(s), _) => (s.iodepth as usize, s.bs.0 as usize),
        (None, Some(_)) => (args.boot_read_depth as usize, args.boot_read_bs as usize),
        (None, None) => (32, 1 << 20),
    };
    let mut cfg = FrontendConfig::new(0);
    cfg.ring_order = args.ring_order;
    cfg.poll = match args.polling.as_str() {
        "adaptive" => front::frontend_default_policy(),
        other => other.parse::<PollPolicy>().map_err(anyhow::Error::msg)?,
    };
    // Jobs are spread over the disks (job j on disk j mod n); the NBD
    // export and the boot read use the first disk. A disk no workload
    // touches gets one small buffer, so a VM of 255 idle disks stays small.
    let jobs_per_disk = |i: usize| -> u32 {
        if spec.is_none() {
            return u32::from(i == 0 && (args.nbd.is_some() || args.boot_read.is_some()));
        }
        let n = devids.len() as u32;
        (numjobs / n) + u32::from((i as u32) < numjobs % n)
    };
    // Disks close when this turns true (a watch, not a Notify: a supervisor
    // that has not started waiting yet must still see it).
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut connecting = tokio::task::JoinSet::new();
    for (i, devid) in devids.iter().enumerate() {
        let mut cfg = cfg.clone();
        cfg.devid = *devid;
        let used = jobs_per_disk(i);
        if used > 0 {
            cfg.queues = args.queues.unwrap_or(used).max(1);
            cfg.buffers = iodepth.max(1);
            cfg.buffer_size = bs.max(4096).div_ceil(4096) * 4096;
        } else {
            cfg.queues = 1;
            cfg.buffers = 1;
            cfg.buffer_size = 4096;
        }
        let (res, xs) = (res.clone(), xs.clone());
        // Disks connect in parallel, as a kernel probes its xenbus devices.
        connecting.spawn_local(async move {
            let r = front::connect(res, xs, &cfg).await;
            (i, cfg.devid, r)
        });
    }
    let mut connected = Vec::new();
    while let Some(joined) = connecting.join_next().await {
        let (i, devid, r) = joined.context("a disk's connect task failed")?;
        let (blk, queues) = r.with_context(|| format!("connecting disk {devid}"))?;
        connected.push((i, blk, queues));
    }
    connected.sort_by_key(|(i, _, _)| *i);
    let mut supervisors = Vec::new();
    let mut all_queues: Vec<Vec<BlkQueue>> = Vec::new();
    for (_, blk, queues) in connected {
        let mut s = stop.clone();
        supervisors.push(tokio::task::spawn_local(async move {
            let stopped = async move {
                let _ = s.wait_for(|v| *v).await;
            };
            if let Err(e) = blk.supervise(stopped).await {
                tracing::warn!("disk supervisor: {e}");
            }
        }));
        all_queues.push(queues);
    }
    if claimed {
        let known = devids.iter().copied().collect();
        tokio::task::spawn_local(hotplug(
            res.clone(),
            xs.clone(),
            cfg.clone(),
            domid,
            known,
            stop.clone(),
        ));
    }
    let result = workload(&args, spec, domid, &xs, &mut all_queues, &shutdown).await;
    if let Err(e) = &result {
        report_failure(&xs, domid, claimed, e).await;
    }
    if result.is_ok() && args.linger > 0.0 {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs_f64(args.linger)) => {}
            _ = shutdown.wait() => {}
        }
    }
    if result.is_ok() && args.stay {
        shutdown.wait().await;
    }
    stop_tx.send_replace(true);
    for s in supervisors {
        let _ = tokio::time::timeout(Duration::from_secs(15), s).await;
    }
    result
}

/// Connects disks the toolstack plugs while the guest runs (as a kernel's
/// xenbus probe does): they get one small buffer, for no workload uses them.
/// A disk the toolstack unplugs is closed by its supervisor when the backend
/// closes.
async fn hotplug(
    res: GuestResources,
    xs: Client,
    mut cfg: FrontendConfig,
    domid: u16,
    mut known: std::collections::HashSet<u32>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let dir = format!("/local/domain/{domid}/device/vbd");
    let mut w = match xs.watch(&dir).await {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!("watching {dir}: {e}");
            return;
        }
    };
    while w.next().await.is_some() {
        let now = match vbds(&xs, domid).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!("listing {dir}: {e}");
                continue;
            }
        };
        known.retain(|d| now.contains(d));
        for devid in now {
            if known.contains(&devid) {
                continue;
            }
            // The toolstack creates the directory before its keys: wait
            // for them (the next event).
            let backend = format!("{dir}/{devid}/backend");
            if !matches!(xs.exists(&backend).await, Ok(true)) {
                continue;
            }
            known.insert(devid);
            cfg.devid = devid;
            cfg.queues = 1;
            cfg.buffers = 1;
            cfg.buffer_size = 4096;
            let (res, xs, cfg, mut stop) = (res.clone(), xs.clone(), cfg.clone(), stop.clone());
            tokio::task::spawn_local(async move {
                match front::connect(res, xs, &cfg).await {
                    Ok((blk, _queues)) => {
                        tracing::info!(devid, "hot-plugged disk connected");
                        let stopped = async move {
                            let _ = stop.wait_for(|v| *v).await;
                        };
                        if let Err(e) = blk.supervise(stopped).await {
                            tracing::warn!(devid, "disk supervisor: {e}");
                        }
                    }
                    Err(e) => tracing::warn!(devid, "connecting hot-plugged disk: {e}"),
                }
            });
        }
    }
}

/// A request to stop: SIGTERM or SIGINT, or (for a domain the toolstack
/// started) `control/shutdown` in the xenstore, as a PV guest kernel
/// watches it. A xenstore request is acknowledged by clearing the key.
struct ShutdownRequest {
    rx: tokio::sync::watch::Receiver<bool>,
}

impl ShutdownRequest {
    async fn listen(xs: &Client, domid: u16, from_xenstore: bool) -> anyhow::Result<Self> {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let tx = Arc::new(tx);
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
        let t = tx.clone();
        tokio::task::spawn_local(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::info!("signal: shutting down");
            t.send_replace(true);
        });
        if from_xenstore {
            let key = format!("/local/domain/{domid}/control/shutdown");
            let mut w = xs.watch(&key).await?;
            let xs = xs.clone();
            tokio::task::spawn_local(async move {
                while w.next().await.is_some() {
                    let v = match xs.try_read(&key).await {
                        Ok(v) => v.unwrap_or_default(),
                        Err(e) => {
                            tracing::warn!("reading {key}: {e}");
                            continue;
                        }
                    };
                    let v = String::from_utf8_lossy(&v).into_owned();
                    if matches!(v.as_str(), "poweroff" | "halt" | "reboot") {
                        tracing::info!(request = %v, "shutdown requested by the toolstack");
                        if let Err(e) = xs.write(&key, "").await {
                            tracing::warn!("acknowledging {key}: {e}");
                        }
                        tx.send_replace(true);
                        return;
                    }
                }
            });
        }
        Ok(Self { rx })
    }

    /// Whether a stop was requested.
    fn requested(&self) -> bool {
        *self.rx.borrow()
    }

    /// Waits for a stop request.
    async fn wait(&self) {
        let mut rx = self.rx.clone();
        let _ = rx.wait_for(|v| *v).await;
    }
}

/// The xenstore directory a toolstack-started guest reports its workload in
/// (like a guest agent's `data/` keys).
fn workload_dir(domid: u16) -> String {
    format!("/local/domain/{domid}/data/workload")
}

async fn report_failure(xs: &Client, domid: u16, claimed: bool, e: &anyhow::Error) {
    if !claimed {
        return;
    }
    let dir = workload_dir(domid);
    let msg: String = format!("{e:#}").chars().take(1024).collect();
    let r = xs
        .transaction(async |t| {
            t.write(&format!("{dir}/state"), "failed").await?;
            t.write(&format!("{dir}/error"), msg.as_str()).await?;
            Ok(())
        })
        .await;
    if let Err(e) = r {
        tracing::warn!("reporting the failure in {dir}: {e}");
    }
}

/// Writes a job's results where the toolstack reads them.
async fn report_job(xs: &Client, domid: u16, r: &RunReport) -> anyhow::Result<()> {
    let dir = workload_dir(domid);
    let t = &r.total;
    let verify = if r.jobs.iter().all(|j| j.verify.is_none()) {
        "off".to_string()
    } else if t.verify_failures == 0 {
        "ok".to_string()
    } else {
        format!("failed ({} blocks)", t.verify_failures)
    };
    let state = if r.ok() { "done" } else { "failed" };
    let keys: Vec<(&str, String)> = vec![
        ("state", state.into()),
        ("runtime_s", format!("{:.2}", t.runtime_s)),
        ("iops", format!("{:.0}", t.read.iops + t.write.iops)),
        ("mb_s", format!("{:.1}", t.read.mb_per_s + t.write.mb_per_s)),
        ("read_iops", format!("{:.0}", t.read.iops)),
        ("write_iops", format!("{:.0}", t.write.iops)),
        ("read_p50_us", format!("{:.1}", t.read.lat_us.p50)),
        ("read_p99_us", format!("{:.1}", t.read.lat_us.p99)),
        ("write_p50_us", format!("{:.1}", t.write.lat_us.p50)),
        ("write_p99_us", format!("{:.1}", t.write.lat_us.p99)),
        ("errors", t.errors.to_string()),
        ("verify", verify),
    ];
    xs.transaction(async |tx| {
        for (k, v) in &keys {
            tx.write(&format!("{dir}/{k}"), v.as_str()).await?;
        }
        Ok(())
    })
    .await?;
    Ok(())
}

async fn workload(
    args: &GuestArgs,
    spec: Option<JobSpec>,
    domid: u16,
    xs: &Client,
    disks: &mut [Vec<BlkQueue>],
    shutdown: &ShutdownRequest,
) -> anyhow::Result<()> {
    let claimed = args.domid.is_some();
    if claimed {
        xs.write(&format!("{}/state", workload_dir(domid)), "running")
            .await?;
    }
    if let Some(spec) = spec {
        // Job j runs on its own queue of disk j mod n.
        let n = disks.len();
        let mut queues: Vec<std::vec::IntoIter<BlkQueue>> = disks
            .iter_mut()
            .map(|d| std::mem::take(d).into_iter())
            .collect();
        let mut picked = Vec::with_capacity(spec.numjobs as usize);
        for j in 0..spec.numjobs as usize {
            match queues[j % n].next() {
                Some(q) => picked.push(q),
                None => bail!(
                    "numjobs={} but disk {} has too few queues",
                    spec.numjobs,
                    j % n
                ),
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let json = args.json;
        let flag = stop.clone();
        let mut rx = shutdown.rx.clone();
        let stopper = tokio::task::spawn_local(async move {
            let _ = rx.wait_for(|v| *v).await;
            flag.store(true, std::sync::atomic::Ordering::Release);
        });
        let outcome = tokio::task::spawn_blocking(move || {
            let mut qs = picked.into_iter();
            run_jobs(&spec, |_| qs.next().ok_or("no queue left"), Some(stop))
        })
        .await?;
        stopper.abort();
        let outcome = outcome?;
        let r = &outcome.report;
        {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            if json {
                // One line, so a harness can read it while the guest lingers.
                writeln!(out, "{}", serde_json::to_string(r)?)?;
            } else {
                write!(out, "{r}")?;
            }
            out.flush()?;
        }
        if claimed {
            report_job(xs, domid, r).await?;
        }
        if !r.ok() && !shutdown.requested() {
            bail!("the job reported errors or verify failures");
        }
        return Ok(());
    }
    if let Some(path) = &args.nbd {
        let q = disks[0].remove(0);
        let server = NbdServer::start(
            path,
            q,
            NbdConfig {
                read_only: args.nbd_read_only,
                ..NbdConfig::default()
            },
        )?;
        tracing::info!(socket = %path.display(), "NBD export ready");
        shutdown.wait().await;
        server.shutdown()?;
        return Ok(());
    }
    if let Some(mib) = args.boot_read {
        let mut q = disks[0].remove(0);
        let bytes = u64::from(mib) << 20;
        let t0 = std::time::Instant::now();
        tokio::select! {
            r = tokio::task::spawn_blocking(move || boot_read(&mut q, bytes)) => r??,
            _ = shutdown.wait() => return Ok(()),
        }
        let dir = workload_dir(domid);
        let secs = format!("{:.3}", t0.elapsed().as_secs_f64());
        xs.transaction(async |t| {
            t.write(&format!("{dir}/state"), "done").await?;
            t.write(&format!("{dir}/boot_read_s"), secs.as_str())
                .await?;
            t.write(&format!("/local/domain/{domid}/data/ready"), "1")
                .await?;
            Ok(())
        })
        .await?;
        return Ok(());
    }
    shutdown.wait().await;
    Ok(())
}

/// Reads `bytes` from the start of the disk in buffer-sized requests, with
/// every buffer in flight.
fn boot_read(q: &mut BlkQueue, bytes: u64) -> anyhow::Result<()> {
    let info = q.info();
    let chunk = (q.buffer_size() as u64).min(u64::from(info.max_request_bytes));
    let end = bytes.min(info.size_bytes());
    let mut next = 0u64;
    let mut inflight = 0usize;
    let mut free: Vec<usize> = (0..q.buffer_count()).collect();
    let mut done = Vec::new();
    while next < end || inflight > 0 {
        while next < end {
            let Some(b) = free.pop() else { break };
            let len = chunk.min(end - next) as u32;
            q.submit(DeviceRequest {
                op: DeviceOp::Read,
                offset: next,
                len,
                buf: b,
                tag: b as u64,
            })?;
            next += u64::from(len);
            inflight += 1;
        }
        q.kick()?;
        done.clear();
        q.wait(&mut done, Some(Duration::from_secs(30)))?;
        if done.is_empty() {
            bail!("boot read stalled");
        }
        for c in &done {
            c.result
                .clone()
                .map_err(|e| anyhow::anyhow!("boot read failed: {e}"))?;
            free.push(c.tag as usize);
            inflight -= 1;
        }
    }
    Ok(())
}
