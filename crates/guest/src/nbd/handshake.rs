//! Fixed newstyle negotiation (proto.md, "Handshake"): the greeting, the
//! client flags, then options until `NBD_OPT_EXPORT_NAME` or a successful
//! `NBD_OPT_GO` enters transmission, or `NBD_OPT_ABORT` ends the session.
//!
//! Served options: `EXPORT_NAME`, `GO`, `INFO` (with `NBD_INFO_EXPORT`,
//! `NBD_INFO_BLOCK_SIZE` always and `NBD_INFO_NAME` on request), `LIST`,
//! `ABORT`, `STRUCTURED_REPLY`, and, once structured replies are on,
//! `LIST_META_CONTEXT` and `SET_META_CONTEXT` with the one context
//! `base:allocation` (when the device can say what is allocated). Every
//! other option is answered `NBD_REP_ERR_UNSUP`.
//!
//! A server that is busy with another client runs the same negotiation in
//! refusing mode: every option that would reveal or select the export gets
//! `NBD_REP_ERR_POLICY` with a message, so the client reports why.

use std::io::{Read, Write};

use super::defs::*;
use super::error::NbdError;
use super::wire::{be16, be32, be64, option_reply, read_message};

/// The export as negotiated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Export {
    /// Its name; the empty name (the default export) also selects it.
    pub name: String,
    pub size: u64,
    /// Transmission flags.
    pub flags: u16,
    /// Minimum block size (alignment of offsets and lengths).
    pub min_block: u32,
    /// The device answers block status: `base:allocation` is offered.
    pub block_status: bool,
}

/// What the client turned on during negotiation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Features {
    /// `NBD_OPT_STRUCTURED_REPLY` was accepted.
    pub structured: bool,
    /// `base:allocation` is the selected metadata context
    /// ([`META_BASE_ALLOCATION_ID`]).
    pub base_allocation: bool,
}

impl Export {
    fn matches(&self, name: &[u8]) -> bool {
        name.is_empty() || name == self.name.as_bytes()
    }
}

/// How negotiation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Transmission phase, with what was negotiated.
    Transmission(Features),
    /// The client aborted, or was refused; close the connection.
    Closed,
}

