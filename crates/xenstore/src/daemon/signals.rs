//! SIGTERM/SIGINT/SIGHUP as a readable descriptor (signalfd), so that the
//! single-threaded event loop notices them like any other event and shuts
//! down cleanly between two requests.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};

/// A signalfd for the termination signals, which are blocked for the
/// calling thread (the daemon's only thread) so that they queue on it.
pub struct TermSignals {
    fd: OwnedFd,
}

const SIGNALS: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

impl TermSignals {
    /// Blocks the termination signals and opens the signalfd.
    pub fn new() -> io::Result<Self> {
        // SAFETY: sigset_t is plain data; an all-zero value is a valid
        // starting point that sigemptyset then initialises.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid, exclusively borrowed sigset_t.
        unsafe { libc::sigemptyset(&mut set) };
        for s in SIGNALS {
            // SAFETY: as above; `s` is a valid signal number.
            unsafe { libc::sigaddset(&mut set, s) };
        }
        // SAFETY: `set` is initialised; passing a null old-set pointer is allowed.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        // SAFETY: -1 asks for a new descriptor; `set` is initialised.
        let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: signalfd returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd })
    }

    /// Reads one pending signal, if any.
    pub fn take(&self) -> Option<i32> {
        let mut buf = [0u8; 128]; // sizeof(struct signalfd_siginfo)
        match rustix::io::read(&self.fd, &mut buf) {
            Ok(n) if n >= 4 => Some(u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as i32),
            _ => None,
        }
    }
}

impl AsFd for TermSignals {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
