//! Every byte a xenstore client sends, on the dom0 socket or a guest's
//! xenbus ring, goes through the frame decoder and then the request parser.
//! The first two bytes choose the sender (its domid and `path-max` quota);
//! the rest is the byte stream, framed until it runs out.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pvio_xenstore::codec::{
    decode_frame, parse_request, ParseCtx, PermTarget, Request, WatchPath, HEADER_LEN,
};
use pvio_xenstore::path::is_valid_nodename;

fn valid(p: &str, ctx: &ParseCtx) {
    assert!(is_valid_nodename(p, ctx.path_max), "parser let {p:?} through");
}

fuzz_target!(|data: &[u8]| {
    let (who, mut stream) = data.split_at(data.len().min(2));
    let ctx = ParseCtx {
        domid: u16::from(who.first().copied().unwrap_or(0)),
        path_max: 1 + usize::from(who.get(1).copied().unwrap_or(255)) * 8,
    };
    loop {
        let (hdr, total) = match decode_frame(stream) {
            Ok(Some(f)) => f,
            Ok(None) | Err(_) => break,
        };
        assert_eq!(total, HEADER_LEN + hdr.len as usize);
        assert!(total <= stream.len() && hdr.len <= 4096);
        let Ok(req) = parse_request(hdr.ty, &stream[HEADER_LEN..total], &ctx) else {
            stream = &stream[total..];
            continue;
        };
        assert_eq!(req.msg_type() as u32, hdr.ty);
        match &req {
            Request::Read(p)
            | Request::Directory(p)
            | Request::GetPerms(p)
            | Request::Mkdir(p)
            | Request::Rm(p)
            | Request::DirectoryPart { path: p, .. }
            | Request::Write { path: p, .. }
            | Request::Watch {
                path: WatchPath::Node { path: p, .. },
                ..
            }
            | Request::SetPerms {
                target: PermTarget::Node(p),
                ..
            } => valid(p, &ctx),
            Request::SetPerms { perms, .. } => assert!(!perms.entries().is_empty()),
            Request::Introduce { port, .. } => assert!(*port != 0),
            _ => {}
        }
        stream = &stream[total..];
    }
});
