//! The crate's one error type, and the description of a hostile index.
//!
//! Every message names the indices involved, so that a log line alone tells
//! which side of which ring misbehaved and by how much.

use core::fmt;

use pvio_abi::ring::RingIdx;

/// The end of a ring that wrote an index found to be impossible.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// The frontend (writer of `req_prod` and `rsp_event`).
    Frontend,
    /// The backend (writer of `rsp_prod` and `req_event`).
    Backend,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Peer::Frontend => "frontend",
            Peer::Backend => "backend",
        })
    }
}

/// Why a shared index read from the peer cannot be right.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViolationKind {
    /// `prod - cons` exceeds the ring size: `RING_REQUEST_PROD_OVERFLOW` or
    /// `RING_RESPONSE_PROD_OVERFLOW`, or the attach-time check of Linux
    /// blkback's `xen_blkif_map`.
    PastRingSize,
    /// The backend published more responses than the frontend published
    /// requests: it answered requests that do not exist.
    PastRequests,
    /// A producer index moved backwards, behind entries already consumed.
    Backwards,
}

/// A shared index that the peer cannot legitimately have written.
///
/// `prod` is the value read from shared memory, `cons` the private index it
/// was measured from; a well-behaved peer keeps `prod - cons` (modulo 2^32)
/// within `limit`, which is at most `size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The protocol name (`RingProtocol::NAME`), e.g. `"blkif"`.
    pub ring: &'static str,
    /// The side held responsible.
    pub peer: Peer,
    /// What is wrong with the index.
    pub kind: ViolationKind,
    /// Name of the shared index that was read, e.g. `"req_prod"`.
    pub index: &'static str,
    /// The value read.
    pub prod: RingIdx,
    /// Name of the index it was measured from, e.g. `"rsp_prod_pvt"`.
    pub cons_name: &'static str,
    /// The value of that index.
    pub cons: RingIdx,
    /// The largest distance a well-behaved peer can produce.
    pub limit: u32,
    /// Number of slots in the ring.
    pub size: u32,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ahead = self.prod.wrapping_sub(self.cons);
        match self.kind {
            ViolationKind::PastRingSize => write!(
                f,
                "{} ring: {} = {} is {} past {} = {}, more than the ring's {} slots (bad {})",
                self.ring,
                self.index,
                self.prod,
                ahead,
                self.cons_name,
                self.cons,
                self.size,
                self.peer
            ),
            ViolationKind::PastRequests => write!(
                f,
                "{} ring: {} = {} is {} past {} = {}, but only {} requests are outstanding \
                 (ring size {}, bad {})",
                self.ring,
                self.index,
                self.prod,
                ahead,
                self.cons_name,
                self.cons,
                self.limit,
                self.size,
                self.peer
            ),
            ViolationKind::Backwards => write!(
                f,
                "{} ring: {} moved back to {}, {} behind {} = {} (ring size {}, bad {})",
                self.ring,
                self.index,
                self.prod,
                self.cons.wrapping_sub(self.prod),
                self.cons_name,
                self.cons,
                self.size,
                self.peer
            ),
        }
    }
}

/// Everything that can go wrong on a ring endpoint.
///
/// `HostileProducer` and `HostileConsumer` are returned once, by the call
/// that detected the bad index; from then on the endpoint is broken and every
/// call returns [`RingError::Broken`] with the same [`Violation`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// The region cannot hold the ring header and one slot.
    #[error("ring region of {len} bytes is too small: a {ring} ring needs at least {min} bytes")]
    RegionTooSmall {
        ring: &'static str,
        len: usize,
        min: usize,
    },
    /// The region is not a whole number of 4 KiB Xen pages.
    #[error("ring region of {len} bytes is not a whole number of 4096-byte pages")]
    RegionNotPageMultiple { len: usize },
    /// Rings are 1, 2, 4, 8 or 16 pages (`ring-page-order` 0 to 4).
    #[error("ring region of {pages} pages: a ring has 1, 2, 4, 8 or 16 pages")]
    UnsupportedPageCount { pages: usize },
    /// The region does not start on a 4 KiB boundary.
    #[error("ring region at {addr:#x} is not aligned to 4096 bytes")]
    RegionMisaligned { addr: usize },
    /// A ring size that is not a power of two (only the index-level core
    /// can be handed one).
    #[error("{ring} ring size {size} is not a power of two")]
    InvalidRingSize { ring: &'static str, size: u32 },
    /// `RING_FULL`: every slot holds a request whose response is not consumed.
    #[error(
        "{ring} ring is full: {size} requests outstanding \
         (req_prod_pvt {req_prod_pvt}, rsp_cons {rsp_cons})"
    )]
    Full {
        ring: &'static str,
        size: u32,
        req_prod_pvt: RingIdx,
        rsp_cons: RingIdx,
    },
    /// A response was pushed with no consumed request left to answer.
    #[error(
        "{ring} ring: no consumed request is waiting for a response \
         (rsp_prod_pvt {rsp_prod_pvt} = req_cons {req_cons})"
    )]
    NoRequestToAnswer {
        ring: &'static str,
        rsp_prod_pvt: RingIdx,
        req_cons: RingIdx,
    },
    /// The peer, as producer, published an impossible producer index.
    #[error("hostile producer: {0}")]
    HostileProducer(Violation),
    /// The peer, as consumer, claims to have consumed entries that were
    /// never produced.
    #[error("hostile consumer: {0}")]
    HostileConsumer(Violation),
    /// A hostile index was detected earlier; the ring must be torn down.
    #[error("ring broken, tear it down: {0}")]
    Broken(Violation),
}

impl RingError {
    /// The hostile index behind this error, if it is one.
    pub fn violation(&self) -> Option<&Violation> {
        match self {
            RingError::HostileProducer(v)
            | RingError::HostileConsumer(v)
            | RingError::Broken(v) => Some(v),
            _ => None,
        }
    }
}

/// How a [`Violation`] is reported the first time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Blame {
    Producer,
    Consumer,
}

impl Blame {
    pub(crate) fn error(self, v: Violation) -> RingError {
        match self {
            Blame::Producer => RingError::HostileProducer(v),
            Blame::Consumer => RingError::HostileConsumer(v),
        }
    }
}
