//! The xenstore of a pvio host: Xen's wire protocol (`io/xs_wire.h`), the
//! store (node tree, permissions, transactions, watches, quotas, domain
//! bookkeeping) with C xenstored 4.17's semantics, the `pvio xenstored`
//! daemon, and the async client and xenbus helpers every other pvio crate
//! uses to coordinate backends, frontends and the toolstack.
//!
//! This crate owns everything that interprets xenstore bytes. Everything a
//! client sends is untrusted: it is parsed once ([`codec::parse_request`])
//! into a validated [`codec::Request`], bad input gets a Xen error name or,
//! for a framing violation, a disconnect of that connection only. The
//! daemon must never panic on input, never let one connection starve the
//! others, never queue unbounded output for a client that does not read,
//! and never hold a global lock across a transaction. The store never does
//! I/O; transports (the Unix socket, guests' xenbus rings through hvd) only
//! move bytes and carry an [`store::Identity`]. A guest's ring page is read
//! and written only by [`ring`], by atomic and volatile copies.

pub mod client;
pub mod codec;
pub mod daemon;
pub mod error;
pub mod path;
pub mod perms;
pub mod ring;
pub mod store;
pub mod xenbus;

pub use client::{Client, Transaction, WatchEvent, Watcher};
pub use error::{Error, XsError};
pub use perms::{Access, Perm, Perms};
pub use store::{ConnId, Identity, Store};
