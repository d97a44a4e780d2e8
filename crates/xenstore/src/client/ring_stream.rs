//! A guest's end of its xenbus ring (docs/misc/xenstore-ring.txt) as a
//! tokio byte stream, so that [`super::Client`] runs over it unchanged:
//! requests go into `req`, replies and watch events come out of `rsp`, and
//! the event channel is signalled after every update of either stream.
//!
//! Waiting. The event channel's wait eventfd is registered with tokio's
//! reactor ([`AsyncFd::register`]). One eventfd announces both replies and
//! freed request space, while a poll-based `AsyncFd` keeps one waker per
//! direction, so only the reader half waits on it: after each wake-up it
//! consumes the event and wakes a writer that found the ring full. The
//! client's reader task polls the reader half for as long as the client
//! lives, so a blocked writer is always woken. Event-channel eventfds are
//! blocking descriptors shared with other processes, so the event is
//! consumed by `poll` then `read` ([`EventChannel::try_consume`]), never by
//! a read that could block a runtime thread.
//!
//! A ring the server stopped serving (`error` set, e.g. after this guest
//! sent garbage) or inconsistent indices end the stream with an error, and
//! the client reports [`crate::Error::Closed`] from then on. A xenstored
//! that dies without a word is not noticed (nor is it by a Xen guest).

use crate::ring::{BadRingMemory, End, Field, XenbusRing};
use pvio_abi::xs_wire::XENSTORE_ERROR_NONE;
use pvio_hv::EventChannel;
use pvio_ring::RingMemory;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll, Waker};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

/// The store event channel, registered by its wait descriptor.
struct Doorbell(EventChannel);

impl AsRawFd for Doorbell {
    fn as_raw_fd(&self) -> RawFd {
        self.0.wait_fd().as_fd().as_raw_fd()
    }
}

struct Shared<M: RingMemory> {
    ring: Mutex<XenbusRing<M>>,
    bell: AsyncFd<Doorbell>,
    /// A writer waiting for request space.
    writer: Mutex<Option<Waker>>,
    closed: AtomicBool,
}

impl<M: RingMemory> Shared<M> {
    fn notify(&self) {
        if let Err(e) = self.bell.get_ref().0.notify() {
            tracing::debug!(error = %e, "xenstore event channel notify failed");
        }
    }

    fn wake_writer(&self) {
        if let Some(w) = self.writer.lock().ok().and_then(|mut w| w.take()) {
            w.wake();
        }
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake_writer();
    }
}

/// The receiving half: replies and watch events.
pub struct RingReader<M: RingMemory> {
    shared: Arc<Shared<M>>,
}

/// The sending half: requests.
pub struct RingWriter<M: RingMemory> {
    shared: Arc<Shared<M>>,
}

fn poisoned() -> io::Error {
    io::Error::other("xenbus ring lock poisoned")
}

/// Attaches to the ring page in `page` as the guest, waiting on `chan`.
/// Must be called inside a tokio runtime.
pub fn split<M: RingMemory>(
    page: M,
    chan: EventChannel,
) -> io::Result<(RingReader<M>, RingWriter<M>)> {
    let ring = XenbusRing::attach(page, End::Guest)
        .map_err(|e: BadRingMemory| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: the registered descriptor is the wait eventfd owned by the
    // EventChannel inside the Doorbell, which the AsyncFd owns: it stays
    // open, and is the same descriptor, until the AsyncFd drops, and
    // `as_raw_fd` always returns it.
    let bell = unsafe { AsyncFd::register_with_interest(Doorbell(chan), Interest::READABLE) }
        .map_err(io::Error::from)?;
    let shared = Arc::new(Shared {
        ring: Mutex::new(ring),
        bell,
        writer: Mutex::new(None),
        closed: AtomicBool::new(false),
    });
    Ok((
        RingReader {
            shared: Arc::clone(&shared),
        },
        RingWriter { shared },
    ))
}

impl<M: RingMemory> AsyncRead for RingReader<M> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let s = &*self.shared;
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            let (got, error) = {
                let mut ring = s.ring.lock().map_err(|_| poisoned())?;
                let want = buf.remaining().min(pvio_abi::xs_wire::XENSTORE_RING_SIZE);
                let got = ring.read(buf.initialize_unfilled_to(want));
                (got, ring.load(Field::Error))
            };
            match got {
                Ok(0) => {}
                Ok(n) => {
                    buf.advance(n);
                    s.notify();
                    return Poll::Ready(Ok(()));
                }
                Err(e) => {
                    s.close();
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
                }
            }
            if error != XENSTORE_ERROR_NONE {
                s.close();
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    format!("xenstored stopped serving the ring (error {error})"),
                )));
            }
            let mut guard = ready!(s.bell.poll_read_ready(cx))?;
            // Consume before looking again: an update after this raises
            // the eventfd anew, and tokio keeps that readiness.
            let _ = guard.get_inner().0.try_consume();
            guard.clear_ready();
            s.wake_writer();
        }
    }
}

impl<M: RingMemory> Drop for RingReader<M> {
    fn drop(&mut self) {
        self.shared.close();
    }
}

impl<M: RingMemory> AsyncWrite for RingWriter<M> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let s = &*self.shared;
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let mut registered = false;
        loop {
            if s.closed.load(Ordering::Acquire) {
                return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
            }
            let n = s
                .ring
                .lock()
                .map_err(|_| poisoned())?
                .write(data)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            if n > 0 {
                s.notify();
                return Poll::Ready(Ok(n));
            }
            if registered {
                return Poll::Pending;
            }
            // Full: wait for the reader to see the server consume, then
            // look once more in case that already happened.
            *s.writer.lock().map_err(|_| poisoned())? = Some(cx.waker().clone());
            registered = true;
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
