//! One blkif request (`io/blkif.h`), parsed and validated once.
//!
//! The ring layer copies a request slot out of shared memory exactly once;
//! [`Request::parse`] turns that private copy (plus, for
//! `BLKIF_OP_INDIRECT`, private copies of the indirect descriptor pages)
//! into an owned, typed [`Request`] that execution uses without ever looking
//! at guest memory again (the XSA-155 lesson). It applies every check Linux
//! blkback makes in `dispatch_rw_block_io`, `xen_blkbk_parse_indirect`,
//! `xen_vbd_translate` and `dispatch_discard_io` (rows 5–10 of the checks
//! table in docs/xen-protocols.md §7.2), in the same order, and returns a
//! typed [`RequestError`] whose [`RequestError::status`] is the one place a
//! failure becomes a blkif status. The shape follows Firecracker's
//! `virtio/block/request.rs` (`Request::parse`).
//!
//! Units: `sector_number`, `nr_sectors` and [`DiskLimits::sectors`] are in
//! 512-byte sectors, as Linux blkback uses them whatever the disk's logical
//! block size; the logical block size only adds an alignment rule.
//!
//! This module does no I/O and needs nothing beyond `pvio-abi`, so a fuzzer
//! can drive it directly ([`fuzz_parse`]).

use std::fmt;
use std::ops::Deref;

use pvio_abi::blkif::{
    BlkifRequest, BlkifRequestSegment, BlkifResponse, BLKIF_DEFAULT_MAX_INDIRECT_SEGMENTS,
    BLKIF_DISCARD_SECURE, BLKIF_MAX_INDIRECT_PAGES_PER_REQUEST, BLKIF_MAX_SEGMENTS_PER_REQUEST,
    BLKIF_OP_DISCARD, BLKIF_OP_FLUSH_DISKCACHE, BLKIF_OP_INDIRECT, BLKIF_OP_PVIO_BLOCK_STATUS,
    BLKIF_OP_READ, BLKIF_OP_WRITE, BLKIF_OP_WRITE_BARRIER, BLKIF_RSP_EOPNOTSUPP, BLKIF_RSP_ERROR,
    BLKIF_SECTORS_PER_PAGE, BLKIF_SECTOR_SIZE, BLKIF_SEGS_PER_INDIRECT_FRAME,
};
use pvio_abi::grant_table::GrantRef;
use pvio_abi::XEN_PAGE_SIZE;
use zerocopy::FromBytes;

/// `log2(BLKIF_SECTOR_SIZE)`.
pub const SECTOR_SHIFT: u32 = 9;

/// The protocol's ceiling on segments of an indirect request: 8 pages of
/// 512 descriptors.
pub const MAX_INDIRECT_SEGMENTS_PROTOCOL: u32 =
    (BLKIF_MAX_INDIRECT_PAGES_PER_REQUEST * BLKIF_SEGS_PER_INDIRECT_FRAME) as u32;

/// One indirect descriptor page, as copied into private memory.
pub type IndirectPage = [u8; XEN_PAGE_SIZE];

/// What a disk accepts: its size, its logical block size, whether it is
/// read-only and which optional operations it advertised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskLimits {
    /// Size in 512-byte sectors (always; the xenstore `sectors` key is in
    /// `sector-size` units instead).
    pub sectors: u64,
    /// Logical block size in bytes (a power of two, at least 512). Request
    /// sectors and segment lengths must be multiples of it.
    pub logical_block_size: u32,
    /// Writes, barriers and discards are refused.
    pub read_only: bool,
    /// `feature-flush-cache`.
    pub flush: bool,
    /// `feature-barrier`.
    pub barrier: bool,
    /// `feature-discard`.
    pub discard: bool,
    /// `discard-secure`: a discard flagged `BLKIF_DISCARD_SECURE` is passed
    /// on as secure; otherwise the flag is dropped (Linux blkback does the
    /// same).
    pub discard_secure: bool,
    /// `feature-max-indirect-segments`; 0 means indirect requests are not
    /// offered (and answered `BLKIF_RSP_EOPNOTSUPP`). Values above the
    /// protocol's 4096 are treated as 4096.
    pub max_indirect_segments: u32,
    /// `feature-pvio-block-status`.
    pub block_status: bool,
}

