//! Front and back endpoints of Xen's generic shared ring (`io/ring.h`).
//!
//! This crate owns the ring protocol between a frontend and a backend over
//! a region of shared memory: `SHARED_RING_INIT` and the attach macros, the
//! counting and overflow checks, pushing with notification hold-off
//! (`req_event`/`rsp_event`), the final check before sleeping, and copying
//! each entry out of shared memory exactly once. Wire layouts come from
//! `pvio-abi`; the protocol logic lives in [`protocol`], generic over how the
//! four shared indices are reached, so that the loom model check runs the
//! same code as the shared-memory rings.
//!
//! It must never trust the peer: whatever the other side writes, no call
//! panics, loops without bound or touches memory outside the region; an
//! impossible index breaks the endpoint for good ([`RingError::Broken`]).
//! It never allocates, makes a system call or blocks on the push/take/check
//! path, and it never notifies or sleeps itself: event channels belong to
//! the caller, who acts on the booleans the protocol returns. All raw
//! memory access, and all `unsafe`, is in the `shm` module.
//!
//! ```
//! use std::sync::Arc;
//! use pvio_abi::blkif::{Blkif, BlkifRequest, BlkifResponse};
//! use pvio_ring::{AnonRingMemory, BackRing, FrontRing};
//!
//! let mem = Arc::new(AnonRingMemory::new(1));
//! let mut front = FrontRing::<Blkif, _>::init(mem.clone())?;
//! let mut back = BackRing::<Blkif, _>::attach(mem)?;
//! assert_eq!(front.size(), 32);
//!
//! front.push_request(&BlkifRequest { id: 7, ..Default::default() })?;
//! // SHARED_RING_INIT set req_event = 1: the first request notifies.
//! assert!(front.push_requests_and_check_notify());
//!
//! while let Some(req) = back.take_request()? {
//!     back.push_response(&BlkifResponse { id: req.id, ..Default::default() })?;
//! }
//! let notify_front = back.push_responses_and_check_notify();
//! assert!(notify_front);
//! // Nothing more to do: safe to sleep until the frontend notifies.
//! assert!(!back.final_check_for_requests()?);
//!
//! assert_eq!(front.take_response()?.map(|r| r.id), Some(7));
//! assert!(!front.final_check_for_responses()?);
//! # Ok::<(), pvio_ring::RingError>(())
//! ```

#![deny(unsafe_code)]

mod back;
mod error;
mod front;
pub mod layout;
pub mod protocol;
mod raw;
#[allow(unsafe_code)]
mod shm;

pub use back::BackRing;
pub use error::{Peer, RingError, Violation, ViolationKind};
pub use front::FrontRing;
pub use protocol::SharedIndex;
pub use raw::RawRing;
pub use shm::{AnonRingMemory, GuestPages, RawAccessError, RingMemory, ShmIndices};

pub use pvio_abi::ring::{RingIdx, RingProtocol};
