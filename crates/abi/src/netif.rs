//! The network protocol of `io/netif.h`: TX and RX rings, extra-info slots and
//! the control ring used for hash configuration.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::grant_table::GrantRef;
use crate::ring::RingProtocol;

/// Every backend must accept a packet spread over this many slots.
pub const XEN_NETIF_NR_SLOTS_MIN: usize = 18;
/// Largest packet on the TX ring.
pub const XEN_NETIF_MAX_TX_SIZE: usize = 0xffff;

/// TX flag: the checksum is blank (to be filled in by the receiver).
pub const NETTXF_CSUM_BLANK: u16 = 1 << 0;
/// TX flag: the packet's checksum has been validated.
pub const NETTXF_DATA_VALIDATED: u16 = 1 << 1;
/// TX flag: more fragments of this packet follow.
pub const NETTXF_MORE_DATA: u16 = 1 << 2;
/// TX flag: an extra-info slot follows.
pub const NETTXF_EXTRA_INFO: u16 = 1 << 3;

/// RX flag: the packet's checksum has been validated (note: swapped with TX).
pub const NETRXF_DATA_VALIDATED: u16 = 1 << 0;
/// RX flag: the checksum is blank.
pub const NETRXF_CSUM_BLANK: u16 = 1 << 1;
/// RX flag: more fragments of this packet follow.
pub const NETRXF_MORE_DATA: u16 = 1 << 2;
/// RX flag: an extra-info slot follows.
pub const NETRXF_EXTRA_INFO: u16 = 1 << 3;
/// RX flag: a GSO prefix slot precedes the packet (deprecated).
pub const NETRXF_GSO_PREFIX: u16 = 1 << 4;

/// The packet was dropped.
pub const NETIF_RSP_DROPPED: i16 = -2;
/// The request failed.
pub const NETIF_RSP_ERROR: i16 = -1;
/// The request succeeded.
pub const NETIF_RSP_OKAY: i16 = 0;
/// The slot carried extra info and has no response of its own.
pub const NETIF_RSP_NULL: i16 = 1;

/// Extra-info type 0: never valid.
pub const XEN_NETIF_EXTRA_TYPE_NONE: u8 = 0;
/// Extra info carries GSO parameters.
pub const XEN_NETIF_EXTRA_TYPE_GSO: u8 = 1;
/// Extra info adds a multicast address.
pub const XEN_NETIF_EXTRA_TYPE_MCAST_ADD: u8 = 2;
/// Extra info removes a multicast address.
pub const XEN_NETIF_EXTRA_TYPE_MCAST_DEL: u8 = 3;
/// Extra info carries a packet hash.
pub const XEN_NETIF_EXTRA_TYPE_HASH: u8 = 4;
/// One past the last valid extra-info type.
pub const XEN_NETIF_EXTRA_TYPE_MAX: u8 = 5;
/// Extra-info flag: another extra-info slot follows.
pub const XEN_NETIF_EXTRA_FLAG_MORE: u8 = 1 << 0;

/// GSO type: none.
pub const XEN_NETIF_GSO_TYPE_NONE: u8 = 0;
/// GSO type: TCP over IPv4.
pub const XEN_NETIF_GSO_TYPE_TCPV4: u8 = 1;
/// GSO type: TCP over IPv6.
pub const XEN_NETIF_GSO_TYPE_TCPV6: u8 = 2;

/// Control request types (`XEN_NETIF_CTRL_TYPE_*`).
pub mod ctrl_type {
    pub const INVALID: u16 = 0;
    pub const GET_HASH_FLAGS: u16 = 1;
    pub const SET_HASH_FLAGS: u16 = 2;
    pub const SET_HASH_KEY: u16 = 3;
    pub const GET_HASH_MAPPING_SIZE: u16 = 4;
    pub const SET_HASH_MAPPING_SIZE: u16 = 5;
    pub const SET_HASH_MAPPING: u16 = 6;
    pub const SET_HASH_ALGORITHM: u16 = 7;
    pub const GET_GREF_MAPPING_SIZE: u16 = 8;
    pub const ADD_GREF_MAPPING: u16 = 9;
    pub const DEL_GREF_MAPPING: u16 = 10;
}

/// Control response status values (`XEN_NETIF_CTRL_STATUS_*`).
pub mod ctrl_status {
    pub const SUCCESS: u32 = 0;
    pub const NOT_SUPPORTED: u32 = 1;
    pub const INVALID_PARAMETER: u32 = 2;
    pub const BUFFER_OVERFLOW: u32 = 3;
}

/// Hash type bits (`XEN_NETIF_CTRL_HASH_TYPE_*`, as bit masks).
pub mod hash_type {
    pub const IPV4: u32 = 1 << 0;
    pub const IPV4_TCP: u32 = 1 << 1;
    pub const IPV6: u32 = 1 << 2;
    pub const IPV6_TCP: u32 = 1 << 3;
}