impl DiskLimits {
    /// A read-write disk of `sectors` 512-byte sectors with 512-byte blocks,
    /// flush, barrier and discard, and Linux blkback's 256 indirect segments.
    pub fn new(sectors: u64) -> Self {
        Self {
            sectors,
            logical_block_size: BLKIF_SECTOR_SIZE as u32,
            read_only: false,
            flush: true,
            barrier: true,
            discard: true,
            discard_secure: false,
            max_indirect_segments: BLKIF_DEFAULT_MAX_INDIRECT_SEGMENTS as u32,
            block_status: true,
        }
    }

    /// The logical block size in 512-byte sectors (at least 1).
    pub fn block_sectors(&self) -> u64 {
        u64::from(self.logical_block_size >> SECTOR_SHIFT).max(1)
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.sectors.saturating_mul(BLKIF_SECTOR_SIZE as u64)
    }

    fn indirect_limit(&self) -> u32 {
        self.max_indirect_segments
            .min(MAX_INDIRECT_SEGMENTS_PROTOCOL)
    }
}

/// A request's operation, after validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// Read the disk into the segments.
    Read,
    /// Write the segments to the disk.
    Write,
    /// Wait for every earlier request, then write the segments (if any) and
    /// make everything durable.
    WriteBarrier,
    /// Make every completed write durable; segments, if any, are written
    /// too (Linux blkfront sends flush-with-data for `REQ_PREFLUSH` writes).
    /// Acknowledge only after the data and an fdatasync are done.
    Flush,
    /// Drop the contents of the range; reads of it return zeroes.
    Discard {
        /// Erase securely (only when the disk offers `discard-secure`).
        secure: bool,
    },
    /// pvio's extension (`BLKIF_OP_PVIO_BLOCK_STATUS`): write what the disk
    /// holds from the request's sector on (holes, zeroes, data) into the
    /// one segment, a whole page.
    BlockStatus,
}

impl Operation {
    /// Whether the operation by itself changes the disk (write, barrier,
    /// discard). A flush that carries segments writes them too: see
    /// [`Request::changes_disk`].
    pub fn modifies_disk(&self) -> bool {
        !matches!(
            self,
            Operation::Read | Operation::Flush | Operation::BlockStatus
        )
    }

    /// Whether the backend writes into the request's pages (a read, or a
    /// block-status answer): they are then mapped writable.
    pub fn fills_segments(&self) -> bool {
        matches!(self, Operation::Read | Operation::BlockStatus)
    }

    /// Whether data moves from the disk into guest memory.
    pub fn is_read(&self) -> bool {
        matches!(self, Operation::Read)
    }

    /// The `BLKIF_OP_*` code.
    pub fn code(&self) -> u8 {
        match self {
            Operation::Read => BLKIF_OP_READ,
            Operation::Write => BLKIF_OP_WRITE,
            Operation::WriteBarrier => BLKIF_OP_WRITE_BARRIER,
            Operation::Flush => BLKIF_OP_FLUSH_DISKCACHE,
            Operation::Discard { .. } => BLKIF_OP_DISCARD,
            Operation::BlockStatus => BLKIF_OP_PVIO_BLOCK_STATUS,
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(pvio_abi::blkif::op_name(self.code()))?;
        if let Operation::Discard { secure: true } = self {
            f.write_str(" (secure)")?;
        }
        Ok(())
    }
}

/// One validated segment: a granted page, the inclusive sector range
/// `first_sect..=last_sect` within it (`first_sect <= last_sect < 8`), and
/// where on the disk its data goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Segment {
    gref: GrantRef,
    first_sect: u8,
    last_sect: u8,
    disk_sector: u64,
}

impl Segment {
    /// The grant reference of the data page.
    pub fn gref(&self) -> GrantRef {
        self.gref
    }

    /// First sector within the page (0..=7).
    pub fn first_sect(&self) -> u8 {
        self.first_sect
    }

    /// Last sector within the page, inclusive (`first_sect..=7`).
    pub fn last_sect(&self) -> u8 {
        self.last_sect
    }

    /// Number of 512-byte sectors (1..=8).
    pub fn sectors(&self) -> u64 {
        u64::from(self.last_sect - self.first_sect) + 1
    }

