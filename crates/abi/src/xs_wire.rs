//! The xenstore wire protocol of `io/xs_wire.h`: message header, message
//! types, error names, limits and the per-domain xenbus ring page.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `struct xsd_sockmsg`: the 16-byte header before every message payload, in
/// host byte order.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct XsdSockmsg {
    /// One of [`XsdSockmsgType`].
    pub type_: u32,
    /// Request identifier, echoed in the reply.
    pub req_id: u32,
    /// Transaction id, 0 outside a transaction.
    pub tx_id: u32,
    /// Payload length in bytes.
    pub len: u32,
}

/// Size of [`XsdSockmsg`].
pub const XSD_SOCKMSG_SIZE: usize = 16;

/// `enum xsd_sockmsg_type`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum XsdSockmsgType {
    /// `XS_CONTROL` (formerly `XS_DEBUG`).
    Control = 0,
    Directory = 1,
    Read = 2,
    GetPerms = 3,
    Watch = 4,
    Unwatch = 5,
    TransactionStart = 6,
    TransactionEnd = 7,
    Introduce = 8,
    Release = 9,
    GetDomainPath = 10,
    Write = 11,
    Mkdir = 12,
    Rm = 13,
    SetPerms = 14,
    WatchEvent = 15,
    Error = 16,
    IsDomainIntroduced = 17,
    Resume = 18,
    SetTarget = 19,
    // 20 was XS_RESTRICT, removed.
    ResetWatches = 21,
    DirectoryPart = 22,
}

/// `XS_TYPE_COUNT`: one past the last valid type.
pub const XS_TYPE_COUNT: u32 = 23;
/// `XS_INVALID`: guaranteed never to be a valid type.
pub const XS_INVALID: u32 = 0xffff;

impl XsdSockmsgType {
    /// Every valid message type, in numeric order.
    pub const ALL: [XsdSockmsgType; 22] = [
        Self::Control,
        Self::Directory,
        Self::Read,
        Self::GetPerms,
        Self::Watch,
        Self::Unwatch,
        Self::TransactionStart,
        Self::TransactionEnd,
        Self::Introduce,
        Self::Release,
        Self::GetDomainPath,
        Self::Write,
        Self::Mkdir,
        Self::Rm,
        Self::SetPerms,
        Self::WatchEvent,
        Self::Error,
        Self::IsDomainIntroduced,
        Self::Resume,
        Self::SetTarget,
        Self::ResetWatches,
        Self::DirectoryPart,
    ];

    /// Decodes a header's `type` field; `None` for unknown or removed types.
    pub fn from_u32(v: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| *t as u32 == v)
    }

    /// The C name of the type, e.g. `"XS_READ"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Control => "XS_CONTROL",
            Self::Directory => "XS_DIRECTORY",
            Self::Read => "XS_READ",
            Self::GetPerms => "XS_GET_PERMS",
            Self::Watch => "XS_WATCH",
            Self::Unwatch => "XS_UNWATCH",
            Self::TransactionStart => "XS_TRANSACTION_START",
            Self::TransactionEnd => "XS_TRANSACTION_END",
            Self::Introduce => "XS_INTRODUCE",
            Self::Release => "XS_RELEASE",
            Self::GetDomainPath => "XS_GET_DOMAIN_PATH",
            Self::Write => "XS_WRITE",
            Self::Mkdir => "XS_MKDIR",
            Self::Rm => "XS_RM",
            Self::SetPerms => "XS_SET_PERMS",
            Self::WatchEvent => "XS_WATCH_EVENT",
            Self::Error => "XS_ERROR",
            Self::IsDomainIntroduced => "XS_IS_DOMAIN_INTRODUCED",
            Self::Resume => "XS_RESUME",
            Self::SetTarget => "XS_SET_TARGET",
            Self::ResetWatches => "XS_RESET_WATCHES",
            Self::DirectoryPart => "XS_DIRECTORY_PART",
        }
    }
}

/// The error names of `xsd_errors[]`, in array order, with their Linux errno
/// values. Errors travel as the name, never the number.
pub const XSD_ERRORS: [(i32, &str); 16] = [
    (22, "EINVAL"),
    (13, "EACCES"),
    (17, "EEXIST"),
    (21, "EISDIR"),
    (2, "ENOENT"),
    (12, "ENOMEM"),
    (28, "ENOSPC"),
    (5, "EIO"),
    (39, "ENOTEMPTY"),
    (38, "ENOSYS"),
    (30, "EROFS"),
    (16, "EBUSY"),
    (11, "EAGAIN"),
    (106, "EISCONN"),
    (7, "E2BIG"),
    (1, "EPERM"),
];

