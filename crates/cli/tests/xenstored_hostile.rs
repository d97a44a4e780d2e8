//! Hostile clients: malformed headers, oversized lengths, unknown types, bad
//! transaction ids, over-long and invalid paths, random garbage, request
//! floods and clients that never read their watch events. Each gets an error
//! reply or a clean disconnect of its own connection; the daemon stays up
//! and other clients keep being served.

mod xenstored_common;
use pvio_xenstore::codec::Header;
use std::io::{ErrorKind, Write};
use xenstored_common::{wait_until, Xenstored, DEADLINE};

fn err(r: (u32, Vec<u8>)) -> String {
    assert_eq!(
        r.0, 16,
        "expected an error reply, got type {} {:?}",
        r.0, r.1
    );
    String::from_utf8_lossy(r.1.strip_suffix(b"\0").unwrap()).into_owned()
}

/// A bystander still gets answers.
fn served(d: &Xenstored) {
    let mut b = d.raw();
    assert_eq!(b.call(2, 0, b"/tool\0"), (2, vec![]));
}

#[test]
fn bad_requests_get_xen_error_names() {
    let mut d = Xenstored::start("badreq");
    let mut c = d.raw();
    assert_eq!(err(c.call(99, 0, b"")), "ENOSYS");
    assert_eq!(err(c.call(20, 0, b"")), "ENOSYS", "removed XS_RESTRICT");
    assert_eq!(
        err(c.call(15, 0, b"/x\0t\0")),
        "ENOSYS",
        "WATCH_EVENT is not a request"
    );
    assert_eq!(err(c.call(0xffff, 0, b"")), "ENOSYS");
    assert_eq!(
        err(c.call(2, 77, b"/tool\0")),
        "ENOENT",
        "unknown transaction id"
    );
    assert_eq!(
        err(c.call(7, 0, b"T\0")),
        "ENOENT",
        "end without a transaction"
    );
    assert_eq!(err(c.call(2, 0, b"/tool")), "EINVAL", "missing NUL");
    assert_eq!(err(c.call(2, 0, b"/tool\0\0")), "EINVAL", "two arguments");
    assert_eq!(err(c.call(2, 0, b"/a b\0")), "EINVAL", "bad character");
    assert_eq!(err(c.call(2, 0, b"/a//b\0")), "EINVAL");
    assert_eq!(err(c.call(2, 0, b"/a/\0")), "EINVAL");
    assert_eq!(err(c.call(2, 0, b"\xff\xfe\0")), "EINVAL", "not UTF-8");
    let long = format!("/{}\0", "p".repeat(2048));
    assert_eq!(
        err(c.call(11, 0, long.as_bytes())),
        "EINVAL",
        "path over the limit"
    );
    assert_eq!(err(c.call(4, 0, b"/w\0")), "EINVAL", "watch without token");
    assert_eq!(
        err(c.call(14, 0, b"/tool\0x5\0")),
        "EINVAL",
        "bad permission"
    );
    assert_eq!(err(c.call(8, 0, b"5\0abc\0x\0")), "EINVAL", "bad introduce");
    assert_eq!(err(c.call(9, 0, b"0\0")), "EINVAL", "release dom0");
    assert_eq!(err(c.call(0, 0, b"no-such-command\0")), "EINVAL");
    assert_eq!(err(c.call(22, 0, b"/tool\0-1\0")), "EINVAL", "bad offset");
    // Nested transactions.
    let (ty, id) = c.call(6, 0, b"\0");
    assert_eq!(ty, 6);
    let id: u32 = String::from_utf8_lossy(id.strip_suffix(b"\0").unwrap())
        .parse()
        .unwrap();
    assert_eq!(err(c.call(6, id, b"\0")), "EBUSY");
    assert_eq!(err(c.call(7, id, b"X\0")), "EINVAL");
    assert_eq!(c.call(7, id, b"F\0"), (7, b"OK\0".to_vec()));
    // The connection is still fine after all of that.
    assert_eq!(c.call(11, 0, b"/ok\0yes"), (11, b"OK\0".to_vec()));
    assert_eq!(c.call(2, 0, b"/ok\0"), (2, b"yes".to_vec()));
    assert!(d.alive());
    assert!(d.stop().success());
}