    /// Byte offset of the data within its page; `page_offset() + len()` is
    /// at most 4096.
    pub fn page_offset(&self) -> usize {
        usize::from(self.first_sect) * BLKIF_SECTOR_SIZE
    }

    /// Length of the data in bytes (512..=4096).
    pub fn len(&self) -> usize {
        self.sectors() as usize * BLKIF_SECTOR_SIZE
    }

    /// Never true: a valid segment holds at least one sector.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The disk sector (512-byte units) where this segment's data starts.
    pub fn disk_sector(&self) -> u64 {
        self.disk_sector
    }

    /// The disk byte offset where this segment's data starts.
    pub fn disk_offset(&self) -> u64 {
        self.disk_sector << SECTOR_SHIFT
    }
}

/// The segments of a request: inline for direct requests (at most 11),
/// on the heap for indirect ones.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Segments(Store);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Store {
    Inline {
        len: u8,
        segs: [Segment; BLKIF_MAX_SEGMENTS_PER_REQUEST],
    },
    Heap(Vec<Segment>),
}

impl Segments {
    fn inline() -> Self {
        Segments(Store::Inline {
            len: 0,
            segs: [Segment::default(); BLKIF_MAX_SEGMENTS_PER_REQUEST],
        })
    }

    fn heap(capacity: usize) -> Self {
        Segments(Store::Heap(Vec::with_capacity(capacity)))
    }

    /// Appends; the caller never exceeds the inline capacity (the segment
    /// count is checked before any segment is added).
    fn push(&mut self, seg: Segment) {
        match &mut self.0 {
            Store::Inline { len, segs } => {
                if let Some(slot) = segs.get_mut(usize::from(*len)) {
                    *slot = seg;
                    *len += 1;
                }
            }
            Store::Heap(v) => v.push(seg),
        }
    }
}

impl Deref for Segments {
    type Target = [Segment];
    fn deref(&self) -> &[Segment] {
        match &self.0 {
            Store::Inline { len, segs } => &segs[..usize::from(*len)],
            Store::Heap(v) => v,
        }
    }
}

/// A validated blkif request, owned and typed.
///
/// Invariants: `sector() + nr_sectors() <= limits.sectors`; both are
/// multiples of the logical block size; the segments (none for discard and
/// for a flush or barrier without data) are contiguous on disk from
/// `sector()` and each lies inside its page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    id: u64,
    operation: Operation,
    indirect: bool,
    sector: u64,
    nr_sectors: u64,
    segments: Segments,
}

impl Request {
    /// The frontend's request id, echoed in the response.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// What to do.
    pub fn operation(&self) -> Operation {
        self.operation
    }

    /// Whether the request came as `BLKIF_OP_INDIRECT`.
    pub fn is_indirect(&self) -> bool {
        self.indirect
    }

    /// First disk sector (512-byte units).
    pub fn sector(&self) -> u64 {
        self.sector
    }

    /// Number of 512-byte sectors (the sum over segments, or a discard's
    /// `nr_sectors`; 0 for a flush or barrier without data).
    pub fn nr_sectors(&self) -> u64 {
        self.nr_sectors
    }

    /// Disk byte offset of the first sector.
    pub fn disk_offset(&self) -> u64 {
        self.sector << SECTOR_SHIFT
    }

    /// Length in bytes.
    pub fn len_bytes(&self) -> u64 {
        self.nr_sectors << SECTOR_SHIFT
    }

    /// Whether executing the request changes the disk: a write, barrier or
    /// discard, or a flush carrying data. Its data pages are then only
    /// read (grant them read-only).
    pub fn changes_disk(&self) -> bool {
        self.operation.modifies_disk() || (self.nr_sectors > 0 && !self.operation.is_read())
    }

    /// The data segments, in disk order.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The `operation` a response to this request carries: the request's
    /// own code, or for an indirect request its `indirect_op`, as Linux
    /// blkback answers.
    pub fn response_operation(&self) -> u8 {
        self.operation.code()
    }

    /// A response with `status`, built in a zeroed value so no padding leaks
    /// (XSA-216).
    pub fn response(&self, status: i16) -> BlkifResponse {
        BlkifResponse {
            id: self.id,
            operation: self.response_operation(),
            status,
            ..BlkifResponse::default()
        }
    }

