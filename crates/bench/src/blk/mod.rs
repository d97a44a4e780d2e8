//! `pvio bench blk`: the block datapath against fio on the same image file,
//! in one run.
//!
//! 1. **QD1 and QD32 4 KiB random reads**: fio (io_uring, O_DIRECT) on the
//!    image, then a guest reading it through blkfront, the ring and a
//!    tapdisk, with polling `off` (both ends block on event channels),
//!    `tapdisk3` (XenServer's rule in the backend: a 1000 µs sliding window,
//!    only when the host is more than 50 % idle; the frontend blocks, as
//!    Linux blkfront does) and `adaptive` (pvio's poller at both ends) —
//!    fio and the modes taking turns over `--rounds` rounds, so a drift in
//!    the disk's speed weighs on all alike. The tapdisk runs on CPU 0 and
//!    the guest on the others (`--placement split`): on Xen a guest's vCPU
//!    and dom0's are distinct, so every notification wakes another CPU.
//! 2. **Gap sweep** ([`gap`]): pickup latency and backend CPU per request
//!    for requests 1 µs to 5 ms apart, for `off`, a pure `spin`,
//!    `tapdisk3` and `adaptive`, in three interleaved rounds; and with
//!    Poisson arrivals of 200 µs to 5 ms mean (JSON `poisson_sweep`),
//!    where the next gap cannot be predicted and polling cannot pay.
//! 3. **Idle cost**: backend CPU over 5 s while a connected guest is idle
//!    after load.
//! 4. **Request splitting** (seed 004): random reads of S bytes
//!    outstanding, as one request or split into N in flight — fio with
//!    `bs=S/N, iodepth=N` as the baseline, and a guest issuing S-byte
//!    requests at queue depth 1 that tapdisk splits with `split-size=S/N`
//!    (and `auto`).
//!
//! `--json` prints one object; the sweeps are also drawn as SVG charts in
//! the output directory.

pub mod charts;
pub mod fio;
pub mod gap;

use std::borrow::Cow;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use pvio_poll::{AdaptiveConfig, HostLoad, PollPolicy, Tapdisk3Config};
use serde_json::json;

use crate::host::{make_image, xvd_devid, MiniHost};
use crate::procs::cpus;
use crate::report::{emit, ratio};
use charts::Series;

/// Options of `pvio bench blk`.
#[derive(clap::Args, Debug)]
#[command(about = "Block datapath vs fio: QD1/QD32 reads, gap sweep, idle cost, request splitting")]
pub struct Args {
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// A short run for tests (small image, short runs, fewer points).
    #[arg(long)]
    pub quick: bool,
    /// Image file to use (created with a pattern if missing); default: a
    /// scratch file.
    #[arg(long)]
    pub image: Option<PathBuf>,
    /// Size of a created image in MiB.
    #[arg(long, default_value_t = 1024)]
    pub size_mib: u64,
    /// Seconds per QD1/QD32 measurement.
    #[arg(long, default_value_t = 8.0)]
    pub runtime: f64,
    /// Directory for the JSON and the SVG charts.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Skip the request-splitting sweep.
    #[arg(long)]
    pub no_split: bool,
    /// Skip the gap sweep.
    #[arg(long)]
    pub no_gap: bool,
    /// Run only these parts (comma-separated: qd1, qd32, gap, idle, split).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Where the guest and its tapdisk run: `split` (the tapdisk on the
    /// first CPU, the guest on the others: a guest's vCPU and dom0's are
    /// distinct on Xen, so every notification wakes another CPU, as in the
    /// gap sweep) or `free` (the scheduler places both).
    #[arg(long, default_value = "split")]
    pub placement: Placement,
    /// pvio modes of the QD1/QD32 phase (comma-separated: off, tapdisk3,
    /// adaptive, spin, or BACKEND:FRONTEND for one policy at each end, such
    /// as `spin:off`); `adaptive` and `off` are needed for the ratios.
    #[arg(long, value_delimiter = ',', default_value = "off,tapdisk3,adaptive", value_parser = parse_mode)]
    pub modes: Vec<Mode>,
    /// Rounds of the QD1/QD32 phase: fio and every mode take turns this
    /// many times, `--runtime` divided among the rounds, so a drift of the
    /// disk's speed during the run weighs on all of them alike.
    #[arg(long)]
    pub rounds: Option<u32>,
}

