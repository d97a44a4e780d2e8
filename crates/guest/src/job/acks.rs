//! The map of acknowledged writes: for each block of a verifying job's
//! range, the generation of the last write the device acknowledged. Reads
//! are checked against it, and it can be saved to a small file so that
//! another process (after a backend restart, say) can check that no
//! acknowledged write was lost.
//!
//! File format (little-endian): `"PVIOACK1"`, job u32, block size u32, base
//! offset u64, blocks u64, seed u64, next generation u64, entry count u64,
//! then per written block (block index u64, generation u64; `u64::MAX`
//! marks a block whose last write failed, so its contents are unknown),
//! then a CRC-32C of everything before it.

use std::io::Write;
use std::path::Path;

use super::crc32c::crc32c;
use super::error::AckMapError;
use super::pattern::Stamp;

const FILE_MAGIC: &[u8; 8] = b"PVIOACK1";
const HEADER_LEN: usize = 8 + 4 + 4 + 8 + 8 + 8 + 8 + 8;
const INDETERMINATE: u64 = u64::MAX;
/// Largest range a map covers (one u64 per block in memory).
pub const MAX_BLOCKS: u64 = 1 << 25;

/// What is known about one block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    /// This job never wrote it.
    Unwritten,
    /// The last acknowledged write has this generation.
    Acked(u64),
    /// The last write failed: the contents are unknown until rewritten.
    Indeterminate,
}

/// Acknowledged write generations of one job's blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckMap {
    job: u32,
    bs: u32,
    base: u64,
    seed: u64,
    next_gen: u64,
    gens: Vec<u64>,
}

impl AckMap {
    /// An empty map of `blocks` blocks of `bs` bytes from `base` (at most
    /// [`MAX_BLOCKS`]).
    pub fn new(job: u32, bs: u32, base: u64, blocks: u64, seed: u64) -> Self {
        assert!(
            blocks <= MAX_BLOCKS,
            "{blocks} blocks is over the map limit"
        );
        Self {
            job,
            bs,
            base,
            seed,
            next_gen: 1,
            gens: vec![0; blocks as usize],
        }
    }

    pub fn job(&self) -> u32 {
        self.job
    }
    pub fn block_size(&self) -> u32 {
        self.bs
    }
    /// Byte offset of block 0.
    pub fn base_offset(&self) -> u64 {
        self.base
    }
    pub fn blocks(&self) -> u64 {
        self.gens.len() as u64
    }
    pub fn seed(&self) -> u64 {
        self.seed
    }
    /// Byte offset of a block.
    pub fn offset_of(&self, block: u64) -> u64 {
        self.base + block * u64::from(self.bs)
    }

    pub fn state(&self, block: u64) -> BlockState {
        match self.gens[block as usize] {
            0 => BlockState::Unwritten,
            INDETERMINATE => BlockState::Indeterminate,
            g => BlockState::Acked(g),
        }
    }

    /// Blocks with an acknowledged write, in order: (block, generation).
    pub fn acked(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.gens
            .iter()
            .enumerate()
            .filter(|(_, &g)| g != 0 && g != INDETERMINATE)
            .map(|(b, &g)| (b as u64, g))
    }

    pub fn acked_count(&self) -> u64 {
        self.acked().count() as u64
    }

    pub fn indeterminate_count(&self) -> u64 {
        self.gens.iter().filter(|&&g| g == INDETERMINATE).count() as u64
    }

    /// The stamp block `block` carries after write `generation`.
    pub fn stamp(&self, block: u64, generation: u64) -> Stamp {
        Stamp {
            offset: self.offset_of(block),
            generation,
            job: self.job,
            seed: self.seed,
        }
    }

    /// A fresh generation for the next write.
    pub(crate) fn next_generation(&mut self) -> u64 {
        let g = self.next_gen;
        self.next_gen += 1;
        g
    }

    /// Records that the device acknowledged write `generation` of `block`.
    pub(crate) fn ack(&mut self, block: u64, generation: u64) {
        self.gens[block as usize] = generation;
    }

    /// Records that a write of `block` failed.
    pub(crate) fn mark_failed(&mut self, block: u64) {
        self.gens[block as usize] = INDETERMINATE;
    }

