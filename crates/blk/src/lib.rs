//! The block datapath of pvio, like Xen's blkfront, blkback and tapdisk3.
//!
//! It owns the validation of blkif requests coming from an untrusted
//! frontend ([`request`]), the image formats behind a virtual disk
//! ([`image`]), the I/O engines that move data between guest memory and
//! images ([`engine`]), request splitting ([`split`]), the backend
//! (`pvio tapdisk`, [`back`]), the frontend ([`front`]), and the
//! [`device::BlockDevice`] interface through which guest workloads use a
//! disk.
//!
//! It must never act on a guest-controlled value it has not copied out of
//! shared memory and validated, and never acknowledge a write before the
//! image layer has it.

pub mod back;
pub mod device;
pub mod engine;
pub mod front;
pub mod image;
pub mod request;
pub mod split;
pub mod xenbus_keys;
