//! Guests talking to `pvio xenstored --hvd-socket` over their xenbus rings,
//! as on Xen: hvd creates the domains (store event channel prepared, ring
//! page at frame 1), dom0 writes each home and introduces it, and each
//! guest is a `pvio internal xs-guest` process that claims its domain and
//! uses the ring client. Checks permissions and quotas by guest identity,
//! watches and transactions over the ring, hostile rings cut off alone,
//! domain death (SIGKILL) firing `@releaseDomain`, and xenstore-utils on
//! the dom0 socket alongside.

mod hv_support;
mod xenstored_common;

use hv_support::{Hvd, DEADLINE};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Instant;
use xenstored_common::{wait_until, Raw, Xenstored};

/// A guest process speaking to xenstored over its ring.
struct XsGuest {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    domid: u16,
}

impl XsGuest {
    fn spawn(hvd: &Hvd, domid: u16, token: u64) -> Self {
        let mut child = Command::new(hv_support::PVIO)
            .args(["internal", "xs-guest", "--socket"])
            .arg(&hvd.socket)
            .args(["--domid", &domid.to_string(), "--token", &token.to_string()])
            .env("PVIO_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn xs-guest");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut g = Self {
            child,
            stdin,
            lines: rx,
            domid,
        };
        assert_eq!(g.ok("domid"), domid.to_string());
        g
    }

    fn cmd(&mut self, line: &str) -> Result<String, String> {
        writeln!(self.stdin, "{line}").expect("guest stdin");
        self.stdin.flush().unwrap();
        let ans = self
            .lines
            .recv_timeout(DEADLINE)
            .unwrap_or_else(|_| panic!("guest {} did not answer {line:?}", self.domid));
        if let Some(rest) = ans.strip_prefix("ok") {
            Ok(rest.trim_start().to_string())
        } else if let Some(rest) = ans.strip_prefix("err") {
            Err(rest.trim_start().to_string())
        } else {
            panic!("unexpected answer {ans:?} to {line:?}")
        }
    }

    fn ok(&mut self, line: &str) -> String {
        self.cmd(line)
            .unwrap_or_else(|e| panic!("{line:?} failed in guest {}: {e}", self.domid))
    }

    fn err(&mut self, line: &str) -> String {
        match self.cmd(line) {
            Ok(v) => panic!("{line:?} succeeded in guest {} ({v:?})", self.domid),
            Err(e) => e,
        }
    }

