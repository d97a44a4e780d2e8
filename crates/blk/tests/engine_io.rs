//! Both I/O engines run the same scenarios on real files under the temp
//! directory: data round trips (buffered and O_DIRECT), flush, discard
//! reading back as zeroes, fixed buffers in a registered memfd mapping,
//! 256 requests in flight, error completions, the notification eventfd and
//! shutdown with requests in flight.
//!
//! io_uring must work on the test machine; set PVIO_TEST_NO_URING=1 to run
//! only the thread pool where it is disabled.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pvio_blk::engine::{
    open_engine, Completion, CompletionError, Engine, EngineChoice, EngineConfig, EngineError,
    EngineKind, FileId, IoBuf, MemoryRegion, ThreadPoolEngine, UringEngine,
};
use pvio_blk::image::{AlignedBuf, DirectIo, Image, RawImage, RawOptions};

fn kinds() -> Vec<EngineKind> {
    if std::env::var_os("PVIO_TEST_NO_URING").is_some() {
        vec![EngineKind::Threads]
    } else {
        vec![EngineKind::Uring, EngineKind::Threads]
    }
}

fn engine(kind: EngineKind, depth: u32) -> Box<dyn Engine> {
    let cfg = EngineConfig {
        queue_depth: depth,
        threads: 4,
    };
    match kind {
        EngineKind::Uring => Box::new(UringEngine::new(&cfg).unwrap_or_else(|e| {
            panic!("io_uring engine: {e} (set PVIO_TEST_NO_URING=1 where io_uring is disabled)")
        })),
        EngineKind::Threads => Box::new(ThreadPoolEngine::new(&cfg).unwrap()),
    }
}

struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, len: u64) -> Self {
        let p = std::env::temp_dir().join(format!("pvio-blk-engine-{}-{name}", std::process::id()));
        let f = File::create(&p).unwrap();
        f.set_len(len).unwrap();
        TempFile(p)
    }

    fn open(&self, write: bool, direct: bool) -> Arc<File> {
        let mut o = OpenOptions::new();
        o.read(true).write(write);
        if direct {
            o.custom_flags(libc::O_DIRECT);
        }
        Arc::new(o.open(&self.0).unwrap())
    }

    fn contents(&self) -> Vec<u8> {
        std::fs::read(&self.0).unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Waits for `n` completions, failing the test after a generous deadline.
fn wait_for(e: &mut dyn Engine, n: usize) -> Vec<Completion> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut out = Vec::new();
    while out.len() < n {
        assert!(
            Instant::now() < deadline,
            "{} engine: {} of {n} completions",
            e.kind(),
            out.len()
        );
        e.wait(n - out.len(), Some(Duration::from_secs(1)), &mut out)
            .unwrap();
    }
    assert_eq!(out.len(), n, "{} engine: too many completions", e.kind());
    out
}

