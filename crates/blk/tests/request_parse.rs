//! blkif request validation: one test per check of Linux blkback's table
//! (docs/xen-protocols.md §7.2 rows 5–10), the accepted shapes, and
//! property tests that random slots and indirect pages never panic and that
//! every accepted request stays inside the disk and its pages.

use std::collections::HashMap;

use proptest::prelude::*;
use pvio_abi::blkif::*;
use pvio_blk::request::{
    assert_request_invariants, error_response, fuzz_parse, DiskLimits, IndirectPage,
    NoIndirectPages, Operation, Request, RequestError, FUZZ_LIMITS_LEN,
};
use zerocopy::IntoBytes;

const DISK: u64 = 1 << 20; // sectors: 512 MiB

fn seg(gref: u32, first: u8, last: u8) -> BlkifRequestSegment {
    BlkifRequestSegment {
        gref,
        first_sect: first,
        last_sect: last,
        _pad: [0; 2],
    }
}

fn direct(op: u8, sector: u64, segs: &[BlkifRequestSegment]) -> BlkifRequest {
    let mut r = BlkifRequest {
        operation: op,
        nr_segments: segs.len() as u8,
        id: 0xfeed,
        sector_number: sector,
        ..Default::default()
    };
    r.seg[..segs.len()].copy_from_slice(segs);
    r
}

fn indirect(op: u8, sector: u64, nseg: u16, grefs: &[u32]) -> BlkifRequest {
    let mut r = BlkifRequestIndirect {
        operation: BLKIF_OP_INDIRECT,
        indirect_op: op,
        nr_segments: nseg,
        id: 77,
        sector_number: sector,
        ..Default::default()
    };
    r.indirect_grefs[..grefs.len()].copy_from_slice(grefs);
    BlkifRequest::from_indirect(&r)
}

fn discard(sector: u64, n: u64, flag: u8) -> BlkifRequest {
    BlkifRequest::from_discard(&BlkifRequestDiscard {
        operation: BLKIF_OP_DISCARD,
        flag,
        id: 9,
        sector_number: sector,
        nr_sectors: n,
        ..Default::default()
    })
}

/// Indirect pages keyed by gref; records which grefs were asked for.
struct Pages {
    pages: HashMap<u32, Vec<BlkifRequestSegment>>,
    asked: Vec<u32>,
}

impl Pages {
    fn new() -> Self {
        Self {
            pages: HashMap::new(),
            asked: Vec::new(),
        }
    }
    fn with(mut self, gref: u32, segs: Vec<BlkifRequestSegment>) -> Self {
        self.pages.insert(gref, segs);
        self
    }
    fn parse(&mut self, slot: &BlkifRequest, limits: &DiskLimits) -> Result<Request, RequestError> {
        let pages = &self.pages;
        let asked = &mut self.asked;
        let mut f = |gref: u32, page: &mut IndirectPage| -> Result<(), std::io::Error> {
            asked.push(gref);
            let segs = pages
                .get(&gref)
                .ok_or_else(|| std::io::Error::other(format!("no grant {gref}")))?;
            page.fill(0);
            let bytes = segs.as_bytes();
            page[..bytes.len()].copy_from_slice(bytes);
            Ok(())
        };
        Request::parse(slot, limits, &mut f)
    }
}

fn parse(slot: &BlkifRequest, limits: &DiskLimits) -> Result<Request, RequestError> {
    Request::parse(slot, limits, &mut NoIndirectPages)
}

fn limits() -> DiskLimits {
    DiskLimits::new(DISK)
}