    /// The file form.
    pub fn to_bytes(&self) -> Vec<u8> {
        let entries: Vec<(u64, u64)> = self
            .gens
            .iter()
            .enumerate()
            .filter(|(_, &g)| g != 0)
            .map(|(b, &g)| (b as u64, g))
            .collect();
        let mut out = Vec::with_capacity(HEADER_LEN + entries.len() * 16 + 4);
        out.extend_from_slice(FILE_MAGIC);
        out.extend_from_slice(&self.job.to_le_bytes());
        out.extend_from_slice(&self.bs.to_le_bytes());
        for v in [
            self.base,
            self.blocks(),
            self.seed,
            self.next_gen,
            entries.len() as u64,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for (b, g) in entries {
            out.extend_from_slice(&b.to_le_bytes());
            out.extend_from_slice(&g.to_le_bytes());
        }
        let crc = crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Parses the file form, checking everything.
    pub fn from_bytes(data: &[u8]) -> Result<Self, AckMapError> {
        let bad = |m: &str| Err(AckMapError::Format(m.to_string()));
        if data.len() < HEADER_LEN + 4 || &data[..8] != FILE_MAGIC {
            return bad("no PVIOACK1 header");
        }
        let (body, crc) = data.split_at(data.len() - 4);
        if crc32c(body).to_le_bytes() != crc {
            return bad("checksum mismatch");
        }
        let mut at = 8;
        let job = read_u32(body, &mut at);
        let bs = read_u32(body, &mut at);
        let base = read_u64(body, &mut at);
        let blocks = read_u64(body, &mut at);
        let seed = read_u64(body, &mut at);
        let next_gen = read_u64(body, &mut at);
        let count = read_u64(body, &mut at);
        if blocks > MAX_BLOCKS || count > blocks || bs < 512 {
            return bad("implausible geometry");
        }
        if (body.len() - HEADER_LEN) as u64 != count * 16 {
            return bad("length does not match the entry count");
        }
        let mut map = Self::new(job, bs, base, blocks, seed);
        map.next_gen = next_gen;
        for _ in 0..count {
            let (b, g) = (read_u64(body, &mut at), read_u64(body, &mut at));
            if b >= blocks || g == 0 || (g >= next_gen && g != INDETERMINATE) {
                return bad("entry out of range");
            }
            map.gens[b as usize] = g;
        }
        Ok(map)
    }

    /// Writes the map to `path` atomically (temporary file, fsync, rename).
    pub fn save(&self, path: &Path) -> Result<(), AckMapError> {
        let io = |source| AckMapError::Io {
            path: path.display().to_string(),
            source,
        };
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(&self.to_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Reads a map saved by [`AckMap::save`].
    pub fn load(path: &Path) -> Result<Self, AckMapError> {
        let data = std::fs::read(path).map_err(|source| AckMapError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_bytes(&data)
    }
}

fn read_u32(b: &[u8], at: &mut usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[*at..*at + 4]);
    *at += 4;
    u32::from_le_bytes(a)
}

fn read_u64(b: &[u8], at: &mut usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[*at..*at + 8]);
    *at += 8;
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> AckMap {
        let mut m = AckMap::new(2, 4096, 1 << 20, 100, 77);
        for b in [3, 50, 99] {
            let g = m.next_generation();
            m.ack(b, g);
        }
        let g = m.next_generation();
        m.ack(50, g);
        m.mark_failed(7);
        m
    }

    #[test]
    fn tracks_the_last_acknowledged_generation() {
        let m = sample();
        assert_eq!(m.state(3), BlockState::Acked(1));
        assert_eq!(m.state(50), BlockState::Acked(4));
        assert_eq!(m.state(7), BlockState::Indeterminate);
        assert_eq!(m.state(8), BlockState::Unwritten);
        assert_eq!(
            m.acked().collect::<Vec<_>>(),
            vec![(3, 1), (50, 4), (99, 3)]
        );
        assert_eq!((m.acked_count(), m.indeterminate_count()), (3, 1));
        assert_eq!(m.stamp(3, 1).offset, (1 << 20) + 3 * 4096);
    }

    #[test]
    fn file_round_trip_and_damage_is_refused() {
        let m = sample();
        let dir = std::env::temp_dir().join(format!("pvio-acks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("map");
        m.save(&path).unwrap();
        assert_eq!(AckMap::load(&path).unwrap(), m);
        std::fs::remove_dir_all(&dir).unwrap();

        let bytes = m.to_bytes();
        for i in [0, 9, HEADER_LEN + 3, bytes.len() - 1] {
            let mut b = bytes.clone();
            b[i] ^= 1;
            assert!(AckMap::from_bytes(&b).is_err(), "flip at {i} accepted");
        }
        assert!(AckMap::from_bytes(&bytes[..bytes.len() - 16]).is_err());
        assert!(AckMap::from_bytes(b"").is_err());
        assert!(AckMap::load(Path::new("/nonexistent/pvio/map")).is_err());
    }
}
