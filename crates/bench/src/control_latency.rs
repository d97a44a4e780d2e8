//! `pvio bench control-latency`: how long `vm-list` takes while guests
//! saturate the datapath on every CPU, with the control slice (the control
//! daemons in `pvio-control`, 10× the CPU share of `pvio-datapath`) and
//! without it (`host up --no-control-slice`: every process competes on
//! equal terms), next to the same call on an idle host.
//!
//! Each sample is what `xe vm-list` does on the wire: a new connection to
//! toolstackd and one `VM.get_all_records`. A second series runs the
//! `pvio vm-list` command itself (process start included), as a user would.
//! With the slice, the client runs in the control slice, as an
//! administrator's ssh session does on XenServer (sshd is one of the
//! services its control.slice holds); without it, the client competes with
//! everything else like every other process.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::hostproc::HostProc;
use crate::report::{emit, latency_histogram};

/// Options of `pvio bench control-latency`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// `vm-list` calls per series.
    #[arg(long, default_value_t = 400)]
    pub samples: usize,
    /// Pause between calls, in ms.
    #[arg(long, default_value_t = 10)]
    pub interval_ms: u64,
    /// `pvio vm-list` command runs per series.
    #[arg(long, default_value_t = 60)]
    pub cli_samples: usize,
    /// Loaded VMs (default: 2 per CPU).
    #[arg(long)]
    pub vms: Option<usize>,
    /// The job each loaded VM runs (it is stopped when the VM shuts down).
    #[arg(
        long,
        default_value = "rw=randread,bs=4k,iodepth=32,runtime=3600s,size=64t"
    )]
    pub job: String,
}

/// Latency figures of one series, in ms.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Series {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub samples: usize,
}

