//! One queue of a blkfront device: the ring, its event channel, the
//! requests in flight, and the [`BlockDevice`] a guest workload drives.
//!
//! I/O buffers are pages of the guest's memory granted once to the backend
//! (persistent grants), so a request only names grant refs already known;
//! requests larger than 11 pages use indirect descriptor pages, one set per
//! ring slot, also granted once. Waiting for responses follows a
//! [`Poller`]: a guest waiting on its own I/O may spin on its own vCPU when
//! that beats the wake-up, and blocks on the event channel otherwise.
//!
//! The ring state sits behind a mutex shared with the device's control task,
//! which swaps in a fresh ring and event channel when the backend restarts
//! and pushes the requests still in flight onto it again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pvio_abi::blkif::{
    Blkif, BlkifRequest, BlkifRequestDiscard, BlkifRequestIndirect, BlkifRequestSegment,
    BLKIF_MAX_SEGMENTS_PER_REQUEST, BLKIF_OP_DISCARD, BLKIF_OP_FLUSH_DISKCACHE, BLKIF_OP_INDIRECT,
    BLKIF_OP_PVIO_BLOCK_STATUS, BLKIF_OP_READ, BLKIF_OP_WRITE, BLKIF_RSP_EOPNOTSUPP,
    BLKIF_RSP_OKAY,
};
use pvio_abi::grant_table::GrantRef;
use pvio_abi::XEN_PAGE_SIZE;
use pvio_hv::{EventChannel, Gfn, GuestMemory};
use pvio_poll::{HostLoad, Idle, Pickup, Poller};
use pvio_ring::{FrontRing, GuestPages};
use rustix::event::{PollFd, PollFlags};
use zerocopy::IntoBytes;

use crate::device::{
    check_request, BlockDevice, DeviceCompletion, DeviceError, DeviceOp, DeviceRequest, DiskInfo,
};

/// A request in flight, kept so it can be pushed again after a reconnect.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Inflight {
    pub tag: u64,
    pub op: DeviceOp,
    pub len: u32,
    /// The slot as pushed (its indirect pages stay in guest memory).
    pub slot: BlkifRequest,
}

/// The ring generation in use.
pub(crate) struct RingState {
    pub front: FrontRing<Blkif, GuestPages>,
    pub chan: Arc<EventChannel>,
    pub pages: GuestPages,
    pub grefs: Vec<GrantRef>,
    pub inflight: Vec<Option<Inflight>>,
    pub free_ids: Vec<u32>,
    /// Requests are pushed to the backend (false while reconnecting).
    pub connected: bool,
    /// The device is gone for good.
    pub closed: Option<String>,
    pub suppressed: bool,
}

/// What the queue thread and the control task share.
pub(crate) struct QueueShared {
    pub state: Mutex<RingState>,
    pub reconnecting: AtomicBool,
}

impl QueueShared {
    pub fn lock(&self) -> MutexGuard<'_, RingState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A contiguous run of granted guest frames.
#[derive(Debug, Clone)]
pub(crate) struct GrantedPages {
    pub first: Gfn,
    pub grefs: Vec<GrantRef>,
}

/// One queue of a blkfront device.
pub struct BlkQueue {
    pub(crate) shared: Arc<QueueShared>,
    pub(crate) index: u32,
    pub(crate) devid: u32,
    pub(crate) info: DiskInfo,
    pub(crate) mem: Arc<GuestMemory>,
    pub(crate) buffers: Vec<GrantedPages>,
    pub(crate) buffer_size: usize,
    /// Indirect pages, `indirect_per_req` per request id.
    pub(crate) indirect: Option<GrantedPages>,
    pub(crate) indirect_per_req: usize,
    pub(crate) poller: Poller,
    pub(crate) load: HostLoad,
}

impl std::fmt::Debug for BlkQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlkQueue")
            .field("devid", &self.devid)
            .field("index", &self.index)
            .field("info", &self.info)
            .finish()
    }
}

const PAGE: usize = XEN_PAGE_SIZE;

impl BlkQueue {
    /// The queue's index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// What the poller did so far.
    pub fn poll_stats(&self) -> pvio_poll::PollStats {
        *self.poller.stats()
    }

    /// The grant refs of buffer `idx`'s pages (for tests that build raw
    /// requests).
    pub fn buffer_grants(&self, idx: usize) -> &[GrantRef] {
        &self.buffers[idx].grefs
    }

