//! A hostile peer: garbage indices (far ahead, backwards, random, changing
//! under our feet) and garbage slots. The endpoint must answer every call
//! promptly with a value or a `RingError`, never panic, never read outside
//! the region, and stay broken once it has seen an impossible index.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use pvio_abi::blkif::{Blkif, BlkifRequest, BlkifResponse};
use pvio_ring::{
    AnonRingMemory, BackRing, FrontRing, Peer, RawRing, RingError, SharedIndex, Violation,
    ViolationKind,
};

type Mem = Arc<AnonRingMemory>;
const SIZE: u32 = 32;

/// A fresh one-page blkif ring, initialised by a frontend that then turns
/// hostile through `RawRing`.
fn ring() -> (Mem, RawRing<Blkif, Mem>) {
    let mem: Mem = Arc::new(AnonRingMemory::new(1));
    FrontRing::<Blkif, _>::init(mem.clone()).unwrap();
    let raw = RawRing::new(mem.clone()).unwrap();
    (mem, raw)
}

fn garbage_slots(raw: &RawRing<Blkif, Mem>, seed: u64) {
    let mut x = seed | 1;
    let mut bytes = vec![0u8; 4096 - 16];
    for b in bytes.iter_mut() {
        // xorshift: cheap, deterministic garbage.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    raw.write_bytes(16, &bytes).unwrap();
}

fn assert_stays_broken(back: &mut BackRing<Blkif, Mem>, v: Violation) {
    for _ in 0..3 {
        assert_eq!(back.take_request(), Err(RingError::Broken(v)));
        assert_eq!(back.final_check_for_requests(), Err(RingError::Broken(v)));
        assert_eq!(
            back.push_response(&BlkifResponse::default()),
            Err(RingError::Broken(v))
        );
        assert!(!back.has_unconsumed_requests());
        assert!(!back.push_responses_and_check_notify());
        assert_eq!(back.broken(), Some(&v));
    }
}

#[test]
fn req_prod_far_ahead_stops_the_ring() {
    let (mem, raw) = ring();
    let mut back = BackRing::<Blkif, _>::attach(mem).unwrap();
    garbage_slots(&raw, 7);
    raw.store(SharedIndex::ReqProd, 1_000_000);
    let err = back.take_request().unwrap_err();
    let RingError::HostileProducer(v) = err else {
        panic!("{err:?}")
    };
    assert_eq!(v.peer, Peer::Frontend);
    assert_eq!(v.kind, ViolationKind::PastRingSize);
    assert_eq!(
        (v.index, v.prod, v.cons, v.size),
        ("req_prod", 1_000_000, 0, SIZE)
    );
    let text = err.to_string();
    for needle in [
        "req_prod = 1000000",
        "rsp_prod_pvt = 0",
        "32 slots",
        "blkif",
    ] {
        assert!(text.contains(needle), "{text:?} lacks {needle:?}");
    }
    // A sane index later does not repair the ring.
    raw.store(SharedIndex::ReqProd, 1);
    assert_stays_broken(&mut back, v);
}

#[test]
fn req_prod_going_backwards_stops_the_ring() {
    let (mem, raw) = ring();
    let mut back = BackRing::<Blkif, _>::attach(mem).unwrap();
    raw.store(SharedIndex::ReqProd, 10);
    for _ in 0..10 {
        back.take_request().unwrap().unwrap();
    }
    for _ in 0..4 {
        back.push_response(&BlkifResponse::default()).unwrap();
    }
    raw.store(SharedIndex::ReqProd, 7);
    let err = back.take_request().unwrap_err();
    let RingError::HostileProducer(v) = err else {
        panic!("{err:?}")
    };
    assert_eq!((v.kind, v.prod, v.cons), (ViolationKind::Backwards, 7, 10));
    assert!(err.to_string().contains("moved back to 7"), "{err}");
    assert_stays_broken(&mut back, v);
}

#[test]
fn final_check_also_validates() {
    let (mem, raw) = ring();
    let mut back = BackRing::<Blkif, _>::attach(mem).unwrap();
    raw.store(SharedIndex::ReqProd, u32::MAX);
    assert!(matches!(
        back.final_check_for_requests(),
        Err(RingError::HostileProducer(_))
    ));
    assert!(back.broken().is_some());
}

#[test]
fn attach_refuses_an_overfull_ring() {
    let (mem, raw) = ring();
    raw.store(SharedIndex::ReqProd, SIZE + 1);
    let err = BackRing::<Blkif, _>::attach(mem).unwrap_err();
    assert!(
        matches!(
            err,
            RingError::HostileProducer(Violation {
                prod: 33,
                cons: 0,
                size: 32,
                ..
            })
        ),
        "{err}"
    );
}

#[test]
fn hostile_backend_rsp_prod_breaks_the_frontend() {
    let (mem, raw) = ring();
    let mut front = FrontRing::<Blkif, _>::attach(mem).unwrap();
    front.push_request(&BlkifRequest::default()).unwrap();
    front.push_requests();
    // Within the ring, but past the one request ever published.
    raw.store(SharedIndex::RspProd, 5);
    let err = front.take_response().unwrap_err();
    assert!(
        matches!(
            err,
            RingError::HostileConsumer(Violation {
                kind: ViolationKind::PastRequests,
                prod: 5,
                limit: 1,
                ..
            })
        ),
        "{err}"
    );
    assert!(matches!(front.take_response(), Err(RingError::Broken(_))));
    assert!(matches!(
        front.push_request(&BlkifRequest::default()),
        Err(RingError::Broken(_))
    ));
    assert!(matches!(
        front.final_check_for_responses(),
        Err(RingError::Broken(_))
    ));

    let (mem, raw) = ring();
    let mut front = FrontRing::<Blkif, _>::attach(mem).unwrap();
    raw.store(SharedIndex::RspProd, 0x8000_0000);
    let err = front.final_check_for_responses().unwrap_err();
    assert!(
        matches!(
            err,
            RingError::HostileProducer(Violation {
                kind: ViolationKind::PastRingSize,
                ..
            })
        ),
        "{err}"
    );
}

#[test]
fn garbage_slots_are_copied_not_trusted() {
    // Garbage in the slots is not the ring's concern (the request parser
    // validates the copy), but each slot is handed out once per index, and
    // the copy does not change when the peer rewrites the slot.
    let (mem, raw) = ring();
    let mut back = BackRing::<Blkif, _>::attach(mem).unwrap();
    garbage_slots(&raw, 99);
    raw.store(SharedIndex::ReqProd, SIZE);
    let first = back.take_request().unwrap().unwrap();
    assert_eq!(first, raw.read_request(0));
    garbage_slots(&raw, 100);
    assert_ne!(raw.read_request(0), first, "the peer rewrote slot 0");
    let mut n = 1;
    while back.take_request().unwrap().is_some() {
        n += 1;
    }
    assert_eq!(n, SIZE);
}

/// What a hostile frontend does between two steps of the backend.
#[derive(Clone, Debug)]
enum Attack {
    /// Publish this many more requests (honest).
    Publish(u32),
    /// Write any value to req_prod.
    SetReqProd(u32),
    /// Move req_prod by a small amount, either way.
    Nudge(i32),
    /// Overwrite req_event, rsp_prod or rsp_event (the backend's own index
    /// included: the peer can write anything).
    Scribble(u8, u32),
    /// Fill the slots with garbage.
    Garbage(u64),
}

fn attack() -> impl Strategy<Value = Attack> {
    prop_oneof![
        3 => (0u32..=40).prop_map(Attack::Publish),
        2 => any::<u32>().prop_map(Attack::SetReqProd),
        2 => (-40i32..=40).prop_map(Attack::Nudge),
        1 => (1u8..4, any::<u32>()).prop_map(|(i, v)| Attack::Scribble(i, v)),
        1 => any::<u64>().prop_map(Attack::Garbage),
    ]
}

/// One round of the blkback loop, bounded: take everything, answer some,
/// publish, final check. Returns the first error.
fn backend_round(back: &mut BackRing<Blkif, Mem>, answer: u32) -> Result<(), RingError> {
    let mut taken = 0u32;
    // More than a ring's worth of requests per snapshot is impossible;
    // the bound turns an endless loop into a failure.
    while let Some(_req) = back.take_request()? {
        taken += 1;
        assert!(
            taken <= SIZE,
            "took more than a ring's worth without answering"
        );
    }
    for _ in 0..answer.min(back.unanswered()) {
        back.push_response(&BlkifResponse::default())?;
    }
    back.push_responses_and_check_notify();
    back.final_check_for_requests()?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn backend_survives_any_frontend(
        attacks in proptest::collection::vec((attack(), 0u32..40), 1..60),
    ) {
        let (mem, raw) = ring();
        let mut back = BackRing::<Blkif, _>::attach(mem).unwrap();
        let mut broken: Option<Violation> = None;
        for (attack, answer) in attacks {
            match attack {
                Attack::Publish(n) => {
                    let p = raw.load(SharedIndex::ReqProd);
                    raw.store(SharedIndex::ReqProd, p.wrapping_add(n));
                }
                Attack::SetReqProd(v) => raw.store(SharedIndex::ReqProd, v),
                Attack::Nudge(d) => {
                    let p = raw.load(SharedIndex::ReqProd);
                    raw.store(SharedIndex::ReqProd, p.wrapping_add_signed(d));
                }
                Attack::Scribble(i, v) => {
                    let index = [SharedIndex::ReqEvent, SharedIndex::RspProd, SharedIndex::RspEvent]
                        [usize::from(i) - 1];
                    raw.store(index, v);
                }
                Attack::Garbage(seed) => garbage_slots(&raw, seed),
            }
            let result = backend_round(&mut back, answer);
            match (broken, result) {
                (None, Ok(())) => {
                    // Whatever was accepted keeps the backend within its
                    // ring: never more taken-and-unanswered than slots.
                    prop_assert!(back.unanswered() <= SIZE);
                }
                (None, Err(RingError::HostileProducer(v))) => {
                    prop_assert_eq!(v.peer, Peer::Frontend);
                    match v.kind {
                        ViolationKind::PastRingSize => {
                            prop_assert!(v.prod.wrapping_sub(v.cons) > v.size)
                        }
                        ViolationKind::Backwards => {
                            prop_assert!(v.cons.wrapping_sub(v.prod) > 0)
                        }
                        ViolationKind::PastRequests => prop_assert!(false, "{}", v),
                    }
                    prop_assert_eq!(back.broken(), Some(&v));
                    broken = Some(v);
                }
                (None, Err(e)) => prop_assert!(false, "unexpected error {}", e),
                (Some(v), r) => prop_assert_eq!(r, Err(RingError::Broken(v))),
            }
        }
    }

    #[test]
    fn frontend_survives_any_backend(
        moves in proptest::collection::vec((any::<bool>(), any::<u32>(), 0u32..40), 1..60),
    ) {
        let (mem, raw) = ring();
        let mut front = FrontRing::<Blkif, _>::attach(mem).unwrap();
        let mut broken = None;
        for (near, value, push) in moves {
            for _ in 0..push.min(front.free_requests()) {
                front.push_request(&BlkifRequest::default()).unwrap_or(());
            }
            front.push_requests_and_check_notify();
            let rsp_prod = if near {
                front.rsp_cons().wrapping_add(value % 48)
            } else {
                value
            };
            raw.store(SharedIndex::RspProd, rsp_prod);
            let mut got = 0u32;
            let result = loop {
                match front.take_response() {
                    Ok(Some(_)) => {
                        got += 1;
                        prop_assert!(got <= SIZE, "took more than a ring's worth");
                    }
                    Ok(None) => break front.final_check_for_responses().map(|_| ()),
                    Err(e) => break Err(e),
                }
            };
            match (broken, result) {
                (None, Ok(())) => prop_assert!(front.free_requests() <= SIZE),
                (None, Err(RingError::HostileProducer(v) | RingError::HostileConsumer(v))) => {
                    prop_assert_eq!(v.peer, Peer::Backend);
                    broken = Some(v);
                }
                (None, Err(e)) => prop_assert!(false, "unexpected error {}", e),
                (Some(v), r) => prop_assert_eq!(r, Err(RingError::Broken(v))),
            }
        }
    }
}

/// The frontend rewrites req_prod as fast as it can while the backend runs
/// its loop: every call must return, and once broken the backend stays so.
#[test]
fn backend_survives_a_concurrent_index_storm() {
    let (mem, raw) = ring();
    let raw = Arc::new(raw);
    let mut back = BackRing::<Blkif, _>::attach(mem).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let storm = {
        let (raw, stop) = (raw.clone(), stop.clone());
        thread::spawn(move || {
            let mut x = 0x2545_f491_4f6c_dd1du64;
            let mut writes = 0u64;
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Mostly plausible values, so the backend works a while
                // before it sees an impossible one.
                let v = if x.is_multiple_of(1024) {
                    x as u32
                } else {
                    (x % 40) as u32
                };
                raw.store(SharedIndex::ReqProd, v);
                writes += 1;
            }
            writes
        })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut rounds = 0u64;
    let violation = loop {
        assert!(
            Instant::now() < deadline,
            "the backend never detected the storm"
        );
        rounds += 1;
        match backend_round(&mut back, 40) {
            Ok(()) => {}
            Err(RingError::HostileProducer(v)) => break v,
            Err(e) => panic!("unexpected error {e}"),
        }
    };
    stop.store(true, Ordering::Relaxed);
    let writes = storm.join().unwrap();
    assert!(writes > 0 && rounds > 0);
    assert_stays_broken(&mut back, violation);
}
