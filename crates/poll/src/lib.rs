//! When a consumer of a shared ring should spin and when it should sleep.
//!
//! A ring consumer (a backend waiting for requests, a frontend waiting for
//! responses) that finds nothing to do asks its [`Poller`] what next: keep
//! checking the ring until some time ([`Idle::Spin`]), or re-arm the
//! notification and block, possibly with a timer ([`Idle::Block`]). The
//! policies ([`PollPolicy`]) are pure: they see timestamps and a host-load
//! view, never the ring, so they are tested in a simulator and compared side
//! by side in `pvio bench blk`.
//!
//! * `off`: always block (classic event channels).
//! * `spin`: never block (the latency floor, at a core per ring).
//! * `tapdisk3`: XenServer's rule — after a request, poll for a fixed window
//!   that slides with every hit, only if the host was idle enough when polling
//!   started (default 1000 µs and 50 % idle, sampled every second).
//! * `adaptive`: learn the idle gap before the next request (the median of
//!   recent gaps), the cost of a wake-up and how many requests an arrival
//!   brings; spin through gaps up to a few wake-ups long per request (a
//!   disk I/O or a frontend's turnaround at queue depth 1, a burst of
//!   completions at queue depth 32), sleep until just before the predicted
//!   arrival through longer, regular ones (spinning about one wake-up's
//!   worth around it, wider after misses, backing off when they repeat),
//!   and block on the event otherwise — always for arrivals without a
//!   rhythm; never while others wait for the poller's CPU, and never once
//!   the stream has gone quiet.
//!
//! This crate must never touch a ring or a file descriptor; [`load`] reads
//! `/proc` only.

pub mod calibrate;
pub mod load;
pub mod policy;
pub mod stats;

pub use load::{HostLoad, LoadView};
pub use policy::{AdaptiveConfig, Idle, Pickup, PollPolicy, Poller, Tapdisk3Config};
pub use stats::PollStats;

/// A stretch between two turns of a spin loop longer than this is time the
/// spinner lost (a turn takes well under a µs; an interrupt a few µs).
pub const LOST_GAP_NS: u64 = 20_000;

/// Nanoseconds on the monotonic clock.
pub fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// CPU time consumed by the calling thread, in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}
