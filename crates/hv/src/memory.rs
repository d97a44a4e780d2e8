//! Shared memory: a domain's RAM is a sealed memfd of 4 KiB frames that hvd
//! creates and hands out. The domain maps it whole ([`GuestMemory`]);
//! privileged backends map a guest's memory whole too ([`ForeignMemory`], like
//! dom0's foreign mappings through privcmd) and map chosen frames at
//! consecutive addresses for multi-page rings ([`FrameMapping`]).
//!
//! This module is one of the few places in pvio that holds raw pointers to
//! shared memory; everything above it works with frame numbers and copies.

use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;

use pvio_abi::XEN_PAGE_SIZE;
use rustix::mm::{mmap, mmap_anonymous, munmap, MapFlags, ProtFlags};

use crate::error::HvError;

/// A guest frame number: the index of a 4 KiB page in a domain's memory.
pub type Gfn = u32;

/// The frame of a guest's console page, by pvio's convention (Xen passes
/// it in `start_info`).
pub const CONSOLE_FRAME: Gfn = 0;
/// The frame of a guest's xenbus ring (`struct xenstore_domain_interface`).
pub const STORE_FRAME: Gfn = 1;
/// Frames a guest's own allocators must leave alone.
pub const RESERVED_FRAMES: u32 = 2;

/// One `mmap` of shared memory, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Mapping is a plain address range of MAP_SHARED memory; it carries
// no thread-affine state, and all access to the bytes goes through raw
// pointers whose users synchronise with atomics.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only exposes the pointer and length.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` from `offset`, shared and read-write.
    pub fn map_shared(fd: &OwnedFd, offset: u64, len: usize) -> Result<Self, HvError> {
        if len == 0 {
            return Err(HvError::InvalidArgument("cannot map 0 bytes".into()));
        }
        // SAFETY: a fresh mapping chosen by the kernel (no MAP_FIXED) cannot
        // alias any Rust object; the fd is a memfd whose size is sealed, so the
        // range stays backed for the mapping's lifetime.
        let ptr = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd.as_fd(),
                offset,
            )
        }
        .map_err(|e| HvError::Io(format!("mmap of {len} bytes failed: {e}")))?;
        Ok(Self {
            ptr: NonNull::new(ptr.cast())
                .ok_or_else(|| HvError::Io("mmap returned null".into()))?,
            len,
        })
    }

    /// Reserves `len` bytes of address space, inaccessible until frames are
    /// mapped into it with [`Mapping::map_frame_at`].
    fn reserve(len: usize) -> Result<Self, HvError> {
        // SAFETY: a fresh PROT_NONE anonymous reservation chosen by the kernel.
        let ptr = unsafe {
            mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        }
        .map_err(|e| HvError::Io(format!("reserving {len} bytes failed: {e}")))?;
        Ok(Self {
            ptr: NonNull::new(ptr.cast())
                .ok_or_else(|| HvError::Io("mmap returned null".into()))?,
            len,
        })
    }

    /// Maps frame `gfn` of `fd` at page `index` of this reservation.
    fn map_frame_at(&self, index: usize, fd: &OwnedFd, gfn: Gfn) -> Result<(), HvError> {
        let off = index * XEN_PAGE_SIZE;
        assert!(off + XEN_PAGE_SIZE <= self.len);
        // SAFETY: the target page lies inside our own reservation (checked
        // above), so MAP_FIXED replaces only memory this Mapping owns; no Rust
        // reference points into a PROT_NONE reservation.
        unsafe {
            mmap(
                self.ptr.as_ptr().add(off).cast(),
                XEN_PAGE_SIZE,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED | MapFlags::FIXED,
                fd.as_fd(),
                u64::from(gfn) * XEN_PAGE_SIZE as u64,
            )
        }
        .map_err(|e| HvError::Io(format!("mapping frame {gfn} failed: {e}")))?;
        Ok(())
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never, by construction).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we own this range since mmap returned it; nothing borrows
        // from it past the Mapping's lifetime.
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Copies bytes in or out of a page of shared memory. Shared pages can be
/// written by another process at any time, so access is by volatile copy.
fn check_range(frames: u32, gfn: Gfn, offset: usize, len: usize) -> Result<usize, HvError> {
    if gfn >= frames {
        return Err(HvError::BadFrame { gfn, frames });
    }
    if offset
        .checked_add(len)
        .is_none_or(|end| end > XEN_PAGE_SIZE)
    {
        return Err(HvError::InvalidArgument(format!(
            "range {offset}+{len} crosses the end of a page"
        )));
    }
    Ok(gfn as usize * XEN_PAGE_SIZE + offset)
}

