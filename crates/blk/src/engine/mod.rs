//! I/O engines: asynchronous reads, writes, fdatasync and discard between
//! guest memory and image files, completed by tag.
//!
//! Two implementations share the [`Engine`] trait, like Firecracker's
//! `io/async_io.rs` and `io/sync_io.rs` and tapdisk's libaio/io_uring
//! back ends:
//!
//! * [`UringEngine`]: one io_uring per backend thread (the `io-uring` crate,
//!   no runtime). Guest memory registered with [`Engine::register_memory`]
//!   becomes fixed buffers, so I/O into it uses `READ_FIXED`/`WRITE_FIXED`
//!   (or `READV_FIXED`/`WRITEV_FIXED` where the kernel has them); other
//!   memory goes through `READV`/`WRITEV`.
//! * [`ThreadPoolEngine`]: `preadv`/`pwritev`/`fdatasync`/`fallocate` on a
//!   few worker threads, for hosts where io_uring is disabled (seccomp,
//!   `kernel.io_uring_disabled`).
//!
//! [`open_engine`] picks one (`--io-engine uring|threads|auto`).
//!
//! Both expose [`Engine::notify_fd`], an eventfd that is readable while
//! completions wait to be reaped, so a backend thread can sleep on its
//! event channel and its engine in one `poll`. Both cancel and drain every
//! request in flight before they free anything ([`Engine::shutdown`], also
//! run on drop): the kernel or a worker may write guest memory until a
//! request's completion has been seen.

mod error;
mod files;
mod threads;
mod uring;

use std::fmt;
use std::fs::File;
use std::os::fd::BorrowedFd;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

pub use error::{CompletionError, EngineError};
pub use threads::ThreadPoolEngine;
pub use uring::UringEngine;

/// Most buffers in one request (`UIO_MAXIOV`).
pub const MAX_BUFFERS: usize = 1024;
/// Most bytes in one request (an io_uring result is an `i32`).
pub const MAX_REQUEST_BYTES: usize = i32::MAX as usize;

/// A file added to an engine with [`Engine::add_file`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(pub(crate) u32);

/// One buffer of a vectored request: `len` bytes at `ptr`, usually inside a
/// guest's memory mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoBuf {
    /// Start address.
    pub ptr: *mut u8,
    /// Length in bytes.
    pub len: usize,
}

impl IoBuf {
    /// A buffer of `len` bytes at `ptr`.
    pub fn new(ptr: *mut u8, len: usize) -> Self {
        Self { ptr, len }
    }
}

/// A finished request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The tag given at submission.
    pub tag: u64,
    /// Bytes moved (the whole request: a short transfer is an error), 0 for
    /// fdatasync and discard; or why it failed.
    pub result: Result<usize, CompletionError>,
}

/// Which implementation an engine is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineKind {
    /// [`UringEngine`].
    Uring,
    /// [`ThreadPoolEngine`].
    Threads,
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EngineKind::Uring => "uring",
            EngineKind::Threads => "threads",
        })
    }
}

/// What `--io-engine` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum EngineChoice {
    /// io_uring if the kernel allows it, else the thread pool.
    #[default]
    Auto,
    /// io_uring or fail.
    Uring,
    /// The thread pool.
    Threads,
}

impl FromStr for EngineChoice {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self, EngineError> {
        match s {
            "auto" => Ok(EngineChoice::Auto),
            "uring" | "io_uring" => Ok(EngineChoice::Uring),
            "threads" => Ok(EngineChoice::Threads),
            _ => Err(EngineError::UnknownEngine(s.to_owned())),
        }
    }
}

impl fmt::Display for EngineChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EngineChoice::Auto => "auto",
            EngineChoice::Uring => "uring",
            EngineChoice::Threads => "threads",
        })
    }
}

/// Engine sizing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    /// Most requests in flight at once (the io_uring's size).
    pub queue_depth: u32,
    /// Worker threads of the thread pool.
    pub threads: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            queue_depth: 256,
            threads: 4,
        }
    }
}