#[test]
fn direct_read_is_parsed_with_offsets() {
    let slot = direct(
        BLKIF_OP_READ,
        100,
        &[seg(5, 0, 7), seg(6, 2, 3), seg(7, 7, 7)],
    );
    let r = parse(&slot, &limits()).unwrap();
    assert_eq!(r.id(), 0xfeed);
    assert_eq!(r.operation(), Operation::Read);
    assert_eq!(r.sector(), 100);
    assert_eq!(r.nr_sectors(), 8 + 2 + 1);
    assert_eq!(r.len_bytes(), 11 * 512);
    let s = r.segments();
    assert_eq!(s.len(), 3);
    assert_eq!(
        (s[1].gref(), s[1].page_offset(), s[1].len()),
        (6, 1024, 1024)
    );
    assert_eq!(s[0].disk_offset(), 100 * 512);
    assert_eq!(s[1].disk_sector(), 108);
    assert_eq!(s[2].disk_sector(), 110);
    assert_eq!((s[2].page_offset(), s[2].len()), (3584, 512));
    assert_request_invariants(&r, &limits());
    let rsp = r.response(BLKIF_RSP_OKAY);
    assert_eq!(
        (rsp.id, rsp.operation, rsp.status),
        (0xfeed, BLKIF_OP_READ, 0)
    );
}

#[test]
fn eleven_segments_accepted_twelve_refused() {
    let segs: Vec<_> = (0..11).map(|i| seg(i, 0, 7)).collect();
    let r = parse(&direct(BLKIF_OP_WRITE, 0, &segs), &limits()).unwrap();
    assert_eq!(r.segments().len(), 11);
    let mut slot = direct(BLKIF_OP_WRITE, 0, &segs);
    slot.nr_segments = 12;
    let e = parse(&slot, &limits()).unwrap_err();
    assert!(
        matches!(e, RequestError::TooManySegments { nr: 12, max: 11 }),
        "{e}"
    );
    assert_eq!(e.status(), BLKIF_RSP_ERROR);
    slot.nr_segments = 255;
    assert!(parse(&slot, &limits()).is_err());
}

#[test]
fn unknown_operations_are_eopnotsupp() {
    for op in [BLKIF_OP_RESERVED_1, 7, 8, 200, 255] {
        let e = parse(&direct(op, 0, &[seg(1, 0, 0)]), &limits()).unwrap_err();
        assert!(matches!(e, RequestError::UnknownOperation { .. }), "{e}");
        assert_eq!(e.status(), BLKIF_RSP_EOPNOTSUPP);
        let rsp = error_response(&direct(op, 0, &[]), &e);
        assert_eq!((rsp.id, rsp.operation, rsp.status), (0xfeed, op, -2));
    }
}

#[test]
fn optional_operations_follow_the_disk() {
    let none = DiskLimits {
        flush: false,
        barrier: false,
        discard: false,
        max_indirect_segments: 0,
        ..limits()
    };
    for slot in [
        direct(BLKIF_OP_FLUSH_DISKCACHE, 0, &[]),
        direct(BLKIF_OP_WRITE_BARRIER, 0, &[]),
        discard(0, 8, 0),
        indirect(BLKIF_OP_READ, 0, 1, &[1]),
    ] {
        let e = parse(&slot, &none).unwrap_err();
        assert!(matches!(e, RequestError::NotOffered { .. }), "{e}");
        assert_eq!(e.status(), BLKIF_RSP_EOPNOTSUPP);
        // Offered: accepted (the indirect one needs its page).
        let ok = Pages::new()
            .with(1, vec![seg(9, 0, 7)])
            .parse(&slot, &limits());
        assert!(ok.is_ok(), "{:?}", ok);
    }
}

#[test]
fn flush_and_barrier_may_carry_no_data() {
    let r = parse(&direct(BLKIF_OP_FLUSH_DISKCACHE, 123, &[]), &limits()).unwrap();
    assert_eq!(r.operation(), Operation::Flush);
    assert_eq!(r.nr_sectors(), 0);
    assert!(r.segments().is_empty());
    // Sector of an empty flush is ignored (Linux checks no range).
    let r = parse(&direct(BLKIF_OP_WRITE_BARRIER, u64::MAX, &[]), &limits()).unwrap();
    assert_eq!(r.operation(), Operation::WriteBarrier);
    assert_eq!(r.sector(), 0);
    // With data they are writes, range-checked.
    let r = parse(
        &direct(BLKIF_OP_FLUSH_DISKCACHE, 8, &[seg(1, 0, 7)]),
        &limits(),
    )
    .unwrap();
    assert_eq!(r.nr_sectors(), 8);
    let e = parse(
        &direct(BLKIF_OP_FLUSH_DISKCACHE, DISK, &[seg(1, 0, 7)]),
        &limits(),
    )
    .unwrap_err();
    assert!(matches!(e, RequestError::BeyondEnd { .. }), "{e}");
}