/// Where the guest and its tapdisk run during the QD1/QD32, idle and split
/// phases (the gap sweep always splits them).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// tapdisk (dom0) on CPU 0, the guest on CPUs 1.. (one CPU: both on it).
    Split,
    /// No pinning.
    Free,
}

impl Placement {
    /// The `PVIO_CPUS` lists of the tapdisk and the guest.
    fn cpus(self) -> (Option<String>, Option<String>) {
        let n = cpus();
        match self {
            Placement::Split if n >= 2 => (Some("0".into()), Some(format!("1-{}", n - 1))),
            _ => (None, None),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Placement::Split => "split",
            Placement::Free => "free",
        }
    }
}

impl Args {
    fn wants(&self, part: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|p| p == part)
    }
}

/// A pvio polling mode of the QD1/QD32 phase: its name, the backend's
/// `pvio-polling` and the frontend's `--polling`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mode {
    name: std::borrow::Cow<'static, str>,
    backend: &'static str,
    frontend: &'static str,
}

/// The modes `--modes` may name: `off` (both ends block on event channels),
/// `tapdisk3` (XenServer's rule in the backend; the frontend blocks, as
/// Linux blkfront does), `adaptive` (pvio's poller at both ends) and
/// `spin` (both ends always poll: the latency floor, at a core each).
/// `BACKEND:FRONTEND` names any other pair of [`POLICIES`].
const MODES: [Mode; 4] = [
    Mode {
        name: Cow::Borrowed("off"),
        backend: "off",
        frontend: "off",
    },
    Mode {
        name: Cow::Borrowed("tapdisk3"),
        backend: "tapdisk3",
        frontend: "off",
    },
    Mode {
        name: Cow::Borrowed("adaptive"),
        backend: "adaptive",
        frontend: "adaptive",
    },
    Mode {
        name: Cow::Borrowed("spin"),
        backend: "spin",
        frontend: "spin",
    },
];

/// The polling policies either end takes.
const POLICIES: [&str; 4] = ["off", "tapdisk3", "adaptive", "spin"];

fn parse_mode(s: &str) -> Result<Mode, String> {
    if let Some(m) = MODES.iter().find(|m| m.name == s) {
        return Ok(m.clone());
    }
    let policy = |p: &str| POLICIES.iter().find(|&&q| q == p).copied();
    match s.split_once(':') {
        Some((b, f)) => match (policy(b), policy(f)) {
            (Some(backend), Some(frontend)) => Ok(Mode {
                name: Cow::Owned(s.to_string()),
                backend,
                frontend,
            }),
            _ => Err(format!(
                "unknown policy in mode {s:?} (BACKEND:FRONTEND, each off, tapdisk3, adaptive or spin)"
            )),
        },
        None => Err(format!(
            "unknown mode {s:?} (expected off, tapdisk3, adaptive, spin or BACKEND:FRONTEND)"
        )),
    }
}

struct Run<'a> {
    host: &'a MiniHost,
    image: PathBuf,
    verbose: bool,
    /// `PVIO_CPUS` of the tapdisks and of the guests.
    tapdisk_cpus: Option<String>,
    guest_cpus: Option<String>,
}

