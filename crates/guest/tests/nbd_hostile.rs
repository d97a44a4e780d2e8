//! The NBD export against a hand-rolled client that behaves well, badly and
//! maliciously: every misbehaviour must end in an error reply or a closed
//! connection, the server must keep serving the next client, and shutdown
//! must never hang. Sockets have read timeouts, so a hung server fails a
//! test instead of stalling it.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pvio_blk::device::{BlockDevice, MemDevice};
use pvio_guest::nbd::defs::*;
use pvio_guest::nbd::{NbdConfig, NbdServer};
use pvio_guest::testing::{FaultConfig, FaultyDevice};

const SIZE: u64 = 1 << 20;

fn sock(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("pvio-nbdh-{}-{name}.sock", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

fn serve(name: &str) -> NbdServer<MemDevice> {
    NbdServer::start(
        sock(name),
        MemDevice::new(SIZE, 8, 64 * 1024),
        NbdConfig::default(),
    )
    .unwrap()
}

/// Waits for `cond` with a deadline.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

struct Client {
    s: UnixStream,
}

impl Client {
    fn connect(path: &Path) -> Self {
        let s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        Self { s }
    }

    fn read_n(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        self.s.read_exact(&mut b).unwrap();
        b
    }

    fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).unwrap();
    }

    /// The greeting, then client flags.
    fn greet(&mut self, flags: u32) {
        let g = self.read_n(18);
        assert_eq!(&g[..8], &NBDMAGIC.to_be_bytes());
        assert_eq!(&g[8..16], &IHAVEOPT.to_be_bytes());
        self.send(&flags.to_be_bytes());
    }

    fn option(&mut self, opt: u32, data: &[u8]) {
        let mut m = IHAVEOPT.to_be_bytes().to_vec();
        m.extend_from_slice(&opt.to_be_bytes());
        m.extend_from_slice(&(data.len() as u32).to_be_bytes());
        m.extend_from_slice(data);
        self.send(&m);
    }

    /// One option reply: (type, data).
    fn option_reply(&mut self) -> (u32, Vec<u8>) {
        let h = self.read_n(20);
        assert_eq!(&h[..8], &OPTION_REPLY_MAGIC.to_be_bytes());
        let typ = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
        (typ, self.read_n(len))
    }

    /// Handshake with NBD_OPT_GO; the export's size and flags.
    fn go(&mut self) -> (u64, u16) {
        self.greet(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
        self.option(OPT_GO, &[0, 0, 0, 0, 0, 0]);
        let mut export = None;
        loop {
            let (typ, d) = self.option_reply();
            match typ {
                REP_INFO if d[..2] == [0, 0] => {
                    export = Some((
                        u64::from_be_bytes(d[2..10].try_into().unwrap()),
                        u16::from_be_bytes(d[10..12].try_into().unwrap()),
                    ))
                }
                REP_INFO => {}
                REP_ACK => return export.unwrap(),
                other => panic!("GO answered {other:#x}: {}", String::from_utf8_lossy(&d)),
            }
        }
    }

    fn request(
        &mut self,
        kind: u16,
        flags: u16,
        cookie: u64,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) {
        let mut m = REQUEST_MAGIC.to_be_bytes().to_vec();
        m.extend_from_slice(&flags.to_be_bytes());
        m.extend_from_slice(&kind.to_be_bytes());
        m.extend_from_slice(&cookie.to_be_bytes());
        m.extend_from_slice(&offset.to_be_bytes());
        m.extend_from_slice(&len.to_be_bytes());
        m.extend_from_slice(payload);
        self.send(&m);
    }

    /// A simple reply: (errno, cookie).
    fn reply(&mut self) -> (u32, u64) {
        let h = self.read_n(16);
        assert_eq!(&h[..4], &SIMPLE_REPLY_MAGIC.to_be_bytes());
        (
            u32::from_be_bytes(h[4..8].try_into().unwrap()),
            u64::from_be_bytes(h[8..16].try_into().unwrap()),
        )
    }

    /// Sends a request and returns its errno (reading a read's data).
    fn call(
        &mut self,
        kind: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) -> (u32, Vec<u8>) {
        self.request(kind, flags, 77, offset, len, payload);
        let (errno, cookie) = self.reply();
        assert_eq!(cookie, 77);
        let data = if kind == CMD_READ && errno == 0 {
            self.read_n(len as usize)
        } else {
            Vec::new()
        };
        (errno, data)
    }

    /// The server closed the connection (EOF or reset), within the timeout.
    fn closed(&mut self) -> bool {
        let mut b = [0u8; 64];
        loop {
            match self.s.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }

    fn disc(mut self) {
        self.request(CMD_DISC, 0, 0, 0, 0, &[]);
        assert!(self.closed());
    }
}

/// A fresh client can still use the export.
fn still_serves(path: &Path) {
    let mut c = Client::connect(path);
    assert_eq!(c.go().0, SIZE);
    assert_eq!(c.call(CMD_READ, 0, 0, 512, &[]).0, 0);
    c.disc();
}

#[test]
fn errors_are_replied_and_the_session_goes_on() {
    let server = serve("errors");
    let mut c = Client::connect(server.path());
    let (size, flags) = c.go();
    assert_eq!(size, SIZE);
    assert_eq!(flags & FLAG_READ_ONLY, 0);
    assert_ne!(flags & FLAG_SEND_FLUSH, 0);
    assert_ne!(flags & FLAG_SEND_TRIM, 0);
    assert_eq!(
        c.call(CMD_READ, 0, SIZE, 512, &[]).0,
        EINVAL,
        "read beyond the end"
    );
    assert_eq!(
        c.call(CMD_READ, 0, SIZE - 512, 1024, &[]).0,
        EINVAL,
        "read across the end"
    );
    assert_eq!(
        c.call(CMD_WRITE, 0, SIZE - 512, 1024, &[1; 1024]).0,
        ENOSPC,
        "write beyond the end"
    );
    assert_eq!(
        c.call(CMD_READ, 0, 100, 512, &[]).0,
        EINVAL,
        "misaligned offset"
    );
    assert_eq!(
        c.call(CMD_READ, 0, 0, 100, &[]).0,
        EINVAL,
        "misaligned length"
    );
    assert_eq!(c.call(CMD_READ, 0, 0, 0, &[]).0, EINVAL, "zero length");
    assert_eq!(
        c.call(CMD_READ, 0, 0, 1 << 30, &[]).0,
        EINVAL,
        "oversize read"
    );
    assert_eq!(
        c.call(CMD_READ, 0, u64::MAX - 511, 512, &[]).0,
        EINVAL,
        "wrapping range"
    );
    assert_eq!(c.call(42, 0, 0, 512, &[]).0, EINVAL, "unknown command");
    assert_eq!(
        c.call(CMD_READ, 1 << 7, 0, 512, &[]).0,
        EINVAL,
        "unknown flag"
    );
    assert_eq!(
        c.call(CMD_FLUSH, 0, 4096, 0, &[]).0,
        EINVAL,
        "flush with a range"
    );

    // Then real work, larger than the device's 64 KiB requests.
    let pattern: Vec<u8> = (0..200 * 1024).map(|i| (i % 251) as u8).collect();
    assert_eq!(
        c.call(
            CMD_WRITE,
            CMD_FLAG_FUA,
            4096,
            pattern.len() as u32,
            &pattern
        )
        .0,
        0
    );
    assert_eq!(c.call(CMD_FLUSH, 0, 0, 0, &[]).0, 0);
    let (e, back) = c.call(CMD_READ, 0, 4096, pattern.len() as u32, &[]);
    assert_eq!(e, 0);
    assert!(back == pattern, "read back different data");
    assert_eq!(c.call(CMD_TRIM, 0, 8192, 8192, &[]).0, 0);
    assert_eq!(
        c.call(
            CMD_WRITE_ZEROES,
            CMD_FLAG_NO_HOLE | CMD_FLAG_FUA,
            65536,
            131072,
            &[]
        )
        .0,
        0
    );
    let (_, back) = c.call(CMD_READ, 0, 4096, 4096 + 8192 + 4096, &[]);
    assert_eq!(&back[..4096], &pattern[..4096]);
    assert!(
        back[4096..12288].iter().all(|&b| b == 0),
        "trimmed range reads as zeroes"
    );
    assert_eq!(&back[12288..], &pattern[12288..16384]);
    c.disc();
    let stats = server.stats();
    let dev = server.shutdown().unwrap();
    assert!(dev.contents()[65536..196608].iter().all(|&b| b == 0));
    assert_eq!(stats.error_replies, 11);
    assert_eq!(stats.protocol_errors, 0);
}

#[test]
fn pipelined_requests_are_all_answered() {
    let server = serve("pipeline");
    let mut c = Client::connect(server.path());
    c.go();
    let n = 40u64;
    for i in 0..n {
        let data = vec![i as u8 + 1; 8192];
        c.request(CMD_WRITE, 0, 1000 + i, i * 8192, 8192, &data);
    }
    let mut seen: Vec<u64> = (0..n)
        .map(|_| c.reply())
        .map(|(e, k)| {
            assert_eq!(e, 0);
            k
        })
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, (1000..1000 + n).collect::<Vec<_>>());
    for i in 0..n {
        c.request(CMD_READ, 0, 2000 + i, i * 8192, 8192, &[]);
    }
    for _ in 0..n {
        let (e, k) = c.reply();
        assert_eq!(e, 0);
        let data = c.read_n(8192);
        let i = k - 2000;
        assert!(
            data.iter().all(|&b| b == i as u8 + 1),
            "request {i} read the wrong data"
        );
    }
    c.disc();
    assert!(
        server.stats().max_active > 1,
        "requests were not kept in flight together"
    );
    server.shutdown().unwrap();
}

#[test]
fn garbage_in_the_handshake_closes_only_that_connection() {
    let server = serve("garbage-hs");
    let mut c = Client::connect(server.path());
    c.read_n(18);
    c.send(&[0xde; 64]);
    assert!(c.closed(), "unknown client flags must close");

    let mut c = Client::connect(server.path());
    c.greet(FLAG_C_FIXED_NEWSTYLE);
    c.send(&[0x42; 16]);
    assert!(c.closed(), "bad option magic must close");

    let mut c = Client::connect(server.path());
    c.greet(FLAG_C_FIXED_NEWSTYLE);
    c.send(&IHAVEOPT.to_be_bytes());
    c.send(&OPT_LIST.to_be_bytes());
    c.send(&u32::MAX.to_be_bytes());
    assert!(c.closed(), "huge option data must close");

    let mut c = Client::connect(server.path());
    c.greet(FLAG_C_FIXED_NEWSTYLE);
    c.option(77, b"hello");
    assert_eq!(c.option_reply().0, REP_ERR_UNSUP);
    c.option(OPT_STRUCTURED_REPLY, b"junk");
    assert_eq!(c.option_reply().0, REP_ERR_INVALID);
    c.option(OPT_SET_META_CONTEXT, &[0xff; 40]);
    assert_eq!(
        c.option_reply().0,
        REP_ERR_INVALID,
        "metadata before structured replies"
    );
    c.option(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(c.option_reply().0, REP_ACK);
    c.option(OPT_SET_META_CONTEXT, &[0xff; 40]);
    assert_eq!(
        c.option_reply().0,
        REP_ERR_INVALID,
        "garbage metadata request"
    );
    c.option(OPT_ABORT, &[]);
    assert_eq!(c.option_reply().0, REP_ACK);
    assert!(c.closed());

    // Gone in the middle of the greeting and of an option.
    drop(Client::connect(server.path()));
    let mut c = Client::connect(server.path());
    c.greet(FLAG_C_FIXED_NEWSTYLE);
    c.send(&IHAVEOPT.to_be_bytes()[..5]);
    drop(c);
    still_serves(server.path());
    server.shutdown().unwrap();
}

#[test]
fn garbage_in_transmission_disconnects_and_the_server_lives_on() {
    let server = serve("garbage-tx");
    let mut c = Client::connect(server.path());
    c.go();
    c.send(&[0x55; 28]);
    assert!(c.closed());
    eventually("the session to end", || server.stats().sessions_ended == 1);
    assert_eq!(server.stats().protocol_errors, 1);

    // A write too large to accept is a hard disconnect; the payload is
    // never read.
    let mut c = Client::connect(server.path());
    c.go();
    c.request(CMD_WRITE, 0, 1, 0, 1 << 30, &[]);
    assert!(c.closed());

    // Gone in the middle of a write payload.
    let mut c = Client::connect(server.path());
    c.go();
    c.request(CMD_WRITE, 0, 1, 0, 65536, &[7; 1000]);
    drop(c);

    // Gone with requests in flight and replies unread.
    let mut c = Client::connect(server.path());
    c.go();
    for i in 0..20 {
        c.request(CMD_READ, 0, i, 0, 65536, &[]);
    }
    drop(c);
    still_serves(server.path());
    server.shutdown().unwrap();
}

#[test]
fn a_second_client_is_refused_with_a_reason_then_served() {
    let server = serve("second");
    let mut first = Client::connect(server.path());
    first.go();
    let mut second = Client::connect(server.path());
    second.greet(FLAG_C_FIXED_NEWSTYLE);
    second.option(OPT_GO, &[0, 0, 0, 0, 0, 0]);
    let (typ, msg) = second.option_reply();
    assert_eq!(typ, REP_ERR_POLICY);
    assert!(String::from_utf8_lossy(&msg).contains("in use"));
    second.option(OPT_ABORT, &[]);
    assert_eq!(second.option_reply().0, REP_ACK);
    assert!(second.closed());
    // The first client is unaffected.
    assert_eq!(first.call(CMD_READ, 0, 0, 4096, &[]).0, 0);
    first.disc();
    still_serves(server.path());
    let stats = server.stats();
    assert_eq!((stats.refused, stats.connections), (1, 2));
    server.shutdown().unwrap();
}

#[test]
fn shutdown_never_waits_for_clients() {
    // An idle client in transmission.
    let server = serve("shutdown-idle");
    let mut c = Client::connect(server.path());
    c.go();
    server.shutdown().unwrap();
    assert!(c.closed());

    // A client that connected and said nothing.
    let server = serve("shutdown-silent");
    let mut c = Client::connect(server.path());
    eventually("the session to start", || server.stats().connections == 1);
    server.shutdown().unwrap();
    assert!(c.closed());

    // Nobody at all, and dropping instead of shutting down.
    let server = serve("shutdown-none");
    let path = server.path().to_path_buf();
    drop(server);
    assert!(!path.exists());
    assert!(UnixStream::connect(&path).is_err());
}

#[test]
fn device_errors_and_read_only_exports_map_to_nbd_errors() {
    let dev = FaultyDevice::new(
        MemDevice::new(SIZE, 8, 65536),
        FaultConfig {
            fail_every: Some(2),
            ..FaultConfig::default()
        },
    );
    let server = NbdServer::start(sock("eio"), dev, NbdConfig::default()).unwrap();
    let mut c = Client::connect(server.path());
    c.go();
    // Requests 1, 3, ... succeed; 2, 4, ... fail at the device.
    assert_eq!(c.call(CMD_READ, 0, 0, 512, &[]).0, 0);
    assert_eq!(c.call(CMD_READ, 0, 0, 512, &[]).0, EIO);
    assert_eq!(c.call(CMD_WRITE, 0, 0, 512, &[1; 512]).0, 0);
    assert_eq!(c.call(CMD_WRITE, 0, 0, 512, &[1; 512]).0, EIO);
    c.disc();
    server.shutdown().unwrap();

    let cfg = NbdConfig {
        read_only: true,
        ..NbdConfig::default()
    };
    let server = NbdServer::start(sock("ro"), MemDevice::new(SIZE, 8, 65536), cfg).unwrap();
    let mut c = Client::connect(server.path());
    let (_, flags) = c.go();
    assert_ne!(flags & FLAG_READ_ONLY, 0);
    assert_eq!(flags & (FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES), 0);
    assert_eq!(c.call(CMD_WRITE, 0, 0, 512, &[1; 512]).0, EPERM);
    assert_eq!(c.call(CMD_TRIM, 0, 0, 512, &[]).0, EPERM);
    assert_eq!(c.call(CMD_WRITE_ZEROES, 0, 0, 512, &[]).0, EPERM);
    assert_eq!(c.call(CMD_READ, 0, 0, 512, &[]).0, 0);
    c.disc();
    let dev = server.shutdown().unwrap();
    assert!(dev.contents().iter().all(|&b| b == 0));
    let _ = dev.info();
}

#[test]
fn export_name_path_and_listing() {
    let cfg = NbdConfig {
        export_name: "vdi-1".into(),
        ..NbdConfig::default()
    };
    let server = NbdServer::start(sock("names"), MemDevice::new(SIZE, 8, 65536), cfg).unwrap();
    let mut c = Client::connect(server.path());
    c.greet(FLAG_C_FIXED_NEWSTYLE);
    c.option(OPT_LIST, &[]);
    let (typ, d) = c.option_reply();
    assert_eq!(typ, REP_SERVER);
    assert_eq!(&d[4..], b"vdi-1");
    assert_eq!(c.option_reply().0, REP_ACK);
    // Old-style EXPORT_NAME, with the 124 zero bytes (no NO_ZEROES).
    c.option(OPT_EXPORT_NAME, b"vdi-1");
    let r = c.read_n(8 + 2 + 124);
    assert_eq!(u64::from_be_bytes(r[..8].try_into().unwrap()), SIZE);
    assert!(r[10..].iter().all(|&b| b == 0));
    assert_eq!(c.call(CMD_READ, 0, 0, 512, &[]).0, 0);
    c.disc();

    // A wrong name through EXPORT_NAME cannot be answered: hard disconnect.
    let mut c = Client::connect(server.path());
    c.greet(FLAG_C_FIXED_NEWSTYLE);
    c.option(OPT_EXPORT_NAME, b"nope");
    assert!(c.closed());
    server.shutdown().unwrap();
}

/// A tiny deterministic generator for the fuzzing below.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn random_garbage_never_kills_the_server() {
    let server = serve("fuzz-bytes");
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    for round in 0..24 {
        let mut c = Client::connect(server.path());
        if round % 2 == 0 {
            c.go();
        } else {
            c.read_n(18);
        }
        let junk: Vec<u8> = (0..256).map(|_| rng.next() as u8).collect();
        c.send(&junk);
        c.s.shutdown(std::net::Shutdown::Write).unwrap();
        assert!(
            c.closed(),
            "round {round}: the server kept a garbage connection open"
        );
    }
    still_serves(server.path());
    server.shutdown().unwrap();
}

#[test]
fn random_well_framed_requests_are_all_answered() {
    let server = serve("fuzz-requests");
    let mut c = Client::connect(server.path());
    c.go();
    let mut rng = XorShift(12345);
    let kinds = [
        CMD_READ,
        CMD_WRITE,
        CMD_FLUSH,
        CMD_TRIM,
        5,
        CMD_WRITE_ZEROES,
        7,
        99,
    ];
    let mut expect = Vec::new();
    for cookie in 0..200u64 {
        let kind = kinds[(rng.next() % kinds.len() as u64) as usize];
        let flags = if rng.next().is_multiple_of(4) {
            (rng.next() % 64) as u16
        } else {
            0
        };
        let len = match rng.next() % 4 {
            0 => (rng.next() % 70_000) as u32,
            1 => 0,
            _ => ((rng.next() % 128) * 512) as u32,
        };
        let offset = match rng.next() % 4 {
            0 => rng.next(),
            1 => SIZE - 512 * (rng.next() % 4),
            _ => (rng.next() % (SIZE / 512)) * 512,
        };
        let payload = if kind == CMD_WRITE {
            vec![0x3c; len as usize]
        } else {
            Vec::new()
        };
        c.request(kind, flags, cookie, offset, len, &payload);
        expect.push((cookie, kind, len));
        // Read replies as they come, so neither side's buffers fill up.
        if cookie % 8 == 7 {
            for _ in 0..8 {
                let (errno, k) = c.reply();
                assert!(
                    [0, EPERM, EIO, EINVAL, ENOSPC].contains(&errno),
                    "errno {errno}"
                );
                let (_, kind, len) = expect
                    .iter()
                    .find(|e| e.0 == k)
                    .copied()
                    .expect("unknown cookie");
                if kind == CMD_READ && errno == 0 {
                    c.read_n(len as usize);
                }
            }
        }
    }
    c.disc();
    let stats = server.stats();
    assert_eq!(stats.requests, 200);
    assert!(
        stats.error_replies > 20 && stats.error_replies < 200,
        "{stats:?}"
    );
    server.shutdown().unwrap();
}
