//! What a backend queue does when it has nothing to do: ask the poller,
//! then spin on the ring (with the frontend's notifications suppressed) or
//! re-arm notifications, check once more, and block on the event channel,
//! the I/O engine's completion fd and a stop fd, with a timer when the
//! poller predicts the next arrival.
//!
//! Two pollers learn two gaps: the wait for the next request (nothing in
//! flight) and the wait for I/O in flight. The same code serves the tapdisk
//! queues and `pvio bench blk`'s gap sweep, so the sweep measures exactly
//! what the backend does.

use std::os::fd::BorrowedFd;

use pvio_abi::blkif::Blkif;
use pvio_hv::EventChannel;
use pvio_poll::{HostLoad, Idle, Pickup, PollPolicy, PollStats, Poller};
use pvio_ring::{BackRing, RingError, RingMemory};
use rustix::event::{PollFd, PollFlags};

use crate::engine::{Engine, EngineError};

/// Why waiting failed.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    #[error("ring: {0}")]
    Ring(#[from] RingError),
    #[error("I/O engine: {0}")]
    Engine(#[from] EngineError),
    #[error("event channel: {0}")]
    Evtchn(#[from] pvio_hv::HvError),
    #[error("poll: {0}")]
    Poll(#[from] std::io::Error),
}

/// What woke the queue, for its counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Woken {
    /// An event-channel notification was consumed.
    pub event: bool,
    /// The queue blocked (rather than spun).
    pub blocked: bool,
}

/// The idle half of a backend queue's loop.
#[derive(Debug)]
pub struct Waiter {
    req: Poller,
    io: Poller,
    load: HostLoad,
    suppressed: bool,
    /// The last pickup was made waiting for I/O (else for requests).
    last_io: bool,
}

impl Waiter {
    /// A waiter following `policy` (one poller per kind of wait).
    pub fn new(policy: PollPolicy, load: HostLoad) -> Self {
        Self {
            req: Poller::new(policy),
            io: Poller::new(policy),
            load,
            suppressed: false,
            last_io: false,
        }
    }

    /// The counters of the poller waiting for requests and of the one
    /// waiting for I/O, apart.
    pub fn stats_apart(&self) -> (PollStats, PollStats) {
        (*self.req.stats(), *self.io.stats())
    }

    /// The two pollers' counters, summed.
    pub fn stats(&self) -> PollStats {
        let (a, b) = (self.req.stats(), self.io.stats());
        PollStats {
            arrivals: a.arrivals + b.arrivals,
            poll_hits: a.poll_hits + b.poll_hits,
            woken: a.woken + b.woken,
            poll_misses: a.poll_misses + b.poll_misses,
            polls: a.polls + b.polls,
            blocks: a.blocks + b.blocks,
            timed_blocks: a.timed_blocks + b.timed_blocks,
            spin_ns: a.spin_ns + b.spin_ns,
            busy_refusals: a.busy_refusals + b.busy_refusals,
            lost_ns: a.lost_ns + b.lost_ns,
            lost_gaps: a.lost_gaps + b.lost_gaps,
            steal_refusals: a.steal_refusals + b.steal_refusals,
        }
    }

    fn arrived(&mut self, io: bool, now: u64, how: Pickup) {
        self.last_io = io;
        let p = if io { &mut self.io } else { &mut self.req };
        p.arrived(now, how, &self.load);
    }

    /// The queue handled `n` items (requests taken, completions reaped)
    /// since its last pickup: they count towards that pickup's batch.
    pub fn served(&mut self, n: usize) {
        if self.last_io {
            self.io.served(n);
        } else {
            self.req.served(n);
        }
    }

    /// Waits once for work: returns after spinning until work or the
    /// poller's deadline, or after blocking until an event, a completion,
    /// the stop fd or the timer.
    pub fn idle<M: RingMemory>(
        &mut self,
        ring: &mut BackRing<Blkif, M>,
        chan: &EventChannel,
        mut engine: Option<&mut (dyn Engine + '_)>,
        stop: BorrowedFd<'_>,
        stopping: &dyn Fn() -> bool,
    ) -> Result<Woken, WaitError> {
        let in_flight = engine.as_ref().map_or(0, |e| e.in_flight());
        let waiting_io = in_flight > 0;
        let now = pvio_poll::now_ns();
        let poller = if waiting_io {
            &mut self.io
        } else {
            &mut self.req
        };
        poller.in_flight(in_flight);
        match poller.idle(now, &self.load) {
            Idle::Spin { until } => {
                if !self.suppressed {
                    // We look at the ring ourselves: the frontend need not
                    // notify (req_event left behind req_cons never matches).
                    ring.set_req_event(ring.req_cons());
                    self.suppressed = true;
                }
                loop {
                    let io_ready = match engine.as_deref_mut() {
                        Some(e) if waiting_io => e.has_completions(),
                        _ => false,
                    };
                    if ring.has_unconsumed_requests() || io_ready || stopping() {
                        self.arrived(waiting_io, pvio_poll::now_ns(), Pickup::Polled);
                        break;
                    }
                    let t = pvio_poll::now_ns();
                    if waiting_io {
                        self.io.looked(t);
                    } else {
                        self.req.looked(t);
                    }
                    if t >= until {
                        break;
                    }
                    std::hint::spin_loop();
                }
                Ok(Woken::default())
            }
            Idle::Block { wake_at } => {
                self.suppressed = false;
                // Always clear the engine's fd before blocking: a completion
                // reaped by polling leaves it readable, and a readable fd in
                // the poll set would turn blocking into a busy loop.
                let io_ready = match engine.as_deref_mut() {
                    Some(e) => e.prepare_to_block()?,
                    None => false,
                };
                if ring.final_check_for_requests()? || io_ready {
                    self.arrived(waiting_io, pvio_poll::now_ns(), Pickup::Polled);
                    return Ok(Woken::default());
                }
                let timeout = wake_at.map(|w| {
                    let d = w.saturating_sub(pvio_poll::now_ns());
                    rustix::time::Timespec {
                        tv_sec: (d / 1_000_000_000) as i64,
                        tv_nsec: (d % 1_000_000_000) as i64,
                    }
                });
                let (ev, io) = {
                    let a = chan.wait_fd();
                    let mut fds = vec![
                        PollFd::new(&a, PollFlags::IN),
                        PollFd::new(&stop, PollFlags::IN),
                    ];
                    let b = engine.as_ref().map(|e| e.notify_fd());
                    if let Some(b) = b.as_ref() {
                        fds.push(PollFd::new(b, PollFlags::IN));
                    }
                    match rustix::event::poll(&mut fds, timeout.as_ref()) {
                        Ok(_) | Err(rustix::io::Errno::INTR) => {}
                        Err(e) => return Err(WaitError::Poll(e.into())),
                    }
                    (
                        fds[0].revents().contains(PollFlags::IN),
                        fds.get(2)
                            .is_some_and(|f| f.revents().contains(PollFlags::IN)),
                    )
                };
                let t = pvio_poll::now_ns();
                if waiting_io {
                    self.io.woke(t, wake_at);
                } else {
                    self.req.woke(t, wake_at);
                }
                if ev {
                    chan.take_pending()?;
                }
                let io_ready = match engine {
                    Some(e) => e.has_completions(),
                    None => false,
                };
                if ring.has_unconsumed_requests() || io_ready || stopping() {
                    let how = if ev || io {
                        Pickup::Event
                    } else {
                        Pickup::Timer
                    };
                    self.arrived(waiting_io, t, how);
                }
                Ok(Woken {
                    event: ev,
                    blocked: true,
                })
            }
        }
    }
}