impl Run<'_> {
    fn say(&self, s: &str) {
        if self.verbose {
            eprintln!("bench blk: {s}");
        }
    }

    /// Starts a domain with one VBD on the image and its tapdisk; returns
    /// them ready for a guest.
    fn disk(
        &self,
        name: &str,
        backend_polling: &str,
        extra_keys: &[(&str, String)],
        tapdisk_args: &[&str],
    ) -> anyhow::Result<(
        pvio_hv::CreatedDomain,
        crate::host::Vbd,
        crate::procs::ChildGuard,
    )> {
        let d = self.host.create_domain(name, 96)?;
        let mut keys: Vec<(&str, String)> = vec![("pvio-polling", backend_polling.to_string())];
        if backend_polling == "tapdisk3" {
            keys.push(("polling-duration", "1000".into()));
            keys.push(("polling-idle-threshold", "50".into()));
        }
        keys.extend(extra_keys.iter().cloned());
        let vbd = self
            .host
            .add_vbd(d.domid, xvd_devid(0), &self.image, false, &keys)?;
        let mut cmd = self.host.tapdisk_command(&vbd, tapdisk_args)?;
        if let Some(c) = &self.tapdisk_cpus {
            cmd.env(pvio_xenops::affinity::CPUS_ENV, c);
        }
        let tap = crate::procs::ChildGuard(cmd.spawn().context("starting pvio tapdisk")?);
        self.host.wait_for_value(
            &format!("{}/state", vbd.backend),
            "2",
            Duration::from_secs(30),
        )?;
        Ok((d, vbd, tap))
    }

    /// The `pvio guest` command for `d`, placed.
    fn guest(&self, d: &pvio_hv::CreatedDomain) -> anyhow::Result<std::process::Command> {
        let mut c = self.host.guest_command(d)?;
        if let Some(cpus) = &self.guest_cpus {
            c.env(pvio_xenops::affinity::CPUS_ENV, cpus);
        }
        Ok(c)
    }

    /// Runs a guest job; returns its report.
    fn job(
        &self,
        d: &pvio_hv::CreatedDomain,
        job: &str,
        frontend_polling: &str,
    ) -> anyhow::Result<serde_json::Value> {
        let out = self
            .guest(d)?
            .args(["--job", job, "--json", "--polling", frontend_polling])
            .stdin(Stdio::null())
            .stderr(if std::env::var_os("PVIO_BENCH_DEBUG").is_some() {
                Stdio::inherit()
            } else {
                Stdio::piped()
            })
            .output()
            .context("running the guest")?;
        if !out.status.success() {
            bail!(
                "guest job {job:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            );
        }
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(text.lines().last().unwrap_or(""))
            .context("parsing the guest's report")
    }

    fn finish(&self, d: pvio_hv::CreatedDomain, mut tap: crate::procs::ChildGuard) {
        let _ = tap.0.kill();
        let _ = tap.0.wait();
        let _ = self.host.host.destroy_domain(d.domid);
    }
}

fn read_iops(report: &serde_json::Value) -> f64 {
    report["total"]["read"]["iops"].as_f64().unwrap_or(0.0)
}

fn read_mbs(report: &serde_json::Value) -> f64 {
    report["total"]["read"]["mb_per_s"].as_f64().unwrap_or(0.0)
}

