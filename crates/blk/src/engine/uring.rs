//! The io_uring engine: one ring per backend thread, driven directly with
//! the `io-uring` crate (no runtime), as tapdisk3's and QEMU's io_uring
//! back ends do.
//!
//! * Each request is one SQE whose `user_data` is the index of its slot in
//!   a slab; the slot owns the iovec array and remembers the caller's tag,
//!   file and expected length until the CQE arrives.
//! * Memory registered with [`Engine::register_memory`] becomes fixed
//!   buffers lazily, one [`FIXED_CHUNK`] at a time when a request first
//!   uses it (a sparse table filled with `IORING_REGISTER_BUFFERS_UPDATE`).
//!   Registering pins, and so populates, every page of a buffer: pinning a
//!   whole guest's memory up front would allocate and clear all of it (a
//!   bootstorm spent a third of its CPU doing that), while a guest's I/O
//!   buffers are a few megabytes. A request whose buffers all lie in one
//!   chunk uses `READ_FIXED`/`WRITE_FIXED` (one buffer) or
//!   `READV_FIXED`/`WRITEV_FIXED` (several, Linux 6.15+); anything else uses
//!   `READV`/`WRITEV`.
//! * Completions raise an eventfd registered with `IORING_REGISTER_EVENTFD`.
//! * Shutdown submits one `ASYNC_CANCEL` matching everything, then waits for
//!   every CQE before the slab, the files or the registered memory are
//!   freed (the use-after-free lesson of foyer#1286 and compio#943).
//!
//! Construction probes the kernel: a failing `io_uring_setup` (seccomp,
//! `kernel.io_uring_disabled`) is [`EngineError::UringUnavailable`], a
//! missing opcode or feature [`EngineError::UringUnsupported`], so the
//! caller can fall back to the thread pool.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{opcode, register::Probe, types, IoUring};

use super::error::result_of;
use super::files::FileTable;
use super::{
    iovecs, Completion, Engine, EngineConfig, EngineError, EngineKind, EngineStats, FileId, IoBuf,
    MemoryRegion,
};

/// The unit of lazy registration (aligned to the start of its region).
pub const FIXED_CHUNK: usize = 8 << 20;
/// Slots in the fixed-buffer table (so up to 8 GiB of touched memory; I/O
/// beyond works unregistered).
pub const FIXED_BUFFER_SLOTS: u32 = 1024;
/// `user_data` of the shutdown cancel request (slot indices are smaller).
const CANCEL_USER_DATA: u64 = u64::MAX;
/// How long shutdown waits between complaints about stuck requests.
const STUCK_WARNING: Duration = Duration::from_secs(10);

/// A request in flight.
struct Op {
    tag: u64,
    file: FileId,
    /// Bytes a read or write must move; 0 for fdatasync and discard.
    expected: usize,
    /// The iovec array the SQE points at; kept until the CQE.
    _iov: Vec<libc::iovec>,
}

/// Memory whose chunks may be registered.
struct Region {
    start: usize,
    len: usize,
    _keep: Arc<dyn MemoryRegion>,
}

/// The io_uring engine.
pub struct UringEngine {
    // Declared first so it is dropped first: the ring goes (after the drain
    // in Drop) before the memory it may point into.
    ring: IoUring,
    eventfd: OwnedFd,
    ops: Vec<Option<Op>>,
    free_slots: Vec<u32>,
    /// Reused by `reap` to copy CQEs out of the ring.
    cqe_scratch: Vec<(u64, i32)>,
    files: FileTable,
    regions: Vec<Region>,
    /// Registered chunks: start address → fixed-buffer index.
    chunks: std::collections::HashMap<usize, u16>,
    fixed_slots: u32,
    vectored_fixed: bool,
    capacity: usize,
    in_flight: usize,
    cancels_pending: usize,
    stats: EngineStats,
    shut_down: bool,
}

// SAFETY: the raw pointers an engine holds (iovec arrays of requests in
// flight, registered memory) are addresses handed to the kernel under the
// submit and MemoryRegion contracts; none is tied to the thread that
// created it, and the engine is used by one thread at a time (&mut self).
unsafe impl Send for UringEngine {}