#[test]
fn reads_and_writes_need_segments() {
    for op in [BLKIF_OP_READ, BLKIF_OP_WRITE] {
        let e = parse(&direct(op, 0, &[]), &limits()).unwrap_err();
        assert!(matches!(e, RequestError::NoSegments { .. }), "{e}");
        assert_eq!(e.status(), BLKIF_RSP_ERROR);
        let e = Pages::new()
            .parse(&indirect(op, 0, 0, &[1]), &limits())
            .unwrap_err();
        assert!(matches!(e, RequestError::NoSegments { .. }), "{e}");
    }
}

#[test]
fn bad_segment_sector_ranges() {
    for (first, last) in [(0, 8), (3, 2), (7, 6), (0, 255), (9, 9)] {
        let slot = direct(BLKIF_OP_READ, 0, &[seg(1, 0, 7), seg(2, first, last)]);
        let e = parse(&slot, &limits()).unwrap_err();
        assert!(
            matches!(e, RequestError::BadSegment { index: 1, .. }),
            "{first}..{last}: {e}"
        );
        assert_eq!(e.status(), BLKIF_RSP_ERROR);
    }
    // In an indirect page too, at the right index.
    let mut segs = vec![seg(1, 0, 7); 200];
    segs[199] = seg(1, 5, 4);
    let e = Pages::new()
        .with(4, segs)
        .parse(&indirect(BLKIF_OP_WRITE, 0, 200, &[4]), &limits())
        .unwrap_err();
    assert!(
        matches!(e, RequestError::BadSegment { index: 199, .. }),
        "{e}"
    );
}

#[test]
fn read_only_disk_refuses_changes() {
    let ro = DiskLimits {
        read_only: true,
        ..limits()
    };
    for slot in [
        direct(BLKIF_OP_WRITE, 0, &[seg(1, 0, 7)]),
        direct(BLKIF_OP_WRITE_BARRIER, 0, &[]),
        direct(BLKIF_OP_FLUSH_DISKCACHE, 0, &[seg(1, 0, 7)]),
        discard(0, 8, 0),
    ] {
        let e = parse(&slot, &ro).unwrap_err();
        assert!(matches!(e, RequestError::ReadOnly { .. }), "{e}");
        assert_eq!(e.status(), BLKIF_RSP_ERROR);
    }
    let e = Pages::new()
        .with(1, vec![seg(2, 0, 7)])
        .parse(&indirect(BLKIF_OP_WRITE, 0, 1, &[1]), &ro)
        .unwrap_err();
    assert!(matches!(e, RequestError::ReadOnly { .. }), "{e}");
    // Reads and an empty flush are fine.
    assert!(parse(&direct(BLKIF_OP_READ, 0, &[seg(1, 0, 7)]), &ro).is_ok());
    assert!(parse(&direct(BLKIF_OP_FLUSH_DISKCACHE, 0, &[]), &ro).is_ok());
}

#[test]
fn ranges_overflowing_or_beyond_the_disk() {
    let e = parse(
        &direct(BLKIF_OP_READ, u64::MAX - 3, &[seg(1, 0, 7)]),
        &limits(),
    )
    .unwrap_err();
    assert!(matches!(e, RequestError::RangeOverflow { .. }), "{e}");
    let e = parse(&direct(BLKIF_OP_READ, DISK - 7, &[seg(1, 0, 7)]), &limits()).unwrap_err();
    assert!(
        matches!(e, RequestError::BeyondEnd { sector, nr_sectors: 8, disk_sectors: DISK } if sector == DISK - 7),
        "{e}"
    );
    // Ending exactly at the end is fine.
    let r = parse(&direct(BLKIF_OP_READ, DISK - 8, &[seg(1, 0, 7)]), &limits()).unwrap();
    assert_eq!(r.sector() + r.nr_sectors(), DISK);
    // Discard ranges are checked the same way.
    let e = parse(&discard(u64::MAX, 2, 0), &limits()).unwrap_err();
    assert!(matches!(e, RequestError::RangeOverflow { .. }), "{e}");
    let e = parse(&discard(8, DISK, 0), &limits()).unwrap_err();
    assert!(matches!(e, RequestError::BeyondEnd { .. }), "{e}");
    let r = parse(&discard(8, DISK - 8, BLKIF_DISCARD_SECURE), &limits()).unwrap();
    assert_eq!(r.operation(), Operation::Discard { secure: false });
    assert!(r.segments().is_empty());
    assert_eq!((r.sector(), r.nr_sectors(), r.id()), (8, DISK - 8, 9));
    let secure = DiskLimits {
        discard_secure: true,
        ..limits()
    };
    let r = parse(&discard(0, 8, BLKIF_DISCARD_SECURE), &secure).unwrap();
    assert_eq!(r.operation(), Operation::Discard { secure: true });
}

