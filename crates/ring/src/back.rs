//! The backend endpoint of a shared ring: takes requests, pushes responses.

use core::fmt;

use pvio_abi::ring::{RingIdx, RingProtocol};

use crate::error::{RingError, Violation};
use crate::protocol::BackCore;
use crate::shm::{Mapping, RingMemory};

/// The backend of a ring of protocol `P` in memory `M` (`name_back_ring`).
///
/// The loop is blkback's: [`take_request`](Self::take_request) until it
/// returns `Ok(None)` (each request is copied out of shared memory once, and
/// only that copy may be validated and used), answer with
/// [`push_response`](Self::push_response), publish with
/// [`push_responses_and_check_notify`](Self::push_responses_and_check_notify)
/// (notify the frontend when it returns true), then sleep only if
/// [`final_check_for_requests`](Self::final_check_for_requests) returns
/// `Ok(false)` (or, while it still has requests in flight, until their
/// completion). `NoRequestToAnswer` is a bug in the caller; any other error
/// means the frontend is hostile: stop serving the ring and tear it down.
pub struct BackRing<P: RingProtocol, M: RingMemory> {
    map: Mapping<P, M>,
    core: BackCore,
}

impl<P: RingProtocol, M: RingMemory> BackRing<P, M> {
    /// `BACK_RING_ATTACH` at the current `rsp_prod`, refusing a ring whose
    /// `req_prod - rsp_prod` exceeds its size.
    pub fn attach(mem: M) -> Result<Self, RingError> {
        let map = Mapping::new(mem)?;
        let core = BackCore::attach(&map.indices(), map.size(), P::NAME)?;
        Ok(Self { map, core })
    }

    /// `RING_SIZE`: the number of slots.
    pub fn size(&self) -> u32 {
        self.core.size()
    }

    /// The index of the next request to take.
    pub fn req_cons(&self) -> RingIdx {
        self.core.req_cons()
    }

    /// The index the next response will be written at.
    pub fn rsp_prod_pvt(&self) -> RingIdx {
        self.core.rsp_prod_pvt()
    }

    /// Requests taken and not answered yet.
    pub fn unanswered(&self) -> u32 {
        self.core.unanswered()
    }

    /// The hostile index that broke this ring, if any.
    pub fn broken(&self) -> Option<&Violation> {
        self.core.broken()
    }

    /// Copies the next request out of the ring, once, if one is published
    /// and a slot is free for its response. An impossible `req_prod` breaks
    /// the ring.
    #[inline]
    pub fn take_request(&mut self) -> Result<Option<P::Request>, RingError> {
        let map = &self.map;
        self.core
            .take_request(&map.indices(), |idx| map.read_request(idx))
    }

    /// Writes `rsp` into the slot at `rsp_prod_pvt`, answering the oldest
    /// request taken and not answered. The frontend sees it only after the
    /// next push. Build `rsp` from a zeroed value so no stale data leaks.
    #[inline]
    pub fn push_response(&mut self, rsp: &P::Response) -> Result<(), RingError> {
        let map = &self.map;
        self.core.push_response(|idx| map.write_response(idx, rsp))
    }

    /// `RING_PUSH_RESPONSES`: publishes the pushed responses, never notifies.
    #[inline]
    pub fn push_responses(&mut self) {
        self.core.push_responses(&self.map.indices())
    }

    /// `RING_PUSH_RESPONSES_AND_CHECK_NOTIFY`: publishes the pushed responses
    /// and returns true if the frontend must be notified.
    #[inline]
    pub fn push_responses_and_check_notify(&mut self) -> bool {
        self.core
            .push_responses_and_check_notify(&self.map.indices())
    }

    /// `RING_HAS_UNCONSUMED_REQUESTS` (a hint: validation happens in
    /// `take_request`). False on a broken ring.
    #[inline]
    pub fn has_unconsumed_requests(&self) -> bool {
        self.core.has_unconsumed_requests(&self.map.indices())
    }

    /// `RING_FINAL_CHECK_FOR_REQUESTS`: `Ok(false)` means it is safe to
    /// sleep until the frontend notifies. Requests are counted only while a
    /// slot is free for their response (see [`BackCore::final_check_for_requests`]).
    ///
    /// [`BackCore::final_check_for_requests`]: crate::protocol::BackCore::final_check_for_requests
    pub fn final_check_for_requests(&mut self) -> Result<bool, RingError> {
        self.core.final_check_for_requests(&self.map.indices())
    }

    /// Sets `req_event` (and fences) for a custom final check; look for
    /// requests again before sleeping.
    pub fn set_req_event(&mut self, event: RingIdx) {
        self.core.set_req_event(&self.map.indices(), event)
    }

    /// The ring's memory.
    pub fn memory(&self) -> &M {
        self.map.memory()
    }

    /// Gives the memory back, e.g. to unmap it.
    pub fn into_memory(self) -> M {
        self.map.into_memory()
    }
}

impl<P: RingProtocol, M: RingMemory> fmt::Debug for BackRing<P, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackRing")
            .field("protocol", &P::NAME)
            .field("core", &self.core)
            .field("shared", &self.map.indices())
            .finish()
    }
}
