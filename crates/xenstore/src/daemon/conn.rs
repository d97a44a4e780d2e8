//! One client connection: its identity, its transport, buffered input
//! (framed into requests) and a bounded queue of encoded replies and watch
//! events waiting to be written.

use super::transport::Transport;
use crate::codec::{decode_frame, FrameError, Header, HEADER_LEN};
use crate::store::{ConnId, Identity};
use rustix::event::epoll::EventFlags;
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::time::Instant;

/// Slices handed to one `writev`.
const WRITEV_BATCH: usize = 64;

struct OutMsg {
    bytes: Vec<u8>,
    is_event: bool,
    queued: Instant,
}

/// Result of one read from the transport.
#[derive(Debug, PartialEq, Eq)]
pub enum Fill {
    /// Some bytes arrived.
    Data,
    /// Nothing available now.
    Empty,
    /// The peer closed its end.
    Eof,
}

/// A connection.
pub struct Conn {
    pub id: ConnId,
    pub identity: Identity,
    pub transport: Box<dyn Transport>,
    inbuf: Vec<u8>,
    in_start: usize,
    out: VecDeque<OutMsg>,
    out_offset: usize,
    /// Bytes queued for output.
    pub out_bytes: usize,
    /// Watch events queued for output.
    pub out_events: usize,
    /// Replies queued for output (requests not yet answered on the wire).
    pub replies_queued: usize,
    /// Flags currently registered with epoll.
    pub interest: EventFlags,
    /// The peer closed its end: close once the output is flushed.
    pub eof: bool,
    /// Already listed for a flush in this loop iteration.
    pub dirty: bool,
    /// A doorbell rang while the connection was paused: input may be
    /// waiting in the transport with no further wake-up to announce it.
    pub needs_fill: bool,
}

impl Conn {
    pub fn new(id: ConnId, identity: Identity, transport: Box<dyn Transport>) -> Self {
        Self {
            id,
            identity,
            transport,
            inbuf: Vec::new(),
            in_start: 0,
            out: VecDeque::new(),
            out_offset: 0,
            out_bytes: 0,
            out_events: 0,
            replies_queued: 0,
            interest: EventFlags::empty(),
            eof: false,
            dirty: false,
            needs_fill: false,
        }
    }

    /// Drops buffered input and queued output (a reset connection starts
    /// on a packet boundary with nothing in flight).
    pub fn clear(&mut self) {
        self.inbuf.clear();
        self.in_start = 0;
        self.out.clear();
        self.out_offset = 0;
        self.out_bytes = 0;
        self.out_events = 0;
        self.replies_queued = 0;
        self.needs_fill = false;
    }

    /// One read from the transport into the input buffer, through `scratch`.
    pub fn fill(&mut self, scratch: &mut [u8]) -> io::Result<Fill> {
        match self.transport.read(scratch) {
            Ok(0) => Ok(Fill::Eof),
            Ok(n) => {
                if self.in_start > 0 && self.in_start == self.inbuf.len() {
                    self.inbuf.clear();
                    self.in_start = 0;
                } else if self.in_start > 64 * 1024 {
                    self.inbuf.drain(..self.in_start);
                    self.in_start = 0;
                }
                self.inbuf.extend_from_slice(&scratch[..n]);
                Ok(Fill::Data)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Fill::Empty),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(Fill::Empty),
            Err(e) => Err(e),
        }
    }

    /// Bytes received but not yet consumed.
    pub fn buffered(&self) -> usize {
        self.inbuf.len() - self.in_start
    }

    /// The next complete request, if one is buffered: header and payload.
    pub fn next_frame(&self) -> Result<Option<(Header, &[u8])>, FrameError> {
        let buf = &self.inbuf[self.in_start..];
        Ok(decode_frame(buf)?.map(|(h, total)| (h, &buf[HEADER_LEN..total])))
    }

    /// Drops a request of `len` payload bytes from the input.
    pub fn consume(&mut self, payload_len: usize) {
        self.in_start += HEADER_LEN + payload_len;
        if self.in_start == self.inbuf.len() {
            self.inbuf.clear();
            self.in_start = 0;
        }
    }

    /// Whether a whole request is buffered.
    pub fn has_frame(&self) -> bool {
        matches!(self.next_frame(), Ok(Some(_)) | Err(_))
    }