impl std::fmt::Debug for UringEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringEngine")
            .field("capacity", &self.capacity)
            .field("in_flight", &self.in_flight)
            .field("fixed_chunks", &self.chunks.len())
            .field("vectored_fixed", &self.vectored_fixed)
            .field("stats", &self.stats)
            .finish()
    }
}

impl UringEngine {
    /// Sets up a ring for `config.queue_depth` requests and probes what the
    /// kernel offers.
    pub fn new(config: &EngineConfig) -> Result<Self, EngineError> {
        let capacity = config.queue_depth.clamp(1, 4096);
        // Cooperative task running: completion work is not pushed at the
        // thread with an interrupt (an IPI, and a VM exit, per completion on
        // a VM) but flagged, and run at the thread's next system call;
        // `has_completions` makes that call when the flag is up. Kernels
        // before 5.19 lack it: fall back to the default setup.
        let ring = IoUring::builder()
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(capacity)
            .or_else(|_| IoUring::builder().build(capacity))
            .map_err(EngineError::UringUnavailable)?;
        if !ring.params().is_feature_ext_arg() {
            return Err(EngineError::UringUnsupported(
                "IORING_FEAT_EXT_ARG (waits with a timeout, Linux 5.11)",
            ));
        }
        let mut probe = Probe::new();
        ring.submitter()
            .register_probe(&mut probe)
            .map_err(|_| EngineError::UringUnsupported("IORING_REGISTER_PROBE (Linux 5.6)"))?;
        let required = [
            (opcode::Readv::CODE, "IORING_OP_READV"),
            (opcode::Writev::CODE, "IORING_OP_WRITEV"),
            (opcode::ReadFixed::CODE, "IORING_OP_READ_FIXED"),
            (opcode::WriteFixed::CODE, "IORING_OP_WRITE_FIXED"),
            (opcode::Fsync::CODE, "IORING_OP_FSYNC"),
            (opcode::Fallocate::CODE, "IORING_OP_FALLOCATE"),
            (opcode::AsyncCancel::CODE, "IORING_OP_ASYNC_CANCEL"),
        ];
        for (code, name) in required {
            if !probe.is_supported(code) {
                return Err(EngineError::UringUnsupported(name));
            }
        }
        let vectored_fixed = probe.is_supported(opcode::ReadvFixed::CODE)
            && probe.is_supported(opcode::WritevFixed::CODE);
        let eventfd = super::completion_eventfd()?;
        ring.submitter()
            .register_eventfd(eventfd.as_raw_fd())
            .map_err(|e| EngineError::sys("IORING_REGISTER_EVENTFD", e))?;
        let fixed_slots = match ring.submitter().register_buffers_sparse(FIXED_BUFFER_SLOTS) {
            Ok(()) => FIXED_BUFFER_SLOTS,
            Err(e) => {
                tracing::info!("io_uring fixed buffers unavailable ({e}); using READV/WRITEV");
                0
            }
        };
        Ok(Self {
            ring,
            eventfd,
            ops: Vec::with_capacity(capacity as usize),
            free_slots: Vec::new(),
            cqe_scratch: Vec::new(),
            files: FileTable::default(),
            regions: Vec::new(),
            chunks: std::collections::HashMap::new(),
            fixed_slots,
            vectored_fixed,
            capacity: capacity as usize,
            in_flight: 0,
            cancels_pending: 0,
            stats: EngineStats::default(),
            shut_down: false,
        })
    }

    /// Whether `READV_FIXED`/`WRITEV_FIXED` are available.
    pub fn has_vectored_fixed(&self) -> bool {
        self.vectored_fixed
    }

