//! Measuring what a wake-up costs on this host, so the adaptive policy
//! knows what polling saves: two threads ping-pong through eventfds and the
//! median one-way time is the cost of an event-driven pickup.

use std::os::fd::{AsFd, OwnedFd};

use rustix::event::{eventfd, EventfdFlags};

fn efd() -> std::io::Result<OwnedFd> {
    Ok(eventfd(0, EventfdFlags::CLOEXEC)?)
}

fn signal(fd: &OwnedFd) -> std::io::Result<()> {
    rustix::io::write(fd.as_fd(), &1u64.to_ne_bytes())?;
    Ok(())
}

fn wait(fd: &OwnedFd) -> std::io::Result<()> {
    let mut b = [0u8; 8];
    loop {
        match rustix::io::read(fd.as_fd(), &mut b) {
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

fn pin(cpu: usize) {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    let _ = rustix::thread::sched_setaffinity(None, &set);
}

/// The median one-way wake-up latency between two threads on different
/// CPUs (what a frontend and a backend pay), in ns, over `rounds` round
/// trips (about 100 µs each on a VM). On one CPU, the same-CPU cost.
pub fn wake_cost_ns(rounds: usize) -> std::io::Result<u64> {
    let (a, b) = (efd()?, efd()?);
    let (a2, b2) = (a.try_clone()?, b.try_clone()?);
    let rounds = rounds.max(3);
    // Measure on two threads of their own so the caller's affinity stays,
    // on two CPUs of the whole machine even if the caller is pinned (a
    // toolstack in a pinned control slice measures for unpinned guests).
    let me = std::thread::spawn(move || -> std::io::Result<u64> {
        let mut all = rustix::thread::CpuSet::new();
        (0..rustix::thread::CpuSet::MAX_CPU).for_each(|c| all.set(c));
        let _ = rustix::thread::sched_setaffinity(None, &all);
        let allowed = rustix::thread::sched_getaffinity(None)?;
        let mut two = (0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| allowed.is_set(c));
        let pair = two.next().zip(two.next());
        if let Some((c0, _)) = pair {
            pin(c0);
        }
        let peer = std::thread::spawn(move || -> std::io::Result<()> {
            if let Some((_, c1)) = pair {
                pin(c1);
            }
            for _ in 0..rounds {
                wait(&a2)?;
                signal(&b2)?;
            }
            Ok(())
        });
        let mut rtts = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let t0 = crate::now_ns();
            signal(&a)?;
            wait(&b)?;
            rtts.push(crate::now_ns() - t0);
        }
        peer.join()
            .map_err(|_| std::io::Error::other("calibration thread panicked"))??;
        rtts.sort_unstable();
        Ok(rtts[rtts.len() / 2] / 2)
    });
    me.join()
        .map_err(|_| std::io::Error::other("calibration thread panicked"))?
}

/// The environment variable through which a toolstack hands the wake-up
/// cost it measured once to every backend and guest it starts, so a host
/// starting hundreds of disks does not calibrate hundreds of times.
pub const WAKE_COST_ENV: &str = "PVIO_WAKE_COST_NS";

/// [`WAKE_COST_ENV`] if it holds a number of nanoseconds, else a fresh
/// [`wake_cost_ns`] measurement.
pub fn host_wake_cost_ns(rounds: usize) -> std::io::Result<u64> {
    match std::env::var(WAKE_COST_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(ns) if ns > 0 => Ok(ns),
        _ => wake_cost_ns(rounds),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn measures_something_positive() {
        let ns = super::wake_cost_ns(20).unwrap();
        assert!(ns > 0);
    }
}
