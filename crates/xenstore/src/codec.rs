//! The xenstore wire protocol of `io/xs_wire.h`: framing of the byte stream
//! into `struct xsd_sockmsg` messages, parsing a request payload once into a
//! typed, validated [`Request`], and encoding replies, errors and watch events.
//!
//! [`parse_request`] is a pure function of the header type, the payload and
//! the caller's identity, so that a fuzzer can call it directly.

use crate::error::XsError;
use crate::path;
use crate::perms::Perms;
use pvio_abi::xs_wire::{XsdSockmsgType, XENSTORE_PAYLOAD_MAX, XENSTORE_REL_PATH_MAX};
use pvio_abi::DomId;

pub use pvio_abi::xs_wire::XsdSockmsgType as MsgType;

/// Size of the message header.
pub const HEADER_LEN: usize = 16;

/// A decoded `struct xsd_sockmsg` (host byte order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub ty: u32,
    pub req_id: u32,
    pub tx_id: u32,
    pub len: u32,
}

impl Header {
    /// Decodes the first 16 bytes of `b`; `None` if there are fewer.
    pub fn decode(b: &[u8]) -> Option<Self> {
        let w = |i: usize| -> Option<u32> {
            Some(u32::from_ne_bytes(b.get(i..i + 4)?.try_into().ok()?))
        };
        Some(Self {
            ty: w(0)?,
            req_id: w(4)?,
            tx_id: w(8)?,
            len: w(12)?,
        })
    }

    /// Appends the 16 header bytes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        for v in [self.ty, self.req_id, self.tx_id, self.len] {
            out.extend_from_slice(&v.to_ne_bytes());
        }
    }
}

/// A framing violation: the connection cannot be resynchronised and is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("payload length {0} exceeds XENSTORE_PAYLOAD_MAX")]
    PayloadTooLong(u32),
}

/// Looks for one complete message at the start of `buf`. Returns its header
/// and total length (header + payload), `None` if more bytes are needed, or
/// an error as soon as the header announces an oversized payload.
pub fn decode_frame(buf: &[u8]) -> Result<Option<(Header, usize)>, FrameError> {
    let Some(h) = Header::decode(buf) else {
        return Ok(None);
    };
    if h.len as usize > XENSTORE_PAYLOAD_MAX {
        return Err(FrameError::PayloadTooLong(h.len));
    }
    let total = HEADER_LEN + h.len as usize;
    Ok((buf.len() >= total).then_some((h, total)))
}

/// Appends one message. The payload must not exceed `XENSTORE_PAYLOAD_MAX`
/// (replies are checked by the caller, which answers E2BIG instead).
pub fn encode_message(out: &mut Vec<u8>, ty: u32, req_id: u32, tx_id: u32, payload: &[u8]) {
    debug_assert!(payload.len() <= XENSTORE_PAYLOAD_MAX);
    Header {
        ty,
        req_id,
        tx_id,
        len: payload.len() as u32,
    }
    .encode(out);
    out.extend_from_slice(payload);
}

/// Appends an XS_ERROR reply carrying the error's name.
pub fn encode_error(out: &mut Vec<u8>, req_id: u32, tx_id: u32, e: XsError) {
    let name = e.name().as_bytes();
    Header {
        ty: MsgType::Error as u32,
        req_id,
        tx_id,
        len: name.len() as u32 + 1,
    }
    .encode(out);
    out.extend_from_slice(name);
    out.push(0);
}

/// Appends an XS_WATCH_EVENT (`path\0token\0`, req_id = tx_id = 0). Returns
/// false, appending nothing, if it would exceed the payload limit.
pub fn encode_watch_event(out: &mut Vec<u8>, path: &str, token: &[u8]) -> bool {
    let len = path.len() + 1 + token.len() + 1;
    if len > XENSTORE_PAYLOAD_MAX {
        return false;
    }
    Header {
        ty: MsgType::WatchEvent as u32,
        req_id: 0,
        tx_id: 0,
        len: len as u32,
    }
    .encode(out);
    out.extend_from_slice(path.as_bytes());
    out.push(0);
    out.extend_from_slice(token);
    out.push(0);
    true
}

/// What the parser needs to know about the sender.
#[derive(Clone, Copy, Debug)]
pub struct ParseCtx {
    /// The sender's domain: relative paths resolve under `/local/domain/<domid>`.
    pub domid: DomId,
    /// The `path-max` quota (at most `XENSTORE_REL_PATH_MAX`).
    pub path_max: usize,
}

