//! The counting and overflow macros of `io/ring.h`, as pure functions.
//!
//! All arithmetic is modulo 2^32 (`RING_IDX` is `unsigned int`), so indices
//! run freely and wrap; `size` is always a power of two.

use pvio_abi::ring::RingIdx;

/// The slot an index lands in: `idx & (size - 1)` (`RING_GET_REQUEST`).
#[inline]
pub const fn slot(idx: RingIdx, size: u32) -> u32 {
    idx & size.wrapping_sub(1)
}

/// `RING_FREE_REQUESTS`: `size - (req_prod_pvt - rsp_cons)`.
#[inline]
pub const fn free_requests(size: u32, req_prod_pvt: RingIdx, rsp_cons: RingIdx) -> u32 {
    size.wrapping_sub(req_prod_pvt.wrapping_sub(rsp_cons))
}

/// `XEN_RING_NR_UNCONSUMED_RESPONSES`: `rsp_prod - rsp_cons`.
#[inline]
pub const fn unconsumed_responses(rsp_prod: RingIdx, rsp_cons: RingIdx) -> u32 {
    rsp_prod.wrapping_sub(rsp_cons)
}

/// `XEN_RING_NR_UNCONSUMED_REQUESTS`: requests published and not taken,
/// clamped to the slots whose responses have been pushed, so that a backend
/// never takes more requests than it has room to answer.
#[inline]
pub const fn unconsumed_requests(
    size: u32,
    req_prod: RingIdx,
    req_cons: RingIdx,
    rsp_prod_pvt: RingIdx,
) -> u32 {
    let req = req_prod.wrapping_sub(req_cons);
    let rsp = size.wrapping_sub(req_cons.wrapping_sub(rsp_prod_pvt));
    if req < rsp {
        req
    } else {
        rsp
    }
}

/// `RING_REQUEST_CONS_OVERFLOW`: taking request `cons` would overwrite a slot
/// whose response has not been pushed yet. The consumer loop's stop test.
#[inline]
pub const fn request_cons_overflow(size: u32, cons: RingIdx, rsp_prod_pvt: RingIdx) -> bool {
    cons.wrapping_sub(rsp_prod_pvt) >= size
}

/// `RING_REQUEST_PROD_OVERFLOW`: a frontend cannot have this many requests
/// outstanding, so it is hostile.
#[inline]
pub const fn request_prod_overflow(size: u32, prod: RingIdx, rsp_prod_pvt: RingIdx) -> bool {
    prod.wrapping_sub(rsp_prod_pvt) > size
}

/// `RING_RESPONSE_PROD_OVERFLOW`: a backend cannot have produced this many
/// responses, so it is hostile.
#[inline]
pub const fn response_prod_overflow(size: u32, prod: RingIdx, rsp_cons: RingIdx) -> bool {
    prod.wrapping_sub(rsp_cons) > size
}

/// The notification decision of `RING_PUSH_*_AND_CHECK_NOTIFY`:
/// `(new - event) < (new - old)`, true exactly when `event` lies in the
/// half-open window `(old, new]` modulo 2^32.
#[inline]
pub const fn need_notify(old: RingIdx, new: RingIdx, event: RingIdx) -> bool {
    new.wrapping_sub(event) < new.wrapping_sub(old)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The window reading of the notification rule, stated without the
    /// macro's trick: some k in 1..=(new - old) has old + k == event.
    fn event_in_window(old: u32, new: u32, event: u32) -> bool {
        let pushed = new.wrapping_sub(old);
        let k = event.wrapping_sub(old);
        k != 0 && k <= pushed
    }

    #[test]
    fn notify_examples() {
        // The consumer asked for the very next request (event = old + 1).
        assert!(need_notify(0, 1, 1));
        assert!(need_notify(0, 5, 1));
        // The consumer is still busy and left a stale event behind.
        assert!(!need_notify(5, 6, 3));
        // Batching: event further on than this push.
        assert!(!need_notify(5, 6, 8));
        assert!(need_notify(5, 8, 8));
        // Nothing pushed never notifies.
        assert!(!need_notify(7, 7, 7));
        assert!(!need_notify(7, 7, 8));
        // Across the wrap.
        assert!(need_notify(u32::MAX, 1, 0));
        assert!(need_notify(u32::MAX - 1, 2, u32::MAX));
        assert!(!need_notify(u32::MAX - 1, 2, u32::MAX - 1));
    }

    #[test]
    fn counting_examples() {
        assert_eq!(free_requests(32, 0, 0), 32);
        assert_eq!(free_requests(32, 32, 0), 0);
        assert_eq!(free_requests(32, 3, u32::MAX - 2), 26);
        assert_eq!(unconsumed_requests(32, 10, 4, 4), 6);
        // Clamp: 4 taken and not answered leaves room for 28 more.
        assert_eq!(unconsumed_requests(32, 100, 8, 4), 28);
        assert!(request_cons_overflow(32, 36, 4));
        assert!(!request_cons_overflow(32, 35, 4));
        assert!(request_prod_overflow(32, 37, 4));
        assert!(!request_prod_overflow(32, 36, 4));
        assert!(response_prod_overflow(32, 2, 3));
        assert_eq!(slot(u32::MAX, 32), 31);
        assert_eq!(slot(u32::MAX.wrapping_add(1), 32), 0);
    }

    proptest! {
        #[test]
        fn notify_is_event_in_window(old: u32, new: u32, event: u32) {
            prop_assert_eq!(need_notify(old, new, event), event_in_window(old, new, event));
        }

        #[test]
        fn notify_near_window_edges(old: u32, pushed in 0u32..64, k in 0u32..70) {
            let new = old.wrapping_add(pushed);
            let event = old.wrapping_add(k);
            prop_assert_eq!(need_notify(old, new, event), k >= 1 && k <= pushed);
        }

        #[test]
        fn counts_are_offset_invariant(
            base: u32, order in 0u32..10, a in 0u32..1024, b in 0u32..1024, c in 0u32..1024,
        ) {
            // Shifting every index by the same amount (through the wrap)
            // changes no count and no predicate.
            let size = 1u32 << order;
            let (x, y, z) = (a, b, c);
            let s = |v: u32| v.wrapping_add(base);
            prop_assert_eq!(free_requests(size, x, y), free_requests(size, s(x), s(y)));
            prop_assert_eq!(
                unconsumed_requests(size, x, y, z),
                unconsumed_requests(size, s(x), s(y), s(z))
            );
            prop_assert_eq!(request_cons_overflow(size, x, y), request_cons_overflow(size, s(x), s(y)));
            prop_assert_eq!(request_prod_overflow(size, x, y), request_prod_overflow(size, s(x), s(y)));
            prop_assert_eq!(response_prod_overflow(size, x, y), response_prod_overflow(size, s(x), s(y)));
            prop_assert_eq!(slot(s(x), size), (slot(x, size) + slot(base, size)) % size);
        }

        #[test]
        fn unconsumed_requests_never_exceeds_room(
            size_order in 0u32..10, rsp_prod_pvt: u32, answered_gap in 0u32..=1024, extra: u32,
        ) {
            let size = 1u32 << size_order;
            let taken = answered_gap % (size + 1);
            let req_cons = rsp_prod_pvt.wrapping_add(taken);
            let n = unconsumed_requests(size, req_cons.wrapping_add(extra), req_cons, rsp_prod_pvt);
            prop_assert!(n <= size - taken);
            prop_assert!(n <= extra);
        }
    }
}
