//! Grant table v1 of `grant_table.h`: the entries a domain writes in its own
//! grant-table frames to let another domain map one of its pages.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::DomId;

/// `grant_ref_t`: an index into a domain's grant table.
pub type GrantRef = u32;

/// `struct grant_entry_v1`.
///
/// The granting domain writes `domid` and `frame` first, then (after a write
/// barrier) `flags`, which carries the type. The hypervisor sets
/// [`GTF_READING`]/[`GTF_WRITING`] while the grant is mapped.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct GrantEntryV1 {
    pub flags: u16,
    pub domid: DomId,
    pub frame: u32,
}

/// Size of a v1 grant entry.
pub const GRANT_ENTRY_V1_SIZE: usize = 8;
/// v1 entries per 4 KiB grant-table frame.
pub const GRANT_ENTRIES_PER_FRAME_V1: usize = crate::XEN_PAGE_SIZE / GRANT_ENTRY_V1_SIZE;
/// Refs below this are reserved for the toolstack (`GNTTAB_NR_RESERVED_ENTRIES`).
pub const GNTTAB_NR_RESERVED_ENTRIES: GrantRef = 8;
/// Reserved ref of the console page.
pub const GNTTAB_RESERVED_CONSOLE: GrantRef = 0;
/// Reserved ref of the xenstore page.
pub const GNTTAB_RESERVED_XENSTORE: GrantRef = 1;
/// Xen's default `gnttab_max_frames` (since 4.10).
pub const DEFAULT_MAX_GRANT_FRAMES: u32 = 64;
/// Xen's default `gnttab_max_maptrack_frames`.
pub const DEFAULT_MAX_MAPTRACK_FRAMES: u32 = 1024;
/// Size of a maptrack entry (`struct grant_mapping`): 256 per page.
pub const MAPTRACK_ENTRY_SIZE: usize = 16;

/// Type field mask (bits 0–1).
pub const GTF_TYPE_MASK: u16 = 3;
/// Type: the entry grants nothing.
pub const GTF_INVALID: u16 = 0;
/// Type: `domid` may map and access `frame`.
pub const GTF_PERMIT_ACCESS: u16 = 1;
/// Type: `domid` may transfer a page into `frame`.
pub const GTF_ACCEPT_TRANSFER: u16 = 2;
/// Type: transitive grant.
pub const GTF_TRANSITIVE: u16 = 3;
/// Set by the granter: the grantee may only read.
pub const GTF_READONLY: u16 = 1 << 2;
/// Set by the hypervisor while the grantee has the frame mapped for reading.
pub const GTF_READING: u16 = 1 << 3;
/// Set by the hypervisor while the grantee has the frame mapped for writing.
pub const GTF_WRITING: u16 = 1 << 4;
/// Cache attribute PWT.
pub const GTF_PWT: u16 = 1 << 5;
/// Cache attribute PCD.
pub const GTF_PCD: u16 = 1 << 6;
/// Cache attribute PAT.
pub const GTF_PAT: u16 = 1 << 7;
/// Sub-page grant (v2 only).
pub const GTF_SUB_PAGE: u16 = 1 << 8;
/// Accept-transfer: the transfer is committed.
pub const GTF_TRANSFER_COMMITTED: u16 = 1 << 2;
/// Accept-transfer: the transfer is completed.
pub const GTF_TRANSFER_COMPLETED: u16 = 1 << 3;

/// `GNTMAP_device_map`.
pub const GNTMAP_DEVICE_MAP: u32 = 1 << 0;
/// `GNTMAP_host_map`.
pub const GNTMAP_HOST_MAP: u32 = 1 << 1;
/// `GNTMAP_readonly`: map for reading only.
pub const GNTMAP_READONLY: u32 = 1 << 2;
/// `GNTMAP_application_map`.
pub const GNTMAP_APPLICATION_MAP: u32 = 1 << 3;
/// `GNTMAP_contains_pte`.
pub const GNTMAP_CONTAINS_PTE: u32 = 1 << 4;

/// `GNTTABOP_*` operation numbers.
pub mod op {
    pub const MAP_GRANT_REF: u32 = 0;
    pub const UNMAP_GRANT_REF: u32 = 1;
    pub const SETUP_TABLE: u32 = 2;
    pub const DUMP_TABLE: u32 = 3;
    pub const TRANSFER: u32 = 4;
    pub const COPY: u32 = 5;
    pub const QUERY_SIZE: u32 = 6;
    pub const UNMAP_AND_REPLACE: u32 = 7;
    pub const SET_VERSION: u32 = 8;
    pub const GET_STATUS_FRAMES: u32 = 9;
    pub const GET_VERSION: u32 = 10;
    pub const SWAP_GRANT_REF: u32 = 11;
    pub const CACHE_FLUSH: u32 = 12;
}

/// `GNTST_*` status codes of grant operations.
#[repr(i16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GntStatus {
    Okay = 0,
    GeneralError = -1,
    BadDomain = -2,
    BadGntref = -3,
    BadHandle = -4,
    BadVirtAddr = -5,
    BadDevAddr = -6,
    NoDeviceSpace = -7,
    PermissionDenied = -8,
    BadPage = -9,
    BadCopyArg = -10,
    AddressTooBig = -11,
    Eagain = -12,
    NoSpace = -13,
}

impl GntStatus {
    /// Every status, from 0 down to -13.
    pub const ALL: [GntStatus; 14] = [
        Self::Okay,
        Self::GeneralError,
        Self::BadDomain,
        Self::BadGntref,
        Self::BadHandle,
        Self::BadVirtAddr,
        Self::BadDevAddr,
        Self::NoDeviceSpace,
        Self::PermissionDenied,
        Self::BadPage,
        Self::BadCopyArg,
        Self::AddressTooBig,
        Self::Eagain,
        Self::NoSpace,
    ];

    /// Decodes a status value.
    pub fn from_i16(v: i16) -> Option<Self> {
        Self::ALL.iter().copied().find(|s| *s as i16 == v)
    }

    /// The message of `GNTTABOP_error_msgs`.
    pub fn message(self) -> &'static str {
        match self {
            Self::Okay => "okay",
            Self::GeneralError => "undefined error",
            Self::BadDomain => "unrecognised domain id",
            Self::BadGntref => "invalid grant reference",
            Self::BadHandle => "invalid mapping handle",
            Self::BadVirtAddr => "invalid virtual address",
            Self::BadDevAddr => "invalid device address",
            Self::NoDeviceSpace => "no spare translation slot in the I/O MMU",
            Self::PermissionDenied => "permission denied",
            Self::BadPage => "bad page",
            Self::BadCopyArg => "copy arguments cross page boundary",
            Self::AddressTooBig => "page address size too large",
            Self::Eagain => "operation not done; try again",
            Self::NoSpace => "out of space",
        }
    }
}

impl core::fmt::Display for GntStatus {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "GNTST {} ({})", *self as i16, self.message())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_holds_512_entries() {
        assert_eq!(GRANT_ENTRIES_PER_FRAME_V1, 512);
        assert_eq!(
            DEFAULT_MAX_GRANT_FRAMES as usize * GRANT_ENTRIES_PER_FRAME_V1,
            32768
        );
    }

    #[test]
    fn status_round_trip() {
        for s in GntStatus::ALL {
            assert_eq!(GntStatus::from_i16(s as i16), Some(s));
        }
        assert_eq!(GntStatus::from_i16(-14), None);
        assert!(GntStatus::PermissionDenied.to_string().contains("-8"));
    }
}