impl ParseCtx {
    /// Dom0's context with the default path limit.
    pub const DOM0: ParseCtx = ParseCtx {
        domid: 0,
        path_max: XENSTORE_REL_PATH_MAX,
    };
}

/// The path of a watch: a node path or a special `@...` name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum WatchPath {
    /// An absolute node path; `relative` if the client sent it relative, in
    /// which case events report paths relative to the domain's home.
    Node { path: String, relative: bool },
    /// `@introduceDomain`, `@releaseDomain` or another `@` name.
    Special(String),
}

/// Target of XS_SET_PERMS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PermTarget {
    Node(String),
    /// `@introduceDomain` or `@releaseDomain`.
    Special(String),
}

/// A validated request. Paths are absolute and valid; numbers are parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Control {
        cmd: String,
        args: Vec<String>,
    },
    Directory(String),
    DirectoryPart {
        path: String,
        offset: u32,
    },
    Read(String),
    GetPerms(String),
    Watch {
        path: WatchPath,
        token: Vec<u8>,
    },
    /// The path is canonicalised but not validated: it only has to match.
    Unwatch {
        path: String,
        token: Vec<u8>,
    },
    TransactionStart,
    TransactionEnd {
        commit: bool,
    },
    Introduce {
        domid: DomId,
        mfn: u64,
        port: u32,
    },
    Release(DomId),
    GetDomainPath(DomId),
    Write {
        path: String,
        value: Vec<u8>,
    },
    Mkdir(String),
    Rm(String),
    SetPerms {
        target: PermTarget,
        perms: Perms,
    },
    IsDomainIntroduced(DomId),
    Resume(DomId),
    SetTarget {
        domid: DomId,
        target: DomId,
    },
    ResetWatches,
}

impl Request {
    /// The message type of this request (and of its reply).
    pub fn msg_type(&self) -> MsgType {
        match self {
            Request::Control { .. } => MsgType::Control,
            Request::Directory(_) => MsgType::Directory,
            Request::DirectoryPart { .. } => MsgType::DirectoryPart,
            Request::Read(_) => MsgType::Read,
            Request::GetPerms(_) => MsgType::GetPerms,
            Request::Watch { .. } => MsgType::Watch,
            Request::Unwatch { .. } => MsgType::Unwatch,
            Request::TransactionStart => MsgType::TransactionStart,
            Request::TransactionEnd { .. } => MsgType::TransactionEnd,
            Request::Introduce { .. } => MsgType::Introduce,
            Request::Release(_) => MsgType::Release,
            Request::GetDomainPath(_) => MsgType::GetDomainPath,
            Request::Write { .. } => MsgType::Write,
            Request::Mkdir(_) => MsgType::Mkdir,
            Request::Rm(_) => MsgType::Rm,
            Request::SetPerms { .. } => MsgType::SetPerms,
            Request::IsDomainIntroduced(_) => MsgType::IsDomainIntroduced,
            Request::Resume(_) => MsgType::Resume,
            Request::SetTarget { .. } => MsgType::SetTarget,
            Request::ResetWatches => MsgType::ResetWatches,
        }
    }
}

/// Whether only privileged connections may send this type (`XS_FLAG_PRIV`).
pub fn is_privileged_type(t: MsgType) -> bool {
    matches!(
        t,
        MsgType::Control
            | MsgType::Introduce
            | MsgType::Release
            | MsgType::IsDomainIntroduced
            | MsgType::Resume
            | MsgType::SetTarget
    )
}

/// Whether the header's transaction id is ignored for this type (`XS_FLAG_NOTID`).
pub fn ignores_tx_id(t: MsgType) -> bool {
    matches!(t, MsgType::Watch | MsgType::Unwatch)
}

/// The request type of a header, or ENOSYS for unknown, removed and
/// reply-only types (as C xenstored answers them).
pub fn request_type(ty: u32) -> Result<MsgType, XsError> {
    match XsdSockmsgType::from_u32(ty) {
        None | Some(MsgType::WatchEvent) | Some(MsgType::Error) => Err(XsError::Enosys),
        Some(t) => Ok(t),
    }
}

/// Parses and validates one request. Never panics, whatever the bytes.
pub fn parse_request(ty: u32, payload: &[u8], ctx: &ParseCtx) -> Result<Request, XsError> {
    parse_payload(request_type(ty)?, payload, ctx)
}

