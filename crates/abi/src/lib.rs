//! Xen's paravirtual wire formats, byte for byte.
//!
//! This crate owns the layouts that cross a trust boundary in pvio: the shared
//! ring header of `io/ring.h`, the block (`io/blkif.h`) and network
//! (`io/netif.h`) request and response structures, the xenstore wire protocol
//! (`io/xs_wire.h`), grant-table v1 entries (`grant_table.h`), event-channel
//! limits (`event_channel.h`) and xenbus states (`io/xenbus.h`).
//!
//! Every structure is `#[repr(C)]` with explicit padding so that it can be
//! copied to and from raw bytes with `zerocopy`, and a test compiles a C
//! program against Debian's `/usr/include/xen` headers to check each size and
//! field offset.
//!
//! This crate must never do I/O, allocate on behalf of a guest or depend on
//! another pvio crate: it is pure data and arithmetic.

pub mod blkif;
pub mod event_channel;
pub mod grant_table;
pub mod netif;
pub mod ring;
pub mod xenbus;
pub mod xs_wire;

/// A domain identifier (`domid_t`).
pub type DomId = u16;

/// The domain id of the host's own domain (dom0).
pub const DOMID_SELF_HOST: DomId = 0;

/// `DOMID_MASK`: domain ids above this are special values, never real domains.
pub const DOMID_MASK: DomId = 0x7fff;

/// `DOMID_SELF`, the special value that names the calling domain.
pub const DOMID_SELF: DomId = 0x7ff0;

/// Xen pages are always 4 KiB (`XEN_PAGE_SHIFT` = 12), whatever the host uses.
pub const XEN_PAGE_SHIFT: u32 = 12;

/// Size of a Xen page in bytes.
pub const XEN_PAGE_SIZE: usize = 1 << XEN_PAGE_SHIFT;

/// The ABI string a 64-bit x86 frontend writes to `protocol` (`protocols.h`).
pub const XEN_IO_PROTO_ABI_X86_64: &str = "x86_64-abi";

/// The ABI string of a 32-bit x86 frontend (`protocols.h`).
pub const XEN_IO_PROTO_ABI_X86_32: &str = "x86_32-abi";

/// The ABI string of an Arm frontend (`protocols.h`).
pub const XEN_IO_PROTO_ABI_ARM: &str = "arm-abi";
