//! The daemon's end of a guest's xenbus ring as a [`Transport`]
//! (docs/misc/xenstore-ring.txt): requests are copied out of `req` once,
//! replies and watch events go into `rsp`, and the event channel is
//! signalled after every update of either stream. The event channel's
//! eventfd is the connection's doorbell: it announces requests, reply space
//! the guest freed, a reconnection request and (raised by hvd as it unbinds
//! the port) the guest's death.
//!
//! A hostile guest cannot make this loop or panic: inconsistent indices
//! set `error = XENSTORE_ERROR_RINGIDX` and fail the read or write, which
//! drops the connection; an over-long message is the daemon's framing
//! violation and sets `XENSTORE_ERROR_PROTO` ([`Transport::protocol_error`]).

use super::transport::{Transport, Wake};
use crate::ring::{End, Field, XenbusRing};
use pvio_abi::xs_wire::{
    XENSTORE_ERROR_NONE, XENSTORE_ERROR_PROTO, XENSTORE_ERROR_RINGIDX, XENSTORE_RECONNECT,
    XENSTORE_SERVER_FEATURE_ERROR, XENSTORE_SERVER_FEATURE_RECONNECTION,
};
use pvio_abi::DomId;
use pvio_hv::EventChannel;
use pvio_ring::RingMemory;
use std::io::{self, IoSlice};
use std::os::fd::BorrowedFd;

/// Run when the transport is dropped (the hv hook closes the port there).
pub type OnDrop = Box<dyn FnOnce(&EventChannel) + Send>;

/// A guest's xenbus ring served by the daemon.
pub struct RingTransport<M: RingMemory + Send> {
    ring: XenbusRing<M>,
    chan: EventChannel,
    domid: DomId,
    /// The guest's (req_prod, rsp_cons) at the last wake-up.
    seen: (u32, u32),
    on_drop: Option<OnDrop>,
}

fn hv_io(e: pvio_hv::HvError) -> io::Error {
    io::Error::other(e.to_string())
}

impl<M: RingMemory + Send> RingTransport<M> {
    /// Serves the ring page in `mem` of guest `domid`, signalled through
    /// `chan`. Advertises ring reconnection and the error word; empties both
    /// streams first when `reset` is set (re-introduction, as C xenstored's
    /// `domain_conn_reset()`) or when the guest is waiting for a
    /// reconnection; then tells the guest xenstore is there. `on_drop` runs
    /// when the transport goes, including when this fails.
    pub fn new(
        mem: M,
        chan: EventChannel,
        domid: DomId,
        reset: bool,
        on_drop: Option<OnDrop>,
    ) -> io::Result<Self> {
        let mut ring = match XenbusRing::attach(mem, End::Server) {
            Ok(r) => r,
            Err(e) => {
                if let Some(f) = on_drop {
                    f(&chan);
                }
                return Err(io::Error::new(io::ErrorKind::InvalidInput, e));
            }
        };
        let features = ring.load(Field::ServerFeatures)
            | XENSTORE_SERVER_FEATURE_RECONNECTION
            | XENSTORE_SERVER_FEATURE_ERROR;
        ring.store(Field::ServerFeatures, features);
        if reset {
            ring.store(Field::Error, XENSTORE_ERROR_NONE);
        }
        if reset || ring.load(Field::Connection) == XENSTORE_RECONNECT {
            ring.reset();
        }
        let seen = (ring.load(Field::ReqProd), ring.load(Field::RspCons));
        let t = Self {
            ring,
            chan,
            domid,
            seen,
            on_drop,
        };
        t.notify();
        Ok(t)
    }

    /// The ring.
    pub fn ring(&self) -> &XenbusRing<M> {
        &self.ring
    }

    /// The event channel.
    pub fn channel(&self) -> &EventChannel {
        &self.chan
    }

    fn notify(&self) {
        if let Err(e) = self.chan.notify() {
            tracing::debug!(domid = self.domid, error = %e, "notify failed");
        }
    }

    /// Stops talking to the guest for `code` (the first error sticks).
    fn fail(&self, code: u32) {
        if self.ring.load(Field::Error) == XENSTORE_ERROR_NONE {
            self.ring.store(Field::Error, code);
        }
        self.notify();
    }

