//! The host-load gate: pollers must not take CPU that others need.
//!
//! Three measures:
//!
//! * **idle %**, as tapdisk3's `cpumond` computes it: every sampling period
//!   (1 s by default) read the first `cpu` line of `/proc/stat` and compute
//!   `100 × Δidle / Δtotal`, where only the 4th field counts as idle (iowait
//!   counts as busy). Until the first period has passed it reads 0, so, as
//!   with tapdisk3 without cpumond, no polling starts.
//! * **contention**: other tasks took the poller's own CPU while it was
//!   runnable — the time the poller thread spent waiting on a run queue
//!   (`/proc/thread-self/schedstat`, its run delay), looked at every 2 ms,
//!   was at least [`CROWDED_PCT`] of the time since the last look — the
//!   userspace analogue of KVM halt-polling's "only if nothing else is
//!   runnable on this CPU". It is what the adaptive policy uses: on a host
//!   where guests and backends share CPUs, the pollers themselves make
//!   idle % read low, but they only deprive someone when a task queues
//!   behind them. Two signals were tried first and dropped: a host-wide
//!   count of runnable tasks (`/proc/loadavg`: with a guest and its tapdisk
//!   polling on the two CPUs of this machine, any kernel worker running
//!   for a moment anywhere made it read 3 > 2, and the frontend refused
//!   nine polls in ten at queue depth 1), and the thread's involuntary
//!   context switches (`rcu_preempt` and `ksoftirqd` preempt a spinning
//!   thread 50–80 times a second for a few µs each, which refused a third
//!   of the polls at queue depth 32). Storms that move from CPU to CPU show in the
//!   kernel's CPU pressure (`/proc/pressure/cpu`, the share of time some
//!   task waited for a CPU), sampled every 100 ms: once a sample reaches
//!   [`PRESSURE_LIMIT_PCT`] the host counts as contended for a second, and
//!   until the first sample (at start, and when sampling resumes) it counts
//!   as contended too. Measured on 2 CPUs: one VM at queue depth 1 with both sides
//!   polling stays under 25%, 25 VMs booting at once hold 30–100%, and
//!   there polling only takes CPU from the others (50 VMs booted in
//!   14.0 s with polling before this gate, 12.2 s with polling off).
//! * **steal**: the share of all CPUs' time the hypervisor gave to
//!   something else while this machine's vCPUs wanted to run (`/proc/stat`'s
//!   8th field), over the last [`STEAL_WINDOW`], sampled with the pressure.
//!   On a VM whose virtual disk is emulated on the physical CPUs its vCPUs
//!   use, it is the disk's share taken back from spinning vCPUs; the
//!   adaptive policy stops spinning for one of several items in flight when
//!   it is high (see `policy::STEAL_LIMIT_PCT`).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// CPU pressure (% of time some task waited for a CPU over the last
/// sample) at which pollers stand back.
pub const PRESSURE_LIMIT_PCT: f32 = 50.0;

/// Share of its time a poller thread may wait for its CPU before it counts
/// as contended (kernel threads that run a few µs now and then stay far
/// below; a task sharing its CPU takes half of it).
pub const CROWDED_PCT: u64 = 20;

/// Over how long the steal percentage is measured (`/proc/stat` counts in
/// 10 ms ticks: on 2 CPUs, one tick in 200 ms is 2.5%).
pub const STEAL_WINDOW: Duration = Duration::from_millis(200);

/// How often CPU pressure is sampled.
const PRESSURE_PERIOD: Duration = Duration::from_millis(100);

/// How long pollers stand back after pressure reached the limit: once they
/// stop, the pressure they caused goes and would let them start again
/// within a sample (measured in a storm of 25 booting VMs: 30–80% from
/// one 100 ms sample to the next).
const PRESSURE_HOLD: Duration = Duration::from_secs(1);

/// What a policy may ask about the host.
pub trait LoadView {
    /// Percentage of CPU time that was idle over the last sampling period.
    fn idle_pct(&self) -> f32;
    /// Whether tasks are waiting for a CPU right now.
    fn contended(&self, now_ns: u64) -> bool;
    /// Percentage of the CPUs' time the hypervisor took from this machine
    /// over the last [`STEAL_WINDOW`] (0 where nothing measures it).
    fn steal_pct(&self) -> f32 {
        0.0
    }
}

