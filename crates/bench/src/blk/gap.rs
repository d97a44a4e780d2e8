//! The gap sweep: requests arrive a fixed gap after the previous one was
//! answered, and the backend's pickup latency and CPU per request are
//! measured for each polling policy — the experiment of perf-anchors §2.3 C
//! on pvio's real ring, event channels and backend idle logic
//! ([`pvio_blk::back::waiter::Waiter`], the code tapdisk's queues run).
//!
//! The frontend (a guest process on CPU 0) stamps each request with the
//! monotonic clock in `sector_number`, spins for its response without
//! re-arming notifications, then waits the gap (sleeping through most of
//! a long gap, spinning its last 150 µs so arrivals are on time). The backend (a thread on CPU 1 of the bench process, dom0)
//! takes the request, records `now - stamp`, and answers.

use std::os::fd::AsFd;
use std::time::Instant;

use anyhow::bail;
use pvio_abi::blkif::{Blkif, BlkifRequest, BlkifResponse, BLKIF_OP_READ, BLKIF_RSP_OKAY};
use pvio_blk::back::waiter::Waiter;
use pvio_hv::HvClient;
use pvio_poll::{HostLoad, PollPolicy};
use pvio_ring::{BackRing, FrontRing, GuestPages};

use crate::procs::{pin_to_cpu, LineChild};
use crate::report::latency_histogram;

/// One point of the sweep.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GapPoint {
    /// The gap, or with Poisson arrivals the mean gap.
    pub gap_us: u64,
    pub arrivals: Arrivals,
    pub mode: String,
    pub latency_us_p50: f64,
    pub latency_us_p99: f64,
    pub cpu_us_per_req: f64,
    pub requests: u64,
}

/// Options of the hidden `pvio internal gap-frontend`.
#[derive(clap::Args, Debug)]
pub struct GapFrontendArgs {
    #[arg(long)]
    pub socket: std::path::PathBuf,
    #[arg(long)]
    pub gap_us: u64,
    #[arg(long)]
    pub count: u64,
    #[arg(long)]
    pub cpu: Option<usize>,
    /// Draw each gap from an exponential distribution of mean `gap_us`
    /// (Poisson arrivals: the next gap cannot be predicted).
    #[arg(long)]
    pub poisson: bool,
}

/// How requests are spaced in a sweep point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arrivals {
    /// Every gap the same: a predictable rhythm.
    Fixed,
    /// Exponential gaps of that mean: no rhythm to learn.
    Poisson,
}

/// Exponential gaps of mean `mean_us` from a xorshift generator (seeded
/// from the clock: each run differs, the distribution does not).
struct ExpGaps {
    state: u64,
    mean_us: f64,
}

impl ExpGaps {
    fn new(mean_us: u64) -> Self {
        Self {
            state: pvio_poll::now_ns() | 1,
            mean_us: mean_us as f64,
        }
    }