/// No hash algorithm.
pub const XEN_NETIF_CTRL_HASH_ALGORITHM_NONE: u32 = 0;
/// The Toeplitz (RSS) hash.
pub const XEN_NETIF_CTRL_HASH_ALGORITHM_TOEPLITZ: u32 = 1;

/// `struct netif_tx_request`. The first slot of a packet carries the total
/// packet size in `size`; later slots carry their fragment sizes.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NetifTxRequest {
    pub gref: GrantRef,
    pub offset: u16,
    pub flags: u16,
    pub id: u16,
    pub size: u16,
}

/// `struct netif_tx_response`.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NetifTxResponse {
    pub id: u16,
    pub status: i16,
}

/// `struct netif_rx_request`.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NetifRxRequest {
    pub id: u16,
    pub pad: u16,
    pub gref: GrantRef,
}

/// `struct netif_rx_response`. A positive `status` is the fragment's length.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NetifRxResponse {
    pub id: u16,
    pub offset: u16,
    pub flags: u16,
    pub status: i16,
}

/// `struct netif_extra_info`; `u` is the union, decoded by the accessors.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NetifExtraInfo {
    pub type_: u8,
    pub flags: u8,
    pub u: [u8; 6],
}

/// `netif_extra_info.u.gso`.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NetifExtraGso {
    pub size: u16,
    pub type_: u8,
    pub pad: u8,
    pub features: u16,
}

/// `netif_extra_info.u.mcast`.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NetifExtraMcast {
    pub addr: [u8; 6],
}

/// `netif_extra_info.u.hash`.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NetifExtraHash {
    pub type_: u8,
    pub algorithm: u8,
    pub value: [u8; 4],
}

impl NetifExtraInfo {
    /// The union viewed as GSO parameters.
    pub fn gso(&self) -> NetifExtraGso {
        NetifExtraGso::read_from_bytes(&self.u).unwrap_or_default()
    }
    /// The union viewed as a multicast address.
    pub fn mcast(&self) -> NetifExtraMcast {
        NetifExtraMcast::read_from_bytes(&self.u).unwrap_or_default()
    }
    /// The union viewed as a hash value.
    pub fn hash(&self) -> NetifExtraHash {
        NetifExtraHash::read_from_bytes(&self.u).unwrap_or_default()
    }
}

/// `struct xen_netif_ctrl_request`.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct XenNetifCtrlRequest {
    pub id: u16,
    pub type_: u16,
    pub data: [u32; 3],
}

/// `struct xen_netif_ctrl_response`.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct XenNetifCtrlResponse {
    pub id: u16,
    pub type_: u16,
    pub status: u32,
    pub data: u32,
}

/// `struct xen_netif_gref`.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct XenNetifGref {
    pub ref_: GrantRef,
    pub flags: u16,
    pub status: u16,
}

/// The TX ring (frontend transmits): `DEFINE_RING_TYPES(netif_tx, ...)`.
#[derive(Debug, Clone, Copy)]
pub enum NetifTx {}
impl RingProtocol for NetifTx {
    type Request = NetifTxRequest;
    type Response = NetifTxResponse;
    const NAME: &'static str = "netif-tx";
}

/// The RX ring (frontend receives): `DEFINE_RING_TYPES(netif_rx, ...)`.
#[derive(Debug, Clone, Copy)]
pub enum NetifRx {}
impl RingProtocol for NetifRx {
    type Request = NetifRxRequest;
    type Response = NetifRxResponse;
    const NAME: &'static str = "netif-rx";
}

/// The control ring: `DEFINE_RING_TYPES(xen_netif_ctrl, ...)`.
#[derive(Debug, Clone, Copy)]
pub enum NetifCtrl {}
impl RingProtocol for NetifCtrl {
    type Request = XenNetifCtrlRequest;
    type Response = XenNetifCtrlResponse;
    const NAME: &'static str = "netif-ctrl";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_page_ring_sizes() {
        assert_eq!(NetifTx::ring_size_for_pages(1), 256);
        assert_eq!(NetifRx::ring_size_for_pages(1), 256);
        assert_eq!(NetifCtrl::ring_size_for_pages(1), 128);
    }

    #[test]
    fn extra_info_views() {
        let e = NetifExtraInfo {
            type_: XEN_NETIF_EXTRA_TYPE_GSO,
            flags: 0,
            u: [0xb4, 0x05, XEN_NETIF_GSO_TYPE_TCPV4, 0, 0, 0],
        };
        assert_eq!(e.gso().size, 1460);
        assert_eq!(e.gso().type_, XEN_NETIF_GSO_TYPE_TCPV4);
        assert_eq!(e.mcast().addr[0], 0xb4);
        assert_eq!(e.hash().algorithm, 0x05);
    }
}
