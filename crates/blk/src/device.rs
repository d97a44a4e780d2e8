//! A virtual disk as a guest workload sees it: I/O buffers that the device
//! can reach (for blkfront, granted pages of guest memory) and asynchronous
//! requests completed by tag, so one thread can keep many requests in flight.
//!
//! Implementations: blkfront (a disk served by a backend over a ring) and
//! [`MemDevice`] (an in-memory disk for tests).

use std::time::Duration;

/// What a device offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskInfo {
    /// Size in sectors of `sector_size` bytes.
    pub sectors: u64,
    /// Logical sector size in bytes (512 unless negotiated otherwise).
    pub sector_size: u32,
    /// Writes and discards are refused.
    pub read_only: bool,
    /// Flush is supported.
    pub flush: bool,
    /// Discard is supported.
    pub discard: bool,
    /// Largest single request in bytes.
    pub max_request_bytes: u32,
    /// Block status is answered ([`DeviceOp::BlockStatus`]).
    pub block_status: bool,
}

impl DiskInfo {
    /// Size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.sectors * u64::from(self.sector_size)
    }
}

/// A request's operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceOp {
    Read,
    Write,
    /// Make every completed write durable.
    Flush,
    /// Drop the contents of a range (reads of it return zeroes).
    Discard,
    /// Say what the range holds (holes, zeroes, data): the answer lands in
    /// the buffer, which must hold at least one page, in blkif's
    /// `BlkifBlockStatus` layout (read it with [`parse_block_status`]). It
    /// may describe less than the range; the completion's length is the
    /// range's.
    BlockStatus,
}

/// What a range of a disk holds: one extent of a
/// [`DeviceOp::BlockStatus`] answer, and of an image's
/// [`Image::block_status`](crate::image::Image::block_status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusExtent {
    /// Length in bytes.
    pub len: u64,
    /// Not allocated in the image.
    pub hole: bool,
    /// Reads as zeroes.
    pub zero: bool,
}

impl StatusExtent {
    /// Allocated, contents unknown.
    pub fn data(len: u64) -> Self {
        Self {
            len,
            hole: false,
            zero: false,
        }
    }

    /// Not allocated; reads as zeroes.
    pub fn hole(len: u64) -> Self {
        Self {
            len,
            hole: true,
            zero: true,
        }
    }
}

/// Bytes of a block-status answer: one page, at the start of the buffer.
pub const BLOCK_STATUS_ANSWER_BYTES: usize = 4096;

/// Reads a block-status answer (blkif's `BlkifBlockStatus` entries, as
/// the backend wrote them into the first [`BLOCK_STATUS_ANSWER_BYTES`] of
/// `answer`): the extents, clipped so that they cover at most `len` bytes,
/// ending at the first empty entry.
pub fn parse_block_status(answer: &[u8], len: u64) -> Vec<StatusExtent> {
    let answer = &answer[..answer.len().min(BLOCK_STATUS_ANSWER_BYTES)];
    use pvio_abi::blkif::{BlkifBlockStatus, BLKIF_BLOCK_STATUS_HOLE, BLKIF_BLOCK_STATUS_ZERO};
    use zerocopy::FromBytes;
    let mut out = Vec::new();
    let mut left = len;
    for raw in answer.chunks_exact(std::mem::size_of::<BlkifBlockStatus>()) {
        let Ok(e) = BlkifBlockStatus::read_from_bytes(raw) else {
            break;
        };
        let bytes = e.nr_sectors.saturating_mul(512).min(left);
        if bytes == 0 {
            break;
        }
        out.push(StatusExtent {
            len: bytes,
            hole: e.flags & BLKIF_BLOCK_STATUS_HOLE != 0,
            zero: e.flags & BLKIF_BLOCK_STATUS_ZERO != 0,
        });
        left -= bytes;
    }
    out
}

