//! What runs inside a pvio guest domain: workloads that exercise its virtual
//! devices through their frontends.
//!
//! * [`job`]: an fio-like job runner with end-to-end data verification;
//! * [`nbd`]: an NBD export of a disk over a Unix socket, so that standard
//!   tools (qemu-img, qemu-io, nbdinfo, nbdcopy) can use it;
//! * [`testing`]: a block device that misbehaves on purpose, for tests;
//! * [`domain`]: the `pvio guest` process that ties a domain, its disks'
//!   frontends and one workload together.
//!
//! This crate owns the workloads, never the devices: it talks to disks only
//! through [`pvio_blk::device::BlockDevice`].

pub mod domain;
pub mod job;
pub mod nbd;
pub mod testing;