/// Counters of one engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineStats {
    /// Requests accepted.
    pub submitted: u64,
    /// Completions reaped.
    pub completed: u64,
    /// Completions that carried an error.
    pub failed: u64,
    /// Reads and writes done on registered (fixed) buffers.
    pub fixed: u64,
    /// Reads and writes done with plain vectored I/O.
    pub vectored: u64,
}

/// Memory that can be registered with an engine ([`Engine::register_memory`]).
///
/// # Safety
///
/// `as_ptr()..as_ptr() + len()` must be one mapping of readable and
/// writable memory that stays mapped, at the same address, as long as the
/// value lives.
pub unsafe trait MemoryRegion: Send + Sync {
    /// Start address.
    fn as_ptr(&self) -> *mut u8;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the region is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// SAFETY: a Mapping is one mmap of `len` bytes, unmapped only on drop.
unsafe impl MemoryRegion for pvio_hv::memory::Mapping {
    fn as_ptr(&self) -> *mut u8 {
        pvio_hv::memory::Mapping::as_ptr(self)
    }
    fn len(&self) -> usize {
        pvio_hv::memory::Mapping::len(self)
    }
}

// SAFETY: ForeignMemory owns its whole-memory Mapping for its lifetime.
unsafe impl MemoryRegion for pvio_hv::memory::ForeignMemory {
    fn as_ptr(&self) -> *mut u8 {
        self.mapping().as_ptr()
    }
    fn len(&self) -> usize {
        self.mapping().len()
    }
}

// SAFETY: GuestMemory owns its whole-memory Mapping for its lifetime.
unsafe impl MemoryRegion for pvio_hv::memory::GuestMemory {
    fn as_ptr(&self) -> *mut u8 {
        self.mapping().as_ptr()
    }
    fn len(&self) -> usize {
        self.mapping().len()
    }
}

/// An asynchronous I/O engine owned by one backend thread.
///
/// Requests are queued by the `submit_*` calls, handed to the kernel or the
/// workers by [`Engine::kick`] (or [`Engine::wait`]), and come back as
/// [`Completion`]s carrying the caller's tag, in any order. At most
/// [`Engine::capacity`] requests may be in flight; beyond that a submission
/// fails with [`EngineError::QueueFull`].
pub trait Engine: Send {
    /// Which implementation this is.
    fn kind(&self) -> EngineKind;

    /// Most requests in flight at once.
    fn capacity(&self) -> usize;

    /// Requests submitted and not yet reaped.
    fn in_flight(&self) -> usize;

    /// Makes `file` usable by requests; the engine keeps it open until it
    /// is removed and no request uses it.
    fn add_file(&mut self, file: Arc<File>) -> Result<FileId, EngineError>;

    /// Forgets a file; fails with [`EngineError::FileBusy`] while requests
    /// on it are in flight.
    fn remove_file(&mut self, id: FileId) -> Result<(), EngineError>;

    /// Registers memory that requests' buffers will lie in, so I/O into it
    /// can avoid per-request page pinning (io_uring fixed buffers, registered
    /// a chunk at a time as requests first touch them, so memory no request
    /// uses is never pinned). The engine keeps `region` alive until
    /// it is dropped. Optional: buffers outside registered memory work too,
    /// and after an error here I/O into `region` still works, unregistered.
    fn register_memory(&mut self, region: Arc<dyn MemoryRegion>) -> Result<(), EngineError>;

    /// Queues a read of `bufs` (in order) from `offset` of `file`.
    ///
    /// # Safety
    ///
    /// Every buffer must be valid for writes of its `len` bytes, and stay
    /// mapped and not otherwise used (no Rust reference to it read or
    /// written, no other request on it) from this call until the
    /// completion carrying `tag` is returned by [`Engine::reap`],
    /// [`Engine::wait`] or [`Engine::shutdown`], or the engine has been
    /// dropped. If this call returns an error, the request was not queued
    /// and the buffers are free again at once.
    unsafe fn submit_read(
        &mut self,
        file: FileId,
        offset: u64,
        bufs: &[IoBuf],
        tag: u64,
    ) -> Result<(), EngineError>;

