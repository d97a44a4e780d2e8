//! Per-disk counters of the backend, one set per queue, exported in one place
//! ([`DiskMetrics::snapshot`]) as JSON: what tapdisk3 publishes in
//! `/dev/shm`, plus the poller's work.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Counters of one queue (relaxed atomics, written by the queue's
        /// thread, read by the exporter).
        #[derive(Debug, Default)]
        pub struct QueueMetrics {
            $($(#[$doc])* pub $name: AtomicU64,)*
        }

        impl QueueMetrics {
            /// `(name, value)` pairs.
            pub fn values(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name.load(Ordering::Relaxed)),)*]
            }
        }
    };
}

counters! {
    /// Requests taken from the ring.
    requests,
    reads,
    writes,
    flushes,
    barriers,
    discards,
    /// Block-status queries answered (pvio's extension).
    block_status,
    bytes_read,
    bytes_written,
    /// Requests answered `BLKIF_RSP_ERROR` after an I/O failure.
    io_errors,
    /// Requests refused by validation (`BLKIF_RSP_ERROR`).
    invalid,
    /// Requests answered `BLKIF_RSP_EOPNOTSUPP`.
    unsupported,
    /// Event-channel notifications received.
    events_received,
    /// Event-channel notifications sent.
    events_sent,
    /// Spin episodes.
    polls,
    /// Spin episodes that found work.
    poll_hits,
    /// Nanoseconds spent spinning.
    poll_ns,
    /// Of `poll_ns`, stretches the spinning thread did not run (interrupts,
    /// other tasks, or the hypervisor running something else).
    poll_lost_ns,
    /// Spins refused because the hypervisor took CPU time from this machine
    /// while the queue had several requests' I/O in flight.
    steal_refusals,
    /// Timer wake-ups before a predicted arrival.
    timed_sleeps,
    /// CPU time of the queue's thread, in ns.
    cpu_ns,
    /// Extra sub-requests created by splitting.
    split_parts,
    /// Grants kept mapped.
    persistent_grants,
    /// hvd round trips to map grants.
    grant_map_calls,
}

impl QueueMetrics {
    /// Adds to a counter.
    pub fn add(c: &AtomicU64, v: u64) {
        c.fetch_add(v, Ordering::Relaxed);
    }

    /// Sets a gauge.
    pub fn set(c: &AtomicU64, v: u64) {
        c.store(v, Ordering::Relaxed);
    }
}

/// The counters of every queue of one disk.
#[derive(Debug, Default, Clone)]
pub struct DiskMetrics {
    pub queues: Vec<Arc<QueueMetrics>>,
}

impl DiskMetrics {
    /// Totals and per-queue values as JSON.
    pub fn snapshot(&self) -> serde_json::Value {
        let mut total = serde_json::Map::new();
        let mut per = Vec::new();
        for q in &self.queues {
            let mut m = serde_json::Map::new();
            for (k, v) in q.values() {
                m.insert(k.to_string(), v.into());
                let t = total.entry(k.to_string()).or_insert(0u64.into());
                *t = (t.as_u64().unwrap_or(0) + v).into();
            }
            per.push(serde_json::Value::Object(m));
        }
        serde_json::json!({ "total": total, "queues": per })
    }
}