#[test]
fn block_status_queries_take_one_whole_page_on_the_disk() {
    let q = |sector, segs: &[BlkifRequestSegment]| direct(BLKIF_OP_PVIO_BLOCK_STATUS, sector, segs);
    let r = parse(&q(DISK - 1, &[seg(5, 0, 7)]), &limits()).unwrap();
    assert_eq!(r.operation(), Operation::BlockStatus);
    assert_eq!(
        (r.sector(), r.nr_sectors(), r.segments().len()),
        (DISK - 1, 0, 1)
    );
    assert_eq!(r.segments()[0].gref(), 5);
    assert!(r.operation().fills_segments() && !r.changes_disk());
    assert_request_invariants(&r, &limits());
    // Read-only disks answer it too.
    let ro = DiskLimits {
        read_only: true,
        ..limits()
    };
    assert!(parse(&q(0, &[seg(5, 0, 7)]), &ro).is_ok());
    for (what, slot) in [
        ("no page", q(0, &[])),
        ("two pages", q(0, &[seg(5, 0, 7), seg(6, 0, 7)])),
        ("half a page", q(0, &[seg(5, 0, 3)])),
        ("a page from sector 1", q(0, &[seg(5, 1, 7)])),
        ("at the end", q(DISK, &[seg(5, 0, 7)])),
        ("past the end", q(u64::MAX, &[seg(5, 0, 7)])),
    ] {
        let e = parse(&slot, &limits()).unwrap_err();
        assert_eq!(e.status(), BLKIF_RSP_ERROR, "{what}: {e}");
    }
    let not_offered = DiskLimits {
        block_status: false,
        ..limits()
    };
    let e = parse(&q(0, &[seg(5, 0, 7)]), &not_offered).unwrap_err();
    assert_eq!(e.status(), BLKIF_RSP_EOPNOTSUPP, "{e}");
}

