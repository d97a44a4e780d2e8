//! The process side of an event channel: two eventfds.
//!
//! hvd gives each bound port a *wait* eventfd, which the peer raises to
//! notify this end, and a *notify* eventfd, which is the peer port's wait
//! eventfd. Sending (`EVTCHNOP_send`) is therefore one `write(2)` by the
//! sender with no round trip through hvd, just as a Xen event-channel send is
//! one hypercall; a pending event is a non-zero eventfd counter.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use pvio_abi::event_channel::EvtchnPort;
use pvio_abi::DomId;

use crate::error::HvError;
use crate::sys;

/// One end of an interdomain event channel, held by the process that owns
/// the port. Closing the port is an hvd request
/// ([`crate::client::HvClient::evtchn_close`]); dropping this only closes the
/// process's descriptors.
#[derive(Debug)]
pub struct EventChannel {
    port: EvtchnPort,
    remote_dom: DomId,
    wait: OwnedFd,
    notify: OwnedFd,
}

impl EventChannel {
    /// Assembles a channel from the descriptors hvd handed over.
    pub fn from_fds(port: EvtchnPort, remote_dom: DomId, wait: OwnedFd, notify: OwnedFd) -> Self {
        Self {
            port,
            remote_dom,
            wait,
            notify,
        }
    }

    /// The local port number.
    pub fn port(&self) -> EvtchnPort {
        self.port
    }

    /// The peer domain.
    pub fn remote_dom(&self) -> DomId {
        self.remote_dom
    }

    /// Raises an event on the peer's port (`EVTCHNOP_send`).
    pub fn notify(&self) -> Result<(), HvError> {
        sys::eventfd_signal(self.notify.as_fd()).map_err(HvError::from)
    }

    /// Consumes a pending event without blocking; true if one was pending.
    pub fn try_consume(&self) -> Result<bool, HvError> {
        Ok(sys::eventfd_consume(self.wait.as_fd())? > 0)
    }

    /// Blocks until an event arrives, then consumes it: one `read(2)`.
    pub fn wait(&self) -> Result<(), HvError> {
        sys::eventfd_wait(self.wait.as_fd())?;
        Ok(())
    }

    /// Consumes an event known to be pending (after `poll` reported the
    /// wait fd readable): one `read(2)`. Blocks if none is pending.
    pub fn take_pending(&self) -> Result<(), HvError> {
        sys::eventfd_wait(self.wait.as_fd())?;
        Ok(())
    }

    /// Waits up to `timeout` for an event; true if one arrived (and was
    /// consumed).
    pub fn wait_timeout(&self, timeout: Duration) -> Result<bool, HvError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if !sys::wait_readable(self.wait.as_fd(), Some(left))? {
                return Ok(false);
            }
            if self.try_consume()? {
                return Ok(true);
            }
            if left.is_zero() {
                return Ok(false);
            }
        }
    }

    /// The eventfd to poll for incoming events (epoll, io_uring).
    pub fn wait_fd(&self) -> BorrowedFd<'_> {
        self.wait.as_fd()
    }

    /// The eventfd that raises the peer.
    pub fn notify_fd(&self) -> BorrowedFd<'_> {
        self.notify.as_fd()
    }
}
