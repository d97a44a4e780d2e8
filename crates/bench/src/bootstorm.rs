//! `pvio bench bootstorm`: start many VMs a batch at a time (125, 25 at a
//! time, as XenServer's bootstorm); each "boots" by reading the first
//! `--boot-mib` MiB of its own disk through its tapdisk and then reports
//! `data/ready = 1` in the xenstore. By default a boot reads the way a
//! bootloader and an early kernel do, one small dependent read after the
//! other (4 KiB, one in flight): a boot then lasts long against the cost of
//! starting a VM, as a real one does, and the VMs of a batch share the
//! host while they boot. Measures the time from the first start
//! to the n-th ready VM and each VM's boot time (its start request to its
//! ready). The XenServer result to reproduce: every VM takes the same time
//! to become ready, and the total grows linearly with the number of VMs.
//!
//! The baseline is the same host's single-VM boot, measured first: a
//! bootstorm is good when a VM in the storm boots about as fast as alone.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use pvio_xenops::{BootRead, VmSpec, Workload, Xenops};
use serde_json::json;

use crate::report::emit;
use crate::vmhost::VmHost;

/// Options of `pvio bench bootstorm`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// VMs in the storm.
    #[arg(long, default_value_t = 125)]
    pub vms: usize,
    /// VMs started at once; the next batch starts when all are ready.
    #[arg(long, default_value_t = 25)]
    pub batch: usize,
    /// MiB each VM reads from its disk to boot.
    #[arg(long, default_value_t = 32)]
    pub boot_mib: u32,
    /// Request size of the boot read in bytes.
    #[arg(long, default_value_t = 4096)]
    pub boot_bs: u32,
    /// Requests the boot read keeps in flight.
    #[arg(long, default_value_t = 1)]
    pub boot_depth: u32,
    /// Memory of each VM in MiB (its boot-read buffers come from it).
    #[arg(long, default_value_t = 64)]
    pub memory_mib: u32,
    /// How long a VM may take to become ready.
    #[arg(long, default_value_t = 300)]
    pub timeout_s: u64,
    /// Leave the VMs' processes wherever the scheduler puts them (for
    /// comparison; see `pvio host up --no-vm-placement`).
    #[arg(long)]
    pub no_vm_placement: bool,
}

/// One VM's boot.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Boot {
    pub vm: usize,
    /// Since the storm began, when its start was requested.
    pub requested_s: f64,
    /// Since the storm began, when the toolstack had it running (disks
    /// connected, guest started).
    pub started_s: f64,
    /// Since the storm began, when it reported ready.
    pub ready_s: f64,
    /// `ready_s - requested_s`.
    pub boot_s: f64,
}

fn spec(i: usize, image: &std::path::Path, a: &Args) -> VmSpec {
    VmSpec {
        uuid: format!("b0075708-0000-4000-8000-{i:012}"),
        name: format!("storm-{i}"),
        memory_mib: a.memory_mib,
        vcpus: 1,
        vbds: VmHost::vbds(&[image.to_path_buf()], Duration::ZERO),
        workload: Workload::BootRead(BootRead {
            mib: a.boot_mib,
            bs: a.boot_bs,
            depth: a.boot_depth,
        }),
    }
}

/// Starts one VM and waits for it to report ready; returns the boot time.
async fn boot(
    xenops: &Xenops,
    xs: &pvio_xenstore::Client,
    spec: VmSpec,
    timeout: Duration,
) -> anyhow::Result<(Instant, Instant, Instant)> {
    let t0 = Instant::now();
    let vm = xenops
        .start_vm(spec.clone())
        .await
        .with_context(|| format!("starting {}", spec.name))?;
    let started = Instant::now();
    let key = format!("/local/domain/{}/data/ready", vm.domid);
    let mut w = xs.watch(&key).await?;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if xs.try_read(&key).await?.as_deref() == Some(b"1".as_slice()) {
            return Ok((t0, started, Instant::now()));
        }
        let ev = tokio::time::timeout_at(deadline, w.next()).await;
        match ev {
            Ok(Some(_)) => {}
            Ok(None) => bail!("lost the xenstore connection"),
            Err(_) => bail!("{} was not ready within {timeout:?}", spec.name),
        }
    }
}

