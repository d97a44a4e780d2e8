//! The polling policies and the per-ring [`Poller`] that applies one.
//!
//! A consumer loop uses a poller like this:
//!
//! ```text
//! loop {
//!     if ring has work { handle it; poller.arrived(now, how, load); continue }
//!     match poller.idle(now, load) {
//!         Idle::Spin { until }    => spin on the ring (notifications suppressed) until work or `until`
//!         Idle::Block { wake_at } => final check (re-arm), then block on the event (and a timer at `wake_at`);
//!                                    on return call poller.woke(now, wake_at)
//!     }
//! }
//! ```
//!
//! All times are nanoseconds on one monotonic clock, so the policies can be
//! driven by a simulated clock in tests.

use crate::load::LoadView;
use crate::stats::PollStats;

/// Timer lateness assumed before any has been measured.
const DEFAULT_TIMER_LATE_NS: f64 = 30_000.0;

/// tapdisk3's rule (xapi defaults: `polling-duration` 1000 µs,
/// `polling-idle-threshold` 50 %).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tapdisk3Config {
    /// Poll this long after the last request; every hit slides the window.
    pub window_ns: u64,
    /// Enter polling only if the host's idle % is above this.
    pub idle_threshold_pct: f32,
}

impl Default for Tapdisk3Config {
    fn default() -> Self {
        Self {
            window_ns: 1_000_000,
            idle_threshold_pct: 50.0,
        }
    }
}

/// Settings of the adaptive policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveConfig {
    /// Latency an event-channel wake-up adds (the caller calibrates it; on
    /// this 2-vCPU VM a cross-CPU wake costs 25–45 µs).
    pub wake_cost_ns: u64,
    /// How long a spin through a whole expected gap may be, in wake-up
    /// costs: with 4 (the default) a consumer spins through gaps up to four
    /// wake-ups long — a disk I/O or a frontend's turnaround — and sleeps
    /// (with a timer before predicted arrivals) through longer ones.
    pub spin_per_saved: f64,
    /// Longest single spin before the policy looks again (and re-checks the
    /// host load).
    pub max_spin_slice_ns: u64,
    /// Margin added around predicted arrivals.
    pub slack_ns: u64,
    /// Do not arm a timer for a sleep shorter than this; spin instead.
    pub min_sleep_ns: u64,
    /// Weight of a new sample in the moving averages, as a shift (3: 1/8).
    pub ewma_shift: u32,
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        Self {
            wake_cost_ns: 30_000,
            spin_per_saved: 4.0,
            max_spin_slice_ns: 200_000,
            slack_ns: 2_000,
            min_sleep_ns: 15_000,
            ewma_shift: 3,
        }
    }
}

/// Which rule a poller follows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PollPolicy {
    /// Always block on the event channel.
    Off,
    /// Never block.
    Spin,
    /// tapdisk3's fixed sliding window gated on idle CPU.
    Tapdisk3(Tapdisk3Config),
    /// Learn the gap and the wake cost; spin, sleep-then-spin, or block.
    Adaptive(AdaptiveConfig),
}

impl PollPolicy {
    /// The policy's name as on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            PollPolicy::Off => "off",
            PollPolicy::Spin => "spin",
            PollPolicy::Tapdisk3(_) => "tapdisk3",
            PollPolicy::Adaptive(_) => "adaptive",
        }
    }
}

impl std::str::FromStr for PollPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(PollPolicy::Off),
            "spin" => Ok(PollPolicy::Spin),
            "tapdisk3" => Ok(PollPolicy::Tapdisk3(Tapdisk3Config::default())),
            "adaptive" => Ok(PollPolicy::Adaptive(AdaptiveConfig::default())),
            _ => Err(format!(
                "unknown polling policy {s:?} (expected off, spin, tapdisk3 or adaptive)"
            )),
        }
    }
}

/// What the consumer should do while it has no work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// Keep checking the ring, with notifications suppressed, until `until`;
    /// then ask again.
    Spin { until: u64 },
    /// Re-arm notifications, re-check, and block on the event channel; if
    /// `wake_at` is set, also wake at that time and ask again.
    Block { wake_at: Option<u64> },
}

