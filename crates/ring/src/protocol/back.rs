//! The backend half of the protocol: `BACK_RING_ATTACH`, the blkback
//! consumer loop, `RING_PUSH_RESPONSES*` and
//! `RING_FINAL_CHECK_FOR_REQUESTS`.

use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use pvio_abi::ring::RingIdx;

use super::arith;
use super::front::check_size;
use super::{SharedIndex, SharedIndices};
use crate::error::{Blame, Peer, RingError, Violation, ViolationKind};

/// The backend's private state (`struct name_back_ring` without the
/// pointer) and the protocol steps that use it.
///
/// Besides the macro's `rsp_prod_pvt` and `req_cons` it keeps the last
/// `rsp_prod` it published (the notification decision then never depends on
/// a value the frontend could have overwritten) and the last validated
/// `req_prod`, so that shared memory is read once per batch of requests and
/// every index used to address a slot has been checked.
#[derive(Clone, Debug)]
pub struct BackCore {
    ring: &'static str,
    size: u32,
    rsp_prod_pvt: RingIdx,
    rsp_prod_published: RingIdx,
    req_cons: RingIdx,
    req_prod_seen: RingIdx,
    broken: Option<Violation>,
}

impl BackCore {
    /// `BACK_RING_ATTACH` at the current `rsp_prod` (for a fresh ring that is
    /// `BACK_RING_INIT`), refusing the ring, as Linux blkback's
    /// `xen_blkif_map` does, when `req_prod - rsp_prod` exceeds its size.
    pub fn attach<I: SharedIndices>(
        ix: &I,
        size: u32,
        ring: &'static str,
    ) -> Result<Self, RingError> {
        check_size(size, ring)?;
        let rsp_prod = ix.load(SharedIndex::RspProd, Acquire);
        let req_prod = ix.load(SharedIndex::ReqProd, Acquire);
        if arith::request_prod_overflow(size, req_prod, rsp_prod) {
            return Err(RingError::HostileProducer(Violation {
                ring,
                peer: Peer::Frontend,
                kind: ViolationKind::PastRingSize,
                index: "req_prod",
                prod: req_prod,
                cons_name: "rsp_prod",
                cons: rsp_prod,
                limit: size,
                size,
            }));
        }
        Ok(Self {
            ring,
            size,
            rsp_prod_pvt: rsp_prod,
            rsp_prod_published: rsp_prod,
            req_cons: rsp_prod,
            req_prod_seen: rsp_prod,
            broken: None,
        })
    }

    /// `RING_SIZE`.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The index of the next request to take.
    pub fn req_cons(&self) -> RingIdx {
        self.req_cons
    }

    /// The index the next response will be written at.
    pub fn rsp_prod_pvt(&self) -> RingIdx {
        self.rsp_prod_pvt
    }

    /// Requests taken and not answered yet (`req_cons - rsp_prod_pvt`).
    pub fn unanswered(&self) -> u32 {
        self.req_cons.wrapping_sub(self.rsp_prod_pvt)
    }

    /// The hostile index that broke this endpoint, if any.
    pub fn broken(&self) -> Option<&Violation> {
        self.broken.as_ref()
    }

    /// One step of the blkback consumer loop (`__do_block_io_op`).
    ///
    /// When the previous snapshot of `req_prod` is used up it reads
    /// `req_prod` once (acquire) and stops the ring with an error if the
    /// frontend cannot have written it (`RING_REQUEST_PROD_OVERFLOW`, or
    /// moved backwards). It stops the loop (`Ok(None)`) on
    /// `RING_REQUEST_CONS_OVERFLOW`. Otherwise `read` receives the request's
    /// free-running index, must copy the slot exactly once, and `req_cons` is
    /// advanced before the caller can respond.
    #[inline]
    pub fn take_request<I: SharedIndices, R>(
        &mut self,
        ix: &I,
        read: impl FnOnce(RingIdx) -> R,
    ) -> Result<Option<R>, RingError> {
        self.check_broken()?;
        if self.req_cons == self.req_prod_seen {
            self.refresh_req_prod(ix)?;
            if self.req_cons == self.req_prod_seen {
                return Ok(None);
            }
        }
        // Unreachable while every snapshot is validated (it keeps
        // req_prod - rsp_prod_pvt <= size), but it is the loop guard the
        // header prescribes, and it costs one compare.
        if arith::request_cons_overflow(self.size, self.req_cons, self.rsp_prod_pvt) {
            return Ok(None);
        }
        let value = read(self.req_cons);
        self.req_cons = self.req_cons.wrapping_add(1);
        Ok(Some(value))
    }

