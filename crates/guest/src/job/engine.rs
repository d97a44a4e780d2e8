//! One job's I/O loop: keeps up to `iodepth` requests in flight on one
//! device with `submit`, `kick` and `wait`, taking buffers in turn from the
//! device's pool (a FIFO of free buffers), matching completions by tag, and
//! stamping and checking blocks when verifying.
//!
//! When verifying, two requests for the same block are never in flight
//! together: a planned I/O whose block is busy waits in a short deferred
//! queue. This is what makes "a read returns the last acknowledged write"
//! a sound check.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use pvio_blk::device::{BlockDevice, DeviceCompletion, DeviceError, DeviceOp, DeviceRequest};

use super::acks::{AckMap, BlockState};
use super::layout::Layout;
use super::pattern::{check_block, write_block};
use super::plan::{IoKind, Plan, Planned};
use super::stats::{ErrorLog, OpStats, VerifyStats};

/// Longest single wait for completions, so stop requests are noticed.
const WAIT_SLICE: Duration = Duration::from_millis(100);
/// No completion for this long with requests in flight aborts the job.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Counters of one phase (the workload, or the verify read-back).
#[derive(Debug, Default)]
pub struct PhaseStats {
    pub read: OpStats,
    pub write: OpStats,
    pub errors: ErrorLog,
    pub verify: VerifyStats,
    /// I/Os issued before this instant are not measured (the ramp).
    pub measure_from: Option<Instant>,
    pub last_completion: Option<Instant>,
}

#[derive(Debug)]
struct InFlight {
    kind: IoKind,
    block: u64,
    buf: usize,
    generation: u64,
    issued: Instant,
}

/// The engine of one job on one device.
pub struct Engine<'d, D: BlockDevice + ?Sized> {
    dev: &'d mut D,
    layout: Layout,
    slots: Vec<Option<InFlight>>,
    free_slots: Vec<usize>,
    free_bufs: VecDeque<usize>,
    inflight: usize,
    busy: HashSet<u64>,
    deferred: VecDeque<Planned>,
    comps: Vec<DeviceCompletion>,
    /// Most requests in flight at once.
    pub inflight_max: usize,
}

enum Fill {
    /// Depth reached, or nothing more to issue now.
    Full,
    /// The device said it is busy.
    DeviceBusy,
}

impl<'d, D: BlockDevice + ?Sized> Engine<'d, D> {
    /// An engine keeping `depth` requests in flight (at most the number of
    /// device buffers; at least 1).
    pub fn new(dev: &'d mut D, layout: Layout, depth: usize) -> Self {
        let depth = depth.clamp(1, dev.buffer_count().max(1));
        Self {
            free_bufs: (0..dev.buffer_count()).collect(),
            dev,
            layout,
            slots: (0..depth).map(|_| None).collect(),
            free_slots: (0..depth).rev().collect(),
            inflight: 0,
            busy: HashSet::new(),
            deferred: VecDeque::new(),
            comps: Vec::new(),
            inflight_max: 0,
        }
    }

    /// The depth in use.
    pub fn depth(&self) -> usize {
        self.slots.len()
    }

    /// Runs `plan` to its end. With `acks`, writes are stamped and recorded
    /// and reads of written blocks checked. `Err` is why the phase was
    /// abandoned (the device failed as a whole or stalled).
    pub fn run(
        &mut self,
        plan: &mut dyn Plan,
        mut acks: Option<&mut AckMap>,
        stats: &mut PhaseStats,
    ) -> Result<(), String> {
        let mut plan_over = false;
        let mut last_progress = Instant::now();
        loop {
            let fill = self.fill(plan, &mut plan_over, acks.as_deref_mut(), stats)?;
            if plan.cut_short() {
                self.deferred.clear();
            }
            if self.inflight == 0 && plan_over && self.deferred.is_empty() {
                return Ok(());
            }
            self.dev.kick().map_err(|e| format!("kick failed: {e}"))?;
            if self.inflight == 0 && !matches!(fill, Fill::DeviceBusy) {
                continue;
            }
            let n = self
                .dev
                .wait(&mut self.comps, Some(WAIT_SLICE))
                .map_err(|e| format!("waiting for completions failed: {e}"))?;
            let now = Instant::now();
            if n == 0 && self.comps.is_empty() {
                if now.duration_since(last_progress) > STALL_TIMEOUT {
                    return Err(format!(
                        "no completion for {} s with {} request(s) in flight",
                        STALL_TIMEOUT.as_secs(),
                        self.inflight
                    ));
                }
                continue;
            }
            last_progress = now;
            let mut comps = std::mem::take(&mut self.comps);
            for c in comps.drain(..) {
                self.complete(c, now, acks.as_deref_mut(), stats);
            }
            self.comps = comps;
        }
    }

