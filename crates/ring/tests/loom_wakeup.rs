//! Lost-wakeup freedom of the ring protocol, by model checking with loom.
//!
//! The frontend and the backend run the crate's real protocol cores
//! (`FrontCore`, `BackCore`) over loom atomics, on a 2-slot ring carrying 3
//! requests (so the ring fills, wraps and reuses slots). Each side is both a
//! producer (requests, resp. responses, published with
//! `push_*_and_check_notify`, notifying only when that says so) and a
//! consumer that drains what it can, runs the final check and sleeps on its
//! event channel only when the final check reports no work.
//!
//! The oracle is loom's deadlock detection: the system is closed, so a side
//! that sleeps with unconsumed work and no notification pending sleeps
//! forever, and with both sides asleep loom reports "deadlock". Slots are
//! loom `UnsafeCell`s, so a missing release/acquire pair shows up as a data
//! race. Each mutant test breaks one rule (no re-check in the final check,
//! no full fence, an acquire-release fence instead of a full one, relaxed
//! index accesses) and asserts that the checker rejects it, for the
//! expected reason: the checks can fail.
//!
//! Bounds: `LOOM_MAX_PREEMPTIONS` (default here 3) keeps each run to
//! seconds; a lost wakeup needs at most two preemptions.

use std::sync::atomic::{AtomicUsize, Ordering as StdOrdering};

use loom::cell::UnsafeCell;
use loom::sync::atomic::{fence, AtomicU32, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;
use pvio_ring::protocol::{BackCore, FrontCore, SharedIndex, SharedIndices};
use pvio_ring::RingIdx;

const SIZE: u32 = 2;
const REQUESTS: u32 = 3;
const REQ_TAG: u64 = 0x1000;
const RSP_TAG: u64 = 0x2000;

/// How the model's `xen_mb()` and index accesses behave.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Barriers {
    /// As the protocol asks.
    Correct,
    /// `full_fence` does nothing.
    NoFullFence,
    /// `full_fence` is an acquire-release fence: orders nothing store→load.
    AcqRelFence,
    /// Every index access is relaxed: no release/acquire for the slots.
    RelaxedIndices,
}

/// How the backend decides it may sleep.
#[derive(Clone, Copy, Debug, PartialEq)]
enum FinalCheck {
    /// `RING_FINAL_CHECK_FOR_REQUESTS`.
    Macro,
    /// Re-arms `req_event` but does not look again before sleeping.
    NoRecheck,
}

#[derive(Clone, Copy, Debug)]
struct Model {
    barriers: Barriers,
    final_check: FinalCheck,
    /// All indices start here, so the run crosses the 2^32 wrap.
    start: RingIdx,
}

struct LoomIndices {
    idx: [AtomicU32; 4],
    barriers: Barriers,
}

impl LoomIndices {
    fn at(&self, i: SharedIndex) -> &AtomicU32 {
        &self.idx[i.offset() / 4]
    }

    fn order(&self, order: Ordering) -> Ordering {
        if self.barriers == Barriers::RelaxedIndices {
            Ordering::Relaxed
        } else {
            order
        }
    }
}

impl SharedIndices for LoomIndices {
    fn load(&self, index: SharedIndex, order: Ordering) -> RingIdx {
        self.at(index).load(self.order(order))
    }

    fn store(&self, index: SharedIndex, value: RingIdx, order: Ordering) {
        self.at(index).store(value, self.order(order))
    }

    fn full_fence(&self) {
        match self.barriers {
            Barriers::Correct | Barriers::RelaxedIndices => fence(Ordering::SeqCst),
            Barriers::NoFullFence => {}
            Barriers::AcqRelFence => fence(Ordering::AcqRel),
        }
    }
}

/// An event channel: a pending bit and a sleeper, like an eventfd.
struct EventChannel {
    pending: Mutex<bool>,
    wake: Condvar,
}

impl EventChannel {
    fn new() -> Self {
        Self {
            pending: Mutex::new(false),
            wake: Condvar::new(),
        }
    }