/// `XS_WRITE_NONE`.
pub const XS_WRITE_NONE: &str = "NONE";
/// `XS_WRITE_CREATE`.
pub const XS_WRITE_CREATE: &str = "CREATE";
/// `XS_WRITE_CREATE_EXCL`.
pub const XS_WRITE_CREATE_EXCL: &str = "CREATE|EXCL";

/// Index of the path in a watch event's payload vector.
pub const XS_WATCH_PATH: usize = 0;
/// Index of the token in a watch event's payload vector.
pub const XS_WATCH_TOKEN: usize = 1;

/// Largest payload in either direction; a larger one kills the connection.
pub const XENSTORE_PAYLOAD_MAX: usize = 4096;
/// Longest absolute path.
pub const XENSTORE_ABS_PATH_MAX: usize = 3072;
/// Longest relative path.
pub const XENSTORE_REL_PATH_MAX: usize = 2048;

/// Size of each direction of the xenbus ring.
pub const XENSTORE_RING_SIZE: usize = 1024;
/// `XENSTORE_RING_IDX`.
pub type XenstoreRingIdx = u32;

/// Masks a free-running ring index into the ring (`MASK_XENSTORE_IDX`).
pub const fn mask_xenstore_idx(idx: XenstoreRingIdx) -> usize {
    (idx as usize) & (XENSTORE_RING_SIZE - 1)
}

/// Server feature: the ring can be reconnected.
pub const XENSTORE_SERVER_FEATURE_RECONNECTION: u32 = 1;
/// Server feature: the `error` field is present.
pub const XENSTORE_SERVER_FEATURE_ERROR: u32 = 2;
/// `connection`: steady state.
pub const XENSTORE_CONNECTED: u32 = 0;
/// `connection`: reconnect in progress.
pub const XENSTORE_RECONNECT: u32 = 1;
/// `error`: none.
pub const XENSTORE_ERROR_NONE: u32 = 0;
/// `error`: communication problem.
pub const XENSTORE_ERROR_COMM: u32 = 1;
/// `error`: invalid ring index.
pub const XENSTORE_ERROR_RINGIDX: u32 = 2;
/// `error`: protocol violation (payload too long).
pub const XENSTORE_ERROR_PROTO: u32 = 3;

/// `struct xenstore_domain_interface`: the xenbus ring page shared between a
/// guest and xenstored.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct XenstoreDomainInterface {
    /// Requests to the daemon.
    pub req: [u8; XENSTORE_RING_SIZE],
    /// Replies and asynchronous watch events.
    pub rsp: [u8; XENSTORE_RING_SIZE],
    pub req_cons: XenstoreRingIdx,
    pub req_prod: XenstoreRingIdx,
    pub rsp_cons: XenstoreRingIdx,
    pub rsp_prod: XenstoreRingIdx,
    pub server_features: u32,
    pub connection: u32,
    pub error: u32,
}

/// Name of an errno value as xenstore sends it, if it is one of [`XSD_ERRORS`].
pub fn error_name(errno: i32) -> Option<&'static str> {
    XSD_ERRORS
        .iter()
        .find(|(n, _)| *n == errno)
        .map(|(_, s)| *s)
}

/// Errno value of a xenstore error name.
pub fn error_errno(name: &str) -> Option<i32> {
    XSD_ERRORS.iter().find(|(_, s)| *s == name).map(|(n, _)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_numbers() {
        assert_eq!(XsdSockmsgType::ResetWatches as u32, 21);
        assert_eq!(XsdSockmsgType::DirectoryPart as u32, 22);
        assert_eq!(XsdSockmsgType::from_u32(20), None);
        assert_eq!(XsdSockmsgType::from_u32(XS_TYPE_COUNT), None);
        for t in XsdSockmsgType::ALL {
            assert_eq!(XsdSockmsgType::from_u32(t as u32), Some(t));
            assert!(t.name().starts_with("XS_"));
        }
    }

    #[test]
    fn errors() {
        assert_eq!(error_name(11), Some("EAGAIN"));
        assert_eq!(error_errno("EPERM"), Some(1));
        assert_eq!(error_name(9999), None);
        assert_eq!(mask_xenstore_idx(1025), 1);
    }
}