    /// Parses and validates `slot`, a private copy of one ring slot.
    ///
    /// For `BLKIF_OP_INDIRECT`, `pages` copies each descriptor page that the
    /// segment count needs (and no other) into private memory; each is read
    /// once. Direct requests never call it.
    pub fn parse<P: IndirectPages + ?Sized>(
        slot: &BlkifRequest,
        limits: &DiskLimits,
        pages: &mut P,
    ) -> Result<Request, RequestError> {
        // One read of the discriminant; everything below branches on the
        // local.
        let op = slot.operation;
        match op {
            BLKIF_OP_READ | BLKIF_OP_WRITE => parse_direct(slot, op, limits),
            BLKIF_OP_WRITE_BARRIER if limits.barrier => parse_direct(slot, op, limits),
            BLKIF_OP_FLUSH_DISKCACHE if limits.flush => parse_direct(slot, op, limits),
            BLKIF_OP_DISCARD if limits.discard => parse_discard(slot, limits),
            BLKIF_OP_INDIRECT if limits.indirect_limit() > 0 => parse_indirect(slot, limits, pages),
            BLKIF_OP_PVIO_BLOCK_STATUS if limits.block_status => parse_block_status(slot, limits),
            BLKIF_OP_WRITE_BARRIER
            | BLKIF_OP_FLUSH_DISKCACHE
            | BLKIF_OP_DISCARD
            | BLKIF_OP_INDIRECT
            | BLKIF_OP_PVIO_BLOCK_STATUS => Err(RequestError::NotOffered { op }),
            _ => Err(RequestError::UnknownOperation { op }),
        }
    }
}

/// The `operation` to echo when answering `slot` with an error: the
/// indirect request's `indirect_op`, else the slot's `operation`.
pub fn response_operation(slot: &BlkifRequest) -> u8 {
    let op = slot.operation;
    if op == BLKIF_OP_INDIRECT {
        slot.as_indirect().indirect_op
    } else {
        op
    }
}

/// The response to a slot that failed to parse: its `id` (at offset 8 in
/// every request view), the operation to echo and `err`'s status, in a
/// zeroed value.
pub fn error_response(slot: &BlkifRequest, err: &RequestError) -> BlkifResponse {
    BlkifResponse {
        id: slot.id,
        operation: response_operation(slot),
        status: err.status(),
        ..BlkifResponse::default()
    }
}

/// Copies indirect descriptor pages into private memory, by grant ref.
///
/// The ring layer implements it by mapping the grant (read-only) and copying
/// the page once. Closures `FnMut(GrantRef, &mut IndirectPage) -> Result<(),
/// E>` implement it.
pub trait IndirectPages {
    /// Why a page could not be copied (bad grant, unmapped frame, ...).
    type Error: std::error::Error + Send + Sync + 'static;

    /// Fills `page` with a copy of the page granted as `gref`.
    fn copy_page(&mut self, gref: GrantRef, page: &mut IndirectPage) -> Result<(), Self::Error>;
}

impl<F, E> IndirectPages for F
where
    F: FnMut(GrantRef, &mut IndirectPage) -> Result<(), E>,
    E: std::error::Error + Send + Sync + 'static,
{
    type Error = E;
    fn copy_page(&mut self, gref: GrantRef, page: &mut IndirectPage) -> Result<(), E> {
        self(gref, page)
    }
}

/// An [`IndirectPages`] for a backend that does not offer indirect
/// requests: every copy fails.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoIndirectPages;

/// The error of [`NoIndirectPages`].
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("indirect descriptor pages are not available")]
pub struct IndirectUnavailable;

impl IndirectPages for NoIndirectPages {
    type Error = IndirectUnavailable;
    fn copy_page(&mut self, _: GrantRef, _: &mut IndirectPage) -> Result<(), IndirectUnavailable> {
        Err(IndirectUnavailable)
    }
}

