//! The device side of a session: runs validated commands on the
//! [`BlockDevice`] with many device requests in flight, and answers each
//! in completion order, which NBD allows: with a simple reply, or, once
//! structured replies are negotiated, a structured one for reads (one
//! `OFFSET_DATA` chunk), block status (one `BLOCK_STATUS` chunk) and every
//! error (one `ERROR` chunk).
//!
//! Reads, writes and write-zeroes larger than the device's largest request
//! are split into several device requests; a command with FUA gets a device
//! flush after its data and is answered after the flush. A command is held
//! in memory while it runs; at most [`MAX_ACTIVE`] commands and about
//! [`BYTE_BUDGET`] bytes run at once, and the reader thread's bounded queue
//! pushes back on the client beyond that.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

use pvio_blk::device::{
    parse_block_status, BlockDevice, DeviceCompletion, DeviceError, DeviceOp, DeviceRequest,
    StatusExtent,
};

use super::defs::{
    EINVAL, EIO, EPERM, META_BASE_ALLOCATION_ID, REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS,
    REPLY_TYPE_ERROR, REPLY_TYPE_OFFSET_DATA, STATE_HOLE, STATE_ZERO,
};
use super::error::NbdError;
use super::request::{Command, Refusal};
use super::stats::NbdStats;
use super::wire::{simple_reply_header, structured_reply_header};

/// Commands running at once.
pub const MAX_ACTIVE: usize = 64;
/// Payload bytes held by running commands before intake pauses.
pub const BYTE_BUDGET: u64 = 64 << 20;
/// Longest wait on the device before looking at the request queue again.
const WAIT_SLICE: Duration = Duration::from_millis(1);
/// No device completion for this long with requests in flight ends the
/// session.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest discard sent as one device request.
const DISCARD_CHUNK: u64 = 1 << 30;