/// How work was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pickup {
    /// Found by checking the ring without blocking (spinning, or the final
    /// check before blocking).
    Polled,
    /// Found after the event channel woke the consumer.
    Event,
    /// Found after a timer woke the consumer.
    Timer,
}

/// A moving average and mean deviation.
#[derive(Debug, Clone, Copy, Default)]
struct Ewma {
    mean: f64,
    dev: f64,
    n: u32,
}

impl Ewma {
    fn add(&mut self, x: f64, shift: u32) {
        if self.n == 0 {
            // Assume regularity until shown otherwise: a wrong guess costs
            // one short spin around the predicted time, then an event.
            self.mean = x;
            self.dev = 0.0;
        } else {
            let w = 1.0 / f64::from(1u32 << shift);
            let err = x - self.mean;
            self.mean += err * w;
            self.dev += (err.abs() - self.dev) * w;
        }
        self.n = self.n.saturating_add(1);
    }
}

/// Applies a [`PollPolicy`] to one ring.
#[derive(Debug, Clone)]
pub struct Poller {
    policy: PollPolicy,
    stats: PollStats,
    /// When the consumer last ran out of work.
    idle_since: Option<u64>,
    /// Start of the current spin episode.
    spin_start: Option<u64>,
    /// Learned idle gap before the next arrival.
    gap: Ewma,
    /// Consecutive gap samples far above the average (a changed workload
    /// once there are enough of them).
    outliers: u32,
    /// Learned lateness of timer wake-ups.
    timer_late: Ewma,
    /// tapdisk3: polling until this time.
    polling_until: Option<u64>,
    /// Adaptive: a timed sleep before a predicted arrival is pending.
    predicting: bool,
    /// Adaptive: predictions missed in a row.
    miss_streak: u32,
    /// Adaptive: arrivals to wait before predicting again.
    skip_predictions: u32,
    /// Adaptive: the deadline of the timer that last woke the consumer.
    last_deadline: Option<u64>,
}

impl Poller {
    /// A poller with nothing learned yet.
    pub fn new(policy: PollPolicy) -> Self {
        Self {
            policy,
            stats: PollStats::default(),
            idle_since: None,
            spin_start: None,
            gap: Ewma::default(),
            outliers: 0,
            timer_late: Ewma::default(),
            polling_until: None,
            predicting: false,
            miss_streak: 0,
            skip_predictions: 0,
            last_deadline: None,
        }
    }

    /// The policy.
    pub fn policy(&self) -> &PollPolicy {
        &self.policy
    }

    /// Counters so far.
    pub fn stats(&self) -> &PollStats {
        &self.stats
    }

    /// The learned idle gap (mean, mean deviation) in ns, for diagnostics.
    pub fn learned_gap(&self) -> (f64, f64) {
        (self.gap.mean, self.gap.dev)
    }

    fn end_spin(&mut self, now: u64, hit: bool) {
        if let Some(s) = self.spin_start.take() {
            self.stats.spin_ns += now.saturating_sub(s);
            if hit {
                self.stats.poll_hits += 1;
            } else {
                self.stats.poll_misses += 1;
            }
        }
    }

    fn spin(&mut self, now: u64, until: u64) -> Idle {
        if self.spin_start.is_none() {
            self.spin_start = Some(now);
            self.stats.polls += 1;
        }
        Idle::Spin { until }
    }

    fn block(&mut self, now: u64, wake_at: Option<u64>) -> Idle {
        self.end_spin(now, false);
        self.stats.blocks += 1;
        if wake_at.is_some() {
            self.stats.timed_blocks += 1;
        }
        Idle::Block { wake_at }
    }

