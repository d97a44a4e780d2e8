//! Every raw access to ring memory, and the only `unsafe` code in the crate.
//!
//! Mirrors how `io/ring.h` touches the shared page: the four indices are
//! 32-bit atomics at fixed offsets of the header, and a slot is copied whole
//! through a volatile pointer (`RING_COPY_REQUEST`), never referenced. The
//! only Rust references to shared bytes are `&AtomicU32`s to the indices,
//! because the peer may change anything else at any moment.
//!
//! Soundness rests on three facts, each checked where it is established:
//! the region is valid for `len` bytes for the life of the [`RingMemory`]
//! value (the trait's contract); the geometry was checked once against that
//! region (page alignment, page count, `64 + size * SLOT_SIZE <= len`); and
//! every slot index is masked here, whatever the caller passes. Entry types
//! are `FromBytes`, so any bytes read are a valid value.
//!
//! One caveat is inherent to shared memory with an untrusted peer: a peer
//! that writes a slot while we copy it races with us. Between processes that
//! is outside what Rust's memory model describes (as for any shared mapping);
//! inside one process it happens only if the protocol is broken, by two
//! endpoints of the same side on one region or by a [`crate::RawRing`]
//! writing slots an endpoint is reading, and the worst outcome on the
//! targets pvio runs on is a torn, still valid, copy.

use core::marker::PhantomData;
use core::ptr::NonNull;
use core::sync::atomic::{fence, AtomicU32, Ordering};
use std::alloc::{alloc_zeroed, dealloc, handle_alloc_error, Layout};
use std::sync::Arc;

use pvio_abi::ring::{RingIdx, RingProtocol, SRING_HEADER_SIZE};
use pvio_abi::XEN_PAGE_SIZE;
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::error::RingError;
use crate::layout;
use crate::protocol::{SharedIndex, SharedIndices};

/// A region of memory that holds a shared ring, typically a mapping shared
/// with another process.
///
/// # Safety
///
/// An implementor guarantees, for as long as the value lives (including
/// after it is moved):
///
/// * `as_ptr()` always returns the same address, and the `len()` bytes from
///   it are mapped readable and writable;
/// * `len()` always returns the same value;
/// * nothing in this process accesses those bytes except through this
///   crate, or through atomics (for the four ring indices) and volatile
///   accesses (for the rest), and nothing unmaps or remaps them.
///
/// Other processes may write the bytes at any time; that is the point.
pub unsafe trait RingMemory {
    /// Start of the region.
    fn as_ptr(&self) -> *mut u8;
    /// Length of the region in bytes.
    fn len(&self) -> usize;
    /// True if the region has no bytes (it then holds no ring).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// SAFETY: a shared reference keeps the referent alive, unmoved and unchanged
// for its lifetime, so the referent's guarantees carry over.
unsafe impl<T: RingMemory + ?Sized> RingMemory for &T {
    fn as_ptr(&self) -> *mut u8 {
        (**self).as_ptr()
    }
    fn len(&self) -> usize {
        (**self).len()
    }
}

// SAFETY: the Arc keeps its one shared referent alive at a fixed address for
// as long as any clone lives.
unsafe impl<T: RingMemory + ?Sized> RingMemory for Arc<T> {
    fn as_ptr(&self) -> *mut u8 {
        (**self).as_ptr()
    }
    fn len(&self) -> usize {
        (**self).len()
    }
}

// SAFETY: a Box's referent lives at a fixed heap address however the Box moves.
unsafe impl<T: RingMemory + ?Sized> RingMemory for Box<T> {
    fn as_ptr(&self) -> *mut u8 {
        (**self).as_ptr()
    }
    fn len(&self) -> usize {
        (**self).len()
    }
}

/// Contiguous frames of a domain's own memory holding a ring (the frontend's
/// side: it places the shared ring in its RAM and grants the frames).
#[derive(Debug, Clone)]
pub struct GuestPages {
    mem: Arc<pvio_hv::GuestMemory>,
    first: pvio_hv::Gfn,
    count: u32,
}

impl GuestPages {
    /// Frames `first .. first + count` of `mem`.
    pub fn new(
        mem: Arc<pvio_hv::GuestMemory>,
        first: pvio_hv::Gfn,
        count: u32,
    ) -> Result<Self, pvio_hv::HvError> {
        let end = first
            .checked_add(count)
            .filter(|e| count > 0 && *e <= mem.frames());
        if end.is_none() {
            return Err(pvio_hv::HvError::BadFrame {
                gfn: first.saturating_add(count),
                frames: mem.frames(),
            });
        }
        Ok(Self { mem, first, count })
    }

