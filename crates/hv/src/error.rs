//! The one error type of the hv crate, and the codes it travels as between
//! hvd and its clients.

use pvio_abi::event_channel::EvtchnPort;
use pvio_abi::grant_table::{GntStatus, GrantRef};
use pvio_abi::DomId;

/// Why hvd refused to map one grant reference. Travels next to the
/// Xen-compatible `GNTST_*` status so that errors say what went wrong.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GrantFailure {
    /// The request was fine.
    None = 0,
    /// The granting domain does not exist.
    NoSuchDomain = 1,
    /// The reference is beyond the granter's grant table.
    RefOutOfRange = 2,
    /// The entry does not permit access (type is not `GTF_permit_access`).
    NotGranted = 3,
    /// The entry names another domain as grantee.
    WrongGrantee = 4,
    /// A writable mapping of a `GTF_readonly` grant.
    ReadOnlyGrant = 5,
    /// The granted frame is outside the granter's memory.
    BadFrame = 6,
    /// The granter kept changing the entry while hvd pinned it.
    EntryChanged = 7,
    /// This connection already maps this grant.
    AlreadyMapped = 8,
    /// The mapping domain's maptrack limit is reached.
    MaptrackFull = 9,
    /// Unmap of a handle that is not mapped.
    BadHandle = 10,
    /// Only privileged domains may map foreign grants in pvio.
    NotPrivileged = 11,
}

impl GrantFailure {
    /// Decodes a reason byte.
    pub fn from_u8(v: u8) -> Option<Self> {
        use GrantFailure::*;
        [
            None,
            NoSuchDomain,
            RefOutOfRange,
            NotGranted,
            WrongGrantee,
            ReadOnlyGrant,
            BadFrame,
            EntryChanged,
            AlreadyMapped,
            MaptrackFull,
            BadHandle,
            NotPrivileged,
        ]
        .get(v as usize)
        .copied()
    }

    /// The Xen status code that goes with this reason.
    pub fn status(self) -> GntStatus {
        use GrantFailure::*;
        match self {
            None => GntStatus::Okay,
            NoSuchDomain => GntStatus::BadDomain,
            RefOutOfRange => GntStatus::BadGntref,
            NotGranted | WrongGrantee | ReadOnlyGrant | NotPrivileged => {
                GntStatus::PermissionDenied
            }
            BadFrame => GntStatus::BadPage,
            EntryChanged => GntStatus::Eagain,
            AlreadyMapped => GntStatus::GeneralError,
            MaptrackFull => GntStatus::NoSpace,
            BadHandle => GntStatus::BadHandle,
        }
    }

    /// A sentence for logs and error messages.
    pub fn describe(self) -> &'static str {
        use GrantFailure::*;
        match self {
            None => "ok",
            NoSuchDomain => "the granting domain does not exist",
            RefOutOfRange => "the reference is beyond the granter's grant table",
            NotGranted => "the entry does not permit access",
            WrongGrantee => "the entry grants access to another domain",
            ReadOnlyGrant => "a writable mapping was asked of a read-only grant",
            BadFrame => "the granted frame is outside the granter's memory",
            EntryChanged => "the granter kept changing the entry during the map",
            AlreadyMapped => "this connection already maps this grant",
            MaptrackFull => "the maptrack limit of the mapping domain is reached",
            BadHandle => "no mapping has this handle",
            NotPrivileged => "only privileged domains may map foreign grants",
        }
    }
}

/// What kind of failure an [`HvError::Remote`] is; the wire form of errors.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// An argument is malformed or out of range.
    InvalidArgument = 1,
    /// The message could not be decoded.
    Protocol = 2,
    /// The caller may not do this.
    PermissionDenied = 3,
    /// The domain does not exist.
    NoSuchDomain = 4,
    /// The event-channel port is not in a usable state.
    BadPort = 5,
    /// A configured limit is reached.
    Limit = 6,
    /// The thing is busy (e.g. the domain is already claimed).
    Busy = 7,
    /// hvd failed internally (out of fds or memory).
    Internal = 8,
}

impl ErrorCode {
    /// Decodes a code.
    pub fn from_u16(v: u16) -> Option<Self> {
        use ErrorCode::*;
        Some(match v {
            1 => InvalidArgument,
            2 => Protocol,
            3 => PermissionDenied,
            4 => NoSuchDomain,
            5 => BadPort,
            6 => Limit,
            7 => Busy,
            8 => Internal,
            _ => return Option::None,
        })
    }
}

/// Errors of the hv crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HvError {
    /// A system call failed.
    #[error("I/O error: {0}")]
    Io(String),
    /// An argument is malformed or out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A frame number is outside a domain's memory.
    #[error("frame {gfn} is outside the domain's {frames} frames")]
    BadFrame { gfn: u32, frames: u32 },
    /// A guest ran out of frames for its own allocations.
    #[error("out of guest memory: wanted {wanted} contiguous frames, {free} free")]
    OutOfMemory { wanted: u32, free: u32 },
    /// No free grant reference in the granting domain's table.
    #[error("grant table full: all {0} references are in use")]
    GrantTableFull(u32),
    /// The granter tried to end access to a grant a peer still maps.
    #[error("grant ref {0} is still mapped by a peer and cannot be revoked")]
    GrantInUse(GrantRef),
    /// One grant could not be mapped.
    #[error("cannot map grant ref {gref} of domain {domid}: {reason} ({status})", reason = .reason.describe())]
    Grant {
        domid: DomId,
        gref: GrantRef,
        status: GntStatus,
        reason: GrantFailure,
    },
    /// hvd refused a request.
    #[error("hvd refused the request: {message}")]
    Remote { code: ErrorCode, message: String },
    /// A reply could not be decoded.
    #[error("malformed message from hvd: {0}")]
    Protocol(String),
    /// hvd closed the connection.
    #[error("hvd closed the connection")]
    Disconnected,
    /// An event channel port of this process is not open.
    #[error("event channel port {0} is not open in this process")]
    UnknownPort(EvtchnPort),
}

impl HvError {
    /// The remote error code, if hvd refused the request.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            HvError::Remote { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl From<std::io::Error> for HvError {
    fn from(e: std::io::Error) -> Self {
        HvError::Io(e.to_string())
    }
}

impl From<rustix::io::Errno> for HvError {
    fn from(e: rustix::io::Errno) -> Self {
        HvError::Io(std::io::Error::from(e).to_string())
    }
}