    /// Queues a write of `bufs` (in order) at `offset` of `file`.
    ///
    /// # Safety
    ///
    /// As for [`Engine::submit_read`], with the buffers valid for reads;
    /// their contents must not change until the completion is returned.
    unsafe fn submit_write(
        &mut self,
        file: FileId,
        offset: u64,
        bufs: &[IoBuf],
        tag: u64,
    ) -> Result<(), EngineError>;

    /// Queues an `fdatasync` of `file`. It covers the writes that
    /// completed before it was submitted; it does not order itself after
    /// writes still in flight.
    fn submit_fdatasync(&mut self, file: FileId, tag: u64) -> Result<(), EngineError>;

    /// Queues a discard: `fallocate(PUNCH_HOLE | KEEP_SIZE)` of `len` bytes
    /// at `offset`; the range then reads as zeroes.
    fn submit_discard(
        &mut self,
        file: FileId,
        offset: u64,
        len: u64,
        tag: u64,
    ) -> Result<(), EngineError>;

    /// Hands queued requests to the kernel or the workers.
    fn kick(&mut self) -> Result<(), EngineError>;

    /// Whether completions are ready to reap. Makes no system call, so a
    /// polling backend can ask in its spin loop.
    fn has_completions(&mut self) -> bool;

    /// Appends completions that are ready, without blocking; returns how
    /// many. Does not touch [`Engine::notify_fd`].
    fn reap(&mut self, out: &mut Vec<Completion>) -> Result<usize, EngineError>;

    /// Call before blocking on [`Engine::notify_fd`]: clears the fd, then
    /// checks again, so a completion that raced with the clear is not slept
    /// through (the same final check as a ring's). Returns true if
    /// completions are ready, in which case do not block.
    fn prepare_to_block(&mut self) -> Result<bool, EngineError>;

    /// Kicks, then appends completions until at least `min` (capped at the
    /// number in flight) have been appended or `timeout` passes (`None`:
    /// no limit); returns how many were appended.
    fn wait(
        &mut self,
        min: usize,
        timeout: Option<Duration>,
        out: &mut Vec<Completion>,
    ) -> Result<usize, EngineError>;

    /// An fd that is readable while completions wait to be reaped.
    fn notify_fd(&self) -> BorrowedFd<'_>;

    /// Counters.
    fn stats(&self) -> EngineStats;