/// Writes a block-status answer of `extents` into `answer` (the layout
/// [`parse_block_status`] reads; at most as many as fit in
/// [`BLOCK_STATUS_ANSWER_BYTES`]).
pub fn write_block_status(answer: &mut [u8], extents: &[StatusExtent]) {
    let end = answer.len().min(BLOCK_STATUS_ANSWER_BYTES);
    let answer = &mut answer[..end];
    use pvio_abi::blkif::{BlkifBlockStatus, BLKIF_BLOCK_STATUS_HOLE, BLKIF_BLOCK_STATUS_ZERO};
    use zerocopy::IntoBytes;
    let size = std::mem::size_of::<BlkifBlockStatus>();
    let mut slots = answer.chunks_exact_mut(size);
    for x in extents {
        let Some(slot) = slots.next() else { return };
        let mut flags = 0;
        if x.hole {
            flags |= BLKIF_BLOCK_STATUS_HOLE;
        }
        if x.zero {
            flags |= BLKIF_BLOCK_STATUS_ZERO;
        }
        let e = BlkifBlockStatus {
            nr_sectors: x.len >> 9,
            flags,
            _pad: 0,
        };
        slot.copy_from_slice(e.as_bytes());
    }
    if let Some(end) = slots.next() {
        end.fill(0);
    }
}

/// One request. `offset` and `len` are in bytes and must be multiples of the
/// sector size; `buf` names one of the device's buffers (ignored by flush and
/// discard).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceRequest {
    pub op: DeviceOp,
    pub offset: u64,
    pub len: u32,
    pub buf: usize,
    /// Returned with the completion.
    pub tag: u64,
}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// The request is malformed (alignment, range, buffer index).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The device does not support the operation.
    #[error("operation not supported")]
    NotSupported,
    /// The device is read-only.
    #[error("the device is read-only")]
    ReadOnly,
    /// No room for another request right now; reap completions first.
    #[error("the device queue is full")]
    Busy,
    /// The backend reported an I/O error.
    #[error("I/O error")]
    Io,
    /// The device is disconnected.
    #[error("device disconnected: {0}")]
    Disconnected(String),
}

/// A finished request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceCompletion {
    pub tag: u64,
    /// The request's length in bytes for a read, write or discard (every
    /// completed request moved all of its bytes), 0 for a flush; or the
    /// failure.
    pub result: Result<u32, DeviceError>,
}

/// A block device with asynchronous requests.
///
/// The caller must not read or write a buffer while a request that uses it
/// is in flight.
pub trait BlockDevice: Send {
    /// Size and features.
    fn info(&self) -> DiskInfo;
    /// Number of I/O buffers.
    fn buffer_count(&self) -> usize;
    /// Size of each buffer in bytes (at least `max_request_bytes`).
    fn buffer_size(&self) -> usize;
    /// Reads a buffer.
    fn buffer(&self, idx: usize) -> &[u8];
    /// Writes a buffer.
    fn buffer_mut(&mut self, idx: usize) -> &mut [u8];
    /// Queues a request; it may not reach the backend before
    /// [`BlockDevice::kick`].
    fn submit(&mut self, req: DeviceRequest) -> Result<(), DeviceError>;
    /// Sends queued requests to the backend.
    fn kick(&mut self) -> Result<(), DeviceError>;
    /// Appends completions that are ready, without blocking.
    fn poll(&mut self, out: &mut Vec<DeviceCompletion>) -> Result<usize, DeviceError>;
    /// Appends completions, waiting up to `timeout` (`None`: forever) for at
    /// least one if none is ready.
    fn wait(
        &mut self,
        out: &mut Vec<DeviceCompletion>,
        timeout: Option<Duration>,
    ) -> Result<usize, DeviceError>;
}

