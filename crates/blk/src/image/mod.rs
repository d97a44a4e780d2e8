//! The image layer: what turns a virtual disk's byte range into I/O on host
//! files, like tapdisk's per-format drivers (`block-aio.c` for raw,
//! `block-vhd.c` for VHD) behind its `tap_disk` interface.
//!
//! An [`Image`] does no data I/O of its own on the fast path: the backend
//! asks it to [`Image::map`] a range to [`Extent`]s (a file of
//! [`Image::files`] and an offset, or zeroes for an unallocated range of a
//! sparse format) and hands those to an I/O engine. Formats that allocate
//! on first write (VHD) say so with [`MapOutcome::NeedsAllocation`]; the
//! backend then calls [`Image::allocate`] (which may block on metadata I/O)
//! and maps again. Raw images never need allocation.
//!
//! Flush is an fdatasync of every writable file ([`Image::sync_files`]),
//! discard a `fallocate(PUNCH_HOLE | KEEP_SIZE)` of the extents that
//! [`MapOp::Discard`] returns; after it the range reads back as zeroes.
//! Both also exist as blocking calls ([`Image::flush`], [`Image::discard`])
//! for tools and tests.

mod direct;
mod error;
mod raw;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::device::StatusExtent;

pub use direct::{AlignedBuf, DirectIo};
pub use error::ImageError;
pub use raw::{RawImage, RawOptions};

/// One host file behind an image, shared with the I/O engine.
#[derive(Debug, Clone)]
pub struct ImageFile {
    file: Arc<File>,
    path: PathBuf,
    direct_io: bool,
    writable: bool,
}

impl ImageFile {
    /// Wraps an open file.
    pub fn new(file: File, path: PathBuf, direct_io: bool, writable: bool) -> Self {
        Self {
            file: Arc::new(file),
            path,
            direct_io,
            writable,
        }
    }

    /// The open file (for registering with an engine).
    pub fn file(&self) -> &Arc<File> {
        &self.file
    }

    /// Where it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether it was opened with `O_DIRECT`: buffers, offsets and lengths
    /// must then be aligned (see [`Image::logical_block_size`] and
    /// [`Image::memory_alignment`]).
    pub fn direct_io(&self) -> bool {
        self.direct_io
    }

    /// Whether it was opened for writing.
    pub fn writable(&self) -> bool {
        self.writable
    }
}

/// What a range is mapped for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MapOp {
    /// Reading: unallocated ranges map to [`Extent::Zeroes`].
    Read,
    /// Writing: every extent is a file extent once allocation is done.
    Write,
    /// Discarding: the file extents to punch holes in (unallocated ranges
    /// are left out, being zeroes already).
    Discard,
}

/// A piece of a mapped range, in virtual order; the lengths add up to the
/// mapped length (for [`MapOp::Discard`], possibly to less).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extent {
    /// `len` bytes at `offset` in file number `file` of [`Image::files`].
    File { file: usize, offset: u64, len: u64 },
    /// `len` bytes that read as zeroes (fill the guest buffer, no I/O).
    Zeroes { len: u64 },
}

impl Extent {
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        match *self {
            Extent::File { len, .. } | Extent::Zeroes { len } => len,
        }
    }

    /// Whether the extent is empty (never, for extents an image returns).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether [`Image::map`] could map the whole range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapOutcome {
    /// `out` holds the extents.
    Complete,
    /// A write touches unallocated space: call [`Image::allocate`] for the
    /// range, then map again. `out` is unchanged.
    NeedsAllocation,
}

/// A virtual disk's image: one format over one or more host files.
pub trait Image: Send + Sync + std::fmt::Debug {
    /// The format's name, for logs (`"raw"`, `"vhd"`).
    fn format(&self) -> &'static str;

    /// Virtual size in bytes (a multiple of [`Image::logical_block_size`]).
    fn size(&self) -> u64;

    /// The logical block size in bytes to publish as `sector-size` and to
    /// validate requests with: 512, or the `O_DIRECT` alignment the file
    /// needs if that is larger.
    fn logical_block_size(&self) -> u32;

    /// Alignment in bytes that I/O buffers need (1 unless `O_DIRECT`).
    fn memory_alignment(&self) -> usize;

