//! Two processes, one ring: the test is the frontend; a child (this test
//! binary again, selected by an environment variable) is the backend. They
//! share a memfd mapping and two eventfds, inherited across exec, as guests
//! and backends do. Millions of blkif requests go through in polling mode,
//! hundreds of thousands in event mode (both sides sleep on eventfds using
//! the real notify/final-check protocol) and in ping-pong modes where one
//! side spins and the other sleeps on every request, on one-page and
//! multi-page rings, some of them across the 2^32 index wrap. Every request
//! must come back exactly once, in order, with its id and a checksum of its
//! payload that the backend computed from the copy it took.
//!
//! Nothing sleeps to synchronise: waits are polls on an eventfd, and every
//! wait and spin has a deadline, so a lost wakeup fails the test with the
//! ring state instead of hanging it.
//!
//! What these runs cannot show is the absence of the narrow lost-wakeup
//! races: the window between a final check's look at the producer index and
//! its event store is a few nanoseconds, shorter than the peer's
//! store-fence-load on the shared header line, so real processes on x86
//! practically never hit it (a final check without its re-check passes
//! here). That is `tests/loom_wakeup.rs`'s job.

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::ptr::NonNull;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pvio_abi::blkif::{Blkif, BlkifRequest, BlkifResponse};
use pvio_ring::{BackRing, FrontRing, RawRing, RingError, RingMemory, SharedIndex};
use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags};
use rustix::fs::{ftruncate, memfd_create, MemfdFlags};
use rustix::io::{fcntl_setfd, read, write, Errno, FdFlags};
use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};
use rustix::time::Timespec;

/// Set in the child: "mode pages count start memfd to_back to_front".
const CHILD_ENV: &str = "PVIO_RING_STRESS_CHILD";

/// No progress for this long means a lost wakeup or a dead peer.
const STALL: Duration = Duration::from_secs(20);

/// Serialises the tests of this binary: each one keeps both cores busy, and
/// fds made inheritable for one child must not leak into another.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Who sleeps, and how many requests the frontend keeps in flight.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Mode {
    /// The frontend sleeps on its eventfd after a final check (else spins).
    front_sleeps: bool,
    /// The backend sleeps on its eventfd after a final check (else spins).
    back_sleeps: bool,
    /// Most requests in flight; 0 means the ring size.
    queue_depth: u32,
}

/// Both sides spin on the ring; nobody notifies or sleeps.
const POLLING: Mode = Mode {
    front_sleeps: false,
    back_sleeps: false,
    queue_depth: 0,
};

/// Both sides notify as the protocol says and sleep after a final check.
const EVENTS: Mode = Mode {
    front_sleeps: true,
    back_sleeps: true,
    queue_depth: 0,
};

impl Mode {
    fn encode(&self) -> String {
        format!(
            "{}:{}:{}",
            self.front_sleeps, self.back_sleeps, self.queue_depth
        )
    }

    fn decode(s: &str) -> Self {
        let f: Vec<&str> = s.split(':').collect();
        Self {
            front_sleeps: f[0].parse().unwrap(),
            back_sleeps: f[1].parse().unwrap(),
            queue_depth: f[2].parse().unwrap(),
        }
    }
}

/// A memfd mapped shared: the ring memory of both processes.
struct SharedMapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl SharedMapping {
    fn new(fd: BorrowedFd<'_>, len: usize) -> Self {
        // SAFETY: a fresh shared mapping of a file we hold, at an address
        // the kernel picks; nothing else in this process uses that range.
        let ptr = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )
        }
        .expect("mmap the ring memfd");
        Self {
            ptr: NonNull::new(ptr.cast()).expect("mmap returned null"),
            len,
        }
    }
}

