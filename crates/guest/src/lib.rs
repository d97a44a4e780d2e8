//! What runs inside a pvio guest domain: workloads that exercise its virtual
//! devices through their frontends.
//!
//! This crate owns the workloads, never the devices: it talks to disks only
//! through [`pvio_blk::device::BlockDevice`].
