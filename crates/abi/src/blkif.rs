//! The block protocol of `io/blkif.h` (x86_64 native ABI, `protocol = x86_64-abi`).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::grant_table::GrantRef;
use crate::ring::RingProtocol;

/// `blkif_vdev_t`.
pub type BlkifVdev = u16;
/// `blkif_sector_t`: a sector number in 512-byte units.
pub type BlkifSector = u64;

/// Read from the disk into the granted pages.
pub const BLKIF_OP_READ: u8 = 0;
/// Write the granted pages to the disk.
pub const BLKIF_OP_WRITE: u8 = 1;
/// Write after all earlier requests completed, then flush (`feature-barrier`).
pub const BLKIF_OP_WRITE_BARRIER: u8 = 2;
/// Flush the disk's write cache (`feature-flush-cache`); may carry no segments.
pub const BLKIF_OP_FLUSH_DISKCACHE: u8 = 3;
/// Reserved (used by SLES); always unsupported.
pub const BLKIF_OP_RESERVED_1: u8 = 4;
/// Discard a sector range (`feature-discard`); see [`BlkifRequestDiscard`].
pub const BLKIF_OP_DISCARD: u8 = 5;
/// An indirect request (`feature-max-indirect-segments`); see [`BlkifRequestIndirect`].
pub const BLKIF_OP_INDIRECT: u8 = 6;

/// pvio's block-status extension, not in Xen's `blkif.h` and only sent to
/// a backend that writes `feature-pvio-block-status = 1`: a request in the
/// [`BlkifRequest`] layout with one segment, a whole granted page (sectors
/// 0..=7) into which the backend writes what the disk holds from
/// `sector_number` on, as consecutive [`BlkifBlockStatus`] entries (up to
/// [`BLKIF_BLOCK_STATUS_PER_PAGE`], ended early by one of zero length). The
/// answer may stop short of the disk's end; ask again from there.
pub const BLKIF_OP_PVIO_BLOCK_STATUS: u8 = 0xf0;
/// [`BlkifBlockStatus::flags`]: the range is not allocated in the image.
pub const BLKIF_BLOCK_STATUS_HOLE: u32 = 1 << 0;
/// [`BlkifBlockStatus::flags`]: the range reads as zeroes.
pub const BLKIF_BLOCK_STATUS_ZERO: u32 = 1 << 1;
/// Entries in one answer page.
pub const BLKIF_BLOCK_STATUS_PER_PAGE: usize =
    crate::XEN_PAGE_SIZE / core::mem::size_of::<BlkifBlockStatus>();

/// `BLKIF_DISCARD_SECURE`: the discard must erase securely.
pub const BLKIF_DISCARD_SECURE: u8 = 1;

/// Maximum segments in a direct request.
pub const BLKIF_MAX_SEGMENTS_PER_REQUEST: usize = 11;
/// Maximum indirect pages in an indirect request.
pub const BLKIF_MAX_INDIRECT_PAGES_PER_REQUEST: usize = 8;
/// Segments described by one indirect page (4096 / 8).
pub const BLKIF_SEGS_PER_INDIRECT_FRAME: usize =
    crate::XEN_PAGE_SIZE / core::mem::size_of::<BlkifRequestSegment>();
/// Linux blkback's default `feature-max-indirect-segments`.
pub const BLKIF_DEFAULT_MAX_INDIRECT_SEGMENTS: usize = 256;
/// The largest `max-ring-page-order` (`XENBUS_MAX_RING_GRANT_ORDER`).
pub const BLKIF_MAX_RING_PAGE_ORDER: u32 = 4;

/// Sector size of `sector_number` and segment sector ranges.
pub const BLKIF_SECTOR_SIZE: usize = 512;
/// Sectors per 4 KiB page: `first_sect`/`last_sect` must be below this.
pub const BLKIF_SECTORS_PER_PAGE: u8 = (crate::XEN_PAGE_SIZE / BLKIF_SECTOR_SIZE) as u8;

/// The request succeeded.
pub const BLKIF_RSP_OKAY: i16 = 0;
/// The request failed.
pub const BLKIF_RSP_ERROR: i16 = -1;
/// The operation is not supported.
pub const BLKIF_RSP_EOPNOTSUPP: i16 = -2;

/// `info` bit: the device is a CD-ROM.
pub const VDISK_CDROM: u32 = 0x1;
/// `info` bit: the device is removable.
pub const VDISK_REMOVABLE: u32 = 0x2;
/// `info` bit: the device is read-only.
pub const VDISK_READONLY: u32 = 0x4;

/// `struct blkif_request_segment`: one granted page and the inclusive
/// sector range `first_sect..=last_sect` within it.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct BlkifRequestSegment {
    pub gref: GrantRef,
    pub first_sect: u8,
    pub last_sect: u8,
    pub _pad: [u8; 2],
}

/// `struct blkif_request`: a direct read, write, barrier or flush.
///
/// It is also the slot type of the request side of the ring: discard and
/// indirect requests are other views of the same 112 bytes, chosen by
/// `operation`.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct BlkifRequest {
    pub operation: u8,
    pub nr_segments: u8,
    pub handle: BlkifVdev,
    pub _pad0: [u8; 4],
    pub id: u64,
    pub sector_number: BlkifSector,
    pub seg: [BlkifRequestSegment; BLKIF_MAX_SEGMENTS_PER_REQUEST],
}