/// What the server does with this client.
#[derive(Debug, Clone, Copy)]
pub enum Mode<'a> {
    Serve(&'a Export),
    /// Refuse, with this message in the error replies.
    Refuse(&'a str),
}

/// Options a client may send before the session is ended as abusive.
const MAX_OPTIONS: u32 = 4096;

fn protocol(m: impl Into<String>) -> NbdError {
    NbdError::Protocol(m.into())
}

/// Runs the negotiation on `s`.
pub fn negotiate<S: Read + Write>(s: &mut S, mode: Mode<'_>) -> Result<Outcome, NbdError> {
    let mut greeting = [0u8; 18];
    greeting[..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    greeting[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    greeting[16..].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&greeting)?;
    let mut cf = [0u8; 4];
    if !read_message(s, &mut cf)? {
        return Ok(Outcome::Closed);
    }
    let client_flags = be32(&cf, 0);
    if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(protocol(format!("unknown client flags {client_flags:#x}")));
    }
    let no_zeroes = client_flags & FLAG_C_NO_ZEROES != 0;
    let mut features = Features::default();
    for _ in 0..MAX_OPTIONS {
        let mut h = [0u8; 16];
        if !read_message(s, &mut h)? {
            return Ok(Outcome::Closed);
        }
        if be64(&h, 0) != IHAVEOPT {
            return Err(protocol(format!("bad option magic {:#018x}", be64(&h, 0))));
        }
        let (opt, len) = (be32(&h, 8), be32(&h, 12));
        if len > MAX_OPTION_DATA {
            return Err(protocol(format!("option {opt} with {len} bytes of data")));
        }
        let mut data = vec![0u8; len as usize];
        if !data.is_empty() && !read_message(s, &mut data)? {
            return Err(protocol("the client left inside an option"));
        }
        match handle_option(s, mode, opt, &data, no_zeroes, &mut features)? {
            Some(outcome) => return Ok(outcome),
            None => continue,
        }
    }
    Err(protocol(format!("more than {MAX_OPTIONS} options")))
}

/// Answers one option; `Some` when negotiation is over.
fn handle_option<S: Write>(
    s: &mut S,
    mode: Mode<'_>,
    opt: u32,
    data: &[u8],
    no_zeroes: bool,
    features: &mut Features,
) -> Result<Option<Outcome>, NbdError> {
    let err = |s: &mut S, rep: u32, msg: &str| -> Result<Option<Outcome>, NbdError> {
        option_reply(s, opt, rep, msg.as_bytes())?;
        Ok(None)
    };
    match (opt, mode) {
        (OPT_ABORT, _) => {
            // The client may already be gone: an error here changes nothing.
            let _ = option_reply(s, opt, REP_ACK, &[]);
            Ok(Some(Outcome::Closed))
        }
        (OPT_EXPORT_NAME, Mode::Refuse(_)) => Ok(Some(Outcome::Closed)),
        (OPT_EXPORT_NAME, Mode::Serve(e)) => {
            if !e.matches(data) {
                // NBD_OPT_EXPORT_NAME cannot carry an error: hard disconnect.
                return Err(protocol(format!(
                    "unknown export {:?}",
                    String::from_utf8_lossy(data)
                )));
            }
            let mut m = Vec::with_capacity(10 + 124);
            m.extend_from_slice(&e.size.to_be_bytes());
            m.extend_from_slice(&e.flags.to_be_bytes());
            if !no_zeroes {
                m.extend_from_slice(&[0u8; 124]);
            }
            s.write_all(&m)?;
            Ok(Some(Outcome::Transmission(*features)))
        }
        (OPT_LIST, _) if !data.is_empty() => err(s, REP_ERR_INVALID, "NBD_OPT_LIST takes no data"),
        (OPT_LIST, Mode::Refuse(why)) => err(s, REP_ERR_POLICY, why),
        (OPT_LIST, Mode::Serve(e)) => {
            let mut d = Vec::with_capacity(4 + e.name.len());
            d.extend_from_slice(&(e.name.len() as u32).to_be_bytes());
            d.extend_from_slice(e.name.as_bytes());
            option_reply(s, opt, REP_SERVER, &d)?;
            option_reply(s, opt, REP_ACK, &[])?;
            Ok(None)
        }
        (OPT_INFO | OPT_GO, _) => {
            let Some((name, requests)) = parse_info_request(data) else {
                return err(s, REP_ERR_INVALID, "malformed NBD_OPT_INFO/NBD_OPT_GO data");
            };
            let e = match mode {
                Mode::Refuse(why) => return err(s, REP_ERR_POLICY, why),
                Mode::Serve(e) => e,
            };
            if !e.matches(name) {
                return err(s, REP_ERR_UNKNOWN, "no such export");
            }
            let mut info = Vec::with_capacity(12);
            info.extend_from_slice(&INFO_EXPORT.to_be_bytes());
            info.extend_from_slice(&e.size.to_be_bytes());
            info.extend_from_slice(&e.flags.to_be_bytes());
            option_reply(s, opt, REP_INFO, &info)?;
            let mut bs = Vec::with_capacity(14);
            bs.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
            bs.extend_from_slice(&e.min_block.to_be_bytes());
            bs.extend_from_slice(&PREFERRED_BLOCK.max(e.min_block).to_be_bytes());
            bs.extend_from_slice(&MAX_PAYLOAD.to_be_bytes());
            option_reply(s, opt, REP_INFO, &bs)?;
            if requests.contains(&INFO_NAME) {
                let mut n = INFO_NAME.to_be_bytes().to_vec();
                n.extend_from_slice(e.name.as_bytes());
                option_reply(s, opt, REP_INFO, &n)?;
            }
            option_reply(s, opt, REP_ACK, &[])?;
            Ok((opt == OPT_GO).then_some(Outcome::Transmission(*features)))
        }
        (OPT_STRUCTURED_REPLY, _) if !data.is_empty() => {
            err(s, REP_ERR_INVALID, "NBD_OPT_STRUCTURED_REPLY takes no data")
        }
        (OPT_STRUCTURED_REPLY, _) => {
            features.structured = true;
            option_reply(s, opt, REP_ACK, &[])?;
            Ok(None)
        }
        (OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT, _) if !features.structured => err(
            s,
            REP_ERR_INVALID,
            "metadata contexts need structured replies first",
        ),
        (OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT, Mode::Refuse(why)) => {
            err(s, REP_ERR_POLICY, why)
        }
        (OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT, Mode::Serve(e)) => {
            let Some((name, queries)) = parse_meta_request(data) else {
                return err(s, REP_ERR_INVALID, "malformed metadata context request");
            };
            if !e.matches(name) {
                return err(s, REP_ERR_UNKNOWN, "no such export");
            }
            let set = opt == OPT_SET_META_CONTEXT;
            // LIST with no query lists everything; "base:" lists the
            // namespace. SET selects exactly what its queries name.
            let wanted = e.block_status
                && if set {
                    queries.contains(&META_BASE_ALLOCATION.as_bytes())
                } else {
                    queries.is_empty()
                        || queries
                            .iter()
                            .any(|q| *q == b"base:" || *q == META_BASE_ALLOCATION.as_bytes())
                };
            if set {
                features.base_allocation = wanted;
            }
            if wanted {
                let id = if set { META_BASE_ALLOCATION_ID } else { 0 };
                let mut d = id.to_be_bytes().to_vec();
                d.extend_from_slice(META_BASE_ALLOCATION.as_bytes());
                option_reply(s, opt, REP_META_CONTEXT, &d)?;
            }
            option_reply(s, opt, REP_ACK, &[])?;
            Ok(None)
        }
        (OPT_STARTTLS, _) => err(s, REP_ERR_UNSUP, "TLS is not supported"),
        _ => err(s, REP_ERR_UNSUP, "unsupported option"),
    }
}

/// Parses `NBD_OPT_LIST_META_CONTEXT`/`NBD_OPT_SET_META_CONTEXT` data:
/// export name length, name, number of queries, each query's length and
/// bytes; `None` if the lengths disagree.
fn parse_meta_request(data: &[u8]) -> Option<(&[u8], Vec<&[u8]>)> {
    let take = |at: usize, n: usize| data.get(at..at.checked_add(n)?);
    let name_len = be32(take(0, 4)?, 0) as usize;
    let name = take(4, name_len)?;
    let mut at = 4 + name_len;
    let count = be32(take(at, 4)?, 0) as usize;
    at += 4;
    // Every query takes at least its 4-byte length.
    if count > (data.len() - at) / 4 {
        return None;
    }
    let mut queries = Vec::with_capacity(count);
    for _ in 0..count {
        let len = be32(take(at, 4)?, 0) as usize;
        queries.push(take(at + 4, len)?);
        at += 4 + len;
    }
    (at == data.len()).then_some((name, queries))
}

/// Parses `NBD_OPT_INFO`/`NBD_OPT_GO` data: name length, name, count of
/// information requests, the requests; `None` if the lengths disagree.
fn parse_info_request(data: &[u8]) -> Option<(&[u8], Vec<u16>)> {
    if data.len() < 6 {
        return None;
    }
    let name_len = be32(data, 0) as usize;
    if name_len > data.len() - 6 {
        return None;
    }
    let name = &data[4..4 + name_len];
    let at = 4 + name_len;
    let n = be16(data, at) as usize;
    if data.len() != at + 2 + 2 * n {
        return None;
    }
    let requests = (0..n).map(|i| be16(data, at + 2 + 2 * i)).collect();
    Some((name, requests))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// A scripted client: what it sends, and what the server wrote.
    struct Script {
        input: Cursor<Vec<u8>>,
        output: Vec<u8>,
    }

    impl Read for Script {
        fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
            self.input.read(b)
        }
    }

    impl Write for Script {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.output.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn option(opt: u32, data: &[u8]) -> Vec<u8> {
        let mut v = IHAVEOPT.to_be_bytes().to_vec();
        v.extend_from_slice(&opt.to_be_bytes());
        v.extend_from_slice(&(data.len() as u32).to_be_bytes());
        v.extend_from_slice(data);
        v
    }

    fn export() -> Export {
        Export {
            name: "disk".into(),
            size: 1 << 20,
            flags: FLAG_HAS_FLAGS | FLAG_SEND_FLUSH,
            min_block: 512,
            block_status: true,
        }
    }

    fn run(client: Vec<u8>, mode: Mode<'_>) -> (Result<Outcome, NbdError>, Vec<u8>) {
        let mut s = Script {
            input: Cursor::new(client),
            output: Vec::new(),
        };
        let r = negotiate(&mut s, mode);
        (r, s.output)
    }

    /// Splits option replies after the 18-byte greeting: (option, type, data).
    fn replies(out: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
        let mut v = Vec::new();
        let mut at = 18;
        while at + 20 <= out.len() && be64(out, at) == OPTION_REPLY_MAGIC {
            let len = be32(out, at + 16) as usize;
            v.push((
                be32(out, at + 8),
                be32(out, at + 12),
                out[at + 20..at + 20 + len].to_vec(),
            ));
            at += 20 + len;
        }
        v
    }

    #[test]
    fn go_with_block_size_enters_transmission() {
        let mut c = 3u32.to_be_bytes().to_vec();
        c.extend(option(OPT_STRUCTURED_REPLY, &[]));
        let mut go = 4u32.to_be_bytes().to_vec();
        go.extend_from_slice(b"disk");
        go.extend_from_slice(&1u16.to_be_bytes());
        go.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        c.extend(option(OPT_GO, &go));
        let (r, out) = run(c, Mode::Serve(&export()));
        assert_eq!(
            r.unwrap(),
            Outcome::Transmission(Features {
                structured: true,
                base_allocation: false
            })
        );
        assert_eq!(be64(&out, 0), NBDMAGIC);
        assert_eq!(be16(&out, 16), FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        let r = replies(&out);
        assert_eq!(r[0].1, REP_ACK);
        assert_eq!(
            (r[1].0, r[1].1, be16(&r[1].2, 0)),
            (OPT_GO, REP_INFO, INFO_EXPORT)
        );
        assert_eq!(
            (be64(&r[1].2, 2), be16(&r[1].2, 10)),
            (1 << 20, export().flags)
        );
        assert_eq!(be16(&r[2].2, 0), INFO_BLOCK_SIZE);
        assert_eq!(
            (be32(&r[2].2, 2), be32(&r[2].2, 6), be32(&r[2].2, 10)),
            (512, 4096, MAX_PAYLOAD)
        );
        assert_eq!(r.last().unwrap().1, REP_ACK);
    }

    fn meta(name: &[u8], queries: &[&[u8]]) -> Vec<u8> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name);
        d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for q in queries {
            d.extend_from_slice(&(q.len() as u32).to_be_bytes());
            d.extend_from_slice(q);
        }
        d
    }

    #[test]
    fn base_allocation_is_listed_and_selected_after_structured_replies() {
        let mut c = 1u32.to_be_bytes().to_vec();
        // Too early: structured replies are not on yet.
        c.extend(option(
            OPT_SET_META_CONTEXT,
            &meta(b"disk", &[b"base:allocation"]),
        ));
        c.extend(option(OPT_STRUCTURED_REPLY, &[]));
        c.extend(option(OPT_LIST_META_CONTEXT, &meta(b"disk", &[])));
        c.extend(option(OPT_LIST_META_CONTEXT, &meta(b"", &[b"qemu:dirty"])));
        c.extend(option(
            OPT_SET_META_CONTEXT,
            &meta(b"other", &[b"base:allocation"]),
        ));
        let mut bad = meta(b"disk", &[b"base:allocation"]);
        bad.push(0);
        c.extend(option(OPT_SET_META_CONTEXT, &bad));
        let mut huge = meta(b"disk", &[]);
        huge[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
        c.extend(option(OPT_SET_META_CONTEXT, &huge));
        c.extend(option(
            OPT_SET_META_CONTEXT,
            &meta(b"disk", &[b"qemu:x", b"base:allocation"]),
        ));
        c.extend(option(OPT_EXPORT_NAME, b""));
        let (r, out) = run(c, Mode::Serve(&export()));
        assert_eq!(
            r.unwrap(),
            Outcome::Transmission(Features {
                structured: true,
                base_allocation: true
            })
        );
        let r = replies(&out);
        let kinds: Vec<u32> = r.iter().map(|x| x.1).collect();
        assert_eq!(
            kinds,
            [
                REP_ERR_INVALID,
                REP_ACK,
                REP_META_CONTEXT,
                REP_ACK,
                REP_ACK,
                REP_ERR_UNKNOWN,
                REP_ERR_INVALID,
                REP_ERR_INVALID,
                REP_META_CONTEXT,
                REP_ACK
            ]
        );
        assert_eq!(be32(&r[2].2, 0), 0, "LIST gives id 0");
        assert_eq!(&r[2].2[4..], b"base:allocation");
        assert_eq!(be32(&r[8].2, 0), META_BASE_ALLOCATION_ID);
        // A device that cannot say selects nothing.
        let mut c = 1u32.to_be_bytes().to_vec();
        c.extend(option(OPT_STRUCTURED_REPLY, &[]));
        c.extend(option(
            OPT_SET_META_CONTEXT,
            &meta(b"disk", &[b"base:allocation"]),
        ));
        c.extend(option(OPT_EXPORT_NAME, b""));
        let e = Export {
            block_status: false,
            ..export()
        };
        let (r, _) = run(c, Mode::Serve(&e));
        assert_eq!(
            r.unwrap(),
            Outcome::Transmission(Features {
                structured: true,
                base_allocation: false
            })
        );
    }

    #[test]
    fn export_name_sends_size_flags_and_zeroes_unless_asked_not_to() {
        for (flags, tail) in [(1u32, 124usize), (3, 0)] {
            let mut c = flags.to_be_bytes().to_vec();
            c.extend(option(OPT_EXPORT_NAME, b""));
            let (r, out) = run(c, Mode::Serve(&export()));
            assert_eq!(r.unwrap(), Outcome::Transmission(Features::default()));
            assert_eq!(out.len(), 18 + 10 + tail);
            assert_eq!(be64(&out, 18), 1 << 20);
        }
        let mut c = 1u32.to_be_bytes().to_vec();
        c.extend(option(OPT_EXPORT_NAME, b"other"));
        assert!(matches!(
            run(c, Mode::Serve(&export())).0,
            Err(NbdError::Protocol(_))
        ));
    }

    #[test]
    fn list_info_unknown_and_abort() {
        let mut c = 1u32.to_be_bytes().to_vec();
        c.extend(option(OPT_LIST, &[]));
        c.extend(option(OPT_LIST, b"x"));
        c.extend(option(99, b"whatever"));
        let mut info = 5u32.to_be_bytes().to_vec();
        info.extend_from_slice(b"nope!");
        info.extend_from_slice(&0u16.to_be_bytes());
        c.extend(option(OPT_INFO, &info));
        c.extend(option(OPT_INFO, &[0, 0, 0, 9, 0, 0]));
        c.extend(option(OPT_ABORT, &[]));
        let (r, out) = run(c, Mode::Serve(&export()));
        assert_eq!(r.unwrap(), Outcome::Closed);
        let types: Vec<u32> = replies(&out).iter().map(|r| r.1).collect();
        assert_eq!(
            types,
            [
                REP_SERVER,
                REP_ACK,
                REP_ERR_INVALID,
                REP_ERR_UNSUP,
                REP_ERR_UNKNOWN,
                REP_ERR_INVALID,
                REP_ACK
            ]
        );
        assert_eq!(&replies(&out)[0].2[4..], b"disk");
    }

    #[test]
    fn refusing_mode_explains_and_never_enters_transmission() {
        let mut c = 1u32.to_be_bytes().to_vec();
        c.extend(option(OPT_GO, &[0, 0, 0, 0, 0, 0]));
        c.extend(option(OPT_EXPORT_NAME, b""));
        let (r, out) = run(c, Mode::Refuse("busy"));
        assert_eq!(r.unwrap(), Outcome::Closed);
        let r = replies(&out);
        assert_eq!((r[0].1, r[0].2.as_slice()), (REP_ERR_POLICY, &b"busy"[..]));
    }

    #[test]
    fn garbage_ends_the_negotiation() {
        let bad_flags = 8u32.to_be_bytes().to_vec();
        assert!(matches!(
            run(bad_flags, Mode::Serve(&export())).0,
            Err(NbdError::Protocol(_))
        ));
        let mut bad_magic = 1u32.to_be_bytes().to_vec();
        bad_magic.extend_from_slice(&[0xde; 16]);
        assert!(matches!(
            run(bad_magic, Mode::Serve(&export())).0,
            Err(NbdError::Protocol(_))
        ));
        let mut huge = 1u32.to_be_bytes().to_vec();
        huge.extend_from_slice(&IHAVEOPT.to_be_bytes());
        huge.extend_from_slice(&OPT_LIST.to_be_bytes());
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            run(huge, Mode::Serve(&export())).0,
            Err(NbdError::Protocol(_))
        ));
        let mut cut = 1u32.to_be_bytes().to_vec();
        cut.extend(option(OPT_LIST, b"abc"));
        cut.truncate(cut.len() - 2);
        assert!(run(cut, Mode::Serve(&export())).0.is_err());
        assert_eq!(
            run(Vec::new(), Mode::Serve(&export())).0.unwrap(),
            Outcome::Closed
        );
    }
}
