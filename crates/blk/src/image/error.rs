//! Errors of the image layer; each names the file it is about.

use std::path::PathBuf;

/// Why an image could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The file does not exist.
    #[error("image {path:?} does not exist")]
    NotFound { path: PathBuf },
    /// The file exists but may not be opened as asked.
    #[error("permission denied opening image {path:?} {}", if *.writable { "read-write" } else { "read-only" })]
    PermissionDenied { path: PathBuf, writable: bool },
    /// Not a regular file or block device.
    #[error("image {path:?} is not a regular file or a block device")]
    NotAFileOrDevice { path: PathBuf },
    /// The file's size cannot be a disk's.
    #[error("image {path:?} has an unusable size of {size} bytes: {reason}")]
    BadSize {
        path: PathBuf,
        size: u64,
        reason: String,
    },
    /// The file's size differs from what the caller expected.
    #[error("image {path:?} is {actual} bytes, expected {expected}")]
    SizeMismatch {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },
    /// `O_DIRECT` was required but the filesystem refuses it.
    #[error("image {path:?}: the filesystem does not support O_DIRECT")]
    DirectIoUnsupported { path: PathBuf },
    /// A write or discard on an image opened read-only.
    #[error("image {path:?} is read-only")]
    ReadOnly { path: PathBuf },
    /// A range outside the image.
    #[error("range {offset}+{len} is outside the image's {size} bytes")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    /// A system call failed.
    #[error("{op} on image {path:?} failed: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl ImageError {
    /// An [`ImageError::Io`] for `op` on `path`.
    pub fn io(path: &std::path::Path, op: &'static str, source: std::io::Error) -> Self {
        ImageError::Io {
            path: path.to_owned(),
            op,
            source,
        }
    }
}
