//! Grant tables (v1) in shared memory.
//!
//! A domain's grant table is a sealed memfd of up to `max_grant_frames`
//! 4 KiB frames, each holding 512 [`GrantEntryV1`]s. The granting domain
//! writes entries in its own table ([`GrantTable`]); hvd validates and pins
//! them when a peer maps a grant, setting `GTF_reading`/`GTF_writing` so the
//! granter cannot revoke a grant that is in use.
//!
//! Each 8-byte entry is read and updated as one `AtomicU64` (flags in bits
//! 0–15, domid in 16–31, frame in 32–63, i.e. the little-endian layout of
//! `struct grant_entry_v1`), so a granter changing an entry while hvd pins it
//! is detected by the compare-exchange, as Xen's `cmpxchg` on the entry does.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use pvio_abi::grant_table::{
    GrantEntryV1, GrantRef, GNTTAB_NR_RESERVED_ENTRIES, GRANT_ENTRIES_PER_FRAME_V1,
    GRANT_ENTRY_V1_SIZE, GTF_PERMIT_ACCESS, GTF_READING, GTF_READONLY, GTF_WRITING,
};
use pvio_abi::{DomId, XEN_PAGE_SIZE};

use crate::error::HvError;
use crate::memory::{Gfn, Mapping};

/// Packs an entry into the `u64` that its 8 bytes hold (little-endian).
pub fn pack(e: GrantEntryV1) -> u64 {
    u64::from(e.flags) | (u64::from(e.domid) << 16) | (u64::from(e.frame) << 32)
}

/// Unpacks the `u64` of an entry.
pub fn unpack(v: u64) -> GrantEntryV1 {
    GrantEntryV1 {
        flags: v as u16,
        domid: (v >> 16) as u16,
        frame: (v >> 32) as u32,
    }
}

/// A mapped grant table: raw atomic access to its entries.
#[derive(Debug)]
pub struct GrantTableMem {
    map: Mapping,
    nr_refs: u32,
}

impl GrantTableMem {
    /// Maps a grant-table memfd of `frames` frames.
    pub fn from_fd(fd: &OwnedFd, frames: u32) -> Result<Self, HvError> {
        let map = Mapping::map_shared(fd, 0, frames as usize * XEN_PAGE_SIZE)?;
        Ok(Self {
            map,
            nr_refs: frames * GRANT_ENTRIES_PER_FRAME_V1 as u32,
        })
    }

    /// Number of grant references the table holds.
    pub fn nr_refs(&self) -> u32 {
        self.nr_refs
    }

    fn slot(&self, gref: GrantRef) -> Option<&AtomicU64> {
        if gref >= self.nr_refs {
            return None;
        }
        let off = gref as usize * GRANT_ENTRY_V1_SIZE;
        // SAFETY: `off + 8 <= len` because gref < nr_refs; the mapping is
        // page-aligned so `off` is 8-byte aligned; the memory stays mapped
        // for `&self`'s lifetime; AtomicU64 has no invalid bit patterns and
        // every access to shared entries in pvio is atomic.
        Some(unsafe { &*self.map.as_ptr().add(off).cast::<AtomicU64>() })
    }

    /// An atomic snapshot of one entry; `None` if `gref` is out of range.
    pub fn load(&self, gref: GrantRef) -> Option<u64> {
        self.slot(gref).map(|s| s.load(Ordering::Acquire))
    }

    /// Stores a whole entry (release: the frame and domid become visible
    /// together with the flags).
    pub fn store(&self, gref: GrantRef, v: u64) -> Result<(), HvError> {
        self.slot(gref)
            .ok_or_else(|| HvError::InvalidArgument(format!("grant ref {gref} out of range")))?
            .store(v, Ordering::Release);
        Ok(())
    }

    /// Compare-exchange of a whole entry.
    pub fn compare_exchange(&self, gref: GrantRef, old: u64, new: u64) -> Result<u64, u64> {
        match self.slot(gref) {
            Some(s) => s.compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire),
            None => Err(0),
        }
    }

    /// Clears flag bits of an entry atomically.
    pub fn clear_flags(&self, gref: GrantRef, mask: u16) {
        if let Some(s) = self.slot(gref) {
            s.fetch_and(!u64::from(mask), Ordering::AcqRel);
        }
    }
}

/// The granting side: a domain sharing its own frames with peers.
#[derive(Debug)]
pub struct GrantTable {
    mem: GrantTableMem,
    free: Mutex<Vec<GrantRef>>,
}

impl GrantTable {
    /// Wraps this domain's own grant table; refs below
    /// `GNTTAB_NR_RESERVED_ENTRIES` are kept for the toolstack.
    pub fn new(mem: GrantTableMem) -> Self {
        let free = (GNTTAB_NR_RESERVED_ENTRIES..mem.nr_refs()).rev().collect();
        Self {
            mem,
            free: Mutex::new(free),
        }
    }

    /// Number of refs in the table.
    pub fn nr_refs(&self) -> u32 {
        self.mem.nr_refs()
    }

    /// Refs still free for [`GrantTable::grant_access`].
    pub fn free_refs(&self) -> usize {
        self.free.lock().map(|f| f.len()).unwrap_or(0)
    }

    /// Grants `domid` access to frame `gfn` (read-only if asked) and returns
    /// the reference to publish (`gnttab_grant_foreign_access`).
    pub fn grant_access(
        &self,
        domid: DomId,
        gfn: Gfn,
        readonly: bool,
    ) -> Result<GrantRef, HvError> {
        let gref = self
            .free
            .lock()
            .map_err(|_| HvError::Io("grant free list poisoned".into()))?
            .pop()
            .ok_or(HvError::GrantTableFull(self.mem.nr_refs()))?;
        self.write_entry(gref, domid, gfn, readonly);
        Ok(gref)
    }

