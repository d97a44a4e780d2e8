//! The [`DomainHook`] of `pvio xenstored --hvd-socket`: xenstored is a dom0
//! process of hvd, and an introduced guest's xenbus ring is frame `mfn` of
//! its memory (`pvio_hv::memory::STORE_FRAME` by hvd's domain builder)
//! with its event channel the port the builder offered to dom0.
//!
//! Domain death, Xen's `VIRQ_DOM_EXC`: hvd destroys a domain whose process
//! died and unbinds its ports, which raises our end of the store channel
//! and leaves it unbound. A ring that wakes the daemon with no news is a
//! suspect: its port's status is asked of hvd (at most every
//! [`CHECK_INTERVAL`] per domain) and an unbound port is confirmed against
//! hvd's domain list. Because a death can coincide with a request (one
//! wake-up with news), every introduced domain is also checked against the
//! domain list once per periodic sweep (about once a second, one request
//! to hvd for all domains).

use super::ring_transport::RingTransport;
use super::transport::Transport;
use super::DomainHook;
use crate::store::domain::DomainInfo;
use pvio_abi::event_channel::{EvtchnPort, EvtchnStat};
use pvio_abi::DomId;
use pvio_hv::{ErrorCode, EventChannel, ForeignMemory, FrameMapping, Gfn, HvClient, HvError};
use pvio_ring::RingMemory;
use std::collections::{HashMap, HashSet};
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Least time between two port-status checks of one domain.
pub const CHECK_INTERVAL: Duration = Duration::from_millis(200);

/// A guest's ring frame mapped in xenstored, with the guest's memory it
/// came from (kept open for as long as the mapping).
pub struct MappedRing {
    map: FrameMapping,
    _mem: ForeignMemory,
}

// SAFETY: the FrameMapping owns one page mapped readable and writable at a
// fixed address until it is dropped with this value; only the xenbus ring
// code accesses it, through atomics and volatile copies.
unsafe impl RingMemory for MappedRing {
    fn as_ptr(&self) -> *mut u8 {
        self.map.as_ptr()
    }
    fn len(&self) -> usize {
        self.map.len()
    }
}

struct Watched {
    /// Our port of the domain's store channel.
    port: EvtchnPort,
    /// The guest's port it is bound to.
    remote_port: EvtchnPort,
    last_check: Option<Instant>,
}

/// Serves introduced guests on their xenbus rings through hvd.
pub struct HvHook {
    hv: Arc<HvClient>,
    domains: HashMap<DomId, Watched>,
    hvd_failing: bool,
}

/// hvd's refusal as an `io::Error` whose kind becomes the XS_INTRODUCE error.
fn hv_io(e: HvError) -> io::Error {
    let kind = match &e {
        HvError::Remote { code, .. } => match code {
            ErrorCode::NoSuchDomain => io::ErrorKind::NotFound,
            ErrorCode::PermissionDenied => io::ErrorKind::PermissionDenied,
            ErrorCode::InvalidArgument | ErrorCode::BadPort => io::ErrorKind::InvalidInput,
            _ => io::ErrorKind::Other,
        },
        HvError::BadFrame { .. } | HvError::InvalidArgument(_) => io::ErrorKind::InvalidInput,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e)
}

impl HvHook {
    /// Connects to hvd as a dom0 process.
    pub fn connect(socket: &Path) -> io::Result<Self> {
        Ok(Self::new(HvClient::connect_host(socket).map_err(hv_io)?))
    }

    /// Uses an existing dom0 connection.
    pub fn new(hv: HvClient) -> Self {
        Self {
            hv: Arc::new(hv),
            domains: HashMap::new(),
            hvd_failing: false,
        }
    }

    /// Introduced domains this hook watches.
    pub fn domains(&self) -> impl Iterator<Item = DomId> + '_ {
        self.domains.keys().copied()
    }

    fn attach(&mut self, info: &DomainInfo, reset: bool) -> io::Result<Box<dyn Transport>> {
        let frame = Gfn::try_from(info.mfn).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("ring frame {} is out of range", info.mfn),
            )
        })?;
        let mem = self.hv.foreign_memory(info.domid).map_err(hv_io)?;
        let map = mem.map_frames(&[frame]).map_err(hv_io)?;
        let chan = self
            .hv
            .evtchn_bind_interdomain(info.domid, info.port)
            .map_err(hv_io)?;
        let port = chan.port();
        let hv = Arc::clone(&self.hv);
        let domid = info.domid;
        let close: super::ring_transport::OnDrop = Box::new(move |c: &EventChannel| {
            if let Err(e) = hv.evtchn_close(c.port()) {
                tracing::debug!(domid, port = c.port(), error = %e, "closing the store port");
            }
        });
        let t = RingTransport::new(
            MappedRing { map, _mem: mem },
            chan,
            info.domid,
            reset,
            Some(close),
        )?;
        self.domains.insert(
            info.domid,
            Watched {
                port,
                remote_port: info.port,
                last_check: None,
            },
        );
        Ok(Box::new(t))
    }

    /// Whether our end of `domid`'s store channel is still connected to it.
    fn still_bound(&mut self, domid: DomId) -> bool {
        let Some(w) = self.domains.get(&domid) else {
            return true;
        };
        match self.hv.evtchn_status(0, w.port) {
            Ok(s) => s.state == EvtchnStat::Interdomain && s.remote_dom == domid,
            Err(e) => {
                tracing::warn!(domid, error = %e, "cannot ask hvd for the store port's status");
                true
            }
        }
    }
}

impl DomainHook for HvHook {
    fn introduced(&mut self, info: &DomainInfo) -> io::Result<Option<Box<dyn Transport>>> {
        self.attach(info, false).map(Some)
    }

    fn reintroduced(&mut self, info: &DomainInfo) -> io::Result<Option<Box<dyn Transport>>> {
        // Binding the port we are already bound to would fail (and hvd
        // cannot rewire the guest's notify descriptor): keep the connection.
        if self
            .domains
            .get(&info.domid)
            .is_some_and(|w| w.remote_port == info.port)
        {
            return Ok(None);
        }
        self.attach(info, true).map(Some)
    }

    fn released(&mut self, domid: DomId) {
        self.domains.remove(&domid);
    }

    fn gone(&mut self, suspects: &[DomId], sweep: bool) -> Vec<DomId> {
        let now = Instant::now();
        let mut unbound = Vec::new();
        for &d in suspects {
            let Some(w) = self.domains.get_mut(&d) else {
                continue;
            };
            if w.last_check
                .is_some_and(|t| now.duration_since(t) < CHECK_INTERVAL)
            {
                continue; // the periodic sweep will look
            }
            w.last_check = Some(now);
            if !self.still_bound(d) {
                unbound.push(d);
            }
        }
        if self.domains.is_empty() || (unbound.is_empty() && !sweep) {
            return Vec::new();
        }
        let live: HashSet<DomId> = match self.hv.list_domains() {
            Ok(l) => {
                self.hvd_failing = false;
                l.iter().map(|d| d.domid).collect()
            }
            Err(e) => {
                if !self.hvd_failing {
                    tracing::warn!(error = %e, "cannot list hvd's domains");
                    self.hvd_failing = true;
                }
                return Vec::new();
            }
        };
        let candidates: Vec<DomId> = if sweep {
            self.domains.keys().copied().collect()
        } else {
            unbound
        };
        candidates
            .into_iter()
            .filter(|d| !live.contains(d))
            .collect()
    }

    fn watching(&self) -> bool {
        !self.domains.is_empty()
    }
}
