//! A hostile frontend: the test process claims a guest domain, connects to a
//! real `pvio tapdisk` through the xenbus handshake, then pushes every class
//! of bad blkif request Linux blkback refuses (docs/xen-protocols.md §7.2).
//! Each must be answered with the right status and counted, the backend
//! must stay up, and a good request afterwards must still work.

use std::time::Duration;

use pvio_abi::blkif::*;
use pvio_bench::host::{make_image, xvd_devid, MiniHost};
use pvio_blk::device::{BlockDevice, DeviceCompletion, DeviceError};
use pvio_blk::front::{connect, BlkQueue, FrontendConfig, GuestResources};
use pvio_hv::memory::RESERVED_FRAMES;
use pvio_hv::HvClient;
use pvio_poll::PollPolicy;

fn send(q: &mut BlkQueue, slot: BlkifRequest, tag: u64) -> Result<u32, DeviceError> {
    q.submit_raw(slot, tag).expect("room on the ring");
    q.kick().unwrap();
    let mut out: Vec<DeviceCompletion> = Vec::new();
    let end = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        q.wait(&mut out, Some(Duration::from_secs(1))).unwrap();
        if let Some(c) = out.iter().find(|c| c.tag == tag) {
            return c.result.clone();
        }
        assert!(
            std::time::Instant::now() < end,
            "no response to request {tag}"
        );
    }
}

fn read(sector: u64, segs: &[(u32, u8, u8)]) -> BlkifRequest {
    let mut r = BlkifRequest {
        operation: BLKIF_OP_READ,
        nr_segments: segs.len() as u8,
        sector_number: sector,
        ..Default::default()
    };
    for (i, &(gref, first, last)) in segs.iter().take(11).enumerate() {
        r.seg[i] = BlkifRequestSegment {
            gref,
            first_sect: first,
            last_sect: last,
            _pad: [0; 2],
        };
    }
    r
}

/// This process becomes domain `d`'s guest: claims it, and reaches the
/// xenstore over the xenbus ring, as a real guest does.
fn become_guest(
    host: &MiniHost,
    d: &pvio_hv::CreatedDomain,
) -> (
    tokio::runtime::Runtime,
    GuestResources,
    pvio_xenstore::Client,
) {
    let dom = HvClient::claim_domain(&host.hvd_socket, d.domid, d.token).unwrap();
    let (res, store) = GuestResources::new(dom, RESERVED_FRAMES);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let xs = rt
        .block_on(pvio_xenstore::Client::connect_ring(
            res.memory.clone(),
            store,
        ))
        .unwrap();
    (rt, res, xs)
}