/// The NUL-terminated strings at the start of a payload (`get_strings()`):
/// bytes after the last NUL are ignored.
fn strings(payload: &[u8]) -> impl Iterator<Item = &[u8]> {
    let end = payload.iter().rposition(|b| *b == 0).map_or(0, |i| i + 1);
    payload[..end]
        .split(|b| *b == 0)
        .take(payload[..end].iter().filter(|b| **b == 0).count())
}

/// `onearg()`: exactly one NUL, at the end.
fn onearg(payload: &[u8]) -> Result<&[u8], XsError> {
    match payload.iter().position(|b| *b == 0) {
        Some(i) if i + 1 == payload.len() => Ok(&payload[..i]),
        _ => Err(XsError::Einval),
    }
}

fn utf8(b: &[u8]) -> Result<&str, XsError> {
    std::str::from_utf8(b).map_err(|_| XsError::Einval)
}

fn node_path(raw: &[u8], ctx: &ParseCtx) -> Result<String, XsError> {
    let p = path::canonicalize(ctx.domid, utf8(raw)?);
    if path::is_valid_nodename(&p, ctx.path_max) {
        Ok(p.into_owned())
    } else {
        Err(XsError::Einval)
    }
}

/// A decimal number of at most `max_digits` digits, nothing else.
fn decimal(raw: &[u8], max_digits: usize) -> Result<u64, XsError> {
    if raw.is_empty() || raw.len() > max_digits || !raw.iter().all(u8::is_ascii_digit) {
        return Err(XsError::Einval);
    }
    Ok(raw.iter().fold(0u64, |a, d| a * 10 + u64::from(d - b'0')))
}

fn domid(raw: &[u8]) -> Result<DomId, XsError> {
    DomId::try_from(decimal(raw, 5)?).map_err(|_| XsError::Einval)
}

fn nth<'a>(v: &[&'a [u8]], i: usize) -> Result<&'a [u8], XsError> {
    v.get(i).copied().ok_or(XsError::Einval)
}