#[test]
fn framing_violations_drop_only_that_connection() {
    let mut d = Xenstored::start("framing");
    let mut keep = d.raw();
    keep.call(11, 0, b"/keep\x001");
    // Payload length over XENSTORE_PAYLOAD_MAX: disconnected at once.
    let mut bad = d.raw();
    let mut h = Vec::new();
    Header {
        ty: 2,
        req_id: 1,
        tx_id: 0,
        len: 4097,
    }
    .encode(&mut h);
    bad.s.write_all(&h).unwrap();
    assert!(
        bad.recv().is_none(),
        "oversized payload must close the connection"
    );
    let mut huge = d.raw();
    let mut h = Vec::new();
    Header {
        ty: 11,
        req_id: 1,
        tx_id: 0,
        len: u32::MAX,
    }
    .encode(&mut h);
    huge.s.write_all(&h).unwrap();
    assert!(huge.recv().is_none());
    // A client that sends half a header and stalls blocks nobody.
    let mut stall = d.raw();
    stall.s.write_all(&[2, 0, 0]).unwrap();
    served(&d);
    assert_eq!(keep.call(2, 0, b"/keep\0"), (2, b"1".to_vec()));
    // A client that sends half a payload and hangs up.
    let mut half = d.raw();
    let mut m = Vec::new();
    Header {
        ty: 11,
        req_id: 1,
        tx_id: 0,
        len: 100,
    }
    .encode(&mut m);
    m.extend_from_slice(b"/half\0");
    half.s.write_all(&m).unwrap();
    drop(half);
    served(&d);
    drop(stall);
    assert!(d.alive());
    assert!(d.log().contains("framing violation"));
    assert!(d.stop().success());
}

/// xorshift64*: deterministic garbage without another dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn random_garbage_never_hurts_the_daemon() {
    let mut d = Xenstored::start("garbage");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..200 {
        let mut c = d.raw();
        let ty = (rng.next() % 26) as u32;
        let len = (rng.next() % 300) as usize;
        let mut payload: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        if round % 3 == 0 {
            // Near-valid: printable path-ish bytes with NULs.
            for b in payload.iter_mut() {
                *b = b"/ab\0@-_9xT"[(*b % 10) as usize];
            }
        }
        c.send(ty, round, (rng.next() % 3) as u32, &payload);
        // Every well-framed request gets exactly one reply (watch events
        // may come too); read until the reply.
        loop {
            let (h, _) = c.recv().expect("reply to a well-framed request");
            if h.ty != 15 {
                assert_eq!(h.req_id, round);
                break;
            }
        }
        if round % 10 == 0 {
            // Raw garbage stream, possibly with a bad length: must not crash.
            let junk: Vec<u8> = (0..64).map(|_| rng.next() as u8).collect();
            let mut j = d.raw();
            let _ = j.s.write_all(&junk);
        }
    }
    served(&d);
    assert!(d.alive());
    assert!(d.stop().success());
}

#[test]
fn request_flood_without_reading_does_not_starve_others() {
    let mut d = Xenstored::start("flood");
    let mut flood = d.raw();
    flood.s.set_nonblocking(true).unwrap();
    let mut one = Vec::new();
    pvio_xenstore::codec::encode_message(&mut one, 2, 1, 0, b"/tool\0");
    let burst: Vec<u8> = one.iter().copied().cycle().take(one.len() * 1024).collect();
    // Write until the daemon stops reading us (its output to us is full and
    // it no longer accepts input) and our socket buffer is full too.
    let mut sent = 0usize;
    let full = wait_until(DEADLINE, || match flood.s.write(&burst) {
        Ok(n) => {
            sent += n;
            false
        }
        Err(e) if e.kind() == ErrorKind::WouldBlock => true,
        Err(e) => panic!("{e}"),
    });
    assert!(full, "the daemon must apply back-pressure");
    assert!(sent > 100_000);
    // Others are still served promptly.
    for _ in 0..10 {
        served(&d);
    }
    drop(flood);
    served(&d);
    assert!(d.alive());
    assert!(d.stop().success());
}

#[test]
fn client_ignoring_watch_events_is_dropped() {
    let mut d = Xenstored::start_with("evflood", &["--max-output-bytes", "65536"]);
    let mut lazy = d.raw();
    assert_eq!(lazy.call(4, 0, b"/\0lazy\0"), (4, b"OK\0".to_vec()));
    let mut writer = d.raw();
    let value = "v".repeat(200);
    // Each write queues an event for `lazy`, which never reads: its queue
    // passes the bound and it is disconnected; the writer never notices.
    let mut i = 0;
    let dropped = wait_until(DEADLINE, || {
        i += 1;
        let p = format!("/flood/{}/{}\0{value}", "x".repeat(300), i);
        assert_eq!(writer.call(11, 0, p.as_bytes()).0, 11);
        d.log().contains("output queue overflow")
    });
    assert!(
        dropped,
        "a client that does not read its events must be dropped"
    );
    // Drain what the kernel buffered; then EOF.
    let mut events = 0;
    while let Some((h, _)) = lazy.recv() {
        assert_eq!(h.ty, 15);
        events += 1;
    }
    assert!(events > 0);
    served(&d);
    assert!(d.alive());
    assert!(d.stop().success());
}
