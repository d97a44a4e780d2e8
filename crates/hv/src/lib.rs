//! pvio's hypervisor services: what Xen provides to a split-driver I/O
//! stack, as a daemon and a client library.
//!
//! * **Domains.** A domain is a process registered with hvd; domain 0 is the
//!   host's own processes. Its RAM is a sealed memfd that hvd hands out.
//! * **Grant tables (v1).** A domain grants pages in its own grant-table
//!   memfd; hvd validates and pins them for a privileged mapper, with Xen's
//!   flags (`GTF_readonly`, `GTF_reading`, `GTF_writing`) and limits.
//! * **Event channels.** Ports with Xen's alloc-unbound / bind-interdomain /
//!   close semantics and per-domain limits; a notification is one write to an
//!   eventfd, with no round trip through hvd.
//! * **Clean-up.** When a process exits or crashes, its connection closes and
//!   hvd releases everything it held; peers see closed ports.
//!
//! This crate must never trust what a guest sends (every request is decoded
//! and validated once by [`proto::Request::decode`]) and never panics on
//! input. Raw pointers to shared memory stay in [`memory`] and [`grant`].

pub mod client;
pub mod daemon;
pub mod error;
pub mod evtchn;
pub mod grant;
pub mod memory;
pub mod proto;
pub mod sys;

pub use client::{CreatedDomain, GuestDomain, HvClient, MappedGrant};
pub use error::{ErrorCode, GrantFailure, HvError};
pub use evtchn::EventChannel;
pub use memory::{ForeignMemory, FrameMapping, Gfn, GuestMemory, Mapping};
