//! hvd's wire protocol: one request per `SOCK_SEQPACKET` datagram, one reply
//! datagram per request, in order. Integers are little-endian; strings are a
//! `u16` length and UTF-8 bytes. File descriptors travel as `SCM_RIGHTS` with
//! the replies that hand out memory and event channels.
//!
//! Requests come from untrusted guests: [`Request::decode`] validates every
//! field once, rejects trailing bytes and never panics.

use pvio_abi::event_channel::{EvtchnPort, EvtchnStat};
use pvio_abi::grant_table::{GntStatus, GrantRef};
use pvio_abi::DomId;

use crate::error::{ErrorCode, GrantFailure, HvError};

/// Largest datagram either side sends or accepts.
pub const MAX_MESSAGE: usize = 64 * 1024;
/// Longest domain name.
pub const MAX_NAME_LEN: usize = 64;
/// Most grant references in one map or unmap request.
pub const MAX_GRANTS_PER_OP: usize = 4096;

/// Why a message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Cursor over a received datagram.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Starts reading `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.buf.len());
        match end {
            Some(end) => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(DecodeError(format!(
                "message ends before {what} (offset {}, length {})",
                self.pos,
                self.buf.len()
            ))),
        }
    }

    /// Reads a byte.
    pub fn u8(&mut self, what: &str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }

    /// Reads a little-endian `u16`.
    pub fn u16(&mut self, what: &str) -> Result<u16, DecodeError> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    /// Reads a little-endian `i16`.
    pub fn i16(&mut self, what: &str) -> Result<i16, DecodeError> {
        Ok(self.u16(what)? as i16)
    }

    /// Reads a little-endian `u32`.
    pub fn u32(&mut self, what: &str) -> Result<u32, DecodeError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Reads a little-endian `u64`.
    pub fn u64(&mut self, what: &str) -> Result<u64, DecodeError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// Reads a string of at most `max` bytes.
    pub fn string(&mut self, max: usize, what: &str) -> Result<String, DecodeError> {
        let n = self.u16(what)? as usize;
        if n > max {
            return Err(DecodeError(format!(
                "{what} is {n} bytes, the limit is {max}"
            )));
        }
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| DecodeError(format!("{what} is not UTF-8")))
    }

    /// Reads a count that prefixes a list, bounded by `max` and by the bytes
    /// left (each element takes at least `min_elem` bytes).
    pub fn count(&mut self, max: usize, min_elem: usize, what: &str) -> Result<usize, DecodeError> {
        let n = self.u32(what)? as usize;
        let left = self.buf.len() - self.pos;
        if n > max || n.saturating_mul(min_elem) > left {
            return Err(DecodeError(format!(
                "{what}: count {n} is over the limit {max} or longer than the message"
            )));
        }
        Ok(n)
    }

    /// Fails if bytes are left over.
    pub fn finish(&self) -> Result<(), DecodeError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(DecodeError(format!(
                "{} unexpected trailing bytes",
                self.buf.len() - self.pos
            )))
        }
    }
}

/// Builder of an outgoing datagram.
#[derive(Default)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// An empty message.
    pub fn new() -> Self {
        Self::default()
    }
    /// Appends a byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    /// Appends a `u16`.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends an `i16`.
    pub fn i16(&mut self, v: i16) -> &mut Self {
        self.u16(v as u16)
    }
    /// Appends a `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a string (truncated to 65535 bytes at a char boundary).
    pub fn string(&mut self, s: &str) -> &mut Self {
        let mut n = s.len().min(u16::MAX as usize);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        self.u16(n as u16);
        self.buf.extend_from_slice(&s.as_bytes()[..n]);
        self
    }
    /// The finished bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// One grant to map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantMapItem {
    /// The reference in the granter's table.
    pub gref: GrantRef,
    /// Map for reading only (`GNTMAP_readonly`).
    pub readonly: bool,
}

