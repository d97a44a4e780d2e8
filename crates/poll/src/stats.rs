//! Counters a poller keeps, exported with the device's metrics.

/// What a poller did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PollStats {
    /// Work found after an idle period.
    pub arrivals: u64,
    /// ... of which found while spinning.
    pub poll_hits: u64,
    /// ... of which found after a wake-up (event or timer).
    pub woken: u64,
    /// Spin episodes that ended without work.
    pub poll_misses: u64,
    /// Spin episodes started.
    pub polls: u64,
    /// Times the consumer blocked.
    pub blocks: u64,
    /// ... of which with a timer to wake before the predicted arrival.
    pub timed_blocks: u64,
    /// Wall time spent spinning, in ns (CPU time when the spinner runs alone).
    pub spin_ns: u64,
    /// Spins refused because other tasks were waiting for a CPU.
    pub busy_refusals: u64,
    /// Of `spin_ns`, the time the spinning thread did not run: stretches
    /// between two looks at the ring longer than [`crate::LOST_GAP_NS`]
    /// (an interrupt, another task, or — on a virtual machine — the
    /// hypervisor running something else on this vCPU's physical CPU).
    pub lost_ns: u64,
    /// How many such stretches.
    pub lost_gaps: u64,
    /// Spins refused because the hypervisor takes time from this machine
    /// (see [`crate::policy::STEAL_LIMIT_PCT`]) and the consumer waits on
    /// more than one item in flight.
    pub steal_refusals: u64,
}

impl std::fmt::Display for PollStats {
    /// One line of `name=value` pairs, for logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "arrivals={} poll_hits={} woken={} polls={} poll_misses={} blocks={} timed_blocks={} \
             spin_us={} lost_us={} lost_gaps={} busy_refusals={} steal_refusals={}",
            self.arrivals,
            self.poll_hits,
            self.woken,
            self.polls,
            self.poll_misses,
            self.blocks,
            self.timed_blocks,
            self.spin_ns / 1000,
            self.lost_ns / 1000,
            self.lost_gaps,
            self.busy_refusals,
            self.steal_refusals,
        )
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn displays_every_counter_once() {
        let s = super::PollStats {
            spin_ns: 5_000,
            steal_refusals: 3,
            ..Default::default()
        };
        let line = s.to_string();
        assert!(line.contains("spin_us=5 "), "{line}");
        assert!(line.ends_with("steal_refusals=3"), "{line}");
        assert_eq!(line.split(' ').count(), 12, "{line}");
    }
}