#[test]
fn logical_block_alignment() {
    let l4k = DiskLimits {
        logical_block_size: 4096,
        ..limits()
    };
    assert!(parse(
        &direct(BLKIF_OP_READ, 8, &[seg(1, 0, 7), seg(2, 0, 7)]),
        &l4k
    )
    .is_ok());
    for slot in [
        direct(BLKIF_OP_READ, 4, &[seg(1, 0, 7)]),
        direct(BLKIF_OP_READ, 8, &[seg(1, 0, 3), seg(2, 4, 7)]),
        discard(8, 4, 0),
        discard(1, 8, 0),
    ] {
        let e = parse(&slot, &l4k).unwrap_err();
        assert!(
            matches!(
                e,
                RequestError::Misaligned {
                    block_sectors: 8,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(e.status(), BLKIF_RSP_ERROR);
    }
}

#[test]
fn indirect_requests() {
    // 600 segments span two pages; only those two are asked for.
    let p1: Vec<_> = (0..512).map(|i| seg(1000 + i, 0, 7)).collect();
    let p2: Vec<_> = (0..88).map(|i| seg(2000 + i, 1, 2)).collect();
    let big = DiskLimits {
        max_indirect_segments: 1024,
        ..limits()
    };
    let mut pages = Pages::new().with(11, p1).with(12, p2);
    let r = pages
        .parse(&indirect(BLKIF_OP_READ, 16, 600, &[11, 12, 13, 14]), &big)
        .unwrap();
    assert_eq!(pages.asked, [11, 12]);
    assert!(r.is_indirect());
    assert_eq!(r.operation(), Operation::Read);
    assert_eq!(r.response_operation(), BLKIF_OP_READ);
    assert_eq!(r.segments().len(), 600);
    assert_eq!(r.nr_sectors(), 512 * 8 + 88 * 2);
    assert_eq!(r.segments()[512].gref(), 2000);
    assert_eq!(r.segments()[512].disk_sector(), 16 + 512 * 8);
    assert_request_invariants(&r, &big);

    // The default limit is 256 (one page).
    let e = Pages::new()
        .parse(&indirect(BLKIF_OP_READ, 0, 257, &[1]), &limits())
        .unwrap_err();
    assert!(
        matches!(e, RequestError::TooManySegments { nr: 257, max: 256 }),
        "{e}"
    );
    // A disk limit above the protocol's 8 × 512 is capped.
    let huge = DiskLimits {
        max_indirect_segments: 100_000,
        ..limits()
    };
    let e = Pages::new()
        .parse(&indirect(BLKIF_OP_READ, 0, 4097, &[1]), &huge)
        .unwrap_err();
    assert!(
        matches!(
            e,
            RequestError::TooManySegments {
                nr: 4097,
                max: 4096
            }
        ),
        "{e}"
    );
    // Only read and write may be indirect.
    for op in [
        BLKIF_OP_WRITE_BARRIER,
        BLKIF_OP_FLUSH_DISKCACHE,
        BLKIF_OP_DISCARD,
        BLKIF_OP_INDIRECT,
        42,
    ] {
        let slot = indirect(op, 0, 1, &[1]);
        let e = Pages::new().parse(&slot, &limits()).unwrap_err();
        assert!(
            matches!(e, RequestError::BadIndirectOperation { .. }),
            "{e}"
        );
        assert_eq!(e.status(), BLKIF_RSP_ERROR);
        assert_eq!(error_response(&slot, &e).operation, op);
    }
    // A page that cannot be copied.
    let e = Pages::new()
        .parse(&indirect(BLKIF_OP_READ, 0, 1, &[99]), &limits())
        .unwrap_err();
    assert!(
        matches!(
            e,
            RequestError::IndirectPage {
                index: 0,
                gref: 99,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("no grant 99"), "{e}");
}

#[test]
fn indirect_page_is_read_once_per_request() {
    // A source whose page changes after every copy: the parse must use one
    // snapshot (each descriptor read from the private copy exactly once).
    let mut copies = 0;
    let mut source = |_: u32, page: &mut IndirectPage| -> Result<(), std::io::Error> {
        copies += 1;
        let segs = if copies == 1 {
            vec![seg(1, 0, 7); 4]
        } else {
            vec![seg(1, 0, 200); 4]
        };
        page.fill(0);
        page[..32].copy_from_slice(segs.as_bytes());
        Ok(())
    };
    let r = Request::parse(&indirect(BLKIF_OP_READ, 0, 4, &[3]), &limits(), &mut source).unwrap();
    assert_eq!(r.nr_sectors(), 32);
    assert_eq!(copies, 1);
}

#[test]
fn errors_say_what_and_which() {
    let e = parse(&direct(BLKIF_OP_READ, DISK, &[seg(1, 0, 7)]), &limits()).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains(&DISK.to_string()), "{msg}");
    assert_eq!(e.kind(), "beyond_end");
    let e = parse(
        &direct(BLKIF_OP_DISCARD, 0, &[]),
        &DiskLimits {
            discard: false,
            ..limits()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("discard"), "{e}");
}

#[test]
fn fuzz_entry_accepts_short_and_odd_inputs() {
    fuzz_parse(&[]);
    fuzz_parse(&[BLKIF_OP_INDIRECT; 7]);
    // A valid indirect read with its page, through the fuzz layout.
    let mut data = indirect(BLKIF_OP_READ, 0, 2, &[0]).as_bytes().to_vec();
    let mut lim = [0u8; FUZZ_LIMITS_LEN];
    lim[..8].copy_from_slice(&1000u64.to_le_bytes());
    lim[9] = 0b1111;
    lim[10..12].copy_from_slice(&256u16.to_le_bytes());
    data.extend_from_slice(&lim);
    data.extend_from_slice([seg(1, 0, 7), seg(2, 0, 7)].as_bytes());
    fuzz_parse(&data);
}

fn arb_limits() -> impl Strategy<Value = DiskLimits> {
    (
        prop_oneof![Just(0u64), 1..64u64, Just(DISK), any::<u64>()],
        0..4u32,
        any::<[bool; 6]>(),
        prop_oneof![Just(0u32), 1..300u32, Just(256u32), any::<u32>()],
    )
        .prop_map(|(sectors, shift, f, max_ind)| DiskLimits {
            sectors,
            logical_block_size: 512 << shift,
            read_only: f[0],
            flush: f[1],
            barrier: f[2],
            discard: f[3],
            discard_secure: f[4],
            max_indirect_segments: max_ind,
            block_status: f[5],
        })
}

fn arb_segment() -> impl Strategy<Value = BlkifRequestSegment> {
    (any::<u32>(), 0..10u8, 0..10u8).prop_map(|(g, f, l)| seg(g, f.min(8), l))
}

/// Mostly plausible slots, so the accepting path is well exercised.
fn arb_slot() -> impl Strategy<Value = BlkifRequest> {
    (
        0..8u8,
        0..13u8,
        prop_oneof![0..64u64, Just(DISK - 8), any::<u64>()],
        proptest::collection::vec(arb_segment(), 11),
        0..3u8,
        0..600u16,
        prop_oneof![0..64u64, any::<u64>()],
    )
        .prop_map(|(op, nseg, sector, segs, ind_op, ind_n, disc_n)| match op {
            BLKIF_OP_INDIRECT => indirect(ind_op, sector, ind_n, &[1, 2, 3]),
            BLKIF_OP_DISCARD => discard(sector, disc_n, nseg & 1),
            _ => {
                // 7 stands for pvio's block-status query (0xf0).
                let code = if op == 7 {
                    BLKIF_OP_PVIO_BLOCK_STATUS
                } else {
                    op
                };
                let mut r = direct(code, sector, &segs);
                r.nr_segments = nseg;
                r
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(
        slot in proptest::collection::vec(any::<u8>(), 0..112 + FUZZ_LIMITS_LEN),
        pages in proptest::collection::vec(any::<u8>(), 0..2 * 4096),
    ) {
        let mut data = slot;
        data.resize(112 + FUZZ_LIMITS_LEN, 0);
        data.extend_from_slice(&pages);
        fuzz_parse(&data);
    }

    #[test]
    fn accepted_requests_stay_inside_disk_and_pages(
        slot in arb_slot(),
        limits in arb_limits(),
        page in proptest::collection::vec(arb_segment(), 512),
    ) {
        let mut source = |_: u32, p: &mut IndirectPage| -> Result<(), std::io::Error> {
            p.copy_from_slice(page.as_bytes());
            Ok(())
        };
        match Request::parse(&slot, &limits, &mut source) {
            Ok(r) => assert_request_invariants(&r, &limits),
            Err(e) => {
                let rsp = error_response(&slot, &e);
                prop_assert_eq!(rsp.id, slot.id);
                let unsupported = matches!(
                    e,
                    RequestError::UnknownOperation { .. } | RequestError::NotOffered { .. }
                );
                prop_assert_eq!(rsp.status == BLKIF_RSP_EOPNOTSUPP, unsupported);
            }
        }
    }
}

#[test]
fn plausible_slot_strategy_exercises_the_accepting_path() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    let strategy = (arb_slot(), proptest::collection::vec(arb_segment(), 512));
    let (mut accepted, mut total) = (0, 0);
    for _ in 0..2000 {
        let (slot, page) = strategy.new_tree(&mut runner).unwrap().current();
        let mut source = |_: u32, p: &mut IndirectPage| -> Result<(), std::io::Error> {
            p.copy_from_slice(page.as_bytes());
            Ok(())
        };
        total += 1;
        if let Ok(r) = Request::parse(&slot, &limits(), &mut source) {
            assert_request_invariants(&r, &limits());
            accepted += 1;
        }
    }
    assert!(accepted * 20 > total, "only {accepted} of {total} accepted");
}
