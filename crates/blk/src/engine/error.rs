//! Errors of the I/O engines: [`EngineError`] for calls that fail at once,
//! [`CompletionError`] for requests that fail in flight.

/// Why an engine call failed. A failed submission queued nothing.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// io_uring cannot be used here (`EPERM`/`ENOSYS`/`EACCES` from
    /// `io_uring_setup`: seccomp, `kernel.io_uring_disabled`, old kernel);
    /// the caller may fall back to the thread pool.
    #[error("io_uring is unavailable: {0}")]
    UringUnavailable(#[source] std::io::Error),
    /// The kernel's io_uring lacks something this engine needs.
    #[error("io_uring lacks {0}")]
    UringUnsupported(&'static str),
    /// A system call of the engine itself failed.
    #[error("{op} failed: {source}")]
    Sys {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// `--io-engine` named no engine.
    #[error("unknown I/O engine {0:?} (expected uring, threads or auto)")]
    UnknownEngine(String),
    /// No such file (never added, or removed).
    #[error("unknown file id {0}")]
    UnknownFile(u32),
    /// The file still has requests in flight.
    #[error("file id {id} has {in_flight} requests in flight")]
    FileBusy { id: u32, in_flight: usize },
    /// `capacity` requests are already in flight.
    #[error("the engine's {capacity} request slots are all in flight")]
    QueueFull { capacity: usize },
    /// A read or write without buffers.
    #[error("a read or write needs at least one buffer")]
    NoBuffers,
    /// Too many buffers in one request.
    #[error("{count} buffers in one request, over the limit of {max}")]
    TooManyBuffers { count: usize, max: usize },
    /// A null or empty buffer.
    #[error("bad buffer at {ptr:#x} of {len} bytes")]
    BadBuffer { ptr: usize, len: usize },
    /// A request over the size limit.
    #[error("request larger than {max} bytes")]
    TooLarge { max: usize },
    /// The engine was shut down.
    #[error("the I/O engine is shut down")]
    ShutDown,
}

impl EngineError {
    /// Whether this is io_uring being unavailable or lacking a feature,
    /// which [`super::open_engine`] answers by falling back.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            EngineError::UringUnavailable(_) | EngineError::UringUnsupported(_)
        )
    }

    pub(crate) fn sys(op: &'static str, source: std::io::Error) -> Self {
        EngineError::Sys { op, source }
    }
}

/// Why a request failed in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CompletionError {
    /// The system call failed with this errno (`ECANCELED` when cancelled
    /// at shutdown).
    #[error("{}", std::io::Error::from_raw_os_error(*errno))]
    Os { errno: i32 },
    /// Fewer bytes moved than asked (end of file, or a write cut short).
    #[error("short transfer: {done} of {expected} bytes")]
    Short { expected: usize, done: usize },
}

impl CompletionError {
    /// The errno, if the failure was one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            CompletionError::Os { errno } => Some(*errno),
            CompletionError::Short { .. } => None,
        }
    }
}

/// The result of a request from a syscall-style return value: negative is
/// an errno, else bytes moved, which must be all of `expected`.
pub(crate) fn result_of(res: i64, expected: usize) -> Result<usize, CompletionError> {
    if res < 0 {
        return Err(CompletionError::Os {
            errno: (-res) as i32,
        });
    }
    let done = res as usize;
    if done < expected {
        return Err(CompletionError::Short { expected, done });
    }
    Ok(done)
}
