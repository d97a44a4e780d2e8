//! Byte-stream transports a connection can run over. The daemon only needs
//! to read request bytes, write reply bytes and know which file descriptor
//! signals "something to do": a Unix socket ([`SocketTransport`]), or a
//! guest's xenbus ring with its event-channel eventfd
//! ([`super::ring_transport::RingTransport`]), where one *doorbell*
//! descriptor announces both new input and freed output space.

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
    /// is a doorbell that fires when the peer consumed responses too, so
    /// the loop keeps it armed even while it does not read the connection,
    /// and calls [`Transport::wake`] on each readiness.
    fn poll_writable(&self) -> bool {
        true
    }

    /// Doorbell transports only: acknowledges one readiness of `fd` (a ring
    /// consumes its event channel) and says what it brought. Called before
    /// any read or write that the wake-up triggers.
    fn wake(&mut self) -> io::Result<Wake> {
        Ok(Wake::News)
    }

    /// Completes a reset that [`Wake::Reset`] announced, after the daemon
    /// dropped the connection's buffered input, queued output, watches and
    /// transactions: empty both streams, report "connected", notify.
    fn reset(&mut self) -> io::Result<()> {
        Ok(())
    }

    /// The daemon is dropping the connection for a protocol violation (a
    /// message longer than `XENSTORE_PAYLOAD_MAX`): tell the peer why where
    /// the transport has a way to (a ring's `error` word).
    fn protocol_error(&mut self) {}

    /// Short description for logs.
    fn describe(&self) -> String;
}

/// What one wake-up of a doorbell transport brought.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// The peer produced input or consumed output (or the transport cannot
    /// tell): read and flush as usual.
    News,
    /// Nothing changed since the last wake-up: a spurious notification, or
    /// the peer's end going away (hvd raises the port it unbinds). The
    /// daemon asks its [`super::DomainHook`] whether the domain still lives.
    Nothing,
    /// The peer asked to reset the connection (xenbus ring reconnection).
    Reset,
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
