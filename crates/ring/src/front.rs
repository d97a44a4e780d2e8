//! The frontend endpoint of a shared ring: pushes requests, takes responses.

use core::fmt;

use pvio_abi::ring::{RingIdx, RingProtocol};

use crate::error::{RingError, Violation};
use crate::protocol::FrontCore;
use crate::shm::{Mapping, RingMemory};

/// The frontend of a ring of protocol `P` in memory `M` (`name_front_ring`).
///
/// Requests are written with [`push_request`](Self::push_request) and
/// published with [`push_requests_and_check_notify`](Self::push_requests_and_check_notify)
/// (notify the backend's event channel when it returns true). Responses are
/// copied out with [`take_response`](Self::take_response); before sleeping,
/// run [`final_check_for_responses`](Self::final_check_for_responses) and
/// sleep only if it returns `Ok(false)`.
pub struct FrontRing<P: RingProtocol, M: RingMemory> {
    map: Mapping<P, M>,
    core: FrontCore,
}

impl<P: RingProtocol, M: RingMemory> FrontRing<P, M> {
    /// `XEN_FRONT_RING_INIT`: initialises the shared header
    /// (`SHARED_RING_INIT`) and the frontend at index 0.
    pub fn init(mem: M) -> Result<Self, RingError> {
        let map = Mapping::new(mem)?;
        map.zero_header_padding();
        let core = FrontCore::init(&map.indices(), map.size(), P::NAME)?;
        Ok(Self { map, core })
    }

    /// `FRONT_RING_ATTACH` to a ring already in use, resuming at its current
    /// indices (see [`FrontCore::attach`]).
    pub fn attach(mem: M) -> Result<Self, RingError> {
        let map = Mapping::new(mem)?;
        let core = FrontCore::attach(&map.indices(), map.size(), P::NAME)?;
        Ok(Self { map, core })
    }

    /// `RING_SIZE`: the number of slots.
    pub fn size(&self) -> u32 {
        self.core.size()
    }

    /// `RING_FREE_REQUESTS`.
    pub fn free_requests(&self) -> u32 {
        self.core.free_requests()
    }

    /// `RING_FULL`.
    pub fn is_full(&self) -> bool {
        self.core.is_full()
    }

    /// The index the next request will be written at.
    pub fn req_prod_pvt(&self) -> RingIdx {
        self.core.req_prod_pvt()
    }

    /// The index of the next response to take.
    pub fn rsp_cons(&self) -> RingIdx {
        self.core.rsp_cons()
    }

    /// The hostile index that broke this ring, if any.
    pub fn broken(&self) -> Option<&Violation> {
        self.core.broken()
    }

    /// Writes `req` into the slot at `req_prod_pvt` and advances it. The
    /// backend sees it only after the next push. Fails if the ring is full
    /// or broken.
    #[inline]
    pub fn push_request(&mut self, req: &P::Request) -> Result<(), RingError> {
        let map = &self.map;
        self.core.push_request(|idx| map.write_request(idx, req))
    }

    /// `RING_PUSH_REQUESTS`: publishes the pushed requests, never notifies.
    #[inline]
    pub fn push_requests(&mut self) {
        self.core.push_requests(&self.map.indices())
    }

    /// `RING_PUSH_REQUESTS_AND_CHECK_NOTIFY`: publishes the pushed requests
    /// and returns true if the backend must be notified.
    #[inline]
    pub fn push_requests_and_check_notify(&mut self) -> bool {
        self.core
            .push_requests_and_check_notify(&self.map.indices())
    }

    /// Copies the next response out of the ring, once, if one is published.
    /// An impossible `rsp_prod` breaks the ring.
    #[inline]
    pub fn take_response(&mut self) -> Result<Option<P::Response>, RingError> {
        let map = &self.map;
        self.core
            .take_response(&map.indices(), |idx| map.read_response(idx))
    }

    /// `RING_HAS_UNCONSUMED_RESPONSES` (a hint: validation happens in
    /// `take_response`). False on a broken ring.
    #[inline]
    pub fn has_unconsumed_responses(&self) -> bool {
        self.core.has_unconsumed_responses(&self.map.indices())
    }

    /// `RING_FINAL_CHECK_FOR_RESPONSES`: `Ok(false)` means it is safe to
    /// sleep until the backend notifies.
    pub fn final_check_for_responses(&mut self) -> Result<bool, RingError> {
        self.core.final_check_for_responses(&self.map.indices())
    }

    /// Sets `rsp_event` (and fences) for a custom final check; look for
    /// responses again before sleeping.
    pub fn set_rsp_event(&mut self, event: RingIdx) {
        self.core.set_rsp_event(&self.map.indices(), event)
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

impl<P: RingProtocol, M: RingMemory> fmt::Debug for FrontRing<P, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrontRing")
            .field("protocol", &P::NAME)
            .field("core", &self.core)
            .field("shared", &self.map.indices())
            .finish()
    }
}
