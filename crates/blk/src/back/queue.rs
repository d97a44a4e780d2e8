//! One queue of a backend: a thread that owns a blkif ring, its event
//! channel and an I/O engine, and moves every request from the ring to the
//! image and its response back (tapdisk3's per-ring loop).
//!
//! Per request: copy the slot once (the ring does), parse and validate it
//! once ([`Request::parse`]), map its grants (hvd validates them; persistent
//! grants are mapped once), translate the range through the image, split it
//! if the split policy says so, submit the parts to the engine, and answer
//! when the last part completes. Flush is `fdatasync`; a barrier drains
//! every request in flight first. Nothing is acknowledged before the engine
//! reports the data written.
//!
//! When there is nothing to do the queue asks a [`Poller`] whether to spin
//! (with notifications from the frontend suppressed) or to block on the
//! event channel and the engine's completion fd. Two pollers learn two
//! different gaps: the wait for the next request, and the wait for I/O in
//! flight.

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use pvio_abi::blkif::{
    Blkif, BlkifRequest, BlkifResponse, BLKIF_BLOCK_STATUS_PER_PAGE, BLKIF_RSP_EOPNOTSUPP,
    BLKIF_RSP_ERROR, BLKIF_RSP_OKAY,
};
use pvio_abi::DomId;
use pvio_abi::XEN_PAGE_SIZE;
use pvio_hv::{EventChannel, ForeignMemory, FrameMapping};
use pvio_poll::{HostLoad, PollPolicy};
use pvio_ring::{BackRing, RingError};

use super::grants::{GrantError, GrantMapper};
use super::metrics::QueueMetrics;
use super::refusal_log::RefusalLog;
use super::waiter::{WaitError, Waiter};
use crate::device::write_block_status;
use crate::engine::{Completion, CompletionError, Engine, FileId, IoBuf, MAX_BUFFERS};
use crate::image::{Extent, Image, MapOp, MapOutcome};
use crate::request::{error_response, Operation, Request, RequestError};
use crate::split::{SplitSize, Splitter};

/// Asks a queue thread to finish: it stops taking requests, completes the
/// ones in flight, answers them and exits.
#[derive(Debug)]
pub struct StopSignal {
    flag: AtomicBool,
    efd: OwnedFd,
}

impl StopSignal {
    /// A signal not yet raised.
    pub fn new() -> std::io::Result<Arc<Self>> {
        Ok(Arc::new(Self {
            flag: AtomicBool::new(false),
            efd: rustix::event::eventfd(
                0,
                rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
            )?,
        }))
    }

    /// Raises it and wakes the thread.
    pub fn request(&self) {
        self.flag.store(true, Ordering::Release);
        let _ = rustix::io::write(&self.efd, &1u64.to_ne_bytes());
    }

    /// Whether it was raised.
    pub fn requested(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }
}

/// Everything a queue thread owns.
pub struct QueueSetup {
    pub index: u32,
    pub domid: DomId,
    pub ring: BackRing<Blkif, FrameMapping>,
    pub chan: EventChannel,
    pub mem: Arc<ForeignMemory>,
    pub grants: GrantMapper,
    pub image: Arc<dyn Image>,
    pub limits: crate::request::DiskLimits,
    pub engine: Box<dyn Engine>,
    pub poll: PollPolicy,
    pub load: HostLoad,
    pub split: SplitSize,
    pub metrics: Arc<QueueMetrics>,
    pub refusals: Arc<RefusalLog>,
    pub stop: Arc<StopSignal>,
}