    fn bad_indices(&self, e: crate::ring::BadIndices) -> io::Error {
        self.fail(XENSTORE_ERROR_RINGIDX);
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

impl<M: RingMemory + Send> Transport for RingTransport<M> {
    fn fd(&self) -> BorrowedFd<'_> {
        self.chan.wait_fd()
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.ring.read(buf) {
            Ok(0) => Err(io::ErrorKind::WouldBlock.into()),
            Ok(n) => {
                self.notify();
                Ok(n)
            }
            Err(e) => Err(self.bad_indices(e)),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut total = 0;
        for b in bufs.iter().filter(|b| !b.is_empty()) {
            match self.ring.write(b) {
                Ok(n) => {
                    total += n;
                    if n < b.len() {
                        break;
                    }
                }
                Err(e) => return Err(self.bad_indices(e)),
            }
        }
        if total == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.notify();
        Ok(total)
    }

    fn poll_writable(&self) -> bool {
        false
    }

    fn wake(&mut self) -> io::Result<Wake> {
        // Consume first, then look: an update after this raises it again.
        self.chan.try_consume().map_err(hv_io)?;
        if self.ring.load(Field::Connection) == XENSTORE_RECONNECT {
            return Ok(Wake::Reset);
        }
        let now = (
            self.ring.load(Field::ReqProd),
            self.ring.load(Field::RspCons),
        );
        let news = now != self.seen;
        self.seen = now;
        Ok(if news { Wake::News } else { Wake::Nothing })
    }

    fn reset(&mut self) -> io::Result<()> {
        self.ring.reset();
        self.seen = (0, 0);
        self.notify();
        Ok(())
    }

    fn protocol_error(&mut self) {
        self.fail(XENSTORE_ERROR_PROTO);
    }

    fn describe(&self) -> String {
        format!(
            "xenbus ring of domain {} (port {})",
            self.domid,
            self.chan.port()
        )
    }
}

impl<M: RingMemory + Send> Drop for RingTransport<M> {
    fn drop(&mut self) {
        if let Some(f) = self.on_drop.take() {
            f(&self.chan);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{encode_message, Header, HEADER_LEN};
    use pvio_abi::xs_wire::XENSTORE_CONNECTED;
    use pvio_ring::AnonRingMemory;
    use std::os::fd::OwnedFd;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    fn eventfd() -> OwnedFd {
        rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap()
    }

    /// Two ends of an event channel without hvd: each end's notify
    /// descriptor is the other's wait descriptor.
    pub(crate) fn channel_pair() -> (EventChannel, EventChannel) {
        let (a, b) = (eventfd(), eventfd());
        let dup = |f: &OwnedFd| f.try_clone().unwrap();
        (
            EventChannel::from_fds(1, 5, dup(&a), dup(&b)),
            EventChannel::from_fds(2, 0, b, a),
        )
    }

    struct Rig {
        t: RingTransport<Arc<AnonRingMemory>>,
        guest: XenbusRing<Arc<AnonRingMemory>>,
        guest_chan: EventChannel,
    }

    fn rig(start: u32) -> Rig {
        let mem = Arc::new(AnonRingMemory::new(1));
        let guest = XenbusRing::attach(mem.clone(), End::Guest).unwrap();
        for f in [
            Field::ReqCons,
            Field::ReqProd,
            Field::RspCons,
            Field::RspProd,
        ] {
            guest.store(f, start);
        }
        let mut guest = guest;
        guest.resync();
        let (ours, guest_chan) = channel_pair();
        let t = RingTransport::new(mem, ours, 5, false, None).unwrap();
        Rig {
            t,
            guest,
            guest_chan,
        }
    }

    #[test]
    fn advertises_features_and_notifies_on_attach() {
        let r = rig(0);
        let f = r.guest.load(Field::ServerFeatures);
        assert_eq!(
            f,
            XENSTORE_SERVER_FEATURE_RECONNECTION | XENSTORE_SERVER_FEATURE_ERROR
        );
        assert!(r.guest_chan.try_consume().unwrap(), "guest was told");
        assert!(r.t.describe().contains("domain 5"));
    }

    #[test]
    fn requests_in_replies_out_with_notifications() {
        let mut r = rig(u32::MAX - 3);
        r.guest_chan.try_consume().unwrap();
        let mut req = Vec::new();
        encode_message(&mut req, 2, 7, 0, b"name\0");
        r.guest.write(&req).unwrap();
        r.guest_chan.notify().unwrap();
        assert_eq!(r.t.wake().unwrap(), Wake::News);
        assert_eq!(r.t.wake().unwrap(), Wake::Nothing, "nothing new");
        let mut buf = [0u8; 4096];
        let n = r.t.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], &req[..]);
        assert!(r.guest_chan.try_consume().unwrap(), "consumption signalled");
        assert_eq!(
            r.t.read(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        // A reply bigger than the ring goes out in pieces as the guest reads.
        let mut reply = Vec::new();
        encode_message(&mut reply, 2, 7, 0, &[b'v'; 1500]);
        let n1 =
            r.t.write_vectored(&[IoSlice::new(&reply[..10]), IoSlice::new(&reply[10..])])
                .unwrap();
        assert_eq!(n1, 1024);
        assert!(r.guest_chan.try_consume().unwrap());
        assert_eq!(
            r.t.write_vectored(&[IoSlice::new(&reply[n1..])])
                .unwrap_err()
                .kind(),
            io::ErrorKind::WouldBlock,
            "full ring pushes back"
        );
        let mut got = vec![0u8; 4096];
        let g1 = r.guest.read(&mut got).unwrap();
        r.guest_chan.notify().unwrap();
        assert_eq!(r.t.wake().unwrap(), Wake::News, "space freed is news");
        let n2 = r.t.write_vectored(&[IoSlice::new(&reply[n1..])]).unwrap();
        assert_eq!(n1 + n2, reply.len());
        let g2 = r.guest.read(&mut got[g1..]).unwrap();
        assert_eq!(&got[..g1 + g2], &reply[..]);
        let h = Header::decode(&got[..HEADER_LEN]).unwrap();
        assert_eq!((h.ty, h.req_id, h.len), (2, 7, 1500));
    }

    #[test]
    fn bad_indices_set_the_error_word() {
        let mut r = rig(100);
        r.guest.store(Field::ReqProd, 100 + 5000);
        r.guest_chan.notify().unwrap();
        assert_eq!(r.t.wake().unwrap(), Wake::News);
        let mut buf = [0u8; 4096];
        let e = r.t.read(&mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert_eq!(r.guest.load(Field::Error), XENSTORE_ERROR_RINGIDX);
        // The first error sticks.
        r.t.protocol_error();
        assert_eq!(r.guest.load(Field::Error), XENSTORE_ERROR_RINGIDX);

        let mut r = rig(0);
        r.t.protocol_error();
        assert_eq!(r.guest.load(Field::Error), XENSTORE_ERROR_PROTO);
        r.guest.store(Field::RspCons, 77);
        assert_eq!(
            r.t.write_vectored(&[IoSlice::new(b"x")])
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn reconnection_and_drop_hook() {
        let mut r = rig(40);
        r.guest.write(b"partial").unwrap();
        r.guest.store(Field::Connection, XENSTORE_RECONNECT);
        r.guest_chan.notify().unwrap();
        assert_eq!(r.t.wake().unwrap(), Wake::Reset);
        r.t.reset().unwrap();
        assert_eq!(r.guest.load(Field::Connection), XENSTORE_CONNECTED);
        assert_eq!(r.guest.load(Field::ReqProd), 0);
        let dropped = Arc::new(AtomicBool::new(false));
        let d2 = dropped.clone();
        let mem = Arc::new(AnonRingMemory::new(1));
        let (ours, _theirs) = channel_pair();
        let t = RingTransport::new(
            mem,
            ours,
            9,
            true,
            Some(Box::new(move |c: &EventChannel| {
                assert_eq!(c.port(), 1);
                d2.store(true, Ordering::SeqCst);
            })),
        )
        .unwrap();
        drop(t);
        assert!(dropped.load(Ordering::SeqCst));
    }
}