/// Aggregate CPU counters from `/proc/stat`'s first line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    pub idle: u64,
    pub total: u64,
    /// Time the hypervisor ran something else while a vCPU wanted to run
    /// (the 8th field; 0 on bare metal and on older kernels).
    pub steal: u64,
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
        steal: fields.get(7).copied().unwrap_or(0),
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

/// Stolen percentage between two samples (0 when no time passed).
pub fn steal_between(a: CpuTimes, b: CpuTimes) -> f32 {
    let dt = b.total.saturating_sub(a.total);
    if dt == 0 {
        return 0.0;
    }
    100.0 * b.steal.saturating_sub(a.steal) as f32 / dt as f32
}

/// Parses the cumulative `some` stall time (µs) from `/proc/pressure/cpu`
/// (`some avg10=0.00 avg60=0.00 avg300=0.00 total=12345`).
pub fn parse_psi_some_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

/// The host's cumulative CPU stall (`some` total, µs) from
/// `/proc/pressure/cpu`; `None` where the kernel has no PSI.
pub fn cpu_stall_us() -> Option<u64> {
    std::fs::read_to_string("/proc/pressure/cpu")
        .ok()
        .and_then(|t| parse_psi_some_total(&t))
}

/// Parses the run delay (ns spent runnable but waiting for a CPU) from a
/// task's `schedstat` (`<run ns> <run delay ns> <timeslices>`).
pub fn parse_schedstat_delay(text: &str) -> Option<u64> {
    text.split_whitespace().nth(1)?.parse().ok()
}

/// A thread's last look at its own run delay.
struct CrowdCheck {
    /// `/proc/thread-self/schedstat`, opened by (and so naming) the thread.
    file: std::fs::File,
    at_ns: u64,
    delay_ns: u64,
    contended: bool,
}

thread_local! {
    static CROWD: std::cell::RefCell<Option<CrowdCheck>> =
        const { std::cell::RefCell::new(None) };
}

/// The calling thread's run delay so far, through its open schedstat file.
fn read_delay(file: &std::fs::File) -> Option<u64> {
    let mut buf = [0u8; 96];
    let n = rustix::io::pread(file, &mut buf, 0).ok()?;
    parse_schedstat_delay(std::str::from_utf8(&buf[..n]).ok()?)
}

struct Shared {
    idle_bits: AtomicU32,
    /// CPU pressure over the last sample, in % (0 where the kernel has
    /// no PSI).
    pressure_bits: AtomicU32,
    /// Pressure reached the limit within the last [`PRESSURE_HOLD`].
    pressured: AtomicBool,
    /// Steal over the last [`STEAL_WINDOW`], in %.
    steal_bits: AtomicU32,
    cpus: u32,
    recheck_ns: u64,
    stop: AtomicBool,
    /// A figure was asked for since the sampler last looked.
    asked: AtomicBool,
    /// The sampler sleeps until the next question (nobody asked for
    /// [`PARK_AFTER`]: an idle guest's pollers cost nothing).
    parked: AtomicBool,
    sampler: std::sync::OnceLock<std::thread::Thread>,
}

impl Shared {
    /// Notes a question, waking a parked sampler.
    fn ask(&self) {
        // Read first: pollers ask on every idle turn, and a store each time
        // would bounce the line between a process's queues.
        if !self.asked.load(Ordering::Relaxed) {
            self.asked.store(true, Ordering::Relaxed);
        }
        if self.parked.load(Ordering::Relaxed) && self.parked.swap(false, Ordering::AcqRel) {
            if let Some(t) = self.sampler.get() {
                t.unpark();
            }
        }
    }
}

/// The sampler parks after this long without a question.
const PARK_AFTER: Duration = Duration::from_secs(1);

