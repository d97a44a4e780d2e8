//! Rate-limited log lines for requests a disk refuses or fails, at the
//! default level: an administrator sees why a guest gets I/O errors without
//! turning on debug, and a guest that sends garbage cannot fill the log —
//! at most one line per cause per disk per second, the next one saying how
//! many were left out.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Shortest time between two lines of one cause.
pub const INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct Cause {
    last: Instant,
    left_out: u64,
}

/// The refusal log of one disk, shared by its queues.
#[derive(Debug)]
pub struct RefusalLog {
    disk: String,
    causes: Mutex<HashMap<&'static str, Cause>>,
}

impl RefusalLog {
    /// A log whose lines name `disk` (for example `vbd 5/51712`).
    pub fn new(disk: impl Into<String>) -> Self {
        Self {
            disk: disk.into(),
            causes: Mutex::new(HashMap::new()),
        }
    }

    /// Logs `what()` as a warning unless a line of `cause` went out less
    /// than [`INTERVAL`] ago; returns whether it did. `what` is only built
    /// when the line is written.
    pub fn warn(&self, queue: u32, cause: &'static str, what: impl FnOnce() -> String) -> bool {
        self.warn_at(Instant::now(), queue, cause, what)
    }

    fn warn_at(
        &self,
        now: Instant,
        queue: u32,
        cause: &'static str,
        what: impl FnOnce() -> String,
    ) -> bool {
        let left_out = {
            let mut causes = self.causes.lock().unwrap_or_else(|p| p.into_inner());
            match causes.get_mut(cause) {
                Some(c) if now.duration_since(c.last) < INTERVAL => {
                    c.left_out += 1;
                    return false;
                }
                Some(c) => {
                    c.last = now;
                    std::mem::take(&mut c.left_out)
                }
                None => {
                    causes.insert(
                        cause,
                        Cause {
                            last: now,
                            left_out: 0,
                        },
                    );
                    0
                }
            }
        };
        let disk = &self.disk;
        let what = what();
        if left_out > 0 {
            tracing::warn!(
                queue,
                cause,
                "{disk}: {what} ({left_out} more of this cause not logged)"
            );
        } else {
            tracing::warn!(queue, cause, "{disk}: {what}");
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_cause_per_interval() {
        let log = RefusalLog::new("vbd 1/51712");
        let t0 = Instant::now();
        assert!(log.warn_at(t0, 0, "bad_segment", || "first".into()));
        // The same cause within the interval is counted, not written...
        let mut built = false;
        assert!(
            !log.warn_at(t0 + Duration::from_millis(500), 0, "bad_segment", || {
                built = true;
                String::new()
            })
        );
        assert!(!built, "a message left out must not be built");
        // ...another cause is not held back by it...
        assert!(log.warn_at(t0 + Duration::from_millis(500), 1, "grant", || "g".into()));
        // ...and after the interval the cause is written again.
        assert!(log.warn_at(t0 + INTERVAL, 0, "bad_segment", || "again".into()));
        assert_eq!(log.causes.lock().unwrap()["bad_segment"].left_out, 0);
        assert!(!log.warn_at(t0 + INTERVAL, 0, "bad_segment", || "x".into()));
        assert_eq!(log.causes.lock().unwrap()["bad_segment"].left_out, 1);
    }
}