    /// Claims the slot at `rsp_prod_pvt` for the response to the oldest
    /// request taken and not answered, lets `write` fill it, and advances
    /// `rsp_prod_pvt`. Not visible to the frontend until the next push.
    #[inline]
    pub fn push_response(&mut self, write: impl FnOnce(RingIdx)) -> Result<(), RingError> {
        self.check_broken()?;
        if self.rsp_prod_pvt == self.req_cons {
            return Err(RingError::NoRequestToAnswer {
                ring: self.ring,
                rsp_prod_pvt: self.rsp_prod_pvt,
                req_cons: self.req_cons,
            });
        }
        write(self.rsp_prod_pvt);
        self.rsp_prod_pvt = self.rsp_prod_pvt.wrapping_add(1);
        Ok(())
    }

    /// `RING_PUSH_RESPONSES`: publish without deciding on a notification.
    /// Does nothing on a broken ring.
    #[inline]
    pub fn push_responses<I: SharedIndices>(&mut self, ix: &I) {
        if self.broken.is_some() {
            return;
        }
        // wmb: the slots are visible before the index that covers them.
        ix.store(SharedIndex::RspProd, self.rsp_prod_pvt, Release);
        self.rsp_prod_published = self.rsp_prod_pvt;
    }

    /// `RING_PUSH_RESPONSES_AND_CHECK_NOTIFY`: publish, then tell whether the
    /// frontend asked (through `rsp_event`) to be notified of these
    /// responses. False on a broken ring.
    #[inline]
    pub fn push_responses_and_check_notify<I: SharedIndices>(&mut self, ix: &I) -> bool {
        if self.broken.is_some() {
            return false;
        }
        let old = self.rsp_prod_published;
        let new = self.rsp_prod_pvt;
        if old == new {
            // Same answer as the macro (an empty window never notifies),
            // without the store and the fence.
            return false;
        }
        ix.store(SharedIndex::RspProd, new, Release);
        self.rsp_prod_published = new;
        // mb: the new rsp_prod must be visible before rsp_event is read.
        ix.full_fence();
        let event = ix.load(SharedIndex::RspEvent, Relaxed);
        arith::need_notify(old, new, event)
    }

    /// `RING_HAS_UNCONSUMED_REQUESTS`, unvalidated: a hint for pollers. If
    /// true, `take_request` returns a request or an error unless the
    /// frontend moves `req_prod` back in between. False on a broken ring.
    #[inline]
    pub fn has_unconsumed_requests<I: SharedIndices>(&self, ix: &I) -> bool {
        if self.broken.is_some() {
            return false;
        }
        let prod = if self.req_cons != self.req_prod_seen {
            self.req_prod_seen
        } else {
            ix.load(SharedIndex::ReqProd, Acquire)
        };
        arith::unconsumed_requests(self.size, prod, self.req_cons, self.rsp_prod_pvt) > 0
    }