    /// The fixed buffer that holds every buffer, registering its chunk on
    /// first use; `None` when the buffers are outside registered memory,
    /// span chunks, or the table is full.
    fn fixed_piece(&mut self, iov: &[libc::iovec]) -> Option<u16> {
        let first = iov.first()?.iov_base as usize;
        let r = self
            .regions
            .iter()
            .find(|r| first >= r.start && first < r.start + r.len)?;
        let cstart = r.start + (first - r.start) / FIXED_CHUNK * FIXED_CHUNK;
        let clen = FIXED_CHUNK.min(r.start + r.len - cstart);
        let inside = |v: &libc::iovec| {
            let a = v.iov_base as usize;
            a >= cstart && a.checked_add(v.iov_len).is_some_and(|e| e <= cstart + clen)
        };
        if !iov.iter().all(inside) {
            return None;
        }
        if let Some(&idx) = self.chunks.get(&cstart) {
            return Some(idx);
        }
        let idx = self.chunks.len() as u32;
        if idx >= self.fixed_slots {
            return None;
        }
        let v = [libc::iovec {
            iov_base: cstart as *mut libc::c_void,
            iov_len: clen,
        }];
        // SAFETY: the chunk lies inside a region the engine keeps alive (its
        // Arc is in `regions`) until it is dropped, after the ring.
        let r = unsafe { self.ring.submitter().register_buffers_update(idx, &v, None) };
        match r {
            Ok(_) => {
                self.chunks.insert(cstart, idx as u16);
                Some(idx as u16)
            }
            Err(e) => {
                tracing::debug!("registering a fixed buffer: {e}; using unregistered I/O");
                // Do not retry on every request.
                self.fixed_slots = idx;
                None
            }
        }
    }

    fn check_room(&self) -> Result<(), EngineError> {
        if self.shut_down {
            return Err(EngineError::ShutDown);
        }
        if self.in_flight >= self.capacity {
            return Err(EngineError::QueueFull {
                capacity: self.capacity,
            });
        }
        Ok(())
    }

    /// Stores `op` in a free slot; returns the slot index.
    fn store(&mut self, op: Op) -> usize {
        match self.free_slots.pop() {
            Some(i) => {
                self.ops[i as usize] = Some(op);
                i as usize
            }
            None => {
                self.ops.push(Some(op));
                self.ops.len() - 1
            }
        }
    }

    /// Pushes the SQE for the op in `slot`; on failure frees the slot.
    ///
    /// # Safety
    ///
    /// Every pointer in `entry` must stay valid until its CQE is reaped
    /// (the slot's iovecs are; buffers are the submitter's promise).
    unsafe fn push(
        &mut self,
        slot: usize,
        entry: io_uring::squeue::Entry,
    ) -> Result<(), EngineError> {
        let entry = entry.user_data(slot as u64);
        // SAFETY: the caller guarantees the entry's pointers.
        let mut pushed = unsafe { self.ring.submission().push(&entry).is_ok() };
        if !pushed && self.kick().is_ok() {
            // The SQ was full of unsubmitted entries, now handed over: retry.
            // SAFETY: as above.
            pushed = unsafe { self.ring.submission().push(&entry).is_ok() };
        }
        let file = self.ops[slot].as_ref().map(|o| o.file);
        if !pushed {
            self.ops[slot] = None;
            self.free_slots.push(slot as u32);
            return Err(EngineError::QueueFull {
                capacity: self.capacity,
            });
        }
        if let Some(f) = file {
            self.files.begin(f);
        }
        self.in_flight += 1;
        self.stats.submitted += 1;
        Ok(())
    }