    /// Pushes a raw request slot as built by the caller, with only its `id`
    /// replaced; its completion carries `tag`. For hostile-frontend tests:
    /// nothing is checked, which is the point.
    pub fn submit_raw(&mut self, mut slot: BlkifRequest, tag: u64) -> Result<(), DeviceError> {
        let shared = self.shared.clone();
        let mut st = shared.lock();
        let Some(id) = st.free_ids.pop() else {
            return Err(DeviceError::Busy);
        };
        slot.id = u64::from(id);
        st.front
            .push_request(&slot)
            .map_err(|e| DeviceError::Disconnected(e.to_string()))?;
        st.inflight[id as usize] = Some(Inflight {
            tag,
            op: DeviceOp::Read,
            len: 0,
            slot,
        });
        Ok(())
    }

    fn build(&self, id: u32, req: &DeviceRequest) -> Result<BlkifRequest, DeviceError> {
        let sector = req.offset >> 9;
        match req.op {
            DeviceOp::Flush => Ok(BlkifRequest {
                operation: BLKIF_OP_FLUSH_DISKCACHE,
                handle: self.devid as u16,
                id: u64::from(id),
                sector_number: 0,
                ..Default::default()
            }),
            DeviceOp::Discard => Ok(BlkifRequest::from_discard(&BlkifRequestDiscard {
                operation: BLKIF_OP_DISCARD,
                handle: self.devid as u16,
                id: u64::from(id),
                sector_number: sector,
                nr_sectors: u64::from(req.len) >> 9,
                ..Default::default()
            })),
            DeviceOp::BlockStatus => {
                let mut r = BlkifRequest {
                    operation: BLKIF_OP_PVIO_BLOCK_STATUS,
                    nr_segments: 1,
                    handle: self.devid as u16,
                    id: u64::from(id),
                    sector_number: sector,
                    ..Default::default()
                };
                r.seg[0] = BlkifRequestSegment {
                    gref: self.buffers[req.buf].grefs[0],
                    first_sect: 0,
                    last_sect: 7,
                    _pad: [0; 2],
                };
                Ok(r)
            }
            DeviceOp::Read | DeviceOp::Write => {
                let op = if req.op == DeviceOp::Read {
                    BLKIF_OP_READ
                } else {
                    BLKIF_OP_WRITE
                };
                let len = req.len as usize;
                let pages = len.div_ceil(PAGE);
                let buf = &self.buffers[req.buf];
                let seg = |p: usize| {
                    let n = (len - p * PAGE).min(PAGE);
                    BlkifRequestSegment {
                        gref: buf.grefs[p],
                        first_sect: 0,
                        last_sect: (n / 512 - 1) as u8,
                        _pad: [0; 2],
                    }
                };
                if pages <= BLKIF_MAX_SEGMENTS_PER_REQUEST {
                    let mut r = BlkifRequest {
                        operation: op,
                        nr_segments: pages as u8,
                        handle: self.devid as u16,
                        id: u64::from(id),
                        sector_number: sector,
                        ..Default::default()
                    };
                    for p in 0..pages {
                        r.seg[p] = seg(p);
                    }
                    return Ok(r);
                }
                let ind = self.indirect.as_ref().ok_or_else(|| {
                    DeviceError::Invalid(format!("{len} bytes need indirect descriptors"))
                })?;
                let per_page = PAGE / std::mem::size_of::<BlkifRequestSegment>();
                let needed = pages.div_ceil(per_page);
                if needed > self.indirect_per_req {
                    return Err(DeviceError::Invalid(format!(
                        "{len} bytes is over the limit"
                    )));
                }
                let mut r = BlkifRequestIndirect {
                    operation: BLKIF_OP_INDIRECT,
                    indirect_op: op,
                    nr_segments: pages as u16,
                    id: u64::from(id),
                    sector_number: sector,
                    handle: self.devid as u16,
                    ..Default::default()
                };
                let base = id as usize * self.indirect_per_req;
                for ip in 0..needed {
                    let segs: Vec<BlkifRequestSegment> = (ip * per_page
                        ..((ip + 1) * per_page).min(pages))
                        .map(seg)
                        .collect();
                    let gfn = ind.first + (base + ip) as Gfn;
                    self.mem
                        .write(gfn, 0, segs.as_bytes())
                        .map_err(|e| DeviceError::Invalid(e.to_string()))?;
                    r.indirect_grefs[ip] = ind.grefs[base + ip];
                }
                Ok(BlkifRequest::from_indirect(&r))
            }
        }
    }