/// One entry of a [`BLKIF_OP_PVIO_BLOCK_STATUS`] answer (little-endian,
/// 16 bytes): `nr_sectors` 512-byte sectors with the same `flags`.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct BlkifBlockStatus {
    pub nr_sectors: u64,
    pub flags: u32,
    pub _pad: u32,
}

/// `struct blkif_request_discard`.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct BlkifRequestDiscard {
    pub operation: u8,
    pub flag: u8,
    pub handle: BlkifVdev,
    pub _pad0: [u8; 4],
    pub id: u64,
    pub sector_number: BlkifSector,
    pub nr_sectors: u64,
}

/// `struct blkif_request_indirect`: the segments live in up to eight granted
/// pages, each an array of [`BlkifRequestSegment`].
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct BlkifRequestIndirect {
    pub operation: u8,
    pub indirect_op: u8,
    pub nr_segments: u16,
    pub _pad0: [u8; 4],
    pub id: u64,
    pub sector_number: BlkifSector,
    pub handle: BlkifVdev,
    pub _pad1: [u8; 2],
    pub indirect_grefs: [GrantRef; BLKIF_MAX_INDIRECT_PAGES_PER_REQUEST],
    pub _pad2: [u8; 4],
}

/// `struct blkif_response`.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct BlkifResponse {
    pub id: u64,
    pub operation: u8,
    pub _pad0: u8,
    pub status: i16,
    pub _pad1: [u8; 4],
}

impl BlkifRequest {
    /// Views this slot as a discard request (meaningful when
    /// `operation == BLKIF_OP_DISCARD`).
    pub fn as_discard(&self) -> BlkifRequestDiscard {
        BlkifRequestDiscard::read_from_prefix(self.as_bytes())
            .map(|(d, _)| d)
            .unwrap_or_default()
    }

    /// Views this slot as an indirect request (meaningful when
    /// `operation == BLKIF_OP_INDIRECT`).
    pub fn as_indirect(&self) -> BlkifRequestIndirect {
        BlkifRequestIndirect::read_from_prefix(self.as_bytes())
            .map(|(d, _)| d)
            .unwrap_or_default()
    }

    /// Builds the slot that carries a discard request.
    pub fn from_discard(d: &BlkifRequestDiscard) -> Self {
        let mut slot = Self::default();
        slot.as_mut_bytes()[..core::mem::size_of::<BlkifRequestDiscard>()]
            .copy_from_slice(d.as_bytes());
        slot
    }

    /// Builds the slot that carries an indirect request.
    pub fn from_indirect(r: &BlkifRequestIndirect) -> Self {
        let mut slot = Self::default();
        slot.as_mut_bytes()[..core::mem::size_of::<BlkifRequestIndirect>()]
            .copy_from_slice(r.as_bytes());
        slot
    }
}

/// The blkif ring protocol (`DEFINE_RING_TYPES(blkif, ...)`).
#[derive(Debug, Clone, Copy)]
pub enum Blkif {}

impl RingProtocol for Blkif {
    type Request = BlkifRequest;
    type Response = BlkifResponse;
    const NAME: &'static str = "blkif";
}

/// Slots of a blkif ring of `2^order` pages: 32 per page.
pub fn blkif_ring_size(order: u32) -> usize {
    Blkif::ring_size_for_pages(1usize << order)
}

/// Name of a blkif operation, for logs.
pub fn op_name(op: u8) -> &'static str {
    match op {
        BLKIF_OP_READ => "read",
        BLKIF_OP_WRITE => "write",
        BLKIF_OP_WRITE_BARRIER => "write-barrier",
        BLKIF_OP_FLUSH_DISKCACHE => "flush-diskcache",
        BLKIF_OP_RESERVED_1 => "reserved-1",
        BLKIF_OP_DISCARD => "discard",
        BLKIF_OP_INDIRECT => "indirect",
        BLKIF_OP_PVIO_BLOCK_STATUS => "pvio-block-status",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_round_trip() {
        let d = BlkifRequestDiscard {
            operation: BLKIF_OP_DISCARD,
            flag: BLKIF_DISCARD_SECURE,
            handle: 7,
            id: 0xdead_beef,
            sector_number: 99,
            nr_sectors: 1 << 40,
            ..Default::default()
        };
        let slot = BlkifRequest::from_discard(&d);
        assert_eq!(slot.operation, BLKIF_OP_DISCARD);
        assert_eq!(slot.id, 0xdead_beef);
        assert_eq!(slot.as_discard(), d);

        let mut r = BlkifRequestIndirect {
            operation: BLKIF_OP_INDIRECT,
            indirect_op: BLKIF_OP_WRITE,
            nr_segments: 300,
            id: 5,
            sector_number: 8,
            handle: 3,
            ..Default::default()
        };
        r.indirect_grefs[7] = 1234;
        let slot = BlkifRequest::from_indirect(&r);
        assert_eq!(slot.as_indirect(), r);
    }

    #[test]
    fn ring_sizes() {
        assert_eq!(Blkif::SLOT_SIZE, 112);
        assert_eq!(blkif_ring_size(0), 32);
        assert_eq!(blkif_ring_size(4), 512);
        assert_eq!(BLKIF_SEGS_PER_INDIRECT_FRAME, 512);
        assert_eq!(core::mem::size_of::<BlkifBlockStatus>(), 16);
        assert_eq!(BLKIF_BLOCK_STATUS_PER_PAGE, 256);
    }
}