    /// Grants access through a specific reference (a reserved one, or a test
    /// that needs a known ref). The ref must not be in the free pool's use.
    pub fn grant_access_ref(
        &self,
        gref: GrantRef,
        domid: DomId,
        gfn: Gfn,
        readonly: bool,
    ) -> Result<(), HvError> {
        if gref >= self.mem.nr_refs() {
            return Err(HvError::InvalidArgument(format!(
                "grant ref {gref} is beyond the table's {} refs",
                self.mem.nr_refs()
            )));
        }
        let mut free = self
            .free
            .lock()
            .map_err(|_| HvError::Io("grant free list poisoned".into()))?;
        if let Some(i) = free.iter().position(|r| *r == gref) {
            free.swap_remove(i);
        } else if gref >= GNTTAB_NR_RESERVED_ENTRIES {
            return Err(HvError::InvalidArgument(format!(
                "grant ref {gref} is in use"
            )));
        }
        drop(free);
        self.write_entry(gref, domid, gfn, readonly);
        Ok(())
    }

    fn write_entry(&self, gref: GrantRef, domid: DomId, gfn: Gfn, readonly: bool) {
        let mut flags = GTF_PERMIT_ACCESS;
        if readonly {
            flags |= GTF_READONLY;
        }
        let e = GrantEntryV1 {
            flags,
            domid,
            frame: gfn,
        };
        // The entry is written whole: domid and frame can never be seen
        // without the flags or the other way round.
        let _ = self.mem.store(gref, pack(e));
    }

    /// Ends access (`gnttab_end_foreign_access_ref`): succeeds only if no
    /// peer maps the grant, and returns the ref to the free pool.
    pub fn end_access(&self, gref: GrantRef) -> Result<(), HvError> {
        let cur = self
            .mem
            .load(gref)
            .ok_or_else(|| HvError::InvalidArgument(format!("grant ref {gref} out of range")))?;
        loop {
            let e = unpack(cur);
            if e.flags & (GTF_READING | GTF_WRITING) != 0 {
                return Err(HvError::GrantInUse(gref));
            }
            match self.mem.compare_exchange(gref, cur, 0) {
                Ok(_) => break,
                Err(now) if unpack(now).flags & (GTF_READING | GTF_WRITING) != 0 => {
                    return Err(HvError::GrantInUse(gref))
                }
                Err(_) => continue,
            }
        }
        if gref >= GNTTAB_NR_RESERVED_ENTRIES {
            if let Ok(mut f) = self.free.lock() {
                if !f.contains(&gref) {
                    f.push(gref);
                }
            }
        }
        Ok(())
    }

    /// The current entry (for diagnostics and tests).
    pub fn entry(&self, gref: GrantRef) -> Option<GrantEntryV1> {
        self.mem.load(gref).map(unpack)
    }

    /// Whether a peer has the grant mapped.
    pub fn is_mapped(&self, gref: GrantRef) -> bool {
        self.entry(gref)
            .is_some_and(|e| e.flags & (GTF_READING | GTF_WRITING) != 0)
    }

    /// Raw access, for tests that play a hostile granter.
    pub fn raw(&self) -> &GrantTableMem {
        &self.mem
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::create_sealed_memfd;
    use proptest::prelude::*;

    fn table(frames: u32) -> GrantTable {
        let fd = create_sealed_memfd("gt", u64::from(frames) * 4096).unwrap();
        GrantTable::new(GrantTableMem::from_fd(&fd, frames).unwrap())
    }

    #[test]
    fn grant_and_end() {
        let t = table(1);
        assert_eq!(t.nr_refs(), 512);
        let r = t.grant_access(0, 42, true).unwrap();
        assert_eq!(r, GNTTAB_NR_RESERVED_ENTRIES);
        let e = t.entry(r).unwrap();
        assert_eq!(
            (e.flags, e.domid, e.frame),
            (GTF_PERMIT_ACCESS | GTF_READONLY, 0, 42)
        );
        // A peer pins it: revocation must fail.
        t.raw()
            .compare_exchange(r, pack(e), pack(e) | u64::from(GTF_READING))
            .unwrap();
        assert_eq!(t.end_access(r), Err(HvError::GrantInUse(r)));
        t.raw().clear_flags(r, GTF_READING);
        t.end_access(r).unwrap();
        assert_eq!(t.entry(r).unwrap(), GrantEntryV1::default());
        assert_eq!(t.free_refs(), 512 - 8);
    }

    #[test]
    fn table_full() {
        let t = table(1);
        for _ in 0..504 {
            t.grant_access(1, 0, false).unwrap();
        }
        assert_eq!(
            t.grant_access(1, 0, false),
            Err(HvError::GrantTableFull(512))
        );
        assert!(t.grant_access_ref(600, 1, 0, false).is_err());
        assert!(t.grant_access_ref(9, 1, 0, false).is_err());
        t.grant_access_ref(1, 1, 0, false).unwrap();
    }

    proptest! {
        #[test]
        fn pack_round_trip(flags: u16, domid: u16, frame: u32) {
            let e = GrantEntryV1 { flags, domid, frame };
            prop_assert_eq!(unpack(pack(e)), e);
            // pack() matches the C struct's little-endian byte layout.
            use zerocopy::IntoBytes;
            let bytes = pack(e).to_le_bytes();
            prop_assert_eq!(bytes.as_slice(), e.as_bytes());
        }
    }
}
