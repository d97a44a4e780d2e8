//! The frontend half of the protocol: `FRONT_RING_*`, `RING_PUSH_REQUESTS*`
//! and `RING_FINAL_CHECK_FOR_RESPONSES`.

use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use pvio_abi::ring::RingIdx;

use super::arith;
use super::{SharedIndex, SharedIndices};
use crate::error::{Blame, Peer, RingError, Violation, ViolationKind};

/// The frontend's private state (`struct name_front_ring` without the
/// pointer) and the protocol steps that use it.
///
/// Besides the macro's `req_prod_pvt` and `rsp_cons` it keeps two private
/// copies: the last `req_prod` it published, so that neither the
/// notification decision nor the response check depends on a value the
/// backend could have overwritten, and the last validated `rsp_prod`, so that
/// shared memory is read once per batch of responses.
#[derive(Clone, Debug)]
pub struct FrontCore {
    ring: &'static str,
    size: u32,
    req_prod_pvt: RingIdx,
    req_prod_published: RingIdx,
    rsp_cons: RingIdx,
    rsp_prod_seen: RingIdx,
    broken: Option<Violation>,
}

impl FrontCore {
    /// `SHARED_RING_INIT` (the indices; the caller zeroes the padding) and
    /// `FRONT_RING_INIT`.
    pub fn init<I: SharedIndices>(
        ix: &I,
        size: u32,
        ring: &'static str,
    ) -> Result<Self, RingError> {
        check_size(size, ring)?;
        // Relaxed: nobody else may look at the ring until the frontend hands
        // it over (xenstore, fd passing, thread spawn), which synchronises.
        ix.store(SharedIndex::ReqProd, 0, Relaxed);
        ix.store(SharedIndex::RspProd, 0, Relaxed);
        ix.store(SharedIndex::ReqEvent, 1, Relaxed);
        ix.store(SharedIndex::RspEvent, 1, Relaxed);
        Ok(Self::at(size, ring, 0, 0))
    }

    /// `FRONT_RING_ATTACH` to a ring that is already in use.
    ///
    /// Consumption resumes at the current `rsp_prod`. Unlike the macro,
    /// which would also move `req_prod_pvt` back to `rsp_prod` and so make
    /// the next push move `req_prod` backwards, requests already published
    /// stay outstanding and are answered normally; on a quiescent ring
    /// (`req_prod == rsp_prod`) the two are the same. A ring whose
    /// `req_prod - rsp_prod` exceeds its size is refused: its backend
    /// answered requests that were never made.
    pub fn attach<I: SharedIndices>(
        ix: &I,
        size: u32,
        ring: &'static str,
    ) -> Result<Self, RingError> {
        check_size(size, ring)?;
        let req_prod = ix.load(SharedIndex::ReqProd, Acquire);
        let rsp_prod = ix.load(SharedIndex::RspProd, Acquire);
        if req_prod.wrapping_sub(rsp_prod) > size {
            return Err(RingError::HostileConsumer(Violation {
                ring,
                peer: Peer::Backend,
                kind: ViolationKind::PastRingSize,
                index: "req_prod",
                prod: req_prod,
                cons_name: "rsp_prod",
                cons: rsp_prod,
                limit: size,
                size,
            }));
        }
        Ok(Self::at(size, ring, req_prod, rsp_prod))
    }

    fn at(size: u32, ring: &'static str, req_prod: RingIdx, rsp_prod: RingIdx) -> Self {
        Self {
            ring,
            size,
            req_prod_pvt: req_prod,
            req_prod_published: req_prod,
            rsp_cons: rsp_prod,
            rsp_prod_seen: rsp_prod,
            broken: None,
        }
    }

    /// `RING_SIZE`.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// `RING_FREE_REQUESTS`.
    pub fn free_requests(&self) -> u32 {
        arith::free_requests(self.size, self.req_prod_pvt, self.rsp_cons)
    }

    /// `RING_FULL`.
    pub fn is_full(&self) -> bool {
        self.free_requests() == 0
    }

    /// The index the next request will be written at.
    pub fn req_prod_pvt(&self) -> RingIdx {
        self.req_prod_pvt
    }

    /// The index of the next response to consume.
    pub fn rsp_cons(&self) -> RingIdx {
        self.rsp_cons
    }

    /// The hostile index that broke this endpoint, if any.
    pub fn broken(&self) -> Option<&Violation> {
        self.broken.as_ref()
    }

