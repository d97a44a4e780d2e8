//! The job runner's errors: a bad spec, a spec that does not fit the device,
//! a device that failed the job as a whole, and a bad acknowledged-writes
//! file. Failed I/Os and verify failures are not errors: they are counted in
//! the report.

use pvio_blk::device::DeviceError;

/// A job spec that cannot be parsed or makes no sense on its own.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// A `key=value` item without `=`.
    #[error("{0:?} is not key=value")]
    NotKeyValue(String),
    /// A key the job runner does not know.
    #[error("unknown job key {0:?}")]
    UnknownKey(String),
    /// A value that does not parse.
    #[error("bad {key} {value:?}: expected {expected}")]
    BadValue {
        key: &'static str,
        value: String,
        expected: &'static str,
    },
    /// Values that parse but do not fit together.
    #[error("{0}")]
    Invalid(String),
}

/// Why a job could not run, or stopped as a whole.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The spec does not fit this device (block size, range, buffers).
    #[error("job {job}: {reason}")]
    Geometry { job: u32, reason: String },
    /// The caller's factory could not make a device for a job.
    #[error("job {job}: could not open its device: {source}")]
    Factory {
        job: u32,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The device refused a request in a way that retrying cannot fix.
    #[error("job {job}: the device failed: {source}")]
    Device { job: u32, source: DeviceError },
    /// Saving or loading the map of acknowledged writes failed.
    #[error("job {job}: {source}")]
    AckMap { job: u32, source: AckMapError },
    /// A job's thread panicked.
    #[error("job {0} panicked")]
    Panicked(u32),
}

/// A map of acknowledged writes that cannot be saved or loaded.
#[derive(Debug, thiserror::Error)]
pub enum AckMapError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("not a map of acknowledged writes: {0}")]
    Format(String),
}