/// Why a request was refused. [`RequestError::status`] maps each to the
/// blkif status of its response.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The operation code is not one blkif defines (or is `RESERVED_1`).
    #[error("unknown operation {op}")]
    UnknownOperation { op: u8 },
    /// An optional operation this disk did not advertise.
    #[error("operation {} ({op}) is not offered by this disk", pvio_abi::blkif::op_name(*op))]
    NotOffered { op: u8 },
    /// An indirect request whose `indirect_op` is not read or write.
    #[error("indirect request with operation {indirect_op} (only read and write may be indirect)")]
    BadIndirectOperation { indirect_op: u8 },
    /// A read or write without segments.
    #[error("{op} request with no segments")]
    NoSegments { op: Operation },
    /// More segments than allowed.
    #[error("{nr} segments, over the limit of {max}")]
    TooManySegments { nr: u32, max: u32 },
    /// A segment whose sector range is not within one page.
    #[error("segment {index}: sectors {first_sect}..={last_sect} are not within a page")]
    BadSegment {
        index: usize,
        first_sect: u8,
        last_sect: u8,
    },
    /// A request that would change a read-only disk.
    #[error("{op} on a read-only disk")]
    ReadOnly { op: Operation },
    /// `sector + nr_sectors` overflows.
    #[error("sector range {sector}+{nr_sectors} overflows")]
    RangeOverflow { sector: u64, nr_sectors: u64 },
    /// The range ends beyond the disk.
    #[error("sector range {sector}+{nr_sectors} ends beyond the disk's {disk_sectors} sectors")]
    BeyondEnd {
        sector: u64,
        nr_sectors: u64,
        disk_sectors: u64,
    },
    /// A start sector or length not a multiple of the logical block size.
    #[error(
        "sector {sector} or length {nr_sectors} (sectors) is not a multiple of the \
         {block_sectors}-sector logical block"
    )]
    Misaligned {
        sector: u64,
        nr_sectors: u64,
        block_sectors: u64,
    },
    /// An indirect descriptor page could not be copied.
    #[error("indirect page {index} (grant ref {gref}) could not be read: {source}")]
    IndirectPage {
        index: usize,
        gref: GrantRef,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl RequestError {
    /// The blkif status of the response: `BLKIF_RSP_EOPNOTSUPP` for unknown
    /// and not-offered operations, `BLKIF_RSP_ERROR` for everything else.
    pub fn status(&self) -> i16 {
        match self {
            RequestError::UnknownOperation { .. } | RequestError::NotOffered { .. } => {
                BLKIF_RSP_EOPNOTSUPP
            }
            _ => BLKIF_RSP_ERROR,
        }
    }

    /// A short stable name for the error class, for counters and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            RequestError::UnknownOperation { .. } => "unknown_operation",
            RequestError::NotOffered { .. } => "not_offered",
            RequestError::BadIndirectOperation { .. } => "bad_indirect_operation",
            RequestError::NoSegments { .. } => "no_segments",
            RequestError::TooManySegments { .. } => "too_many_segments",
            RequestError::BadSegment { .. } => "bad_segment",
            RequestError::ReadOnly { .. } => "read_only",
            RequestError::RangeOverflow { .. } => "range_overflow",
            RequestError::BeyondEnd { .. } => "beyond_end",
            RequestError::Misaligned { .. } => "misaligned",
            RequestError::IndirectPage { .. } => "indirect_page",
        }
    }
}

fn operation_of(code: u8) -> Operation {
    match code {
        BLKIF_OP_READ => Operation::Read,
        BLKIF_OP_WRITE => Operation::Write,
        BLKIF_OP_WRITE_BARRIER => Operation::WriteBarrier,
        _ => Operation::Flush,
    }
}

/// Validates one segment descriptor (row 8) and places it on the disk at
/// `*next_sector`, which advances. The descriptor is a private copy; each
/// field is read once.
fn take_segment(
    index: usize,
    desc: BlkifRequestSegment,
    next_sector: &mut u64,
) -> Result<Segment, RequestError> {
    let BlkifRequestSegment {
        gref,
        first_sect,
        last_sect,
        ..
    } = desc;
    if last_sect >= BLKIF_SECTORS_PER_PAGE || last_sect < first_sect {
        return Err(RequestError::BadSegment {
            index,
            first_sect,
            last_sect,
        });
    }
    let seg = Segment {
        gref,
        first_sect,
        last_sect,
        disk_sector: *next_sector,
    };
    // Wrapping: the total is range-checked afterwards, and a wrapped value
    // can only belong to a request that check refuses.
    *next_sector = next_sector.wrapping_add(seg.sectors());
    Ok(seg)
}