    /// Cancels what can be cancelled, waits for every request in flight,
    /// and appends their completions (cancelled ones fail with
    /// `ECANCELED`). Afterwards the engine refuses submissions. Dropping an
    /// engine does the same and discards the completions.
    fn shutdown(&mut self, out: &mut Vec<Completion>) -> Result<(), EngineError>;
}

/// Opens the engine `choice` asks for. With [`EngineChoice::Auto`], an
/// io_uring that cannot be set up (disabled, filtered, too old) falls back
/// to the thread pool with one log line.
pub fn open_engine(
    choice: EngineChoice,
    config: &EngineConfig,
) -> Result<Box<dyn Engine>, EngineError> {
    select_engine(choice, config, UringEngine::new)
}

fn select_engine(
    choice: EngineChoice,
    config: &EngineConfig,
    uring: impl FnOnce(&EngineConfig) -> Result<UringEngine, EngineError>,
) -> Result<Box<dyn Engine>, EngineError> {
    match choice {
        EngineChoice::Threads => Ok(Box::new(ThreadPoolEngine::new(config)?)),
        EngineChoice::Uring => Ok(Box::new(uring(config)?)),
        EngineChoice::Auto => match uring(config) {
            Ok(e) => Ok(Box::new(e)),
            Err(e) if e.is_unavailable() => {
                tracing::warn!("io_uring unavailable ({e}); using the thread-pool I/O engine");
                Ok(Box::new(ThreadPoolEngine::new(config)?))
            }
            Err(e) => Err(e),
        },
    }
}

/// A non-blocking eventfd private to one engine, raised on completions.
fn completion_eventfd() -> Result<std::os::fd::OwnedFd, EngineError> {
    rustix::event::eventfd(
        0,
        rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
    )
    .map_err(|e| EngineError::sys("eventfd", e.into()))
}

/// Clears a non-blocking eventfd (one `read`; empty is fine).
fn clear_eventfd(fd: BorrowedFd<'_>) -> Result<(), EngineError> {
    let mut b = [0u8; 8];
    match rustix::io::read(fd, &mut b) {
        Ok(_) | Err(rustix::io::Errno::AGAIN) => Ok(()),
        Err(e) => Err(EngineError::sys("reading the completion eventfd", e.into())),
    }
}

/// Checks a request's buffers and turns them into an iovec array; returns
/// it with the total length.
fn iovecs(bufs: &[IoBuf]) -> Result<(Vec<libc::iovec>, usize), EngineError> {
    if bufs.is_empty() {
        return Err(EngineError::NoBuffers);
    }
    if bufs.len() > MAX_BUFFERS {
        return Err(EngineError::TooManyBuffers {
            count: bufs.len(),
            max: MAX_BUFFERS,
        });
    }
    let mut total = 0usize;
    let mut v = Vec::with_capacity(bufs.len());
    for b in bufs {
        if b.len == 0 || b.ptr.is_null() {
            return Err(EngineError::BadBuffer {
                ptr: b.ptr as usize,
                len: b.len,
            });
        }
        total = total
            .checked_add(b.len)
            .filter(|&t| t <= MAX_REQUEST_BYTES)
            .ok_or(EngineError::TooLarge {
                max: MAX_REQUEST_BYTES,
            })?;
        v.push(libc::iovec {
            iov_base: b.ptr.cast(),
            iov_len: b.len,
        });
    }
    Ok((v, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choice_parses() {
        assert_eq!("auto".parse::<EngineChoice>().unwrap(), EngineChoice::Auto);
        assert_eq!(
            "uring".parse::<EngineChoice>().unwrap(),
            EngineChoice::Uring
        );
        assert_eq!(
            "threads".parse::<EngineChoice>().unwrap(),
            EngineChoice::Threads
        );
        assert!("aio".parse::<EngineChoice>().is_err());
    }

    #[test]
    fn auto_falls_back_only_when_uring_is_unavailable() {
        let cfg = EngineConfig::default();
        let eperm = |_: &EngineConfig| {
            Err(EngineError::UringUnavailable(
                std::io::Error::from_raw_os_error(libc::EPERM),
            ))
        };
        let e = select_engine(EngineChoice::Auto, &cfg, eperm).unwrap();
        assert_eq!(e.kind(), EngineKind::Threads);
        assert!(select_engine(EngineChoice::Uring, &cfg, eperm).is_err());
        let other = |_: &EngineConfig| Err(EngineError::NoBuffers);
        assert!(select_engine(EngineChoice::Auto, &cfg, other).is_err());
        let t = select_engine(EngineChoice::Threads, &cfg, eperm).unwrap();
        assert_eq!(t.kind(), EngineKind::Threads);
    }

    #[test]
    fn iovecs_are_checked() {
        let mut b = [0u8; 8];
        let ok = IoBuf::new(b.as_mut_ptr(), 8);
        assert_eq!(iovecs(&[ok, ok]).unwrap().1, 16);
        assert!(matches!(iovecs(&[]), Err(EngineError::NoBuffers)));
        assert!(iovecs(&[IoBuf::new(b.as_mut_ptr(), 0)]).is_err());
        assert!(iovecs(&[IoBuf::new(std::ptr::null_mut(), 8)]).is_err());
        assert!(iovecs(&vec![ok; MAX_BUFFERS + 1]).is_err());
        let huge = IoBuf::new(b.as_mut_ptr(), MAX_REQUEST_BYTES);
        assert!(matches!(
            iovecs(&[huge, ok]),
            Err(EngineError::TooLarge { .. })
        ));
    }
}
