//! `pvio bench plug`: VM start time against the number of VBDs, when every
//! VDI attach (and detach) takes `attach-delay-ms` (slow storage), with
//! the VBDs plugged one at a time (xenopsd before parallel plug) and in
//! parallel (a worker pool of 16, at most 10 per VM). The XenServer 7.0
//! result: start time no longer grows with the number of disks.

use std::time::{Duration, Instant};

use anyhow::Context;
use pvio_xenops::{VmSpec, Workload, Xenops};
use serde_json::json;

use crate::report::emit;
use crate::vmhost::VmHost;

/// Options of `pvio bench plug`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// VBD counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,64,255")]
    pub vbds: Vec<usize>,
    /// What each VDI attach and detach costs (the SR's attach-delay-ms).
    #[arg(long, default_value_t = 100)]
    pub attach_delay_ms: u64,
    /// The parallel engine's host-wide worker pool.
    #[arg(long, default_value_t = 16)]
    pub worker_pool_size: usize,
    /// The parallel engine's limit per VM.
    #[arg(long, default_value_t = 10)]
    pub max_parallel_per_vm: usize,
    /// Skip the sequential runs above this many VBDs (they take
    /// 2 × N × the delay); 0 measures all.
    #[arg(long, default_value_t = 0)]
    pub sequential_max: usize,
}

/// One measurement.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Point {
    pub vbds: usize,
    pub sequential_s: Option<f64>,
    pub parallel_s: f64,
    pub sequential_shutdown_s: Option<f64>,
    pub parallel_shutdown_s: f64,
}

/// Starts and shuts down one VM of `vbds` disks; returns both times.
fn cycle(
    host: &VmHost,
    engine: &Xenops,
    images: &[std::path::PathBuf],
    vbds: usize,
    delay: Duration,
    tag: &str,
) -> anyhow::Result<(f64, f64)> {
    let spec = VmSpec {
        uuid: format!("00000000-0000-4000-8000-{:06}{:06}", vbds, tag.len()),
        name: format!("plug-{tag}-{vbds}"),
        memory_mib: 64,
        vcpus: 1,
        vbds: VmHost::vbds(&images[..vbds], delay),
        workload: Workload::Idle,
    };
    let t0 = Instant::now();
    host.rt
        .block_on(engine.start_vm(spec.clone()))
        .with_context(|| format!("starting a VM of {vbds} VBDs ({tag})"))?;
    let start = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    host.rt
        .block_on(engine.shutdown_vm(&spec.uuid, false))
        .with_context(|| format!("shutting down a VM of {vbds} VBDs ({tag})"))?;
    Ok((start, t1.elapsed().as_secs_f64()))
}

/// Runs the benchmark.
pub fn run(a: Args) -> anyhow::Result<()> {
    let host = VmHost::start("plug")?;
    let max = a.vbds.iter().copied().max().unwrap_or(1);
    if max > pvio_xenops::vm::MAX_VBDS {
        anyhow::bail!("a VM has at most {} VBDs", pvio_xenops::vm::MAX_VBDS);
    }
    let images = host.images("vdi", max, 1)?;
    let delay = Duration::from_millis(a.attach_delay_ms);
    let (sequential, _e1) = host.engine(1, 1)?;
    let (parallel, _e2) = host.engine(a.worker_pool_size, a.max_parallel_per_vm)?;
    // Warm up: the first start calibrates the host and loads the binary.
    cycle(&host, &parallel, &images, 1, Duration::ZERO, "warm")?;
    let mut points = Vec::new();
    for &n in &a.vbds {
        let seq = if a.sequential_max == 0 || n <= a.sequential_max {
            Some(cycle(&host, &sequential, &images, n, delay, "seq")?)
        } else {
            None
        };
        let par = cycle(&host, &parallel, &images, n, delay, "par")?;
        let p = Point {
            vbds: n,
            sequential_s: seq.map(|s| s.0),
            parallel_s: par.0,
            sequential_shutdown_s: seq.map(|s| s.1),
            parallel_shutdown_s: par.1,
        };
        if !a.json {
            eprintln!(
                "{n:>4} VBDs: start sequential {} parallel {:.2} s; shutdown sequential {} parallel {:.2} s",
                p.sequential_s.map_or("-".into(), |s| format!("{s:.2}")),
                p.parallel_s,
                p.sequential_shutdown_s.map_or("-".into(), |s| format!("{s:.2}")),
                p.parallel_shutdown_s
            );
        }
        points.push(p);
    }
    let one = points.iter().find(|p| p.vbds == 1).map(|p| p.parallel_s);
    let rel = |n: usize| -> Option<f64> {
        let base = one?;
        let p = points.iter().find(|p| p.vbds == n)?;
        Some((p.parallel_s / base * 100.0).round() / 100.0)
    };
    let value = json!({
        "bench": "plug",
        "attach_delay_ms": a.attach_delay_ms,
        "worker_pool_size": a.worker_pool_size,
        "max_parallel_per_vm": a.max_parallel_per_vm,
        "results": points,
        "parallel_10_over_1": rel(10).or_else(|| rel(8)),
        "parallel_255_over_1": rel(255),
    });
    let mut text = format!(
        "VM start time against VBDs (attach/detach {} ms each; parallel: pool {}, {} per VM)\n\
         {:>5} {:>14} {:>12} {:>10} {:>17} {:>15}\n",
        a.attach_delay_ms,
        a.worker_pool_size,
        a.max_parallel_per_vm,
        "vbds",
        "sequential s",
        "parallel s",
        "speed-up",
        "seq. shutdown s",
        "par. shutdown s"
    );
    for p in &points {
        text += &format!(
            "{:>5} {:>14} {:>12.2} {:>10} {:>17} {:>15.2}\n",
            p.vbds,
            p.sequential_s.map_or("-".into(), |s| format!("{s:.2}")),
            p.parallel_s,
            p.sequential_s
                .map_or("-".into(), |s| format!("{:.1}x", s / p.parallel_s)),
            p.sequential_shutdown_s
                .map_or("-".into(), |s| format!("{s:.2}")),
            p.parallel_shutdown_s
        );
    }
    if let Some(base) = one {
        for p in &points {
            if p.vbds > 1 {
                text += &format!(
                    "parallel start of {} VBDs = {:.2} x the 1-VBD start\n",
                    p.vbds,
                    p.parallel_s / base
                );
            }
        }
    }
    emit(a.json, &value, &text);
    Ok(())
}
