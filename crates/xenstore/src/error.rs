//! Errors: the xenstore error names of `xs_wire.h` (what travels on the wire)
//! and the client's error type.

use pvio_abi::xs_wire::XSD_ERRORS;

/// One of the error names of `xsd_errors[]`. The daemon sends the name, never
/// the number; the client maps a received name back to this type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum XsError {
    Einval,
    Eacces,
    Eexist,
    Eisdir,
    Enoent,
    Enomem,
    Enospc,
    Eio,
    Enotempty,
    Enosys,
    Erofs,
    Ebusy,
    Eagain,
    Eisconn,
    E2big,
    Eperm,
}

impl XsError {
    /// Every error, in `xsd_errors[]` order.
    pub const ALL: [XsError; 16] = [
        Self::Einval,
        Self::Eacces,
        Self::Eexist,
        Self::Eisdir,
        Self::Enoent,
        Self::Enomem,
        Self::Enospc,
        Self::Eio,
        Self::Enotempty,
        Self::Enosys,
        Self::Erofs,
        Self::Ebusy,
        Self::Eagain,
        Self::Eisconn,
        Self::E2big,
        Self::Eperm,
    ];

    fn index(self) -> usize {
        Self::ALL.iter().position(|e| *e == self).unwrap_or(0)
    }

    /// The name sent on the wire, e.g. `"EAGAIN"`.
    pub fn name(self) -> &'static str {
        XSD_ERRORS[self.index()].1
    }

    /// The Linux errno value.
    pub fn errno(self) -> i32 {
        XSD_ERRORS[self.index()].0
    }

    /// Parses an error name as sent on the wire (without the NUL).
    pub fn from_name(name: &str) -> Option<Self> {
        XSD_ERRORS
            .iter()
            .position(|(_, n)| *n == name)
            .map(|i| Self::ALL[i])
    }
}

impl core::fmt::Display for XsError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::error::Error for XsError {}

/// Errors of the async client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The daemon answered with an error reply.
    #[error("xenstore: {0}")]
    Xen(#[from] XsError),
    /// The connection failed.
    #[error("xenstore connection: {0}")]
    Io(#[from] std::io::Error),
    /// The daemon sent something the protocol does not allow.
    #[error("xenstore protocol violation: {0}")]
    Protocol(String),
    /// The connection to the daemon was closed.
    #[error("xenstore connection closed")]
    Closed,
    /// A deadline passed before the awaited condition held.
    #[error("timed out waiting for {0}")]
    Timeout(String),
}

impl Error {
    /// The xenstore error name, when the daemon sent one.
    pub fn xs(&self) -> Option<XsError> {
        match self {
            Error::Xen(e) => Some(*e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for e in XsError::ALL {
            assert_eq!(XsError::from_name(e.name()), Some(e));
        }
        assert_eq!(XsError::Eagain.name(), "EAGAIN");
        assert_eq!(XsError::Eagain.errno(), 11);
        assert_eq!(XsError::Eperm.errno(), 1);
        assert_eq!(XsError::from_name("EWHAT"), None);
    }
}