    /// Queues a read or write.
    ///
    /// # Safety
    ///
    /// The [`Engine::submit_read`] contract.
    unsafe fn submit_rw(
        &mut self,
        write: bool,
        file: FileId,
        offset: u64,
        bufs: &[IoBuf],
        tag: u64,
    ) -> Result<(), EngineError> {
        self.check_room()?;
        let (iov, len) = iovecs(bufs)?;
        let fd = types::Fd(self.files.get(file)?.as_raw_fd());
        let fixed = self.fixed_piece(&iov);
        let (iov_ptr, iov_len) = (iov.as_ptr(), iov.len() as u32);
        let (buf0, len0) = (iov[0].iov_base.cast::<u8>(), iov[0].iov_len as u32);
        let entry = match fixed {
            Some(idx) if iov_len == 1 && write => opcode::WriteFixed::new(fd, buf0, len0, idx)
                .offset(offset)
                .build(),
            Some(idx) if iov_len == 1 => opcode::ReadFixed::new(fd, buf0, len0, idx)
                .offset(offset)
                .build(),
            Some(idx) if self.vectored_fixed && write => {
                opcode::WritevFixed::new(fd, iov_ptr, iov_len, idx)
                    .offset(offset)
                    .build()
            }
            Some(idx) if self.vectored_fixed => opcode::ReadvFixed::new(fd, iov_ptr, iov_len, idx)
                .offset(offset)
                .build(),
            _ if write => opcode::Writev::new(fd, iov_ptr, iov_len)
                .offset(offset)
                .build(),
            _ => opcode::Readv::new(fd, iov_ptr, iov_len)
                .offset(offset)
                .build(),
        };
        let is_fixed = fixed.is_some() && (iov_len == 1 || self.vectored_fixed);
        // Moving the Vec into the slab keeps its heap buffer (iov_ptr) where
        // it is.
        let slot = self.store(Op {
            tag,
            file,
            expected: len,
            _iov: iov,
        });
        // SAFETY: iov_ptr points into the slot's Vec, freed only when the
        // CQE is reaped; the data buffers are the caller's promise; fd stays
        // open because the file table refuses to drop a file in use.
        unsafe { self.push(slot, entry)? };
        if is_fixed {
            self.stats.fixed += 1;
        } else {
            self.stats.vectored += 1;
        }
        Ok(())
    }

    fn submit_simple(
        &mut self,
        file: FileId,
        tag: u64,
        build: impl FnOnce(types::Fd) -> io_uring::squeue::Entry,
    ) -> Result<(), EngineError> {
        self.check_room()?;
        let fd = types::Fd(self.files.get(file)?.as_raw_fd());
        let slot = self.store(Op {
            tag,
            file,
            expected: 0,
            _iov: Vec::new(),
        });
        // SAFETY: fdatasync and fallocate SQEs hold no pointers; the fd stays
        // open while the request is in flight (file table).
        unsafe { self.push(slot, build(fd)) }
    }

    /// Enters the kernel to submit and wait for `want` CQEs for at most
    /// `left`. Returns false on timeout.
    fn enter(&mut self, want: usize, left: Option<Duration>) -> Result<bool, EngineError> {
        let r = match left {
            None => self.ring.submit_and_wait(want),
            Some(t) => {
                let ts = types::Timespec::from(t);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(want, &args)
            }
        };
        match r {
            Ok(_) => Ok(true),
            Err(e) => match e.raw_os_error() {
                Some(libc::ETIME) => Ok(false),
                Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY) => Ok(true),
                _ => Err(EngineError::sys("io_uring_enter", e)),
            },
        }
    }

    fn drain(&mut self, out: &mut Vec<Completion>) -> Result<(), EngineError> {
        let mut next_warning = Instant::now() + STUCK_WARNING;
        loop {
            self.reap(out)?;
            if self.in_flight == 0 && self.cancels_pending == 0 {
                return Ok(());
            }
            self.enter(1, Some(Duration::from_secs(1)))?;
            if Instant::now() >= next_warning {
                tracing::warn!(
                    in_flight = self.in_flight,
                    "io_uring shutdown still waiting for requests in flight"
                );
                next_warning = Instant::now() + STUCK_WARNING;
            }
        }
    }
}

