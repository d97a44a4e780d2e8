//! Thin wrappers over the Linux primitives hv is built from: memfd (guest
//! memory and grant tables), eventfd (event channels), `SOCK_SEQPACKET` Unix
//! sockets carrying file descriptors (`SCM_RIGHTS`), and `poll`.
//!
//! Event-channel eventfds are *blocking*: an eventfd's open file description
//! (and so its `O_NONBLOCK` flag) is shared by every process holding it, and
//! the hot path is the waiter's single blocking `read`, the same system call
//! a raw eventfd ping-pong makes. Writes never block in practice (only a
//! counter at 2^64 - 2 would), and non-blocking consumers `poll` first.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags};
use rustix::fs::{fcntl_add_seals, ftruncate, memfd_create, MemfdFlags, SealFlags};
use rustix::io::Errno;
use rustix::net::{
    bind, connect, listen, recvmsg, sendmsg, socket_with, AddressFamily, RecvAncillaryBuffer,
    RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

/// Most file descriptors one hvd message carries.
pub const MAX_FDS_PER_MESSAGE: usize = 4;

/// Creates a sealed memfd of `size` bytes: it can be mapped and written but
/// never shrunk or grown, so a peer that maps it can never be hit by SIGBUS
/// because the owner truncated it.
pub fn create_sealed_memfd(name: &str, size: u64) -> std::io::Result<OwnedFd> {
    let fd = memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    ftruncate(&fd, size)?;
    fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
    Ok(fd)
}

/// Creates the eventfd behind one end of an event channel (blocking; see
/// the module comment).
pub fn create_eventfd() -> std::io::Result<OwnedFd> {
    Ok(eventfd(0, EventfdFlags::CLOEXEC)?)
}

/// Blocks until the eventfd is raised, then clears it; returns the count.
pub fn eventfd_wait(fd: BorrowedFd<'_>) -> std::io::Result<u64> {
    let mut buf = [0u8; 8];
    loop {
        match rustix::io::read(fd, &mut buf) {
            Ok(8) => return Ok(u64::from_ne_bytes(buf)),
            Ok(n) => {
                return Err(std::io::Error::other(format!(
                    "short eventfd read of {n} bytes"
                )))
            }
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Raises an eventfd: one `write` of 1. A counter already at its maximum is
/// still pending, so `EAGAIN` counts as success.
pub fn eventfd_signal(fd: BorrowedFd<'_>) -> std::io::Result<()> {
    match rustix::io::write(fd, &1u64.to_ne_bytes()) {
        Ok(_) | Err(Errno::AGAIN) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Reads and clears an eventfd's counter without blocking; 0 if it was clear.
/// Safe on blocking eventfds as long as this process is the only reader.
pub fn eventfd_consume(fd: BorrowedFd<'_>) -> std::io::Result<u64> {
    if !wait_readable(fd, Some(Duration::ZERO))? {
        return Ok(0);
    }
    let mut buf = [0u8; 8];
    match rustix::io::read(fd, &mut buf) {
        Ok(8) => Ok(u64::from_ne_bytes(buf)),
        Ok(_) => Ok(0),
        Err(Errno::AGAIN) => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// Waits until `fd` is readable or `timeout` passes (`None`: forever).
/// Returns whether it became readable. Interrupted waits are retried.
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> std::io::Result<bool> {
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    loop {
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        let ts = match deadline {
            None => None,
            Some(d) => {
                let left = d.saturating_duration_since(std::time::Instant::now());
                Some(rustix::time::Timespec {
                    tv_sec: left.as_secs() as i64,
                    tv_nsec: left.subsec_nanos() as i64,
                })
            }
        };
        match poll(&mut fds, ts.as_ref()) {
            Ok(0) => return Ok(false),
            Ok(_) => return Ok(true),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Creates a listening `SOCK_SEQPACKET` socket at `path`, replacing a stale
/// socket file left by a previous run.
pub fn seqpacket_listen(path: &Path, nonblocking: bool) -> std::io::Result<OwnedFd> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if meta.file_type().is_socket() {
            // A socket a live daemon serves is never taken over.
            if seqpacket_connect(path).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!("a running daemon already serves {}", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
    }
    let mut flags = SocketFlags::CLOEXEC;
    if nonblocking {
        flags |= SocketFlags::NONBLOCK;
    }
    let fd = socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, flags, None)?;
    bind(&fd, &SocketAddrUnix::new(path)?)?;
    listen(&fd, 1024)?;
    Ok(fd)
}

/// Connects a `SOCK_SEQPACKET` socket to `path`.
pub fn seqpacket_connect(path: &Path) -> std::io::Result<OwnedFd> {
    let fd = socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    connect(&fd, &SocketAddrUnix::new(path)?)?;
    Ok(fd)
}

/// Sends one datagram with up to [`MAX_FDS_PER_MESSAGE`] file descriptors.
pub fn send_with_fds(
    sock: BorrowedFd<'_>,
    data: &[u8],
    fds: &[BorrowedFd<'_>],
    nonblocking: bool,
) -> std::io::Result<()> {
    let mut space =
        [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_MESSAGE))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        assert!(fds.len() <= MAX_FDS_PER_MESSAGE);
        if !control.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(std::io::Error::other("control buffer too small"));
        }
    }
    let mut flags = SendFlags::NOSIGNAL;
    if nonblocking {
        flags |= SendFlags::DONTWAIT;
    }
    loop {
        match sendmsg(sock, &[IoSlice::new(data)], &mut control, flags) {
            Ok(n) if n == data.len() => return Ok(()),
            Ok(_) => return Err(std::io::Error::other("short datagram send")),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// One datagram received by [`recv_with_fds`].
#[derive(Debug)]
pub struct Received {
    /// Bytes placed in the buffer; 0 means the peer closed the connection.
    pub len: usize,
    /// The datagram did not fit in the buffer and was cut.
    pub truncated: bool,
    /// Descriptors that came with it.
    pub fds: Vec<OwnedFd>,
}

/// Receives one datagram and the descriptors attached to it.
pub fn recv_with_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    nonblocking: bool,
) -> std::io::Result<Received> {
    let mut space =
        [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_MESSAGE))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut flags = RecvFlags::CMSG_CLOEXEC;
    if nonblocking {
        flags |= RecvFlags::DONTWAIT;
    }
    let msg = loop {
        match recvmsg(sock, &mut [IoSliceMut::new(buf)], &mut control, flags) {
            Ok(m) => break m,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = m {
            fds.extend(rights);
        }
    }
    Ok(Received {
        len: msg.bytes.min(buf.len()),
        truncated: msg.flags.contains(ReturnFlags::TRUNC)
            || msg.flags.contains(ReturnFlags::CTRUNC),
        fds,
    })
}

/// Raises the soft open-file limit as far as allowed (as root, to the kernel
/// maximum): every event channel is an eventfd, so density needs many fds.
/// Returns the resulting soft limit.
pub fn raise_nofile_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let cur = getrlimit(Resource::Nofile);
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(1 << 20);
    let want = Rlimit {
        current: Some(nr_open),
        maximum: Some(nr_open.max(cur.maximum.unwrap_or(0))),
    };
    if setrlimit(Resource::Nofile, want).is_err() {
        let hard = Rlimit {
            current: cur.maximum,
            maximum: cur.maximum,
        };
        let _ = setrlimit(Resource::Nofile, hard);
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// Descriptors as borrowed, for [`send_with_fds`].
pub fn borrow_all<'a>(fds: &'a [&'a OwnedFd]) -> Vec<BorrowedFd<'a>> {
    fds.iter().map(|f| f.as_fd()).collect()
}

/// Blocks SIGTERM, SIGINT and SIGHUP for the calling thread (call it before
/// spawning threads so every thread inherits the mask) and returns a
/// signalfd that becomes readable when one arrives: daemons put it in their
/// event loop and exit cleanly.
pub fn termination_signalfd() -> std::io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: sigset_t is plain data that sigemptyset initialises fully.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, exclusively borrowed sigset_t; these calls
    // only write into it and into this thread's signal mask.
    let rc = unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    // SAFETY: `set` is initialised; -1 asks for a new descriptor.
    let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: signalfd returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