    fn next_us(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        // Uniform in (0, 1]: never ln(0).
        let u = ((self.state >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        (-u.ln() * self.mean_us).round() as u64
    }
}

/// Waits `gap_us` precisely: sleeps through all but the last 150 µs (so
/// the host is idle during long gaps, as a real guest would leave it), then
/// spins to the deadline (so the arrival time does not carry the VM's timer
/// jitter, like the requester of perf-anchors §2.3 C).
fn wait_gap(gap_us: u64) {
    let until = pvio_poll::now_ns() + gap_us * 1000;
    if gap_us > 300 {
        std::thread::sleep(std::time::Duration::from_micros(gap_us - 150));
    }
    while pvio_poll::now_ns() < until {
        std::hint::spin_loop();
    }
}

/// The frontend process of the gap sweep.
pub fn frontend_main(a: GapFrontendArgs) -> anyhow::Result<()> {
    if let Some(c) = a.cpu {
        pin_to_cpu(c)?;
    }
    // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0u64, 0u64, 0u64) };
    let dom = HvClient::register_guest(&a.socket, "bench-gap-frontend", 16)?;
    let gfn = pvio_hv::memory::RESERVED_FRAMES;
    let mut front = FrontRing::<Blkif, _>::init(GuestPages::new(dom.memory.clone(), gfn, 1)?)?;
    let gref = dom.grants.grant_access(0, gfn, false)?;
    let chan = dom.client.evtchn_alloc_unbound(0)?;
    let mut exp = a.poisson.then(|| ExpGaps::new(a.gap_us));
    println!("ready {} {} {}", dom.client.domid(), gref, chan.port());
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    for i in 0..a.count {
        let req = BlkifRequest {
            operation: BLKIF_OP_READ,
            id: i,
            sector_number: pvio_poll::now_ns(),
            ..Default::default()
        };
        front.push_request(&req)?;
        if front.push_requests_and_check_notify() {
            chan.notify()?;
        }
        loop {
            if let Some(r) = front.take_response()? {
                if r.id != i {
                    bail!("response {} to request {i}", r.id);
                }
                break;
            }
            std::hint::spin_loop();
        }
        wait_gap(exp.as_mut().map_or(a.gap_us, ExpGaps::next_us));
    }
    println!("done");
    Ok(())
}

/// What one run of a (gap, policy) point measured: the pickup latencies
/// after the warm-up, and the backend's CPU time over them.
pub struct GapRun {
    pub latency: hdrhistogram::Histogram<u64>,
    pub cpu_ns: u64,
}

impl GapPoint {
    /// The point made of several runs' measurements.
    pub fn from_runs(
        gap_us: u64,
        arrivals: Arrivals,
        mode: &str,
        runs: &[GapRun],
    ) -> anyhow::Result<Self> {
        let mut h = latency_histogram();
        let mut cpu = 0;
        for r in runs {
            h.add(&r.latency)?;
            cpu += r.cpu_ns;
        }
        let measured = h.len().max(1);
        Ok(GapPoint {
            gap_us,
            arrivals,
            mode: mode.to_string(),
            latency_us_p50: h.value_at_quantile(0.5) as f64 / 1000.0,
            latency_us_p99: h.value_at_quantile(0.99) as f64 / 1000.0,
            cpu_us_per_req: cpu as f64 / 1000.0 / measured as f64,
            requests: measured,
        })
    }
}

/// Runs `count` requests of one (gap, policy) point against the hvd at
/// `socket` (the first tenth, at least 20, is a warm-up and not measured).
pub fn run(
    socket: &std::path::Path,
    policy: PollPolicy,
    load: &HostLoad,
    (gap_us, arrivals): (u64, Arrivals),
    count: u64,
    pin: bool,
) -> anyhow::Result<GapRun> {
    let host = HvClient::connect_host(socket)?;
    let mut args = vec![
        "internal".to_string(),
        "gap-frontend".into(),
        "--socket".into(),
        socket.display().to_string(),
        "--gap-us".into(),
        gap_us.to_string(),
        "--count".into(),
        count.to_string(),
    ];
    if pin {
        args.extend(["--cpu".into(), "0".into()]);
    }
    if arrivals == Arrivals::Poisson {
        args.push("--poisson".into());
    }
    let mut child = LineChild::spawn(&args)?;
    let ready = child.read_line()?;
    let f: Vec<&str> = ready.split_whitespace().collect();
    if f.len() != 4 || f[0] != "ready" {
        bail!("gap frontend said {ready:?}");
    }
    let (domid, gref, port): (u16, u32, u32) = (f[1].parse()?, f[2].parse()?, f[3].parse()?);
    let mapped = host.map_grant_refs(domid, &[gref], false)?;
    let mem = host.foreign_memory(domid)?;
    let mut ring = BackRing::<Blkif, _>::attach(mem.map_frames(&[mapped[0].frame])?)?;
    let chan = host.evtchn_bind_interdomain(domid, port)?;
    let load = load.clone();
    let worker = std::thread::spawn(
        move || -> anyhow::Result<(hdrhistogram::Histogram<u64>, u64)> {
            if pin {
                pin_to_cpu(1)?;
            }
            // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack.
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0u64, 0u64, 0u64) };
            let stop = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)?;
            let mut waiter = Waiter::new(policy, load);
            let mut h = latency_histogram();
            // The first requests teach the poller the rhythm; not measured.
            let warm = (count / 10).max(20).min(count / 2);
            let mut served = 0u64;
            let mut cpu0 = 0;
            while served < count {
                let mut got = false;
                while let Some(req) = ring.take_request()? {
                    let lat = pvio_poll::now_ns().saturating_sub(req.sector_number);
                    if served == warm {
                        cpu0 = pvio_poll::thread_cpu_ns();
                    }
                    if served >= warm {
                        h.record(lat.max(1))?;
                    }
                    ring.push_response(&BlkifResponse {
                        id: req.id,
                        operation: req.operation,
                        status: BLKIF_RSP_OKAY,
                        ..Default::default()
                    })?;
                    served += 1;
                    got = true;
                }
                if got && ring.push_responses_and_check_notify() {
                    chan.notify()?;
                }
                if !got && served < count {
                    waiter.idle(&mut ring, &chan, None, stop.as_fd(), &|| false)?;
                }
            }
            Ok((h, pvio_poll::thread_cpu_ns() - cpu0))
        },
    );
    child.send("go")?;
    let started = Instant::now();
    let done = child.read_line()?;
    if done != "done" {
        bail!("gap frontend said {done:?}");
    }
    let (h, cpu) = worker
        .join()
        .map_err(|_| anyhow::anyhow!("backend panicked"))??;
    child.finish()?;
    host.unmap_grants(&[mapped[0].handle])?;
    let _ = started;
    Ok(GapRun {
        latency: h,
        cpu_ns: cpu,
    })
}