    /// Claims the slot at `req_prod_pvt`, lets `write` fill it (it receives
    /// the free-running index), then advances `req_prod_pvt`. The request is
    /// not visible to the backend until the next push.
    #[inline]
    pub fn push_request(&mut self, write: impl FnOnce(RingIdx)) -> Result<(), RingError> {
        self.check_broken()?;
        if self.is_full() {
            return Err(RingError::Full {
                ring: self.ring,
                size: self.size,
                req_prod_pvt: self.req_prod_pvt,
                rsp_cons: self.rsp_cons,
            });
        }
        write(self.req_prod_pvt);
        self.req_prod_pvt = self.req_prod_pvt.wrapping_add(1);
        Ok(())
    }

    /// `RING_PUSH_REQUESTS`: publish without deciding on a notification.
    /// Does nothing on a broken ring.
    #[inline]
    pub fn push_requests<I: SharedIndices>(&mut self, ix: &I) {
        if self.broken.is_some() {
            return;
        }
        // wmb: the slots are visible before the index that covers them.
        ix.store(SharedIndex::ReqProd, self.req_prod_pvt, Release);
        self.req_prod_published = self.req_prod_pvt;
    }

    /// `RING_PUSH_REQUESTS_AND_CHECK_NOTIFY`: publish, then tell whether the
    /// backend asked (through `req_event`) to be notified of these requests.
    /// False on a broken ring.
    #[inline]
    pub fn push_requests_and_check_notify<I: SharedIndices>(&mut self, ix: &I) -> bool {
        if self.broken.is_some() {
            return false;
        }
        let old = self.req_prod_published;
        let new = self.req_prod_pvt;
        if old == new {
            // The macro would store the same value, fence, and find the
            // event outside the empty window (old, new]: the answer is no.
            return false;
        }
        ix.store(SharedIndex::ReqProd, new, Release);
        self.req_prod_published = new;
        // mb: the new req_prod must be visible before req_event is read, or
        // a backend going to sleep and this push can miss each other.
        ix.full_fence();
        let event = ix.load(SharedIndex::ReqEvent, Relaxed);
        arith::need_notify(old, new, event)
    }

    /// Takes the next response, if the backend has published one: `read`
    /// receives its free-running index and must copy the slot exactly once.
    ///
    /// `rsp_prod` is read (with acquire) only when every response of the
    /// previous read is consumed, and checked with
    /// `RING_RESPONSE_PROD_OVERFLOW` and against the requests published.
    #[inline]
    pub fn take_response<I: SharedIndices, R>(
        &mut self,
        ix: &I,
        read: impl FnOnce(RingIdx) -> R,
    ) -> Result<Option<R>, RingError> {
        self.check_broken()?;
        if self.rsp_cons == self.rsp_prod_seen {
            self.refresh_rsp_prod(ix)?;
            if self.rsp_cons == self.rsp_prod_seen {
                return Ok(None);
            }
        }
        let value = read(self.rsp_cons);
        self.rsp_cons = self.rsp_cons.wrapping_add(1);
        Ok(Some(value))
    }

    /// `RING_HAS_UNCONSUMED_RESPONSES`, unvalidated: a hint for pollers.
    /// If true, `take_response` returns a response or an error unless the
    /// backend moves `rsp_prod` back in between. False on a broken ring.
    #[inline]
    pub fn has_unconsumed_responses<I: SharedIndices>(&self, ix: &I) -> bool {
        if self.broken.is_some() {
            return false;
        }
        if self.rsp_cons != self.rsp_prod_seen {
            return true;
        }
        ix.load(SharedIndex::RspProd, Acquire) != self.rsp_cons
    }

    /// `RING_FINAL_CHECK_FOR_RESPONSES`: before sleeping, ask for a
    /// notification on the very next response and look once more. `Ok(true)`
    /// means a response is ready and the caller must not sleep; `Ok(false)`
    /// means any later response will be notified.
    pub fn final_check_for_responses<I: SharedIndices>(
        &mut self,
        ix: &I,
    ) -> Result<bool, RingError> {
        self.check_broken()?;
        if self.unconsumed_responses(ix)? > 0 {
            return Ok(true);
        }
        ix.store(
            SharedIndex::RspEvent,
            self.rsp_cons.wrapping_add(1),
            Relaxed,
        );
        // mb: rsp_event must be visible before rsp_prod is read again (see
        // push_requests_and_check_notify, which is the other half).
        ix.full_fence();
        Ok(self.unconsumed_responses(ix)? > 0)
    }

