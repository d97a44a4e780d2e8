//! The self-describing block a verifying job writes, and the check of a
//! block read back.
//!
//! Layout (little-endian), at the start of every `bs`-byte block:
//!
//! ```text
//!  0  u64 magic "PVIOVRFY"      24  u32 job id        40  u32 CRC-32C
//!  8  u64 byte offset           28  u32 block length  44  u32 zero
//! 16  u64 write generation      32  u64 job seed      48  payload ...
//! ```
//!
//! The payload is pseudo-random, seeded from (seed, job, offset,
//! generation), and the CRC covers the whole block except its own field.
//! A block that is torn, corrupted, misdirected or stale (an older
//! generation: a lost write) fails the check.

use std::fmt;

use super::crc32c::Crc32c;
use super::rng::{mix64, SplitMix64};

/// "PVIOVRFY".
pub const MAGIC: u64 = u64::from_le_bytes(*b"PVIOVRFY");
/// Bytes of header at the start of each block.
pub const HEADER_LEN: usize = 48;
const CRC_AT: usize = 40;

/// What identifies one write of one block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub offset: u64,
    pub generation: u64,
    pub job: u32,
    pub seed: u64,
}

impl Stamp {
    fn payload_seed(&self) -> u64 {
        mix64(self.seed ^ mix64(self.offset ^ mix64(self.generation ^ (u64::from(self.job) << 40))))
    }
}

/// Fills `block` (the whole block, at least [`HEADER_LEN`] bytes) with the
/// data of this write.
pub fn write_block(block: &mut [u8], stamp: &Stamp) {
    assert!(block.len() >= HEADER_LEN && block.len() <= u32::MAX as usize);
    block[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    block[8..16].copy_from_slice(&stamp.offset.to_le_bytes());
    block[16..24].copy_from_slice(&stamp.generation.to_le_bytes());
    block[24..28].copy_from_slice(&stamp.job.to_le_bytes());
    let len = block.len() as u32;
    block[28..32].copy_from_slice(&len.to_le_bytes());
    block[32..40].copy_from_slice(&stamp.seed.to_le_bytes());
    block[44..48].fill(0);
    SplitMix64::new(stamp.payload_seed()).fill(&mut block[HEADER_LEN..]);
    let crc = block_crc(block);
    block[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
}

fn block_crc(block: &[u8]) -> u32 {
    let mut c = Crc32c::new();
    c.update(&block[..CRC_AT]);
    c.update(&block[CRC_AT + 4..]);
    c.finish()
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

/// How a block read back differs from the write it should hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch {
    /// No verify header: never written by a verifying job, or overwritten.
    NoHeader { magic: u64 },
    /// The header is for a block of another size.
    WrongLength { found: u32 },
    /// The data does not match its checksum: corrupted or torn.
    Corrupt { stored: u32, computed: u32 },
    /// A valid block, but for another offset: a misdirected write or read.
    WrongOffset { found: u64 },
    /// A valid block written by another job.
    WrongJob { found: u32 },
    /// A valid block from an older write: the acknowledged write was lost.
    Stale { found: u64, expected: u64 },
    /// A valid block from a newer write than the last acknowledged one.
    Newer { found: u64, expected: u64 },
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoHeader { magic } => write!(f, "no verify header (magic {magic:#018x})"),
            Self::WrongLength { found } => write!(f, "header is for a {found}-byte block"),
            Self::Corrupt { stored, computed } => write!(
                f,
                "corrupt data: CRC-32C {computed:#010x}, header says {stored:#010x}"
            ),
            Self::WrongOffset { found } => write!(f, "block belongs at offset {found}"),
            Self::WrongJob { found } => write!(f, "block was written by job {found}"),
            Self::Stale { found, expected } => write!(
                f,
                "lost write: generation {found} found, {expected} was acknowledged"
            ),
            Self::Newer { found, expected } => write!(
                f,
                "generation {found} found, newer than the acknowledged {expected}"
            ),
        }
    }
}

/// Checks that `block` holds exactly the write `expect` describes.
pub fn check_block(block: &[u8], expect: &Stamp) -> Result<(), Mismatch> {
    if block.len() < HEADER_LEN {
        return Err(Mismatch::WrongLength {
            found: block.len() as u32,
        });
    }
    let magic = u64_at(block, 0);
    if magic != MAGIC {
        return Err(Mismatch::NoHeader { magic });
    }
    let len = u32_at(block, 28);
    if len as usize != block.len() {
        return Err(Mismatch::WrongLength { found: len });
    }
    let stored = u32_at(block, CRC_AT);
    let computed = block_crc(block);
    if stored != computed {
        return Err(Mismatch::Corrupt { stored, computed });
    }
    let offset = u64_at(block, 8);
    if offset != expect.offset {
        return Err(Mismatch::WrongOffset { found: offset });
    }
    let job = u32_at(block, 24);
    if job != expect.job {
        return Err(Mismatch::WrongJob { found: job });
    }
    let generation = u64_at(block, 16);
    match generation.cmp(&expect.generation) {
        std::cmp::Ordering::Less => Err(Mismatch::Stale {
            found: generation,
            expected: expect.generation,
        }),
        std::cmp::Ordering::Greater => Err(Mismatch::Newer {
            found: generation,
            expected: expect.generation,
        }),
        std::cmp::Ordering::Equal => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(generation: u64) -> Stamp {
        Stamp {
            offset: 8192,
            generation,
            job: 3,
            seed: 42,
        }
    }

    #[test]
    fn a_written_block_checks_and_payload_depends_on_the_stamp() {
        let mut a = vec![0u8; 4096];
        write_block(&mut a, &stamp(5));
        assert_eq!(check_block(&a, &stamp(5)), Ok(()));
        let mut b = vec![0u8; 4096];
        write_block(&mut b, &stamp(6));
        assert_ne!(a[HEADER_LEN..], b[HEADER_LEN..]);
        assert!(a[HEADER_LEN..].iter().any(|&x| x != 0));
    }

    #[test]
    fn every_kind_of_damage_is_caught() {
        let mut good = vec![0u8; 512];
        write_block(&mut good, &stamp(5));
        let e = stamp(5);
        assert_eq!(
            check_block(&vec![0u8; 512], &e),
            Err(Mismatch::NoHeader { magic: 0 })
        );
        for i in [9, 17, 47, 48, 300, 511] {
            let mut b = good.clone();
            b[i] ^= 0x40;
            assert!(
                matches!(check_block(&b, &e), Err(Mismatch::Corrupt { .. })),
                "flip at {i}"
            );
        }
        assert_eq!(
            check_block(&good, &stamp(7)),
            Err(Mismatch::Stale {
                found: 5,
                expected: 7
            })
        );
        assert_eq!(
            check_block(&good, &stamp(4)),
            Err(Mismatch::Newer {
                found: 5,
                expected: 4
            })
        );
        let other = Stamp { offset: 0, ..e };
        assert_eq!(
            check_block(&good, &other),
            Err(Mismatch::WrongOffset { found: 8192 })
        );
        let other = Stamp { job: 1, ..e };
        assert_eq!(
            check_block(&good, &other),
            Err(Mismatch::WrongJob { found: 3 })
        );
        let mut big = vec![0u8; 1024];
        big[..512].copy_from_slice(&good);
        assert_eq!(
            check_block(&big, &e),
            Err(Mismatch::WrongLength { found: 512 })
        );
    }
}