/// Least-squares fit of `y = a + b x`; returns (b, r²).
fn linear_fit(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    if n < 2.0 {
        return (0.0, 1.0);
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let syy: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
    if sxx == 0.0 || syy == 0.0 {
        return (0.0, 1.0);
    }
    let b = sxy / sxx;
    (b, (sxy * sxy) / (sxx * syy))
}

/// Runs the benchmark.
pub fn run(a: Args) -> anyhow::Result<()> {
    if a.vms == 0 || a.batch == 0 {
        bail!("--vms and --batch must be positive");
    }
    let mut host = VmHost::start("bootstorm")?;
    host.placement = !a.no_vm_placement;
    // One disk per VM: a base image copied (copy_file_range) per VM.
    let base = host.images("base", 1, u64::from(a.boot_mib))?.remove(0);
    eprintln!("creating {} disks of {} MiB", a.vms + 1, a.boot_mib);
    let mut images = Vec::with_capacity(a.vms + 1);
    for i in 0..=a.vms {
        let p = host.mini.dir.0.join(format!("vm-{i}.img"));
        std::fs::copy(&base, &p).with_context(|| format!("creating {}", p.display()))?;
        // On the device, not dirty in the page cache: a direct read of a
        // dirty range would first wait for its writeback.
        std::fs::File::open(&p)?.sync_all()?;
        images.push(p);
    }
    let (xenops, _events) = host.engine(16, 10)?;
    let timeout = Duration::from_secs(a.timeout_s);
    let xs = host
        .rt
        .block_on(pvio_xenstore::Client::connect(&host.mini.xs_socket))?;

    // Baseline: one VM booting alone (after a warm-up start).
    let alone = host.rt.block_on(async {
        let warm = spec(a.vms, &images[a.vms], &a);
        boot(&xenops, &xs, warm.clone(), timeout).await?;
        xenops.shutdown_vm(&warm.uuid, false).await?;
        let mut s = spec(a.vms, &images[a.vms], &a);
        s.uuid = format!("b0075708-0000-4000-8000-a1{:010}", a.vms);
        let (t0, _, t1) = boot(&xenops, &xs, s.clone(), timeout).await?;
        xenops.shutdown_vm(&s.uuid, false).await?;
        anyhow::Ok((t1 - t0).as_secs_f64())
    })?;
    eprintln!("one VM alone boots in {alone:.3} s; now the storm");

    let begin = Instant::now();
    let mut boots = Vec::with_capacity(a.vms);
    let mut batch_s = Vec::new();
    for first in (0..a.vms).step_by(a.batch) {
        let ids: Vec<usize> = (first..(first + a.batch).min(a.vms)).collect();
        let tb = Instant::now();
        let results = host.rt.block_on(async {
            let mut set = tokio::task::JoinSet::new();
            for &i in &ids {
                let (x, c, s) = (xenops.clone(), xs.clone(), spec(i, &images[i], &a));
                set.spawn(async move { (i, boot(&x, &c, s, timeout).await) });
            }
            let mut out = Vec::new();
            while let Some(r) = set.join_next().await {
                out.push(r?);
            }
            anyhow::Ok(out)
        })?;
        for (i, r) in results {
            let (t0, started, t1) = r?;
            boots.push(Boot {
                vm: i,
                requested_s: (t0 - begin).as_secs_f64(),
                started_s: (started - begin).as_secs_f64(),
                ready_s: (t1 - begin).as_secs_f64(),
                boot_s: (t1 - t0).as_secs_f64(),
            });
        }
        batch_s.push(tb.elapsed().as_secs_f64());
        if !a.json {
            eprintln!(
                "{} VMs ready after {:.2} s",
                boots.len(),
                begin.elapsed().as_secs_f64()
            );
        }
    }
    let total_s = begin.elapsed().as_secs_f64();
    // What the booted, now idle VMs cost the host.
    let stat = || {
        std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|t| pvio_poll::load::parse_proc_stat(&t))
    };
    let before = stat();
    std::thread::sleep(Duration::from_secs(2));
    let idle_vms_cpu_pct = match (before, stat()) {
        (Some(a), Some(b)) => {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
            ((100.0 - f64::from(pvio_poll::load::idle_between(a, b))) * cpus * 10.0).round() / 10.0
        }
        _ => -1.0,
    };
    let t_shutdown = Instant::now();
    host.rt.block_on(xenops.shutdown_all())?;
    let shutdown_s = t_shutdown.elapsed().as_secs_f64();

    boots.sort_by_key(|b| b.vm);
    let per_vm_s: Vec<f64> = boots.iter().map(|b| b.boot_s).collect();
    let fastest = per_vm_s.iter().copied().fold(f64::INFINITY, f64::min);
    let slowest = per_vm_s.iter().copied().fold(0.0, f64::max);
    let mut ready: Vec<f64> = boots.iter().map(|b| b.ready_s).collect();
    ready.sort_by(f64::total_cmp);
    let fit: Vec<(f64, f64)> = ready
        .iter()
        .enumerate()
        .map(|(n, t)| ((n + 1) as f64, *t))
        .collect();
    let (slope, r2) = linear_fit(&fit);
    let mean = per_vm_s.iter().sum::<f64>() / per_vm_s.len() as f64;
    let value = json!({
        "bench": "bootstorm",
        "vms": a.vms,
        "batch": a.batch,
        "boot_mib": a.boot_mib,
        "boot_bs": a.boot_bs,
        "boot_depth": a.boot_depth,
        "vm_placement": !a.no_vm_placement,
        "alone_s": alone,
        "total_s": total_s,
        "per_vm_s": per_vm_s,
        "ready_at_s": ready,
        "batch_s": batch_s,
        "fastest_s": fastest,
        "slowest_s": slowest,
        "slowest_over_fastest": (slowest / fastest * 100.0).round() / 100.0,
        "mean_boot_s": mean,
        "mean_over_alone": (mean / alone * 100.0).round() / 100.0,
        "seconds_per_vm": slope,
        "linear_r2": (r2 * 1000.0).round() / 1000.0,
        "shutdown_all_s": shutdown_s,
        "idle_vms_cpu_pct": idle_vms_cpu_pct,
        "boots": boots,
    });
    let text = format!(
        "bootstorm: {} VMs, {} at a time, each reading {} MiB to boot\n\
         one VM alone boots in        {alone:.3} s\n\
         all ready after              {total_s:.2} s ({slope:.3} s per VM, linear fit r² {r2:.3})\n\
         per-VM boot time             fastest {fastest:.3} s, mean {mean:.3} s, slowest {slowest:.3} s\n\
         slowest / fastest            {:.2}\n\
         batches took                 {}\n\
         {} idle VMs then used        {idle_vms_cpu_pct:.1}% of a CPU\n\
         shutting all down took       {shutdown_s:.2} s\n",
        a.vms,
        a.batch,
        a.boot_mib,
        slowest / fastest,
        batch_s
            .iter()
            .map(|s| format!("{s:.2} s"))
            .collect::<Vec<_>>()
            .join(", "),
        a.vms,
    );
    emit(a.json, &value, &text);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::linear_fit;

    #[test]
    fn a_line_fits_perfectly_and_noise_does_not() {
        let line: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 2.0 * i as f64 + 1.0)).collect();
        let (b, r2) = linear_fit(&line);
        assert!((b - 2.0).abs() < 1e-9 && (r2 - 1.0).abs() < 1e-9);
        let zigzag: Vec<(f64, f64)> = (0..10)
            .map(|i| (i as f64, if i % 2 == 0 { 0.0 } else { 5.0 }))
            .collect();
        assert!(linear_fit(&zigzag).1 < 0.2);
    }
}