    fn notify(&self) {
        *self.pending.lock().unwrap() = true;
        self.wake.notify_one();
    }

    /// Sleeps until a notification is pending, and consumes it.
    fn wait(&self) {
        let mut pending = self.pending.lock().unwrap();
        while !*pending {
            pending = self.wake.wait(pending).unwrap();
        }
        *pending = false;
    }
}

struct Ring {
    ix: LoomIndices,
    slots: [UnsafeCell<u64>; SIZE as usize],
    to_back: EventChannel,
    to_front: EventChannel,
}

impl Ring {
    fn new(model: &Model) -> Self {
        let ix = LoomIndices {
            idx: [
                AtomicU32::new(model.start),
                AtomicU32::new(model.start.wrapping_add(1)),
                AtomicU32::new(model.start),
                AtomicU32::new(model.start.wrapping_add(1)),
            ],
            barriers: model.barriers,
        };
        Self {
            ix,
            slots: [UnsafeCell::new(0), UnsafeCell::new(0)],
            to_back: EventChannel::new(),
            to_front: EventChannel::new(),
        }
    }

    fn write(&self, idx: RingIdx, value: u64) {
        self.slots[(idx % SIZE) as usize].with_mut(|p| {
            // SAFETY: loom's cell pointer is valid; loom itself reports a
            // race if the protocol lets this write overlap another access.
            unsafe { *p = value }
        })
    }

    fn read(&self, idx: RingIdx) -> u64 {
        self.slots[(idx % SIZE) as usize].with(|p| {
            // SAFETY: as in write.
            unsafe { *p }
        })
    }
}

fn frontend(ring: &Ring, mut front: FrontCore) {
    let ix = &ring.ix;
    let (mut sent, mut received) = (0u32, 0u32);
    while received < REQUESTS {
        while sent < REQUESTS && !front.is_full() {
            front
                .push_request(|i| ring.write(i, REQ_TAG + u64::from(sent)))
                .unwrap();
            sent += 1;
        }
        if front.push_requests_and_check_notify(ix) {
            ring.to_back.notify();
        }
        let mut got_any = false;
        while let Some(v) = front.take_response(ix, |i| ring.read(i)).unwrap() {
            assert_eq!(
                v,
                RSP_TAG + u64::from(received),
                "response out of order or torn"
            );
            received += 1;
            got_any = true;
        }
        if !got_any && received < REQUESTS && !front.final_check_for_responses(ix).unwrap() {
            ring.to_front.wait();
        }
    }
}

fn backend(ring: &Ring, mut back: BackCore, final_check: FinalCheck) {
    let ix = &ring.ix;
    let mut answered = 0u32;
    loop {
        while let Some(v) = back.take_request(ix, |i| ring.read(i)).unwrap() {
            assert_eq!(
                v,
                REQ_TAG + u64::from(answered),
                "request out of order or torn"
            );
            back.push_response(|i| ring.write(i, RSP_TAG + u64::from(answered)))
                .unwrap();
            answered += 1;
        }
        if back.push_responses_and_check_notify(ix) {
            ring.to_front.notify();
        }
        if answered == REQUESTS {
            return;
        }
        let work = match final_check {
            FinalCheck::Macro => back.final_check_for_requests(ix).unwrap(),
            FinalCheck::NoRecheck => {
                if back.has_unconsumed_requests(ix) {
                    true
                } else {
                    let event = back.req_cons().wrapping_add(1);
                    back.set_req_event(ix, event);
                    false
                }
            }
        };
        if !work {
            ring.to_back.wait();
        }
    }
}

/// Runs the model under loom and returns the number of executions explored.
fn check(model: Model) -> usize {
    // Tests run in parallel threads, so each call counts in its own cell.
    let count = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = count.clone();

    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(move || {
        counter.fetch_add(1, StdOrdering::Relaxed);
        let ring = Arc::new(Ring::new(&model));
        let front = FrontCore::attach(&ring.ix, SIZE, "loom").unwrap();
        let back = BackCore::attach(&ring.ix, SIZE, "loom").unwrap();
        let backend_ring = ring.clone();
        let final_check = model.final_check;
        let backend_thread = thread::spawn(move || backend(&backend_ring, back, final_check));
        frontend(&ring, front);
        backend_thread.join().unwrap();
    });
    count.load(StdOrdering::Relaxed)
}

