//! A block device that misbehaves on purpose, wrapped around a working one
//! (usually [`MemDevice`](pvio_blk::device::MemDevice)): it fails requests,
//! loses writes (acknowledges without writing), corrupts read data,
//! reorders completions, delays them, and refuses requests with `Busy`
//! past a queue limit. It counts what it did and the most requests it had
//! in flight, in counters that stay readable after the device has moved to
//! another thread.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pvio_blk::device::{
    BlockDevice, DeviceCompletion, DeviceError, DeviceOp, DeviceRequest, DiskInfo,
};

/// What to do wrong. The default does nothing wrong.
#[derive(Debug, Clone, Default)]
pub struct FaultConfig {
    /// Fail every Nth read or write (counting from 1) with an I/O error,
    /// without performing it.
    pub fail_every: Option<u64>,
    /// Acknowledge writes that cover this byte offset without performing
    /// them: lost writes.
    pub lose_writes_at: Option<u64>,
    /// Let this many writes covering `lose_writes_at` through before
    /// losing the rest.
    pub lose_skip: u64,
    /// Flip a byte in the data of reads that cover this byte offset.
    pub corrupt_reads_at: Option<u64>,
    /// Deliver completions in a shuffled order.
    pub reorder: bool,
    /// Time `wait` takes before delivering (a slow device).
    pub delay: Option<Duration>,
    /// Refuse submits with [`DeviceError::Busy`] while this many requests
    /// are in flight.
    pub queue_limit: Option<usize>,
    /// Seed of the reordering.
    pub seed: u64,
    /// Keep a log of every accepted request ([`FaultyDevice::log`]).
    pub record: bool,
}

/// What the device did, readable from any thread.
#[derive(Debug, Default)]
pub struct FaultCounters {
    /// Requests accepted by `submit`.
    pub submitted: AtomicU64,
    /// Requests accepted but not yet delivered as completions.
    pub inflight: AtomicU64,
    /// The most requests in flight at once.
    pub max_inflight: AtomicU64,
    /// Requests failed on purpose.
    pub failed: AtomicU64,
    /// Writes acknowledged but not performed.
    pub lost: AtomicU64,
    /// Reads whose data was corrupted.
    pub corrupted: AtomicU64,
    /// Submits refused with `Busy`.
    pub busy: AtomicU64,
    /// Batches delivered in an order other than completion order.
    pub reordered: AtomicU64,
}

impl FaultCounters {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

/// A misbehaving device around `D`.
#[derive(Debug)]
pub struct FaultyDevice<D> {
    inner: D,
    cfg: FaultConfig,
    counters: Arc<FaultCounters>,
    /// Tag to request, for requests in flight.
    pending: HashMap<u64, DeviceRequest>,
    ready: Vec<DeviceCompletion>,
    ios: u64,
    lose_seen: u64,
    shuffle: u64,
    log: Vec<DeviceRequest>,
}

impl<D: BlockDevice> FaultyDevice<D> {
    pub fn new(inner: D, cfg: FaultConfig) -> Self {
        Self {
            inner,
            shuffle: cfg.seed | 1,
            cfg,
            counters: Arc::default(),
            pending: HashMap::new(),
            ready: Vec::new(),
            ios: 0,
            lose_seen: 0,
            log: Vec::new(),
        }
    }

    /// The counters (shared: they stay valid after the device moves).
    pub fn counters(&self) -> Arc<FaultCounters> {
        self.counters.clone()
    }