/// Why a queue thread ended early.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("ring: {0}")]
    Ring(#[from] RingError),
    #[error("I/O engine: {0}")]
    Engine(#[from] crate::engine::EngineError),
    #[error("event channel: {0}")]
    Evtchn(#[from] pvio_hv::HvError),
    #[error("waiting for events: {0}")]
    Poll(#[from] std::io::Error),
    #[error("{0}")]
    Wait(#[from] WaitError),
}

/// Where a request is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// fdatasync before the data (flush and barrier).
    PreSync,
    /// The data parts.
    Data,
    /// fdatasync after the data (a barrier or a flush carrying data).
    PostSync,
}

#[derive(Debug)]
struct Pending {
    req: Request,
    bufs: Vec<IoBuf>,
    temp_handles: Vec<u32>,
    parts_left: u32,
    status: i16,
    stage: Stage,
    started_ns: u64,
}

/// A part waiting for room in the engine.
#[derive(Debug, Clone, Copy)]
enum Part {
    Read {
        slot: u32,
        file: FileId,
        offset: u64,
        from: usize,
        to: usize,
    },
    Write {
        slot: u32,
        file: FileId,
        offset: u64,
        from: usize,
        to: usize,
    },
    Sync {
        slot: u32,
        file: FileId,
    },
    Discard {
        slot: u32,
        file: FileId,
        offset: u64,
        len: u64,
    },
}

impl Part {
    fn slot(&self) -> u32 {
        match *self {
            Part::Read { slot, .. }
            | Part::Write { slot, .. }
            | Part::Sync { slot, .. }
            | Part::Discard { slot, .. } => slot,
        }
    }
}

struct Queue {
    // The engine is dropped first: it drains I/O that may still write guest
    // memory before the memory mapping goes.
    engine: Box<dyn Engine>,
    files: Vec<FileId>,
    ring: BackRing<Blkif, FrameMapping>,
    chan: EventChannel,
    mem: Arc<ForeignMemory>,
    grants: GrantMapper,
    image: Arc<dyn Image>,
    limits: crate::request::DiskLimits,
    waiter: Waiter,
    splitter: Splitter,
    metrics: Arc<QueueMetrics>,
    refusals: Arc<RefusalLog>,
    stop: Arc<StopSignal>,
    slots: Vec<Option<Pending>>,
    free_slots: Vec<u32>,
    parts: VecDeque<Part>,
    /// A barrier waiting for the requests before it to drain.
    barrier: Option<u32>,
    responses: u32,
    stopping: bool,
    extents: Vec<Extent>,
    frames: Vec<u32>,
    completions: Vec<Completion>,
    index: u32,
}

/// Starts a queue thread.
pub fn spawn(
    setup: QueueSetup,
) -> std::io::Result<std::thread::JoinHandle<Result<(), QueueError>>> {
    let name = format!("blkback-d{}q{}", setup.domid, setup.index);
    std::thread::Builder::new().name(name).spawn(move || {
        let mut q = Queue::new(setup)?;
        let r = q.run();
        if let Err(e) = &r {
            tracing::error!(queue = q.index, "queue stopped: {e}");
        }
        q.finish();
        r
    })
}

/// The end of the longest range `[from, end)`, `end <= to`, that covers at
/// most [`MAX_BUFFERS`] of `bufs` (cut at a buffer boundary, so a part stays
/// a whole number of segments).
fn bufs_end(bufs: &[IoBuf], from: usize, to: usize) -> usize {
    let mut pos = 0usize;
    let mut used = 0usize;
    for b in bufs {
        let end = pos + b.len;
        if end > from {
            used += 1;
            if used == MAX_BUFFERS || end >= to {
                return end.min(to);
            }
        }
        pos = end;
    }
    to
}

fn slice_bufs(bufs: &[IoBuf], from: usize, to: usize, out: &mut Vec<IoBuf>) {
    out.clear();
    let mut pos = 0usize;
    for b in bufs {
        let (s, e) = (pos, pos + b.len);
        pos = e;
        if e <= from {
            continue;
        }
        if s >= to {
            break;
        }
        let lo = from.max(s) - s;
        let hi = to.min(e) - s;
        // SAFETY: lo < hi <= b.len, so the pointer stays inside the buffer
        // the caller built from a validated guest frame.
        out.push(IoBuf::new(unsafe { b.ptr.add(lo) }, hi - lo));
    }
}

impl Queue {
    fn new(s: QueueSetup) -> Result<Self, QueueError> {
        // Timers ending predicted sleeps should fire on time, not 50 µs late.
        // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0u64, 0u64, 0u64) };
        let mut engine = s.engine;
        let mut files = Vec::new();
        for f in s.image.files() {
            files.push(engine.add_file(f.file().clone())?);
        }
        if let Err(e) = engine.register_memory(s.mem.clone()) {
            tracing::debug!("guest memory not registered as fixed buffers: {e}");
        }
        let depth = s.ring.size() as usize;
        Ok(Self {
            engine,
            files,
            ring: s.ring,
            chan: s.chan,
            mem: s.mem,
            grants: s.grants,
            image: s.image,
            limits: s.limits,
            waiter: Waiter::new(s.poll, s.load),
            splitter: Splitter::new(s.split),
            metrics: s.metrics,
            refusals: s.refusals,
            stop: s.stop,
            slots: (0..depth).map(|_| None).collect(),
            free_slots: (0..depth as u32).rev().collect(),
            parts: VecDeque::new(),
            barrier: None,
            responses: 0,
            stopping: false,
            extents: Vec::new(),
            frames: Vec::new(),
            completions: Vec::with_capacity(depth * 2),
            index: s.index,
        })
    }

    fn in_flight(&self) -> usize {
        self.slots.len() - self.free_slots.len()
    }

    fn run(&mut self) -> Result<(), QueueError> {
        loop {
            let mut served = 0usize;
            if self.engine.in_flight() > 0 && self.engine.has_completions() {
                let mut done = std::mem::take(&mut self.completions);
                self.engine.reap(&mut done)?;
                served += done.len();
                for c in done.drain(..) {
                    self.complete(c);
                }
                self.completions = done;
                // Answer before looking for more: the frontend may be
                // waiting on these to send its next requests.
                self.publish_responses()?;
            }
            let mut work = served > 0;
            if let Some(slot) = self.barrier {
                if self.in_flight() == 1 && self.parts.is_empty() {
                    self.barrier = None;
                    self.begin(slot);
                    work = true;
                }
            }
            if !self.stopping && self.barrier.is_none() {
                while !self.free_slots.is_empty() {
                    match self.ring.take_request()? {
                        Some(slot) => {
                            served += 1;
                            self.start(slot);
                            // Hand it to the disk now, not after the whole
                            // batch is parsed: a disk that serves its queue
                            // in batches starts on it while we parse the
                            // rest (QD32 reads: +20%).
                            self.pump()?;
                            if self.barrier.is_some() {
                                break;
                            }
                        }
                        None => break,
                    }
                }
            }
            work |= served > 0;
            if served > 0 {
                self.waiter.served(served);
            }
            self.pump()?;
            self.publish_responses()?;
            if self.stop.requested() {
                self.stopping = true;
                if self.in_flight() == 0 {
                    return Ok(());
                }
            }
            if !work {
                self.idle()?;
            }
        }
    }

    /// Makes the responses pushed so far visible, notifying the frontend
    /// if it asked to be.
    fn publish_responses(&mut self) -> Result<(), QueueError> {
        if self.responses > 0 {
            self.responses = 0;
            if self.ring.push_responses_and_check_notify() {
                self.chan.notify()?;
                QueueMetrics::add(&self.metrics.events_sent, 1);
            }
        }
        Ok(())
    }

    /// Hands queued parts to the engine while it has room.
    fn pump(&mut self) -> Result<(), QueueError> {
        let mut submitted = false;
        let mut scratch = Vec::new();
        while let Some(&part) = self.parts.front() {
            if self.engine.in_flight() >= self.engine.capacity() {
                break;
            }
            let slot = part.slot();
            let tag = u64::from(slot);
            let r = match part {
                Part::Read {
                    file,
                    offset,
                    from,
                    to,
                    ..
                }
                | Part::Write {
                    file,
                    offset,
                    from,
                    to,
                    ..
                } => {
                    let p = self.slots[slot as usize]
                        .as_ref()
                        .expect("part of a live request");
                    slice_bufs(&p.bufs, from, to, &mut scratch);
                    // SAFETY: the buffers lie in frames of the guest's memory
                    // that hvd validated and pinned for this request; `mem`
                    // keeps the mapping alive and is dropped after the engine
                    // (field order), which drains in-flight I/O on drop; the
                    // backend makes no Rust reference to these bytes.
                    unsafe {
                        if matches!(part, Part::Read { .. }) {
                            self.engine.submit_read(file, offset, &scratch, tag)
                        } else {
                            self.engine.submit_write(file, offset, &scratch, tag)
                        }
                    }
                }
                Part::Sync { file, .. } => self.engine.submit_fdatasync(file, tag),
                Part::Discard {
                    file, offset, len, ..
                } => self.engine.submit_discard(file, offset, len, tag),
            };
            self.parts.pop_front();
            match r {
                Ok(()) => submitted = true,
                Err(e) => {
                    tracing::warn!(queue = self.index, "submitting I/O failed: {e}");
                    self.part_done(slot, Err(()));
                }
            }
        }
        if submitted {
            self.engine.kick()?;
        }
        Ok(())
    }

    fn respond(&mut self, rsp: &BlkifResponse) {
        if self.ring.push_response(rsp).is_ok() {
            self.responses += 1;
        }
    }

    /// Takes a request copied from the ring: validate, map, queue its parts.
    fn start(&mut self, slot: BlkifRequest) {
        QueueMetrics::add(&self.metrics.requests, 1);
        let mut temp = Vec::new();
        let parsed = {
            let grants = &mut self.grants;
            let mem = &self.mem;
            let mut copy =
                |gref, page: &mut crate::request::IndirectPage| -> Result<(), GrantError> {
                    let f = grants.frame_for_read(gref, &mut temp)?;
                    mem.read(f, 0, page).map_err(GrantError::Hv)
                };
            Request::parse(&slot, &self.limits, &mut copy)
        };
        // Indirect pages were copied; their grants are not needed any more.
        self.grants.release(&temp);
        temp.clear();
        let req = match parsed {
            Ok(r) => r,
            Err(e) => {
                self.refuse(&slot, &e);
                return;
            }
        };
        let op = req.operation();
        let mut bufs = Vec::with_capacity(req.segments().len());
        if !req.segments().is_empty() {
            let grefs: Vec<u32> = req.segments().iter().map(|s| s.gref()).collect();
            let mut frames = std::mem::take(&mut self.frames);
            let mapped = self
                .grants
                .map(&grefs, op.fills_segments(), &mut frames, &mut temp);
            QueueMetrics::set(&self.metrics.grant_map_calls, self.grants.map_calls);
            QueueMetrics::set(
                &self.metrics.persistent_grants,
                self.grants.persistent_count() as u64,
            );
            if let Err(e) = mapped {
                self.frames = frames;
                self.refusals.warn(self.index, "grant", || {
                    format!("refusing request {}: {e}", req.id())
                });
                QueueMetrics::add(&self.metrics.invalid, 1);
                self.respond(&req.response(BLKIF_RSP_ERROR));
                return;
            }
            for (seg, &frame) in req.segments().iter().zip(frames.iter()) {
                let base = match self.mem.frame_ptr(frame) {
                    Ok(p) => p,
                    Err(e) => {
                        self.refusals.warn(self.index, "frame", || {
                            format!("refusing request {}: {e}", req.id())
                        });
                        self.grants.release(&temp);
                        self.frames = frames;
                        QueueMetrics::add(&self.metrics.invalid, 1);
                        self.respond(&req.response(BLKIF_RSP_ERROR));
                        return;
                    }
                };
                // SAFETY: page_offset + len <= 4096 (validated by parse),
                // inside the frame's page of the guest mapping.
                let ptr = unsafe { base.add(seg.page_offset()) };
                match bufs.last_mut() {
                    // SAFETY: only compares addresses.
                    Some(IoBuf { ptr: p, len }) if unsafe { p.add(*len) } == ptr => {
                        *len += seg.len()
                    }
                    _ => bufs.push(IoBuf::new(ptr, seg.len())),
                }
            }
            self.frames = frames;
        }
        match op {
            Operation::Read => {
                QueueMetrics::add(&self.metrics.reads, 1);
                QueueMetrics::add(&self.metrics.bytes_read, req.len_bytes());
            }
            Operation::Write => {
                QueueMetrics::add(&self.metrics.writes, 1);
                QueueMetrics::add(&self.metrics.bytes_written, req.len_bytes());
            }
            Operation::Flush => QueueMetrics::add(&self.metrics.flushes, 1),
            Operation::WriteBarrier => QueueMetrics::add(&self.metrics.barriers, 1),
            Operation::Discard { .. } => QueueMetrics::add(&self.metrics.discards, 1),
            Operation::BlockStatus => {
                // Metadata only: answered here, no I/O in flight.
                QueueMetrics::add(&self.metrics.block_status, 1);
                let status = self.answer_block_status(&req, &bufs);
                self.grants.release(&temp);
                self.respond(&req.response(status));
                return;
            }
        }
        let Some(s) = self.free_slots.pop() else {
            // Cannot happen: we take at most as many requests as slots.
            self.grants.release(&temp);
            self.respond(&req.response(BLKIF_RSP_ERROR));
            return;
        };
        let stage = match op {
            Operation::Flush | Operation::WriteBarrier => Stage::PreSync,
            _ => Stage::Data,
        };
        self.slots[s as usize] = Some(Pending {
            req,
            bufs,
            temp_handles: temp,
            parts_left: 0,
            status: BLKIF_RSP_OKAY,
            stage,
            started_ns: pvio_poll::now_ns(),
        });
        if op == Operation::WriteBarrier && self.in_flight() > 1 {
            // Drain everything before the barrier.
            self.barrier = Some(s);
            return;
        }
        self.begin(s);
    }

    /// Writes what the image holds from the request's sector on into its
    /// answer page (`BLKIF_OP_PVIO_BLOCK_STATUS`); the response's status.
    fn answer_block_status(&mut self, req: &Request, bufs: &[IoBuf]) -> i16 {
        let Some(page) = bufs.first().filter(|b| b.len == XEN_PAGE_SIZE) else {
            // Request::parse admits only one whole page; never expected.
            QueueMetrics::add(&self.metrics.invalid, 1);
            self.refusals.warn(self.index, "block_status", || {
                format!("block status {}: the answer is not one page", req.id())
            });
            return BLKIF_RSP_ERROR;
        };
        let offset = req.disk_offset();
        let len = self.image.size().saturating_sub(offset);
        let mut found = Vec::new();
        if let Err(e) =
            self.image
                .block_status(offset, len, BLKIF_BLOCK_STATUS_PER_PAGE, &mut found)
        {
            QueueMetrics::add(&self.metrics.io_errors, 1);
            self.refusals.warn(self.index, "block_status", || {
                format!("block status from byte {offset}: {e}")
            });
            return BLKIF_RSP_ERROR;
        }
        let mut answer = [0u8; XEN_PAGE_SIZE];
        write_block_status(&mut answer, &found);
        // SAFETY: `page` is the request's one segment, a whole granted page
        // of the guest's memory mapped writable for this request (a
        // block-status answer fills its segment) and kept mapped by `mem`;
        // exactly its 4096 bytes are written, through no Rust reference.
        unsafe { std::ptr::copy_nonoverlapping(answer.as_ptr(), page.ptr, XEN_PAGE_SIZE) };
        BLKIF_RSP_OKAY
    }

    fn refuse(&mut self, slot: &BlkifRequest, e: &RequestError) {
        let rsp = error_response(slot, e);
        if rsp.status == BLKIF_RSP_EOPNOTSUPP {
            QueueMetrics::add(&self.metrics.unsupported, 1);
        } else {
            QueueMetrics::add(&self.metrics.invalid, 1);
        }
        self.refusals.warn(self.index, e.kind(), || {
            format!("refusing request {}: {e}", slot.id)
        });
        self.respond(&rsp);
    }

    /// Queues the parts of the request's current stage.
    fn begin(&mut self, slot: u32) {
        let (stage, op, offset, len) = {
            let p = self.slots[slot as usize].as_ref().expect("live request");
            (
                p.stage,
                p.req.operation(),
                p.req.disk_offset(),
                p.req.len_bytes(),
            )
        };
        let mut parts = 0u32;
        match stage {
            Stage::PreSync | Stage::PostSync => {
                for &f in &self.image.sync_files() {
                    if let Some(&file) = self.files.get(f) {
                        self.parts.push_back(Part::Sync { slot, file });
                        parts += 1;
                    }
                }
            }
            Stage::Data if len == 0 => {}
            Stage::Data => {
                let map_op = match op {
                    Operation::Read => MapOp::Read,
                    Operation::Discard { .. } => MapOp::Discard,
                    _ => MapOp::Write,
                };
                let mut extents = std::mem::take(&mut self.extents);
                extents.clear();
                let mut mapped = self.image.map(map_op, offset, len, &mut extents);
                if matches!(mapped, Ok(MapOutcome::NeedsAllocation)) {
                    // Only formats with allocation get here (not raw).
                    if let Some(img) = Arc::get_mut(&mut self.image) {
                        mapped = img
                            .allocate(offset, len)
                            .and_then(|_| img.map(map_op, offset, len, &mut extents));
                    }
                }
                match mapped {
                    Ok(MapOutcome::Complete) => {
                        let part_size = self.splitter.part_size(len).map(|s| s as usize);
                        let mut pos = 0usize;
                        for e in &extents {
                            let elen = e.len() as usize;
                            match *e {
                                Extent::Zeroes { .. } => self.zero(slot, pos, pos + elen),
                                Extent::File { file, offset, .. } => {
                                    let Some(&fid) = self.files.get(file) else {
                                        continue;
                                    };
                                    if let Operation::Discard { .. } = op {
                                        self.parts.push_back(Part::Discard {
                                            slot,
                                            file: fid,
                                            offset,
                                            len: e.len(),
                                        });
                                        parts += 1;
                                        continue;
                                    }
                                    let step = part_size.unwrap_or(elen).max(1);
                                    let bufs = &self.slots[slot as usize]
                                        .as_ref()
                                        .expect("live request")
                                        .bufs;
                                    let mut at = 0usize;
                                    while at < elen {
                                        let from = pos + at;
                                        // An engine takes at most MAX_BUFFERS
                                        // buffers in one I/O: a request of
                                        // more non-adjacent segments is
                                        // served in several parts.
                                        let mut to = from + step.min(elen - at);
                                        if bufs.len() > MAX_BUFFERS {
                                            to = bufs_end(bufs, from, to);
                                        }
                                        let n = to - from;
                                        let fo = offset + at as u64;
                                        self.parts.push_back(if op.is_read() {
                                            Part::Read {
                                                slot,
                                                file: fid,
                                                offset: fo,
                                                from,
                                                to,
                                            }
                                        } else {
                                            Part::Write {
                                                slot,
                                                file: fid,
                                                offset: fo,
                                                from,
                                                to,
                                            }
                                        });
                                        parts += 1;
                                        at += n;
                                    }
                                }
                            }
                            pos += elen;
                        }
                        if parts > 1 {
                            QueueMetrics::add(&self.metrics.split_parts, u64::from(parts - 1));
                        }
                    }
                    other => {
                        self.extents = extents;
                        self.refusals.warn(self.index, "image", || match other {
                            Err(e) => format!("{len} bytes at {offset}: image: {e}"),
                            Ok(o) => format!("{len} bytes at {offset}: image: {o:?}"),
                        });
                        self.fail_and_finish(slot);
                        return;
                    }
                }
                self.extents = extents;
            }
        }
        let p = self.slots[slot as usize].as_mut().expect("live request");
        p.parts_left = parts;
        if parts == 0 {
            self.advance(slot);
        }
    }

    /// Fills a byte range of a request's buffers with zeroes (unallocated
    /// space of sparse formats).
    fn zero(&mut self, slot: u32, from: usize, to: usize) {
        let p = self.slots[slot as usize].as_ref().expect("live request");
        let mut pieces = Vec::new();
        slice_bufs(&p.bufs, from, to, &mut pieces);
        for b in pieces {
            // SAFETY: the range lies in pinned guest frames of this request
            // (see `pump`); no Rust reference to it exists.
            unsafe { std::ptr::write_bytes(b.ptr, 0, b.len) };
        }
    }

    fn fail_and_finish(&mut self, slot: u32) {
        if let Some(p) = self.slots[slot as usize].as_mut() {
            p.status = BLKIF_RSP_ERROR;
            p.parts_left = 0;
        }
        self.finish_request(slot);
    }

    fn complete(&mut self, c: Completion) {
        let slot = c.tag as u32;
        let r = match &c.result {
            Ok(_) => Ok(()),
            Err(CompletionError::Os { errno }) if *errno == libc::EOPNOTSUPP => {
                if let Some(p) = self.slots.get_mut(slot as usize).and_then(Option::as_mut) {
                    p.status = BLKIF_RSP_EOPNOTSUPP;
                }
                Err(())
            }
            Err(e) => {
                self.refusals
                    .warn(self.index, "io_error", || format!("I/O failed: {e}"));
                Err(())
            }
        };
        self.part_done(slot, r);
    }

    fn part_done(&mut self, slot: u32, r: Result<(), ()>) {
        let Some(p) = self.slots.get_mut(slot as usize).and_then(Option::as_mut) else {
            tracing::error!(queue = self.index, slot, "completion for no request");
            return;
        };
        if r.is_err() && p.status == BLKIF_RSP_OKAY {
            p.status = BLKIF_RSP_ERROR;
        }
        p.parts_left = p.parts_left.saturating_sub(1);
        if p.parts_left == 0 {
            self.advance(slot);
        }
    }

    /// The current stage is done: start the next, or answer.
    fn advance(&mut self, slot: u32) {
        let p = self.slots[slot as usize].as_mut().expect("live request");
        if p.status != BLKIF_RSP_OKAY {
            return self.finish_request(slot);
        }
        let has_data = p.req.len_bytes() > 0;
        let next = match (p.stage, p.req.operation()) {
            (Stage::PreSync, _) if has_data => Some(Stage::Data),
            (Stage::Data, Operation::WriteBarrier | Operation::Flush) => Some(Stage::PostSync),
            _ => None,
        };
        match next {
            Some(stage) => {
                p.stage = stage;
                self.begin(slot);
            }
            None => self.finish_request(slot),
        }
    }

    fn finish_request(&mut self, slot: u32) {
        let Some(p) = self.slots[slot as usize].take() else {
            return;
        };
        self.free_slots.push(slot);
        if p.status == BLKIF_RSP_ERROR {
            QueueMetrics::add(&self.metrics.io_errors, 1);
        }
        if p.req.operation().is_read() || p.req.operation() == Operation::Write {
            self.splitter.observe(
                p.req.len_bytes(),
                pvio_poll::now_ns().saturating_sub(p.started_ns),
            );
        }
        self.grants.release(&p.temp_handles);
        self.respond(&p.req.response(p.status));
    }

    /// Nothing to do: the waiter spins or blocks, as its pollers say.
    fn idle(&mut self) -> Result<(), QueueError> {
        let stop = self.stop.clone();
        let woken = self.waiter.idle(
            &mut self.ring,
            &self.chan,
            Some(self.engine.as_mut()),
            stop.efd.as_fd(),
            &|| stop.requested(),
        )?;
        if woken.event {
            QueueMetrics::add(&self.metrics.events_received, 1);
        }
        self.export_poll_stats(woken.blocked);
        Ok(())
    }

    /// Publishes the poller's counters; the thread's CPU time (a system
    /// call) only after blocking, never on the spinning path.
    fn export_poll_stats(&self, with_cpu: bool) {
        let s = self.waiter.stats();
        let m = &self.metrics;
        QueueMetrics::set(&m.polls, s.polls);
        QueueMetrics::set(&m.poll_hits, s.poll_hits);
        QueueMetrics::set(&m.poll_ns, s.spin_ns);
        QueueMetrics::set(&m.poll_lost_ns, s.lost_ns);
        QueueMetrics::set(&m.steal_refusals, s.steal_refusals);
        QueueMetrics::set(&m.timed_sleeps, s.timed_blocks);
        if with_cpu {
            QueueMetrics::set(&m.cpu_ns, pvio_poll::thread_cpu_ns());
        }
    }

    /// Drains the engine and answers whatever is left, then releases grants.
    fn finish(&mut self) {
        let mut done = Vec::new();
        if let Err(e) = self.engine.shutdown(&mut done) {
            tracing::warn!(queue = self.index, "draining I/O: {e}");
        }
        for c in done {
            self.complete(c);
        }
        while let Some(part) = self.parts.pop_front() {
            self.part_done(part.slot(), Err(()));
        }
        if self.responses > 0 && self.ring.push_responses_and_check_notify() {
            let _ = self.chan.notify();
        }
        self.export_poll_stats(true);
        let (req, io) = self.waiter.stats_apart();
        for (waiting_for, s) in [("requests", req), ("I/O", io)] {
            tracing::debug!(
                queue = self.index,
                waiting_for,
                stats = %s,
                "backend queue polling"
            );
        }
        self.grants.unmap_all();
    }
}
