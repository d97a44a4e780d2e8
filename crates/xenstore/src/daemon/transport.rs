//! Byte-stream transports a connection can run over. The daemon only needs
//! to read request bytes, write reply bytes and know which file descriptor
//! signals "something to do": a Unix socket today; a guest's xenbus ring
//! (`struct xenstore_domain_interface`) with its event-channel eventfd in
//! phase 2.

use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;

/// A connection's byte stream.
pub trait Transport: Send {
    /// The descriptor the event loop waits on. Readable means input may be
    /// available (for a ring: the event channel fired, which also signals
    /// that output space was freed).
    fn fd(&self) -> BorrowedFd<'_>;

    /// Reads available request bytes. `Ok(0)` means the peer is gone;
    /// `WouldBlock` means nothing is available now.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize>;

    /// Writes reply bytes; `WouldBlock` (or a short count) when full.
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;

    /// Whether the loop should ask for writability of [`Transport::fd`] while
    /// output is blocked (sockets). A ring returns false: its event channel
    /// fires when the peer consumed responses.
    fn poll_writable(&self) -> bool {
        true
    }

    /// Short description for logs.
    fn describe(&self) -> String;
}

/// A dom0 client on the Unix socket.
pub struct SocketTransport {
    stream: UnixStream,
}

impl SocketTransport {
    /// Wraps an accepted stream, switching it to non-blocking mode.
    pub fn new(stream: UnixStream) -> io::Result<Self> {
        stream.set_nonblocking(true)?;
        Ok(Self { stream })
    }
}

impl Transport for SocketTransport {
    fn fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.read(buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.stream.write_vectored(bufs)
    }

    fn describe(&self) -> String {
        let cred = rustix::net::sockopt::socket_peercred(&self.stream)
            .map(|c| format!("pid {}", c.pid.as_raw_nonzero()))
            .unwrap_or_else(|_| "unknown peer".into());
        format!("socket ({cred})")
    }
}
