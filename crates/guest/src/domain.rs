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

use crate::job::{run_jobs, JobSpec};
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
    #[arg(long, default_value = "adaptive")]
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
    /// Boot simulation: read this many MiB from the first disk, then write
    /// data/ready = 1 in the domain's xenstore home.
    #[arg(long)]
    pub boot_read: Option<u32>,
    /// Connect the disks and wait for SIGTERM.
    #[arg(long)]
    pub idle: bool,
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
    let (iodepth, bs) = spec
        .as_ref()
        .map_or((32, 1 << 20), |s| (s.iodepth as usize, s.bs.0 as usize));
    let mut cfg = FrontendConfig::new(0);
    cfg.queues = args.queues.unwrap_or(numjobs).max(1);
    cfg.ring_order = args.ring_order;
    cfg.buffers = iodepth.max(1);
    cfg.buffer_size = bs.max(4096).div_ceil(4096) * 4096;
    cfg.poll = match args.polling.as_str() {
        "adaptive" => front::frontend_default_policy(),
        other => other.parse::<PollPolicy>().map_err(anyhow::Error::msg)?,
    };
    let stop = Arc::new(tokio::sync::Notify::new());
    let mut supervisors = Vec::new();
    let mut all_queues: Vec<Vec<BlkQueue>> = Vec::new();
    for devid in &devids {
        cfg.devid = *devid;
        let (blk, queues) = front::connect(res.clone(), xs.clone(), &cfg)
            .await
            .with_context(|| format!("connecting disk {devid}"))?;
        let s = stop.clone();
        supervisors.push(tokio::task::spawn_local(async move {
            if let Err(e) = blk.supervise(async move { s.notified().await }).await {
                tracing::warn!("disk supervisor: {e}");
            }
        }));
        all_queues.push(queues);
    }
    let result = workload(&args, spec, domid, &xs, &mut all_queues).await;
    if result.is_ok() && args.linger > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(args.linger)).await;
    }
    stop.notify_waiters();
    for s in supervisors {
        let _ = tokio::time::timeout(Duration::from_secs(15), s).await;
    }
    result
}

async fn wait_for_termination() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

async fn workload(
    args: &GuestArgs,
    spec: Option<JobSpec>,
    domid: u16,
    xs: &Client,
    disks: &mut [Vec<BlkQueue>],
) -> anyhow::Result<()> {
    if let Some(spec) = spec {
        // Every job runs on its own queue; with several disks, the jobs
        // of the first disk (one report).
        let queues = std::mem::take(&mut disks[0]);
        if (queues.len() as u32) < spec.numjobs {
            bail!(
                "numjobs={} but the disk has {} queues",
                spec.numjobs,
                queues.len()
            );
        }
        let stop = Arc::new(AtomicBool::new(false));
        let json = args.json;
        let outcome = tokio::task::spawn_blocking(move || {
            let mut qs = queues.into_iter();
            run_jobs(&spec, |_| qs.next().ok_or("no queue left"), Some(stop))
        })
        .await??;
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
        if !r.ok() {
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
        wait_for_termination().await?;
        server.shutdown()?;
        return Ok(());
    }
    if let Some(mib) = args.boot_read {
        let mut q = disks[0].remove(0);
        let bytes = u64::from(mib) << 20;
        tokio::task::spawn_blocking(move || boot_read(&mut q, bytes)).await??;
        xs.write(&format!("/local/domain/{domid}/data/ready"), "1")
            .await?;
        return Ok(());
    }
    wait_for_termination().await
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