/// What the reader thread hands over.
#[derive(Debug)]
pub enum Msg {
    Request {
        cookie: u64,
        cmd: Result<Command, Refusal>,
    },
    /// `NBD_CMD_DISC`: finish what runs, answer it, close.
    Disconnect,
    /// The client went away or broke the protocol: finish what runs, send
    /// nothing more.
    Closed(Option<String>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Write,
    Zeroes,
    Trim,
    Flush,
    BlockStatus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Data,
    Flush,
}

#[derive(Debug)]
struct Active {
    cookie: u64,
    op: Op,
    offset: u64,
    len: u64,
    fua: bool,
    /// Read: room for the reply's headers ([`Executor::read_header`]),
    /// then the data. Write: the data.
    data: Vec<u8>,
    /// Block status: only the first extent (`NBD_CMD_FLAG_REQ_ONE`).
    one: bool,
    /// Block status: what the device said.
    extents: Vec<StatusExtent>,
    stage: Stage,
    /// Bytes of the data stage submitted (or 1 once the flush is).
    next: u64,
    outstanding: u32,
    errno: u32,
    queued: bool,
}

impl Active {
    fn has_more(&self) -> bool {
        match self.stage {
            Stage::Data => self.next < self.len,
            Stage::Flush => self.next == 0,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Sub {
    id: usize,
    buf: Option<usize>,
    /// Byte offset within the command's data.
    at: usize,
    len: u32,
    op: DeviceOp,
}

/// NBD error for a device error.
fn errno_of(e: &DeviceError) -> u32 {
    match e {
        DeviceError::Invalid(_) | DeviceError::NotSupported => EINVAL,
        DeviceError::ReadOnly => EPERM,
        DeviceError::Busy | DeviceError::Io | DeviceError::Disconnected(_) => EIO,
    }
}

/// Runs commands on one device for one session.
pub struct Executor<'a, D: BlockDevice + ?Sized, W: Write> {
    dev: &'a mut D,
    out: &'a mut W,
    stats: &'a NbdStats,
    chunk: u32,
    reqs: Vec<Option<Active>>,
    free_ids: Vec<usize>,
    active: usize,
    active_bytes: u64,
    queue: VecDeque<usize>,
    tags: HashMap<u64, Sub>,
    next_tag: u64,
    free_bufs: VecDeque<usize>,
    inflight: usize,
    replies_off: bool,
    reply_error: Option<std::io::Error>,
    /// Structured replies were negotiated.
    structured: bool,
    /// Bytes before a read's data in its reply: a simple reply's header,
    /// or a structured chunk's header and offset.
    read_header: usize,
}

impl<'a, D: BlockDevice + ?Sized, W: Write> Executor<'a, D, W> {
    /// An executor whose device tags start at `tag_base` (distinct per
    /// session, so a late completion of an abandoned session is not
    /// mistaken for one of this session), answering with structured
    /// replies where NBD requires them when `structured`.
    pub fn new(
        dev: &'a mut D,
        out: &'a mut W,
        stats: &'a NbdStats,
        tag_base: u64,
        structured: bool,
    ) -> Self {
        let info = dev.info();
        let sector = info.sector_size.max(1);
        let max = info
            .max_request_bytes
            .min(u32::try_from(dev.buffer_size()).unwrap_or(u32::MAX));
        let chunk = (max / sector * sector).max(sector);
        Self {
            free_bufs: (0..dev.buffer_count()).collect(),
            dev,
            out,
            stats,
            chunk,
            reqs: Vec::new(),
            free_ids: Vec::new(),
            active: 0,
            active_bytes: 0,
            queue: VecDeque::new(),
            tags: HashMap::new(),
            next_tag: tag_base,
            inflight: 0,
            replies_off: false,
            reply_error: None,
            structured,
            read_header: if structured { 20 + 8 } else { 16 },
        }
    }

    /// Serves messages from `rx` until the client disconnects and every
    /// running command is finished.
    pub fn serve(mut self, rx: &Receiver<Msg>) -> Result<(), NbdError> {
        let mut open = true;
        let mut last_progress = Instant::now();
        let mut comps: Vec<DeviceCompletion> = Vec::new();
        loop {
            if self.replies_off {
                open = false;
            }
            let was_idle = self.active == 0;
            while open && self.active < MAX_ACTIVE && self.active_bytes < BYTE_BUDGET {
                let msg = if self.active == 0 {
                    rx.recv().unwrap_or(Msg::Closed(None))
                } else {
                    match rx.try_recv() {
                        Ok(m) => m,
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => Msg::Closed(None),
                    }
                };
                match msg {
                    Msg::Request { cookie, cmd } => self.start(cookie, cmd),
                    Msg::Disconnect => open = false,
                    Msg::Closed(why) => {
                        if let Some(why) = why {
                            tracing::debug!("nbd: session closing: {why}");
                        }
                        open = false;
                        self.replies_off = true;
                    }
                }
            }
            // Time spent idle, waiting for the client, is not a stall.
            if was_idle {
                last_progress = Instant::now();
            }
            self.submit_ready();
            if self.inflight > 0 {
                self.dev
                    .kick()
                    .map_err(|e| NbdError::Device(format!("kick failed: {e}")))?;
            }
            if self.active == 0 {
                if !open {
                    return match self.reply_error.take() {
                        Some(e) => Err(NbdError::Io(e)),
                        None => Ok(()),
                    };
                }
                continue;
            }
            let n = self
                .dev
                .wait(&mut comps, Some(WAIT_SLICE))
                .map_err(|e| NbdError::Device(format!("waiting for completions failed: {e}")))?;
            if n == 0 && comps.is_empty() {
                if last_progress.elapsed() > STALL_TIMEOUT {
                    return Err(NbdError::Device(format!(
                        "no completion for {} s with {} request(s) in flight",
                        STALL_TIMEOUT.as_secs(),
                        self.inflight
                    )));
                }
                continue;
            }
            last_progress = Instant::now();
            for c in comps.drain(..) {
                self.complete(c);
            }
        }
    }

    fn start(&mut self, cookie: u64, cmd: Result<Command, Refusal>) {
        let cmd = match cmd {
            Ok(c) => c,
            Err(r) => {
                tracing::debug!(cookie, errno = r.errno, "nbd: refused: {}", r.reason);
                self.reply(cookie, r.errno);
                return;
            }
        };
        let footprint = cmd.footprint();
        let mut one = false;
        let (op, offset, len, fua, data) = match cmd {
            Command::Read { offset, len } => (
                Op::Read,
                offset,
                u64::from(len),
                false,
                vec![0u8; self.read_header + len as usize],
            ),
            Command::BlockStatus {
                offset,
                len,
                one: first_only,
            } => {
                one = first_only;
                (Op::BlockStatus, offset, u64::from(len), false, Vec::new())
            }
            Command::Write { offset, data, fua } => {
                (Op::Write, offset, data.len() as u64, fua, data)
            }
            Command::WriteZeroes { offset, len, fua } => {
                (Op::Zeroes, offset, u64::from(len), fua, Vec::new())
            }
            Command::Trim { offset, len, fua } => {
                (Op::Trim, offset, u64::from(len), fua, Vec::new())
            }
            Command::Flush => (Op::Flush, 0, 0, false, Vec::new()),
        };
        let a = Active {
            cookie,
            op,
            offset,
            len,
            fua,
            data,
            one,
            extents: Vec::new(),
            stage: if op == Op::Flush {
                Stage::Flush
            } else {
                Stage::Data
            },
            next: 0,
            outstanding: 0,
            errno: 0,
            queued: true,
        };
        let id = match self.free_ids.pop() {
            Some(id) => {
                self.reqs[id] = Some(a);
                id
            }
            None => {
                self.reqs.push(Some(a));
                self.reqs.len() - 1
            }
        };
        self.active += 1;
        self.active_bytes += footprint;
        self.stats
            .max_active
            .fetch_max(self.active as u64, std::sync::atomic::Ordering::Relaxed);
        self.queue.push_back(id);
    }

    /// Submits device requests for queued commands while buffers last.
    fn submit_ready(&mut self) {
        while let Some(&id) = self.queue.front() {
            let Some(a) = self.reqs[id].as_mut() else {
                self.queue.pop_front();
                continue;
            };
            if a.errno != 0 || !a.has_more() {
                a.queued = false;
                self.queue.pop_front();
                if a.outstanding == 0 {
                    self.advance(id);
                }
                continue;
            }
            let (op, offset, n) = match (a.stage, a.op) {
                (Stage::Flush, _) => (DeviceOp::Flush, 0, 0),
                (Stage::Data, Op::Trim) => {
                    let n = (a.len - a.next).min(DISCARD_CHUNK);
                    (DeviceOp::Discard, a.offset + a.next, n as u32)
                }
                (Stage::Data, Op::Read) => {
                    let n = (a.len - a.next).min(u64::from(self.chunk));
                    (DeviceOp::Read, a.offset + a.next, n as u32)
                }
                // One question; the answer may cover less than asked,
                // which NBD allows.
                (Stage::Data, Op::BlockStatus) => (DeviceOp::BlockStatus, a.offset, a.len as u32),
                (Stage::Data, _) => {
                    let n = (a.len - a.next).min(u64::from(self.chunk));
                    (DeviceOp::Write, a.offset + a.next, n as u32)
                }
            };
            let at = a.next as usize;
            let buf = if matches!(op, DeviceOp::Read | DeviceOp::Write | DeviceOp::BlockStatus) {
                match self.free_bufs.pop_front() {
                    Some(b) => Some(b),
                    None => return,
                }
            } else {
                None
            };
            if let (Some(b), Op::Write | Op::Zeroes) = (buf, a.op) {
                let dst = &mut self.dev.buffer_mut(b)[..n as usize];
                match a.op {
                    Op::Write => dst.copy_from_slice(&a.data[at..at + n as usize]),
                    _ => dst.fill(0),
                }
            }
            let tag = self.next_tag;
            self.next_tag = self.next_tag.wrapping_add(1);
            let req = DeviceRequest {
                op,
                offset,
                len: n,
                buf: buf.unwrap_or(0),
                tag,
            };
            match self.dev.submit(req) {
                Ok(()) => {
                    a.next += match op {
                        DeviceOp::Flush => 1,
                        DeviceOp::BlockStatus => a.len,
                        _ => u64::from(n),
                    };
                    a.outstanding += 1;
                    self.inflight += 1;
                    self.tags.insert(
                        tag,
                        Sub {
                            id,
                            buf,
                            at,
                            len: n,
                            op,
                        },
                    );
                    if !a.has_more() {
                        a.queued = false;
                        self.queue.pop_front();
                    }
                }
                Err(e) => {
                    if let Some(b) = buf {
                        self.free_bufs.push_front(b);
                    }
                    if e == DeviceError::Busy {
                        return;
                    }
                    tracing::debug!(
                        cookie = a.cookie,
                        "nbd: device refused {op:?} at {offset}: {e}"
                    );
                    a.errno = errno_of(&e);
                }
            }
        }
    }

    fn complete(&mut self, c: DeviceCompletion) {
        let Some(sub) = self.tags.remove(&c.tag) else {
            tracing::warn!(tag = c.tag, "nbd: completion for a request not in flight");
            return;
        };
        self.inflight -= 1;
        let Some(a) = self.reqs[sub.id].as_mut() else {
            return;
        };
        a.outstanding -= 1;
        let expect = match sub.op {
            DeviceOp::Flush | DeviceOp::BlockStatus => None,
            _ => Some(sub.len),
        };
        match c.result {
            Ok(n) if expect.is_some_and(|e| e != n) => {
                tracing::debug!(cookie = a.cookie, "nbd: short transfer {n} of {}", sub.len);
                a.errno = EIO;
            }
            Ok(n) => match (sub.op, sub.buf) {
                (DeviceOp::Read, Some(b)) => {
                    let (h, n) = (self.read_header, sub.len as usize);
                    a.data[h + sub.at..h + sub.at + n].copy_from_slice(&self.dev.buffer(b)[..n]);
                }
                (DeviceOp::BlockStatus, Some(b)) => {
                    a.extents = parse_block_status(self.dev.buffer(b), u64::from(n.min(sub.len)));
                    // An answer that describes nothing is broken.
                    if a.extents.is_empty() {
                        a.errno = EIO;
                    }
                }
                _ => {}
            },
            Err(e) => {
                tracing::debug!(cookie = a.cookie, "nbd: device {:?} failed: {e}", sub.op);
                if a.errno == 0 {
                    a.errno = errno_of(&e);
                }
            }
        }
        if let Some(b) = sub.buf {
            self.free_bufs.push_back(b);
        }
        if a.outstanding == 0 && !a.queued {
            self.advance(sub.id);
        }
    }

    /// A command's current stage is over: start its flush, or answer it.
    fn advance(&mut self, id: usize) {
        let Some(a) = self.reqs[id].as_mut() else {
            return;
        };
        if a.stage == Stage::Data && a.fua && a.errno == 0 {
            a.stage = Stage::Flush;
            a.next = 0;
            a.queued = true;
            self.queue.push_back(id);
            return;
        }
        let Some(a) = self.reqs[id].take() else {
            return;
        };
        self.free_ids.push(id);
        self.active -= 1;
        let footprint = match a.op {
            Op::Read => a.len,
            Op::Write => a.data.len() as u64,
            _ => 0,
        };
        self.active_bytes -= footprint;
        if a.errno == 0 {
            match a.op {
                Op::Read => NbdStats::add(&self.stats.bytes_read, a.len),
                Op::Write | Op::Zeroes => NbdStats::add(&self.stats.bytes_written, a.len),
                _ => {}
            }
        }
        match (a.op, a.errno) {
            (Op::Read, 0) => {
                let mut data = a.data;
                self.reply_read(a.cookie, a.offset, &mut data);
            }
            (Op::BlockStatus, 0) => self.reply_block_status(a.cookie, &a.extents, a.one),
            (_, errno) => self.reply(a.cookie, errno),
        }
    }

    /// Answers a command without a payload: a simple reply, or with
    /// structured replies an error as an `ERROR` chunk.
    fn reply(&mut self, cookie: u64, errno: u32) {
        if errno != 0 {
            NbdStats::add(&self.stats.error_replies, 1);
        }
        if errno != 0 && self.structured {
            // error, message length (none).
            let mut m =
                structured_reply_header(REPLY_FLAG_DONE, REPLY_TYPE_ERROR, cookie, 6).to_vec();
            m.extend_from_slice(&errno.to_be_bytes());
            m.extend_from_slice(&0u16.to_be_bytes());
            self.send(&m);
        } else {
            self.send(&simple_reply_header(errno, cookie));
        }
    }

    /// Answers a read; `data` is its buffer, header space first, and goes
    /// out in one write.
    fn reply_read(&mut self, cookie: u64, offset: u64, data: &mut [u8]) {
        if self.structured {
            let len = (data.len() - 20) as u32;
            data[..20].copy_from_slice(&structured_reply_header(
                REPLY_FLAG_DONE,
                REPLY_TYPE_OFFSET_DATA,
                cookie,
                len,
            ));
            data[20..28].copy_from_slice(&offset.to_be_bytes());
        } else {
            data[..16].copy_from_slice(&simple_reply_header(0, cookie));
        }
        self.send(data);
    }

    /// Answers a block-status command with one `BLOCK_STATUS` chunk of
    /// `base:allocation` descriptors (neighbours with the same flags
    /// merged; only the first with `one`).
    fn reply_block_status(&mut self, cookie: u64, extents: &[StatusExtent], one: bool) {
        let mut descs: Vec<(u32, u32)> = Vec::new();
        for e in extents {
            let mut flags = 0;
            if e.hole {
                flags |= STATE_HOLE;
            }
            if e.zero {
                flags |= STATE_ZERO;
            }
            // Each extent lies within the command's 32-bit length.
            let len = e.len as u32;
            match descs.last_mut() {
                Some((l, f)) if *f == flags => *l += len,
                _ => descs.push((len, flags)),
            }
        }
        if one {
            descs.truncate(1);
        }
        let payload = 4 + 8 * descs.len() as u32;
        let mut m =
            structured_reply_header(REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, cookie, payload)
                .to_vec();
        m.extend_from_slice(&META_BASE_ALLOCATION_ID.to_be_bytes());
        for (len, flags) in descs {
            m.extend_from_slice(&len.to_be_bytes());
            m.extend_from_slice(&flags.to_be_bytes());
        }
        self.send(&m);
    }

    fn send(&mut self, bytes: &[u8]) {
        if self.replies_off {
            return;
        }
        if let Err(e) = self.out.write_all(bytes) {
            tracing::debug!("nbd: sending a reply failed: {e}");
            self.replies_off = true;
            self.reply_error = Some(e);
        }
    }
}