    /// The consumer found work at `now`.
    pub fn arrived(&mut self, now: u64, how: Pickup, load: &dyn LoadView) {
        self.stats.arrivals += 1;
        match how {
            Pickup::Polled => self.end_spin(now, true),
            Pickup::Event | Pickup::Timer => {
                self.end_spin(now, false);
                self.stats.woken += 1;
            }
        }
        if let PollPolicy::Adaptive(_) = self.policy {
            // A request already waiting when the timer fired was predicted
            // late but still picked up cheaply: not a miss.
            self.score_prediction(how != Pickup::Event);
        }
        if let (PollPolicy::Adaptive(cfg), Some(since)) = (self.policy, self.idle_since) {
            let sample = match how {
                Pickup::Polled => now.saturating_sub(since),
                // The event's own wake-up delayed the pickup.
                Pickup::Event => now.saturating_sub(since).saturating_sub(cfg.wake_cost_ns),
                // It arrived before our deadline (else the timer would have
                // found nothing): learn the deadline, so the next prediction
                // comes earlier until it catches the arrival spinning.
                Pickup::Timer => self
                    .last_deadline
                    .map_or(now, |d| d.min(now))
                    .saturating_sub(since),
            };
            self.learn_gap(sample as f64, cfg);
        }
        self.last_deadline = None;
        self.idle_since = None;
        if let PollPolicy::Tapdisk3(cfg) = self.policy {
            // Every batch slides the window; entering polling needs idle CPU,
            // checked only when entering (td-blkif.c).
            if self.polling_until.is_some() || load.idle_pct() > cfg.idle_threshold_pct {
                self.polling_until = Some(now + cfg.window_ns);
            }
        }
    }

    fn learn_gap(&mut self, sample: f64, cfg: AdaptiveConfig) {
        // A gap far longer than usual is usually a pause (the guest went
        // idle), not a new rhythm: ignore it unless it keeps happening.
        let far = self.gap.n >= 2 && sample > (8.0 * self.gap.mean).max(1e6);
        if far {
            self.outliers += 1;
            if self.outliers < 3 {
                return;
            }
            self.gap = Ewma::default();
        }
        self.outliers = 0;
        self.gap.add(sample, cfg.ewma_shift);
    }

    /// The consumer woke from [`Idle::Block`] at `now`; `wake_at` is the
    /// timer it had asked for, if any.
    pub fn woke(&mut self, now: u64, wake_at: Option<u64>) {
        if let (Some(t), PollPolicy::Adaptive(cfg)) = (wake_at, self.policy) {
            if now >= t {
                self.timer_late
                    .add(now.saturating_sub(t) as f64, cfg.ewma_shift);
                self.last_deadline = Some(t);
            }
        }
    }

    /// The consumer has no work at `now`: spin or block?
    pub fn idle(&mut self, now: u64, load: &dyn LoadView) -> Idle {
        let since = *self.idle_since.get_or_insert(now);
        match self.policy {
            PollPolicy::Off => self.block(now, None),
            PollPolicy::Spin => self.spin(now, now + 1_000_000),
            PollPolicy::Tapdisk3(_) => match self.polling_until {
                Some(until) if now < until => self.spin(now, until),
                _ => {
                    self.polling_until = None;
                    self.block(now, None)
                }
            },
            PollPolicy::Adaptive(cfg) => self.adaptive(now, since, cfg, load),
        }
    }

    fn adaptive(&mut self, now: u64, since: u64, cfg: AdaptiveConfig, load: &dyn LoadView) -> Idle {
        if self.gap.n < 2 {
            return self.block(now, None);
        }
        let gap = self.gap.mean;
        let dev = self.gap.dev;
        let slack = cfg.slack_ns as f64;
        let wake = cfg.wake_cost_ns as f64;
        // Spinning through the whole expected gap pays when the host has a
        // CPU to spare and the spin is at most `spin_per_saved` wake-ups.
        let spin_pays = gap + 2.0 * dev + slack <= wake * cfg.spin_per_saved;
        // Around a predicted arrival, spin at most one wake-up's worth.
        // (On a host whose wake-ups cost less than two slacks, the slack.)
        let half = (2.0 * dev + slack).clamp(slack, (wake / 2.0).max(slack));
        let expect_end = if spin_pays {
            since + (gap + 2.0 * dev + slack) as u64
        } else {
            since + (gap + half) as u64
        };
        if now >= expect_end {
            // Missed (or the guest went quiet): never keep a core busy for
            // a stream that has stopped.
            return self.block(now, None);
        }
        let slice_end = expect_end.min(now + cfg.max_spin_slice_ns);
        // Spinning (now, or after a timer) takes a CPU that others may
        // need: look at the host only when about to do it.
        if load.contended(now) {
            self.stats.busy_refusals += 1;
            return self.block(now, None);
        }
        if spin_pays {
            return self.spin(now, slice_end);
        }
        if self.skip_predictions > 0 {
            return self.block(now, None);
        }
        // Long gap: sleep until just before the predicted arrival, early by
        // the timer's usual lateness plus one deviation (about its 75th
        // percentile: on a VM every sleep costs a wake-up's CPU, so one
        // sleep and a short spin beat a second, more precise sleep), then
        // spin briefly around the arrival.
        let late = if self.timer_late.n == 0 {
            DEFAULT_TIMER_LATE_NS
        } else {
            self.timer_late.mean + self.timer_late.dev
        };
        let wake_at = since + (gap - half - late).max(0.0) as u64;
        self.predicting = true;
        if wake_at <= now + cfg.min_sleep_ns {
            return self.spin(now, slice_end);
        }
        self.block(now, Some(wake_at))
    }

