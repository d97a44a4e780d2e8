//! The bare-metal baseline: fio itself (io_uring, O_DIRECT) on the same
//! image file the guest's disk uses.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};

/// What fio measured.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct FioResult {
    pub iops: f64,
    pub mb_per_s: f64,
    pub lat_us_p50: f64,
}

/// Runs `fio` random reads of `bs` bytes at `iodepth` for `runtime_s`.
pub fn randread(image: &Path, bs: u64, iodepth: u32, runtime_s: f64) -> anyhow::Result<FioResult> {
    let out = Command::new("fio")
        .arg("--name=pvio-baseline")
        .arg(format!("--filename={}", image.display()))
        .args(["--rw=randread", "--direct=1", "--ioengine=io_uring"])
        .arg(format!("--bs={bs}"))
        .arg(format!("--iodepth={iodepth}"))
        .arg(format!("--runtime={runtime_s}s"))
        .args([
            "--time_based",
            "--norandommap",
            "--randrepeat=0",
            "--output-format=json",
        ])
        .output()
        .context("running fio (install it with scripts/install-deps.sh)")?;
    if !out.status.success() {
        bail!("fio failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // fio may print warnings before the JSON.
    let start = text.find('{').context("fio printed no JSON")?;
    let v: serde_json::Value =
        serde_json::from_str(&text[start..]).context("parsing fio's JSON")?;
    let read = &v["jobs"][0]["read"];
    Ok(FioResult {
        iops: read["iops"].as_f64().unwrap_or(0.0),
        mb_per_s: read["bw_bytes"].as_f64().unwrap_or(0.0) / 1e6,
        lat_us_p50: read["clat_ns"]["percentile"]["50.000000"]
            .as_f64()
            .unwrap_or(0.0)
            / 1000.0,
    })
}