fn one(e: &mut dyn Engine, tag: u64) -> Result<usize, CompletionError> {
    let c = wait_for(e, 1).pop().unwrap();
    assert_eq!(c.tag, tag);
    c.result
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn buf(b: &mut AlignedBuf, at: usize, len: usize) -> IoBuf {
    assert!(at + len <= b.len());
    IoBuf::new(b.as_mut_ptr().wrapping_add(at), len)
}

/// Writes three buffers, reads them back split differently, flushes,
/// discards a range and checks it reads as zeroes.
fn round_trip(e: &mut dyn Engine, file: FileId, tf: &TempFile) {
    let mut src = AlignedBuf::new(64 << 10, 4096).unwrap();
    let data = pattern(7, 8192);
    src.as_mut_slice()[..4096].copy_from_slice(&data[..4096]);
    src.as_mut_slice()[8192..8704].copy_from_slice(&data[4096..4608]);
    src.as_mut_slice()[16384..19968].copy_from_slice(&data[4608..]);
    let bufs = [
        buf(&mut src, 0, 4096),
        buf(&mut src, 8192, 512),
        buf(&mut src, 16384, 3584),
    ];
    // SAFETY: src outlives the request, which is waited for below.
    unsafe { e.submit_write(file, 12288, &bufs, 1) }.unwrap();
    assert_eq!(one(e, 1), Ok(8192));

    let mut dst = AlignedBuf::new(64 << 10, 4096).unwrap();
    let bufs = [buf(&mut dst, 4096, 512), buf(&mut dst, 32768, 7680)];
    // SAFETY: dst outlives the request.
    unsafe { e.submit_read(file, 12288, &bufs, 2) }.unwrap();
    assert_eq!(one(e, 2), Ok(8192));
    let mut got = dst.as_slice()[4096..4608].to_vec();
    got.extend_from_slice(&dst.as_slice()[32768..32768 + 7680]);
    assert_eq!(got, data, "{} engine: data read back differs", e.kind());

    e.submit_fdatasync(file, 3).unwrap();
    assert_eq!(one(e, 3), Ok(0));
    assert_eq!(&tf.contents()[12288..12288 + 8192], &data[..]);

    e.submit_discard(file, 12288 + 4096, 4096, 4).unwrap();
    assert_eq!(one(e, 4), Ok(0));
    let bufs = [buf(&mut dst, 0, 8192)];
    // SAFETY: dst outlives the request.
    unsafe { e.submit_read(file, 12288, &bufs, 5) }.unwrap();
    assert_eq!(one(e, 5), Ok(8192));
    assert_eq!(&dst.as_slice()[..4096], &data[..4096]);
    assert!(
        dst.as_slice()[4096..8192].iter().all(|&b| b == 0),
        "{} engine: discarded range does not read as zeroes",
        e.kind()
    );
    assert_eq!(tf.contents().len(), 1 << 20, "discard changed the size");
}

#[test]
fn buffered_round_trip_flush_and_discard() {
    for kind in kinds() {
        let tf = TempFile::new(&format!("buffered-{kind}"), 1 << 20);
        let mut e = engine(kind, 32);
        let file = e.add_file(tf.open(true, false)).unwrap();
        round_trip(e.as_mut(), file, &tf);
        let s = e.stats();
        assert_eq!((s.submitted, s.completed, s.failed), (5, 5, 0));
    }
}

#[test]
fn o_direct_round_trip_through_a_raw_image() {
    for kind in kinds() {
        let tf = TempFile::new(&format!("direct-{kind}"), 1 << 20);
        let img = RawImage::open(
            &tf.0,
            &RawOptions {
                direct_io: DirectIo::Required,
                ..Default::default()
            },
        );
        let img = match img {
            Ok(i) => i,
            // The temp filesystem refuses O_DIRECT: nothing to test here.
            Err(pvio_blk::image::ImageError::DirectIoUnsupported { .. }) => return,
            Err(e) => panic!("{e}"),
        };
        assert!(img.direct_io());
        assert!(img.logical_block_size() <= 4096);
        let mut e = engine(kind, 32);
        let file = e.add_file(Arc::clone(img.files()[0].file())).unwrap();
        round_trip(e.as_mut(), file, &tf);

        // A misaligned file offset or buffer under O_DIRECT fails in
        // flight, cleanly. (Over allocated blocks: ext4 fills holes without
        // checking alignment.)
        let mut b = AlignedBuf::new(8192, 4096).unwrap();
        let bad = [buf(&mut b, 0, 4096)];
        // SAFETY: b outlives the request.
        unsafe { e.submit_read(file, 12288 + 100, &bad, 9) }.unwrap();
        assert_eq!(
            one(e.as_mut(), 9),
            Err(CompletionError::Os {
                errno: libc::EINVAL
            })
        );
        if img.memory_alignment() > 1 {
            let bad = [buf(&mut b, 1, 4096)];
            // SAFETY: b outlives the request.
            unsafe { e.submit_read(file, 12288, &bad, 10) }.unwrap();
            assert_eq!(
                one(e.as_mut(), 10),
                Err(CompletionError::Os {
                    errno: libc::EINVAL
                })
            );
        }
    }
}

/// A memfd mapping shared with "the guest", like ForeignMemory's.
fn guest_memory(pages: usize) -> Arc<pvio_hv::memory::Mapping> {
    let fd = pvio_hv::sys::create_sealed_memfd("engine-test", (pages * 4096) as u64).unwrap();
    Arc::new(pvio_hv::memory::Mapping::map_shared(&fd, 0, pages * 4096).unwrap())
}

fn page(mem: &pvio_hv::memory::Mapping, n: usize, at: usize, len: usize) -> IoBuf {
    assert!(n * 4096 + at + len <= mem.len());
    IoBuf::new(mem.as_ptr().wrapping_add(n * 4096 + at), len)
}

fn copy_from(mem: &pvio_hv::memory::Mapping, offset: usize, len: usize) -> Vec<u8> {
    assert!(offset + len <= mem.len());
    let mut v = vec![0u8; len];
    // SAFETY: bounds checked above; no request is in flight on this range.
    unsafe { std::ptr::copy_nonoverlapping(mem.as_ptr().add(offset), v.as_mut_ptr(), len) };
    v
}

fn copy_into(mem: &pvio_hv::memory::Mapping, offset: usize, data: &[u8]) {
    assert!(offset + data.len() <= mem.len());
    // SAFETY: bounds checked above; no request is in flight on this range.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), mem.as_ptr().add(offset), data.len()) };
}

#[test]
fn registered_memfd_mapping_uses_fixed_buffers() {
    for kind in kinds() {
        let tf = TempFile::new(&format!("fixed-{kind}"), 1 << 20);
        let mem = guest_memory(16);
        let mut e = engine(kind, 32);
        e.register_memory(Arc::clone(&mem) as Arc<dyn MemoryRegion>)
            .unwrap();
        let direct = RawImage::open(&tf.0, &RawOptions::default())
            .unwrap()
            .direct_io();
        let file = e.add_file(tf.open(true, direct)).unwrap();

        let data = pattern(3, 8192);
        copy_into(&mem, 2 * 4096, &data[..4096]);
        copy_into(&mem, 9 * 4096, &data[4096..]);
        // One buffer: WRITE_FIXED. Then two pages in one write.
        // SAFETY: mem is registered (kept alive by the engine) and unused
        // until the completion.
        unsafe { e.submit_write(file, 0, &[page(&mem, 2, 0, 4096)], 1) }.unwrap();
        assert_eq!(one(e.as_mut(), 1), Ok(4096));
        let two = [page(&mem, 2, 0, 4096), page(&mem, 9, 0, 4096)];
        // SAFETY: as above.
        unsafe { e.submit_write(file, 65536, &two, 2) }.unwrap();
        assert_eq!(one(e.as_mut(), 2), Ok(8192));
        // Read into other pages, with sector offsets inside them.
        // SAFETY: as above.
        unsafe { e.submit_read(file, 0, &[page(&mem, 5, 0, 4096)], 3) }.unwrap();
        assert_eq!(one(e.as_mut(), 3), Ok(4096));
        let split = [
            page(&mem, 11, 512, 3584),
            page(&mem, 12, 0, 4608 - 4096 + 4096),
        ];
        // SAFETY: as above.
        unsafe { e.submit_read(file, 65536, &split, 4) }.unwrap();
        assert_eq!(one(e.as_mut(), 4), Ok(8192));

        assert_eq!(copy_from(&mem, 5 * 4096, 4096), data[..4096]);
        let mut got = copy_from(&mem, 11 * 4096 + 512, 3584);
        got.extend(copy_from(&mem, 12 * 4096, 4608));
        assert_eq!(got, data);
        assert_eq!(&tf.contents()[65536..65536 + 8192], &data[..]);

        let s = e.stats();
        match kind {
            // Single-buffer requests are always fixed; two-buffer ones
            // when the kernel has READV_FIXED/WRITEV_FIXED.
            EngineKind::Uring => assert!(s.fixed >= 2, "{s:?}"),
            EngineKind::Threads => assert_eq!((s.fixed, s.vectored), (0, 4)),
        }
        assert_eq!(s.fixed + s.vectored, 4);

        // Memory outside every registered region goes through READV.
        let mut heap = AlignedBuf::new(4096, 4096).unwrap();
        let before = e.stats().vectored;
        // SAFETY: heap outlives the request.
        unsafe { e.submit_read(file, 0, &[buf(&mut heap, 0, 4096)], 5) }.unwrap();
        assert_eq!(one(e.as_mut(), 5), Ok(4096));
        assert_eq!(e.stats().vectored, before + 1);
        assert_eq!(heap.as_slice(), &data[..4096]);
    }
}

#[test]
fn many_requests_in_flight() {
    const N: usize = 256;
    for kind in kinds() {
        let tf = TempFile::new(&format!("many-{kind}"), (N * 4096) as u64);
        let mut e = engine(kind, N as u32);
        assert_eq!(e.capacity(), N);
        let file = e.add_file(tf.open(true, false)).unwrap();
        let mut src = AlignedBuf::new(N * 4096, 4096).unwrap();
        for i in 0..N {
            src.as_mut_slice()[i * 4096..(i + 1) * 4096].fill(i as u8 ^ 0x5a);
        }
        for i in 0..N {
            let b = [buf(&mut src, i * 4096, 4096)];
            // SAFETY: src outlives every request (all are waited for).
            unsafe { e.submit_write(file, (i * 4096) as u64, &b, i as u64) }.unwrap();
        }
        assert_eq!(e.in_flight(), N);
        // One more does not fit.
        let b = [buf(&mut src, 0, 4096)];
        // SAFETY: refused submissions queue nothing.
        let full = unsafe { e.submit_write(file, 0, &b, 999) };
        assert!(
            matches!(full, Err(EngineError::QueueFull { capacity: N })),
            "{full:?}"
        );
        let done = wait_for(e.as_mut(), N);
        let tags: BTreeSet<u64> = done.iter().map(|c| c.tag).collect();
        assert_eq!(
            tags,
            (0..N as u64).collect(),
            "{kind}: every tag exactly once"
        );
        assert!(done.iter().all(|c| c.result == Ok(4096)));
        assert_eq!(e.in_flight(), 0);

        // Read them back in reverse submission order, all in flight.
        let mut dst = AlignedBuf::new(N * 4096, 4096).unwrap();
        for i in (0..N).rev() {
            let b = [buf(&mut dst, i * 4096, 4096)];
            // SAFETY: dst outlives every request.
            unsafe { e.submit_read(file, (i * 4096) as u64, &b, 1000 + i as u64) }.unwrap();
        }
        let done = wait_for(e.as_mut(), N);
        let tags: BTreeSet<u64> = done.iter().map(|c| c.tag).collect();
        assert_eq!(tags.len(), N);
        assert!(done.iter().all(|c| c.result == Ok(4096)));
        assert_eq!(dst.as_slice(), src.as_slice(), "{kind}: data differs");
    }
}

#[test]
fn failures_come_back_as_completions() {
    for kind in kinds() {
        let tf = TempFile::new(&format!("errors-{kind}"), 8192);
        let mut e = engine(kind, 8);
        let ro = e.add_file(tf.open(false, false)).unwrap();
        let mut b = AlignedBuf::new(16384, 4096).unwrap();

        // Write and discard on a file opened read-only: EBADF.
        let w = [buf(&mut b, 0, 4096)];
        // SAFETY: b outlives the request.
        unsafe { e.submit_write(ro, 0, &w, 1) }.unwrap();
        assert_eq!(
            one(e.as_mut(), 1),
            Err(CompletionError::Os { errno: libc::EBADF })
        );
        e.submit_discard(ro, 0, 4096, 2).unwrap();
        assert_eq!(
            one(e.as_mut(), 2),
            Err(CompletionError::Os { errno: libc::EBADF })
        );

        // A read past the end of the file is short.
        let r = [buf(&mut b, 0, 8192)];
        // SAFETY: b outlives the request.
        unsafe { e.submit_read(ro, 4096, &r, 3) }.unwrap();
        assert_eq!(
            one(e.as_mut(), 3),
            Err(CompletionError::Short {
                expected: 8192,
                done: 4096
            })
        );
        assert_eq!(e.stats().failed, 3);

        // A file cannot go while a request on it is unreaped.
        // SAFETY: b outlives the request.
        unsafe { e.submit_read(ro, 0, &[buf(&mut b, 0, 512)], 4) }.unwrap();
        assert!(matches!(
            e.remove_file(ro),
            Err(EngineError::FileBusy { .. })
        ));
        assert_eq!(one(e.as_mut(), 4), Ok(512));
        e.remove_file(ro).unwrap();
        // SAFETY: refused submissions queue nothing.
        let gone = unsafe { e.submit_read(ro, 0, &[buf(&mut b, 0, 512)], 5) };
        assert!(matches!(gone, Err(EngineError::UnknownFile(_))), "{gone:?}");
        assert!(matches!(
            e.submit_fdatasync(ro, 6),
            Err(EngineError::UnknownFile(_))
        ));
        // SAFETY: refused submissions queue nothing.
        let none = unsafe { e.submit_read(ro, 0, &[], 7) };
        assert!(matches!(none, Err(EngineError::NoBuffers)));
        assert_eq!(e.in_flight(), 0);
    }
}

#[test]
fn notify_fd_is_readable_while_completions_wait() {
    for kind in kinds() {
        let tf = TempFile::new(&format!("notify-{kind}"), 8192);
        let mut e = engine(kind, 8);
        let file = e.add_file(tf.open(true, false)).unwrap();
        let mut b = AlignedBuf::new(4096, 4096).unwrap();
        // SAFETY: b outlives the request.
        unsafe { e.submit_read(file, 0, &[buf(&mut b, 0, 4096)], 42) }.unwrap();
        e.kick().unwrap();
        let ready =
            pvio_hv::sys::wait_readable(e.notify_fd(), Some(Duration::from_secs(20))).unwrap();
        assert!(ready, "{kind}: notify fd never became readable");
        assert!(e.has_completions(), "{kind}: readable but nothing to reap");
        // The final check before blocking sees the completion: do not block.
        assert!(
            e.prepare_to_block().unwrap(),
            "{kind}: would sleep through a completion"
        );
        let mut out = Vec::new();
        assert_eq!(e.reap(&mut out).unwrap(), 1);
        assert_eq!(out[0].tag, 42);
        assert!(!e.has_completions());
        assert!(!e.prepare_to_block().unwrap());
        let again = pvio_hv::sys::wait_readable(e.notify_fd(), Some(Duration::ZERO)).unwrap();
        assert!(
            !again,
            "{kind}: notify fd still readable after the final check"
        );
        // Nothing in flight: wait returns at once with nothing.
        assert_eq!(
            e.wait(1, Some(Duration::from_secs(5)), &mut out).unwrap(),
            0
        );
    }
}

#[test]
fn shutdown_drains_requests_in_flight() {
    for kind in kinds() {
        let tf = TempFile::new(&format!("shutdown-{kind}"), 1 << 20);
        let mut e = engine(kind, 64);
        let file = e.add_file(tf.open(true, false)).unwrap();
        let mut b = AlignedBuf::new(64 * 4096, 4096).unwrap();
        for i in 0..64 {
            let bufs = [buf(&mut b, i * 4096, 4096)];
            // SAFETY: b outlives the engine's shutdown, which drains.
            unsafe { e.submit_read(file, (i * 4096) as u64, &bufs, i as u64) }.unwrap();
        }
        e.kick().unwrap();
        let mut out = Vec::new();
        e.shutdown(&mut out).unwrap();
        assert_eq!(e.in_flight(), 0);
        let tags: BTreeSet<u64> = out.iter().map(|c| c.tag).collect();
        assert_eq!(tags, (0..64).collect(), "{kind}");
        for c in &out {
            assert!(
                c.result == Ok(4096)
                    || c.result
                        == Err(CompletionError::Os {
                            errno: libc::ECANCELED
                        }),
                "{kind}: {c:?}"
            );
        }
        // SAFETY: refused submissions queue nothing.
        let after = unsafe { e.submit_read(file, 0, &[buf(&mut b, 0, 4096)], 99) };
        assert!(matches!(after, Err(EngineError::ShutDown)));

        // Dropping with requests in flight drains too (the buffer is freed
        // only after the drop returns).
        let mut e = engine(kind, 64);
        let file = e.add_file(tf.open(true, false)).unwrap();
        let mut b2 = AlignedBuf::new(64 * 4096, 4096).unwrap();
        for i in 0..64 {
            let bufs = [buf(&mut b2, i * 4096, 4096)];
            // SAFETY: the engine is dropped (and drained) before b2.
            unsafe { e.submit_read(file, (i * 4096) as u64, &bufs, i as u64) }.unwrap();
        }
        drop(e);
        drop(b2);
    }
}

#[test]
fn open_engine_honours_the_choice() {
    let cfg = EngineConfig::default();
    let t = open_engine(EngineChoice::Threads, &cfg).unwrap();
    assert_eq!(t.kind(), EngineKind::Threads);
    if kinds().contains(&EngineKind::Uring) {
        assert_eq!(
            open_engine(EngineChoice::Uring, &cfg).unwrap().kind(),
            EngineKind::Uring
        );
        assert_eq!(
            open_engine(EngineChoice::Auto, &cfg).unwrap().kind(),
            EngineKind::Uring
        );
    } else {
        // Auto must still give a working engine: the thread pool where
        // io_uring is refused, whichever works where it is not.
        let auto = open_engine(EngineChoice::Auto, &cfg).unwrap();
        let uring_works = UringEngine::new(&cfg).is_ok();
        assert_eq!(auto.kind() == EngineKind::Uring, uring_works);
    }
}