fn copy_out(map: &Mapping, at: usize, buf: &mut [u8]) {
    debug_assert!(at + buf.len() <= map.len());
    // SAFETY: the range was bounds-checked against the mapping; the source
    // is shared memory another process may write concurrently, which is why
    // this is a byte copy with no reference to the source ever formed.
    unsafe { std::ptr::copy_nonoverlapping(map.as_ptr().add(at), buf.as_mut_ptr(), buf.len()) };
}

fn copy_in(map: &Mapping, at: usize, data: &[u8]) {
    debug_assert!(at + data.len() <= map.len());
    // SAFETY: bounds-checked destination inside our shared mapping; no Rust
    // reference into the destination exists.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), map.as_ptr().add(at), data.len()) };
}

/// A domain's own RAM, as the domain sees it.
#[derive(Debug)]
pub struct GuestMemory {
    fd: OwnedFd,
    map: Mapping,
    frames: u32,
}

impl GuestMemory {
    /// Maps the memfd hvd handed to this domain.
    pub fn from_fd(fd: OwnedFd, frames: u32) -> Result<Self, HvError> {
        let map = Mapping::map_shared(&fd, 0, frames as usize * XEN_PAGE_SIZE)?;
        Ok(Self { fd, map, frames })
    }

    /// Number of 4 KiB frames.
    pub fn frames(&self) -> u32 {
        self.frames
    }

    /// The whole mapping (for registering with io_uring, or a ring).
    pub fn mapping(&self) -> &Mapping {
        &self.map
    }

    /// The memfd (to hand to a child process, for example).
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Address of frame `gfn`.
    pub fn frame_ptr(&self, gfn: Gfn) -> Result<*mut u8, HvError> {
        let at = check_range(self.frames, gfn, 0, XEN_PAGE_SIZE)?;
        // SAFETY: `at` is inside the mapping (checked).
        Ok(unsafe { self.map.as_ptr().add(at) })
    }

    /// Copies `buf.len()` bytes out of frame `gfn` at `offset`.
    pub fn read(&self, gfn: Gfn, offset: usize, buf: &mut [u8]) -> Result<(), HvError> {
        let at = check_range(self.frames, gfn, offset, buf.len())?;
        copy_out(&self.map, at, buf);
        Ok(())
    }

    /// Copies `data` into frame `gfn` at `offset`.
    pub fn write(&self, gfn: Gfn, offset: usize, data: &[u8]) -> Result<(), HvError> {
        let at = check_range(self.frames, gfn, offset, data.len())?;
        copy_in(&self.map, at, data);
        Ok(())
    }
}

/// A guest's RAM as a privileged backend sees it: the whole memfd, mapped
/// once; grant validation says which frames the backend may touch.
#[derive(Debug)]
pub struct ForeignMemory {
    domid: pvio_abi::DomId,
    fd: OwnedFd,
    map: Mapping,
    frames: u32,
}

impl ForeignMemory {
    /// Maps the memfd of domain `domid` that hvd handed over.
    pub fn from_fd(domid: pvio_abi::DomId, fd: OwnedFd, frames: u32) -> Result<Self, HvError> {
        let map = Mapping::map_shared(&fd, 0, frames as usize * XEN_PAGE_SIZE)?;
        Ok(Self {
            domid,
            fd,
            map,
            frames,
        })
    }

    /// The domain this memory belongs to.
    pub fn domid(&self) -> pvio_abi::DomId {
        self.domid
    }

    /// Number of frames.
    pub fn frames(&self) -> u32 {
        self.frames
    }

    /// The whole mapping (for io_uring fixed buffers).
    pub fn mapping(&self) -> &Mapping {
        &self.map
    }

    /// Address of frame `gfn`.
    pub fn frame_ptr(&self, gfn: Gfn) -> Result<*mut u8, HvError> {
        let at = check_range(self.frames, gfn, 0, XEN_PAGE_SIZE)?;
        // SAFETY: `at` is inside the mapping (checked).
        Ok(unsafe { self.map.as_ptr().add(at) })
    }

    /// Copies bytes out of frame `gfn`.
    pub fn read(&self, gfn: Gfn, offset: usize, buf: &mut [u8]) -> Result<(), HvError> {
        let at = check_range(self.frames, gfn, offset, buf.len())?;
        copy_out(&self.map, at, buf);
        Ok(())
    }

    /// Copies bytes into frame `gfn`.
    pub fn write(&self, gfn: Gfn, offset: usize, data: &[u8]) -> Result<(), HvError> {
        let at = check_range(self.frames, gfn, offset, data.len())?;
        copy_in(&self.map, at, data);
        Ok(())
    }

    /// Maps the given frames at consecutive addresses (the way Xen maps a
    /// multi-page ring's grant refs contiguously in the backend).
    pub fn map_frames(&self, gfns: &[Gfn]) -> Result<FrameMapping, HvError> {
        if gfns.is_empty() {
            return Err(HvError::InvalidArgument("no frames to map".into()));
        }
        for &g in gfns {
            check_range(self.frames, g, 0, XEN_PAGE_SIZE)?;
        }
        let map = Mapping::reserve(gfns.len() * XEN_PAGE_SIZE)?;
        for (i, &g) in gfns.iter().enumerate() {
            map.map_frame_at(i, &self.fd, g)?;
        }
        Ok(FrameMapping {
            map,
            gfns: gfns.to_vec(),
        })
    }
}

