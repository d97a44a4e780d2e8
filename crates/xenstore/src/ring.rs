//! The xenbus ring page (`struct xenstore_domain_interface` of
//! `io/xs_wire.h`, docs/misc/xenstore-ring.txt): two 1 KiB byte streams,
//! requests (`req`) from the guest and replies and watch events (`rsp`) to
//! it, each with a free-running u32 producer and consumer index, plus the
//! server-feature, connection-state and error words.
//!
//! [`XenbusRing`] is one end of that page, used by both sides: the daemon's
//! [`crate::daemon::ring_transport`] (`End::Server`: reads `req`, writes
//! `rsp`) and the guest client (`End::Guest`: the reverse). It keeps its
//! own two indices privately and publishes them; it reads the peer's two
//! indices once per call, checks `prod - cons <= 1024` (anything else is
//! [`BadIndices`], never a loop or a panic), and copies bytes in or out of
//! the stream with volatile copies, masked with `& 1023`. It neither
//! notifies nor blocks: the caller signals the event channel after every
//! update, as the ring protocol asks.
//!
//! Memory access follows `pvio_ring`'s rules ([`RingMemory`]): the seven
//! u32 words are touched only as atomics, the data bytes only by volatile
//! copies, and no other reference into the page is ever formed.

use core::mem::offset_of;
use core::sync::atomic::{AtomicU32, Ordering};
use pvio_abi::xs_wire::{
    XenstoreDomainInterface, XenstoreRingIdx, XENSTORE_CONNECTED, XENSTORE_RING_SIZE,
};
use pvio_ring::RingMemory;

const RING: u32 = XENSTORE_RING_SIZE as u32;
const REQ: usize = offset_of!(XenstoreDomainInterface, req);
const RSP: usize = offset_of!(XenstoreDomainInterface, rsp);
/// Bytes of the page the interface occupies (2076).
pub const INTERFACE_SIZE: usize = core::mem::size_of::<XenstoreDomainInterface>();

/// One of the u32 words of the interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    ReqCons,
    ReqProd,
    RspCons,
    RspProd,
    ServerFeatures,
    Connection,
    Error,
}

impl Field {
    const fn offset(self) -> usize {
        match self {
            Field::ReqCons => offset_of!(XenstoreDomainInterface, req_cons),
            Field::ReqProd => offset_of!(XenstoreDomainInterface, req_prod),
            Field::RspCons => offset_of!(XenstoreDomainInterface, rsp_cons),
            Field::RspProd => offset_of!(XenstoreDomainInterface, rsp_prod),
            Field::ServerFeatures => offset_of!(XenstoreDomainInterface, server_features),
            Field::Connection => offset_of!(XenstoreDomainInterface, connection),
            Field::Error => offset_of!(XenstoreDomainInterface, error),
        }
    }
}

/// Which side of the page this end is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// xenstored: consumes `req`, produces `rsp`.
    Server,
    /// The guest: produces `req`, consumes `rsp`.
    Guest,
}

/// Which stream an index problem was found in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Requests,
    Responses,
}

/// The peer published an index that no correct peer could: the producer is
/// more than 1024 bytes ahead of the consumer (or behind it). The ring is
/// unusable; the server answers with `XENSTORE_ERROR_RINGIDX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("inconsistent {stream:?} ring indices: producer {prod:#x}, consumer {cons:#x}")]
pub struct BadIndices {
    pub stream: Stream,
    pub cons: XenstoreRingIdx,
    pub prod: XenstoreRingIdx,
}

/// The memory handed to [`XenbusRing::attach`] cannot hold the interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a xenbus ring needs {INTERFACE_SIZE} bytes aligned to 4; got {len} bytes at {addr:#x}")]
pub struct BadRingMemory {
    pub addr: usize,
    pub len: usize,
}

/// One end of a xenbus ring page.
#[derive(Debug)]
pub struct XenbusRing<M: RingMemory> {
    mem: M,
    end: End,
    /// Our consumer index of the incoming stream.
    in_cons: XenstoreRingIdx,
    /// Our producer index of the outgoing stream.
    out_prod: XenstoreRingIdx,
}

impl<M: RingMemory> XenbusRing<M> {
    /// Attaches to a page as `end`, taking our two indices from it as they
    /// are (they need not start at 0).
    pub fn attach(mem: M, end: End) -> Result<Self, BadRingMemory> {
        let (addr, len) = (mem.as_ptr() as usize, mem.len());
        if len < INTERFACE_SIZE || !addr.is_multiple_of(4) {
            return Err(BadRingMemory { addr, len });
        }
        let mut r = Self {
            mem,
            end,
            in_cons: 0,
            out_prod: 0,
        };
        r.resync();
        Ok(r)
    }

