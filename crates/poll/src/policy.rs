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
//! After handling what it found, the consumer says how many items (requests,
//! responses, completions) that was with `poller.served(n)`: a pickup that
//! serves a batch of 32 responses saves the wake-up's latency for each of
//! them, so the adaptive policy may spin 32 times as long for it.
//!
//! All times are nanoseconds on one monotonic clock, so the policies can be
//! driven by a simulated clock in tests.

use crate::load::LoadView;
use crate::stats::PollStats;

/// Timer lateness assumed before any has been measured.
const DEFAULT_TIMER_LATE_NS: f64 = 30_000.0;

/// Steal (the share of the CPUs' time the hypervisor took from this
/// machine, [`LoadView::steal_pct`]) at which a consumer waiting on more
/// than one item in flight stops spinning. On a VM whose virtual disk is
/// emulated on the physical CPUs its vCPUs run on, a spinning vCPU takes
/// the CPU the disk needs: measured on a 2-vCPU KVM guest at queue depth
/// 32, fio alone showed 0% steal, pvio with both ends blocking 4.6%, with
/// both ends spinning 28% and 10% fewer IOPS. A host whose spare CPUs let
/// spinning cost nothing shows none, and keeps the spin for a batch.
pub const STEAL_LIMIT_PCT: f32 = 10.0;

/// How long a consumer stands back from spinning with several items in
/// flight once steal reached [`STEAL_LIMIT_PCT`] (the steal its spinning
/// caused goes when it stops, so the figure cannot say when to resume).
/// Doubles, up to [`STEAL_HOLD_MAX_NS`], when steal is back within two
/// holds of trying again.
const STEAL_HOLD_NS: u64 = 500_000_000;
const STEAL_HOLD_MAX_NS: u64 = 8_000_000_000;

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
    /// How much CPU a spin may cost per request, in wake-up costs (the
    /// latency a caught arrival saves each request it brings): with 4 (the
    /// default) a consumer spins through gaps up to four wake-ups long per
    /// request an arrival brings — a disk I/O or a frontend's turnaround at
    /// queue depth 1, the batch of 32 responses a disk completes at once at
    /// queue depth 32 — and sleeps (with a timer before predicted arrivals)
    /// through longer ones.
    pub spin_per_saved: f64,
    /// Longest single spin before the policy looks again (and re-checks the
    /// host load).
    pub max_spin_slice_ns: u64,
    /// Margin added around predicted arrivals.
    pub slack_ns: u64,
    /// Do not arm a timer for a sleep shorter than this; spin instead.
    pub min_sleep_ns: u64,
    /// Weight of a new sample in the moving average of the batch an arrival
    /// brings, as a shift (3: 1/8). (Gaps and timer lateness are medians
    /// of recent samples instead.)
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

/// Samples kept by [`Recent`].
const RECENT: usize = 16;

/// The last [`RECENT`] samples of a quantity and their quartiles. Medians
/// and quartiles shrug off the odd pause, hiccup or late timer that pulls a
/// moving average (and so every prediction after it) off the mark, and they
/// follow a new rhythm once it holds for half the window. The samples are
/// also kept in order, updated on every add (one removal and one insertion
/// in 16 slots), so reading a quartile costs nothing: sorting the window
/// when the poller next looked put ~0.2 µs between running out of work and
/// spinning, and an arrival 1 µs later waited for it.
#[derive(Debug, Clone, Copy)]
struct Recent {
    samples: [f64; RECENT],
    sorted: [f64; RECENT],
    len: usize,
    next: usize,
}

impl Default for Recent {
    fn default() -> Self {
        Self {
            samples: [0.0; RECENT],
            sorted: [0.0; RECENT],
            len: 0,
            next: 0,
        }
    }
}