    /// The first frame.
    pub fn first_frame(&self) -> pvio_hv::Gfn {
        self.first
    }

    /// Number of frames.
    pub fn frames(&self) -> u32 {
        self.count
    }
}

// SAFETY: the Arc keeps the guest's memory mapped at a fixed address for as
// long as this value lives; `new` checked that the frames lie inside it, and
// frame_ptr of an in-range frame cannot fail.
unsafe impl RingMemory for GuestPages {
    fn as_ptr(&self) -> *mut u8 {
        self.mem
            .frame_ptr(self.first)
            .expect("frame range checked in GuestPages::new")
    }
    fn len(&self) -> usize {
        self.count as usize * XEN_PAGE_SIZE
    }
}

// SAFETY: a FrameMapping owns its mapping (unmapped only on drop), at a fixed
// address, `len()` bytes long, readable and writable.
unsafe impl RingMemory for pvio_hv::FrameMapping {
    fn as_ptr(&self) -> *mut u8 {
        pvio_hv::FrameMapping::as_ptr(self)
    }
    fn len(&self) -> usize {
        pvio_hv::FrameMapping::len(self)
    }
}

/// Zeroed, page-aligned private memory for a ring: for tests, benchmarks
/// and rings whose two ends are threads of one process (share it with an
/// `Arc`).
#[derive(Debug)]
pub struct AnonRingMemory {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl AnonRingMemory {
    /// Allocates `pages` zeroed 4 KiB pages aligned to 4 KiB.
    ///
    /// # Panics
    ///
    /// If `pages` is zero or the size overflows; aborts if memory runs out.
    pub fn new(pages: usize) -> Self {
        assert!(pages > 0, "a ring region has at least one page");
        let size = pages
            .checked_mul(XEN_PAGE_SIZE)
            .expect("ring region size overflows");
        let layout = Layout::from_size_align(size, XEN_PAGE_SIZE).expect("ring region layout");
        // SAFETY: the layout has a non-zero size (pages > 0).
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            handle_alloc_error(layout)
        };
        Self { ptr, layout }
    }

    /// Number of 4 KiB pages.
    pub fn pages(&self) -> usize {
        self.layout.size() / XEN_PAGE_SIZE
    }
}

impl Drop for AnonRingMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout, freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// SAFETY: the allocation is owned by the value and freed only on drop; every
// access goes through atomics or volatile copies, so sending the owner to
// another thread or sharing it between threads adds no data race that the
// ring protocol does not already order.
unsafe impl Send for AnonRingMemory {}
// SAFETY: as for Send.
unsafe impl Sync for AnonRingMemory {}

// SAFETY: the allocation lives, unmoved and of fixed size, until drop; only
// this crate touches it.
unsafe impl RingMemory for AnonRingMemory {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.layout.size()
    }
}

/// A ring region whose geometry has been checked for protocol `P`.
pub(crate) struct Mapping<P, M> {
    mem: M,
    size: u32,
    _protocol: PhantomData<fn() -> P>,
}

impl<P: RingProtocol, M: RingMemory> Mapping<P, M> {
    /// Checked at compile time for each protocol: slots must keep both entry
    /// types aligned (the C union is as aligned as its most aligned member,
    /// and `SLOT_SIZE` must reflect that) and hold either of them.
    const ENTRY_FITS: () = {
        let slot = P::SLOT_SIZE;
        let req_align = align_of::<P::Request>();
        let rsp_align = align_of::<P::Response>();
        assert!(size_of::<P::Request>() <= slot && size_of::<P::Response>() <= slot);
        assert!(slot.is_multiple_of(req_align) && slot.is_multiple_of(rsp_align));
        assert!(SRING_HEADER_SIZE.is_multiple_of(req_align));
        assert!(SRING_HEADER_SIZE.is_multiple_of(rsp_align));
        assert!(req_align <= XEN_PAGE_SIZE && rsp_align <= XEN_PAGE_SIZE);
    };

    pub(crate) fn new(mem: M) -> Result<Self, RingError> {
        let () = Self::ENTRY_FITS;
        let size = layout::ring_slots(mem.as_ptr() as usize, mem.len(), P::SLOT_SIZE, P::NAME)?;
        Ok(Self {
            mem,
            size,
            _protocol: PhantomData,
        })
    }

    pub(crate) fn size(&self) -> u32 {
        self.size
    }

    pub(crate) fn memory(&self) -> &M {
        &self.mem
    }