fn series(
    samples: usize,
    interval: Duration,
    mut call: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Series> {
    let mut h = latency_histogram();
    for _ in 0..samples {
        let t0 = Instant::now();
        call()?;
        h.record(t0.elapsed().as_nanos().max(1) as u64)?;
        std::thread::sleep(interval);
    }
    let ms = |ns: u64| (ns as f64 / 1e4).round() / 100.0;
    Ok(Series {
        p50_ms: ms(h.value_at_quantile(0.5)),
        p99_ms: ms(h.value_at_quantile(0.99)),
        max_ms: ms(h.max()),
        samples,
    })
}

/// `VM.get_all_records` on a fresh connection.
fn rpc_vm_list(host: &HostProc) -> anyhow::Result<()> {
    let mut c = host.rpc()?;
    let v = c.call("VM.get_all_records", Value::Null)?;
    if !v.is_array() && !v.is_object() {
        bail!("VM.get_all_records answered {v}");
    }
    Ok(())
}

fn cli_vm_list(host: &HostProc) -> anyhow::Result<()> {
    let st = host
        .xe_command(&["vm-list", "--minimal"])?
        .stdout(std::process::Stdio::null())
        .status()?;
    if !st.success() {
        bail!("pvio vm-list failed: {st}");
    }
    Ok(())
}

/// The first line of /proc/stat.
fn cpu_times() -> anyhow::Result<pvio_poll::load::CpuTimes> {
    let s = std::fs::read_to_string("/proc/stat")?;
    pvio_poll::load::parse_proc_stat(&s).context("no cpu line in /proc/stat")
}

/// Creates `n` VMs with one disk each running `job`, starts them and
/// waits until every job runs.
fn load(host: &HostProc, n: usize, job: &str) -> anyhow::Result<Vec<String>> {
    let sr = host.xe(&["sr-create", "name-label=bench", "type=file"])?;
    let mut vms = Vec::new();
    for i in 0..n {
        let vm = host.xe(&[
            "vm-create",
            &format!("name-label=load-{i}"),
            &format!("workload=job:{job}"),
        ])?;
        let vdi = host.xe(&[
            "vdi-create",
            &format!("sr-uuid={sr}"),
            &format!("name-label=load-{i}"),
            "virtual-size=256MiB",
        ])?;
        host.xe(&[
            "vbd-create",
            &format!("vm-uuid={vm}"),
            &format!("vdi-uuid={vdi}"),
            "device=0",
        ])?;
        vms.push(vm);
    }
    for vm in &vms {
        host.xe(&["vm-start", &format!("uuid={vm}")])?;
    }
    let end = Instant::now() + Duration::from_secs(60);
    for vm in &vms {
        loop {
            let st = host
                .xe(&[
                    "vm-param-get",
                    &format!("uuid={vm}"),
                    "param-name=guest-metrics",
                    "param-key=workload/state",
                ])
                .unwrap_or_default();
            if st == "running" {
                break;
            }
            if Instant::now() > end {
                bail!("the job of VM {vm} did not start (state {st:?})");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(vms)
}

/// Moves this process into the control slice (its cgroup and its CPUs)
/// for as long as it lives, then back to where it was.
struct JoinedGroup {
    back: std::path::PathBuf,
}

impl JoinedGroup {
    /// Joins the control slice if cgroups are usable; `None` (and a note)
    /// where they are not.
    fn control_slice(quiet: bool) -> Option<JoinedGroup> {
        use pvio_xenops::cgroup::{cpu_cgroup_of, Hierarchy, CONTROL_GROUP};
        let h = Hierarchy::detect()?;
        let me = std::process::id();
        let here = cpu_cgroup_of(me).ok()?;
        let back = h.root().join(here.trim_start_matches('/'));
        let target = h.root().join(CONTROL_GROUP);
        match std::fs::write(target.join("cgroup.procs"), me.to_string()) {
            Ok(()) => {
                // On the slice's CPUs too, as `host up` puts its daemons.
                let n = std::thread::available_parallelism().map_or(1, |n| n.get());
                let _ = pvio_xenops::affinity::pin(Some(&pvio_xenops::affinity::control_cpus(n)));
                Some(JoinedGroup { back })
            }
            Err(e) => {
                if !quiet {
                    eprintln!("cannot join {}: {e}", target.display());
                }
                None
            }
        }
    }
}

impl Drop for JoinedGroup {
    fn drop(&mut self) {
        let _ = pvio_xenops::affinity::pin(None);
        let _ = std::fs::write(
            self.back.join("cgroup.procs"),
            std::process::id().to_string(),
        );
    }
}

/// One host, loaded: the two series and the CPU load they ran under.
fn loaded(
    tag: &str,
    extra: &[&str],
    a: &Args,
    vms: usize,
) -> anyhow::Result<(Series, Series, f64, Option<Series>)> {
    let host = HostProc::start(tag, extra)?;
    let interval = Duration::from_millis(a.interval_ms);
    // The idle figure comes from the host with the slice, before the load.
    let idle = if extra.is_empty() {
        Some(series(a.samples, interval, || rpc_vm_list(&host))?)
    } else {
        None
    };
    load(&host, vms, &a.job)?;
    // Let the load settle.
    std::thread::sleep(Duration::from_secs(1));
    let joined = if extra.is_empty() {
        JoinedGroup::control_slice(a.json)
    } else {
        None
    };
    let c0 = cpu_times()?;
    let rpc = series(a.samples, interval, || rpc_vm_list(&host))?;
    let cli = series(a.cli_samples, interval, || cli_vm_list(&host))?;
    let c1 = cpu_times()?;
    drop(joined);
    let busy = (1000.0 - f64::from(pvio_poll::load::idle_between(c0, c1)) * 10.0).round() / 10.0;
    drop(host);
    Ok((rpc, cli, busy, idle))
}

/// Runs the benchmark.
pub fn run(a: Args) -> anyhow::Result<()> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let vms = a.vms.unwrap_or(2 * cpus);
    if !a.json {
        eprintln!("with the control slice: {vms} VMs running `{}`", a.job);
    }
    let (with_rpc, with_cli, with_busy, idle) = loaded("ctl-slice", &[], &a, vms)?;
    if !a.json {
        eprintln!("without the control slice");
    }
    let (without_rpc, without_cli, without_busy, _) =
        loaded("ctl-noslice", &["--no-control-slice"], &a, vms)?;
    let idle = idle.context("no idle series")?;
    let value = json!({
        "bench": "control-latency",
        "vms": vms,
        "job": a.job,
        "idle_p99_ms": idle.p99_ms,
        "with_slice_p99_ms": with_rpc.p99_ms,
        "without_slice_p99_ms": without_rpc.p99_ms,
        "idle": idle,
        "with_slice": with_rpc,
        "without_slice": without_rpc,
        "with_slice_cli": with_cli,
        "without_slice_cli": without_cli,
        "with_slice_cpu_busy_pct": with_busy,
        "without_slice_cpu_busy_pct": without_busy,
    });
    let row = |name: &str, s: &Series, busy: Option<f64>| {
        format!(
            "{name:<34} {:>9.2} {:>9.2} {:>9.2} {:>8}\n",
            s.p50_ms,
            s.p99_ms,
            s.max_ms,
            busy.map_or("-".into(), |b| format!("{b:.0}%"))
        )
    };
    let mut text = format!(
        "vm-list round trips ({} calls each; {vms} VMs saturating the datapath)\n{:<34} {:>9} {:>9} {:>9} {:>8}\n",
        a.samples, "", "p50 ms", "p99 ms", "max ms", "CPU busy"
    );
    text += &row("idle host (RPC)", &idle, None);
    text += &row("loaded, control slice (RPC)", &with_rpc, Some(with_busy));
    text += &row("loaded, no slice (RPC)", &without_rpc, Some(without_busy));
    text += &row(
        "loaded, control slice (pvio vm-list)",
        &with_cli,
        Some(with_busy),
    );
    text += &row(
        "loaded, no slice (pvio vm-list)",
        &without_cli,
        Some(without_busy),
    );
    emit(a.json, &value, &text);
    Ok(())
}