#[test]
fn a_hostile_frontend_gets_errors_and_a_good_request_still_works() {
    std::env::set_var("PVIO_BIN", env!("CARGO_BIN_EXE_pvio"));
    let host = MiniHost::start("blk-hostile").unwrap();
    let img = make_image(&host.dir.0, "disk.img", 8 << 20).unwrap();
    let ro_img = make_image(&host.dir.0, "ro.img", 1 << 20).unwrap();
    let d = host.create_domain("hostile", 64).unwrap();
    let vbd = host
        .add_vbd(d.domid, xvd_devid(0), &img, true, &[])
        .unwrap();
    let ro = host
        .add_vbd(d.domid, xvd_devid(1), &ro_img, false, &[])
        .unwrap();
    let mut tap = host.start_tapdisk(&vbd, &[]).unwrap();
    let mut tap_ro = host.start_tapdisk(&ro, &[]).unwrap();
    for v in [&vbd, &ro] {
        host.wait_for_value(
            &format!("{}/state", v.backend),
            "2",
            Duration::from_secs(20),
        )
        .unwrap();
    }

    let (rt, res, xs) = become_guest(&host, &d);
    let mut cfg = FrontendConfig::new(xvd_devid(0));
    cfg.buffers = 2;
    cfg.buffer_size = 64 << 10;
    cfg.poll = PollPolicy::Off;
    let (_front, mut queues) = rt.block_on(connect(res.clone(), xs.clone(), &cfg)).unwrap();
    let q = &mut queues[0];
    let sectors = q.info().sectors;
    let g = q.buffer_grants(0).to_vec();
    // A page granted to someone else, and a ref nobody granted.
    let foreign = res.grants.grant_access(7, RESERVED_FRAMES, false).unwrap();
    let io = Err(DeviceError::Io);
    let unsupported = Err(DeviceError::NotSupported);

    let mut tag = 0;
    let mut check =
        |q: &mut BlkQueue, slot: BlkifRequest, want: &Result<u32, DeviceError>, what: &str| {
            tag += 1;
            let got = send(q, slot, tag);
            assert_eq!(&got.map(|_| 0), want, "{what}");
        };
    check(
        q,
        BlkifRequest {
            operation: 9,
            ..Default::default()
        },
        &unsupported,
        "unknown operation",
    );
    check(
        q,
        BlkifRequest {
            operation: BLKIF_OP_RESERVED_1,
            ..Default::default()
        },
        &unsupported,
        "reserved operation",
    );
    check(q, read(0, &[]), &io, "read without segments");
    let mut twelve = read(0, &[(g[0], 0, 7); 11]);
    twelve.nr_segments = 12;
    check(q, twelve, &io, "12 direct segments");
    check(q, read(0, &[(g[0], 0, 8)]), &io, "last_sect past the page");
    check(
        q,
        read(0, &[(g[0], 3, 2)]),
        &io,
        "last_sect before first_sect",
    );
    check(
        q,
        read(sectors, &[(g[0], 0, 0)]),
        &io,
        "read past the end of the disk",
    );
    check(
        q,
        read(u64::MAX - 1, &[(g[0], 0, 7)]),
        &io,
        "sector range that wraps",
    );
    check(
        q,
        read(0, &[(60_000, 0, 7)]),
        &io,
        "a grant ref nobody granted",
    );
    check(
        q,
        read(0, &[(foreign, 0, 7)]),
        &io,
        "a grant meant for another domain",
    );
    let mut ind = BlkifRequestIndirect {
        operation: BLKIF_OP_INDIRECT,
        indirect_op: BLKIF_OP_WRITE_BARRIER,
        nr_segments: 1,
        ..Default::default()
    };
    ind.indirect_grefs[0] = g[1];
    check(
        q,
        BlkifRequest::from_indirect(&ind),
        &io,
        "indirect barrier",
    );
    ind.indirect_op = BLKIF_OP_READ;
    ind.nr_segments = 300;
    check(
        q,
        BlkifRequest::from_indirect(&ind),
        &io,
        "300 indirect segments (over 256)",
    );
    ind.nr_segments = 16;
    ind.indirect_grefs[0] = 60_001;
    check(
        q,
        BlkifRequest::from_indirect(&ind),
        &io,
        "indirect page not granted",
    );
    let discard = BlkifRequestDiscard {
        operation: BLKIF_OP_DISCARD,
        sector_number: sectors - 1,
        nr_sectors: 8,
        ..Default::default()
    };
    check(
        q,
        BlkifRequest::from_discard(&discard),
        &io,
        "discard past the end",
    );

    // pvio's block-status query: one whole page, a sector on the disk.
    let status = |sector: u64, segs: &[(u32, u8, u8)]| {
        let mut r = read(sector, segs);
        r.operation = BLKIF_OP_PVIO_BLOCK_STATUS;
        r
    };
    check(q, status(0, &[]), &io, "block status without a page");
    check(
        q,
        status(0, &[(g[0], 0, 7); 2]),
        &io,
        "block status with two pages",
    );
    check(
        q,
        status(0, &[(g[0], 0, 3)]),
        &io,
        "block status into half a page",
    );
    check(
        q,
        status(sectors, &[(g[0], 0, 7)]),
        &io,
        "block status past the end",
    );
    check(
        q,
        status(0, &[(60_002, 0, 7)]),
        &io,
        "block status into no page",
    );
    check(q, status(8, &[(g[0], 0, 7)]), &Ok(0), "a good block status");
    let answer = pvio_blk::device::parse_block_status(&q.buffer(0)[..4096], u64::MAX);
    assert_eq!(
        answer.iter().map(|e| e.len).sum::<u64>(),
        (sectors - 8) * 512,
        "the answer covers the rest of the disk: {answer:?}"
    );

    // After all that, a good read still works and returns the image's data.
    check(q, read(8, &[(g[0], 0, 7)]), &Ok(0), "a good read");
    let expect = std::fs::read(&img).unwrap();
    assert_eq!(&q.buffer(0)[..4096], &expect[4096..8192], "wrong data");

    // A read-only disk refuses writes and discards but serves reads.
    let mut cfg_ro = cfg.clone();
    cfg_ro.devid = xvd_devid(1);
    let (_front_ro, mut rq) = rt.block_on(connect(res.clone(), xs, &cfg_ro)).unwrap();
    let r = &mut rq[0];
    assert!(r.info().read_only);
    let rg = r.buffer_grants(0).to_vec();
    let mut w = read(0, &[(rg[0], 0, 7)]);
    w.operation = BLKIF_OP_WRITE;
    check(r, w, &io, "write to a read-only disk");
    let d0 = BlkifRequestDiscard {
        operation: BLKIF_OP_DISCARD,
        nr_sectors: 8,
        ..Default::default()
    };
    // A read-only disk does not offer discard at all: EOPNOTSUPP.
    check(
        r,
        BlkifRequest::from_discard(&d0),
        &unsupported,
        "discard on a read-only disk",
    );
    check(
        r,
        read(0, &[(rg[0], 0, 7)]),
        &Ok(0),
        "a read from a read-only disk",
    );

    // Both backends are alive and counted what they refused.
    assert!(tap.0.try_wait().unwrap().is_none(), "tapdisk died");
    assert!(
        tap_ro.0.try_wait().unwrap().is_none(),
        "read-only tapdisk died"
    );
    let end = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let s = host.tapdisk_stats(&vbd).unwrap_or_default();
        let t = &s["metrics"]["total"];
        if t["invalid"].as_u64().unwrap_or(0) >= 16 && t["unsupported"].as_u64().unwrap_or(0) >= 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < end,
            "counters never showed the refusals: {s}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An indirect request of `segs` one-sector segments, each at the start of
/// its own page of `data` (so no two are adjacent), its segment list
/// written into the pages `list` grants.
fn scattered(q: &mut BlkQueue, op: u8, data: usize, list: usize, segs: usize) -> BlkifRequest {
    let data_grants = q.buffer_grants(data).to_vec();
    let list_grants = q.buffer_grants(list).to_vec();
    let pages = &mut q.buffer_mut(list)[..segs * 8];
    for (i, seg) in pages.chunks_exact_mut(8).enumerate() {
        seg[..4].copy_from_slice(&data_grants[i].to_le_bytes());
        seg[4] = 0; // first_sect
        seg[5] = 0; // last_sect
        seg[6..].fill(0);
    }
    let mut ind = BlkifRequestIndirect {
        operation: BLKIF_OP_INDIRECT,
        indirect_op: op,
        nr_segments: segs as u16,
        ..Default::default()
    };
    let n_pages = (segs * 8).div_ceil(4096);
    ind.indirect_grefs[..n_pages].copy_from_slice(&list_grants[..n_pages]);
    BlkifRequest::from_indirect(&ind)
}

#[test]
fn an_indirect_request_of_more_segments_than_one_io_takes_is_served() {
    std::env::set_var("PVIO_BIN", env!("CARGO_BIN_EXE_pvio"));
    let host = MiniHost::start("blk-scatter").unwrap();
    let img = make_image(&host.dir.0, "disk.img", 8 << 20).unwrap();
    let d = host.create_domain("scatter", 128).unwrap();
    let vbd = host
        .add_vbd(d.domid, xvd_devid(0), &img, true, &[])
        .unwrap();
    let mut tap = host
        .start_tapdisk_ready(&vbd, &["--max-indirect-segments", "4096"])
        .unwrap();
    let (rt, res, xs) = become_guest(&host, &d);
    let mut cfg = FrontendConfig::new(xvd_devid(0));
    cfg.buffers = 3;
    cfg.buffer_size = 16 << 20;
    cfg.poll = PollPolicy::Off;
    let (_front, mut queues) = rt.block_on(connect(res, xs, &cfg)).unwrap();
    let q = &mut queues[0];
    let image = std::fs::read(&img).unwrap();
    let mut tag = 100;
    // 1,025 is one over what one engine I/O takes (1,024 buffers); 4,096
    // is the most a frontend may send.
    for segs in [1025usize, 1500, 4096] {
        // Write a pattern through buffer 0's scattered sectors...
        for i in 0..segs {
            let v = (i * 7 + segs) as u8;
            q.buffer_mut(0)[i * 4096..i * 4096 + 512].fill(v);
        }
        tag += 1;
        let w = scattered(q, BLKIF_OP_WRITE, 0, 2, segs);
        assert!(send(q, w, tag).is_ok(), "write of {segs} segments failed");
        // ...and read it back into buffer 1's.
        q.buffer_mut(1).fill(0xEE);
        tag += 1;
        let r = scattered(q, BLKIF_OP_READ, 1, 2, segs);
        assert!(send(q, r, tag).is_ok(), "read of {segs} segments failed");
        for i in 0..segs {
            let page = &q.buffer(1)[i * 4096..(i + 1) * 4096];
            let v = (i * 7 + segs) as u8;
            assert!(
                page[..512].iter().all(|&b| b == v),
                "{segs} segments: sector {i} read back wrong"
            );
            assert!(
                page[512..].iter().all(|&b| b == 0xEE),
                "{segs} segments: the read wrote past sector {i}'s segment"
            );
        }
    }
    // The sectors after the last request's are the image's own.
    tag += 1;
    let mut one = scattered(q, BLKIF_OP_READ, 1, 2, 1);
    one.sector_number = 4096;
    assert!(send(q, one, tag).is_ok());
    assert_eq!(&q.buffer(1)[..512], &image[4096 * 512..4097 * 512]);
    assert!(tap.0.try_wait().unwrap().is_none(), "tapdisk died");
}