    /// Which end this is.
    pub fn end(&self) -> End {
        self.end
    }

    /// The memory.
    pub fn memory(&self) -> &M {
        &self.mem
    }

    fn atomic(&self, f: Field) -> &AtomicU32 {
        let ptr = self.mem.as_ptr().wrapping_add(f.offset()).cast::<u32>();
        // SAFETY: `attach` checked that the region holds the whole interface
        // and is 4-byte aligned; every field offset is a multiple of 4 below
        // INTERFACE_SIZE, and RingMemory keeps the region mapped for as long
        // as `self.mem` lives, which outlives the returned borrow. These
        // words are only ever accessed atomically here, and by the peer with
        // its own atomic accesses; an atomic may change under us at any time.
        unsafe { AtomicU32::from_ptr(ptr) }
    }

    /// Reads one word of the interface.
    pub fn load(&self, f: Field) -> u32 {
        self.atomic(f).load(Ordering::Acquire)
    }

    /// Writes one word of the interface (tests and hostile tools may write
    /// any word; the protocol paths use the methods below).
    pub fn store(&self, f: Field, v: u32) {
        self.atomic(f).store(v, Ordering::Release)
    }

    /// (our consumer index, the peer's producer index, our consumer field,
    /// the peer's producer field) of the incoming stream.
    fn incoming(&self) -> (Field, Field, Stream) {
        match self.end {
            End::Server => (Field::ReqCons, Field::ReqProd, Stream::Requests),
            End::Guest => (Field::RspCons, Field::RspProd, Stream::Responses),
        }
    }

    /// (our producer field, the peer's consumer field) of the outgoing stream.
    fn outgoing(&self) -> (Field, Field, Stream) {
        match self.end {
            End::Server => (Field::RspProd, Field::RspCons, Stream::Responses),
            End::Guest => (Field::ReqProd, Field::ReqCons, Stream::Requests),
        }
    }

    /// Re-reads our own two indices from the page (after the peer side of
    /// a reset, or at attach).
    pub fn resync(&mut self) {
        let (in_cons, _, _) = self.incoming();
        let (out_prod, _, _) = self.outgoing();
        self.in_cons = self.load(in_cons);
        self.out_prod = self.load(out_prod);
    }

    /// Bytes waiting in the incoming stream.
    pub fn readable(&self) -> Result<u32, BadIndices> {
        let (_, prod_f, stream) = self.incoming();
        let prod = self.load(prod_f);
        let avail = prod.wrapping_sub(self.in_cons);
        if avail > RING {
            return Err(BadIndices {
                stream,
                cons: self.in_cons,
                prod,
            });
        }
        Ok(avail)
    }

    /// Free space in the outgoing stream.
    pub fn writable(&self) -> Result<u32, BadIndices> {
        let (_, cons_f, stream) = self.outgoing();
        let cons = self.load(cons_f);
        let used = self.out_prod.wrapping_sub(cons);
        if used > RING {
            return Err(BadIndices {
                stream,
                cons,
                prod: self.out_prod,
            });
        }
        Ok(RING - used)
    }

