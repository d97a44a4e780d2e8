//! `O_DIRECT`: whether to use it, what alignment it needs, and an aligned
//! buffer to probe it with.
//!
//! tapdisk opens images with `O_DIRECT` so guest writes bypass dom0's page
//! cache; some filesystems (tmpfs before Linux 6.6, some overlay and FUSE
//! setups) refuse it with `EINVAL`, at `open` or at the first I/O, and the
//! image then falls back to buffered I/O.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

/// Whether to open an image with `O_DIRECT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirectIo {
    /// Use it where the filesystem supports it, else buffered I/O (one log
    /// line says so).
    #[default]
    Auto,
    /// Never use it.
    Off,
    /// Use it or fail to open.
    Required,
}

/// The alignment `O_DIRECT` I/O on `file` needs: `(offset and length
/// alignment, memory alignment)`, from `statx(STATX_DIOALIGN)` (Linux 6.1),
/// else `BLKSSZGET` for block devices, else 512 for both.
pub(crate) fn dio_alignment(file: &File, is_block_device: bool) -> (u32, u32) {
    use rustix::fs::{statx, AtFlags, StatxFlags};
    if let Ok(st) = statx(file, "", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN) {
        if st.stx_mask & StatxFlags::DIOALIGN.bits() != 0 && st.stx_dio_offset_align != 0 {
            return (st.stx_dio_offset_align, st.stx_dio_mem_align.max(1));
        }
    }
    if is_block_device {
        let mut size: libc::c_int = 0;
        // SAFETY: BLKSSZGET writes one c_int through the pointer, which
        // points at a live local of that type.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::BLKSSZGET, &mut size) };
        if rc == 0 && size > 0 {
            return (size as u32, size as u32);
        }
    }
    (512, 512)
}

/// A zeroed heap buffer with a chosen alignment, for `O_DIRECT` I/O from
/// private memory (probes, tests, bounce buffers).
#[derive(Debug)]
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `len` zero bytes aligned to `align` (a power of two). Returns `None`
    /// for a zero length, a bad alignment, or allocation failure.
    pub fn new(len: usize, align: usize) -> Option<Self> {
        let layout = Layout::from_size_align(len, align).ok()?;
        if len == 0 {
            return None;
        }
        // SAFETY: the layout has a non-zero size (checked above).
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })?;
        Some(Self { ptr, layout })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// Never true (zero-length buffers are not created).
    pub fn is_empty(&self) -> bool {
        self.layout.size() == 0
    }

    /// Start address, for submitting I/O into the buffer.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of layout.size() initialised
        // (zeroed) bytes owned by self; the shared borrow of self prevents
        // mutation through as_mut_slice meanwhile.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, with exclusive access through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Reads the first `len` bytes of `file` into an aligned buffer: proves that
/// `O_DIRECT` I/O works, not only the `open`.
pub(crate) fn probe_read(file: &File, len: usize, align: usize) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut buf = AlignedBuf::new(len, align.max(512))
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::OutOfMemory))?;
    file.read_at(buf.as_mut_slice(), 0).map(|_| ())
}