impl Recent {
    fn add(&mut self, x: f64) {
        if self.len == RECENT {
            let old = self.samples[self.next];
            let live = &mut self.sorted[..self.len];
            // The evicted sample is in the ordered copy (it was inserted
            // there when added).
            let i = live
                .iter()
                .position(|v| v.total_cmp(&old).is_eq())
                .unwrap_or(RECENT - 1);
            live.copy_within(i + 1.., i);
            self.len -= 1;
        }
        self.samples[self.next] = x;
        self.next = (self.next + 1) % RECENT;
        let at = self.sorted[..self.len].partition_point(|v| v.total_cmp(&x).is_lt());
        self.sorted.copy_within(at..self.len, at + 1);
        self.sorted[at] = x;
        self.len += 1;
    }

    fn quartiles(&self) -> [f64; 3] {
        if self.len == 0 {
            return [0.0; 3];
        }
        let s = &self.sorted[..self.len];
        let at = |f: usize| s[(s.len() - 1) * f / 4];
        [at(1), at(2), at(3)]
    }

    fn median(&self) -> f64 {
        self.quartiles()[1]
    }

    /// Half the interquartile range (about two thirds of a standard
    /// deviation).
    fn spread(&self) -> f64 {
        let q = self.quartiles();
        (q[2] - q[0]) / 2.0
    }

    fn p75(&self) -> f64 {
        self.quartiles()[2]
    }
}

/// A pickup not yet learned from (learning waits for the next idle turn,
/// so the pickup path stays short).
#[derive(Debug, Clone, Copy)]
struct PendingPickup {
    how: Pickup,
    /// When the consumer had run out of work, and when it found more.
    since: u64,
    at: u64,
    /// The deadline of the timer that woke the consumer, if one did.
    deadline: Option<u64>,
    /// The last look at the ring that found nothing before the consumer
    /// blocked: the arrival came after it.
    blocked_at: Option<u64>,
    /// The policy meant to catch this arrival by polling (a spin through
    /// the gap, or a timed sleep and a spin around the predicted time).
    expected: bool,
    /// ...and it was a timed prediction.
    timed: bool,
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
    /// Idle gaps before recent arrivals.
    gap: Recent,
    /// Learned number of items an arrival brings.
    batch: Ewma,
    /// Items served since the last arrival.
    served: u64,
    /// The last pickup, until it is learned from.
    pending: Option<PendingPickup>,
    /// Lateness of recent timer wake-ups.
    timer_late: Recent,
    /// tapdisk3: polling until this time.
    polling_until: Option<u64>,
    /// Adaptive: this idle turn is meant to catch the arrival polling.
    expecting: bool,
    /// Adaptive: ...with a timed sleep first.
    timed: bool,
    /// Adaptive: when the consumer last blocked.
    blocked_at: Option<u64>,
    /// Adaptive: timed predictions missed in a row.
    miss_streak: u32,
    /// Adaptive: arrivals to wait before predicting again.
    skip_predictions: u32,
    /// Adaptive: how much wider than the learned spread to poll around an
    /// expected arrival. It grows by a step with every miss and decays with
    /// every catch, so a host whose timers suddenly run later (on this VM
    /// the lateness of a 5 ms sleep moves between ~40 and ~140 µs), or a
    /// rhythm a wrong wake-up estimate hid, is caught up with in a few
    /// requests.
    margin_ns: f64,
    /// Adaptive: the deadline of the timer that last woke the consumer.
    last_deadline: Option<u64>,
    /// The spinning consumer's last look at the ring.
    last_look: Option<u64>,
    /// Items the consumer waits on (requests or I/O in flight), as it last
    /// said with [`Poller::in_flight`].
    in_flight: usize,
    /// Adaptive: until when it stands back from spinning with several items
    /// in flight (steal reached the limit), and how long that lasts.
    stolen_until: Option<u64>,
    steal_hold_ns: u64,
}

impl Poller {
    /// A poller with nothing learned yet.
    pub fn new(policy: PollPolicy) -> Self {
        Self {
            policy,
            stats: PollStats::default(),
            idle_since: None,
            spin_start: None,
            gap: Recent::default(),
            batch: Ewma::default(),
            served: 0,
            pending: None,
            timer_late: Recent::default(),
            polling_until: None,
            expecting: false,
            timed: false,
            blocked_at: None,
            miss_streak: 0,
            skip_predictions: 0,
            margin_ns: 0.0,
            last_deadline: None,
            last_look: None,
            in_flight: 1,
            stolen_until: None,
            steal_hold_ns: STEAL_HOLD_NS,
        }
    }

