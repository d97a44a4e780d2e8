//! The thread-pool engine: blocking `preadv`/`pwritev`/`fdatasync`/
//! `fallocate` on a few workers, like Firecracker's `sync_io.rs` moved off
//! the device thread, or QEMU's thread-pool AIO. It is the fallback where
//! io_uring is not allowed.
//!
//! Workers take jobs from a shared queue and append completions to a shared
//! list, then raise an eventfd ([`Engine::notify_fd`]). Shutdown drops the
//! jobs no worker has started (they complete with `ECANCELED`) and joins
//! the workers, so no worker touches guest memory afterwards.

use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::error::result_of;
use super::files::FileTable;
use super::{
    iovecs, Completion, CompletionError, Engine, EngineConfig, EngineError, EngineKind,
    EngineStats, FileId, IoBuf, MemoryRegion,
};

enum Work {
    Read {
        offset: u64,
        iov: Vec<libc::iovec>,
        len: usize,
    },
    Write {
        offset: u64,
        iov: Vec<libc::iovec>,
        len: usize,
    },
    Fdatasync,
    Discard {
        offset: u64,
        len: u64,
    },
}

struct Job {
    tag: u64,
    file_id: FileId,
    file: Arc<File>,
    work: Work,
}

// SAFETY: the raw pointers in a Job's iovecs are addresses that the
// submitter promised (Engine::submit_read/submit_write contract) stay valid
// and unused until the job's completion is reaped; a worker thread is as
// entitled to use them as the submitting thread.
unsafe impl Send for Job {}

struct Done {
    completion: Completion,
    file_id: FileId,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    shutdown: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    work_ready: Condvar,
    done: Mutex<Vec<Done>>,
    eventfd: OwnedFd,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A worker never panics while holding a lock (no code that can panic
    // runs under one), but stay usable if one did.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn complete(&self, done: Done) {
        lock(&self.done).push(done);
        // Signalling a valid eventfd cannot fail; if it somehow did, the
        // completion would wait for the next reap, so say so.
        if let Err(e) = pvio_hv::sys::eventfd_signal(self.eventfd.as_fd()) {
            tracing::error!("signalling I/O completion failed: {e}");
        }
    }
}

/// The thread-pool engine.
pub struct ThreadPoolEngine {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    files: FileTable,
    regions: Vec<Arc<dyn MemoryRegion>>,
    capacity: usize,
    in_flight: usize,
    stats: EngineStats,
    shut_down: bool,
}

impl std::fmt::Debug for ThreadPoolEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPoolEngine")
            .field("workers", &self.workers.len())
            .field("capacity", &self.capacity)
            .field("in_flight", &self.in_flight)
            .field("stats", &self.stats)
            .finish()
    }
}

impl ThreadPoolEngine {
    /// Starts `config.threads` workers (at least one).
    pub fn new(config: &EngineConfig) -> Result<Self, EngineError> {
        let eventfd = super::completion_eventfd()?;
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            work_ready: Condvar::new(),
            done: Mutex::new(Vec::new()),
            eventfd,
        });
        let mut engine = Self {
            shared,
            workers: Vec::new(),
            files: FileTable::default(),
            regions: Vec::new(),
            capacity: config.queue_depth.max(1) as usize,
            in_flight: 0,
            stats: EngineStats::default(),
            shut_down: false,
        };
        for i in 0..config.threads.max(1) {
            let shared = Arc::clone(&engine.shared);
            let handle = std::thread::Builder::new()
                .name(format!("pvio-blk-io-{i}"))
                .spawn(move || worker(&shared))
                .map_err(|e| EngineError::sys("spawning an I/O worker", e))?;
            engine.workers.push(handle);
        }
        Ok(engine)
    }

    fn queue(&mut self, file_id: FileId, work: Work, tag: u64) -> Result<(), EngineError> {
        if self.shut_down {
            return Err(EngineError::ShutDown);
        }
        if self.in_flight >= self.capacity {
            return Err(EngineError::QueueFull {
                capacity: self.capacity,
            });
        }
        let file = Arc::clone(self.files.get(file_id)?);
        self.files.begin(file_id);
        self.in_flight += 1;
        self.stats.submitted += 1;
        if matches!(work, Work::Read { .. } | Work::Write { .. }) {
            self.stats.vectored += 1;
        }
        lock(&self.shared.queue).jobs.push_back(Job {
            tag,
            file_id,
            file,
            work,
        });
        self.shared.work_ready.notify_one();
        Ok(())
    }

    fn take_done(&mut self, out: &mut Vec<Completion>) -> usize {
        let done = std::mem::take(&mut *lock(&self.shared.done));
        let n = done.len();
        for d in done {
            self.files.end(d.file_id);
            self.in_flight = self.in_flight.saturating_sub(1);
            self.stats.completed += 1;
            if d.completion.result.is_err() {
                self.stats.failed += 1;
            }
            out.push(d.completion);
        }
        n
    }
}