    fn reap(
        &self,
        st: &mut RingState,
        out: &mut Vec<DeviceCompletion>,
    ) -> Result<usize, DeviceError> {
        let mut n = 0;
        loop {
            let rsp = match st.front.take_response() {
                Ok(Some(r)) => r,
                Ok(None) => return Ok(n),
                Err(e) => {
                    let msg = format!("backend broke the ring: {e}");
                    st.closed = Some(msg.clone());
                    return Err(DeviceError::Disconnected(msg));
                }
            };
            let id = rsp.id as usize;
            let Some(f) = st.inflight.get_mut(id).and_then(Option::take) else {
                tracing::warn!(queue = self.index, id, "response for no request in flight");
                continue;
            };
            st.free_ids.push(id as u32);
            let result = match rsp.status {
                BLKIF_RSP_OKAY => Ok(match f.op {
                    DeviceOp::Flush => 0,
                    // A block-status answer is in its buffer; its reader
                    // parses it (once).
                    DeviceOp::Read
                    | DeviceOp::Write
                    | DeviceOp::Discard
                    | DeviceOp::BlockStatus => f.len,
                }),
                BLKIF_RSP_EOPNOTSUPP => Err(DeviceError::NotSupported),
                _ => Err(DeviceError::Io),
            };
            out.push(DeviceCompletion { tag: f.tag, result });
            n += 1;
        }
    }

    fn in_flight(st: &RingState) -> usize {
        st.inflight.len() - st.free_ids.len()
    }
}

impl BlkQueue {
    fn buffer_ptr(&self, idx: usize) -> *mut u8 {
        self.mem
            .frame_ptr(self.buffers[idx].first)
            .expect("buffer frames lie in guest memory")
    }
}

impl BlockDevice for BlkQueue {
    fn info(&self) -> DiskInfo {
        self.info
    }

    fn buffer_count(&self) -> usize {
        self.buffers.len()
    }

    fn buffer_size(&self) -> usize {
        self.buffer_size
    }

    fn buffer(&self, idx: usize) -> &[u8] {
        // SAFETY: the buffer's frames were allocated contiguously in this
        // guest's memory, mapped for the life of `mem`; they belong to this
        // queue alone, and the backend writes them only while a request on
        // them is in flight, when the BlockDevice contract forbids access.
        unsafe { std::slice::from_raw_parts(self.buffer_ptr(idx), self.buffer_size) }
    }

    fn buffer_mut(&mut self, idx: usize) -> &mut [u8] {
        // SAFETY: as in `buffer`; `&mut self` makes this the only reference
        // this process holds to the queue's buffers.
        unsafe { std::slice::from_raw_parts_mut(self.buffer_ptr(idx), self.buffer_size) }
    }

    fn submit(&mut self, req: DeviceRequest) -> Result<(), DeviceError> {
        check_request(&self.info, (self.buffers.len(), self.buffer_size), &req)?;
        let shared = self.shared.clone();
        let mut st = shared.lock();
        if let Some(c) = &st.closed {
            return Err(DeviceError::Disconnected(c.clone()));
        }
        let Some(id) = st.free_ids.pop() else {
            return Err(DeviceError::Busy);
        };
        let slot = match self.build(id, &req) {
            Ok(s) => s,
            Err(e) => {
                st.free_ids.push(id);
                return Err(e);
            }
        };
        if st.connected {
            if let Err(e) = st.front.push_request(&slot) {
                st.free_ids.push(id);
                return Err(DeviceError::Disconnected(e.to_string()));
            }
        }
        st.inflight[id as usize] = Some(Inflight {
            tag: req.tag,
            op: req.op,
            len: req.len,
            slot,
        });
        Ok(())
    }