/// Parses the payload of a request of type `t`.
pub fn parse_payload(t: MsgType, payload: &[u8], ctx: &ParseCtx) -> Result<Request, XsError> {
    let one_path = || node_path(onearg(payload)?, ctx);
    Ok(match t {
        MsgType::Read => Request::Read(one_path()?),
        MsgType::Directory => Request::Directory(one_path()?),
        MsgType::GetPerms => Request::GetPerms(one_path()?),
        MsgType::Mkdir => Request::Mkdir(one_path()?),
        MsgType::Rm => Request::Rm(one_path()?),
        MsgType::DirectoryPart => {
            if payload.iter().filter(|b| **b == 0).count() != 2 {
                return Err(XsError::Einval);
            }
            let v: Vec<&[u8]> = strings(payload).collect();
            let offset = u32::try_from(decimal(nth(&v, 1)?, 10)?).map_err(|_| XsError::Einval)?;
            Request::DirectoryPart {
                path: node_path(nth(&v, 0)?, ctx)?,
                offset,
            }
        }
        MsgType::Write => {
            let nul = payload
                .iter()
                .position(|b| *b == 0)
                .ok_or(XsError::Einval)?;
            Request::Write {
                path: node_path(&payload[..nul], ctx)?,
                value: payload[nul + 1..].to_vec(),
            }
        }
        MsgType::SetPerms => {
            let v: Vec<&[u8]> = strings(payload).collect();
            if v.len() < 2 {
                return Err(XsError::Einval);
            }
            let perms = Perms::parse(v[1..].iter().copied())?;
            let raw = utf8(v[0])?;
            let target = if raw.starts_with('@') {
                PermTarget::Special(raw.to_owned())
            } else {
                PermTarget::Node(node_path(v[0], ctx)?)
            };
            Request::SetPerms { target, perms }
        }
        MsgType::Watch | MsgType::Unwatch => {
            let v: Vec<&[u8]> = strings(payload).collect();
            if v.len() != 2 {
                return Err(XsError::Einval);
            }
            let raw = utf8(v[0])?;
            let token = v[1].to_vec();
            if t == MsgType::Unwatch {
                let path = path::canonicalize(ctx.domid, raw).into_owned();
                return Ok(Request::Unwatch { path, token });
            }
            let path = if raw.starts_with('@') {
                if raw.len() > XENSTORE_REL_PATH_MAX {
                    return Err(XsError::Einval);
                }
                WatchPath::Special(raw.to_owned())
            } else {
                WatchPath::Node {
                    relative: !raw.starts_with('/'),
                    path: node_path(v[0], ctx)?,
                }
            };
            Request::Watch { path, token }
        }
        MsgType::TransactionStart => Request::TransactionStart,
        MsgType::TransactionEnd => match onearg(payload)? {
            b"T" => Request::TransactionEnd { commit: true },
            b"F" => Request::TransactionEnd { commit: false },
            _ => return Err(XsError::Einval),
        },
        MsgType::Introduce => {
            let v: Vec<&[u8]> = strings(payload).collect();
            let port = u32::try_from(decimal(nth(&v, 2)?, 10)?).map_err(|_| XsError::Einval)?;
            if port == 0 {
                return Err(XsError::Einval);
            }
            Request::Introduce {
                domid: domid(nth(&v, 0)?)?,
                mfn: decimal(nth(&v, 1)?, 19)?,
                port,
            }
        }
        MsgType::Release | MsgType::Resume => {
            let d = domid(onearg(payload)?)?;
            if d == 0 {
                return Err(XsError::Einval);
            }
            if t == MsgType::Release {
                Request::Release(d)
            } else {
                Request::Resume(d)
            }
        }
        MsgType::GetDomainPath => Request::GetDomainPath(domid(onearg(payload)?)?),
        MsgType::IsDomainIntroduced => Request::IsDomainIntroduced(domid(onearg(payload)?)?),
        MsgType::SetTarget => {
            let v: Vec<&[u8]> = strings(payload).collect();
            Request::SetTarget {
                domid: domid(nth(&v, 0)?)?,
                target: domid(nth(&v, 1)?)?,
            }
        }
        MsgType::ResetWatches => Request::ResetWatches,
        MsgType::Control => {
            let v: Vec<&[u8]> = strings(payload).collect();
            let cmd = utf8(nth(&v, 0)?)?.to_owned();
            let args = v[1..]
                .iter()
                .map(|a| utf8(a).map(str::to_owned))
                .collect::<Result<Vec<_>, _>>()?;
            Request::Control { cmd, args }
        }
        MsgType::WatchEvent | MsgType::Error => return Err(XsError::Enosys),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(t: MsgType, payload: &[u8]) -> Result<Request, XsError> {
        parse_request(t as u32, payload, &ParseCtx::DOM0)
    }

    #[test]
    fn header_round_trip_and_framing() {
        let mut out = Vec::new();
        encode_message(&mut out, 2, 7, 9, b"abc");
        assert_eq!(out.len(), 19);
        let (h, total) = decode_frame(&out).unwrap().unwrap();
        assert_eq!(
            h,
            Header {
                ty: 2,
                req_id: 7,
                tx_id: 9,
                len: 3
            }
        );
        assert_eq!(total, 19);
        assert_eq!(decode_frame(&out[..18]), Ok(None));
        assert_eq!(decode_frame(&out[..3]), Ok(None));
        let mut big = Vec::new();
        Header {
            ty: 2,
            req_id: 0,
            tx_id: 0,
            len: 4097,
        }
        .encode(&mut big);
        assert_eq!(decode_frame(&big), Err(FrameError::PayloadTooLong(4097)));
        let mut err = Vec::new();
        encode_error(&mut err, 1, 2, XsError::Eagain);
        assert_eq!(&err[16..], b"EAGAIN\0");
        let mut ev = Vec::new();
        assert!(encode_watch_event(&mut ev, "/a", b"tok"));
        assert_eq!(&ev[16..], b"/a\0tok\0");
        assert!(!encode_watch_event(&mut ev, &"x".repeat(4096), b""));
    }

    #[test]
    fn parses_each_type() {
        assert_eq!(p(MsgType::Read, b"/a\0"), Ok(Request::Read("/a".into())));
        assert_eq!(
            p(MsgType::Read, b"x\0"),
            Ok(Request::Read("/local/domain/0/x".into()))
        );
        assert_eq!(p(MsgType::Read, b"/a"), Err(XsError::Einval));
        assert_eq!(p(MsgType::Read, b"/a\0\0"), Err(XsError::Einval));
        assert_eq!(p(MsgType::Read, b"/a/\0"), Err(XsError::Einval));
        assert_eq!(
            p(MsgType::Write, b"/a\0v\0w"),
            Ok(Request::Write {
                path: "/a".into(),
                value: b"v\0w".to_vec()
            })
        );
        assert_eq!(p(MsgType::Write, b"/a"), Err(XsError::Einval));
        assert_eq!(
            p(MsgType::DirectoryPart, b"/a\x0012\0"),
            Ok(Request::DirectoryPart {
                path: "/a".into(),
                offset: 12
            })
        );
        assert_eq!(p(MsgType::DirectoryPart, b"/a\0x\0"), Err(XsError::Einval));
        assert_eq!(
            p(MsgType::Watch, b"d\0tok\0"),
            Ok(Request::Watch {
                path: WatchPath::Node {
                    path: "/local/domain/0/d".into(),
                    relative: true
                },
                token: b"tok".to_vec()
            })
        );
        assert_eq!(
            p(MsgType::Watch, b"@releaseDomain\0t\0"),
            Ok(Request::Watch {
                path: WatchPath::Special("@releaseDomain".into()),
                token: b"t".to_vec()
            })
        );
        assert_eq!(p(MsgType::Watch, b"/a\0"), Err(XsError::Einval));
        assert_eq!(
            p(MsgType::TransactionEnd, b"T\0"),
            Ok(Request::TransactionEnd { commit: true })
        );
        assert_eq!(p(MsgType::TransactionEnd, b"X\0"), Err(XsError::Einval));
        assert_eq!(
            p(MsgType::Introduce, b"5\x00123\x007\0"),
            Ok(Request::Introduce {
                domid: 5,
                mfn: 123,
                port: 7
            })
        );
        assert_eq!(
            p(MsgType::Introduce, b"5\x00123\x000\0"),
            Err(XsError::Einval)
        );
        assert_eq!(
            p(MsgType::Introduce, b"70000\x001\x001\0"),
            Err(XsError::Einval)
        );
        assert_eq!(p(MsgType::Release, b"0\0"), Err(XsError::Einval));
        assert_eq!(p(MsgType::Release, b"3\0"), Ok(Request::Release(3)));
        assert_eq!(
            p(MsgType::GetDomainPath, b"3\0"),
            Ok(Request::GetDomainPath(3))
        );
        assert!(matches!(
            p(MsgType::SetPerms, b"/a\0r1\0n2\0"),
            Ok(Request::SetPerms {
                target: PermTarget::Node(_),
                ..
            })
        ));
        assert_eq!(p(MsgType::SetPerms, b"/a\0"), Err(XsError::Einval));
        assert_eq!(p(MsgType::SetPerms, b"/a\0q1\0"), Err(XsError::Einval));
        assert_eq!(
            p(MsgType::Control, b"quota\0"),
            Ok(Request::Control {
                cmd: "quota".into(),
                args: vec![]
            })
        );
        assert_eq!(p(MsgType::Control, b""), Err(XsError::Einval));
        assert_eq!(
            parse_request(20, b"", &ParseCtx::DOM0),
            Err(XsError::Enosys)
        );
        assert_eq!(
            parse_request(15, b"", &ParseCtx::DOM0),
            Err(XsError::Enosys)
        );
        assert_eq!(
            parse_request(999, b"", &ParseCtx::DOM0),
            Err(XsError::Enosys)
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Arbitrary bytes into the framer and parser never panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200),
                                       ty in 0u32..30, domid in any::<u16>(), path_max in 0usize..3000) {
            let ctx = ParseCtx { domid, path_max };
            let _ = decode_frame(&bytes);
            let _ = parse_request(ty, &bytes, &ctx);
        }

        /// Structured near-valid payloads never panic either and, when
        /// accepted, yield only valid absolute paths.
        #[test]
        fn structured_payloads(parts in proptest::collection::vec("[a-z/@0-9.]{0,12}", 0..5),
                               ty in 0u32..24) {
            let mut payload = Vec::new();
            for s in &parts { payload.extend_from_slice(s.as_bytes()); payload.push(0); }
            if let Ok(Request::Read(p) | Request::Write { path: p, .. } | Request::Rm(p)) =
                parse_request(ty, &payload, &ParseCtx::DOM0)
            {
                prop_assert!(path::is_valid_nodename(&p, XENSTORE_REL_PATH_MAX));
            }
        }
    }
}
