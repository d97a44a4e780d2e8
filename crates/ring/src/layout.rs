//! Which regions can hold a ring, and how many slots they get.
//!
//! A ring is 1, 2, 4, 8 or 16 Xen pages (blkif `ring-page-order` 0 to 4),
//! page-aligned, with `__CONST_RING_SIZE` slots: the 64-byte header, then
//! as many slots as fit, rounded down to a power of two.

use pvio_abi::ring::{ring_size, SRING_HEADER_SIZE};
use pvio_abi::XEN_PAGE_SIZE;

use crate::error::RingError;

/// The largest ring, in pages (`XENBUS_MAX_RING_GRANT_ORDER` = 4).
pub const MAX_RING_PAGES: usize = 16;

/// Checks a region at `addr` of `len` bytes and returns its number of slots
/// of `slot_size` bytes.
pub fn ring_slots(
    addr: usize,
    len: usize,
    slot_size: usize,
    ring: &'static str,
) -> Result<u32, RingError> {
    let min = SRING_HEADER_SIZE
        .saturating_add(slot_size)
        .div_ceil(XEN_PAGE_SIZE)
        .saturating_mul(XEN_PAGE_SIZE);
    if len < XEN_PAGE_SIZE {
        return Err(RingError::RegionTooSmall { ring, len, min });
    }
    if !len.is_multiple_of(XEN_PAGE_SIZE) {
        return Err(RingError::RegionNotPageMultiple { len });
    }
    let pages = len / XEN_PAGE_SIZE;
    if !pages.is_power_of_two() || pages > MAX_RING_PAGES {
        return Err(RingError::UnsupportedPageCount { pages });
    }
    if !addr.is_multiple_of(XEN_PAGE_SIZE) {
        return Err(RingError::RegionMisaligned { addr });
    }
    let slots = ring_size(len, slot_size);
    if slots == 0 {
        return Err(RingError::RegionTooSmall { ring, len, min });
    }
    // At most 16 pages of slots of at least one byte: fits in u32.
    Ok(slots as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvio_abi::blkif::Blkif;
    use pvio_abi::netif::{NetifCtrl, NetifRx, NetifTx};
    use pvio_abi::ring::RingProtocol;

    const A: usize = 0x10000;

    #[test]
    fn blkif_sizes_by_order() {
        for (order, slots) in [(0, 32), (1, 64), (2, 128), (3, 256), (4, 512)] {
            let len = XEN_PAGE_SIZE << order;
            assert_eq!(ring_slots(A, len, Blkif::SLOT_SIZE, "blkif"), Ok(slots));
        }
    }

    #[test]
    fn netif_sizes() {
        assert_eq!(ring_slots(A, 4096, NetifTx::SLOT_SIZE, "tx"), Ok(256));
        assert_eq!(ring_slots(A, 4096, NetifRx::SLOT_SIZE, "rx"), Ok(256));
        assert_eq!(ring_slots(A, 4096, NetifCtrl::SLOT_SIZE, "ctrl"), Ok(128));
    }

    #[test]
    fn rejects_bad_regions() {
        assert!(matches!(
            ring_slots(A, 0, 112, "b"),
            Err(RingError::RegionTooSmall { len: 0, .. })
        ));
        assert!(matches!(
            ring_slots(A, 4095, 112, "b"),
            Err(RingError::RegionTooSmall { .. })
        ));
        assert_eq!(
            ring_slots(A, 4097, 112, "b"),
            Err(RingError::RegionNotPageMultiple { len: 4097 })
        );
        assert_eq!(
            ring_slots(A, 3 * 4096, 112, "b"),
            Err(RingError::UnsupportedPageCount { pages: 3 })
        );
        assert_eq!(
            ring_slots(A, 32 * 4096, 112, "b"),
            Err(RingError::UnsupportedPageCount { pages: 32 })
        );
        assert_eq!(
            ring_slots(A + 64, 4096, 112, "b"),
            Err(RingError::RegionMisaligned { addr: A + 64 })
        );
        // A slot bigger than a page minus the header needs two pages.
        assert_eq!(
            ring_slots(A, 4096, 4033, "big"),
            Err(RingError::RegionTooSmall {
                ring: "big",
                len: 4096,
                min: 8192
            })
        );
        assert_eq!(ring_slots(A, 8192, 4033, "big"), Ok(2));
        assert_eq!(ring_slots(A, 8192, 4065, "big"), Ok(1));
    }
}
