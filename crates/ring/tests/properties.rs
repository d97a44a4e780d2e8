//! Property tests of the shared-memory endpoints against a reference model:
//! index wraparound, full/empty accounting, multi-page sizes and the
//! notification decisions, with a frontend and a backend driven step by step
//! over one region.

use std::sync::Arc;

use proptest::prelude::*;
use pvio_abi::blkif::{Blkif, BlkifRequest, BlkifResponse};
use pvio_abi::netif::{NetifCtrl, NetifRx, NetifTx, NetifTxRequest, NetifTxResponse};
use pvio_ring::{
    AnonRingMemory, BackRing, FrontRing, RawRing, RingError, RingIdx, RingMemory, RingProtocol,
    SharedIndex,
};

type Mem = Arc<AnonRingMemory>;

/// The notification rule read as "event lies in (old, new]".
fn event_in_window(old: RingIdx, new: RingIdx, event: RingIdx) -> bool {
    let k = event.wrapping_sub(old);
    k != 0 && k <= new.wrapping_sub(old)
}

/// A region whose four indices are preset, as a peer may have left them.
fn preset<P: RingProtocol>(pages: usize, req_prod: u32, rsp_prod: u32, events: [u32; 2]) -> Mem {
    let mem = Arc::new(AnonRingMemory::new(pages));
    let raw = RawRing::<P, _>::new(mem.clone()).unwrap();
    raw.store(SharedIndex::ReqProd, req_prod);
    raw.store(SharedIndex::RspProd, rsp_prod);
    raw.store(SharedIndex::ReqEvent, events[0]);
    raw.store(SharedIndex::RspEvent, events[1]);
    mem
}

#[test]
fn ring_sizes_by_protocol_and_pages() {
    for (order, slots) in [(0u32, 32u32), (1, 64), (2, 128), (3, 256), (4, 512)] {
        let front = FrontRing::<Blkif, _>::init(AnonRingMemory::new(1 << order)).unwrap();
        assert_eq!(front.size(), slots, "blkif order {order}");
        assert_eq!(front.free_requests(), slots);
        assert_eq!(
            u64::from(slots),
            pvio_abi::blkif::blkif_ring_size(order) as u64
        );
    }
    assert_eq!(
        FrontRing::<NetifTx, _>::init(AnonRingMemory::new(1))
            .unwrap()
            .size(),
        256
    );
    assert_eq!(
        FrontRing::<NetifRx, _>::init(AnonRingMemory::new(1))
            .unwrap()
            .size(),
        256
    );
    assert_eq!(
        FrontRing::<NetifCtrl, _>::init(AnonRingMemory::new(1))
            .unwrap()
            .size(),
        128
    );
}

#[test]
fn unsupported_regions_are_refused() {
    assert_eq!(
        FrontRing::<Blkif, _>::init(AnonRingMemory::new(3)).unwrap_err(),
        RingError::UnsupportedPageCount { pages: 3 }
    );
    assert_eq!(
        BackRing::<Blkif, _>::attach(AnonRingMemory::new(32)).unwrap_err(),
        RingError::UnsupportedPageCount { pages: 32 }
    );
    let mem = AnonRingMemory::new(2);
    let short = Window {
        mem: &mem,
        offset: 0,
        len: 100,
    };
    assert!(matches!(
        FrontRing::<Blkif, _>::init(short).unwrap_err(),
        RingError::RegionTooSmall {
            len: 100,
            min: 4096,
            ..
        }
    ));
    let ragged = Window {
        mem: &mem,
        offset: 0,
        len: 5000,
    };
    assert_eq!(
        FrontRing::<Blkif, _>::init(ragged).unwrap_err(),
        RingError::RegionNotPageMultiple { len: 5000 }
    );
    let shifted = Window {
        mem: &mem,
        offset: 64,
        len: 4096,
    };
    let addr = mem.as_ptr() as usize + 64;
    assert_eq!(
        FrontRing::<Blkif, _>::init(shifted).unwrap_err(),
        RingError::RegionMisaligned { addr }
    );
}

/// Part of another region, to build misaligned and odd-sized regions.
struct Window<'a> {
    mem: &'a AnonRingMemory,
    offset: usize,
    len: usize,
}

// SAFETY: a sub-range (offset + len <= the parent's length in every use
// above) of a region that outlives the borrow.
unsafe impl RingMemory for Window<'_> {
    fn as_ptr(&self) -> *mut u8 {
        self.mem.as_ptr().wrapping_add(self.offset)
    }
    fn len(&self) -> usize {
        assert!(self.offset + self.len <= self.mem.len());
        self.len
    }
}