/// Checks a request against a device's geometry and buffers; the common
/// validation every implementation applies before queueing.
pub fn check_request(
    info: &DiskInfo,
    buffers: (usize, usize),
    req: &DeviceRequest,
) -> Result<(), DeviceError> {
    let ss = u64::from(info.sector_size);
    if req.op == DeviceOp::Flush {
        return if info.flush {
            Ok(())
        } else {
            Err(DeviceError::NotSupported)
        };
    }
    if req.op == DeviceOp::Discard && !info.discard {
        return Err(DeviceError::NotSupported);
    }
    if req.op == DeviceOp::BlockStatus && !info.block_status {
        return Err(DeviceError::NotSupported);
    }
    if info.read_only && matches!(req.op, DeviceOp::Write | DeviceOp::Discard) {
        return Err(DeviceError::ReadOnly);
    }
    if req.len == 0 || !req.offset.is_multiple_of(ss) || !u64::from(req.len).is_multiple_of(ss) {
        return Err(DeviceError::Invalid(format!(
            "offset {} and length {} must be non-zero multiples of {ss}",
            req.offset, req.len
        )));
    }
    let end = req.offset.checked_add(u64::from(req.len));
    if end.is_none_or(|e| e > info.size_bytes()) {
        return Err(DeviceError::Invalid(format!(
            "range {}+{} is beyond the disk's {} bytes",
            req.offset,
            req.len,
            info.size_bytes()
        )));
    }
    if req.op == DeviceOp::BlockStatus
        && (req.buf >= buffers.0 || buffers.1 < BLOCK_STATUS_ANSWER_BYTES)
    {
        return Err(DeviceError::Invalid(format!(
            "block status needs a buffer of a page; there is no buffer {} of {} bytes",
            req.buf, buffers.1
        )));
    }
    if matches!(req.op, DeviceOp::Read | DeviceOp::Write) {
        if req.buf >= buffers.0 {
            return Err(DeviceError::Invalid(format!("no buffer {}", req.buf)));
        }
        if req.len as usize > buffers.1 || req.len > info.max_request_bytes {
            return Err(DeviceError::Invalid(format!(
                "length {} is over the limit of {} bytes",
                req.len,
                (buffers.1 as u32).min(info.max_request_bytes)
            )));
        }
    }
    Ok(())
}

/// An in-memory disk that completes every request at submit time.
#[derive(Debug)]
pub struct MemDevice {
    info: DiskInfo,
    data: Vec<u8>,
    bufs: Vec<Vec<u8>>,
    done: Vec<DeviceCompletion>,
}

impl MemDevice {
    /// A zeroed disk of `bytes` bytes (rounded down to whole sectors) with
    /// `buffers` buffers of `buf_size` bytes.
    pub fn new(bytes: u64, buffers: usize, buf_size: usize) -> Self {
        let info = DiskInfo {
            sectors: bytes / 512,
            sector_size: 512,
            read_only: false,
            flush: true,
            discard: true,
            max_request_bytes: buf_size as u32,
            block_status: true,
        };
        Self {
            data: vec![0; (info.sectors * 512) as usize],
            info,
            bufs: vec![vec![0; buf_size]; buffers],
            done: Vec::new(),
        }
    }

    /// The disk's bytes.
    pub fn contents(&self) -> &[u8] {
        &self.data
    }
}