    pub(crate) fn into_memory(self) -> M {
        self.mem
    }

    pub(crate) fn indices(&self) -> ShmIndices<'_> {
        ShmIndices {
            base: self.mem.as_ptr(),
            _region: PhantomData,
        }
    }

    /// Address of the slot `idx` lands in. In bounds for any `idx`.
    #[inline]
    fn slot_ptr(&self, idx: RingIdx) -> *mut u8 {
        let slot = (idx & (self.size - 1)) as usize;
        // In bounds: slot < size and 64 + size * SLOT_SIZE <= len (checked
        // by `layout::ring_slots`), so the offset stays inside the region.
        self.mem
            .as_ptr()
            .wrapping_add(SRING_HEADER_SIZE + slot * P::SLOT_SIZE)
    }

    #[inline]
    pub(crate) fn read_request(&self, idx: RingIdx) -> P::Request {
        read_entry(self.slot_ptr(idx))
    }

    #[inline]
    pub(crate) fn read_response(&self, idx: RingIdx) -> P::Response {
        read_entry(self.slot_ptr(idx))
    }

    #[inline]
    pub(crate) fn write_request(&self, idx: RingIdx, req: &P::Request) {
        write_entry(self.slot_ptr(idx), req)
    }

    #[inline]
    pub(crate) fn write_response(&self, idx: RingIdx, rsp: &P::Response) {
        write_entry(self.slot_ptr(idx), rsp)
    }

    /// The non-index part of `SHARED_RING_INIT`: zero `pvt` and `__pad`
    /// (bytes 16..64 of the header).
    pub(crate) fn zero_header_padding(&self) {
        const PAD: usize = SRING_HEADER_SIZE - 16;
        let ptr = self.mem.as_ptr().wrapping_add(16).cast::<[u8; PAD]>();
        // SAFETY: bytes 16..64 are inside the region (len >= 4096), hold no
        // index, and a byte array needs no alignment.
        unsafe { ptr.write_volatile([0; PAD]) }
    }

    /// Volatile byte-wise write into the ring region, for tests and tools
    /// that play a misbehaving peer. Refuses to overlap the four indices
    /// (bytes 0..16), which are written only as atomics.
    pub(crate) fn write_bytes(&self, offset: usize, bytes: &[u8]) -> Result<(), RawAccessError> {
        self.check_raw(offset, bytes.len())?;
        let base = self.mem.as_ptr().wrapping_add(offset);
        for (i, b) in bytes.iter().enumerate() {
            // SAFETY: offset + len <= region length and offset >= 16
            // (check_raw), so every byte is in the region and outside the
            // atomically accessed indices.
            unsafe { base.add(i).write_volatile(*b) }
        }
        Ok(())
    }

    /// Volatile byte-wise read from the ring region (outside the indices).
    pub(crate) fn read_bytes(&self, offset: usize, buf: &mut [u8]) -> Result<(), RawAccessError> {
        self.check_raw(offset, buf.len())?;
        let base = self.mem.as_ptr().wrapping_add(offset);
        for (i, b) in buf.iter_mut().enumerate() {
            // SAFETY: as in write_bytes.
            *b = unsafe { base.add(i).read_volatile() };
        }
        Ok(())
    }

    fn check_raw(&self, offset: usize, len: usize) -> Result<(), RawAccessError> {
        let end = offset.checked_add(len);
        match end {
            Some(end) if offset >= INDEX_BYTES && end <= self.mem.len() => Ok(()),
            _ => Err(RawAccessError {
                offset,
                len,
                region: self.mem.len(),
            }),
        }
    }
}

/// The four indices occupy the first 16 bytes of the header.
pub(crate) const INDEX_BYTES: usize = 16;

/// A raw byte access that would leave the region or touch the indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("raw access of {len} bytes at offset {offset} is outside bytes 16..{region} of the ring")]
pub struct RawAccessError {
    pub offset: usize,
    pub len: usize,
    pub region: usize,
}

/// Copies one entry out of a slot, once, whole (`RING_COPY_*`).
#[inline]
fn read_entry<T: FromBytes>(slot: *mut u8) -> T {
    // SAFETY: `slot` is in bounds for a whole slot (Mapping::slot_ptr) and
    // size_of::<T>() <= SLOT_SIZE; it is aligned for T because the region
    // is page-aligned and both the header size and SLOT_SIZE are multiples
    // of T's alignment (Mapping::ENTRY_FITS). T: FromBytes, so whatever the
    // peer wrote, even torn by a concurrent write, is a valid T. The
    // volatile read keeps the compiler from reading the slot again later
    // (the XSA-155 double fetch): only the returned copy is used.
    unsafe { slot.cast::<T>().read_volatile() }
}

