//! `pvio bench ring`: queue-depth-1 round trips between a frontend domain
//! and a dom0 backend through a blkif ring and event channels from hvd, next
//! to the two raw baselines measured in the same run on the same CPUs:
//!
//! * `eventfd`: two processes ping-ponging through blocking eventfd reads —
//!   what an event-mode ring round trip can at best cost;
//! * `spin`: two processes ping-ponging a cache line — what a polled ring
//!   round trip can at best cost.
//!
//! The pinger (the frontend) runs on CPU 0 and the ponger (the backend) on
//! CPU 1, so every mode pays the same cross-CPU costs.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{bail, Context};
use pvio_abi::blkif::{Blkif, BlkifRequest, BlkifResponse, BLKIF_OP_READ, BLKIF_RSP_OKAY};
use pvio_hv::HvClient;
use pvio_ring::{BackRing, FrontRing, GuestPages};
use serde::{Deserialize, Serialize};

use crate::procs::{cpus, pin_to_cpu, start_hvd, LineChild, ScratchDir};
use crate::report::{emit, latency_histogram, ratio};

/// Options of `pvio bench ring`.
#[derive(clap::Args, Debug)]
#[command(
    about = "Ring round trips (event and poll modes) against raw eventfd and cache-line ping-pong"
)]
pub struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Round trips measured in the event and eventfd modes.
    #[arg(long, default_value_t = 20_000)]
    pub iterations: u64,
    /// Round trips measured in the poll and spin modes.
    #[arg(long, default_value_t = 500_000)]
    pub poll_iterations: u64,
    /// A short run for tests (2,000 and 20,000 round trips).
    #[arg(long)]
    pub quick: bool,
    /// Do not pin the two sides to CPUs 0 and 1.
    #[arg(long)]
    pub no_pin: bool,
}

/// How the two sides wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
pub enum Mode {
    /// Block on the event channel (or eventfd).
    Event,
    /// Spin on the shared memory.
    Poll,
}

/// Latency summary a pinger reports, in ns.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct RttSummary {
    pub p50: u64,
    pub p99: u64,
    pub mean: f64,
    pub n: u64,
}

fn summary(h: &hdrhistogram::Histogram<u64>) -> RttSummary {
    RttSummary {
        p50: h.value_at_quantile(0.5),
        p99: h.value_at_quantile(0.99),
        mean: h.mean(),
        n: h.len(),
    }
}

/// Options of the hidden `pvio internal ring-ping` (the baseline pinger).
#[derive(clap::Args, Debug)]
pub struct PingArgs {
    /// Socket of the benchmark that hands over the shared descriptors.
    #[arg(long)]
    pub connect: std::path::PathBuf,
    #[arg(long, value_enum)]
    pub mode: Mode,
    #[arg(long)]
    pub iterations: u64,
    #[arg(long, default_value_t = 1000)]
    pub warmup: u64,
    /// CPU to pin to (none: don't pin).
    #[arg(long)]
    pub cpu: Option<usize>,
}

/// Options of the hidden `pvio internal ring-frontend` (the guest side).
#[derive(clap::Args, Debug)]
pub struct FrontendArgs {
    /// hvd's socket.
    #[arg(long)]
    pub socket: std::path::PathBuf,
    #[arg(long, value_enum)]
    pub mode: Mode,
    #[arg(long)]
    pub iterations: u64,
    #[arg(long, default_value_t = 1000)]
    pub warmup: u64,
    #[arg(long)]
    pub cpu: Option<usize>,
}

/// Two cache lines of a shared page: the pinger's counter and the ponger's.
struct SpinLines {
    map: pvio_hv::Mapping,
}

impl SpinLines {
    fn new(fd: &std::os::fd::OwnedFd) -> anyhow::Result<Self> {
        Ok(Self {
            map: pvio_hv::Mapping::map_shared(fd, 0, 4096)?,
        })
    }
    fn line(&self, i: usize) -> &AtomicU64 {
        // SAFETY: offsets 0 and 64 lie inside the 4 KiB mapping, which is
        // page-aligned (so 8-byte aligned) and lives as long as `self`; the
        // shared words are only ever accessed atomically by both processes.
        unsafe { &*self.map.as_ptr().add(i * 64).cast::<AtomicU64>() }
    }
}

