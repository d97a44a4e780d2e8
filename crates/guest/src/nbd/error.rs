//! The NBD server's errors. Errors of one request are NBD error replies,
//! not these; these end a session or the server.

/// Why a session or the server stopped.
#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    /// The socket could not be created.
    #[error("cannot listen on {path}: {source}")]
    Bind {
        path: String,
        source: std::io::Error,
    },
    /// Socket I/O failed.
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
    /// The client broke the protocol; the session was ended.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The device stopped completing requests or failed as a whole.
    #[error("device: {0}")]
    Device(String),
    /// A server thread panicked; the device is lost.
    #[error("a server thread panicked")]
    Panicked,
}