/// A request to hvd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Become a process of domain 0 (privileged).
    RegisterHost,
    /// Create a fresh guest domain with `frames` pages and become it.
    RegisterGuest { name: String, frames: u32 },
    /// Create a guest domain for a process to claim later (privileged).
    CreateDomain { name: String, frames: u32 },
    /// Become a domain created with [`Request::CreateDomain`].
    ClaimDomain { domid: DomId, token: u64 },
    /// Destroy a domain (privileged).
    DestroyDomain { domid: DomId },
    /// List the domains.
    ListDomains,
    /// `EVTCHNOP_alloc_unbound`: a port of the caller's domain that
    /// `remote_dom` may bind to.
    EvtchnAllocUnbound { remote_dom: DomId },
    /// `EVTCHNOP_bind_interdomain`: connect a new local port to a remote
    /// unbound port.
    EvtchnBindInterdomain {
        remote_dom: DomId,
        remote_port: EvtchnPort,
    },
    /// `EVTCHNOP_close`.
    EvtchnClose { port: EvtchnPort },
    /// `EVTCHNOP_send` through hvd (processes normally signal the eventfd).
    EvtchnSend { port: EvtchnPort },
    /// `EVTCHNOP_status`.
    EvtchnStatus { dom: DomId, port: EvtchnPort },
    /// Every open port of a domain.
    EvtchnList { dom: DomId },
    /// Hand over a guest's memory (privileged).
    ForeignMemory { dom: DomId },
    /// `GNTTABOP_map_grant_ref` for a batch of refs of domain `dom`.
    GrantMap {
        dom: DomId,
        items: Vec<GrantMapItem>,
    },
    /// `GNTTABOP_unmap_grant_ref` for a batch of handles.
    GrantUnmap { handles: Vec<u32> },
    /// Counters and limits of hvd.
    Info,
}

mod op {
    pub const REGISTER_HOST: u32 = 1;
    pub const REGISTER_GUEST: u32 = 2;
    pub const CREATE_DOMAIN: u32 = 3;
    pub const CLAIM_DOMAIN: u32 = 4;
    pub const DESTROY_DOMAIN: u32 = 5;
    pub const LIST_DOMAINS: u32 = 6;
    pub const EVTCHN_ALLOC_UNBOUND: u32 = 10;
    pub const EVTCHN_BIND_INTERDOMAIN: u32 = 11;
    pub const EVTCHN_CLOSE: u32 = 12;
    pub const EVTCHN_SEND: u32 = 13;
    pub const EVTCHN_STATUS: u32 = 14;
    pub const EVTCHN_LIST: u32 = 15;
    pub const FOREIGN_MEMORY: u32 = 20;
    pub const GRANT_MAP: u32 = 21;
    pub const GRANT_UNMAP: u32 = 22;
    pub const INFO: u32 = 30;
}