    /// SIGKILL: no clean-up of its own.
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for XsGuest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A dom0 request: the reply payload, or the error name.
fn call(r: &mut Raw, ty: u32, payload: &[u8]) -> Result<Vec<u8>, String> {
    let (t, body) = r.call(ty, 0, payload);
    if t == 16 {
        Err(String::from_utf8_lossy(body.strip_suffix(b"\0").unwrap_or(&body)).into_owned())
    } else {
        assert_eq!(t, ty, "reply type");
        Ok(body)
    }
}

fn introduced(r: &mut Raw, domid: u16) -> bool {
    call(r, 17, format!("{domid}\0").as_bytes()).unwrap() == b"T\0"
}

/// Guest connections xenstored has for `domid` (`xenstore-control quota`).
fn connections(r: &mut Raw, domid: u16) -> Option<u32> {
    let text = call(r, 0, format!("quota\0{domid}\0").as_bytes()).ok()?;
    let text = String::from_utf8_lossy(&text).into_owned();
    let line = text.lines().find(|l| l.starts_with("connections"))?;
    line.split(':')
        .nth(1)?
        .trim()
        .trim_end_matches('\0')
        .parse()
        .ok()
}

/// The toolstack's part: create the domain in hvd, write its home owned by
/// it (as libxl does), then XS_INTRODUCE it with its ring frame and port.
fn create_guest(hvd: &Hvd, dom0: &mut Raw, name: &str) -> (u16, u64) {
    let host = hvd.host();
    let d = host.create_domain(name, 64).expect("create_domain");
    let home = format!("/local/domain/{}", d.domid);
    call(dom0, 12, format!("{home}\0").as_bytes()).unwrap();
    call(dom0, 14, format!("{home}\0n{}\0", d.domid).as_bytes()).unwrap();
    for (k, v) in [
        ("name", name.to_string()),
        ("domid", d.domid.to_string()),
        ("store/port", d.store_port.to_string()),
        ("store/ring-ref", pvio_hv::memory::STORE_FRAME.to_string()),
    ] {
        call(dom0, 11, format!("{home}/{k}\0{v}").as_bytes()).unwrap();
    }
    assert!(!introduced(dom0, d.domid));
    let frame = pvio_hv::memory::STORE_FRAME;
    call(
        dom0,
        8,
        format!("{}\0{frame}\0{}\0", d.domid, d.store_port).as_bytes(),
    )
    .expect("XS_INTRODUCE");
    assert!(introduced(dom0, d.domid));
    (d.domid, d.token)
}

/// The next `@releaseDomain` event on a watching connection.
fn release_event(w: &mut Raw) {
    let (h, body) = w.recv().expect("@releaseDomain event");
    assert_eq!(h.ty, 15);
    assert!(body.starts_with(b"@releaseDomain\0"), "{body:?}");
}

#[test]
fn guests_talk_to_xenstored_over_their_rings() {
    let hvd = Hvd::start(&[]);
    let mut xs = Xenstored::start_with(
        "guest-ring",
        &[
            "--hvd-socket",
            hvd.socket.to_str().unwrap(),
            "--quota-nodes",
            "30",
        ],
    );
    let mut dom0 = xs.raw();
    let mut watcher = xs.raw();
    watcher.send(4, 1, 0, b"@releaseDomain\0rel\0");
    assert_eq!(watcher.recv().unwrap().1, b"OK\0");
    release_event(&mut watcher); // the watch's first event

    // An introduction naming a domain hvd does not have is refused.
    assert_eq!(
        call(&mut dom0, 8, b"4000\x001\x001\0"),
        Err("ENOENT".into())
    );
    assert!(!introduced(&mut dom0, 4000));

    let (a, token) = create_guest(&hvd, &mut dom0, "alpha");
    let mut ga = XsGuest::spawn(&hvd, a, token);
    let (b, token) = create_guest(&hvd, &mut dom0, "beta");
    let mut gb = XsGuest::spawn(&hvd, b, token);
    assert_eq!(ga.ok("ring-features"), "3", "reconnection + error word");

    // Reads and writes in its home, relative and absolute.
    ga.ok("write data/x hello");
    assert_eq!(ga.ok(&format!("read /local/domain/{a}/data/x")), "hello");
    assert_eq!(ga.ok("read name"), "alpha");
    ga.ok(&format!("write /local/domain/{a}/data/y abs"));
    assert_eq!(ga.ok("dir data"), "x y");
    assert_eq!(ga.ok("perms data/x"), format!("n{a}"));
    assert_eq!(ga.ok("domain-path"), format!("/local/domain/{a}"));
    // xenstore-utils on the dom0 socket see the guest's writes...
    let (ok, out, err) = xs.run("xenstore-read", &[&format!("/local/domain/{a}/data/x")]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "hello");
    // ...and the guest sees theirs.
    let (ok, _, err) = xs.run(
        "xenstore-write",
        &[&format!("/local/domain/{a}/data/from-dom0"), "hi"],
    );
    assert!(ok, "{err}");
    assert_eq!(ga.ok("read data/from-dom0"), "hi");

    // Watches: relative paths come back relative.
    let w = ga.ok("watch data");
    call(
        &mut dom0,
        11,
        format!("/local/domain/{a}/data/z\0new").as_bytes(),
    )
    .unwrap();
    assert_eq!(ga.ok(&format!("event {w} 20000")), "data/z");
    gb.ok("write peer 1");
    assert_eq!(ga.err(&format!("event {w} 100")), "timeout", "not its home");

    // Transactions: a conflicting dom0 write makes the commit fail.
    let t = ga.ok("tx-start");
    assert_eq!(ga.ok(&format!("tx-read {t} data/x")), "hello");
    call(
        &mut dom0,
        11,
        format!("/local/domain/{a}/data/x\0dom0").as_bytes(),
    )
    .unwrap();
    ga.ok(&format!("tx-write {t} data/x guest"));
    assert_eq!(ga.err(&format!("tx-commit {t}")), "EAGAIN");
    assert_eq!(ga.ok("read data/x"), "dom0");
    assert_eq!(ga.ok("incr counter"), "1");
    assert_eq!(ga.ok("incr counter"), "2");

    // Its identity: nothing of dom0's, nothing of the other guest's.
    assert_eq!(ga.err("read /tool"), "EACCES");
    assert_eq!(ga.err("write /tool/x 1"), "EACCES");
    assert_eq!(ga.err(&format!("read /local/domain/{b}/name")), "EACCES");
    assert_eq!(ga.err(&format!("write /local/domain/{b}/evil 1")), "EACCES");
    assert_eq!(ga.err("introduced 0"), "EACCES");
    // The node quota (30, home included).
    let fill = ga.ok("fill many 100");
    let (made, why) = fill.split_once(' ').unwrap();
    assert_eq!(why, "ENOSPC", "{fill}");
    let made: usize = made.parse().unwrap();
    assert!(made > 5 && made < 30, "{fill}");

    // Hostile guests: garbage indices, and a length far over the limit.
    let (c, token) = create_guest(&hvd, &mut dom0, "bad-index");
    let mut gc = XsGuest::spawn(&hvd, c, token);
    gc.ok("hostile-index");
    let (d, token) = create_guest(&hvd, &mut dom0, "bad-length");
    let mut gd = XsGuest::spawn(&hvd, d, token);
    gd.ok("hostile-length");
    let errors_set = wait_until(DEADLINE, || {
        gc.ok("ring-error") == "2" && gd.ok("ring-error") == "3"
    });
    assert!(errors_set, "error words not set:\n{}", xs.log());
    assert!(wait_until(DEADLINE, || {
        connections(&mut dom0, c) == Some(0) && connections(&mut dom0, d) == Some(0)
    }));
    assert!(introduced(&mut dom0, c), "cut off, not released");
    assert_eq!(connections(&mut dom0, a), Some(1));
    assert_eq!(ga.ok("read data/x"), "dom0", "others are still served");

    // A guest that dies: @releaseDomain, its nodes and connection gone.
    let start = Instant::now();
    ga.kill();
    release_event(&mut watcher);
    eprintln!("death of domain {a} noticed in {:?}", start.elapsed());
    assert!(!introduced(&mut dom0, a));
    assert_eq!(
        call(
            &mut dom0,
            2,
            format!("/local/domain/{a}/data/x\0").as_bytes()
        ),
        Err("ENOENT".into())
    );
    assert_eq!(connections(&mut dom0, a), None, "forgotten");
    assert!(xs.alive());
    assert_eq!(gb.ok("read peer"), "1");
    // The cut-off guest's death is noticed too (by the periodic check).
    gc.kill();
    release_event(&mut watcher);
    assert!(!introduced(&mut dom0, c));
    // XS_RELEASE of a live guest closes its ring and removes its nodes.
    call(&mut dom0, 9, format!("{b}\0").as_bytes()).unwrap();
    release_event(&mut watcher);
    assert!(!introduced(&mut dom0, b));
    assert_eq!(connections(&mut dom0, b), None);
    drop(gb);
    drop(gd);
    release_event(&mut watcher);
    assert!(!introduced(&mut dom0, d));

    let (ok, out, err) = xs.run("xenstore-ls", &["/local/domain"]);
    assert!(ok, "{err}");
    assert!(!out.contains("alpha"), "{out}");
    assert!(xs.stop().success(), "{}", xs.log());
}