    fn kick(&mut self) -> Result<(), DeviceError> {
        // While reconnecting, queued requests wait for the new ring.
        let mut st = self.shared.lock();
        if st.connected && st.front.push_requests_and_check_notify() {
            st.chan
                .notify()
                .map_err(|e| DeviceError::Disconnected(e.to_string()))?;
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<DeviceCompletion>) -> Result<usize, DeviceError> {
        let shared = self.shared.clone();
        let mut st = shared.lock();
        let n = self.reap(&mut st, out)?;
        if n == 0 {
            if let Some(c) = &st.closed {
                if Self::in_flight(&st) > 0 {
                    return Err(DeviceError::Disconnected(c.clone()));
                }
            }
        }
        Ok(n)
    }

    fn wait(
        &mut self,
        out: &mut Vec<DeviceCompletion>,
        timeout: Option<Duration>,
    ) -> Result<usize, DeviceError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let shared = self.shared.clone();
        loop {
            let n = self.poll(out)?;
            if n > 0 {
                self.poller.served(n);
                return Ok(n);
            }
            let in_flight = Self::in_flight(&shared.lock());
            if in_flight == 0 {
                return Ok(0);
            }
            self.poller.in_flight(in_flight);
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(0);
            }
            let now = pvio_poll::now_ns();
            match self.poller.idle(now, &self.load) {
                Idle::Spin { until } => {
                    {
                        let mut st = shared.lock();
                        if !st.suppressed && st.connected {
                            let c = st.front.rsp_cons();
                            st.front.set_rsp_event(c);
                            st.suppressed = true;
                        }
                    }
                    loop {
                        let has = {
                            let st = shared.lock();
                            st.front.has_unconsumed_responses() || st.closed.is_some()
                        };
                        if has {
                            self.poller
                                .arrived(pvio_poll::now_ns(), Pickup::Polled, &self.load);
                            break;
                        }
                        let t = pvio_poll::now_ns();
                        self.poller.looked(t);
                        if t >= until || deadline.is_some_and(|d| Instant::now() >= d) {
                            break;
                        }
                        std::hint::spin_loop();
                    }
                }
                Idle::Block { wake_at } => {
                    let chan = {
                        let mut st = shared.lock();
                        st.suppressed = false;
                        let ready = st.connected
                            && st
                                .front
                                .final_check_for_responses()
                                .map_err(|e| DeviceError::Disconnected(e.to_string()))?;
                        if ready || st.closed.is_some() {
                            drop(st);
                            self.poller
                                .arrived(pvio_poll::now_ns(), Pickup::Polled, &self.load);
                            continue;
                        }
                        st.chan.clone()
                    };
                    let mut limit = wake_at.map(|w| w.saturating_sub(pvio_poll::now_ns()));
                    if let Some(d) = deadline {
                        let left = d.saturating_duration_since(Instant::now()).as_nanos() as u64;
                        limit = Some(limit.map_or(left, |l| l.min(left)));
                    }
                    let ts = limit.map(|d| rustix::time::Timespec {
                        tv_sec: (d / 1_000_000_000) as i64,
                        tv_nsec: (d % 1_000_000_000) as i64,
                    });
                    let fd = chan.wait_fd();
                    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
                    match rustix::event::poll(&mut fds, ts.as_ref()) {
                        Ok(_) | Err(rustix::io::Errno::INTR) => {}
                        Err(e) => return Err(DeviceError::Disconnected(format!("poll: {e}"))),
                    }
                    let ev = fds[0].revents().contains(PollFlags::IN);
                    let t = pvio_poll::now_ns();
                    self.poller.woke(t, wake_at);
                    if ev {
                        let _ = chan.take_pending();
                    }
                    if shared.lock().front.has_unconsumed_responses() {
                        let how = if ev { Pickup::Event } else { Pickup::Timer };
                        self.poller.arrived(t, how, &self.load);
                    }
                }
            }
        }
    }
}

/// Marks a reconnect as done for `shared`: pushes what was in flight onto
/// the new ring, in id order, and notifies the backend.
pub(crate) fn resume(shared: &QueueShared) -> Result<(), String> {
    let mut st = shared.lock();
    st.connected = true;
    let mut slots: Vec<BlkifRequest> = st.inflight.iter().flatten().map(|f| f.slot).collect();
    slots.sort_by_key(|s| s.id);
    for s in &slots {
        st.front.push_request(s).map_err(|e| e.to_string())?;
    }
    if st.front.push_requests_and_check_notify() {
        st.chan.notify().map_err(|e| e.to_string())?;
    }
    shared.reconnecting.store(false, Ordering::Release);
    if !slots.is_empty() {
        tracing::info!(
            requests = slots.len(),
            "resubmitted requests in flight after reconnect"
        );
    }
    Ok(())
}

impl Drop for BlkQueue {
    fn drop(&mut self) {
        tracing::debug!(
            queue = self.index,
            stats = %self.poller.stats(),
            gap = ?self.poller.learned_gap(),
            batch = self.poller.learned_batch(),
            "frontend queue polling"
        );
    }
}