    /// The consumer is about to wait on `n` items in flight (I/O it
    /// submitted, requests it sent). Spinning for one of several pays only
    /// where spinning is free: on a host that takes CPU from this machine
    /// for the disk (see [`STEAL_LIMIT_PCT`]), the disk still has the others
    /// to work on, and the CPU the spin takes slows it more than the pickup
    /// gains.
    pub fn in_flight(&mut self, n: usize) {
        self.in_flight = n;
    }

    /// Whether the poller stands back from spinning with several items in
    /// flight at `now` because the hypervisor took time from this machine.
    pub fn standing_back(&self, now: u64) -> bool {
        self.stolen_until.is_some_and(|t| now < t)
    }

    /// Steal has reached the limit at `now`: stand back for a hold, a
    /// longer one if the last ended only just before.
    fn stand_back(&mut self, now: u64) {
        self.steal_hold_ns = match self.stolen_until {
            Some(t) if now < t.saturating_add(2 * self.steal_hold_ns) => {
                (self.steal_hold_ns * 2).min(STEAL_HOLD_MAX_NS)
            }
            _ => STEAL_HOLD_NS,
        };
        self.stolen_until = Some(now + self.steal_hold_ns);
    }

    /// The policy.
    pub fn policy(&self) -> &PollPolicy {
        &self.policy
    }

    /// Counters so far.
    pub fn stats(&self) -> &PollStats {
        &self.stats
    }

    /// The learned idle gap (median, half the interquartile range) in ns,
    /// for diagnostics.
    pub fn learned_gap(&self) -> (f64, f64) {
        (self.gap.median(), self.gap.spread())
    }

    /// The learned number of items an arrival brings, for diagnostics.
    pub fn learned_batch(&self) -> f64 {
        self.batch.mean.max(1.0)
    }

    /// The consumer handled `n` items (requests, responses, completions)
    /// since it last found work; counted towards that arrival's batch.
    pub fn served(&mut self, n: usize) {
        self.served = self.served.saturating_add(n as u64);
    }

    /// The spinning consumer looked at the ring at `now` (call it on every
    /// turn of the spin loop): a long stretch since the last look is time
    /// the spinner lost.
    #[inline]
    pub fn looked(&mut self, now: u64) {
        if let Some(prev) = self.last_look.replace(now) {
            let d = now.saturating_sub(prev);
            if d > crate::LOST_GAP_NS {
                self.stats.lost_ns += d;
                self.stats.lost_gaps += 1;
            }
        }
    }