fn blocking_eventfd() -> anyhow::Result<std::os::fd::OwnedFd> {
    Ok(rustix::event::eventfd(
        0,
        rustix::event::EventfdFlags::CLOEXEC,
    )?)
}

fn efd_write(fd: std::os::fd::BorrowedFd<'_>) -> anyhow::Result<()> {
    rustix::io::write(fd, &1u64.to_ne_bytes())?;
    Ok(())
}

fn efd_read(fd: std::os::fd::BorrowedFd<'_>) -> anyhow::Result<()> {
    let mut b = [0u8; 8];
    loop {
        match rustix::io::read(fd, &mut b) {
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// The baseline pinger (child process).
pub fn ping_main(a: PingArgs) -> anyhow::Result<()> {
    if let Some(c) = a.cpu {
        pin_to_cpu(c)?;
    }
    let sock = pvio_hv::sys::seqpacket_connect(&a.connect)?;
    let mut buf = [0u8; 16];
    let got = pvio_hv::sys::recv_with_fds(sock.as_fd(), &mut buf, false)?;
    let mut h = latency_histogram();
    let total = a.warmup + a.iterations;
    match a.mode {
        Mode::Event => {
            let [to_me, to_peer]: [std::os::fd::OwnedFd; 2] = got
                .fds
                .try_into()
                .map_err(|_| anyhow::anyhow!("expected two eventfds"))?;
            for i in 0..total {
                let t0 = Instant::now();
                efd_write(to_peer.as_fd())?;
                efd_read(to_me.as_fd())?;
                if i >= a.warmup {
                    h.record(t0.elapsed().as_nanos() as u64)?;
                }
            }
        }
        Mode::Poll => {
            let fd = got.fds.into_iter().next().context("expected a memfd")?;
            let lines = SpinLines::new(&fd)?;
            for i in 1..=total {
                let t0 = Instant::now();
                lines.line(0).store(i, Ordering::Release);
                while lines.line(1).load(Ordering::Acquire) != i {
                    std::hint::spin_loop();
                }
                if i > a.warmup {
                    h.record(t0.elapsed().as_nanos() as u64)?;
                }
            }
        }
    }
    println!("{}", serde_json::to_string(&summary(&h))?);
    Ok(())
}

fn baseline(
    dir: &ScratchDir,
    mode: Mode,
    iterations: u64,
    pin: bool,
) -> anyhow::Result<RttSummary> {
    let path = dir.0.join(format!("ping-{mode:?}.sock"));
    let listener = pvio_hv::sys::seqpacket_listen(&path, false)?;
    let mut args = vec![
        "internal".to_string(),
        "ring-ping".into(),
        "--connect".into(),
        path.display().to_string(),
        "--mode".into(),
        format!("{mode:?}").to_lowercase(),
        "--iterations".into(),
        iterations.to_string(),
    ];
    if pin {
        args.extend(["--cpu".into(), "0".into()]);
    }
    let mut child = LineChild::spawn(&args)?;
    let conn = rustix::net::accept(&listener)?;
    let total = 1000 + iterations;
    let worker = match mode {
        Mode::Event => {
            let to_child = blocking_eventfd()?;
            let to_me = blocking_eventfd()?;
            pvio_hv::sys::send_with_fds(
                conn.as_fd(),
                b"fds",
                &[to_child.as_fd(), to_me.as_fd()],
                false,
            )?;
            std::thread::spawn(move || -> anyhow::Result<()> {
                if pin {
                    pin_to_cpu(1)?;
                }
                for _ in 0..total {
                    efd_read(to_me.as_fd())?;
                    efd_write(to_child.as_fd())?;
                }
                Ok(())
            })
        }
        Mode::Poll => {
            let fd = pvio_hv::sys::create_sealed_memfd("pvio-bench-spin", 4096)?;
            pvio_hv::sys::send_with_fds(conn.as_fd(), b"fds", &[fd.as_fd()], false)?;
            std::thread::spawn(move || -> anyhow::Result<()> {
                if pin {
                    pin_to_cpu(1)?;
                }
                let lines = SpinLines::new(&fd)?;
                for i in 1..=total {
                    while lines.line(0).load(Ordering::Acquire) != i {
                        std::hint::spin_loop();
                    }
                    lines.line(1).store(i, Ordering::Release);
                }
                Ok(())
            })
        }
    };
    let line = child.read_line()?;
    worker
        .join()
        .map_err(|_| anyhow::anyhow!("ponger panicked"))??;
    child.finish()?;
    serde_json::from_str(&line).with_context(|| format!("bad result line {line:?}"))
}

/// The frontend domain (child process): a guest with a one-page blkif ring
/// in its memory, granted to dom0, and an event channel offered to dom0.
pub fn frontend_main(a: FrontendArgs) -> anyhow::Result<()> {
    if let Some(c) = a.cpu {
        pin_to_cpu(c)?;
    }
    let dom = HvClient::register_guest(&a.socket, "bench-ring-frontend", 16)?;
    let ring_gfn = 1;
    let mut front = FrontRing::<Blkif, _>::init(GuestPages::new(dom.memory.clone(), ring_gfn, 1)?)?;
    let gref = dom.grants.grant_access(0, ring_gfn, false)?;
    let chan = dom.client.evtchn_alloc_unbound(0)?;
    println!("ready {} {} {}", dom.client.domid(), gref, chan.port());
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    if go.trim() != "go" {
        bail!("expected go, got {go:?}");
    }
    let mut h = latency_histogram();
    let total = a.warmup + a.iterations;
    for i in 0..total {
        let req = BlkifRequest {
            operation: BLKIF_OP_READ,
            id: i,
            ..Default::default()
        };
        let t0 = Instant::now();
        front.push_request(&req)?;
        if front.push_requests_and_check_notify() {
            chan.notify()?;
        }
        let rsp = loop {
            if let Some(r) = front.take_response()? {
                break r;
            }
            match a.mode {
                Mode::Poll => std::hint::spin_loop(),
                Mode::Event => {
                    if !front.final_check_for_responses()? {
                        chan.wait()?;
                    }
                }
            }
        };
        let dt = t0.elapsed().as_nanos() as u64;
        if rsp.id != i || rsp.status != BLKIF_RSP_OKAY {
            bail!("response {} (status {}) to request {i}", rsp.id, rsp.status);
        }
        if i >= a.warmup {
            h.record(dt)?;
        }
    }
    println!("{}", serde_json::to_string(&summary(&h))?);
    Ok(())
}

fn ring_mode(
    hvd_socket: &std::path::Path,
    mode: Mode,
    iterations: u64,
    pin: bool,
) -> anyhow::Result<RttSummary> {
    let host = HvClient::connect_host(hvd_socket)?;
    let mut args = vec![
        "internal".to_string(),
        "ring-frontend".into(),
        "--socket".into(),
        hvd_socket.display().to_string(),
        "--mode".into(),
        format!("{mode:?}").to_lowercase(),
        "--iterations".into(),
        iterations.to_string(),
    ];
    if pin {
        args.extend(["--cpu".into(), "0".into()]);
    }
    let mut child = LineChild::spawn(&args)?;
    let ready = child.read_line()?;
    let f: Vec<&str> = ready.split_whitespace().collect();
    if f.len() != 4 || f[0] != "ready" {
        bail!("frontend said {ready:?}");
    }
    let (domid, gref, port): (u16, u32, u32) = (f[1].parse()?, f[2].parse()?, f[3].parse()?);
    // The backend: map the ring's grant, attach, bind the event channel.
    let mapped = host.map_grant_refs(domid, &[gref], false)?;
    let mem = host.foreign_memory(domid)?;
    let ring_pages = mem.map_frames(&[mapped[0].frame])?;
    let mut back = BackRing::<Blkif, _>::attach(ring_pages)?;
    let chan = host.evtchn_bind_interdomain(domid, port)?;
    let total = 1000 + iterations;
    let worker = std::thread::spawn(move || -> anyhow::Result<()> {
        if pin {
            pin_to_cpu(1)?;
        }
        let mut served = 0u64;
        while served < total {
            let mut got = false;
            while let Some(req) = back.take_request()? {
                let rsp = BlkifResponse {
                    id: req.id,
                    operation: req.operation,
                    status: BLKIF_RSP_OKAY,
                    ..Default::default()
                };
                back.push_response(&rsp)?;
                served += 1;
                got = true;
            }
            if got && back.push_responses_and_check_notify() {
                chan.notify()?;
            }
            if served >= total || got {
                continue;
            }
            match mode {
                Mode::Poll => std::hint::spin_loop(),
                Mode::Event => {
                    if !back.final_check_for_requests()? {
                        chan.wait()?;
                    }
                }
            }
        }
        Ok(())
    });
    child.send("go")?;
    let line = child.read_line()?;
    worker
        .join()
        .map_err(|_| anyhow::anyhow!("backend panicked"))??;
    child.finish()?;
    host.unmap_grants(&[mapped[0].handle])?;
    serde_json::from_str(&line).with_context(|| format!("bad result line {line:?}"))
}

/// Runs the benchmark.
pub fn run(args: Args) -> anyhow::Result<()> {
    let (iters, poll_iters) = if args.quick {
        (2_000, 20_000)
    } else {
        (args.iterations, args.poll_iterations)
    };
    let pin = !args.no_pin && cpus() >= 2;
    let dir = ScratchDir::new("ring")?;
    let say = |what: &str| {
        if !args.json {
            eprintln!("bench ring: {what}");
        }
    };
    say(&format!("raw eventfd ping-pong, {iters} round trips"));
    let eventfd = baseline(&dir, Mode::Event, iters, pin)?;
    say(&format!(
        "raw cache-line ping-pong, {poll_iters} round trips"
    ));
    let spin = baseline(&dir, Mode::Poll, poll_iters, pin)?;
    let hvd_socket = dir.0.join("hvd.sock");
    let _hvd = start_hvd(&hvd_socket)?;
    say(&format!("ring, event mode, {iters} round trips"));
    let event = ring_mode(&hvd_socket, Mode::Event, iters, pin)?;
    say(&format!("ring, poll mode, {poll_iters} round trips"));
    let poll = ring_mode(&hvd_socket, Mode::Poll, poll_iters, pin)?;

    let ev_ratio = ratio(event.p50 as f64, eventfd.p50 as f64);
    let poll_ratio = ratio(poll.p50 as f64, spin.p50 as f64);
    let json = serde_json::json!({
        "eventfd_rtt_ns_p50": eventfd.p50,
        "eventfd_rtt_ns_p99": eventfd.p99,
        "spin_rtt_ns_p50": spin.p50,
        "spin_rtt_ns_p99": spin.p99,
        "event_rtt_ns_p50": event.p50,
        "event_rtt_ns_p99": event.p99,
        "poll_rtt_ns_p50": poll.p50,
        "poll_rtt_ns_p99": poll.p99,
        "event_vs_eventfd_p50": ev_ratio,
        "poll_vs_spin_p50": poll_ratio,
        "iterations_event": iters,
        "iterations_poll": poll_iters,
        "pinned": pin,
        "cpus": cpus(),
    });
    let f = |v: Option<f64>| v.map_or("n/a".to_string(), |r| format!("{r:.2}x"));
    let text = format!(
        "mode              p50 (ns)    p99 (ns)   vs baseline\n\
         raw eventfd     {:>10}  {:>10}\n\
         ring, event     {:>10}  {:>10}   {}\n\
         raw spin        {:>10}  {:>10}\n\
         ring, poll      {:>10}  {:>10}   {}\n\
         (queue depth 1; {} pinned to CPUs 0 and 1)\n",
        eventfd.p50,
        eventfd.p99,
        event.p50,
        event.p99,
        f(ev_ratio),
        spin.p50,
        spin.p99,
        poll.p50,
        poll.p99,
        f(poll_ratio),
        if pin { "sides" } else { "sides not" },
    );
    emit(args.json, &json, &text);
    Ok(())
}