impl Request {
    /// The request's name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Request::RegisterHost => "register-host",
            Request::RegisterGuest { .. } => "register-guest",
            Request::CreateDomain { .. } => "create-domain",
            Request::ClaimDomain { .. } => "claim-domain",
            Request::DestroyDomain { .. } => "destroy-domain",
            Request::ListDomains => "list-domains",
            Request::EvtchnAllocUnbound { .. } => "evtchn-alloc-unbound",
            Request::EvtchnBindInterdomain { .. } => "evtchn-bind-interdomain",
            Request::EvtchnClose { .. } => "evtchn-close",
            Request::EvtchnSend { .. } => "evtchn-send",
            Request::EvtchnStatus { .. } => "evtchn-status",
            Request::EvtchnList { .. } => "evtchn-list",
            Request::ForeignMemory { .. } => "foreign-memory",
            Request::GrantMap { .. } => "grant-map",
            Request::GrantUnmap { .. } => "grant-unmap",
            Request::Info => "info",
        }
    }

    /// Encodes the request as one datagram.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        match self {
            Request::RegisterHost => {
                w.u32(op::REGISTER_HOST);
            }
            Request::RegisterGuest { name, frames } => {
                w.u32(op::REGISTER_GUEST).string(name).u32(*frames);
            }
            Request::CreateDomain { name, frames } => {
                w.u32(op::CREATE_DOMAIN).string(name).u32(*frames);
            }
            Request::ClaimDomain { domid, token } => {
                w.u32(op::CLAIM_DOMAIN).u16(*domid).u64(*token);
            }
            Request::DestroyDomain { domid } => {
                w.u32(op::DESTROY_DOMAIN).u16(*domid);
            }
            Request::ListDomains => {
                w.u32(op::LIST_DOMAINS);
            }
            Request::EvtchnAllocUnbound { remote_dom } => {
                w.u32(op::EVTCHN_ALLOC_UNBOUND).u16(*remote_dom);
            }
            Request::EvtchnBindInterdomain {
                remote_dom,
                remote_port,
            } => {
                w.u32(op::EVTCHN_BIND_INTERDOMAIN)
                    .u16(*remote_dom)
                    .u32(*remote_port);
            }
            Request::EvtchnClose { port } => {
                w.u32(op::EVTCHN_CLOSE).u32(*port);
            }
            Request::EvtchnSend { port } => {
                w.u32(op::EVTCHN_SEND).u32(*port);
            }
            Request::EvtchnStatus { dom, port } => {
                w.u32(op::EVTCHN_STATUS).u16(*dom).u32(*port);
            }
            Request::EvtchnList { dom } => {
                w.u32(op::EVTCHN_LIST).u16(*dom);
            }
            Request::ForeignMemory { dom } => {
                w.u32(op::FOREIGN_MEMORY).u16(*dom);
            }
            Request::GrantMap { dom, items } => {
                w.u32(op::GRANT_MAP).u16(*dom).u32(items.len() as u32);
                for it in items {
                    w.u32(it.gref).u8(u8::from(it.readonly));
                }
            }
            Request::GrantUnmap { handles } => {
                w.u32(op::GRANT_UNMAP).u32(handles.len() as u32);
                for h in handles {
                    w.u32(*h);
                }
            }
            Request::Info => {
                w.u32(op::INFO);
            }
        }
        w.into_bytes()
    }

    /// Decodes and validates one request datagram.
    pub fn decode(buf: &[u8]) -> Result<Request, DecodeError> {
        if buf.len() > MAX_MESSAGE {
            return Err(DecodeError(format!(
                "message of {} bytes is too long",
                buf.len()
            )));
        }
        let mut r = Reader::new(buf);
        let opcode = r.u32("opcode")?;
        let req = match opcode {
            op::REGISTER_HOST => Request::RegisterHost,
            op::REGISTER_GUEST => Request::RegisterGuest {
                name: r.string(MAX_NAME_LEN, "name")?,
                frames: r.u32("frames")?,
            },
            op::CREATE_DOMAIN => Request::CreateDomain {
                name: r.string(MAX_NAME_LEN, "name")?,
                frames: r.u32("frames")?,
            },
            op::CLAIM_DOMAIN => Request::ClaimDomain {
                domid: r.u16("domid")?,
                token: r.u64("token")?,
            },
            op::DESTROY_DOMAIN => Request::DestroyDomain {
                domid: r.u16("domid")?,
            },
            op::LIST_DOMAINS => Request::ListDomains,
            op::EVTCHN_ALLOC_UNBOUND => Request::EvtchnAllocUnbound {
                remote_dom: r.u16("remote domid")?,
            },
            op::EVTCHN_BIND_INTERDOMAIN => Request::EvtchnBindInterdomain {
                remote_dom: r.u16("remote domid")?,
                remote_port: r.u32("remote port")?,
            },
            op::EVTCHN_CLOSE => Request::EvtchnClose {
                port: r.u32("port")?,
            },
            op::EVTCHN_SEND => Request::EvtchnSend {
                port: r.u32("port")?,
            },
            op::EVTCHN_STATUS => Request::EvtchnStatus {
                dom: r.u16("domid")?,
                port: r.u32("port")?,
            },
            op::EVTCHN_LIST => Request::EvtchnList {
                dom: r.u16("domid")?,
            },
            op::FOREIGN_MEMORY => Request::ForeignMemory {
                dom: r.u16("domid")?,
            },
            op::GRANT_MAP => {
                let dom = r.u16("domid")?;
                let n = r.count(MAX_GRANTS_PER_OP, 5, "grant count")?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    let gref = r.u32("grant ref")?;
                    let readonly = match r.u8("readonly flag")? {
                        0 => false,
                        1 => true,
                        v => return Err(DecodeError(format!("readonly flag {v} is not 0 or 1"))),
                    };
                    items.push(GrantMapItem { gref, readonly });
                }
                Request::GrantMap { dom, items }
            }
            op::GRANT_UNMAP => {
                let n = r.count(MAX_GRANTS_PER_OP, 4, "handle count")?;
                let mut handles = Vec::with_capacity(n);
                for _ in 0..n {
                    handles.push(r.u32("handle")?);
                }
                Request::GrantUnmap { handles }
            }
            op::INFO => Request::Info,
            other => return Err(DecodeError(format!("unknown request opcode {other}"))),
        };
        r.finish()?;
        Ok(req)
    }
}

/// Reply status word: success.
pub const REPLY_OK: u16 = 0;