    /// Sets `rsp_event` for a custom final check (notify only after several
    /// responses, or never while polling) and fences. The caller must look
    /// for responses again before it sleeps.
    /// Does nothing on a broken ring.
    pub fn set_rsp_event<I: SharedIndices>(&mut self, ix: &I, event: RingIdx) {
        if self.broken.is_some() {
            return;
        }
        ix.store(SharedIndex::RspEvent, event, Relaxed);
        ix.full_fence();
    }

    fn unconsumed_responses<I: SharedIndices>(&mut self, ix: &I) -> Result<u32, RingError> {
        if self.rsp_cons == self.rsp_prod_seen {
            self.refresh_rsp_prod(ix)?;
        }
        Ok(arith::unconsumed_responses(
            self.rsp_prod_seen,
            self.rsp_cons,
        ))
    }

    /// Reads `rsp_prod` once and accepts it only if a backend could have
    /// written it; otherwise marks the endpoint broken.
    fn refresh_rsp_prod<I: SharedIndices>(&mut self, ix: &I) -> Result<(), RingError> {
        // rmb: the responses are read after the index that covers them.
        let prod = ix.load(SharedIndex::RspProd, Acquire);
        let outstanding = self.req_prod_published.wrapping_sub(self.rsp_cons);
        let violation = |kind, limit| Violation {
            ring: self.ring,
            peer: Peer::Backend,
            kind,
            index: "rsp_prod",
            prod,
            cons_name: "rsp_cons",
            cons: self.rsp_cons,
            limit,
            size: self.size,
        };
        if arith::response_prod_overflow(self.size, prod, self.rsp_cons) {
            let v = violation(ViolationKind::PastRingSize, self.size);
            return Err(self.fail(Blame::Producer, v));
        }
        if prod.wrapping_sub(self.rsp_cons) > outstanding {
            let v = violation(ViolationKind::PastRequests, outstanding);
            return Err(self.fail(Blame::Consumer, v));
        }
        self.rsp_prod_seen = prod;
        Ok(())
    }

    fn fail(&mut self, blame: Blame, v: Violation) -> RingError {
        self.broken = Some(v);
        blame.error(v)
    }

    #[inline]
    fn check_broken(&self) -> Result<(), RingError> {
        match self.broken {
            Some(v) => Err(RingError::Broken(v)),
            None => Ok(()),
        }
    }
}