impl Engine for UringEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Uring
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn add_file(&mut self, file: Arc<File>) -> Result<FileId, EngineError> {
        Ok(self.files.add(file))
    }

    fn remove_file(&mut self, id: FileId) -> Result<(), EngineError> {
        self.files.remove(id)
    }

    fn register_memory(&mut self, region: Arc<dyn MemoryRegion>) -> Result<(), EngineError> {
        if self.fixed_slots == 0 {
            return Err(EngineError::UringUnsupported("registered buffers"));
        }
        // Chunks are registered when requests first use them.
        self.regions.push(Region {
            start: region.as_ptr() as usize,
            len: region.len(),
            _keep: region,
        });
        Ok(())
    }

    unsafe fn submit_read(
        &mut self,
        file: FileId,
        offset: u64,
        bufs: &[IoBuf],
        tag: u64,
    ) -> Result<(), EngineError> {
        // SAFETY: the caller upholds the submit_read contract.
        unsafe { self.submit_rw(false, file, offset, bufs, tag) }
    }

    unsafe fn submit_write(
        &mut self,
        file: FileId,
        offset: u64,
        bufs: &[IoBuf],
        tag: u64,
    ) -> Result<(), EngineError> {
        // SAFETY: the caller upholds the submit_write contract.
        unsafe { self.submit_rw(true, file, offset, bufs, tag) }
    }

    fn submit_fdatasync(&mut self, file: FileId, tag: u64) -> Result<(), EngineError> {
        self.submit_simple(file, tag, |fd| {
            opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build()
        })
    }

    fn submit_discard(
        &mut self,
        file: FileId,
        offset: u64,
        len: u64,
        tag: u64,
    ) -> Result<(), EngineError> {
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        self.submit_simple(file, tag, |fd| {
            opcode::Fallocate::new(fd, len)
                .offset(offset)
                .mode(mode)
                .build()
        })
    }

    fn kick(&mut self) -> Result<(), EngineError> {
        self.enter(0, None).map(|_| ())
    }

    fn has_completions(&mut self) -> bool {
        if !self.ring.completion().is_empty() {
            return true;
        }
        // Completion work waiting for us to enter the kernel (see `new`).
        if self.in_flight > 0 && self.ring.submission().taskrun() {
            let _ = self.enter(0, None);
            return !self.ring.completion().is_empty();
        }
        false
    }

    fn prepare_to_block(&mut self) -> Result<bool, EngineError> {
        super::clear_eventfd(self.eventfd.as_fd())?;
        Ok(self.has_completions())
    }

    fn reap(&mut self, out: &mut Vec<Completion>) -> Result<usize, EngineError> {
        let mut cqes = std::mem::take(&mut self.cqe_scratch);
        cqes.clear();
        cqes.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        let mut n = 0;
        for &(user_data, res) in &cqes {
            if user_data == CANCEL_USER_DATA {
                self.cancels_pending = self.cancels_pending.saturating_sub(1);
                continue;
            }
            let Some(op) = self.ops.get_mut(user_data as usize).and_then(Option::take) else {
                tracing::error!(user_data, "io_uring completion for no request");
                continue;
            };
            self.free_slots.push(user_data as u32);
            self.files.end(op.file);
            self.in_flight -= 1;
            let result = result_of(i64::from(res), op.expected);
            self.stats.completed += 1;
            if result.is_err() {
                self.stats.failed += 1;
            }
            out.push(Completion {
                tag: op.tag,
                result,
            });
            n += 1;
        }
        self.cqe_scratch = cqes;
        Ok(n)
    }

    fn wait(
        &mut self,
        min: usize,
        timeout: Option<Duration>,
        out: &mut Vec<Completion>,
    ) -> Result<usize, EngineError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        self.kick()?;
        let mut got = self.reap(out)?;
        while got < min && self.in_flight > 0 {
            let want = (min - got).min(self.in_flight);
            let left = match deadline {
                None => None,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        break;
                    }
                    Some(d - now)
                }
            };
            let in_time = self.enter(want, left)?;
            got += self.reap(out)?;
            if !in_time {
                break;
            }
        }
        Ok(got)
    }

    fn notify_fd(&self) -> BorrowedFd<'_> {
        self.eventfd.as_fd()
    }

    fn stats(&self) -> EngineStats {
        self.stats
    }

    fn shutdown(&mut self, out: &mut Vec<Completion>) -> Result<(), EngineError> {
        if !self.shut_down && self.in_flight > 0 {
            let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any())
                .build()
                .user_data(CANCEL_USER_DATA);
            // SAFETY: a cancel SQE holds no pointers.
            if unsafe { self.ring.submission().push(&cancel).is_ok() } {
                self.cancels_pending += 1;
            }
        }
        self.shut_down = true;
        self.kick()?;
        self.drain(out)
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        let mut out = Vec::new();
        if let Err(e) = self.shutdown(&mut out) {
            // The kernel may still use the iovecs and registered memory:
            // leak them rather than free memory it could write.
            tracing::error!(
                in_flight = self.in_flight,
                "io_uring shutdown failed ({e}); leaking its buffers"
            );
            std::mem::forget(std::mem::take(&mut self.ops));
            std::mem::forget(std::mem::take(&mut self.regions));
        }
    }
}
