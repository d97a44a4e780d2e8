//! Counters a job keeps while it runs: per operation I/Os, bytes, errors
//! and a latency histogram (nanoseconds, 3 significant digits), plus the
//! first few error messages and verify failures.

use std::time::Duration;

use hdrhistogram::Histogram;

use super::report::{Latency, OpReport, VerifyFailure, VerifyReport};

/// How many error messages and verify failures a report keeps.
pub const KEEP_FIRST: usize = 8;

/// One operation's counters.
#[derive(Debug, Clone)]
pub struct OpStats {
    pub ios: u64,
    pub bytes: u64,
    pub errors: u64,
    pub hist: Histogram<u64>,
}

impl Default for OpStats {
    fn default() -> Self {
        Self {
            ios: 0,
            bytes: 0,
            errors: 0,
            hist: new_histogram(),
        }
    }
}

/// An auto-resizing histogram with 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant digits is a valid precision")
}

impl OpStats {
    /// Counts one completed I/O.
    pub fn record(&mut self, latency: Duration, bytes: u64) {
        self.ios += 1;
        self.bytes += bytes;
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX).max(1);
        // `record`, not `saturating_record`: the histogram auto-resizes, and
        // saturating would clamp every value to its initial 2 ns range.
        if self.hist.record(ns).is_err() {
            self.hist.saturating_record(ns);
        }
    }

    /// The report over `runtime`.
    pub fn finish(&self, runtime: Duration) -> OpReport {
        OpReport::new(
            self.ios,
            self.bytes,
            self.errors,
            self.hist.clone(),
            runtime,
        )
    }
}

/// Latency figures of a histogram of nanoseconds, in microseconds.
pub fn latency_of(h: &Histogram<u64>) -> Latency {
    if h.is_empty() {
        return Latency::default();
    }
    let us = |ns: u64| ns as f64 / 1000.0;
    Latency {
        min: us(h.min()),
        mean: h.mean() / 1000.0,
        p50: us(h.value_at_quantile(0.50)),
        p90: us(h.value_at_quantile(0.90)),
        p99: us(h.value_at_quantile(0.99)),
        p99_9: us(h.value_at_quantile(0.999)),
        max: us(h.max()),
    }
}

/// Errors: a count and the first few messages.
#[derive(Debug, Clone, Default)]
pub struct ErrorLog {
    pub count: u64,
    pub first: Vec<String>,
}

impl ErrorLog {
    pub fn push(&mut self, message: impl FnOnce() -> String) {
        self.count += 1;
        if self.first.len() < KEEP_FIRST {
            let m = message();
            tracing::debug!("{m}");
            self.first.push(m);
        }
    }
}

/// Verification counters.
#[derive(Debug, Clone, Default)]
pub struct VerifyStats {
    pub checked: u64,
    pub failures: u64,
    pub first_failures: Vec<VerifyFailure>,
    pub unverified_reads: u64,
}

impl VerifyStats {
    pub fn fail(&mut self, offset: u64, reason: String) {
        self.checked += 1;
        self.failures += 1;
        if self.first_failures.len() < KEEP_FIRST {
            tracing::warn!(offset, "verify failure: {reason}");
            self.first_failures.push(VerifyFailure { offset, reason });
        }
    }

    pub fn pass(&mut self) {
        self.checked += 1;
    }

    pub fn merge_into(&self, r: &mut VerifyReport) {
        r.checked += self.checked;
        r.failures += self.failures;
        r.unverified_reads += self.unverified_reads;
        for f in &self.first_failures {
            if r.first_failures.len() < KEEP_FIRST {
                r.first_failures.push(f.clone());
            }
        }
    }
}

#[cfg(test)]
mod latency_tests {
    use super::*;

    #[test]
    fn latencies_keep_their_magnitude() {
        let mut s = OpStats::default();
        for us in [50u64, 100, 150, 1000, 20_000] {
            s.record(Duration::from_micros(us), 4096);
        }
        let l = latency_of(&s.hist);
        assert!((149.0..=151.0).contains(&l.p50), "{l:?}");
        assert!((19_900.0..=20_100.0).contains(&l.max), "{l:?}");
        assert!((49.0..=51.0).contains(&l.min), "{l:?}");
    }
}