fn parse_direct(
    slot: &BlkifRequest,
    code: u8,
    limits: &DiskLimits,
) -> Result<Request, RequestError> {
    let operation = operation_of(code);
    let BlkifRequest {
        nr_segments,
        id,
        sector_number,
        ref seg,
        ..
    } = *slot;
    let nseg = usize::from(nr_segments);
    // Row 7: flush and barrier may carry no data; read and write must.
    if nseg == 0 && matches!(operation, Operation::Read | Operation::Write) {
        return Err(RequestError::NoSegments { op: operation });
    }
    if nseg > BLKIF_MAX_SEGMENTS_PER_REQUEST {
        return Err(RequestError::TooManySegments {
            nr: u32::from(nr_segments),
            max: BLKIF_MAX_SEGMENTS_PER_REQUEST as u32,
        });
    }
    let mut segments = Segments::inline();
    let mut next = sector_number;
    for (index, desc) in seg.iter().take(nseg).enumerate() {
        segments.push(take_segment(index, *desc, &mut next)?);
    }
    finish(id, operation, false, sector_number, segments, limits)
}

fn parse_indirect<P: IndirectPages + ?Sized>(
    slot: &BlkifRequest,
    limits: &DiskLimits,
    pages: &mut P,
) -> Result<Request, RequestError> {
    let ind = slot.as_indirect();
    let indirect_op = ind.indirect_op;
    if indirect_op != BLKIF_OP_READ && indirect_op != BLKIF_OP_WRITE {
        return Err(RequestError::BadIndirectOperation { indirect_op });
    }
    let operation = operation_of(indirect_op);
    let nr = u32::from(ind.nr_segments);
    if nr == 0 {
        return Err(RequestError::NoSegments { op: operation });
    }
    let max = limits.indirect_limit();
    if nr > max {
        return Err(RequestError::TooManySegments { nr, max });
    }
    let nseg = nr as usize;
    let sector_number = ind.sector_number;
    let grefs = ind.indirect_grefs;
    let mut segments = Segments::heap(nseg);
    let mut next = sector_number;
    let mut page: IndirectPage = [0; XEN_PAGE_SIZE];
    let npages = nseg.div_ceil(BLKIF_SEGS_PER_INDIRECT_FRAME);
    for (pi, &gref) in grefs.iter().take(npages).enumerate() {
        pages
            .copy_page(gref, &mut page)
            .map_err(|e| RequestError::IndirectPage {
                index: pi,
                gref,
                source: Box::new(e),
            })?;
        let first = pi * BLKIF_SEGS_PER_INDIRECT_FRAME;
        let here = (nseg - first).min(BLKIF_SEGS_PER_INDIRECT_FRAME);
        let descs = page.chunks_exact(std::mem::size_of::<BlkifRequestSegment>());
        for (i, bytes) in descs.take(here).enumerate() {
            // By value: a page has no alignment guarantee for the u32 gref.
            let desc = BlkifRequestSegment::read_from_bytes(bytes).unwrap_or_default();
            segments.push(take_segment(first + i, desc, &mut next)?);
        }
    }
    finish(ind.id, operation, true, sector_number, segments, limits)
}

fn parse_discard(slot: &BlkifRequest, limits: &DiskLimits) -> Result<Request, RequestError> {
    let d = slot.as_discard();
    let secure = d.flag & BLKIF_DISCARD_SECURE != 0 && limits.discard_secure;
    let operation = Operation::Discard { secure };
    let (sector, nr_sectors) = (d.sector_number, d.nr_sectors);
    check_range(operation, sector, nr_sectors, limits)?;
    check_alignment(sector, nr_sectors, limits)?;
    Ok(Request {
        id: d.id,
        operation,
        indirect: false,
        sector,
        nr_sectors,
        segments: Segments::inline(),
    })
}