    /// Scores a prediction when its arrival comes: a hit sharpens nothing
    /// more (the precise sample already did), repeated misses back off.
    fn score_prediction(&mut self, hit: bool) {
        if !std::mem::take(&mut self.predicting) {
            if self.skip_predictions > 0 {
                self.skip_predictions -= 1;
            }
            return;
        }
        if hit {
            self.miss_streak = 0;
        } else {
            self.miss_streak = self.miss_streak.saturating_add(1);
            if self.miss_streak >= 3 {
                self.skip_predictions = 1u32 << (self.miss_streak - 3).min(6);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::HostLoad;

    /// A consumer loop under a simulated clock: requests arrive `gap` after
    /// the previous pickup (a queue-depth-1 frontend); an event wake-up takes
    /// `wake` ns and costs `wake_cpu` ns of CPU, a timer fires `late` ns after
    /// its deadline; a spinning consumer notices work in `spin_detect` ns.
    struct Sim {
        wake: u64,
        wake_cpu: u64,
        late: u64,
        spin_detect: u64,
    }

    struct Outcome {
        latency_p50: u64,
        cpu_per_req: f64,
    }

    impl Sim {
        fn run(
            &self,
            policy: PollPolicy,
            gap: u64,
            n: usize,
            load: &HostLoad,
        ) -> (Outcome, PollStats) {
            self.run_with(policy, &mut |_| gap, n, load)
        }

        fn run_with(
            &self,
            policy: PollPolicy,
            gaps: &mut dyn FnMut(usize) -> u64,
            n: usize,
            load: &HostLoad,
        ) -> (Outcome, PollStats) {
            let gap = gaps(0);
            let mut p = Poller::new(policy);
            let mut now = 0u64;
            let mut cpu = 0u64;
            let mut lat = Vec::with_capacity(n);
            let mut arrival = gap;
            for i in 0..n {
                // Idle until the request at `arrival` is picked up.
                loop {
                    match p.idle(now, load) {
                        Idle::Spin { until } => {
                            if arrival <= until {
                                let t = arrival.max(now) + self.spin_detect;
                                cpu += t - now;
                                now = t;
                                p.arrived(now, Pickup::Polled, load);
                                break;
                            }
                            cpu += until - now;
                            now = until;
                        }
                        Idle::Block { wake_at } => {
                            if arrival <= now {
                                // The final check before blocking finds it.
                                p.arrived(now, Pickup::Polled, load);
                                break;
                            }
                            let ev = arrival + self.wake;
                            let tm = wake_at.map(|w| w.max(now) + self.late);
                            cpu += self.wake_cpu;
                            match tm {
                                Some(t) if t < ev => {
                                    now = t;
                                    p.woke(now, wake_at);
                                    if arrival <= now {
                                        p.arrived(now, Pickup::Timer, load);
                                        break;
                                    }
                                }
                                _ => {
                                    now = ev;
                                    p.woke(now, None);
                                    p.arrived(now, Pickup::Event, load);
                                    break;
                                }
                            }
                        }
                    }
                }
                lat.push(now - arrival);
                arrival = now + gaps(i + 1);
            }
            lat.sort_unstable();
            let o = Outcome {
                latency_p50: lat[lat.len() / 2],
                cpu_per_req: cpu as f64 / n as f64,
            };
            (o, *p.stats())
        }
    }

    fn sim() -> Sim {
        // Wake-up latency and CPU as measured on this 2-vCPU VM
        // (shared/docs/perf-anchors.md §2.3: 25-45 µs one way, 10-27 µs of
        // CPU per event-driven request).
        Sim {
            wake: 40_000,
            wake_cpu: 10_000,
            late: 8_000,
            spin_detect: 300,
        }
    }

    #[test]
    fn a_host_with_cheap_wake_ups_does_not_trip_the_policy() {
        // A wake-up cost below two slacks (a same-CPU calibration) once
        // made the spin window's bounds cross and panic.
        let load = HostLoad::fixed(100.0);
        let cheap = Sim {
            wake: 1_500,
            wake_cpu: 1_000,
            late: 500,
            spin_detect: 300,
        };
        let cfg = AdaptiveConfig {
            wake_cost_ns: 1_500,
            ..AdaptiveConfig::default()
        };
        for gap in [1_000u64, 100_000, 5_000_000] {
            let (o, _) = cheap.run(PollPolicy::Adaptive(cfg), gap, 500, &load);
            assert!(o.latency_p50 > 0);
        }
    }

    #[test]
    fn off_always_blocks_and_spin_never_does() {
        let load = HostLoad::fixed(100.0);
        let (o, st) = sim().run(PollPolicy::Off, 100_000, 100, &load);
        assert_eq!(o.latency_p50, 40_000);
        assert_eq!(st.polls, 0);
        let (o, st) = sim().run(PollPolicy::Spin, 100_000, 100, &load);
        assert_eq!(o.latency_p50, 300);
        assert_eq!(st.blocks, 0);
    }

    #[test]
    fn adaptive_matches_the_better_of_off_and_spin_across_the_gap_sweep() {
        let load = HostLoad::fixed(100.0);
        let s = sim();
        for gap in [1_000u64, 10_000, 50_000, 200_000, 1_000_000, 5_000_000] {
            let (off, _) = s.run(PollPolicy::Off, gap, 3000, &load);
            let (spin, _) = s.run(PollPolicy::Spin, gap, 3000, &load);
            let (ad, st) = s.run(
                PollPolicy::Adaptive(AdaptiveConfig::default()),
                gap,
                3000,
                &load,
            );
            let best = off.latency_p50.min(spin.latency_p50);
            assert!(
                ad.latency_p50 as f64 <= 1.5 * best as f64,
                "gap {gap}: adaptive p50 {} vs best {best} ({st:?})",
                ad.latency_p50
            );
            // Where spinning through the gap is beyond the spin budget,
            // polling cannot pay: adaptive must stay close to off's CPU.
            if gap as f64 > s.wake as f64 * AdaptiveConfig::default().spin_per_saved {
                assert!(
                    ad.cpu_per_req <= 1.5 * off.cpu_per_req,
                    "gap {gap}: adaptive cpu {} vs off {} ({st:?})",
                    ad.cpu_per_req,
                    off.cpu_per_req
                );
            }
        }
    }

    #[test]
    fn tapdisk3_wastes_a_window_per_request_beyond_its_window() {
        let load = HostLoad::fixed(100.0);
        let td = PollPolicy::Tapdisk3(Tapdisk3Config::default());
        let (o, _) = sim().run(td, 200_000, 500, &load);
        assert!(
            o.latency_p50 < 1_000,
            "inside the window it catches requests"
        );
        let (o, st) = sim().run(td, 5_000_000, 200, &load);
        assert_eq!(
            o.latency_p50, 40_000,
            "beyond it, every request pays the wake-up"
        );
        assert!(o.cpu_per_req > 900_000.0, "and burns a window each time");
        assert!(st.poll_misses >= 199);
        // With the host busy, it never starts polling.
        let busy = HostLoad::fixed(10.0);
        let (o, st) = sim().run(td, 10_000, 200, &busy);
        assert_eq!((o.latency_p50, st.polls), (40_000, 0));
    }

    #[test]
    fn adaptive_stops_when_the_stream_stops() {
        let load = HostLoad::fixed(100.0);
        let mut p = Poller::new(PollPolicy::Adaptive(AdaptiveConfig::default()));
        let mut now = 0;
        for _ in 0..50 {
            now += 5_000;
            assert!(matches!(
                p.idle(now, &load),
                Idle::Spin { .. } | Idle::Block { .. }
            ));
            now += 5_000;
            p.arrived(now, Pickup::Polled, &load);
        }
        // The guest goes quiet: after the expected gap has passed the poller
        // blocks without a timer, and keeps doing so.
        now += 1_000;
        let quiet_from = now;
        let mut spun_until = now;
        loop {
            match p.idle(now, &load) {
                Idle::Spin { until } => {
                    spun_until = until;
                    now = until;
                }
                Idle::Block { wake_at } => {
                    assert_eq!(wake_at, None);
                    break;
                }
            }
        }
        assert!(
            spun_until - quiet_from < 100_000,
            "spun far past the expected gap"
        );
        for t in [1_000_000, 50_000_000, 5_000_000_000u64] {
            assert_eq!(p.idle(now + t, &load), Idle::Block { wake_at: None });
        }
    }

    #[test]
    fn adaptive_yields_when_tasks_wait_for_a_cpu() {
        struct Contended;
        impl LoadView for Contended {
            fn idle_pct(&self) -> f32 {
                100.0
            }
            fn contended(&self, _now: u64) -> bool {
                true
            }
        }
        let mut p = Poller::new(PollPolicy::Adaptive(AdaptiveConfig::default()));
        let mut now = 0;
        for _ in 0..20 {
            let _ = p.idle(now, &Contended);
            now += 1_000;
            p.arrived(now, Pickup::Polled, &Contended);
        }
        assert_eq!(p.idle(now + 10, &Contended), Idle::Block { wake_at: None });
        assert!(p.stats().busy_refusals >= 1);
    }

    #[test]
    fn an_idle_pause_does_not_unlearn_the_rhythm() {
        let load = HostLoad::fixed(100.0);
        let mut p = Poller::new(PollPolicy::Adaptive(AdaptiveConfig::default()));
        let mut now = 0;
        for _ in 0..30 {
            let _ = p.idle(now, &load);
            now += 8_000;
            p.arrived(now, Pickup::Polled, &load);
        }
        let (g, _) = p.learned_gap();
        // One long pause...
        let _ = p.idle(now, &load);
        now += 3_000_000_000;
        p.arrived(now, Pickup::Event, &load);
        assert!((p.learned_gap().0 - g).abs() < 1.0);
        // ...but a new, steady rhythm is adopted.
        for _ in 0..40 {
            let _ = p.idle(now, &load);
            now += 2_000_000;
            p.arrived(now, Pickup::Timer, &load);
        }
        assert!(p.learned_gap().0 > 1_000_000.0);
    }

    proptest::proptest! {
        /// Whatever the arrival pattern, adaptive is never worse than off in
        /// median latency, and its CPU stays within a bounded factor of off's.
        #[test]
        fn adaptive_does_no_harm_on_irregular_arrivals(seed: u64, spread in 1u64..10_000) {
            let load = HostLoad::fixed(100.0);
            let mut x = seed | 1;
            let mut gaps = |_i: usize| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                1_000 + (x % (spread * 1_000))
            };
            let s = sim();
            let (ad, st) = s.run_with(PollPolicy::Adaptive(AdaptiveConfig::default()), &mut gaps, 400, &load);
            let (off, _) = s.run(PollPolicy::Off, 1_000, 400, &load);
            proptest::prop_assert!(ad.latency_p50 <= off.latency_p50, "{st:?}");
            proptest::prop_assert!(
                ad.cpu_per_req <= 2.0 * off.cpu_per_req + s.wake as f64,
                "cpu {} vs off {} ({st:?})", ad.cpu_per_req, off.cpu_per_req
            );
        }
    }

    #[test]
    fn policies_parse() {
        assert_eq!("off".parse::<PollPolicy>().unwrap(), PollPolicy::Off);
        assert_eq!("adaptive".parse::<PollPolicy>().unwrap().name(), "adaptive");
        assert!("sometimes".parse::<PollPolicy>().is_err());
    }
}