/// The host's load, sampled like cpumond (a background thread), and the
/// calling thread's own contention, checked on demand (at most once every
/// 2 ms per thread).
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
    /// Starts sampling: idle % every `period` (cpumond: 1 s), CPU pressure
    /// and steal every 100 ms (or `period`, if shorter).
    pub fn start(period: Duration) -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        let psi = cpu_stall_us().is_some();
        let shared = Arc::new(Shared {
            idle_bits: AtomicU32::new(0f32.to_bits()),
            pressure_bits: AtomicU32::new(0f32.to_bits()),
            // Until the first sample, pressure is unknown: stand back (a
            // VM started in a storm must not poll before it can tell).
            pressured: AtomicBool::new(psi),
            steal_bits: AtomicU32::new(0f32.to_bits()),
            cpus,
            recheck_ns: 2_000_000,
            stop: AtomicBool::new(false),
            asked: AtomicBool::new(true),
            parked: AtomicBool::new(false),
            sampler: std::sync::OnceLock::new(),
        });
        let s = Arc::downgrade(&shared);
        let spawned = std::thread::Builder::new()
            .name("pvio-cpumon".into())
            .spawn(move || {
                let read = || {
                    std::fs::read_to_string("/proc/stat")
                        .ok()
                        .and_then(|t| parse_proc_stat(&t))
                };
                let stall = || cpu_stall_us().map(|us| (us, std::time::Instant::now()));
                // Pressure reacts within a tenth of a second (a storm of
                // VMs starting must stop pollers before the early ones run
                // away with the CPUs); idle % keeps cpumond's period.
                let tick = period.min(PRESSURE_PERIOD);
                let mut prev = read();
                let mut prev_at = std::time::Instant::now();
                // /proc/stat every tick, for steal over the last window.
                let window = (STEAL_WINDOW.as_millis() / tick.as_millis().max(1)).max(1) as usize;
                let mut recent: std::collections::VecDeque<CpuTimes> = prev.into_iter().collect();
                let mut prev_stall = stall();
                let mut pressured_at: Option<std::time::Instant> = None;
                let mut unasked = Duration::ZERO;
                loop {
                    std::thread::sleep(tick);
                    let Some(sh) = s.upgrade() else { return };
                    if sh.stop.load(Ordering::Relaxed) {
                        return;
                    }
                    if sh.asked.swap(false, Ordering::Relaxed) {
                        unasked = Duration::ZERO;
                    } else {
                        unasked += tick;
                    }
                    if unasked >= PARK_AFTER {
                        // Nobody polls: stop sampling until someone asks.
                        // Old figures say nothing then; start from
                        // "unknown" as at start-up.
                        sh.idle_bits.store(0f32.to_bits(), Ordering::Relaxed);
                        sh.pressured.store(psi, Ordering::Relaxed);
                        sh.steal_bits.store(0f32.to_bits(), Ordering::Relaxed);
                        sh.parked.store(true, Ordering::Release);
                        drop(sh);
                        loop {
                            std::thread::park();
                            let Some(sh) = s.upgrade() else { return };
                            if sh.stop.load(Ordering::Relaxed) {
                                return;
                            }
                            if !sh.parked.load(Ordering::Acquire) {
                                break;
                            }
                        }
                        unasked = Duration::ZERO;
                        pressured_at = None;
                        prev = read();
                        prev_at = std::time::Instant::now();
                        prev_stall = stall();
                        recent = prev.into_iter().collect();
                        continue;
                    }
                    let cur_stall = stall();
                    if let (Some((a, ta)), Some((b, tb))) = (prev_stall, cur_stall) {
                        let dt = tb.duration_since(ta).as_micros().max(1) as f32;
                        let pct = (100.0 * b.saturating_sub(a) as f32 / dt).min(100.0);
                        sh.pressure_bits.store(pct.to_bits(), Ordering::Relaxed);
                        if pct >= PRESSURE_LIMIT_PCT {
                            pressured_at = Some(tb);
                        }
                        let held = pressured_at.is_some_and(|t| t.elapsed() < PRESSURE_HOLD);
                        sh.pressured.store(held, Ordering::Relaxed);
                    }
                    prev_stall = cur_stall;
                    let cur = read();
                    if let Some(c) = cur {
                        recent.push_back(c);
                        while recent.len() > window + 1 {
                            recent.pop_front();
                        }
                        if let (Some(&a), Some(&b)) = (recent.front(), recent.back()) {
                            sh.steal_bits
                                .store(steal_between(a, b).to_bits(), Ordering::Relaxed);
                        }
                    }
                    if prev_at.elapsed() < period {
                        continue;
                    }
                    prev_at = std::time::Instant::now();
                    if let (Some(a), Some(b)) = (prev, cur) {
                        sh.idle_bits
                            .store(idle_between(a, b).to_bits(), Ordering::Relaxed);
                    }
                    prev = cur;
                }
            });
        if let Ok(h) = spawned {
            let _ = shared.sampler.set(h.thread().clone());
        }
        Self { shared }
    }

    /// The process's one sampler (cpumond's 1 s period), started on first
    /// use: every ring of a process asks about the same host, so a guest
    /// with 255 disks runs one sampler thread, not 255.
    pub fn process_wide() -> Self {
        static LOAD: std::sync::OnceLock<HostLoad> = std::sync::OnceLock::new();
        LOAD.get_or_init(|| HostLoad::start(Duration::from_secs(1)))
            .clone()
    }

    /// A fixed view for tests and for disabling the gate: `idle_pct` is
    /// constant and the host is never contended.
    pub fn fixed(idle_pct: f32) -> Self {
        Self {
            shared: Arc::new(Shared {
                idle_bits: AtomicU32::new(idle_pct.to_bits()),
                pressure_bits: AtomicU32::new(0f32.to_bits()),
                pressured: AtomicBool::new(false),
                steal_bits: AtomicU32::new(0f32.to_bits()),
                cpus: 1,
                recheck_ns: u64::MAX,
                stop: AtomicBool::new(true),
                asked: AtomicBool::new(false),
                parked: AtomicBool::new(false),
                sampler: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Number of CPUs.
    pub fn cpus(&self) -> u32 {
        self.shared.cpus
    }

    /// Whether the sampler is running (it parks after [`PARK_AFTER`]
    /// without a question).
    pub fn sampling(&self) -> bool {
        !self.shared.parked.load(Ordering::Acquire)
    }

    /// CPU pressure over the last sample, in %.
    pub fn pressure_pct(&self) -> f32 {
        f32::from_bits(self.shared.pressure_bits.load(Ordering::Relaxed))
    }

    /// Steal over the last [`STEAL_WINDOW`], in %.
    pub fn steal_pct(&self) -> f32 {
        f32::from_bits(self.shared.steal_bits.load(Ordering::Relaxed))
    }

    /// Sets the pressure figure as one sample would (tests of the gate;
    /// no hold: the next call decides again).
    #[cfg(test)]
    fn set_pressure_pct(&self, pct: f32) {
        let sh = &self.shared;
        sh.pressure_bits.store(pct.to_bits(), Ordering::Relaxed);
        sh.pressured
            .store(pct >= PRESSURE_LIMIT_PCT, Ordering::Relaxed);
    }
}

impl HostLoad {
    /// Whether the calling thread waited for its CPU for at least
    /// [`CROWDED_PCT`] of the time between its last two looks (looks at
    /// most every 2 ms; the answer holds until the next look).
    fn crowded(&self, now_ns: u64) -> bool {
        let recheck = self.shared.recheck_ns;
        if recheck == u64::MAX {
            return false;
        }
        CROWD.with(|cell| {
            let mut cell = cell.borrow_mut();
            if let Some(c) = cell.as_mut() {
                let dt = now_ns.saturating_sub(c.at_ns);
                if dt < recheck {
                    return c.contended;
                }
                let Some(delay) = read_delay(&c.file) else {
                    return false;
                };
                c.contended = delay.saturating_sub(c.delay_ns) * 100 >= dt * CROWDED_PCT;
                c.at_ns = now_ns;
                c.delay_ns = delay;
                return c.contended;
            }
            // First look: no interval yet.
            let Ok(file) = std::fs::File::open("/proc/thread-self/schedstat") else {
                return false;
            };
            let Some(delay) = read_delay(&file) else {
                return false;
            };
            *cell = Some(CrowdCheck {
                file,
                at_ns: now_ns,
                delay_ns: delay,
                contended: false,
            });
            false
        })
    }
}

impl Drop for HostLoad {
    fn drop(&mut self) {
        if Arc::strong_count(&self.shared) == 1 {
            self.shared.stop.store(true, Ordering::Relaxed);
            if let Some(t) = self.shared.sampler.get() {
                t.unpark();
            }
        }
    }
}

impl LoadView for HostLoad {
    fn idle_pct(&self) -> f32 {
        self.shared.ask();
        f32::from_bits(self.shared.idle_bits.load(Ordering::Relaxed))
    }

    fn contended(&self, now_ns: u64) -> bool {
        let sh = &self.shared;
        sh.ask();
        if sh.pressured.load(Ordering::Relaxed) {
            return true;
        }
        self.crowded(now_ns)
    }

    fn steal_pct(&self) -> f32 {
        self.shared.ask();
        HostLoad::steal_pct(self)
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
                total: 1000,
                steal: 0,
            }
        );
        let d = CpuTimes {
            idle: 900,
            total: 1200,
            steal: 20,
        };
        assert_eq!(idle_between(c, d), 50.0);
        assert_eq!(steal_between(c, d), 10.0);
        assert_eq!(steal_between(c, c), 0.0);
        let stolen = parse_proc_stat("cpu  100 0 50 800 50 0 0 7 0 0\n").unwrap();
        assert_eq!(stolen.steal, 7);
        assert_eq!(idle_between(c, c), 0.0);
        assert!(parse_proc_stat("cpu 1 2\n").is_none());
        assert!(parse_proc_stat("nothing").is_none());
    }

    fn pin_to_cpu0() {
        let mut set = rustix::thread::CpuSet::new();
        set.set(0);
        rustix::thread::sched_setaffinity(None, &set).unwrap();
    }

    #[test]
    fn threads_sharing_a_cpu_see_each_other() {
        let h = HostLoad::start(Duration::from_secs(1));
        // Two threads spinning on one CPU take turns: each waits for the
        // CPU half the time.
        let seen = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
        let spinner = |h: HostLoad, me: usize| {
            let seen = seen.clone();
            std::thread::spawn(move || {
                pin_to_cpu0();
                // Both keep spinning until both have seen the other.
                let end = std::time::Instant::now() + Duration::from_secs(20);
                while std::time::Instant::now() < end
                    && !(seen[0].load(Ordering::Relaxed) && seen[1].load(Ordering::Relaxed))
                {
                    if h.crowded(crate::now_ns()) {
                        seen[me].store(true, Ordering::Relaxed);
                    }
                    std::hint::spin_loop();
                }
                seen[me].load(Ordering::Relaxed)
            })
        };
        let (a, b) = (spinner(h.clone(), 0), spinner(h.clone(), 1));
        assert!(a.join().unwrap(), "first spinner never saw the second");
        assert!(b.join().unwrap(), "second spinner never saw the first");
        let f = HostLoad::fixed(100.0);
        assert!(!f.contended(crate::now_ns()));
    }

    #[test]
    fn parses_schedstat() {
        assert_eq!(parse_schedstat_delay("690330 1234 2\n"), Some(1234));
        assert_eq!(parse_schedstat_delay("690330\n"), None);
    }

    #[test]
    fn parses_cpu_pressure() {
        let t = "some avg10=29.07 avg60=41.19 avg300=20.02 total=2878790535\n\
                 full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(parse_psi_some_total(t), Some(2_878_790_535));
        assert_eq!(parse_psi_some_total("full total=3\n"), None);
        assert_eq!(parse_psi_some_total("some total=x\n"), None);
    }

    #[test]
    fn pressure_makes_the_host_contended() {
        let f = HostLoad::fixed(100.0);
        assert!(!f.contended(crate::now_ns()));
        f.set_pressure_pct(PRESSURE_LIMIT_PCT - 1.0);
        assert!(!f.contended(crate::now_ns()));
        f.set_pressure_pct(PRESSURE_LIMIT_PCT);
        assert!(f.contended(crate::now_ns()));
    }

    #[test]
    fn the_sampler_parks_when_nobody_asks_and_wakes_on_a_question() {
        let h = HostLoad::start(Duration::from_millis(10));
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while h.sampling() {
            assert!(std::time::Instant::now() < end, "the sampler never parked");
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = h.contended(crate::now_ns());
        assert!(h.sampling(), "a question did not wake the sampler");
        // Questions keep it awake past the parking delay.
        let until = std::time::Instant::now() + PARK_AFTER + PARK_AFTER / 2;
        while std::time::Instant::now() < until {
            let _ = h.idle_pct();
            assert!(h.sampling());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn pressure_is_unknown_and_so_contended_until_the_first_sample() {
        let psi = cpu_stall_us().is_some();
        // The first sample comes a tenth of a second after the start.
        let h = HostLoad::start(Duration::from_secs(1));
        if psi {
            assert!(h.contended(crate::now_ns()));
        }
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