pub(super) fn check_size(size: u32, ring: &'static str) -> Result<(), RingError> {
    if size.is_power_of_two() {
        Ok(())
    } else {
        Err(RingError::InvalidRingSize { ring, size })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::test_indices::TestIndices;

    fn fresh(size: u32) -> (TestIndices, FrontCore) {
        let ix = TestIndices::default();
        let core = FrontCore::init(&ix, size, "test").unwrap();
        (ix, core)
    }

    #[test]
    fn init_writes_shared_ring_init_values() {
        let ix = TestIndices::default();
        ix.set(SharedIndex::ReqProd, 9);
        ix.set(SharedIndex::RspProd, 9);
        FrontCore::init(&ix, 4, "test").unwrap();
        assert_eq!(ix.get(SharedIndex::ReqProd), 0);
        assert_eq!(ix.get(SharedIndex::RspProd), 0);
        assert_eq!(ix.get(SharedIndex::ReqEvent), 1);
        assert_eq!(ix.get(SharedIndex::RspEvent), 1);
    }

    #[test]
    fn rejects_non_power_of_two_sizes() {
        let ix = TestIndices::default();
        for size in [0, 3, 6, 100] {
            assert!(matches!(
                FrontCore::init(&ix, size, "test"),
                Err(RingError::InvalidRingSize { size: s, .. }) if s == size
            ));
        }
    }

    #[test]
    fn full_after_size_pushes() {
        let (ix, mut core) = fresh(4);
        let mut written = Vec::new();
        for _ in 0..4 {
            core.push_request(|i| written.push(i)).unwrap();
        }
        assert_eq!(written, vec![0, 1, 2, 3]);
        assert!(core.is_full());
        let err = core
            .push_request(|_| panic!("no slot may be written"))
            .unwrap_err();
        assert!(matches!(
            err,
            RingError::Full {
                size: 4,
                req_prod_pvt: 4,
                rsp_cons: 0,
                ..
            }
        ));
        // Nothing published yet.
        assert_eq!(ix.get(SharedIndex::ReqProd), 0);
        assert!(core.push_requests_and_check_notify(&ix));
        assert_eq!(ix.get(SharedIndex::ReqProd), 4);
    }

    #[test]
    fn notify_follows_req_event() {
        let (ix, mut core) = fresh(8);
        core.push_request(|_| ()).unwrap();
        // req_event = 1 after init: the first request notifies.
        assert!(core.push_requests_and_check_notify(&ix));
        // The backend has not re-armed: no notification.
        core.push_request(|_| ()).unwrap();
        assert!(!core.push_requests_and_check_notify(&ix));
        // Nothing new: no notification even if the event is due.
        ix.set(SharedIndex::ReqEvent, 3);
        assert!(!core.push_requests_and_check_notify(&ix));
        core.push_request(|_| ()).unwrap();
        assert!(core.push_requests_and_check_notify(&ix));
    }

    #[test]
    fn responses_are_taken_in_order_and_free_slots() {
        let (ix, mut core) = fresh(4);
        for _ in 0..3 {
            core.push_request(|_| ()).unwrap();
        }
        core.push_requests(&ix);
        assert_eq!(core.take_response(&ix, |i| i).unwrap(), None);
        ix.set(SharedIndex::RspProd, 2);
        assert!(core.has_unconsumed_responses(&ix));
        assert_eq!(core.take_response(&ix, |i| i).unwrap(), Some(0));
        assert_eq!(core.take_response(&ix, |i| i).unwrap(), Some(1));
        assert_eq!(core.take_response(&ix, |i| i).unwrap(), None);
        assert_eq!(core.free_requests(), 3);
        assert!(!core.final_check_for_responses(&ix).unwrap());
        assert_eq!(ix.get(SharedIndex::RspEvent), 3);
    }

    #[test]
    fn responses_beyond_requests_break_the_ring() {
        let (ix, mut core) = fresh(8);
        core.push_request(|_| ()).unwrap();
        core.push_requests(&ix);
        ix.set(SharedIndex::RspProd, 2);
        let err = core.take_response(&ix, |_| ()).unwrap_err();
        let RingError::HostileConsumer(v) = err else {
            panic!("{err:?}")
        };
        assert_eq!(
            (v.kind, v.prod, v.cons, v.limit),
            (ViolationKind::PastRequests, 2, 0, 1)
        );
        // Broken for good, even once the index looks sane again.
        ix.set(SharedIndex::RspProd, 1);
        assert_eq!(core.take_response(&ix, |_| ()), Err(RingError::Broken(v)));
        assert_eq!(
            core.final_check_for_responses(&ix),
            Err(RingError::Broken(v))
        );
        assert_eq!(core.push_request(|_| ()), Err(RingError::Broken(v)));
        assert!(!core.has_unconsumed_responses(&ix));
        assert!(!core.push_requests_and_check_notify(&ix));
    }

    #[test]
    fn responses_past_ring_size_break_the_ring() {
        let (ix, mut core) = fresh(8);
        ix.set(SharedIndex::RspProd, 9);
        let err = core.final_check_for_responses(&ix).unwrap_err();
        assert!(matches!(
            err,
            RingError::HostileProducer(Violation {
                kind: ViolationKind::PastRingSize,
                prod: 9,
                size: 8,
                ..
            })
        ));
        assert!(core.broken().is_some());
    }

    #[test]
    fn attach_resumes_with_requests_outstanding() {
        let ix = TestIndices::default();
        ix.set(SharedIndex::ReqProd, u32::MAX);
        ix.set(SharedIndex::RspProd, u32::MAX - 3);
        let core = FrontCore::attach(&ix, 4, "test").unwrap();
        assert_eq!(core.req_prod_pvt(), u32::MAX);
        assert_eq!(core.rsp_cons(), u32::MAX - 3);
        assert_eq!(core.free_requests(), 1);

        ix.set(SharedIndex::RspProd, 1);
        let err = FrontCore::attach(&ix, 4, "test").unwrap_err();
        assert!(matches!(err, RingError::HostileConsumer(_)), "{err}");
    }
}