/// A block-status query: one segment, a whole page for the answer, and a
/// first sector on the disk (aligned to the logical block size).
fn parse_block_status(slot: &BlkifRequest, limits: &DiskLimits) -> Result<Request, RequestError> {
    let BlkifRequest {
        nr_segments,
        id,
        sector_number,
        ref seg,
        ..
    } = *slot;
    let operation = Operation::BlockStatus;
    match nr_segments {
        0 => return Err(RequestError::NoSegments { op: operation }),
        1 => {}
        nr => {
            return Err(RequestError::TooManySegments {
                nr: u32::from(nr),
                max: 1,
            })
        }
    }
    let desc = seg[0];
    if desc.first_sect != 0 || desc.last_sect != BLKIF_SECTORS_PER_PAGE - 1 {
        return Err(RequestError::BadSegment {
            index: 0,
            first_sect: desc.first_sect,
            last_sect: desc.last_sect,
        });
    }
    // The query starts on the disk: at least one sector is left.
    check_range(operation, sector_number, 1, limits)?;
    let bs = limits.block_sectors();
    if !sector_number.is_multiple_of(bs) {
        return Err(misaligned(sector_number, 0, bs));
    }
    let mut next = sector_number;
    let mut segments = Segments::inline();
    segments.push(take_segment(0, desc, &mut next)?);
    Ok(Request {
        id,
        operation,
        indirect: false,
        sector: sector_number,
        nr_sectors: 0,
        segments,
    })
}

/// Rows 9 and 10 for a read, write, flush or barrier whose segments are
/// already valid.
fn finish(
    id: u64,
    operation: Operation,
    indirect: bool,
    sector: u64,
    segments: Segments,
    limits: &DiskLimits,
) -> Result<Request, RequestError> {
    let nr_sectors: u64 = segments.iter().map(Segment::sectors).sum();
    // A flush or barrier without data addresses no range.
    let empty_flush = nr_sectors == 0;
    // A flush carrying data writes it (Request::changes_disk).
    let writes = operation.modifies_disk() || (!empty_flush && !operation.is_read());
    if limits.read_only && writes {
        return Err(RequestError::ReadOnly { op: operation });
    }
    if !empty_flush {
        check_range(operation, sector, nr_sectors, limits)?;
        let bs = limits.block_sectors();
        if !sector.is_multiple_of(bs) {
            return Err(misaligned(sector, nr_sectors, bs));
        }
        // Linux checks each segment's length, which also covers the total.
        if let Some(seg) = segments.iter().find(|s| !s.sectors().is_multiple_of(bs)) {
            return Err(misaligned(seg.disk_sector(), seg.sectors(), bs));
        }
    }
    Ok(Request {
        id,
        operation,
        indirect,
        sector: if empty_flush { 0 } else { sector },
        nr_sectors,
        segments,
    })
}

/// Row 9: read-only disks, overflow, end of disk.
fn check_range(
    op: Operation,
    sector: u64,
    nr_sectors: u64,
    limits: &DiskLimits,
) -> Result<(), RequestError> {
    if limits.read_only && op.modifies_disk() {
        return Err(RequestError::ReadOnly { op });
    }
    let end = sector
        .checked_add(nr_sectors)
        .ok_or(RequestError::RangeOverflow { sector, nr_sectors })?;
    if end > limits.sectors {
        return Err(RequestError::BeyondEnd {
            sector,
            nr_sectors,
            disk_sectors: limits.sectors,
        });
    }
    Ok(())
}

/// Row 10 (the block layer makes the same check for discards).
fn check_alignment(sector: u64, nr_sectors: u64, limits: &DiskLimits) -> Result<(), RequestError> {
    let bs = limits.block_sectors();
    if !sector.is_multiple_of(bs) || !nr_sectors.is_multiple_of(bs) {
        return Err(misaligned(sector, nr_sectors, bs));
    }
    Ok(())
}

fn misaligned(sector: u64, nr_sectors: u64, block_sectors: u64) -> RequestError {
    RequestError::Misaligned {
        sector,
        nr_sectors,
        block_sectors,
    }
}

