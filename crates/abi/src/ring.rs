//! The generic shared ring of `io/ring.h` (`DEFINE_RING_TYPES`).
//!
//! A shared ring is a 64-byte header followed by a power-of-two array of
//! slots. Requests and responses share the slots: each slot is a union of the
//! request and the response type, so its size is the larger of the two.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `RING_IDX`: a free-running 32-bit index; slots are `idx & (size - 1)`.
pub type RingIdx = u32;

/// Size in bytes of the shared-ring header that precedes the slots.
pub const SRING_HEADER_SIZE: usize = 64;

/// The header of a shared ring page (`struct name##_sring` up to `ring[]`).
///
/// `req_prod` is written by the frontend, `rsp_prod` by the backend;
/// `req_event` is the index at which the backend wants to be notified of new
/// requests and `rsp_event` the index at which the frontend wants to be
/// notified of new responses.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct SringHeader {
    pub req_prod: RingIdx,
    pub req_event: RingIdx,
    pub rsp_prod: RingIdx,
    pub rsp_event: RingIdx,
    /// The `pvt` union (`netif.smartpoll_active`, `tapif_user.msg`, `pvt_pad[4]`).
    pub pvt: [u8; 4],
    pub pad: [u8; 44],
}

/// Byte offset of `req_prod` in the shared ring.
pub const SRING_REQ_PROD: usize = 0;
/// Byte offset of `req_event` in the shared ring.
pub const SRING_REQ_EVENT: usize = 4;
/// Byte offset of `rsp_prod` in the shared ring.
pub const SRING_RSP_PROD: usize = 8;
/// Byte offset of `rsp_event` in the shared ring.
pub const SRING_RSP_EVENT: usize = 12;

/// Rounds down to a power of two (`__RD32`); 0 stays 0.
pub const fn round_down_pow2(x: usize) -> usize {
    if x == 0 {
        0
    } else {
        1 << (usize::BITS - 1 - x.leading_zeros())
    }
}

/// `__CONST_RING_SIZE`: the number of slots of `entry_size` bytes that fit
/// in a ring of `ring_bytes` bytes (header included), rounded down to a
/// power of two.
pub const fn ring_size(ring_bytes: usize, entry_size: usize) -> usize {
    if ring_bytes <= SRING_HEADER_SIZE || entry_size == 0 {
        return 0;
    }
    round_down_pow2((ring_bytes - SRING_HEADER_SIZE) / entry_size)
}

/// Describes one ring protocol: its request and response types.
///
/// The slot size is the larger of the two, because the C definition makes
/// each slot a union of both.
pub trait RingProtocol {
    /// The request type, written by the frontend.
    type Request: FromBytes + IntoBytes + Immutable + KnownLayout + Copy;
    /// The response type, written by the backend.
    type Response: FromBytes + IntoBytes + Immutable + KnownLayout + Copy;
    /// A short name for logs and errors, e.g. `"blkif"`.
    const NAME: &'static str;

    /// Size of one slot in bytes.
    const SLOT_SIZE: usize = {
        let q = core::mem::size_of::<Self::Request>();
        let s = core::mem::size_of::<Self::Response>();
        if q > s {
            q
        } else {
            s
        }
    };

    /// Number of slots in a ring made of `pages` 4 KiB pages.
    fn ring_size_for_pages(pages: usize) -> usize {
        ring_size(pages * crate::XEN_PAGE_SIZE, Self::SLOT_SIZE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_64_bytes() {
        assert_eq!(core::mem::size_of::<SringHeader>(), SRING_HEADER_SIZE);
        assert_eq!(core::mem::offset_of!(SringHeader, req_prod), SRING_REQ_PROD);
        assert_eq!(
            core::mem::offset_of!(SringHeader, req_event),
            SRING_REQ_EVENT
        );
        assert_eq!(core::mem::offset_of!(SringHeader, rsp_prod), SRING_RSP_PROD);
        assert_eq!(
            core::mem::offset_of!(SringHeader, rsp_event),
            SRING_RSP_EVENT
        );
    }

    #[test]
    fn rounding() {
        assert_eq!(round_down_pow2(0), 0);
        assert_eq!(round_down_pow2(1), 1);
        assert_eq!(round_down_pow2(36), 32);
        assert_eq!(round_down_pow2(64), 64);
        assert_eq!(round_down_pow2(336), 256);
        assert_eq!(ring_size(64, 8), 0);
        assert_eq!(ring_size(4096, 0), 0);
    }
}
