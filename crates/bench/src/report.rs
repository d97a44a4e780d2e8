//! Shared measurement and reporting helpers for the benchmarks.

use hdrhistogram::Histogram;

/// A latency histogram in nanoseconds, 1 ns to 60 s, 3 significant digits.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// p50 and p99 of a latency histogram, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Percentiles {
    pub p50: u64,
    pub p99: u64,
}

impl Percentiles {
    /// Reads p50 and p99 from a histogram.
    pub fn of(h: &Histogram<u64>) -> Self {
        Self {
            p50: h.value_at_quantile(0.50),
            p99: h.value_at_quantile(0.99),
        }
    }
}

/// `a / b` rounded to two decimals, or `None` when `b` is zero.
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    if b == 0.0 {
        None
    } else {
        Some(((a / b) * 100.0).round() / 100.0)
    }
}

/// Prints a report: one JSON object on stdout with `--json`, the text otherwise.
pub fn emit(json: bool, value: &serde_json::Value, text: &str) {
    if json {
        println!("{value}");
    } else {
        print!("{text}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_ratio() {
        let mut h = latency_histogram();
        for v in 1..=100u64 {
            h.record(v * 1000).unwrap();
        }
        let p = Percentiles::of(&h);
        assert!((49_000..=51_000).contains(&p.p50), "{p:?}");
        assert!((98_000..=100_100).contains(&p.p99), "{p:?}");
        assert_eq!(ratio(3.0, 2.0), Some(1.5));
        assert_eq!(ratio(1.0, 0.0), None);
    }
}