/// CPU time (ns) of every thread of `pid`, from /proc/<pid>/task/*/schedstat.
fn process_cpu_ns(pid: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    dir.flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| {
            s.split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum()
}

/// Runs the benchmark.
pub fn run(args: Args) -> anyhow::Result<()> {
    let q = args.quick;
    let runtime = if q { 1.5 } else { args.runtime };
    let verbose = !args.json;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let host = MiniHost::start("blk")?;
    let image = match &args.image {
        Some(p) if p.exists() => p.clone(),
        Some(p) => make_image(
            p.parent().unwrap_or(&PathBuf::from(".")),
            &p.file_name().unwrap_or_default().to_string_lossy(),
            args.size_mib << 20,
        )?,
        None => {
            let mib = if q { 128 } else { args.size_mib };
            if verbose {
                eprintln!("bench blk: writing a {mib} MiB image");
            }
            make_image(&host.dir.0, "bench.img", mib << 20)?
        }
    };
    let (tapdisk_cpus, guest_cpus) = args.placement.cpus();
    let r = Run {
        host: &host,
        image: image.clone(),
        verbose,
        tapdisk_cpus,
        guest_cpus,
    };
    let load = HostLoad::start(Duration::from_secs(1));

    // 1. QD1 and QD32, fio and the modes taking turns.
    let rounds = args.rounds.unwrap_or(if q { 2 } else { 4 }).max(1);
    let turn = runtime / f64::from(rounds);
    let mut modes: Vec<Mode> = Vec::new();
    for m in &args.modes {
        if !modes.contains(m) {
            modes.push(m.clone());
        }
    }
    let mut qd = serde_json::Map::new();
    let mut text = String::new();
    for depth in [1u32, 32] {
        if !args.wants(&format!("qd{depth}")) {
            continue;
        }
        // IOPS per round, fio first, then each mode.
        let mut samples: Vec<Vec<f64>> = vec![Vec::new(); modes.len() + 1];
        for round in 1..=rounds {
            r.say(&format!(
                "QD{depth} round {round}/{rounds}: fio 4k randread, {turn:.1} s"
            ));
            samples[0].push(fio::randread(&image, 4096, depth, turn)?.iops);
            for (i, m) in modes.iter().enumerate() {
                r.say(&format!(
                    "QD{depth} round {round}/{rounds}: pvio {}, {turn:.1} s",
                    m.name
                ));
                let (d, _vbd, tap) = r.disk(
                    &format!("qd{depth}-{}-{round}", m.name.replace(':', "-")),
                    m.backend,
                    &[],
                    &[],
                )?;
                // size= caps the bytes moved: out of reach, so the run is
                // time-based like fio's --time_based.
                let job = format!(
                    "rw=randread,bs=4k,iodepth={depth},size=64t,runtime={}ms",
                    (turn * 1000.0) as u64
                );
                let rep = r.job(&d, &job, m.frontend)?;
                r.finish(d, tap);
                samples[i + 1].push(read_iops(&rep));
            }
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        let fio_iops = mean(&samples[0]);
        let mut row = serde_json::Map::new();
        row.insert("fio_iops".into(), json!(fio_iops.round()));
        let mut line = format!("QD{depth:<3} 4k randread   fio {fio_iops:>8.0}");
        let mut per_round = serde_json::Map::new();
        per_round.insert(
            "fio".into(),
            json!(samples[0].iter().map(|x| x.round()).collect::<Vec<_>>()),
        );
        for (i, m) in modes.iter().enumerate() {
            let iops = mean(&samples[i + 1]);
            row.insert(format!("{}_iops", m.name), json!(iops.round()));
            per_round.insert(
                m.name.to_string(),
                json!(samples[i + 1].iter().map(|x| x.round()).collect::<Vec<_>>()),
            );
            line.push_str(&format!("   {} {iops:>8.0}", m.name));
        }
        if let Some(ad) = row.get("adaptive_iops").and_then(|v| v.as_f64()) {
            row.insert("adaptive_vs_fio".into(), json!(ratio(ad, fio_iops)));
            if let Some(off) = row.get("off_iops").and_then(|v| v.as_f64()) {
                row.insert("adaptive_vs_off".into(), json!(ratio(ad, off)));
            }
            line.push_str(&format!(
                "   (adaptive/fio {:.2}, adaptive/off {:.2})",
                row["adaptive_vs_fio"].as_f64().unwrap_or(0.0),
                row.get("adaptive_vs_off")
                    .and_then(|v| v.as_f64())
                    .unwrap_or(0.0)
            ));
        }
        row.insert("rounds".into(), serde_json::Value::Object(per_round));
        text.push_str(&line);
        text.push('\n');
        qd.insert(format!("qd{depth}_4k"), serde_json::Value::Object(row));
    }

    // 2. Gap sweep.
    let mut gap_points = Vec::new();
    if !args.no_gap && args.wants("gap") {
        let wake = pvio_poll::calibrate::wake_cost_ns(40)
            .unwrap_or(30_000)
            .clamp(2_000, 200_000);
        let policies = [
            PollPolicy::Off,
            PollPolicy::Spin,
            PollPolicy::Tapdisk3(Tapdisk3Config::default()),
            PollPolicy::Adaptive(AdaptiveConfig {
                wake_cost_ns: wake,
                ..AdaptiveConfig::default()
            }),
        ];
        let gaps: &[u64] = if q {
            &[1, 50, 1000, 5000]
        } else {
            &[1, 10, 50, 200, 1000, 5000]
        };
        // Seconds of requests per point, and rounds: every policy takes a
        // turn at a gap before any takes its second, so a change in how
        // fast this VM's CPUs see each other's writes (0.2 µs or 0.6 µs,
        // it moves now and then) weighs on all policies alike.
        let (budget, rounds) = if q { (0.25, 1) } else { (2.0, 3) };
        // Fixed gaps, then Poisson arrivals of a few means: there the next
        // gap cannot be predicted and polling cannot pay.
        let poisson: &[u64] = if q { &[1000] } else { &[200, 1000, 5000] };
        let points = gaps
            .iter()
            .map(|&g| (g, gap::Arrivals::Fixed))
            .chain(poisson.iter().map(|&g| (g, gap::Arrivals::Poisson)));
        for (g, arrivals) in points {
            let count = ((budget * 1e6 / (g as f64 + 60.0)) as u64).clamp(60, 20_000);
            let per_round = count.div_ceil(rounds).max(40);
            let mut runs: Vec<Vec<gap::GapRun>> = policies.iter().map(|_| Vec::new()).collect();
            for round in 1..=rounds {
                for (i, p) in policies.iter().enumerate() {
                    r.say(&format!(
                        "gap sweep: {g} µs {arrivals:?}, {}, round {round}/{rounds}, {per_round} requests",
                        p.name()
                    ));
                    runs[i].push(gap::run(
                        &host.hvd_socket,
                        *p,
                        &load,
                        (g, arrivals),
                        per_round,
                        cpus() >= 2,
                    )?);
                }
            }
            for (p, runs) in policies.iter().zip(&runs) {
                gap_points.push(gap::GapPoint::from_runs(g, arrivals, p.name(), runs)?);
            }
        }
        text.push_str(&format!(
            "\ngap sweep (wake-up cost measured {:.1} µs): pickup latency p50 µs / backend CPU µs per request\n",
            wake as f64 / 1000.0
        ));
        text.push_str(
            "   gap µs        off              spin            tapdisk3         adaptive\n",
        );
        let rows = gaps
            .iter()
            .map(|&g| (g, gap::Arrivals::Fixed))
            .chain(poisson.iter().map(|&g| (g, gap::Arrivals::Poisson)));
        for (g, arrivals) in rows {
            match arrivals {
                gap::Arrivals::Fixed => text.push_str(&format!("{g:>8}")),
                gap::Arrivals::Poisson => text.push_str(&format!("{:>8}", format!("~{g}"))),
            }
            for m in ["off", "spin", "tapdisk3", "adaptive"] {
                if let Some(p) = gap_points
                    .iter()
                    .find(|p| p.gap_us == g && p.arrivals == arrivals && p.mode == m)
                {
                    text.push_str(&format!(
                        "  {:>7.2} / {:>6.1}",
                        p.latency_us_p50, p.cpu_us_per_req
                    ));
                }
            }
            text.push('\n');
        }
        text.push_str("   (~N: Poisson arrivals, exponential gaps of mean N µs)\n");
        let series = |f: fn(&gap::GapPoint) -> f64| -> Vec<Series> {
            ["off", "spin", "tapdisk3", "adaptive"]
                .iter()
                .map(|m| Series {
                    name: m.to_string(),
                    points: gap_points
                        .iter()
                        .filter(|p| p.mode == *m && p.arrivals == gap::Arrivals::Fixed)
                        .map(|p| (p.gap_us as f64, f(p)))
                        .collect(),
                })
                .collect()
        };
        charts::log_log(
            &args.out.join("blk-gap-latency.svg"),
            "Pickup latency (p50) vs request gap",
            "gap between requests (µs)",
            "pickup latency p50 (µs)",
            &series(|p| p.latency_us_p50),
        )?;
        charts::log_log(
            &args.out.join("blk-gap-cpu.svg"),
            "Backend CPU per request vs request gap",
            "gap between requests (µs)",
            "backend CPU per request (µs)",
            &series(|p| p.cpu_us_per_req),
        )?;
    }

    // 3. Idle cost after load.
    let mut idle_pct = -1.0;
    if args.wants("idle") {
        r.say("idle backend CPU: 5 s of an idle, connected guest after load");
        let (d, _vbd, tap) = r.disk("idle", "adaptive", &[], &[])?;
        let mut guest = r
            .guest(&d)?
            .args([
                "--job",
                "rw=randread,bs=4k,iodepth=1,runtime=1s",
                "--json",
                "--linger",
                "8",
            ])
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()?;
        {
            use std::io::BufRead;
            let mut lines =
                std::io::BufReader::new(guest.stdout.take().context("guest stdout")?).lines();
            lines.next().context("the guest printed no report")??;
        }
        std::thread::sleep(Duration::from_millis(500));
        let pid = tap.0.id();
        let (c0, t0) = (process_cpu_ns(pid), Instant::now());
        std::thread::sleep(Duration::from_secs(5));
        let (c1, t1) = (process_cpu_ns(pid), Instant::now());
        idle_pct = 100.0 * (c1 - c0) as f64 / (t1 - t0).as_nanos() as f64;
        let _ = guest.wait();
        r.finish(d, tap);
        text.push_str(&format!(
            "\nidle backend CPU after load: {idle_pct:.3} % of one CPU\n"
        ));
    }

    // 4. Request splitting.
    let mut split_rows = Vec::new();
    if !args.no_split && args.wants("split") {
        let sizes: &[u64] = if q {
            &[64 << 10, 512 << 10]
        } else {
            &[16 << 10, 64 << 10, 256 << 10, 512 << 10, 1 << 20, 4 << 20]
        };
        let parts: &[u64] = if q { &[1, 8] } else { &[1, 2, 8, 64] };
        let rt = if q { 1.0 } else { (runtime / 2.0).max(2.0) };
        for &s in sizes {
            for &n in parts {
                if s / n < 4096 {
                    continue;
                }
                let bs = s / n;
                r.say(&format!(
                    "split sweep: {} KiB outstanding as {n} x {} KiB",
                    s >> 10,
                    bs >> 10
                ));
                let f = fio::randread(&image, bs, n as u32, rt)?;
                let split = if n == 1 {
                    "off".to_string()
                } else {
                    format!("{}k", bs >> 10)
                };
                let segs = (s / 4096).clamp(256, 4096).to_string();
                let (d, _vbd, tap) = r.disk(
                    &format!("split-{s}-{n}"),
                    "adaptive",
                    &[("pvio-split-size", split.clone())],
                    &["--max-indirect-segments", &segs],
                )?;
                let rep = r.job(
                    &d,
                    &format!(
                        "rw=randread,bs={s},iodepth=1,size=64t,runtime={}ms",
                        (rt * 1000.0) as u64
                    ),
                    "adaptive",
                )?;
                r.finish(d, tap);
                split_rows.push(json!({
                    "outstanding_kib": s >> 10, "parts": n, "part_kib": bs >> 10,
                    "fio_mb_per_s": (f.mb_per_s * 10.0).round() / 10.0,
                    "pvio_mb_per_s": (read_mbs(&rep) * 10.0).round() / 10.0,
                }));
            }
            r.say(&format!(
                "split sweep: {} KiB outstanding, split-size auto",
                s >> 10
            ));
            let segs = (s / 4096).clamp(256, 4096).to_string();
            let (d, _vbd, tap) = r.disk(
                &format!("split-{s}-auto"),
                "adaptive",
                &[("pvio-split-size", "auto".into())],
                &["--max-indirect-segments", &segs],
            )?;
            let rep = r.job(
                &d,
                &format!(
                    "rw=randread,bs={s},iodepth=1,size=64t,runtime={}ms",
                    (rt * 2000.0) as u64
                ),
                "adaptive",
            )?;
            r.finish(d, tap);
            split_rows.push(json!({
                "outstanding_kib": s >> 10, "parts": "auto",
                "pvio_mb_per_s": (read_mbs(&rep) * 10.0).round() / 10.0,
            }));
        }
        text.push_str("\nrequest splitting: MB/s, fio (bs = S/N, iodepth = N) vs pvio (S-byte requests at QD1, split-size S/N)\n");
        for row in &split_rows {
            text.push_str(&format!(
                "  S = {:>5} KiB  N = {:>4}   fio {:>8}   pvio {:>8}\n",
                row["outstanding_kib"], row["parts"], row["fio_mb_per_s"], row["pvio_mb_per_s"]
            ));
        }
        let mut series = Vec::new();
        for &n in parts {
            for (who, key) in [("fio", "fio_mb_per_s"), ("pvio", "pvio_mb_per_s")] {
                series.push(Series {
                    name: format!("{who}, {n} in flight"),
                    points: split_rows
                        .iter()
                        .filter(|r| r["parts"] == json!(n))
                        .map(|r| {
                            (
                                r["outstanding_kib"].as_f64().unwrap_or(0.0),
                                r[key].as_f64().unwrap_or(0.0),
                            )
                        })
                        .collect(),
                });
            }
        }
        series.push(Series {
            name: "pvio, split-size auto".into(),
            points: split_rows
                .iter()
                .filter(|r| r["parts"] == json!("auto"))
                .map(|r| {
                    (
                        r["outstanding_kib"].as_f64().unwrap_or(0.0),
                        r["pvio_mb_per_s"].as_f64().unwrap_or(0.0),
                    )
                })
                .collect(),
        });
        charts::log_log(
            &args.out.join("blk-split.svg"),
            "Random-read throughput vs outstanding data, split into N requests",
            "outstanding data (KiB)",
            "MB/s",
            &series,
        )?;
    }

    let mut out = qd;
    // The sweep of the issue (fixed gaps) and, apart, Poisson arrivals.
    let (fixed, poisson): (Vec<_>, Vec<_>) = gap_points
        .into_iter()
        .partition(|p| p.arrivals == gap::Arrivals::Fixed);
    out.insert("gap_sweep".into(), serde_json::to_value(&fixed)?);
    out.insert("poisson_sweep".into(), serde_json::to_value(&poisson)?);
    out.insert(
        "idle_backend_cpu_pct".into(),
        json!((idle_pct * 1000.0).round() / 1000.0),
    );
    out.insert("split_sweep".into(), json!(split_rows));
    out.insert("runtime_s".into(), json!(runtime));
    out.insert("image".into(), json!(image.display().to_string()));
    out.insert("cpus".into(), json!(cpus()));
    out.insert("placement".into(), json!(args.placement.name()));
    let value = serde_json::Value::Object(out);
    std::fs::write(
        args.out.join("blk.json"),
        serde_json::to_string_pretty(&value)?,
    )?;
    text.push_str(&format!(
        "\n(JSON and SVG charts in {})\n",
        args.out.display()
    ));
    emit(args.json, &value, &text);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_name_both_ends_or_a_pair() {
        let a = parse_mode("adaptive").unwrap();
        assert_eq!((a.backend, a.frontend), ("adaptive", "adaptive"));
        let t = parse_mode("tapdisk3").unwrap();
        assert_eq!((t.backend, t.frontend), ("tapdisk3", "off"));
        let p = parse_mode("spin:off").unwrap();
        assert_eq!(
            (p.name.as_ref(), p.backend, p.frontend),
            ("spin:off", "spin", "off")
        );
        for bad in ["", "fast", "spin:", ":off", "spin:fast", "a:b:c"] {
            assert!(parse_mode(bad).is_err(), "{bad:?} accepted");
        }
    }
}
