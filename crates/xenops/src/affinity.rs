//! CPU affinity of the control slice.
//!
//! The kernel divides a cgroup's `cpu.shares` among CPUs by where the
//! group's recent load was. The control daemons are mostly idle, so spread
//! over every CPU their group's weight on the CPU where a request wakes
//! them can be a small part of its shares, and under a saturated datapath
//! the kernel (EEVDF, Linux 6.18) then let them wait 100–500 ms, once 67 s
//! (measured: `pvio bench control-latency`, docs/benchmarks.md). Kept on a
//! few CPUs, the group carries its whole share there. `pvio host up` pins
//! itself (and so the daemons it starts) to [`control_cpus`]; the toolstack
//! gives every tapdisk and guest all CPUs back through [`CPUS_ENV`], which
//! `pvio` applies before it starts any thread.

use rustix::thread::CpuSet;

/// Environment variable with a CPU list (`0-3,6` or `all`) that `pvio`
/// applies to itself at start-up.
pub const CPUS_ENV: &str = "PVIO_CPUS";

/// The default CPUs of the control slice on a machine of `n` CPUs: the
/// first eighth, at least one.
pub fn control_cpus(n: usize) -> Vec<usize> {
    (0..n.div_ceil(8).max(1)).collect()
}

/// Parses `all` or a list like taskset's `0-3,6`.
pub fn parse_cpus(s: &str) -> Result<Option<Vec<usize>>, String> {
    let s = s.trim();
    if s == "all" {
        return Ok(None);
    }
    let mut out = Vec::new();
    for part in s.split(',') {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a, b),
            None => (part, part),
        };
        let bad = || format!("bad CPU list {s:?} (expected e.g. 0-3,6 or all)");
        let lo: usize = lo.trim().parse().map_err(|_| bad())?;
        let hi: usize = hi.trim().parse().map_err(|_| bad())?;
        if lo > hi || hi >= CpuSet::MAX_CPU {
            return Err(bad());
        }
        out.extend(lo..=hi);
    }
    out.sort_unstable();
    out.dedup();
    Ok(Some(out))
}

/// The CPUs of the machine (not of the caller's affinity mask, which the
/// control slice narrows): `/sys/devices/system/cpu/online`.
pub fn online_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| parse_cpus(&s).ok().flatten())
        .map_or_else(
            || std::thread::available_parallelism().map_or(1, |n| n.get()),
            |l| l.len().max(1),
        )
}

/// Formats a CPU list for [`parse_cpus`].
pub fn format_cpus(cpus: &[usize]) -> String {
    cpus.iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Pins the calling thread (and what it starts later) to `cpus`; `None`
/// means every CPU.
pub fn pin(cpus: Option<&[usize]>) -> std::io::Result<()> {
    let mut set = CpuSet::new();
    match cpus {
        Some(list) => list.iter().for_each(|&c| set.set(c)),
        None => (0..CpuSet::MAX_CPU).for_each(|c| set.set(c)),
    }
    rustix::thread::sched_setaffinity(None, &set).map_err(std::io::Error::from)
}

/// Applies [`CPUS_ENV`] if set (called first thing by `pvio`).
pub fn apply_env() -> Result<(), String> {
    let Ok(v) = std::env::var(CPUS_ENV) else {
        return Ok(());
    };
    let cpus = parse_cpus(&v)?;
    pin(cpus.as_deref()).map_err(|e| format!("{CPUS_ENV}={v}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_like_taskset() {
        assert_eq!(parse_cpus("all"), Ok(None));
        assert_eq!(parse_cpus("0"), Ok(Some(vec![0])));
        assert_eq!(parse_cpus("3,0-2,2"), Ok(Some(vec![0, 1, 2, 3])));
        for bad in ["", "x", "2-1", "0-", "-1", "99999"] {
            assert!(parse_cpus(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(format_cpus(&[0, 1, 5]), "0,1,5");
        assert_eq!(
            parse_cpus(&format_cpus(&[0, 1, 5])),
            Ok(Some(vec![0, 1, 5]))
        );
    }

    #[test]
    fn the_machine_has_at_least_the_cpus_this_thread_may_use() {
        let mine = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(online_cpus() >= mine);
    }

    #[test]
    fn the_control_slice_gets_an_eighth_of_the_cpus() {
        assert_eq!(control_cpus(1), vec![0]);
        assert_eq!(control_cpus(2), vec![0]);
        assert_eq!(control_cpus(8), vec![0]);
        assert_eq!(control_cpus(9), vec![0, 1]);
        assert_eq!(control_cpus(64), (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn a_thread_is_pinned_and_freed() {
        let t = std::thread::spawn(|| {
            pin(Some(&[0])).unwrap();
            let got = rustix::thread::sched_getaffinity(None).unwrap();
            assert!(got.is_set(0));
            assert_eq!(got.count(), 1);
            pin(None).unwrap();
            rustix::thread::sched_getaffinity(None).unwrap().count()
        });
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(t.join().unwrap() as usize, n);
    }
}
