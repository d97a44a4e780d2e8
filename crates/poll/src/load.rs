//! The host-load gate: pollers must not take CPU that others need.
//!
//! Two measures, one per policy that uses it:
//!
//! * **idle %**, as tapdisk3's `cpumond` computes it: every sampling period
//!   (1 s by default) read the first `cpu` line of `/proc/stat` and compute
//!   `100 × Δidle / Δtotal`, where only the 4th field counts as idle (iowait
//!   counts as busy). Until the first period has passed it reads 0, so, as
//!   with tapdisk3 without cpumond, no polling starts.
//! * **contention**: more runnable tasks than CPUs right now (the `running`
//!   field of `/proc/loadavg`), the userspace analogue of KVM halt-polling's
//!   "only if nothing else is runnable". It is what the adaptive policy uses:
//!   on a host where guests and backends share CPUs, the pollers themselves
//!   make idle % read low, but they only deprive someone when tasks queue.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What a policy may ask about the host.
pub trait LoadView {
    /// Percentage of CPU time that was idle over the last sampling period.
    fn idle_pct(&self) -> f32;
    /// Whether tasks are waiting for a CPU right now.
    fn contended(&self, now_ns: u64) -> bool;
}

/// Aggregate CPU counters from `/proc/stat`'s first line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    pub idle: u64,
    pub total: u64,
}

/// Parses the first `cpu ` line of `/proc/stat`.
pub fn parse_proc_stat(text: &str) -> Option<CpuTimes> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<Vec<u64>>>()?;
    if fields.len() < 4 {
        return None;
    }
    Some(CpuTimes {
        idle: fields[3],
        total: fields.iter().sum(),
    })
}

/// Idle percentage between two samples (0 when no time passed).
pub fn idle_between(a: CpuTimes, b: CpuTimes) -> f32 {
    let dt = b.total.saturating_sub(a.total);
    if dt == 0 {
        return 0.0;
    }
    100.0 * b.idle.saturating_sub(a.idle) as f32 / dt as f32
}

/// Parses the runnable-task count from `/proc/loadavg` (`0.10 0.20 0.30 3/456 789`).
pub fn parse_loadavg_running(text: &str) -> Option<u32> {
    let f = text.split_whitespace().nth(3)?;
    f.split('/').next()?.parse().ok()
}

struct Shared {
    idle_bits: AtomicU32,
    checked_ns: AtomicU64,
    contended: AtomicBool,
    cpus: u32,
    recheck_ns: u64,
    stop: AtomicBool,
}

/// The host's load, sampled like cpumond (a background thread) and checked
/// for contention on demand (at most once every 2 ms).
#[derive(Clone)]
pub struct HostLoad {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for HostLoad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostLoad")
            .field("idle_pct", &self.idle_pct())
            .field("cpus", &self.shared.cpus)
            .finish()
    }
}

impl HostLoad {
    /// Starts sampling `/proc/stat` every `period` (cpumond: 1 s).
    pub fn start(period: Duration) -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        let shared = Arc::new(Shared {
            idle_bits: AtomicU32::new(0f32.to_bits()),
            checked_ns: AtomicU64::new(0),
            contended: AtomicBool::new(false),
            cpus,
            recheck_ns: 2_000_000,
            stop: AtomicBool::new(false),
        });
        let s = Arc::downgrade(&shared);
        let _ = std::thread::Builder::new()
            .name("pvio-cpumon".into())
            .spawn(move || {
                let read = || {
                    std::fs::read_to_string("/proc/stat")
                        .ok()
                        .and_then(|t| parse_proc_stat(&t))
                };
                let mut prev = read();
                loop {
                    std::thread::sleep(period);
                    let Some(sh) = s.upgrade() else { return };
                    if sh.stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let cur = read();
                    if let (Some(a), Some(b)) = (prev, cur) {
                        sh.idle_bits
                            .store(idle_between(a, b).to_bits(), Ordering::Relaxed);
                    }
                    prev = cur;
                }
            });
        Self { shared }
    }

    /// A fixed view for tests and for disabling the gate: `idle_pct` is
    /// constant and the host is never contended.
    pub fn fixed(idle_pct: f32) -> Self {
        Self {
            shared: Arc::new(Shared {
                idle_bits: AtomicU32::new(idle_pct.to_bits()),
                checked_ns: AtomicU64::new(u64::MAX),
                contended: AtomicBool::new(false),
                cpus: 1,
                recheck_ns: u64::MAX,
                stop: AtomicBool::new(true),
            }),
        }
    }

    /// Number of CPUs.
    pub fn cpus(&self) -> u32 {
        self.shared.cpus
    }
}

impl Drop for HostLoad {
    fn drop(&mut self) {
        if Arc::strong_count(&self.shared) == 1 {
            self.shared.stop.store(true, Ordering::Relaxed);
        }
    }
}

impl LoadView for HostLoad {
    fn idle_pct(&self) -> f32 {
        f32::from_bits(self.shared.idle_bits.load(Ordering::Relaxed))
    }

    fn contended(&self, now_ns: u64) -> bool {
        let sh = &self.shared;
        let last = sh.checked_ns.load(Ordering::Relaxed);
        if last != u64::MAX && now_ns.saturating_sub(last) >= sh.recheck_ns {
            sh.checked_ns.store(now_ns, Ordering::Relaxed);
            let running = std::fs::read_to_string("/proc/loadavg")
                .ok()
                .and_then(|t| parse_loadavg_running(&t))
                .unwrap_or(0);
            sh.contended.store(running > sh.cpus, Ordering::Relaxed);
        }
        sh.contended.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat() {
        let t = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\nintr 5\n";
        let c = parse_proc_stat(t).unwrap();
        assert_eq!(
            c,
            CpuTimes {
                idle: 800,
                total: 1000
            }
        );
        let d = CpuTimes {
            idle: 900,
            total: 1200,
        };
        assert_eq!(idle_between(c, d), 50.0);
        assert_eq!(idle_between(c, c), 0.0);
        assert!(parse_proc_stat("cpu 1 2\n").is_none());
        assert!(parse_proc_stat("nothing").is_none());
    }

    #[test]
    fn parses_loadavg() {
        assert_eq!(
            parse_loadavg_running("0.00 0.01 0.05 3/123 4567\n"),
            Some(3)
        );
        assert_eq!(parse_loadavg_running("garbage"), None);
    }

    #[test]
    fn real_host_is_readable() {
        let h = HostLoad::start(Duration::from_millis(10));
        // Before the first period the idle figure is 0, as without cpumond.
        let _ = h.contended(crate::now_ns());
        assert!(h.cpus() >= 1);
        let f = HostLoad::fixed(80.0);
        assert_eq!(f.idle_pct(), 80.0);
        assert!(!f.contended(crate::now_ns()));
    }
}