    /// Copies up to `buf.len()` bytes out of the incoming stream and
    /// publishes the new consumer index. `Ok(0)`: nothing is waiting.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize, BadIndices> {
        // Acquire on the peer's producer index orders the data reads after it.
        let avail = self.readable()?;
        let n = (avail as usize).min(buf.len());
        if n == 0 {
            return Ok(0);
        }
        let base = match self.end {
            End::Server => REQ,
            End::Guest => RSP,
        };
        let start = (self.in_cons & (RING - 1)) as usize;
        let first = n.min(XENSTORE_RING_SIZE - start);
        self.copy_out(base + start, &mut buf[..first]);
        self.copy_out(base, &mut buf[first..n]);
        self.in_cons = self.in_cons.wrapping_add(n as u32);
        // Release: our reads of the bytes happen before the peer may reuse them.
        let (cons_f, _, _) = self.incoming();
        self.store(cons_f, self.in_cons);
        Ok(n)
    }

    /// Copies as much of `data` as fits into the outgoing stream and
    /// publishes the new producer index. `Ok(0)`: the stream is full.
    pub fn write(&mut self, data: &[u8]) -> Result<usize, BadIndices> {
        let space = self.writable()?;
        let n = (space as usize).min(data.len());
        if n == 0 {
            return Ok(0);
        }
        let base = match self.end {
            End::Server => RSP,
            End::Guest => REQ,
        };
        let start = (self.out_prod & (RING - 1)) as usize;
        let first = n.min(XENSTORE_RING_SIZE - start);
        self.copy_in(base + start, &data[..first]);
        self.copy_in(base, &data[first..n]);
        self.out_prod = self.out_prod.wrapping_add(n as u32);
        // Release: the bytes are visible before the index that covers them.
        let (prod_f, _, _) = self.outgoing();
        self.store(prod_f, self.out_prod);
        Ok(n)
    }

    /// Server side of the ring reconnection (and of a re-introduction, as C
    /// xenstored's `domain_conn_reset()`): both streams emptied with all
    /// four indices at 0, then the connection marked connected. The caller
    /// notifies.
    pub fn reset(&mut self) {
        for f in [
            Field::ReqCons,
            Field::ReqProd,
            Field::RspCons,
            Field::RspProd,
        ] {
            self.store(f, 0);
        }
        self.in_cons = 0;
        self.out_prod = 0;
        self.store(Field::Connection, XENSTORE_CONNECTED);
    }

    fn copy_out(&self, off: usize, dst: &mut [u8]) {
        debug_assert!(off + dst.len() <= INTERFACE_SIZE);
        let src = self.mem.as_ptr().wrapping_add(off);
        let mut chunks = dst.chunks_exact_mut(8);
        let mut i = 0;
        for c in &mut chunks {
            // SAFETY: off + dst.len() stays inside the `req` or `rsp` array
            // (callers mask the start and split at the array's end), which
            // `attach` checked lies in the region; [u8; 8] needs no
            // alignment. Volatile: the bytes are copied once, here, and the
            // copy is all the caller ever looks at.
            let v = unsafe { src.add(i).cast::<[u8; 8]>().read_volatile() };
            c.copy_from_slice(&v);
            i += 8;
        }
        for b in chunks.into_remainder() {
            // SAFETY: as above, one byte.
            *b = unsafe { src.add(i).read_volatile() };
            i += 1;
        }
    }

    fn copy_in(&self, off: usize, data: &[u8]) {
        debug_assert!(off + data.len() <= INTERFACE_SIZE);
        let dst = self.mem.as_ptr().wrapping_add(off);
        let mut chunks = data.chunks_exact(8);
        let mut i = 0;
        for c in &mut chunks {
            let mut v = [0u8; 8];
            v.copy_from_slice(c);
            // SAFETY: as in copy_out: inside the stream array of the page.
            unsafe { dst.add(i).cast::<[u8; 8]>().write_volatile(v) };
            i += 8;
        }
        for b in chunks.remainder() {
            // SAFETY: as above, one byte.
            unsafe { dst.add(i).write_volatile(*b) };
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvio_abi::xs_wire::XENSTORE_RECONNECT;
    use pvio_ring::AnonRingMemory;
    use std::sync::Arc;

    fn pair_at(
        start: u32,
    ) -> (
        XenbusRing<Arc<AnonRingMemory>>,
        XenbusRing<Arc<AnonRingMemory>>,
    ) {
        let mem = Arc::new(AnonRingMemory::new(1));
        let setup = XenbusRing::attach(mem.clone(), End::Server).unwrap();
        for f in [
            Field::ReqCons,
            Field::ReqProd,
            Field::RspCons,
            Field::RspProd,
        ] {
            setup.store(f, start);
        }
        (
            XenbusRing::attach(mem.clone(), End::Server).unwrap(),
            XenbusRing::attach(mem, End::Guest).unwrap(),
        )
    }

    #[test]
    fn layout_matches_the_header() {
        assert_eq!(INTERFACE_SIZE, 2076);
        assert_eq!((REQ, RSP), (0, 1024));
        assert_eq!(Field::ReqCons.offset(), 2048);
        assert_eq!(Field::RspProd.offset(), 2060);
        assert_eq!(Field::Error.offset(), 2072);
        let small = AnonRingMemory::new(1);
        struct Short<'a>(&'a AnonRingMemory);
        // SAFETY: a prefix of a live allocation, accessed only through the ring.
        unsafe impl RingMemory for Short<'_> {
            fn as_ptr(&self) -> *mut u8 {
                self.0.as_ptr()
            }
            fn len(&self) -> usize {
                100
            }
        }
        assert!(XenbusRing::attach(Short(&small), End::Guest).is_err());
    }

    #[test]
    fn bytes_cross_the_index_wrap_at_u32_max() {
        // Indices 10 bytes short of wrapping, at an offset that also makes
        // the byte stream wrap inside the 1 KiB array.
        let (mut server, mut guest) = pair_at(u32::MAX - 9);
        let msg: Vec<u8> = (0..700u32).map(|i| (i * 7) as u8).collect();
        for _ in 0..5 {
            assert_eq!(guest.write(&msg).unwrap(), 700);
            let mut got = vec![0u8; 1024];
            assert_eq!(server.read(&mut got).unwrap(), 700);
            assert_eq!(&got[..700], &msg[..]);
            assert_eq!(server.write(&msg[..300]).unwrap(), 300);
            let mut back = [0u8; 300];
            assert_eq!(guest.read(&mut back).unwrap(), 300);
            assert_eq!(&back[..], &msg[..300]);
        }
        let req_prod = server.load(Field::ReqProd);
        assert_eq!(req_prod, (u32::MAX - 9).wrapping_add(3500));
        assert_eq!(server.load(Field::ReqCons), req_prod);
        assert!(req_prod < 4000, "the index wrapped");
    }

    #[test]
    fn partial_reads_and_writes() {
        let (mut server, mut guest) = pair_at(1000);
        assert_eq!(guest.write(b"hello, xenstore").unwrap(), 15);
        let mut a = [0u8; 4];
        assert_eq!(server.read(&mut a).unwrap(), 4);
        assert_eq!(&a, b"hell");
        assert_eq!(server.readable().unwrap(), 11);
        let mut b = [0u8; 64];
        assert_eq!(server.read(&mut b).unwrap(), 11);
        assert_eq!(&b[..11], b"o, xenstore");
        assert_eq!(server.read(&mut b).unwrap(), 0, "empty");
        assert_eq!(guest.read(&mut b).unwrap(), 0, "no replies yet");
    }

    #[test]
    fn a_full_ring_pushes_back() {
        let (mut server, mut guest) = pair_at(7);
        let big = vec![0xabu8; 1500];
        assert_eq!(guest.write(&big).unwrap(), 1024);
        assert_eq!(guest.writable().unwrap(), 0);
        assert_eq!(guest.write(&big).unwrap(), 0, "full: nothing more");
        let mut buf = [0u8; 100];
        assert_eq!(server.read(&mut buf).unwrap(), 100);
        assert_eq!(guest.write(&big).unwrap(), 100, "exactly the freed space");
        let mut all = vec![0u8; 2048];
        assert_eq!(server.read(&mut all).unwrap(), 1024);
        // The other direction too.
        assert_eq!(server.write(&big).unwrap(), 1024);
        assert_eq!(server.write(b"x").unwrap(), 0);
        assert_eq!(guest.read(&mut all).unwrap(), 1024);
        assert_eq!(server.write(b"x").unwrap(), 1);
    }

    #[test]
    fn hostile_indices_are_refused_not_followed() {
        let (mut server, guest) = pair_at(50);
        let mut buf = [0u8; 2048];
        // A producer more than a ring ahead of the consumer.
        guest.store(Field::ReqProd, 50 + 1025);
        let e = server.read(&mut buf).unwrap_err();
        assert_eq!(e.stream, Stream::Requests);
        assert_eq!((e.cons, e.prod), (50, 1075));
        // Exactly one ring ahead is fine (a full ring).
        guest.store(Field::ReqProd, 50 + 1024);
        assert_eq!(server.read(&mut buf).unwrap(), 1024);
        // A producer behind the consumer.
        guest.store(Field::ReqProd, 10);
        assert!(server.read(&mut buf).is_err());
        // The guest moves its response consumer past our producer.
        guest.store(Field::RspCons, 51);
        assert!(server.write(b"reply").is_err());
        assert!(server.writable().is_err());
        // Our own index, scribbled on by the guest, is not trusted either:
        // we keep ours and republish it.
        guest.store(Field::RspCons, 50);
        guest.store(Field::RspProd, 9999);
        assert_eq!(server.write(b"ok").unwrap(), 2);
        assert_eq!(server.load(Field::RspProd), 52);
    }

    #[test]
    fn reset_empties_both_streams() {
        let (mut server, mut guest) = pair_at(123_456);
        guest.write(b"half a request").unwrap();
        server.write(b"half a reply").unwrap();
        guest.store(Field::Connection, XENSTORE_RECONNECT);
        server.reset();
        for f in [
            Field::ReqCons,
            Field::ReqProd,
            Field::RspCons,
            Field::RspProd,
        ] {
            assert_eq!(server.load(f), 0);
        }
        assert_eq!(server.load(Field::Connection), XENSTORE_CONNECTED);
        guest.resync();
        assert_eq!(guest.write(b"again").unwrap(), 5);
        let mut buf = [0u8; 16];
        assert_eq!(server.read(&mut buf).unwrap(), 5);
        assert_eq!(&buf[..5], b"again");
    }
}