/// The environment variable that makes `child_checks_a_mutant` run one.
const MUTANT_ENV: &str = "PVIO_RING_LOOM_MUTANT";

const MUTANTS: [(&str, Model); 4] = [
    (
        "no-recheck",
        Model {
            final_check: FinalCheck::NoRecheck,
            ..CORRECT
        },
    ),
    (
        "no-full-fence",
        Model {
            barriers: Barriers::NoFullFence,
            ..CORRECT
        },
    ),
    (
        "acq-rel-fence",
        Model {
            barriers: Barriers::AcqRelFence,
            ..CORRECT
        },
    ),
    (
        "relaxed-indices",
        Model {
            barriers: Barriers::RelaxedIndices,
            ..CORRECT
        },
    ),
];

/// Model-checks a mutant in a child process (this test binary again) and
/// returns what it printed; fails if the checker accepted the mutant.
///
/// A child, because loom cannot be unwound: after it reports a failure its
/// objects' destructors panic and the process aborts.
fn check_rejected(name: &str) -> String {
    let exe = std::env::current_exe().expect("test binary path");
    let out = std::process::Command::new(exe)
        .args([
            "child_checks_a_mutant",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(MUTANT_ENV, name)
        .output()
        .expect("spawn the mutant checker");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success() && !text.contains("mutant accepted"),
        "loom accepted the mutant {name}: {text}"
    );
    assert!(
        text.contains(&format!("checking mutant {name}")),
        "the child did not run the mutant {name}: {text}"
    );
    text
}

/// The child side of `check_rejected`; passes trivially when run normally.
#[test]
fn child_checks_a_mutant() {
    let Ok(name) = std::env::var(MUTANT_ENV) else {
        return;
    };
    // The child dies by abort: leave no core file behind.
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let maximum = getrlimit(Resource::Core).maximum;
    let _ = setrlimit(
        Resource::Core,
        Rlimit {
            current: Some(0),
            maximum,
        },
    );
    let (_, model) = MUTANTS
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("unknown mutant {name}"));
    println!("checking mutant {name}");
    let n = check(*model);
    println!("mutant accepted after {n} executions");
}

const CORRECT: Model = Model {
    barriers: Barriers::Correct,
    final_check: FinalCheck::Macro,
    start: 0,
};

#[test]
fn protocol_has_no_lost_wakeup() {
    let n = check(CORRECT);
    println!("{n} executions");
    // A two-thread model with this many steps has far more than a handful
    // of interleavings; a tiny count would mean the model did not run.
    assert!(n > 100, "only {n} executions explored");
}

#[test]
fn protocol_has_no_lost_wakeup_across_index_wrap() {
    let n = check(Model {
        start: u32::MAX - 1,
        ..CORRECT
    });
    assert!(n > 100, "only {n} executions explored");
}

#[test]
fn mutant_final_check_without_recheck_loses_a_wakeup() {
    let out = check_rejected("no-recheck");
    assert!(
        out.contains("deadlock"),
        "rejected for another reason: {out}"
    );
}

#[test]
fn mutant_without_full_fence_loses_a_wakeup() {
    let out = check_rejected("no-full-fence");
    assert!(
        out.contains("deadlock"),
        "rejected for another reason: {out}"
    );
}

#[test]
fn mutant_with_acq_rel_fence_loses_a_wakeup() {
    let out = check_rejected("acq-rel-fence");
    assert!(
        out.contains("deadlock"),
        "rejected for another reason: {out}"
    );
}

#[test]
fn mutant_with_relaxed_indices_races_on_slots() {
    let out = check_rejected("relaxed-indices");
    assert!(
        out.contains("Causality violation"),
        "rejected for another reason: {out}"
    );
}