#[test]
fn netif_entries_round_trip() {
    let mem: Mem = Arc::new(AnonRingMemory::new(1));
    let mut front = FrontRing::<NetifTx, _>::init(mem.clone()).unwrap();
    let mut back = BackRing::<NetifTx, _>::attach(mem).unwrap();
    for round in 0..3u16 {
        for i in 0..256u16 {
            let req = NetifTxRequest {
                gref: u32::from(i) * 7,
                offset: i,
                flags: round,
                id: i,
                size: 1500,
            };
            front.push_request(&req).unwrap();
        }
        assert!(front.is_full());
        front.push_requests();
        for i in 0..256u16 {
            let req = back.take_request().unwrap().unwrap();
            assert_eq!(
                (req.id, req.offset, req.flags, req.gref),
                (i, i, round, u32::from(i) * 7)
            );
            back.push_response(&NetifTxResponse {
                id: req.id,
                status: 0,
            })
            .unwrap();
        }
        assert_eq!(back.take_request().unwrap(), None);
        back.push_responses();
        for i in 0..256u16 {
            assert_eq!(front.take_response().unwrap().unwrap().id, i);
        }
        assert_eq!(front.take_response().unwrap(), None);
    }
}

/// One step of the model test.
#[derive(Clone, Debug)]
enum Op {
    PushRequests(u32),
    PublishRequests { check_notify: bool },
    TakeRequests(u32),
    Respond(u32),
    PublishResponses { check_notify: bool },
    TakeResponses(u32),
    FinalCheckRequests,
    FinalCheckResponses,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u32..40).prop_map(Op::PushRequests),
        any::<bool>().prop_map(|check_notify| Op::PublishRequests { check_notify }),
        (0u32..40).prop_map(Op::TakeRequests),
        (0u32..40).prop_map(Op::Respond),
        any::<bool>().prop_map(|check_notify| Op::PublishResponses { check_notify }),
        (0u32..40).prop_map(Op::TakeResponses),
        Just(Op::FinalCheckRequests),
        Just(Op::FinalCheckResponses),
    ]
}

/// Where the model stands: every count runs from the starting index.
#[derive(Debug, Default)]
struct Model {
    pushed: u32,
    published: u32,
    taken: u32,
    answered: u32,
    answered_published: u32,
    consumed: u32,
}

fn request(n: u32) -> BlkifRequest {
    let mut req = BlkifRequest {
        operation: (n % 2) as u8,
        nr_segments: (n % 12) as u8,
        id: u64::from(n) | 0xabcd_0000_0000,
        sector_number: u64::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        ..Default::default()
    };
    req.seg[(n % 11) as usize].gref = n;
    req
}

fn response(n: u32) -> BlkifResponse {
    BlkifResponse {
        id: u64::from(n) | 0xabcd_0000_0000,
        operation: (n % 2) as u8,
        status: (n % 3) as i16 - 1,
        ..Default::default()
    }
}