    /// Writes and discards are refused.
    fn read_only(&self) -> bool;

    /// Whether every file is opened with `O_DIRECT`.
    fn direct_io(&self) -> bool {
        self.files().iter().all(ImageFile::direct_io)
    }

    /// Whether discard is offered (the filesystem may still refuse a punch
    /// with `EOPNOTSUPP`; the backend then stops offering it).
    fn supports_discard(&self) -> bool;

    /// The host files, indexed by [`Extent::File::file`].
    fn files(&self) -> &[ImageFile];

    /// Maps `len` bytes at virtual `offset` for `op`, appending extents to
    /// `out`. The range must lie inside the image.
    fn map(
        &self,
        op: MapOp,
        offset: u64,
        len: u64,
        out: &mut Vec<Extent>,
    ) -> Result<MapOutcome, ImageError>;

    /// What `len` bytes at `offset` hold, as consecutive [`StatusExtent`]s
    /// appended to `out` (blocking, metadata only): at most
    /// `max_extents` of them, which may then cover less than `len`. Every
    /// extent's length is a multiple of 512. The default says the whole
    /// range is allocated, which is always true enough.
    fn block_status(
        &self,
        offset: u64,
        len: u64,
        max_extents: usize,
        out: &mut Vec<StatusExtent>,
    ) -> Result<(), ImageError> {
        check_range(self, offset, len)?;
        if len > 0 && max_extents > 0 {
            out.push(StatusExtent::data(len));
        }
        Ok(())
    }

    /// Allocates whatever a write of the range needs (blocking; metadata is
    /// durable when it returns). Formats without allocation do nothing.
    fn allocate(&mut self, offset: u64, len: u64) -> Result<(), ImageError> {
        check_range(self, offset, len)
    }

    /// The request limits of a disk backed by this image: its size, block
    /// size, read-only flag, and discard if offered; flush and barrier on,
    /// and the default indirect segment limit. Adjust before use.
    fn disk_limits(&self) -> crate::request::DiskLimits {
        crate::request::DiskLimits {
            logical_block_size: self.logical_block_size(),
            read_only: self.read_only(),
            discard: self.supports_discard() && !self.read_only(),
            ..crate::request::DiskLimits::new(self.size() >> 9)
        }
    }

    /// Indices of the files a flush must fdatasync.
    fn sync_files(&self) -> Vec<usize> {
        (0..self.files().len())
            .filter(|&i| self.files()[i].writable())
            .collect()
    }

    /// Blocking flush: fdatasync of every file in [`Image::sync_files`].
    fn flush(&self) -> Result<(), ImageError> {
        for i in self.sync_files() {
            let f = &self.files()[i];
            rustix::fs::fdatasync(f.file().as_ref())
                .map_err(|e| ImageError::io(f.path(), "fdatasync", e.into()))?;
        }
        Ok(())
    }

    /// Blocking discard: punches holes in the extents that
    /// [`MapOp::Discard`] yields; the range then reads as zeroes.
    fn discard(&self, offset: u64, len: u64) -> Result<(), ImageError> {
        if self.read_only() {
            return Err(ImageError::ReadOnly {
                path: self
                    .files()
                    .first()
                    .map(|f| f.path().to_owned())
                    .unwrap_or_default(),
            });
        }
        let mut extents = Vec::new();
        self.map(MapOp::Discard, offset, len, &mut extents)?;
        for e in extents {
            if let Extent::File { file, offset, len } = e {
                let f = &self.files()[file];
                punch_hole(f.file(), offset, len)
                    .map_err(|err| ImageError::io(f.path(), "fallocate(PUNCH_HOLE)", err))?;
            }
        }
        Ok(())
    }
}

/// Checks that `offset..offset + len` lies inside `image`.
pub fn check_range<I: Image + ?Sized>(image: &I, offset: u64, len: u64) -> Result<(), ImageError> {
    let size = image.size();
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(ImageError::OutOfRange { offset, len, size });
    }
    Ok(())
}

/// `fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)`: deallocates the
/// range; reads of it return zeroes and the file size is unchanged.
pub fn punch_hole(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    use rustix::fs::FallocateFlags;
    rustix::fs::fallocate(
        file,
        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
        offset,
        len,
    )?;
    Ok(())
}