fn worker(shared: &Shared) {
    loop {
        let job = {
            let mut q = lock(&shared.queue);
            loop {
                if let Some(j) = q.jobs.pop_front() {
                    break j;
                }
                if q.shutdown {
                    return;
                }
                q = shared.work_ready.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        };
        let result = run(&job);
        shared.complete(Done {
            completion: Completion {
                tag: job.tag,
                result,
            },
            file_id: job.file_id,
        });
    }
}

/// Retries a syscall-style call on `EINTR`; returns its result or `-errno`.
fn retry(mut f: impl FnMut() -> isize) -> i64 {
    loop {
        let r = f();
        if r >= 0 {
            return r as i64;
        }
        let errno = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        if errno != libc::EINTR {
            return -i64::from(errno);
        }
    }
}

fn run(job: &Job) -> Result<usize, CompletionError> {
    let fd = job.file.as_raw_fd();
    match &job.work {
        Work::Read { offset, iov, len } => {
            let Ok(off) = libc::off_t::try_from(*offset) else {
                return Err(CompletionError::Os {
                    errno: libc::EINVAL,
                });
            };
            // SAFETY: fd is open (job.file keeps it so); the iovecs describe
            // memory the submitter guaranteed writable and unused until this
            // completion (submit_read contract); iov.len() <= MAX_BUFFERS.
            let r = retry(|| unsafe { libc::preadv(fd, iov.as_ptr(), iov.len() as i32, off) });
            result_of(r, *len)
        }
        Work::Write { offset, iov, len } => {
            let Ok(off) = libc::off_t::try_from(*offset) else {
                return Err(CompletionError::Os {
                    errno: libc::EINVAL,
                });
            };
            // SAFETY: as for the read, with the memory readable
            // (submit_write contract).
            let r = retry(|| unsafe { libc::pwritev(fd, iov.as_ptr(), iov.len() as i32, off) });
            result_of(r, *len)
        }
        Work::Fdatasync => match rustix::fs::fdatasync(job.file.as_ref()) {
            Ok(()) => Ok(0),
            Err(e) => Err(CompletionError::Os {
                errno: e.raw_os_error(),
            }),
        },
        Work::Discard { offset, len } => match crate::image::punch_hole(&job.file, *offset, *len) {
            Ok(()) => Ok(0),
            Err(e) => Err(CompletionError::Os {
                errno: e.raw_os_error().unwrap_or(libc::EIO),
            }),
        },
    }
}

impl Engine for ThreadPoolEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Threads
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
        // Nothing to register for preadv/pwritev; keep it alive as promised.
        self.regions.push(region);
        Ok(())
    }

    unsafe fn submit_read(
        &mut self,
        file: FileId,
        offset: u64,
        bufs: &[IoBuf],
        tag: u64,
    ) -> Result<(), EngineError> {
        let (iov, len) = iovecs(bufs)?;
        self.queue(file, Work::Read { offset, iov, len }, tag)
    }

    unsafe fn submit_write(
        &mut self,
        file: FileId,
        offset: u64,
        bufs: &[IoBuf],
        tag: u64,
    ) -> Result<(), EngineError> {
        let (iov, len) = iovecs(bufs)?;
        self.queue(file, Work::Write { offset, iov, len }, tag)
    }

    fn submit_fdatasync(&mut self, file: FileId, tag: u64) -> Result<(), EngineError> {
        self.queue(file, Work::Fdatasync, tag)
    }

    fn submit_discard(
        &mut self,
        file: FileId,
        offset: u64,
        len: u64,
        tag: u64,
    ) -> Result<(), EngineError> {
        self.queue(file, Work::Discard { offset, len }, tag)
    }

    fn kick(&mut self) -> Result<(), EngineError> {
        // Jobs go to the workers as they are queued.
        Ok(())
    }

    fn has_completions(&mut self) -> bool {
        !lock(&self.shared.done).is_empty()
    }

    fn prepare_to_block(&mut self) -> Result<bool, EngineError> {
        super::clear_eventfd(self.shared.eventfd.as_fd())?;
        Ok(self.has_completions())
    }

    fn reap(&mut self, out: &mut Vec<Completion>) -> Result<usize, EngineError> {
        Ok(self.take_done(out))
    }

    fn wait(
        &mut self,
        min: usize,
        timeout: Option<Duration>,
        out: &mut Vec<Completion>,
    ) -> Result<usize, EngineError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut got = 0;
        loop {
            got += self.reap(out)?;
            if got >= min || self.in_flight == 0 {
                return Ok(got);
            }
            let left = match deadline {
                None => None,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(got);
                    }
                    Some(d - now)
                }
            };
            if self.prepare_to_block()? {
                continue;
            }
            pvio_hv::sys::wait_readable(self.shared.eventfd.as_fd(), left)
                .map_err(|e| EngineError::sys("poll on the completion eventfd", e))?;
        }
    }

    fn notify_fd(&self) -> BorrowedFd<'_> {
        self.shared.eventfd.as_fd()
    }

    fn stats(&self) -> EngineStats {
        self.stats
    }

    fn shutdown(&mut self, out: &mut Vec<Completion>) -> Result<(), EngineError> {
        self.shut_down = true;
        let cancelled: Vec<Job> = {
            let mut q = lock(&self.shared.queue);
            q.shutdown = true;
            q.jobs.drain(..).collect()
        };
        self.shared.work_ready.notify_all();
        for job in cancelled {
            self.shared.complete(Done {
                completion: Completion {
                    tag: job.tag,
                    result: Err(CompletionError::Os {
                        errno: libc::ECANCELED,
                    }),
                },
                file_id: job.file_id,
            });
        }
        for w in self.workers.drain(..) {
            if w.join().is_err() {
                tracing::error!("an I/O worker thread panicked");
            }
        }
        // Every job has completed now: no worker holds a buffer any more.
        self.reap(out)?;
        Ok(())
    }
}

impl Drop for ThreadPoolEngine {
    fn drop(&mut self) {
        let mut out = Vec::new();
        if let Err(e) = self.shutdown(&mut out) {
            tracing::error!("shutting down the thread-pool I/O engine: {e}");
        }
    }
}