    /// The next I/O that may be issued now: a deferred one whose block is
    /// free, else a fresh one from the plan (deferred if its block is busy).
    fn next_io(&mut self, plan: &mut dyn Plan, plan_over: &mut bool) -> Option<Planned> {
        if let Some(i) = self
            .deferred
            .iter()
            .position(|p| !self.busy.contains(&p.block))
        {
            return self.deferred.remove(i);
        }
        while !*plan_over && self.deferred.len() < self.slots.len() {
            match plan.next(Instant::now()) {
                None => *plan_over = true,
                Some(p) if self.busy.contains(&p.block) => self.deferred.push_back(p),
                Some(p) => return Some(p),
            }
        }
        None
    }

    fn fill(
        &mut self,
        plan: &mut dyn Plan,
        plan_over: &mut bool,
        mut acks: Option<&mut AckMap>,
        stats: &mut PhaseStats,
    ) -> Result<Fill, String> {
        let bs = self.layout.bs as usize;
        while !self.free_slots.is_empty() && !self.free_bufs.is_empty() {
            let Some(p) = self.next_io(plan, plan_over) else {
                return Ok(Fill::Full);
            };
            let (Some(slot), Some(buf)) = (self.free_slots.pop(), self.free_bufs.pop_front())
            else {
                return Ok(Fill::Full);
            };
            let mut generation = 0;
            if let (IoKind::Write, Some(a)) = (p.kind, acks.as_deref_mut()) {
                generation = a.next_generation();
                write_block(
                    &mut self.dev.buffer_mut(buf)[..bs],
                    &a.stamp(p.block, generation),
                );
            }
            let req = DeviceRequest {
                op: match p.kind {
                    IoKind::Read => DeviceOp::Read,
                    IoKind::Write => DeviceOp::Write,
                },
                offset: self.layout.offset_of(p.block),
                len: self.layout.bs,
                buf,
                tag: slot as u64,
            };
            // Latency is measured from before submit, like fio's clat+slat.
            let issued = Instant::now();
            match self.dev.submit(req) {
                Ok(()) => {
                    self.slots[slot] = Some(InFlight {
                        kind: p.kind,
                        block: p.block,
                        buf,
                        generation,
                        issued,
                    });
                    if acks.is_some() {
                        self.busy.insert(p.block);
                    }
                    self.inflight += 1;
                    self.inflight_max = self.inflight_max.max(self.inflight);
                }
                Err(e) => {
                    self.free_slots.push(slot);
                    self.free_bufs.push_front(buf);
                    match e {
                        DeviceError::Busy => {
                            self.deferred.push_front(p);
                            return Ok(Fill::DeviceBusy);
                        }
                        DeviceError::Io => {
                            let op = match p.kind {
                                IoKind::Read => &mut stats.read,
                                IoKind::Write => &mut stats.write,
                            };
                            op.errors += 1;
                            stats.errors.push(|| {
                                format!("{:?} at offset {} refused: {e}", p.kind, req.offset)
                            });
                        }
                        e => return Err(format!("the device refused a request: {e}")),
                    }
                }
            }
        }
        Ok(Fill::Full)
    }

    fn complete(
        &mut self,
        c: DeviceCompletion,
        now: Instant,
        acks: Option<&mut AckMap>,
        stats: &mut PhaseStats,
    ) {
        let Some(f) = self.slots.get_mut(c.tag as usize).and_then(Option::take) else {
            stats
                .errors
                .push(|| format!("completion with a tag {} that is not in flight", c.tag));
            return;
        };
        self.free_slots.push(c.tag as usize);
        self.free_bufs.push_back(f.buf);
        self.inflight -= 1;
        self.busy.remove(&f.block);
        stats.last_completion = Some(now);
        let offset = self.layout.offset_of(f.block);
        let bs = self.layout.bs;
        let op = match f.kind {
            IoKind::Read => &mut stats.read,
            IoKind::Write => &mut stats.write,
        };
        let result = match c.result {
            Ok(n) if n == bs => Ok(()),
            Ok(n) => Err(format!("short transfer: {n} of {bs} bytes")),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = result {
            op.errors += 1;
            stats
                .errors
                .push(|| format!("{:?} at offset {offset} failed: {e}", f.kind));
            if let (IoKind::Write, Some(a)) = (f.kind, acks) {
                a.mark_failed(f.block);
            }
            return;
        }
        if stats.measure_from.is_none_or(|m| f.issued >= m) {
            op.record(now.duration_since(f.issued), u64::from(bs));
        }
        let Some(a) = acks else { return };
        match f.kind {
            IoKind::Write => a.ack(f.block, f.generation),
            IoKind::Read => match a.state(f.block) {
                BlockState::Acked(g) => {
                    let data = &self.dev.buffer(f.buf)[..bs as usize];
                    match check_block(data, &a.stamp(f.block, g)) {
                        Ok(()) => stats.verify.pass(),
                        Err(m) => stats.verify.fail(offset, m.to_string()),
                    }
                }
                BlockState::Unwritten => stats.verify.unverified_reads += 1,
                BlockState::Indeterminate => {}
            },
        }
    }
}