    fn end_spin(&mut self, now: u64, hit: bool) {
        self.last_look = None;
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
        self.blocked_at = Some(now);
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
        if let (PollPolicy::Adaptive(_), Some(since)) = (self.policy, self.idle_since) {
            self.pending = Some(PendingPickup {
                how,
                since,
                at: now,
                deadline: self.last_deadline,
                blocked_at: self.blocked_at,
                expected: self.expecting,
                timed: self.timed,
            });
        }
        self.expecting = false;
        self.timed = false;
        self.blocked_at = None;
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

    /// The latency an event's wake-up adds: the cost of waking a sleeping
    /// CPU, which grows with how long it slept (on this VM ~20 µs after
    /// 100 µs, ~100 µs after 5 ms) as a timer's lateness does, so the
    /// lateness measured for sleeps like this one is the better estimate
    /// once there is one.
    fn event_latency(&mut self, cfg: &AdaptiveConfig) -> f64 {
        let calibrated = cfg.wake_cost_ns as f64;
        if self.timer_late.len == 0 {
            calibrated
        } else {
            self.timer_late.median().max(calibrated)
        }
    }

    /// Learns from a pickup: the idle gap, and whether polling caught what
    /// it meant to. Only a polled pickup times the arrival exactly; an
    /// event's was delayed by the wake-up; a timer that found work was not
    /// beaten by the arrival's event, so it came within that delay before
    /// the pickup (take the middle). Either came after the consumer last
    /// looked and found nothing.
    fn learn(&mut self, p: PendingPickup, cfg: AdaptiveConfig) {
        let waited = p.at.saturating_sub(p.since) as f64;
        let wake = self.event_latency(&cfg);
        let after = |t: Option<u64>| t.map_or(0.0, |t| t.saturating_sub(p.since) as f64);
        let looked = after(p.blocked_at).min(waited);
        let sample = match p.how {
            Pickup::Polled => waited,
            Pickup::Event => (waited - wake).max(looked),
            Pickup::Timer => (waited - wake / 2.0)
                .max(looked)
                .max(after(p.deadline).min(waited)),
        };
        if p.expected {
            let slack = cfg.slack_ns as f64;
            let spread = if p.timed {
                self.timer_late.spread()
            } else {
                self.gap.spread()
            };
            let step = spread.max(slack).max(self.gap.median() / 8.0);
            match p.how {
                Pickup::Polled => {
                    self.margin_ns -= self.margin_ns / 4.0;
                    if p.timed {
                        self.miss_streak = 0;
                    }
                }
                // Late, but picked up without an event's wake-up.
                Pickup::Timer => self.margin_ns = (self.margin_ns + step / 2.0).min(wake),
                Pickup::Event => {
                    self.margin_ns = (self.margin_ns + step).min(wake);
                    if p.timed {
                        // Arrivals this irregular: stop paying for timers
                        // for a while (longer after every further miss).
                        self.miss_streak = self.miss_streak.saturating_add(1);
                        if self.miss_streak >= 3 {
                            self.skip_predictions = 1u32 << (self.miss_streak - 3).min(6);
                        }
                    }
                }
            }
        } else if self.skip_predictions > 0 {
            self.skip_predictions -= 1;
        }
        self.gap.add(sample);
    }

    /// The consumer woke from [`Idle::Block`] at `now`; `wake_at` is the
    /// timer it had asked for, if any.
    pub fn woke(&mut self, now: u64, wake_at: Option<u64>) {
        if let (Some(t), PollPolicy::Adaptive(_)) = (wake_at, self.policy) {
            if now >= t {
                self.timer_late.add(now.saturating_sub(t) as f64);
                self.last_deadline = Some(t);
            }
        }
    }

    /// The consumer has no work at `now`: spin or block?
    pub fn idle(&mut self, now: u64, load: &dyn LoadView) -> Idle {
        if self.idle_since.is_none() {
            if let (Some(p), PollPolicy::Adaptive(cfg)) = (self.pending.take(), self.policy) {
                self.learn(p, cfg);
            }
            // Out of work after an arrival: what it brought is one sample.
            let n = std::mem::take(&mut self.served);
            if n > 0 {
                if let PollPolicy::Adaptive(cfg) = self.policy {
                    self.batch.add(n as f64, cfg.ewma_shift);
                }
            }
        }
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
        if self.gap.len < 2 {
            return self.block(now, None);
        }
        let gap = self.gap.median();
        let dev = self.gap.spread();
        let slack = cfg.slack_ns as f64;
        let wake = cfg.wake_cost_ns as f64;
        let margin = self.margin_ns;
        // Spinning through the whole expected gap pays when the host has a
        // CPU to spare and the spin costs each request the arrival brings
        // at most `spin_per_saved` wake-ups.
        let width = 2.0 * dev + slack + margin;
        let budget = wake * cfg.spin_per_saved * self.learned_batch();
        let spin_pays = gap + width <= budget;
        // Around a predicted arrival, spin about one wake-up's worth (on a
        // host whose wake-ups cost less than two slacks, the slack), wider
        // while arrivals keep being missed.
        let half = (2.0 * dev + slack).clamp(slack, (wake / 2.0).max(slack)) + margin;
        let expect_end = if spin_pays {
            // The whole budget: a late arrival (a disk's slow request) is
            // as worth catching as a punctual one.
            since + budget as u64
        } else {
            since + (gap + half) as u64
        };
        if now >= expect_end {
            // Missed (or the guest went quiet): never keep a core busy for
            // a stream that has stopped.
            return self.block(now, None);
        }
        let slice_end = expect_end.min(now + cfg.max_spin_slice_ns);
        // A rhythm whose quartiles lie further apart than a wake-up and a
        // quarter of the gap (Poisson arrivals: 1.1 gaps apart) cannot be
        // predicted: a timed sleep would mostly wake for nothing. (Against
        // the gap too: at 5 ms, gaps learned from events scatter by tens
        // of µs, and that rhythm is still worth a timer.)
        if !spin_pays && (self.skip_predictions > 0 || 2.0 * dev > wake.max(gap / 4.0)) {
            return self.block(now, None);
        }
        // Spinning (now, or after a timer) takes a CPU that others may
        // need: look at the host only when about to do it.
        if load.contended(now) {
            self.stats.busy_refusals += 1;
            return self.block(now, None);
        }
        // With several items in flight the disk has work while we sleep:
        // spinning for one pays only where it takes no CPU the disk needs.
        if self.in_flight > 1 {
            if !self.standing_back(now) && load.steal_pct() >= STEAL_LIMIT_PCT {
                self.stand_back(now);
            }
            if self.standing_back(now) {
                self.stats.steal_refusals += 1;
                return self.block(now, None);
            }
        }
        if spin_pays {
            self.expecting = true;
            return self.spin(now, slice_end);
        }
        // Long gap: sleep until just before the predicted arrival, early by
        // the 75th percentile of the timer's lateness (on a VM every sleep
        // costs a wake-up's CPU, so one sleep and a short spin beat a
        // second, more precise sleep), then spin briefly around the arrival.
        let late = if self.timer_late.len == 0 {
            DEFAULT_TIMER_LATE_NS
        } else {
            self.timer_late.p75()
        };
        let wake_at = since + (gap - half - late).max(0.0) as u64;
        self.expecting = true;
        self.timed = true;
        if wake_at <= now + cfg.min_sleep_ns {
            return self.spin(now, slice_end);
        }
        self.block(now, Some(wake_at))
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
        /// Items each arrival brings (responses a disk completes at once).
        batch: usize,
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
                p.served(self.batch);
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
            batch: 1,
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
            batch: 1,
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
    fn adaptive_spins_longer_for_arrivals_that_bring_many_requests() {
        // A disk at queue depth 32 completing its requests in bursts every
        // 450 µs: one event per burst costs every request in it the
        // wake-up, so the spin's CPU per request (450 / 32 µs) pays...
        let load = HostLoad::fixed(100.0);
        let burst = Sim { batch: 32, ..sim() };
        let ad = PollPolicy::Adaptive(AdaptiveConfig::default());
        let (o, st) = burst.run(ad, 450_000, 2000, &load);
        assert!(o.latency_p50 < 1_000, "bursts picked up late ({st:?})");
        assert!(st.poll_hits > 1900, "{st:?}");
        assert!(o.cpu_per_req > 400_000.0, "did not spin through ({st:?})");
        // ...where for single requests it would not: it sleeps until just
        // before the predicted arrival instead.
        let (o, st) = sim().run(ad, 450_000, 2000, &load);
        assert!(
            o.cpu_per_req < 100_000.0,
            "spun through single requests ({st:?})"
        );
        assert!(st.timed_blocks > 1000, "{st:?}");
    }

    #[test]
    fn adaptive_finds_a_rhythm_a_wrong_wake_up_estimate_hides() {
        // The calibration said 30 µs, but a backend that just went to sleep
        // wakes in 8: every event pickup looks like a gap of ~0, the spin
        // window shrinks to the slack and keeps missing the 10 µs gap —
        // unless misses widen it.
        let load = HostLoad::fixed(100.0);
        let fast = Sim {
            wake: 8_000,
            ..sim()
        };
        let ad = PollPolicy::Adaptive(AdaptiveConfig {
            wake_cost_ns: 30_000,
            ..AdaptiveConfig::default()
        });
        let (o, st) = fast.run(ad, 10_000, 2000, &load);
        assert!(o.latency_p50 < 1_000, "stuck on events ({st:?})");
    }

    #[test]
    fn adaptive_follows_timers_that_turn_late() {
        // Long gaps are caught by a timed sleep and a short spin; when the
        // host's timers start firing 100 µs late instead of 8, predictions
        // must move earlier, not give up.
        let load = HostLoad::fixed(100.0);
        let ad = PollPolicy::Adaptive(AdaptiveConfig::default());
        let mut p = Poller::new(ad);
        let mut now = 0u64;
        let mut caught_late_phase = 0;
        for i in 0..400 {
            let late = if i < 100 { 8_000 } else { 100_000 };
            let arrival = now + 2_000_000;
            loop {
                match p.idle(now, &load) {
                    Idle::Spin { until } => {
                        if arrival <= until {
                            now = arrival.max(now) + 300;
                            p.arrived(now, Pickup::Polled, &load);
                            caught_late_phase += usize::from(i >= 200);
                            break;
                        }
                        now = until;
                    }
                    Idle::Block { wake_at } => {
                        let ev = arrival + 100_000;
                        match wake_at.map(|w| w.max(now) + late) {
                            Some(t) if t < ev => {
                                now = t;
                                p.woke(now, wake_at);
                                if arrival <= now {
                                    p.arrived(now, Pickup::Timer, &load);
                                    break;
                                }
                            }
                            _ => {
                                now = ev;
                                p.woke(now, wake_at);
                                p.arrived(now, Pickup::Event, &load);
                                break;
                            }
                        }
                    }
                }
            }
        }
        assert!(
            caught_late_phase > 150,
            "caught {caught_late_phase} of 200 ({:?})",
            p.stats()
        );
    }

    #[test]
    fn adaptive_does_not_predict_what_has_no_rhythm() {
        // Poisson arrivals of mean 1 ms: no timer could catch them, so the
        // poller must cost no more than off.
        let load = HostLoad::fixed(100.0);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut gaps = |_i: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = ((x >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
            (-u.ln() * 1_000_000.0) as u64
        };
        let s = sim();
        let ad = PollPolicy::Adaptive(AdaptiveConfig::default());
        let (o, st) = s.run_with(ad, &mut gaps, 2000, &load);
        let (off, _) = s.run(PollPolicy::Off, 1_000_000, 2000, &load);
        assert!(
            o.cpu_per_req <= 1.2 * off.cpu_per_req,
            "cpu {} vs off {} ({st:?})",
            o.cpu_per_req,
            off.cpu_per_req
        );
        // A timer or two while the first gaps are learned, then none (the
        // back-off after misses alone would still set ~50).
        assert!(st.timed_blocks < 5, "{st:?}");
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
        // At most the spin budget (four wake-ups) past the last arrival.
        let cfg = AdaptiveConfig::default();
        assert!(
            spun_until - quiet_from <= (cfg.spin_per_saved * cfg.wake_cost_ns as f64) as u64,
            "spun past the spin budget"
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
    fn recent_keeps_the_quartiles_of_the_last_samples() {
        let mut r = Recent::default();
        let mut x = 12345u64;
        let mut all = Vec::new();
        for n in 0..200 {
            // A few repeats and a wide range, as gaps have.
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let v = if n % 7 == 0 {
                5.0
            } else {
                ((x >> 33) % 1000) as f64
            };
            r.add(v);
            all.push(v);
            let mut w: Vec<f64> = all[all.len().saturating_sub(RECENT)..].to_vec();
            w.sort_unstable_by(f64::total_cmp);
            let at = |f: usize| w[(w.len() - 1) * f / 4];
            assert_eq!(
                r.quartiles(),
                [at(1), at(2), at(3)],
                "after {} samples",
                n + 1
            );
        }
    }

    /// A load view whose steal is set by the test.
    struct Stealing(std::cell::Cell<f32>);

    impl LoadView for Stealing {
        fn idle_pct(&self) -> f32 {
            100.0
        }
        fn contended(&self, _now: u64) -> bool {
            false
        }
        fn steal_pct(&self) -> f32 {
            self.0.get()
        }
    }

    /// A poller that learned arrivals 1 µs apart (it spins for them).
    fn trained(load: &dyn LoadView) -> (Poller, u64) {
        let mut p = Poller::new(PollPolicy::Adaptive(AdaptiveConfig::default()));
        let mut now = 0;
        for _ in 0..20 {
            let _ = p.idle(now, load);
            now += 1_000;
            p.arrived(now, Pickup::Polled, load);
        }
        (p, now)
    }

    #[test]
    fn steal_stops_spinning_only_for_one_of_several_in_flight() {
        let load = Stealing(std::cell::Cell::new(30.0));
        let (mut p, now) = trained(&load);
        // One item in flight: the disk idles until it is picked up, so the
        // spin pays even on a host that takes CPU from this machine.
        p.in_flight(1);
        assert!(matches!(p.idle(now + 10, &load), Idle::Spin { .. }));
        p.arrived(now + 20, Pickup::Polled, &load);
        // Several: the disk has the others to work on.
        p.in_flight(32);
        assert_eq!(p.idle(now + 30, &load), Idle::Block { wake_at: None });
        assert_eq!(p.stats().steal_refusals, 1);
        assert!(p.standing_back(now + 30));
    }

    #[test]
    fn without_steal_a_batch_is_still_spun_for() {
        let load = Stealing(std::cell::Cell::new(STEAL_LIMIT_PCT - 1.0));
        let (mut p, now) = trained(&load);
        p.in_flight(32);
        assert!(matches!(p.idle(now + 10, &load), Idle::Spin { .. }));
        assert_eq!(p.stats().steal_refusals, 0);
    }

    #[test]
    fn standing_back_holds_then_retries_and_holds_longer_if_steal_is_back() {
        let load = Stealing(std::cell::Cell::new(30.0));
        let (mut p, mut now) = trained(&load);
        p.in_flight(32);
        let wait = |p: &mut Poller, now: &mut u64, load: &Stealing| {
            let idle = p.idle(*now, load);
            *now += 1_000;
            p.arrived(*now, Pickup::Event, load);
            idle
        };
        assert!(matches!(wait(&mut p, &mut now, &load), Idle::Block { .. }));
        // Blocking ends the steal it caused; the hold still stands.
        load.0.set(0.0);
        now += STEAL_HOLD_NS / 2;
        assert!(matches!(wait(&mut p, &mut now, &load), Idle::Block { .. }));
        // After the hold it spins again...
        now += STEAL_HOLD_NS;
        assert!(!p.standing_back(now));
        assert!(matches!(wait(&mut p, &mut now, &load), Idle::Spin { .. }));
        // ...and steal coming back at once doubles the next hold.
        load.0.set(30.0);
        let from = now;
        assert!(matches!(wait(&mut p, &mut now, &load), Idle::Block { .. }));
        load.0.set(0.0);
        assert!(p.standing_back(from + STEAL_HOLD_NS + STEAL_HOLD_NS / 2));
        assert!(!p.standing_back(from + 2 * STEAL_HOLD_NS + 2_000));
        // Steal seen again long after a hold ended starts from the first.
        now = from + 20 * STEAL_HOLD_NS;
        load.0.set(30.0);
        let from = now;
        assert!(matches!(wait(&mut p, &mut now, &load), Idle::Block { .. }));
        assert!(!p.standing_back(from + STEAL_HOLD_NS + 2_000));
    }

    #[test]
    fn stretches_a_spinner_did_not_run_count_as_lost() {
        let load = HostLoad::fixed(100.0);
        let (mut p, now) = trained(&load);
        let Idle::Spin { .. } = p.idle(now, &load) else {
            panic!("a trained poller spins");
        };
        let mut t = now;
        for step in [
            100,
            200,
            crate::LOST_GAP_NS + 1,
            300,
            5 * crate::LOST_GAP_NS,
        ] {
            t += step;
            p.looked(t);
        }
        p.arrived(t, Pickup::Polled, &load);
        assert_eq!(p.stats().lost_gaps, 2);
        assert_eq!(p.stats().lost_ns, 6 * crate::LOST_GAP_NS + 1);
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
        let _ = p.idle(now, &load);
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