    /// Queues an encoded message.
    pub fn enqueue(&mut self, bytes: Vec<u8>, is_event: bool, now: Instant) {
        self.out_bytes += bytes.len();
        if is_event {
            self.out_events += 1;
        } else {
            self.replies_queued += 1;
        }
        self.out.push_back(OutMsg {
            bytes,
            is_event,
            queued: now,
        });
    }

    /// Whether output is waiting.
    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// When the oldest queued watch event was queued.
    pub fn oldest_event(&self) -> Option<Instant> {
        self.out.iter().find(|m| m.is_event).map(|m| m.queued)
    }

    /// Writes as much queued output as the transport takes. Ok(true) when
    /// everything was written.
    pub fn flush(&mut self) -> io::Result<bool> {
        while !self.out.is_empty() {
            let mut slices: [IoSlice<'_>; WRITEV_BATCH] = [IoSlice::new(&[]); WRITEV_BATCH];
            let mut n = 0;
            for (i, m) in self.out.iter().take(WRITEV_BATCH).enumerate() {
                let start = if i == 0 { self.out_offset } else { 0 };
                slices[n] = IoSlice::new(&m.bytes[start..]);
                n += 1;
            }
            let mut written = match self.transport.write_vectored(&slices[..n]) {
                Ok(0) => return Ok(false),
                Ok(w) => w,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.out_bytes -= written;
            while written > 0 {
                let Some(front) = self.out.front() else { break };
                let left = front.bytes.len() - self.out_offset;
                if written >= left {
                    written -= left;
                    self.out_offset = 0;
                    if let Some(m) = self.out.pop_front() {
                        if m.is_event {
                            self.out_events -= 1;
                        } else {
                            self.replies_queued -= 1;
                        }
                    }
                } else {
                    self.out_offset += written;
                    written = 0;
                }
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

    /// A transport that takes at most 5 bytes per write and serves reads
    /// from a script.
    struct Trickle {
        fd: OwnedFd,
        written: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
        input: Vec<u8>,
    }

    impl Transport for Trickle {
        fn fd(&self) -> BorrowedFd<'_> {
            self.fd.as_fd()
        }
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.input.is_empty() {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = buf.len().min(self.input.len()).min(7);
            buf[..n].copy_from_slice(&self.input[..n]);
            self.input.drain(..n);
            Ok(n)
        }
        fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
            let all: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            let n = all.len().min(5);
            self.written.lock().unwrap().extend_from_slice(&all[..n]);
            Ok(n)
        }
        fn describe(&self) -> String {
            "trickle".into()
        }
    }

    fn conn(input: Vec<u8>) -> (Conn, std::sync::Arc<std::sync::Mutex<Vec<u8>>>) {
        let fd = rustix::io::dup(std::io::stdin()).unwrap();
        let written = std::sync::Arc::default();
        let t = Trickle {
            fd,
            written: std::sync::Arc::clone(&written),
            input,
        };
        (Conn::new(ConnId(1), Identity::DOM0, Box::new(t)), written)
    }

    #[test]
    fn partial_writes_keep_order_and_counts() {
        let (mut c, written) = conn(Vec::new());
        let now = Instant::now();
        c.enqueue(b"first-reply".to_vec(), false, now);
        c.enqueue(b"event".to_vec(), true, now);
        c.enqueue(b"second".to_vec(), false, now);
        assert_eq!((c.out_bytes, c.out_events, c.replies_queued), (22, 1, 2));
        assert!(c.oldest_event().is_some());
        assert!(c.flush().unwrap());
        assert!(!c.has_output());
        assert_eq!((c.out_bytes, c.out_events, c.replies_queued), (0, 0, 0));
        assert_eq!(
            written.lock().unwrap().as_slice(),
            b"first-replyeventsecond"
        );
    }

    #[test]
    fn frames_split_across_reads() {
        let mut input = Vec::new();
        crate::codec::encode_message(&mut input, 2, 1, 0, b"/a\0");
        crate::codec::encode_message(&mut input, 2, 2, 0, b"/bb\0");
        let (mut c, _) = conn(input);
        let mut scratch = [0u8; 64];
        let mut seen = Vec::new();
        while c.fill(&mut scratch).unwrap() == Fill::Data {
            while let Ok(Some((h, p))) = c.next_frame() {
                let len = p.len();
                seen.push((h.req_id, p.to_vec()));
                c.consume(len);
            }
        }
        assert_eq!(seen, [(1, b"/a\0".to_vec()), (2, b"/bb\0".to_vec())]);
        assert_eq!(c.buffered(), 0);
        assert!(!c.has_frame());
    }
}
