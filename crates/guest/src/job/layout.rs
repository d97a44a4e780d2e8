//! Where on the device a job does its I/O: the block size and the range of
//! `bs`-sized blocks, checked against the device's geometry and buffers.
//!
//! Blocks are `offset + k * bs`. Without verification every job of a run
//! uses the whole range (as fio's jobs share a file); with verification the
//! range is split into one slice per job, so that no job overwrites
//! another's blocks.

use pvio_blk::device::DiskInfo;

use super::acks::MAX_BLOCKS;
use super::spec::{JobSpec, Verify};

/// A job's blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Byte offset of block 0.
    pub base: u64,
    /// Block size in bytes.
    pub bs: u32,
    /// Number of blocks.
    pub blocks: u64,
}

impl Layout {
    /// Job `job`'s blocks on a device with `info` and buffers of
    /// `buffer_size` bytes; the error says what does not fit.
    pub fn for_job(
        spec: &JobSpec,
        job: u32,
        info: &DiskInfo,
        buffer_size: usize,
    ) -> Result<Self, String> {
        let sector = u64::from(info.sector_size.max(1));
        let size = info.size_bytes();
        let bs = spec.bs.0;
        if !bs.is_multiple_of(sector) {
            return Err(format!(
                "bs {bs} is not a multiple of the {sector}-byte sector"
            ));
        }
        let max = u64::from(info.max_request_bytes).min(buffer_size as u64);
        if bs > max {
            return Err(format!(
                "bs {bs} is over the device's largest request of {max} bytes"
            ));
        }
        let offset = spec.offset.0;
        if !offset.is_multiple_of(sector) {
            return Err(format!(
                "offset {offset} is not a multiple of the {sector}-byte sector"
            ));
        }
        if offset >= size {
            return Err(format!(
                "offset {offset} is beyond the device's {size} bytes"
            ));
        }
        let range = spec.range.map_or(size - offset, |r| r.0);
        if offset.checked_add(range).is_none_or(|end| end > size) {
            return Err(format!(
                "offset {offset} + range {range} is beyond the device's {size} bytes"
            ));
        }
        let total = range / bs;
        if total == 0 {
            return Err(format!(
                "the range of {range} bytes holds no {bs}-byte block"
            ));
        }
        let (base, blocks) = if spec.verify != Verify::None && spec.numjobs > 1 {
            let per = total / u64::from(spec.numjobs);
            if per == 0 {
                return Err(format!(
                    "{total} blocks cannot be shared among {} verifying jobs",
                    spec.numjobs
                ));
            }
            (offset + u64::from(job) * per * bs, per)
        } else {
            (offset, total)
        };
        if spec.verify != Verify::None && blocks > MAX_BLOCKS {
            return Err(format!(
                "verifying {blocks} blocks is over the limit of {MAX_BLOCKS}: use a larger bs or a smaller range"
            ));
        }
        Ok(Self {
            base,
            bs: bs as u32,
            blocks,
        })
    }

    /// Byte offset of a block.
    pub fn offset_of(&self, block: u64) -> u64 {
        self.base + block * u64::from(self.bs)
    }

    /// Bytes covered.
    pub fn bytes(&self) -> u64 {
        self.blocks * u64::from(self.bs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(bytes: u64, max: u32) -> DiskInfo {
        DiskInfo {
            sectors: bytes / 512,
            sector_size: 512,
            read_only: false,
            flush: true,
            discard: false,
            max_request_bytes: max,
            block_status: false,
        }
    }

    #[test]
    fn whole_device_by_default_and_slices_when_verifying() {
        let spec = JobSpec::parse("bs=4k").unwrap();
        let l = Layout::for_job(&spec, 0, &info(1 << 20, 65536), 65536).unwrap();
        assert_eq!(
            l,
            Layout {
                base: 0,
                bs: 4096,
                blocks: 256
            }
        );
        let spec =
            JobSpec::parse("rw=randwrite,bs=4k,offset=64k,range=512k,numjobs=3,verify=crc32c")
                .unwrap();
        let l: Vec<_> = (0..3)
            .map(|j| Layout::for_job(&spec, j, &info(1 << 20, 65536), 65536).unwrap())
            .collect();
        assert_eq!(
            l[0],
            Layout {
                base: 65536,
                bs: 4096,
                blocks: 42
            }
        );
        assert_eq!(l[2].base, 65536 + 2 * 42 * 4096);
        assert!(l[2].base + l[2].bytes() <= 65536 + 512 * 1024);
    }

    #[test]
    fn refuses_what_does_not_fit() {
        let dev = info(1 << 20, 65536);
        let err = |s: &str, buf: usize| {
            Layout::for_job(&JobSpec::parse(s).unwrap(), 0, &dev, buf).unwrap_err()
        };
        assert!(err("bs=1536,offset=0", 512).contains("largest request"));
        assert!(err("bs=128k", 1 << 20).contains("largest request"));
        assert!(err("bs=4k,offset=1m", 65536).contains("beyond"));
        assert!(err("bs=4k,offset=4k,range=1m", 65536).contains("beyond"));
        assert!(err("bs=4k,offset=1000", 65536).contains("sector"));
        assert!(err("rw=write,bs=64k,numjobs=32,verify=crc32c", 65536).contains("shared"));
        let odd = DiskInfo {
            sector_size: 4096,
            ..dev
        };
        assert!(
            Layout::for_job(&JobSpec::parse("bs=512").unwrap(), 0, &odd, 65536)
                .unwrap_err()
                .contains("multiple")
        );
    }
}
