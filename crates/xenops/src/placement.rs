//! Where a VM's processes run: its guest and its tapdisks share the VM's
//! CPUs (as many as it has vCPUs), and while the host's CPUs are contended
//! the VMs' CPUs rotate, so every VM gets the same share of each CPU.
//!
//! Why together: a notification between two processes on one CPU is a
//! same-CPU wake-up (1–3 µs on this VM), between CPUs an inter-processor
//! one (25–45 µs, and CPU time on both sides). Left to the scheduler, the
//! few VMs whose guest and tapdisk happened to share a CPU booted twice as
//! fast as the rest of a storm (`pvio bench bootstorm`: slowest / fastest
//! 1.9–2.9), which is unfair, not fast.
//!
//! Why rotate: the CPUs are not alike. One takes the disk's interrupts
//! (a tapdisk there is woken without an IPI), another runs the control
//! plane. Pinned for good, a storm's VMs on one CPU booted 20–30% faster
//! than those on the other; moving every VM to the next CPU every
//! [`ROTATE_PERIOD`] evens that out over a boot. Only while CPU pressure
//! says tasks are waiting for CPUs: on a quiet host placement cannot be
//! unfair, and idle VMs cost nothing.
//!
//! This is the spirit of xenopsd's NUMA placement (a VM's vCPUs and memory
//! on one node) on a host whose "nodes" are single CPUs, plus the
//! migrations a hypervisor's scheduler makes to balance load.

use std::time::Duration;

use rustix::thread::{CpuSet, Pid};

/// How often the VMs' CPUs move on while the host is contended.
pub const ROTATE_PERIOD: Duration = Duration::from_millis(200);

/// CPU pressure (% of time some task waited for a CPU) from which VMs
/// rotate.
pub const ROTATE_PRESSURE_PCT: f32 = 20.0;

/// The CPUs of a VM placed at `slot` with `vcpus` vCPUs on a host of
/// `cpus` CPUs, in rotation `epoch`: `vcpus` consecutive CPUs (wrapping)
/// starting at `slot + epoch`. `None` when the VM may use every CPU.
pub fn cpus_for(slot: usize, vcpus: usize, epoch: usize, cpus: usize) -> Option<Vec<usize>> {
    let vcpus = vcpus.max(1);
    if cpus <= 1 || vcpus >= cpus {
        return None;
    }
    let first = (slot + epoch) % cpus;
    Some((0..vcpus).map(|k| (first + k) % cpus).collect())
}

/// Hands out slots so the VMs' vCPUs spread evenly over the CPUs.
#[derive(Debug, Default)]
pub struct Slots {
    next: usize,
}

impl Slots {
    /// The slot of the next VM with `vcpus` vCPUs on `cpus` CPUs.
    pub fn assign(&mut self, vcpus: usize, cpus: usize) -> usize {
        let slot = self.next % cpus.max(1);
        self.next = (self.next + vcpus.max(1)) % cpus.max(1);
        slot
    }
}

/// Pins every thread of process `pid` to `cpus` (`None`: every CPU).
/// Returns how many threads were pinned; a process or thread that exits
/// meanwhile is skipped.
pub fn pin_process(pid: u32, cpus: Option<&[usize]>) -> std::io::Result<usize> {
    let mut set = CpuSet::new();
    match cpus {
        Some(list) => list.iter().for_each(|&c| set.set(c)),
        None => (0..CpuSet::MAX_CPU).for_each(|c| set.set(c)),
    }
    let mut pinned = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Some(tid) = Pid::from_raw(tid) else {
            continue;
        };
        if rustix::thread::sched_setaffinity(Some(tid), &set).is_ok() {
            pinned += 1;
        }
    }
    Ok(pinned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vm_gets_as_many_cpus_as_vcpus_and_moves_on_each_epoch() {
        assert_eq!(cpus_for(0, 1, 0, 2), Some(vec![0]));
        assert_eq!(cpus_for(0, 1, 1, 2), Some(vec![1]));
        assert_eq!(cpus_for(1, 1, 1, 2), Some(vec![0]));
        assert_eq!(cpus_for(3, 2, 0, 4), Some(vec![3, 0]));
        assert_eq!(cpus_for(3, 2, 2, 4), Some(vec![1, 2]));
        // As many vCPUs as CPUs, or one CPU: no pinning.
        assert_eq!(cpus_for(0, 2, 5, 2), None);
        assert_eq!(cpus_for(0, 1, 5, 1), None);
        // Over a full cycle every VM visits every CPU once.
        for slot in 0..4 {
            let mut seen: Vec<usize> = (0..4)
                .flat_map(|e| cpus_for(slot, 1, e, 4).unwrap())
                .collect();
            seen.sort_unstable();
            assert_eq!(seen, vec![0, 1, 2, 3]);
        }
    }

    #[test]
    fn slots_spread_vcpus_evenly() {
        let mut s = Slots::default();
        let got: Vec<usize> = (0..6).map(|_| s.assign(1, 4)).collect();
        assert_eq!(got, vec![0, 1, 2, 3, 0, 1]);
        let mut s = Slots::default();
        assert_eq!((s.assign(2, 4), s.assign(2, 4), s.assign(1, 4)), (0, 2, 0));
    }

    #[test]
    fn a_process_is_pinned_thread_by_thread_and_freed() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        assert_eq!(pin_process(pid, Some(&[0])).unwrap(), 1);
        let got = rustix::thread::sched_getaffinity(Pid::from_raw(pid as i32)).unwrap();
        assert_eq!((got.is_set(0), got.count()), (true, 1));
        pin_process(pid, None).unwrap();
        let got = rustix::thread::sched_getaffinity(Pid::from_raw(pid as i32)).unwrap();
        assert_eq!(got.count() as usize, cpus);
        let _ = child.kill();
        let _ = child.wait();
        assert!(pin_process(pid, Some(&[0])).is_err(), "a reaped process");
    }
}
