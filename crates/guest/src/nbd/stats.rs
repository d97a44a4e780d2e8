//! Counters of an NBD server, kept with atomics so that the server threads
//! update them and anyone reads them.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// Live counters.
#[derive(Debug, Default)]
pub struct NbdStats {
    pub connections: AtomicU64,
    pub refused: AtomicU64,
    pub sessions_ended: AtomicU64,
    pub requests: AtomicU64,
    pub max_active: AtomicU64,
    pub error_replies: AtomicU64,
    pub protocol_errors: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct NbdStatsSnapshot {
    /// Connections accepted for service.
    pub connections: u64,
    /// Connections turned away (another client was being served).
    pub refused: u64,
    /// Sessions that have ended.
    pub sessions_ended: u64,
    /// Transmission requests received.
    pub requests: u64,
    /// Most commands running at once in one session.
    pub max_active: u64,
    /// Requests answered with an error.
    pub error_replies: u64,
    /// Sessions ended because the client broke the protocol.
    pub protocol_errors: u64,
    /// Bytes sent to clients by reads.
    pub bytes_read: u64,
    /// Bytes written for clients.
    pub bytes_written: u64,
}

impl NbdStats {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> NbdStatsSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        NbdStatsSnapshot {
            connections: g(&self.connections),
            refused: g(&self.refused),
            sessions_ended: g(&self.sessions_ended),
            requests: g(&self.requests),
            max_active: g(&self.max_active),
            error_replies: g(&self.error_replies),
            protocol_errors: g(&self.protocol_errors),
            bytes_read: g(&self.bytes_read),
            bytes_written: g(&self.bytes_written),
        }
    }
}