/// Chosen frames of a guest mapped at consecutive addresses.
#[derive(Debug)]
pub struct FrameMapping {
    map: Mapping,
    gfns: Vec<Gfn>,
}

impl FrameMapping {
    /// Start address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_ptr()
    }

    /// Length in bytes (frames × 4096).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no frame is mapped (never, by construction).
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The frames, in mapping order.
    pub fn gfns(&self) -> &[Gfn] {
        &self.gfns
    }
}

/// A first-fit allocator of contiguous frame ranges, for a guest placing its
/// rings and I/O buffers in its own memory.
#[derive(Debug, Clone)]
pub struct FrameAllocator {
    used: Vec<bool>,
    reserved: u32,
}

impl FrameAllocator {
    /// Manages `frames` frames, of which the first `reserved` are never
    /// handed out.
    pub fn new(frames: u32, reserved: u32) -> Self {
        let mut used = vec![false; frames as usize];
        for u in used.iter_mut().take(reserved as usize) {
            *u = true;
        }
        Self { used, reserved }
    }

    /// Allocates `n` contiguous frames; returns the first.
    pub fn alloc(&mut self, n: u32) -> Result<Gfn, HvError> {
        if n == 0 {
            return Err(HvError::InvalidArgument("allocating 0 frames".into()));
        }
        let n = n as usize;
        let mut run = 0;
        for i in self.reserved as usize..self.used.len() {
            if self.used[i] {
                run = 0;
                continue;
            }
            run += 1;
            if run == n {
                let start = i + 1 - n;
                self.used[start..=i].iter_mut().for_each(|u| *u = true);
                return Ok(start as Gfn);
            }
        }
        Err(HvError::OutOfMemory {
            wanted: n as u32,
            free: self.free(),
        })
    }

    /// Frees `n` frames starting at `first`.
    pub fn free_range(&mut self, first: Gfn, n: u32) {
        let lo = (first as usize).max(self.reserved as usize);
        let hi = (first as usize + n as usize).min(self.used.len());
        for u in self.used.iter_mut().take(hi).skip(lo) {
            *u = false;
        }
    }

    /// Frames still free.
    pub fn free(&self) -> u32 {
        self.used.iter().filter(|u| !**u).count() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::create_sealed_memfd;

    #[test]
    fn guest_and_foreign_views_share_frames() {
        let fd = create_sealed_memfd("t", 8 * XEN_PAGE_SIZE as u64).unwrap();
        let dup = fd.try_clone().unwrap();
        let g = GuestMemory::from_fd(fd, 8).unwrap();
        let f = ForeignMemory::from_fd(3, dup, 8).unwrap();
        g.write(5, 100, b"hello").unwrap();
        let mut buf = [0u8; 5];
        f.read(5, 100, &mut buf).unwrap();
        assert_eq!(&buf, b"hello");
        assert!(g.write(8, 0, b"x").is_err());
        assert!(g.write(1, 4095, b"xy").is_err());
        assert!(f.read(7, usize::MAX, &mut buf).is_err());

        // Frames 6 and 2, in that order, appear back to back.
        g.write(6, 0, b"six").unwrap();
        g.write(2, 0, b"two").unwrap();
        let m = f.map_frames(&[6, 2]).unwrap();
        let mut six = [0u8; 3];
        let mut two = [0u8; 3];
        // SAFETY: both ranges lie inside the two-page mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(m.as_ptr(), six.as_mut_ptr(), 3);
            std::ptr::copy_nonoverlapping(m.as_ptr().add(XEN_PAGE_SIZE), two.as_mut_ptr(), 3);
        }
        assert_eq!(&six, b"six");
        assert_eq!(&two, b"two");
        assert!(f.map_frames(&[9]).is_err());
    }

    #[test]
    fn sealed_memfd_cannot_shrink() {
        let fd = create_sealed_memfd("t", 4096).unwrap();
        assert!(rustix::fs::ftruncate(&fd, 0).is_err());
    }

    #[test]
    fn allocator() {
        let mut a = FrameAllocator::new(10, 2);
        assert_eq!(a.free(), 8);
        let x = a.alloc(4).unwrap();
        assert_eq!(x, 2);
        let y = a.alloc(4).unwrap();
        assert_eq!(y, 6);
        assert!(a.alloc(1).is_err());
        a.free_range(x, 4);
        assert_eq!(a.alloc(3).unwrap(), 2);
        a.free_range(0, 100);
        assert_eq!(a.free(), 8);
        assert!(a.alloc(0).is_err());
    }
}