    /// `RING_FINAL_CHECK_FOR_REQUESTS`: before sleeping, ask for a
    /// notification on the very next request and look once more. `Ok(true)`
    /// means a request is ready (the next `take_request` returns it) and the
    /// caller must not sleep; `Ok(false)` means any later request will be
    /// notified. As in the macro, requests are counted only while a slot is
    /// free for their response: with every slot taken and unanswered this
    /// says `Ok(false)` even if more are published, and it is the
    /// completion of that work, not the frontend, that must wake the
    /// backend to answer and run the loop again.
    pub fn final_check_for_requests<I: SharedIndices>(
        &mut self,
        ix: &I,
    ) -> Result<bool, RingError> {
        self.check_broken()?;
        if self.unconsumed_requests(ix)? > 0 {
            return Ok(true);
        }
        ix.store(
            SharedIndex::ReqEvent,
            self.req_cons.wrapping_add(1),
            Relaxed,
        );
        // mb: req_event must be visible before req_prod is read again (see
        // FrontCore::push_requests_and_check_notify, the other half).
        ix.full_fence();
        Ok(self.unconsumed_requests(ix)? > 0)
    }

    /// Sets `req_event` for a custom final check (notify only after several
    /// requests, or never while polling) and fences. The caller must look
    /// for requests again before it sleeps.
    /// Does nothing on a broken ring.
    pub fn set_req_event<I: SharedIndices>(&mut self, ix: &I, event: RingIdx) {
        if self.broken.is_some() {
            return;
        }
        ix.store(SharedIndex::ReqEvent, event, Relaxed);
        ix.full_fence();
    }

    fn unconsumed_requests<I: SharedIndices>(&mut self, ix: &I) -> Result<u32, RingError> {
        if self.req_cons == self.req_prod_seen {
            self.refresh_req_prod(ix)?;
        }
        Ok(arith::unconsumed_requests(
            self.size,
            self.req_prod_seen,
            self.req_cons,
            self.rsp_prod_pvt,
        ))
    }

    /// Reads `req_prod` once and accepts it only if a frontend could have
    /// written it; otherwise marks the endpoint broken. Called only when the
    /// previous snapshot is used up (`req_cons == req_prod_seen`).
    fn refresh_req_prod<I: SharedIndices>(&mut self, ix: &I) -> Result<(), RingError> {
        // rmb: the requests are read after the index that covers them.
        let prod = ix.load(SharedIndex::ReqProd, Acquire);
        let violation = |kind, cons_name, cons| Violation {
            ring: self.ring,
            peer: Peer::Frontend,
            kind,
            index: "req_prod",
            prod,
            cons_name,
            cons,
            limit: self.size,
            size: self.size,
        };
        if arith::request_prod_overflow(self.size, prod, self.rsp_prod_pvt) {
            let v = violation(
                ViolationKind::PastRingSize,
                "rsp_prod_pvt",
                self.rsp_prod_pvt,
            );
            return Err(self.fail(v));
        }
        // Within the window but behind requests already taken: the frontend
        // withdrew published requests.
        if prod.wrapping_sub(self.rsp_prod_pvt) < self.req_cons.wrapping_sub(self.rsp_prod_pvt) {
            let v = violation(ViolationKind::Backwards, "req_cons", self.req_cons);
            return Err(self.fail(v));
        }
        self.req_prod_seen = prod;
        Ok(())
    }

    fn fail(&mut self, v: Violation) -> RingError {
        self.broken = Some(v);
        Blame::Producer.error(v)
    }