fn run_model(pages: usize, start: RingIdx, ops: &[Op]) -> Result<(), TestCaseError> {
    let mem = preset::<Blkif>(pages, start, start, [start.wrapping_add(1); 2]);
    let raw = RawRing::<Blkif, _>::new(mem.clone()).unwrap();
    let mut front = FrontRing::<Blkif, _>::attach(mem.clone()).unwrap();
    let mut back = BackRing::<Blkif, _>::attach(mem).unwrap();
    let size = front.size();
    prop_assert_eq!(size, 32 * pages as u32);
    let at = |n: u32| start.wrapping_add(n);
    let mut m = Model::default();

    for op in ops {
        match *op {
            Op::PushRequests(k) => {
                for _ in 0..k {
                    let r = front.push_request(&request(m.pushed));
                    if m.pushed - m.consumed < size {
                        prop_assert_eq!(r, Ok(()));
                        m.pushed += 1;
                    } else {
                        prop_assert!(matches!(r, Err(RingError::Full { .. })), "{:?}", r);
                        prop_assert!(front.is_full());
                    }
                }
            }
            Op::PublishRequests { check_notify } => {
                let event = raw.load(SharedIndex::ReqEvent);
                let (old, new) = (at(m.published), at(m.pushed));
                if check_notify {
                    let notify = front.push_requests_and_check_notify();
                    prop_assert_eq!(notify, event_in_window(old, new, event));
                } else {
                    front.push_requests();
                }
                m.published = m.pushed;
                prop_assert_eq!(raw.load(SharedIndex::ReqProd), new);
            }
            Op::TakeRequests(k) => {
                for _ in 0..k {
                    let r = back.take_request().unwrap();
                    if m.taken < m.published {
                        prop_assert_eq!(r, Some(request(m.taken)));
                        m.taken += 1;
                    } else {
                        prop_assert_eq!(r, None);
                    }
                }
            }
            Op::Respond(k) => {
                for _ in 0..k {
                    let r = back.push_response(&response(m.answered));
                    if m.answered < m.taken {
                        prop_assert_eq!(r, Ok(()));
                        m.answered += 1;
                    } else {
                        prop_assert!(
                            matches!(r, Err(RingError::NoRequestToAnswer { .. })),
                            "{:?}",
                            r
                        );
                    }
                }
            }
            Op::PublishResponses { check_notify } => {
                let event = raw.load(SharedIndex::RspEvent);
                let (old, new) = (at(m.answered_published), at(m.answered));
                if check_notify {
                    let notify = back.push_responses_and_check_notify();
                    prop_assert_eq!(notify, event_in_window(old, new, event));
                } else {
                    back.push_responses();
                }
                m.answered_published = m.answered;
                prop_assert_eq!(raw.load(SharedIndex::RspProd), new);
            }
            Op::TakeResponses(k) => {
                for _ in 0..k {
                    let r = front.take_response().unwrap();
                    if m.consumed < m.answered_published {
                        prop_assert_eq!(r, Some(response(m.consumed)));
                        m.consumed += 1;
                    } else {
                        prop_assert_eq!(r, None);
                    }
                }
            }
            Op::FinalCheckRequests => {
                let before = raw.load(SharedIndex::ReqEvent);
                let work = back.final_check_for_requests().unwrap();
                prop_assert_eq!(work, m.taken < m.published);
                let expect = if work { before } else { at(m.taken + 1) };
                prop_assert_eq!(raw.load(SharedIndex::ReqEvent), expect);
            }
            Op::FinalCheckResponses => {
                let before = raw.load(SharedIndex::RspEvent);
                let work = front.final_check_for_responses().unwrap();
                prop_assert_eq!(work, m.consumed < m.answered_published);
                let expect = if work { before } else { at(m.consumed + 1) };
                prop_assert_eq!(raw.load(SharedIndex::RspEvent), expect);
            }
        }
        // Accounting after every step.
        prop_assert_eq!(front.req_prod_pvt(), at(m.pushed));
        prop_assert_eq!(front.rsp_cons(), at(m.consumed));
        prop_assert_eq!(front.free_requests(), size - (m.pushed - m.consumed));
        prop_assert_eq!(front.is_full(), m.pushed - m.consumed == size);
        prop_assert_eq!(back.req_cons(), at(m.taken));
        prop_assert_eq!(back.rsp_prod_pvt(), at(m.answered));
        prop_assert_eq!(back.unanswered(), m.taken - m.answered);
        prop_assert_eq!(back.has_unconsumed_requests(), m.taken < m.published);
        prop_assert_eq!(
            front.has_unconsumed_responses(),
            m.consumed < m.answered_published
        );
        prop_assert!(front.broken().is_none() && back.broken().is_none());
    }
    Ok(())
}

/// Starting points that matter: zero, just before the 2^32 wrap (a ring's
/// worth of requests crosses it) and anywhere.
fn start() -> impl Strategy<Value = RingIdx> {
    prop_oneof![
        Just(0u32),
        (0u32..600).prop_map(|d| u32::MAX - d),
        any::<u32>(),
    ]
}

