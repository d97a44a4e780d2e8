//! Supervision of a VBD's tapdisk, as a service manager supervises a
//! daemon: the engine is the tapdisk's parent, so its death is seen at once
//! (the reaper task's `wait`). A tapdisk that dies while its VBD is plugged
//! is logged with the VM and device and started again with the same
//! command line; the frontend then reconnects and pushes again what it had
//! in flight (the datapath's reconnect path). A tapdisk that dies more than
//! [`RESTART_LIMIT`] times within [`RESTART_WINDOW`] is not started again:
//! the VBD is marked failed, its backend's xenstore `error` says why and its
//! `state` goes to Closed, so the guest sees the disk go rather than wait
//! on it forever.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::process::ExitStatus;
use std::rc::Rc;
use std::time::{Duration, Instant};

use pvio_abi::xenbus::XenbusState;
use pvio_xenstore::Client;

use crate::process::{log_tail, Proc};
use crate::vbd::TapdiskLaunch;

/// Deaths within [`RESTART_WINDOW`] after which a tapdisk is left dead.
pub const RESTART_LIMIT: usize = 5;
/// The window over which deaths are counted.
pub const RESTART_WINDOW: Duration = Duration::from_secs(60);
/// Wait before the second restart within the window; it doubles for each
/// further one (the first restart is immediate).
pub const RESTART_BACKOFF: Duration = Duration::from_millis(100);

/// What the toolstack learns of a supervised tapdisk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TapdiskEvent {
    /// It died and was started again; `restarts` since the VBD was plugged.
    Restarted { restarts: u32, status: String },
    /// It died too often and is left dead.
    Failed { reason: String },
}

/// A VBD's tapdisk: the process running now, and its supervision state.
#[derive(Debug)]
pub struct Tapdisk {
    current: RefCell<Proc>,
    launch: TapdiskLaunch,
    /// The VBD is being unplugged: a death is expected.
    stopping: Cell<bool>,
}

impl Tapdisk {
    /// A tapdisk started by `launch`.
    pub fn new(first: Proc, launch: TapdiskLaunch) -> Self {
        Self {
            current: RefCell::new(first),
            launch,
            stopping: Cell::new(false),
        }
    }

    /// The process running now (or the last one, once it died).
    pub fn proc(&self) -> Proc {
        self.current.borrow().clone()
    }

    pub fn pid(&self) -> u32 {
        self.current.borrow().pid()
    }

    /// How the current process exited, if it did.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.current.borrow().exit_status()
    }

    /// From now on a death is an unplug, not a crash.
    pub fn set_stopping(&self) {
        self.stopping.set(true);
    }

    fn stopping(&self) -> bool {
        self.stopping.get()
    }
}

/// Deaths of one tapdisk, over the last [`RESTART_WINDOW`].
#[derive(Debug, Default)]
pub struct DeathLog {
    at: VecDeque<Instant>,
}

impl DeathLog {
    /// Records a death at `now`; returns the deaths within the window
    /// ending at `now`, this one included.
    pub fn record(&mut self, now: Instant) -> usize {
        while self
            .at
            .front()
            .is_some_and(|t| now.duration_since(*t) >= RESTART_WINDOW)
        {
            self.at.pop_front();
        }
        self.at.push_back(now);
        self.at.len()
    }
}

/// How long to wait before restarting after the `n`th death in the window.
pub fn backoff(n: usize) -> Duration {
    if n <= 1 {
        return Duration::ZERO;
    }
    RESTART_BACKOFF * (1u32 << (n - 2).min(6))
}

/// What the supervisor of one VBD needs.
pub struct Supervised {
    pub xs: Client,
    pub vm: String,
    pub devid: u32,
    pub backend: String,
    pub log: std::path::PathBuf,
    pub tapdisk: Rc<Tapdisk>,
    /// True once the VM is being taken down (its tapdisks' deaths are
    /// expected then).
    pub vm_stopping: Box<dyn Fn() -> bool>,
    /// Told of each restart and of the failure.
    pub notify: Box<dyn Fn(TapdiskEvent)>,
}

/// Watches the tapdisk until its VBD is unplugged or it is given up on.
/// Runs as a local task of the engine.
pub async fn supervise(s: Supervised) {
    let mut deaths = DeathLog::default();
    let mut restarts = 0u32;
    loop {
        let st = s.tapdisk.proc().wait().await;
        if s.tapdisk.stopping() || (s.vm_stopping)() {
            return;
        }
        let n = deaths.record(Instant::now());
        let tail = log_tail(&s.log, 300);
        let log_says = if tail.is_empty() {
            String::new()
        } else {
            format!("; its log ends: {tail}")
        };
        if n > RESTART_LIMIT {
            let reason = format!(
                "its tapdisk died {n} times within {} s (last: {st}){log_says}",
                RESTART_WINDOW.as_secs()
            );
            tracing::error!(vm = %s.vm, devid = s.devid, "giving up on the tapdisk: {reason}");
            mark_failed(&s.xs, &s.backend, &reason).await;
            (s.notify)(TapdiskEvent::Failed { reason });
            return;
        }
        let wait = backoff(n);
        tracing::warn!(
            vm = %s.vm,
            devid = s.devid,
            deaths_in_window = n,
            "the tapdisk died ({st}); restarting it in {} ms{log_says}",
            wait.as_millis()
        );
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
            if s.tapdisk.stopping() || (s.vm_stopping)() {
                return;
            }
        }
        match s.tapdisk.launch.spawn().await {
            Ok(p) => {
                tracing::info!(vm = %s.vm, devid = s.devid, pid = p.pid(), "tapdisk restarted");
                *s.tapdisk.current.borrow_mut() = p;
            }
            Err(e) => {
                // Counted as the next death when the loop comes round: the
                // old process is still the current one, already exited.
                tracing::warn!(vm = %s.vm, devid = s.devid, "restarting the tapdisk: {e}");
                continue;
            }
        }
        restarts += 1;
        (s.notify)(TapdiskEvent::Restarted {
            restarts,
            status: st.to_string(),
        });
    }
}

/// Tells the guest the disk is gone: `error` says why, `state` = Closed.
async fn mark_failed(xs: &Client, backend: &str, reason: &str) {
    let key = format!("{backend}/error");
    if let Err(e) = xs.write(&key, reason).await {
        tracing::warn!("writing {key}: {e}");
    }
    if let Err(e) = pvio_xenstore::xenbus::switch_state(xs, backend, XenbusState::Closed).await {
        tracing::warn!("closing {backend}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deaths_are_counted_over_a_sliding_window() {
        let mut d = DeathLog::default();
        let t0 = Instant::now();
        assert_eq!(d.record(t0), 1);
        assert_eq!(d.record(t0 + Duration::from_secs(10)), 2);
        assert_eq!(d.record(t0 + Duration::from_secs(59)), 3);
        // The first death leaves the window.
        assert_eq!(d.record(t0 + RESTART_WINDOW), 3);
        // A long quiet spell forgets them all.
        assert_eq!(d.record(t0 + RESTART_WINDOW * 3), 1);
    }

    #[test]
    fn the_first_restart_is_immediate_then_the_wait_doubles() {
        assert_eq!(backoff(1), Duration::ZERO);
        assert_eq!(backoff(2), RESTART_BACKOFF);
        assert_eq!(backoff(3), RESTART_BACKOFF * 2);
        assert_eq!(backoff(4), RESTART_BACKOFF * 4);
        assert_eq!(backoff(100), RESTART_BACKOFF * 64);
    }
}