/// Checks the invariants every accepted request must hold; panics if one
/// does not. Used by [`fuzz_parse`] and the property tests.
pub fn assert_request_invariants(req: &Request, limits: &DiskLimits) {
    let end = req.sector().checked_add(req.nr_sectors());
    assert!(
        end.is_some_and(|e| e <= limits.sectors),
        "request {req:?} leaves the disk"
    );
    if req.operation() == Operation::BlockStatus {
        assert!(req.sector() < limits.sectors, "query beyond the disk");
        assert_eq!(req.nr_sectors(), 0);
        assert_eq!(req.segments().len(), 1, "one answer page");
        assert_eq!(req.segments()[0].len(), XEN_PAGE_SIZE, "a whole page");
        assert!(!req.changes_disk());
        return;
    }
    let bs = limits.block_sectors();
    if req.nr_sectors() > 0 {
        assert!(req.sector().is_multiple_of(bs), "misaligned start accepted");
        assert!(
            req.nr_sectors().is_multiple_of(bs),
            "misaligned length accepted"
        );
    }
    if limits.read_only {
        assert!(
            !req.changes_disk(),
            "modification of a read-only disk accepted"
        );
    }
    let mut next = req.sector();
    let mut total = 0u64;
    for s in req.segments() {
        assert!(s.first_sect() <= s.last_sect() && s.last_sect() < BLKIF_SECTORS_PER_PAGE);
        assert!(
            s.page_offset() + s.len() <= XEN_PAGE_SIZE,
            "segment leaves its page"
        );
        assert_eq!(s.disk_sector(), next, "segments not contiguous");
        next += s.sectors();
        total += s.sectors();
    }
    match req.operation() {
        Operation::Discard { .. } => assert!(req.segments().is_empty()),
        Operation::Read | Operation::Write => {
            assert!(!req.segments().is_empty());
            assert_eq!(total, req.nr_sectors());
        }
        Operation::Flush | Operation::WriteBarrier => assert_eq!(total, req.nr_sectors()),
        Operation::BlockStatus => unreachable!("checked above"),
    }
    let max = if req.is_indirect() {
        limits.indirect_limit() as usize
    } else {
        BLKIF_MAX_SEGMENTS_PER_REQUEST
    };
    assert!(req.segments().len() <= max);
}

/// Size of the limits header [`fuzz_parse`] reads after the slot.
pub const FUZZ_LIMITS_LEN: usize = 16;

/// Fuzzing entry point: `data` is a request slot (112 bytes), a 16-byte
/// limits header (disk sectors u64 LE; log2 of the logical block size above
/// 512, mod 4; a feature byte: bit 0 read-only, 1 flush, 2 barrier,
/// 3 discard, 4 discard-secure; `max_indirect_segments` u16 LE; 4 bytes
/// unused), then indirect pages: the page for indirect gref `g` is chunk
/// `g % chunks` of the rest (missing bytes are zero; no rest means the copy
/// fails). Short inputs are zero-padded. Panics only if an accepted
/// request breaks an invariant.
pub fn fuzz_parse(data: &[u8]) {
    let slot_len = std::mem::size_of::<BlkifRequest>();
    let mut head = [0u8; 112 + FUZZ_LIMITS_LEN];
    let n = data.len().min(head.len());
    head[..n].copy_from_slice(&data[..n]);
    let rest = data.get(head.len()..).unwrap_or(&[]);
    let Ok(slot) = BlkifRequest::read_from_bytes(&head[..slot_len]) else {
        return;
    };
    let l = &head[slot_len..];
    let mut sectors = [0u8; 8];
    sectors.copy_from_slice(&l[..8]);
    let flags = l[9];
    let limits = DiskLimits {
        sectors: u64::from_le_bytes(sectors),
        logical_block_size: (BLKIF_SECTOR_SIZE as u32) << (l[8] % 4),
        read_only: flags & 1 != 0,
        flush: flags & 2 != 0,
        barrier: flags & 4 != 0,
        discard: flags & 8 != 0,
        discard_secure: flags & 16 != 0,
        max_indirect_segments: u32::from(u16::from_le_bytes([l[10], l[11]])),
        block_status: flags & 32 != 0,
    };
    let chunks = rest.len().div_ceil(XEN_PAGE_SIZE);
    let mut source = |gref: GrantRef, page: &mut IndirectPage| -> Result<(), IndirectUnavailable> {
        if chunks == 0 {
            return Err(IndirectUnavailable);
        }
        let c = gref as usize % chunks;
        let bytes = &rest[c * XEN_PAGE_SIZE..rest.len().min((c + 1) * XEN_PAGE_SIZE)];
        page.fill(0);
        page[..bytes.len()].copy_from_slice(bytes);
        Ok(())
    };
    match Request::parse(&slot, &limits, &mut source) {
        Ok(req) => assert_request_invariants(&req, &limits),
        Err(e) => {
            let rsp = error_response(&slot, &e);
            assert!(rsp.status == BLKIF_RSP_ERROR || rsp.status == BLKIF_RSP_EOPNOTSUPP);
            let _ = e.to_string();
        }
    }
}