    /// Every accepted request, in submit order (with `record`).
    pub fn log(&self) -> &[DeviceRequest] {
        &self.log
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    pub fn inner_mut(&mut self) -> &mut D {
        &mut self.inner
    }

    pub fn into_inner(self) -> D {
        self.inner
    }

    fn covers(req: &DeviceRequest, at: Option<u64>) -> bool {
        at.is_some_and(|a| a >= req.offset && a < req.offset + u64::from(req.len))
    }

    fn pull(&mut self) -> Result<(), DeviceError> {
        let mut done = Vec::new();
        self.inner.poll(&mut done)?;
        self.ready.append(&mut done);
        Ok(())
    }

    fn deliver(&mut self, out: &mut Vec<DeviceCompletion>) -> usize {
        let mut batch = std::mem::take(&mut self.ready);
        if self.cfg.reorder && batch.len() > 1 {
            // Fisher-Yates with an xorshift; a reversal if it happens to be
            // the identity, so every batch really is reordered.
            let before: Vec<u64> = batch.iter().map(|c| c.tag).collect();
            for i in (1..batch.len()).rev() {
                self.shuffle ^= self.shuffle << 13;
                self.shuffle ^= self.shuffle >> 7;
                self.shuffle ^= self.shuffle << 17;
                batch.swap(i, (self.shuffle % (i as u64 + 1)) as usize);
            }
            if batch.iter().map(|c| c.tag).eq(before.iter().copied()) {
                batch.reverse();
            }
            self.counters.reordered.fetch_add(1, Ordering::Relaxed);
        }
        for c in &batch {
            let Some(req) = self.pending.remove(&c.tag) else {
                continue;
            };
            if req.op == DeviceOp::Read
                && c.result.is_ok()
                && Self::covers(&req, self.cfg.corrupt_reads_at)
            {
                let at = (self.cfg.corrupt_reads_at.unwrap_or(0) - req.offset) as usize;
                let byte = (at / 512) * 512 + 100;
                self.inner.buffer_mut(req.buf)[byte.min(req.len as usize - 1)] ^= 0x5a;
                self.counters.corrupted.fetch_add(1, Ordering::Relaxed);
            }
        }
        let n = batch.len();
        self.counters
            .inflight
            .fetch_sub(n as u64, Ordering::Relaxed);
        out.extend(batch);
        n
    }
}

impl<D: BlockDevice> BlockDevice for FaultyDevice<D> {
    fn info(&self) -> DiskInfo {
        self.inner.info()
    }
    fn buffer_count(&self) -> usize {
        self.inner.buffer_count()
    }
    fn buffer_size(&self) -> usize {
        self.inner.buffer_size()
    }
    fn buffer(&self, idx: usize) -> &[u8] {
        self.inner.buffer(idx)
    }
    fn buffer_mut(&mut self, idx: usize) -> &mut [u8] {
        self.inner.buffer_mut(idx)
    }

    fn submit(&mut self, req: DeviceRequest) -> Result<(), DeviceError> {
        let inflight = FaultCounters::get(&self.counters.inflight);
        if self.cfg.queue_limit.is_some_and(|l| inflight as usize >= l) {
            self.counters.busy.fetch_add(1, Ordering::Relaxed);
            return Err(DeviceError::Busy);
        }
        let data = matches!(req.op, DeviceOp::Read | DeviceOp::Write);
        if data {
            self.ios += 1;
        }
        let fail = data
            && self
                .cfg
                .fail_every
                .is_some_and(|n| n > 0 && self.ios.is_multiple_of(n));
        let mut lose = false;
        if req.op == DeviceOp::Write && Self::covers(&req, self.cfg.lose_writes_at) {
            self.lose_seen += 1;
            lose = self.lose_seen > self.cfg.lose_skip;
        }
        if fail || lose {
            pvio_blk::device::check_request(
                &self.inner.info(),
                (self.inner.buffer_count(), self.inner.buffer_size()),
                &req,
            )?;
            let result = if fail {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
                Err(DeviceError::Io)
            } else {
                self.counters.lost.fetch_add(1, Ordering::Relaxed);
                Ok(req.len)
            };
            self.ready.push(DeviceCompletion {
                tag: req.tag,
                result,
            });
        } else {
            self.inner.submit(req)?;
        }
        self.pending.insert(req.tag, req);
        if self.cfg.record {
            self.log.push(req);
        }
        self.counters.submitted.fetch_add(1, Ordering::Relaxed);
        let now = self.counters.inflight.fetch_add(1, Ordering::Relaxed) + 1;
        self.counters.max_inflight.fetch_max(now, Ordering::Relaxed);
        Ok(())
    }

    fn kick(&mut self) -> Result<(), DeviceError> {
        self.inner.kick()
    }

    fn poll(&mut self, out: &mut Vec<DeviceCompletion>) -> Result<usize, DeviceError> {
        self.pull()?;
        Ok(self.deliver(out))
    }

    fn wait(
        &mut self,
        out: &mut Vec<DeviceCompletion>,
        timeout: Option<Duration>,
    ) -> Result<usize, DeviceError> {
        self.pull()?;
        if self.ready.is_empty() {
            let mut done = Vec::new();
            self.inner.wait(&mut done, timeout)?;
            self.ready.append(&mut done);
        }
        if !self.ready.is_empty() {
            if let Some(d) = self.cfg.delay {
                std::thread::sleep(d);
            }
        }
        Ok(self.deliver(out))
    }
}