/// Writes one entry into a slot, whole.
#[inline]
fn write_entry<T: IntoBytes + Immutable + Copy>(slot: *mut u8, value: &T) {
    // SAFETY: in bounds and aligned as in read_entry. T: IntoBytes has no
    // padding, so no uninitialised byte of ours reaches the peer (XSA-216).
    unsafe { slot.cast::<T>().write_volatile(*value) }
}

/// The four indices of a checked ring region, as atomics.
#[derive(Clone, Copy)]
pub struct ShmIndices<'a> {
    base: *mut u8,
    _region: PhantomData<&'a ()>,
}

impl ShmIndices<'_> {
    #[inline]
    fn atomic(&self, index: SharedIndex) -> &AtomicU32 {
        let ptr = self.base.wrapping_add(index.offset()).cast::<u32>();
        // SAFETY: `base` is a page-aligned region of at least one page that
        // outlives 'a (Mapping checked it; RingMemory guarantees it), so the
        // u32 at offset 0, 4, 8 or 12 is in bounds and 4-byte aligned. This
        // crate only ever accesses those 16 bytes atomically (raw byte
        // access refuses them), as the peer does with its own atomics.
        unsafe { AtomicU32::from_ptr(ptr) }
    }
}

impl SharedIndices for ShmIndices<'_> {
    #[inline]
    fn load(&self, index: SharedIndex, order: Ordering) -> RingIdx {
        self.atomic(index).load(order)
    }

    #[inline]
    fn store(&self, index: SharedIndex, value: RingIdx, order: Ordering) {
        self.atomic(index).store(value, order)
    }

    #[inline]
    fn full_fence(&self) {
        fence(Ordering::SeqCst)
    }
}

impl core::fmt::Debug for ShmIndices<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let mut d = f.debug_struct("ShmIndices");
        for i in SharedIndex::ALL {
            d.field(i.name(), &self.load(i, Ordering::Relaxed));
        }
        d.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvio_abi::blkif::{Blkif, BlkifRequest, BlkifResponse};

    #[test]
    fn anon_memory_is_page_aligned_and_zeroed() {
        for pages in [1, 2, 16] {
            let mem = AnonRingMemory::new(pages);
            assert_eq!(mem.as_ptr() as usize % XEN_PAGE_SIZE, 0);
            assert_eq!(mem.len(), pages * XEN_PAGE_SIZE);
            assert_eq!(mem.pages(), pages);
            let map = Mapping::<Blkif, _>::new(&mem).unwrap();
            let mut buf = vec![0xffu8; mem.len() - INDEX_BYTES];
            map.read_bytes(INDEX_BYTES, &mut buf).unwrap();
            assert!(buf.iter().all(|b| *b == 0));
        }
    }

    #[test]
    fn slots_wrap_and_stay_in_bounds() {
        let mem = AnonRingMemory::new(1);
        let map = Mapping::<Blkif, _>::new(&mem).unwrap();
        assert_eq!(map.size(), 32);
        let req = BlkifRequest {
            id: 0xdead_beef,
            sector_number: 7,
            ..Default::default()
        };
        map.write_request(u32::MAX, &req);
        assert_eq!(map.read_request(31), req);
        assert_eq!(map.read_request(31 + 32 * 1000), req);
        let rsp = BlkifResponse {
            id: 5,
            status: -1,
            ..Default::default()
        };
        map.write_response(0, &rsp);
        assert_eq!(map.read_response(32), rsp);
        // Slot 31 ends exactly at 64 + 32 * 112 = 3648 <= 4096.
        let end = map.slot_ptr(31) as usize + Blkif::SLOT_SIZE - mem.as_ptr() as usize;
        assert_eq!(end, 3648);
    }

    #[test]
    fn raw_access_never_touches_indices_or_leaves_the_region() {
        let mem = AnonRingMemory::new(1);
        let map = Mapping::<Blkif, _>::new(&mem).unwrap();
        assert!(map.write_bytes(15, &[1]).is_err());
        assert!(map.write_bytes(4095, &[1, 2]).is_err());
        assert!(map.write_bytes(usize::MAX, &[1]).is_err());
        assert!(map.write_bytes(4095, &[1]).is_ok());
        let mut b = [0u8; 1];
        map.read_bytes(4095, &mut b).unwrap();
        assert_eq!(b, [1]);
    }
}