/// Encodes an error reply.
pub fn encode_error(code: ErrorCode, message: &str) -> Vec<u8> {
    let mut w = Writer::new();
    w.u16(code as u16).string(message);
    w.into_bytes()
}

/// Splits a reply into its payload, or the error hvd sent.
pub fn reply_payload(buf: &[u8]) -> Result<Reader<'_>, HvError> {
    let mut r = Reader::new(buf);
    let status = r.u16("reply status").map_err(|e| HvError::Protocol(e.0))?;
    if status == REPLY_OK {
        return Ok(r);
    }
    let code = ErrorCode::from_u16(status)
        .ok_or_else(|| HvError::Protocol(format!("unknown error code {status}")))?;
    let message = r
        .string(u16::MAX as usize, "error message")
        .map_err(|e| HvError::Protocol(e.0))?;
    Err(HvError::Remote { code, message })
}

/// A domain as hvd describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainInfo {
    pub domid: DomId,
    pub name: String,
    /// Memory size in 4 KiB frames (0 for domain 0).
    pub frames: u32,
    /// Grant-table frames of this domain.
    pub grant_frames: u32,
    /// Whether a process currently is this domain.
    pub running: bool,
    /// Pid of that process (0 if none).
    pub pid: u32,
    /// Open event-channel ports.
    pub ports: u32,
    /// Grants of this domain mapped by others.
    pub grants_mapped: u32,
}

impl DomainInfo {
    /// Appends the encoding.
    pub fn write(&self, w: &mut Writer) {
        w.u16(self.domid)
            .string(&self.name)
            .u32(self.frames)
            .u32(self.grant_frames)
            .u8(u8::from(self.running))
            .u32(self.pid)
            .u32(self.ports)
            .u32(self.grants_mapped);
    }
    /// Decodes one.
    pub fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            domid: r.u16("domid")?,
            name: r.string(MAX_NAME_LEN, "name")?,
            frames: r.u32("frames")?,
            grant_frames: r.u32("grant frames")?,
            running: r.u8("running")? != 0,
            pid: r.u32("pid")?,
            ports: r.u32("ports")?,
            grants_mapped: r.u32("grants mapped")?,
        })
    }
}

/// The state of one event-channel port (`EVTCHNOP_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortStatus {
    pub port: EvtchnPort,
    pub state: EvtchnStat,
    /// The peer domain (unbound: the domain allowed to bind).
    pub remote_dom: DomId,
    /// The peer port (interdomain only).
    pub remote_port: EvtchnPort,
    /// Pid of the process that owns the port (0 if unknown).
    pub owner_pid: u32,
}

impl PortStatus {
    /// Appends the encoding.
    pub fn write(&self, w: &mut Writer) {
        w.u32(self.port)
            .u32(self.state as u32)
            .u16(self.remote_dom)
            .u32(self.remote_port)
            .u32(self.owner_pid);
    }
    /// Decodes one.
    pub fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let port = r.u32("port")?;
        let s = r.u32("state")?;
        Ok(Self {
            port,
            state: EvtchnStat::from_u32(s)
                .ok_or_else(|| DecodeError(format!("unknown port state {s}")))?,
            remote_dom: r.u16("remote domid")?,
            remote_port: r.u32("remote port")?,
            owner_pid: r.u32("owner pid")?,
        })
    }
}

/// The outcome of mapping one grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapResult {
    pub status: GntStatus,
    pub reason: GrantFailure,
    /// Handle for unmapping (valid when `status` is okay).
    pub handle: u32,
    /// The granted frame in the granter's memory (valid when okay).
    pub frame: u32,
}

impl MapResult {
    /// Appends the encoding.
    pub fn write(&self, w: &mut Writer) {
        w.i16(self.status as i16)
            .u8(self.reason as u8)
            .u32(self.handle)
            .u32(self.frame);
    }
    /// Decodes one.
    pub fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let s = r.i16("status")?;
        let reason = r.u8("reason")?;
        Ok(Self {
            status: GntStatus::from_i16(s)
                .ok_or_else(|| DecodeError(format!("unknown grant status {s}")))?,
            reason: GrantFailure::from_u8(reason)
                .ok_or_else(|| DecodeError(format!("unknown grant failure {reason}")))?,
            handle: r.u32("handle")?,
            frame: r.u32("frame")?,
        })
    }
}