impl BlockDevice for MemDevice {
    fn info(&self) -> DiskInfo {
        self.info
    }
    fn buffer_count(&self) -> usize {
        self.bufs.len()
    }
    fn buffer_size(&self) -> usize {
        self.bufs.first().map_or(0, |b| b.len())
    }
    fn buffer(&self, idx: usize) -> &[u8] {
        &self.bufs[idx]
    }
    fn buffer_mut(&mut self, idx: usize) -> &mut [u8] {
        &mut self.bufs[idx]
    }
    fn submit(&mut self, req: DeviceRequest) -> Result<(), DeviceError> {
        check_request(&self.info, (self.buffer_count(), self.buffer_size()), &req)?;
        let (o, n) = (req.offset as usize, req.len as usize);
        match req.op {
            DeviceOp::Read => self.bufs[req.buf][..n].copy_from_slice(&self.data[o..o + n]),
            DeviceOp::Write => self.data[o..o + n].copy_from_slice(&self.bufs[req.buf][..n]),
            DeviceOp::Discard => self.data[o..o + n].fill(0),
            DeviceOp::Flush => {}
            DeviceOp::BlockStatus => {
                // Memory is always allocated; say which sectors are zero.
                let mut extents: Vec<StatusExtent> = Vec::new();
                for sector in self.data[o..o + n].chunks(512) {
                    let zero = sector.iter().all(|&b| b == 0);
                    match extents.last_mut() {
                        Some(e) if e.zero == zero => e.len += 512,
                        _ => extents.push(StatusExtent {
                            len: 512,
                            hole: false,
                            zero,
                        }),
                    }
                }
                write_block_status(&mut self.bufs[req.buf], &extents);
            }
        }
        let len = if req.op == DeviceOp::Flush {
            0
        } else {
            req.len
        };
        self.done.push(DeviceCompletion {
            tag: req.tag,
            result: Ok(len),
        });
        Ok(())
    }
    fn kick(&mut self) -> Result<(), DeviceError> {
        Ok(())
    }
    fn poll(&mut self, out: &mut Vec<DeviceCompletion>) -> Result<usize, DeviceError> {
        let n = self.done.len();
        out.append(&mut self.done);
        Ok(n)
    }
    fn wait(
        &mut self,
        out: &mut Vec<DeviceCompletion>,
        _timeout: Option<Duration>,
    ) -> Result<usize, DeviceError> {
        self.poll(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_status_answers_fill_one_page_and_are_read_back_clipped() {
        // A full page of 256 entries, then bytes of an older use of the
        // buffer that must not be read as more entries.
        let mut buf = vec![0xffu8; 3 * BLOCK_STATUS_ANSWER_BYTES];
        let many: Vec<StatusExtent> = (0..300)
            .map(|i| {
                if i % 2 == 0 {
                    StatusExtent::hole(512)
                } else {
                    StatusExtent::data(1024)
                }
            })
            .collect();
        write_block_status(&mut buf, &many);
        let back = parse_block_status(&buf, u64::MAX);
        assert_eq!(back, many[..256]);
        assert!(buf[BLOCK_STATUS_ANSWER_BYTES..].iter().all(|&b| b == 0xff));
        // Fewer entries end with an empty one; the length clips the last.
        write_block_status(&mut buf, &many[..3]);
        assert_eq!(parse_block_status(&buf, u64::MAX), many[..3]);
        assert_eq!(
            parse_block_status(&buf, 1024),
            [StatusExtent::hole(512), StatusExtent::data(512)]
        );
        assert!(parse_block_status(&buf, 0).is_empty());
    }

    #[test]
    fn mem_device_round_trip_and_checks() {
        let mut d = MemDevice::new(1 << 20, 2, 8192);
        d.buffer_mut(0)[..4].copy_from_slice(b"abcd");
        let w = DeviceRequest {
            op: DeviceOp::Write,
            offset: 4096,
            len: 512,
            buf: 0,
            tag: 1,
        };
        d.submit(w).unwrap();
        let r = DeviceRequest {
            op: DeviceOp::Read,
            offset: 4096,
            len: 512,
            buf: 1,
            tag: 2,
        };
        d.submit(r).unwrap();
        let mut out = Vec::new();
        assert_eq!(d.poll(&mut out).unwrap(), 2);
        assert_eq!(&d.buffer(1)[..4], b"abcd");
        let bad = |op, offset, len, buf| DeviceRequest {
            op,
            offset,
            len,
            buf,
            tag: 0,
        };
        assert!(d.submit(bad(DeviceOp::Read, 1, 512, 0)).is_err());
        assert!(d.submit(bad(DeviceOp::Read, 0, 0, 0)).is_err());
        assert!(d.submit(bad(DeviceOp::Read, 1 << 20, 512, 0)).is_err());
        assert!(d
            .submit(bad(DeviceOp::Read, u64::MAX - 511, 512, 0))
            .is_err());
        assert!(d.submit(bad(DeviceOp::Read, 0, 16384, 0)).is_err());
        assert!(d.submit(bad(DeviceOp::Read, 0, 512, 2)).is_err());
        d.submit(bad(DeviceOp::Discard, 4096, 512, 0)).unwrap();
        assert_eq!(&d.contents()[4096..4100], &[0, 0, 0, 0]);
    }
}
