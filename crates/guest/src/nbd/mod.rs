//! An NBD export of a [`BlockDevice`](pvio_blk::device::BlockDevice) over a
//! Unix socket, so that standard clients (tested: qemu-img, qemu-io,
//! nbdinfo, nbdcopy, fio's `nbd` engine, with `nbd+unix:///NAME?socket=PATH`
//! URIs) can use a pvio virtual disk.
//!
//! It speaks the protocol of the NetworkBlockDevice project's
//! `doc/proto.md`: fixed newstyle negotiation ([`handshake`]) with
//! `EXPORT_NAME`, `GO`, `INFO`, `LIST`, `ABORT`, `STRUCTURED_REPLY` and the
//! `base:allocation` metadata context (`LIST_META_CONTEXT`,
//! `SET_META_CONTEXT`) when the device answers block status; the commands
//! `READ`, `WRITE` (with `FUA`), `FLUSH`, `TRIM`, `WRITE_ZEROES` (with and
//! without `NO_HOLE`), `BLOCK_STATUS` (with `REQ_ONE`) and `DISC`,
//! validated in one place ([`request`]) and run with many device requests
//! in flight (`exec.rs`). One client is served at a time; others are
//! refused with a message ([`NbdServer`]).
//!
//! A client is untrusted: garbage, oversize lengths and vanishing clients
//! end in an error reply or a closed connection, never a panic or a hang.
//!
//! ```no_run
//! use pvio_blk::device::MemDevice;
//! use pvio_guest::nbd::{NbdConfig, NbdServer};
//!
//! let disk = MemDevice::new(64 << 20, 32, 64 * 1024);
//! let server = NbdServer::start("/tmp/disk.sock", disk, NbdConfig::default())?;
//! // Now: qemu-img info 'nbd+unix:///?socket=/tmp/disk.sock'
//! let disk = server.shutdown()?;
//! # Ok::<(), pvio_guest::nbd::NbdError>(())
//! ```

pub mod defs;
mod error;
mod exec;
pub mod handshake;
pub mod request;
mod server;
mod session;
mod stats;
mod wire;

pub use error::NbdError;
pub use handshake::Export;
pub use server::{NbdConfig, NbdServer};
pub use stats::{NbdStats, NbdStatsSnapshot};