impl Drop for SharedMapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`, once, when no
        // ring borrows it any more (the ring owns this value).
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

// SAFETY: the mapping stays at `ptr` with `len` bytes until drop, and is
// only accessed through the ring crate.
unsafe impl RingMemory for SharedMapping {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// The request the frontend sends as number `n`: every field derived from
/// `n`, so the backend can check it arrived whole.
fn request(n: u64) -> BlkifRequest {
    let mut req = BlkifRequest {
        operation: (n % 2) as u8,
        nr_segments: (n % 12) as u8,
        handle: (n % 65_521) as u16,
        id: n,
        sector_number: n.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        ..Default::default()
    };
    for (i, seg) in req.seg.iter_mut().enumerate() {
        seg.gref = (n as u32).wrapping_mul(31).wrapping_add(i as u32);
        seg.first_sect = (i % 8) as u8;
        seg.last_sect = 7;
    }
    req
}

/// A checksum of every byte of a request, echoed back in `status`.
fn checksum(req: &BlkifRequest) -> i16 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut mix = |v: u64| {
        h ^= v;
        h = h.wrapping_mul(0x100_0000_01b3);
    };
    mix(u64::from(req.operation));
    mix(u64::from(req.nr_segments));
    mix(u64::from(req.handle));
    mix(req.id);
    mix(req.sector_number);
    for seg in &req.seg {
        mix(u64::from(seg.gref));
        mix(u64::from(seg.first_sect) << 8 | u64::from(seg.last_sect));
    }
    (h & 0x7fff) as i16
}

fn response_for(req: &BlkifRequest) -> BlkifResponse {
    BlkifResponse {
        id: req.id,
        operation: req.operation,
        status: checksum(req),
        ..Default::default()
    }
}

/// Waits for a notification on `fd` until `deadline`; consumes it.
fn wait_event(fd: &OwnedFd, deadline: Instant, what: &dyn Fn() -> String) {
    loop {
        let now = Instant::now();
        assert!(
            now < deadline,
            "no notification within {STALL:?}: {}",
            what()
        );
        let left = (deadline - now).min(Duration::from_millis(500));
        let timeout = Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let mut fds = [PollFd::new(fd, PollFlags::IN)];
        match poll(&mut fds, Some(&timeout)) {
            Ok(0) | Err(Errno::INTR) => continue,
            Ok(_) => {}
            Err(e) => panic!("poll: {e}"),
        }
        let mut buf = [0u8; 8];
        match read(fd, &mut buf) {
            Ok(8) => return,
            Err(Errno::AGAIN) | Err(Errno::INTR) => continue,
            other => panic!("eventfd read: {other:?}"),
        }
    }
}

fn notify(fd: &OwnedFd) {
    write(fd, &1u64.to_ne_bytes()).expect("eventfd write");
}

/// Cheap deterministic randomness for batch sizes.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Busy-waits a random 0 to ~2 µs before a final check, as a side doing
/// some work would, so that the peer's updates land before, during and after
/// the final check rather than always after it.
fn jitter(rng: &mut XorShift) {
    for _ in 0..rng.below(64) {
        std::hint::spin_loop();
    }
}

/// Spinning without progress: yield now and then, give up at the stall
/// deadline.
struct Idle {
    spins: u32,
    last_progress: Instant,
}

impl Idle {
    fn new() -> Self {
        Self {
            spins: 0,
            last_progress: Instant::now(),
        }
    }

    fn progress(&mut self) {
        self.spins = 0;
        self.last_progress = Instant::now();
    }

    fn spin(&mut self, what: &dyn Fn() -> String) {
        self.spins += 1;
        if self.spins.is_multiple_of(256) {
            // With two cores and two spinning processes, let the scheduler
            // run the peer if it was preempted.
            std::thread::yield_now();
            assert!(self.last_progress.elapsed() < STALL, "stalled: {}", what());
        }
    }
}

#[derive(Debug, Default)]
struct Stats {
    notifications: u64,
    sleeps: u64,
}

fn frontend(
    ring: &mut FrontRing<Blkif, SharedMapping>,
    mode: Mode,
    count: u64,
    to_back: &OwnedFd,
    to_front: &OwnedFd,
) -> Result<Stats, RingError> {
    let mut rng = XorShift(0x853c_49e6_748f_ea9b);
    let mut stats = Stats::default();
    let (mut sent, mut received) = (0u64, 0u64);
    let mut idle = Idle::new();
    let depth = match mode.queue_depth {
        0 => ring.size(),
        d => d.min(ring.size()),
    };
    while received < count {
        // A burst of random length, within the queue depth.
        let burst = 1 + rng.below(u64::from(depth));
        let mut pushed = 0;
        while pushed < burst && sent < count && sent - received < u64::from(depth) {
            ring.push_request(&request(sent))?;
            sent += 1;
            pushed += 1;
        }
        if !mode.back_sleeps {
            ring.push_requests();
        } else if ring.push_requests_and_check_notify() {
            notify(to_back);
            stats.notifications += 1;
        }
        let mut got = 0u64;
        while let Some(rsp) = ring.take_response()? {
            let expect = response_for(&request(received));
            assert_eq!(rsp, expect, "response {received} is wrong");
            received += 1;
            got += 1;
        }
        if got + pushed > 0 {
            idle.progress();
            continue;
        }
        // Nothing to push (done, or at the queue depth) and nothing to take.
        if !mode.front_sleeps {
            idle.spin(&|| format!("frontend sent {sent}, got {received}: {ring:?}"));
            continue;
        }
        jitter(&mut rng);
        if !ring.final_check_for_responses()? {
            stats.sleeps += 1;
            let state = || format!("frontend sent {sent}, got {received}: {ring:?}");
            wait_event(to_front, Instant::now() + STALL, &state);
        }
    }
    assert!(sent == count && received == count);
    assert_eq!(
        ring.take_response()?,
        None,
        "a response beyond the last request"
    );
    Ok(stats)
}

fn backend(
    ring: &mut BackRing<Blkif, SharedMapping>,
    mode: Mode,
    count: u64,
    to_back: &OwnedFd,
    to_front: &OwnedFd,
) -> Result<Stats, RingError> {
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    let mut stats = Stats::default();
    let mut answered = 0u64;
    let mut idle = Idle::new();
    let publish = |ring: &mut BackRing<Blkif, SharedMapping>, stats: &mut Stats| {
        if !mode.front_sleeps {
            ring.push_responses();
        } else if ring.push_responses_and_check_notify() {
            notify(to_front);
            stats.notifications += 1;
        }
    };
    while answered < count {
        // Publish after a random number of responses, as a backend
        // completing I/O out of step with the requests would.
        let mut batch_left = 1 + rng.below(8);
        let mut got = 0u64;
        while let Some(req) = ring.take_request()? {
            assert_eq!(req, request(answered), "request {answered} arrived damaged");
            ring.push_response(&response_for(&req))?;
            answered += 1;
            got += 1;
            batch_left -= 1;
            if batch_left == 0 {
                publish(ring, &mut stats);
                batch_left = 1 + rng.below(8);
            }
        }
        publish(ring, &mut stats);
        if got > 0 {
            idle.progress();
            continue;
        }
        if !mode.back_sleeps {
            idle.spin(&|| format!("backend answered {answered}: {ring:?}"));
            continue;
        }
        jitter(&mut rng);
        if !ring.final_check_for_requests()? {
            stats.sleeps += 1;
            let state = || format!("backend answered {answered}: {ring:?}");
            wait_event(to_back, Instant::now() + STALL, &state);
        }
    }
    Ok(stats)
}

/// Runs one frontend/backend pair over `pages` pages, `count` requests,
/// indices starting at `start`.
fn run(mode: Mode, pages: usize, count: u64, start: u32) {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let len = pages * 4096;
    let memfd = memfd_create("pvio-ring-stress", MemfdFlags::CLOEXEC).expect("memfd_create");
    ftruncate(&memfd, len as u64).expect("ftruncate");
    let flags = EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK;
    let to_back = eventfd(0, flags).expect("eventfd");
    let to_front = eventfd(0, flags).expect("eventfd");

    let mapping = SharedMapping::new(memfd.as_fd(), len);
    let mut ring = if start == 0 {
        FrontRing::<Blkif, _>::init(mapping).unwrap()
    } else {
        // A ring left by an earlier frontend just before the wrap.
        let raw = RawRing::<Blkif, _>::new(&mapping).unwrap();
        for (i, v) in [(SharedIndex::ReqProd, start), (SharedIndex::RspProd, start)] {
            raw.store(i, v);
        }
        raw.store(SharedIndex::ReqEvent, start.wrapping_add(1));
        raw.store(SharedIndex::RspEvent, start.wrapping_add(1));
        FrontRing::<Blkif, _>::attach(mapping).unwrap()
    };

    let mut child = spawn_backend(
        &format!("{} {pages} {count} {start}", mode.encode()),
        [&memfd, &to_back, &to_front],
    );
    let began = Instant::now();
    let front = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        frontend(&mut ring, mode, count, &to_back, &to_front)
    }));
    let elapsed = began.elapsed();
    if front.as_ref().map_or(true, |r| r.is_err()) {
        // Our own child: stop it so its output can be shown.
        let _ = child.kill();
    }
    let (status, output) = finish(child);
    match front {
        Ok(Ok(stats)) => {
            assert!(status.success(), "backend failed ({status}):\n{output}");
            assert!(
                output.contains(&format!("backend answered {count}")),
                "backend did not report:\n{output}"
            );
            if mode.back_sleeps {
                // The first push always notifies (req_event starts at
                // req_prod + 1): the event path was taken.
                assert!(stats.notifications > 0);
            }
            eprintln!(
                "{mode:?} {pages}p {count} requests from {start}: {elapsed:?}, frontend {stats:?}, {}",
                output
                    .find("backend answered")
                    .and_then(|at| output[at..].lines().next())
                    .unwrap_or("")
            );
        }
        Ok(Err(e)) => panic!("frontend ring error: {e}\nbackend ({status}):\n{output}"),
        Err(panic) => {
            eprintln!("backend ({status}):\n{output}");
            std::panic::resume_unwind(panic)
        }
    }
}

/// Starts this binary as the backend, handing it three fds by inheritance.
fn spawn_backend(args: &str, fds: [&OwnedFd; 3]) -> Child {
    // The fds are close-on-exec; lift that only around this spawn, which
    // ONE_AT_A_TIME keeps from overlapping another test's spawn.
    for fd in fds {
        fcntl_setfd(fd, FdFlags::empty()).expect("clear FD_CLOEXEC");
    }
    let env = format!(
        "{args} {} {} {}",
        fds[0].as_raw_fd(),
        fds[1].as_raw_fd(),
        fds[2].as_raw_fd()
    );
    let child = Command::new(std::env::current_exe().expect("test binary path"))
        .args([
            "child_backend",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, env)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the backend");
    for fd in fds {
        fcntl_setfd(fd, FdFlags::CLOEXEC).expect("restore FD_CLOEXEC");
    }
    child
}

fn finish(mut child: Child) -> (std::process::ExitStatus, String) {
    let mut output = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut output);
    }
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut output);
    }
    let status = child.wait().expect("wait for the backend");
    (status, output)
}

/// The backend's side; passes trivially when run without the variable.
#[test]
fn child_backend() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let f: Vec<&str> = spec.split_whitespace().collect();
    let mode = Mode::decode(f[0]);
    let pages: usize = f[1].parse().unwrap();
    let count: u64 = f[2].parse().unwrap();
    let mut fds = f[4..7].iter().map(|s| {
        let fd: i32 = s.parse().unwrap();
        // SAFETY: the parent passed these three descriptors, open and
        // inherited, for this process to own; nothing else here uses them.
        unsafe { OwnedFd::from_raw_fd(fd) }
    });
    let (memfd, to_back, to_front) = (
        fds.next().unwrap(),
        fds.next().unwrap(),
        fds.next().unwrap(),
    );
    let mapping = SharedMapping::new(memfd.as_fd(), pages * 4096);
    let mut ring = BackRing::<Blkif, _>::attach(mapping).expect("attach the backend");
    let stats = backend(&mut ring, mode, count, &to_back, &to_front).expect("backend ring error");
    println!("backend answered {count}: {stats:?}");
}

#[test]
fn polling_one_page_millions() {
    run(POLLING, 1, 6_000_000, u32::MAX - 1_000_000);
}

#[test]
fn polling_sixteen_pages() {
    run(POLLING, 16, 4_000_000, 0);
}

#[test]
fn events_one_page() {
    run(EVENTS, 1, 300_000, u32::MAX - 50_000);
}

#[test]
fn events_four_pages() {
    run(EVENTS, 4, 100_000, 0);
}

#[test]
fn ping_pong_backend_sleeps() {
    let mode = Mode {
        front_sleeps: false,
        back_sleeps: true,
        queue_depth: 1,
    };
    run(mode, 1, 100_000, 0);
}

#[test]
fn ping_pong_frontend_sleeps() {
    let mode = Mode {
        front_sleeps: true,
        back_sleeps: false,
        queue_depth: 1,
    };
    run(mode, 1, 100_000, u32::MAX - 10);
}
