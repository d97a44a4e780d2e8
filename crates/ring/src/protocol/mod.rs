//! The ring protocol of `io/ring.h`, independent of where the ring lives.
//!
//! [`FrontCore`] and [`BackCore`] hold an endpoint's private indices and run
//! the macros' logic (push, notification check, final check, overflow
//! checks) against any [`SharedIndices`]: the shared-memory rings of this
//! crate use one implementation over the real page, and the loom model check
//! (`tests/loom_wakeup.rs`) another over loom's atomics, so the protocol that
//! is model-checked is the protocol that runs. Slot contents are not the
//! core's business: it hands the caller the free-running index of the slot to
//! read or write, at the moment the protocol allows it.

pub mod arith;
mod back;
mod front;

use core::sync::atomic::Ordering;

use pvio_abi::ring::{RingIdx, SRING_REQ_EVENT, SRING_REQ_PROD, SRING_RSP_EVENT, SRING_RSP_PROD};

pub use back::BackCore;
pub use front::FrontCore;

/// One of the four indices in the shared ring header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedIndex {
    /// `req_prod`, written by the frontend.
    ReqProd,
    /// `req_event`, written by the backend.
    ReqEvent,
    /// `rsp_prod`, written by the backend.
    RspProd,
    /// `rsp_event`, written by the frontend.
    RspEvent,
}

impl SharedIndex {
    /// All four, in header order.
    pub const ALL: [SharedIndex; 4] = [
        SharedIndex::ReqProd,
        SharedIndex::ReqEvent,
        SharedIndex::RspProd,
        SharedIndex::RspEvent,
    ];

    /// Byte offset in the shared ring header.
    pub const fn offset(self) -> usize {
        match self {
            SharedIndex::ReqProd => SRING_REQ_PROD,
            SharedIndex::ReqEvent => SRING_REQ_EVENT,
            SharedIndex::RspProd => SRING_RSP_PROD,
            SharedIndex::RspEvent => SRING_RSP_EVENT,
        }
    }

    /// The field's name in `io/ring.h`.
    pub const fn name(self) -> &'static str {
        match self {
            SharedIndex::ReqProd => "req_prod",
            SharedIndex::ReqEvent => "req_event",
            SharedIndex::RspProd => "rsp_prod",
            SharedIndex::RspEvent => "rsp_event",
        }
    }
}

/// Access to the four shared indices of one ring.
///
/// The core chooses every memory ordering (`io/ring.h` barriers mapped to
/// C11 as in the Xen brief §1.7): `wmb` is a `Release` store of a producer
/// index, `rmb` an `Acquire` load of one, and `mb`, needed where a store
/// must be ordered before a later load, is [`SharedIndices::full_fence`].
/// Implementations perform exactly the access asked for; a model checker's
/// implementation may weaken them on purpose to show that a check fails.
pub trait SharedIndices {
    /// Atomically loads `index`.
    fn load(&self, index: SharedIndex, order: Ordering) -> RingIdx;
    /// Atomically stores `value` to `index`.
    fn store(&self, index: SharedIndex, value: RingIdx, order: Ordering);
    /// `xen_mb()`: a sequentially consistent fence.
    fn full_fence(&self);
}

impl<T: SharedIndices + ?Sized> SharedIndices for &T {
    fn load(&self, index: SharedIndex, order: Ordering) -> RingIdx {
        (**self).load(index, order)
    }
    fn store(&self, index: SharedIndex, value: RingIdx, order: Ordering) {
        (**self).store(index, value, order)
    }
    fn full_fence(&self) {
        (**self).full_fence()
    }
}

#[cfg(test)]
pub(crate) mod test_indices {
    //! Plain in-process indices for the core's unit tests.

    use core::sync::atomic::{fence, AtomicU32, Ordering};

    use super::{SharedIndex, SharedIndices};
    use pvio_abi::ring::RingIdx;

    #[derive(Debug, Default)]
    pub(crate) struct TestIndices([AtomicU32; 4]);

    impl TestIndices {
        pub(crate) fn get(&self, i: SharedIndex) -> RingIdx {
            self.0[i.offset() / 4].load(Ordering::SeqCst)
        }
        pub(crate) fn set(&self, i: SharedIndex, v: RingIdx) {
            self.0[i.offset() / 4].store(v, Ordering::SeqCst)
        }
    }

    impl SharedIndices for TestIndices {
        fn load(&self, index: SharedIndex, order: Ordering) -> RingIdx {
            self.0[index.offset() / 4].load(order)
        }
        fn store(&self, index: SharedIndex, value: RingIdx, order: Ordering) {
            self.0[index.offset() / 4].store(value, order)
        }
        fn full_fence(&self) {
            fence(Ordering::SeqCst)
        }
    }
}
