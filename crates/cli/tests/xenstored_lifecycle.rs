//! `pvio xenstored` as a process: --help, clean exit on SIGTERM (socket
//! removed), a stale socket replaced, a non-socket path refused, and quota
//! flags visible through XS_CONTROL.

mod xenstored_common;
use std::process::Command;
use xenstored_common::Xenstored;

#[test]
fn help_lists_the_quota_flags() {
    let o = Command::new(env!("CARGO_BIN_EXE_pvio"))
        .args(["xenstored", "--help"])
        .output()
        .unwrap();
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    for flag in [
        "--socket",
        "--hvd-socket",
        "--quota-nodes",
        "--quota-node-size",
        "--quota-watches",
        "--quota-transactions",
        "--quota-outstanding",
        "--quota-transaction-nodes",
        "--quota-perms",
        "--quota-path-max",
        "--log-level",
        "XENSTORED_PATH",
    ] {
        assert!(text.contains(flag), "--help lacks {flag}:\n{text}");
    }
}

#[test]
fn sigterm_exits_cleanly_and_removes_the_socket() {
    let mut d = Xenstored::start("sigterm");
    let sock = d.sock.clone();
    let status = d.stop();
    assert!(status.success(), "{status:?}\n{}", d.log());
    assert!(!sock.exists(), "socket left behind");
    assert!(d.log().contains("xenstored stopping"));
}

#[test]
fn stale_socket_is_replaced_and_other_files_are_refused() {
    let dir = std::env::temp_dir().join(format!("pvio-xst-{}-stale", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("xs.sock");
    // A crashed daemon leaves its socket file behind (dropping a listener
    // does not unlink it).
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let mut child = Command::new(env!("CARGO_BIN_EXE_pvio"))
        .args(["xenstored", "--socket"])
        .arg(&sock)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let up = xenstored_common::wait_until(xenstored_common::DEADLINE, || {
        let Ok(s) = std::os::unix::net::UnixStream::connect(&sock) else {
            return false;
        };
        s.set_read_timeout(Some(xenstored_common::DEADLINE))
            .unwrap();
        let mut r = xenstored_common::Raw { s };
        r.send(2, 1, 0, b"/tool\0");
        r.recv().is_some_and(|(h, _)| h.ty == 2)
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(up, "daemon did not replace the stale socket");
    // A regular file at the socket path is never deleted.
    let file = dir.join("not-a-socket");
    std::fs::write(&file, "precious").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_pvio"))
        .args(["xenstored", "--socket"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "precious");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn quota_flags_reach_the_store() {
    let mut d = Xenstored::start_with("quotas", &["--quota-watches", "7", "--quota-nodes", "55"]);
    let mut c = d.raw();
    let (ty, body) = c.call(0, 0, b"quota\0");
    assert_eq!(ty, 0);
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("watches          :        7"), "{text}");
    assert!(text.contains("nodes            :       55"), "{text}");
    assert!(d.stop().success());
}
