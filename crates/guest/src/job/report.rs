//! What a run measured: per job and in total, IOPS, MB/s (10^6 bytes per
//! second), latency percentiles, errors and verify results; printed as a
//! compact table (`Display`) or as JSON (`serde::Serialize`).

use std::fmt;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::stats::{latency_of, new_histogram, KEEP_FIRST};

/// Latency in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Latency {
    pub min: f64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p99_9: f64,
    pub max: f64,
}

/// One operation (read or write) over a run.
#[derive(Debug, Clone, Serialize)]
pub struct OpReport {
    pub ios: u64,
    pub bytes: u64,
    pub errors: u64,
    pub iops: f64,
    pub mb_per_s: f64,
    pub lat_us: Latency,
    #[serde(skip)]
    hist: Histogram<u64>,
}

impl Default for OpReport {
    fn default() -> Self {
        Self::new(0, 0, 0, new_histogram(), Duration::ZERO)
    }
}

impl OpReport {
    pub(crate) fn new(
        ios: u64,
        bytes: u64,
        errors: u64,
        hist: Histogram<u64>,
        runtime: Duration,
    ) -> Self {
        let secs = runtime.as_secs_f64();
        let per_sec = |n: f64| if secs > 0.0 { n / secs } else { 0.0 };
        Self {
            ios,
            bytes,
            errors,
            iops: per_sec(ios as f64),
            mb_per_s: per_sec(bytes as f64) / 1e6,
            lat_us: latency_of(&hist),
            hist,
        }
    }

    /// The latency histogram, in nanoseconds.
    pub fn histogram(&self) -> &Histogram<u64> {
        &self.hist
    }

    /// Several reports as one over `runtime`.
    pub fn merge<'a>(parts: impl IntoIterator<Item = &'a OpReport>, runtime: Duration) -> Self {
        let (mut ios, mut bytes, mut errors, mut hist) = (0, 0, 0, new_histogram());
        for p in parts {
            ios += p.ios;
            bytes += p.bytes;
            errors += p.errors;
            // Both histograms auto-resize, so adding cannot fail on range.
            let _ = hist.add(&p.hist);
        }
        Self::new(ios, bytes, errors, hist, runtime)
    }
}

/// A read back that did not match the last acknowledged write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyFailure {
    /// Byte offset of the block.
    pub offset: u64,
    pub reason: String,
}

/// Verification results.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct VerifyReport {
    /// Blocks checked (passed or failed).
    pub checked: u64,
    /// Blocks that did not match.
    pub failures: u64,
    /// The first few failures.
    pub first_failures: Vec<VerifyFailure>,
    /// Reads of blocks this job had not written (nothing to check).
    pub unverified_reads: u64,
    /// Blocks with an acknowledged write when the write phase ended.
    pub acked_blocks: u64,
    /// Blocks whose last write failed, so their contents are unknown.
    pub indeterminate_blocks: u64,
    /// Duration of the read-back phase, in seconds.
    pub readback_s: f64,
}

/// One job's results.
#[derive(Debug, Clone, Serialize)]
pub struct JobReport {
    pub job: u32,
    /// The spec in compact form.
    pub spec: String,
    pub bs: u32,
    /// Requests kept in flight (the spec's iodepth, capped by the device's
    /// buffers).
    pub iodepth: u32,
    /// Most requests seen in flight at once.
    pub iodepth_max: u32,
    /// Measured time (after the ramp), in seconds.
    pub runtime_s: f64,
    pub read: OpReport,
    pub write: OpReport,
    /// Failed requests (reads and writes, including the verify phase).
    pub errors: u64,
    pub first_errors: Vec<String>,
    pub verify: Option<VerifyReport>,
    /// Why the job stopped early, if it did.
    pub aborted: Option<String>,
}

impl JobReport {
    /// No errors, no verify failure, not aborted.
    pub fn ok(&self) -> bool {
        self.errors == 0
            && self.aborted.is_none()
            && self.verify.as_ref().is_none_or(|v| v.failures == 0)
    }
}

/// Totals over all jobs.
#[derive(Debug, Clone, Serialize)]
pub struct TotalReport {
    pub runtime_s: f64,
    pub read: OpReport,
    pub write: OpReport,
    pub errors: u64,
    pub verify_failures: u64,
}

/// A run's results.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub jobs: Vec<JobReport>,
    pub total: TotalReport,
}

impl RunReport {
    /// Adds up per-job reports (the runtime is the longest job's).
    pub fn from_jobs(jobs: Vec<JobReport>) -> Self {
        let runtime = jobs.iter().map(|j| j.runtime_s).fold(0.0, f64::max);
        let rt = Duration::from_secs_f64(runtime);
        let total = TotalReport {
            runtime_s: runtime,
            read: OpReport::merge(jobs.iter().map(|j| &j.read), rt),
            write: OpReport::merge(jobs.iter().map(|j| &j.write), rt),
            errors: jobs.iter().map(|j| j.errors).sum(),
            verify_failures: jobs
                .iter()
                .filter_map(|j| j.verify.as_ref())
                .map(|v| v.failures)
                .sum(),
        };
        Self { jobs, total }
    }

    /// Every job is [`JobReport::ok`].
    pub fn ok(&self) -> bool {
        self.jobs.iter().all(JobReport::ok)
    }

    /// Pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

fn op_row(f: &mut fmt::Formatter<'_>, who: &str, op: &str, r: &OpReport) -> fmt::Result {
    if r.ios == 0 && r.errors == 0 {
        return Ok(());
    }
    let l = &r.lat_us;
    writeln!(
        f,
        "{who:<5} {op:<5} {:>10} {:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>7}",
        r.ios, r.iops, r.mb_per_s, l.p50, l.p90, l.p99, l.p99_9, r.errors
    )
}

impl fmt::Display for RunReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<5} {:<5} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}",
            "job", "op", "ios", "IOPS", "MB/s", "p50 us", "p90 us", "p99 us", "p99.9 us", "errors"
        )?;
        for j in &self.jobs {
            op_row(f, &j.job.to_string(), "read", &j.read)?;
            op_row(f, &j.job.to_string(), "write", &j.write)?;
        }
        if self.jobs.len() > 1 {
            op_row(f, "all", "read", &self.total.read)?;
            op_row(f, "all", "write", &self.total.write)?;
        }
        writeln!(
            f,
            "runtime {:.2} s, {} job(s), {} error(s)",
            self.total.runtime_s,
            self.jobs.len(),
            self.total.errors
        )?;
        for j in &self.jobs {
            for e in j.first_errors.iter().take(KEEP_FIRST) {
                writeln!(f, "job {}: error: {e}", j.job)?;
            }
            if let Some(a) = &j.aborted {
                writeln!(f, "job {}: aborted: {a}", j.job)?;
            }
            if let Some(v) = &j.verify {
                writeln!(
                    f,
                    "job {}: verify: {} block(s) checked in {:.2} s, {} failure(s), {} acknowledged, {} indeterminate",
                    j.job, v.checked, v.readback_s, v.failures, v.acked_blocks, v.indeterminate_blocks
                )?;
                for x in &v.first_failures {
                    writeln!(
                        f,
                        "job {}: verify failure at offset {}: {}",
                        j.job, x.offset, x.reason
                    )?;
                }
            }
        }
        Ok(())
    }
}