fn pages() -> impl Strategy<Value = usize> {
    prop_oneof![Just(1usize), Just(2), Just(4), Just(8), Just(16)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn endpoints_match_the_model(
        pages in pages(),
        start in start(),
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        run_model(pages, start, &ops)?;
    }

    #[test]
    fn request_notification_is_the_macro_decision(
        start: u32, pending in 0u32..=32, pushed in 0u32..=32, event: u32,
    ) {
        // `pending` requests already published and unanswered, then
        // `pushed` more, limited by the ring's 32 slots.
        let pushed = pushed.min(32 - pending);
        let mem = preset::<Blkif>(1, start.wrapping_add(pending), start, [event, 0]);
        let mut front = FrontRing::<Blkif, _>::attach(mem).unwrap();
        for n in 0..pushed {
            front.push_request(&request(n)).unwrap();
        }
        let old = start.wrapping_add(pending);
        let new = old.wrapping_add(pushed);
        prop_assert_eq!(front.push_requests_and_check_notify(), event_in_window(old, new, event));
        // The decision is `(new - event) < (new - old)`, word for word.
        prop_assert_eq!(
            event_in_window(old, new, event),
            new.wrapping_sub(event) < new.wrapping_sub(old)
        );
    }

    #[test]
    fn response_notification_is_the_macro_decision(
        start: u32, outstanding in 0u32..=32, answered in 0u32..=32, event: u32,
    ) {
        let answered = answered.min(outstanding);
        let mem = preset::<Blkif>(1, start.wrapping_add(outstanding), start, [0, event]);
        let mut back = BackRing::<Blkif, _>::attach(mem).unwrap();
        for n in 0..answered {
            back.take_request().unwrap().unwrap();
            back.push_response(&response(n)).unwrap();
        }
        let new = start.wrapping_add(answered);
        prop_assert_eq!(
            back.push_responses_and_check_notify(),
            event_in_window(start, new, event)
        );
    }
}

#[test]
fn full_cycle_across_the_wrap_on_every_ring_size() {
    for pages in [1, 2, 4, 8, 16] {
        let start = u32::MAX - 40;
        let mem = preset::<Blkif>(pages, start, start, [start.wrapping_add(1); 2]);
        let mut front = FrontRing::<Blkif, _>::attach(mem.clone()).unwrap();
        let mut back = BackRing::<Blkif, _>::attach(mem).unwrap();
        let size = front.size();
        let mut n = 0u32;
        for _round in 0..3 {
            for _ in 0..size {
                front.push_request(&request(n)).unwrap();
                n += 1;
            }
            assert!(front.is_full());
            // The backend re-armed req_event at the end of the previous round.
            assert!(front.push_requests_and_check_notify());
            let mut k = n - size;
            while let Some(req) = back.take_request().unwrap() {
                assert_eq!(req, request(k));
                back.push_response(&response(k)).unwrap();
                k += 1;
            }
            assert_eq!(k, n);
            back.push_responses();
            assert!(!back.final_check_for_requests().unwrap());
            let mut k = n - size;
            while let Some(rsp) = front.take_response().unwrap() {
                assert_eq!(rsp, response(k));
                k += 1;
            }
            assert_eq!(k, n);
            assert!(!front.final_check_for_responses().unwrap());
        }
        assert_eq!(front.req_prod_pvt(), start.wrapping_add(3 * size));
        assert!(front.req_prod_pvt() < start, "the run crossed the wrap");
    }
}

#[test]
fn endpoints_can_move_to_threads() {
    fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<FrontRing<Blkif, Mem>>();
    send_and_sync::<BackRing<Blkif, Mem>>();
    send_and_sync::<AnonRingMemory>();
}

/// A frontend and a backend in two threads of one process over an `Arc`
/// (the single-process use `AnonRingMemory` exists for), polling, with a
/// deadline instead of a hang.
#[test]
fn threads_exchange_requests_in_one_process() {
    const COUNT: u32 = 200_000;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mem: Mem = Arc::new(AnonRingMemory::new(2));
    let mut front = FrontRing::<Blkif, _>::init(mem.clone()).unwrap();
    let mut back = BackRing::<Blkif, _>::attach(mem).unwrap();
    let backend = std::thread::spawn(move || {
        let mut n = 0u32;
        while n < COUNT {
            let mut got = false;
            while let Some(req) = back.take_request().unwrap() {
                assert_eq!(req, request(n));
                back.push_response(&response(n)).unwrap();
                n += 1;
                got = true;
            }
            back.push_responses();
            if !got {
                assert!(
                    std::time::Instant::now() < deadline,
                    "backend stalled at {n}"
                );
                std::thread::yield_now();
            }
        }
    });
    let (mut sent, mut received) = (0u32, 0u32);
    while received < COUNT {
        while sent < COUNT && !front.is_full() {
            front.push_request(&request(sent)).unwrap();
            sent += 1;
        }
        front.push_requests();
        let mut got = false;
        while let Some(rsp) = front.take_response().unwrap() {
            assert_eq!(rsp, response(received));
            received += 1;
            got = true;
        }
        if !got {
            assert!(
                std::time::Instant::now() < deadline,
                "frontend stalled at {received}"
            );
            std::thread::yield_now();
        }
    }
    backend.join().unwrap();
}