    #[inline]
    fn check_broken(&self) -> Result<(), RingError> {
        match self.broken {
            Some(v) => Err(RingError::Broken(v)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::test_indices::TestIndices;

    fn at(req_prod: u32, rsp_prod: u32, size: u32) -> (TestIndices, BackCore) {
        let ix = TestIndices::default();
        ix.set(SharedIndex::ReqProd, req_prod);
        ix.set(SharedIndex::RspProd, rsp_prod);
        ix.set(SharedIndex::RspEvent, rsp_prod.wrapping_add(1));
        let core = BackCore::attach(&ix, size, "test").unwrap();
        (ix, core)
    }

    #[test]
    fn attach_refuses_more_requests_than_slots() {
        let ix = TestIndices::default();
        ix.set(SharedIndex::ReqProd, 5);
        ix.set(SharedIndex::RspProd, 0);
        let err = BackCore::attach(&ix, 4, "test").unwrap_err();
        assert!(matches!(
            err,
            RingError::HostileProducer(Violation {
                prod: 5,
                cons: 0,
                size: 4,
                ..
            })
        ));
        ix.set(SharedIndex::ReqProd, 4);
        assert!(BackCore::attach(&ix, 4, "test").is_ok());
        // rsp_prod ahead of req_prod is a wrapped, huge distance.
        ix.set(SharedIndex::RspProd, 6);
        assert!(BackCore::attach(&ix, 4, "test").is_err());
    }

    #[test]
    fn takes_published_requests_then_stops() {
        let (ix, mut core) = at(3, 0, 4);
        let taken: Vec<_> = core_take_all(&ix, &mut core);
        assert_eq!(taken, vec![0, 1, 2]);
        assert_eq!(core.unanswered(), 3);
        assert!(!core.has_unconsumed_requests(&ix));
        // Responding frees slots; more requests come in.
        core.push_response(|i| assert_eq!(i, 0)).unwrap();
        assert!(core.push_responses_and_check_notify(&ix));
        assert_eq!(ix.get(SharedIndex::RspProd), 1);
        ix.set(SharedIndex::ReqProd, 5);
        assert_eq!(core_take_all(&ix, &mut core), vec![3, 4]);
    }

    #[test]
    fn responses_need_a_taken_request() {
        let (_ix, mut core) = at(0, 0, 4);
        assert!(matches!(
            core.push_response(|_| ()),
            Err(RingError::NoRequestToAnswer {
                rsp_prod_pvt: 0,
                req_cons: 0,
                ..
            })
        ));
    }

    #[test]
    fn final_check_rearms_req_event() {
        let (ix, mut core) = at(2, 0, 4);
        assert!(core.final_check_for_requests(&ix).unwrap());
        core_take_all(&ix, &mut core);
        assert!(!core.final_check_for_requests(&ix).unwrap());
        assert_eq!(ix.get(SharedIndex::ReqEvent), 3);
        ix.set(SharedIndex::ReqProd, 3);
        assert!(core.final_check_for_requests(&ix).unwrap());
    }

    #[test]
    fn req_prod_far_ahead_breaks_the_ring() {
        let (ix, mut core) = at(0, 0, 4);
        ix.set(SharedIndex::ReqProd, 5);
        let err = core.take_request(&ix, |i| i).unwrap_err();
        let RingError::HostileProducer(v) = err else {
            panic!("{err:?}")
        };
        assert_eq!(
            (v.kind, v.prod, v.cons, v.size),
            (ViolationKind::PastRingSize, 5, 0, 4)
        );
        ix.set(SharedIndex::ReqProd, 1);
        assert_eq!(core.take_request(&ix, |i| i), Err(RingError::Broken(v)));
        assert_eq!(
            core.final_check_for_requests(&ix),
            Err(RingError::Broken(v))
        );
        assert!(!core.has_unconsumed_requests(&ix));
    }

    #[test]
    fn req_prod_moving_back_breaks_the_ring() {
        let (ix, mut core) = at(3, 0, 4);
        assert_eq!(core_take_all(&ix, &mut core), vec![0, 1, 2]);
        core.push_response(|_| ()).unwrap();
        ix.set(SharedIndex::ReqProd, 2);
        let err = core.take_request(&ix, |i| i).unwrap_err();
        assert!(
            matches!(
                err,
                RingError::HostileProducer(Violation {
                    kind: ViolationKind::Backwards,
                    prod: 2,
                    cons: 3,
                    ..
                })
            ),
            "{err}"
        );
    }

    fn core_take_all(ix: &TestIndices, core: &mut BackCore) -> Vec<u32> {
        let mut v = Vec::new();
        while let Some(i) = core.take_request(ix, |i| i).unwrap() {
            v.push(i);
        }
        v
    }
}