/// hvd's counters and limits, for tools and leak tests.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HvdInfo {
    pub domains: u32,
    pub connections: u32,
    pub ports: u32,
    pub active_grants: u32,
    pub maptrack_entries: u32,
    pub max_grant_frames: u32,
    pub max_maptrack_entries: u32,
    pub max_ports: u32,
    pub evtchn_abi: String,
}

impl HvdInfo {
    /// Appends the encoding.
    pub fn write(&self, w: &mut Writer) {
        w.u32(self.domains)
            .u32(self.connections)
            .u32(self.ports)
            .u32(self.active_grants)
            .u32(self.maptrack_entries)
            .u32(self.max_grant_frames)
            .u32(self.max_maptrack_entries)
            .u32(self.max_ports)
            .string(&self.evtchn_abi);
    }
    /// Decodes one.
    pub fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            domains: r.u32("domains")?,
            connections: r.u32("connections")?,
            ports: r.u32("ports")?,
            active_grants: r.u32("active grants")?,
            maptrack_entries: r.u32("maptrack entries")?,
            max_grant_frames: r.u32("max grant frames")?,
            max_maptrack_entries: r.u32("max maptrack")?,
            max_ports: r.u32("max ports")?,
            evtchn_abi: r.string(16, "evtchn abi")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn samples() -> Vec<Request> {
        vec![
            Request::RegisterHost,
            Request::RegisterGuest {
                name: "vm1".into(),
                frames: 256,
            },
            Request::CreateDomain {
                name: "λ".into(),
                frames: 1,
            },
            Request::ClaimDomain {
                domid: 7,
                token: u64::MAX,
            },
            Request::DestroyDomain { domid: 7 },
            Request::ListDomains,
            Request::EvtchnAllocUnbound { remote_dom: 0 },
            Request::EvtchnBindInterdomain {
                remote_dom: 3,
                remote_port: 9,
            },
            Request::EvtchnClose { port: 1 },
            Request::EvtchnSend { port: 2 },
            Request::EvtchnStatus { dom: 1, port: 2 },
            Request::EvtchnList { dom: 5 },
            Request::ForeignMemory { dom: 5 },
            Request::GrantMap {
                dom: 5,
                items: vec![
                    GrantMapItem {
                        gref: 8,
                        readonly: true,
                    },
                    GrantMapItem {
                        gref: 9,
                        readonly: false,
                    },
                ],
            },
            Request::GrantUnmap {
                handles: vec![1, 2, 3],
            },
            Request::Info,
        ]
    }

    #[test]
    fn round_trip() {
        for r in samples() {
            assert_eq!(Request::decode(&r.encode()).unwrap(), r, "{}", r.name());
        }
    }

    #[test]
    fn rejects_bad_input() {
        assert!(Request::decode(&[]).is_err());
        assert!(Request::decode(&99u32.to_le_bytes()).is_err());
        let mut m = Request::Info.encode();
        m.push(0);
        assert!(Request::decode(&m).unwrap_err().0.contains("trailing"));
        // A count far beyond the message is refused before allocating.
        let mut w = Writer::new();
        w.u32(op::GRANT_UNMAP).u32(u32::MAX);
        assert!(Request::decode(&w.into_bytes()).is_err());
        let mut w = Writer::new();
        w.u32(op::REGISTER_GUEST).u16(200);
        assert!(Request::decode(&w.into_bytes())
            .unwrap_err()
            .0
            .contains("limit"));
        let mut w = Writer::new();
        w.u32(op::GRANT_MAP).u16(1).u32(1).u32(8).u8(2);
        assert!(Request::decode(&w.into_bytes()).is_err());
    }

    #[test]
    fn error_replies() {
        let e = encode_error(ErrorCode::BadPort, "port 5 is closed");
        match reply_payload(&e) {
            Err(HvError::Remote { code, message }) => {
                assert_eq!(code, ErrorCode::BadPort);
                assert_eq!(message, "port 5 is closed");
            }
            other => panic!("{other:?}"),
        }
        assert!(reply_payload(&[9, 9]).is_err());
        assert!(reply_payload(&[]).is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = Request::decode(&data);
            let _ = reply_payload(&data);
        }

        #[test]
        fn truncations_are_errors(idx in 0usize..16, cut in 0usize..64) {
            let r = &samples()[idx % 16];
            let bytes = r.encode();
            if cut < bytes.len() {
                prop_assert!(Request::decode(&bytes[..cut]).is_err());
            }
        }
    }
}
