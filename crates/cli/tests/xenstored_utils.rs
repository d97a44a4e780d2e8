//! Debian's xenstore-utils (xenstore-write, -read, -ls, -list, -exists,
//! -rm, -chmod, -watch) against `pvio xenstored` via XENSTORED_PATH.

mod xenstored_common;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use xenstored_common::{Xenstored, DEADLINE};

#[test]
fn read_write_ls_list_exists_rm_chmod() {
    let mut d = Xenstored::start("utils");
    let ok = |r: (bool, String, String)| {
        assert!(r.0, "command failed: {}", r.2);
        r.1
    };
    ok(d.run(
        "xenstore-write",
        &["/vm/name", "guest-1", "/vm/memory", "1024"],
    ));
    assert_eq!(
        ok(d.run("xenstore-read", &["/vm/name", "/vm/memory"])),
        "guest-1\n1024\n"
    );
    assert_eq!(ok(d.run("xenstore-list", &["/vm"])), "name\nmemory\n");
    assert_eq!(
        ok(d.run("xenstore-ls", &["/vm"])),
        "name = \"guest-1\"\nmemory = \"1024\"\n"
    );
    assert_eq!(
        ok(d.run("xenstore-ls", &["/"])),
        "tool = \"\"\n xenstored = \"\"\nvm = \"\"\n name = \"guest-1\"\n memory = \"1024\"\n"
    );
    assert!(d.run("xenstore-exists", &["/vm/name"]).0);
    assert!(!d.run("xenstore-exists", &["/vm/nothing"]).0);
    let (success, _, err) = d.run("xenstore-read", &["/vm/nothing"]);
    assert!(!success);
    assert!(err.contains("couldn't read path /vm/nothing"), "{err}");
    // Permissions.
    ok(d.run("xenstore-chmod", &["/vm/name", "n0", "r5", "b7"]));
    let ls = ok(d.run("xenstore-ls", &["-p", "/vm"]));
    assert!(ls.contains("(n0,r5,b7)"), "{ls}");
    ok(d.run("xenstore-chmod", &["-r", "/vm", "r0"]));
    let ls = ok(d.run("xenstore-ls", &["-p", "/vm"]));
    assert_eq!(ls.matches("(r0)").count(), 2, "{ls}");
    // Recursive remove; removing a missing child of an existing node is fine.
    ok(d.run("xenstore-write", &["/vm/device/vbd/51712/state", "1"]));
    ok(d.run("xenstore-rm", &["/vm/device"]));
    assert_eq!(ok(d.run("xenstore-list", &["/vm"])), "name\nmemory\n");
    ok(d.run("xenstore-rm", &["/vm/not-there"]));
    assert!(!d.run("xenstore-rm", &["/no/parent"]).0);
    // Relative paths resolve under /local/domain/0.
    ok(d.run("xenstore-write", &["rel/key", "v"]));
    assert_eq!(
        ok(d.run("xenstore-read", &["/local/domain/0/rel/key"])),
        "v\n"
    );
    assert!(d.alive());
    assert!(d.stop().success());
}

#[test]
fn xenstore_watch_sees_changes() {
    let d = Xenstored::start("watch");
    let mut w = d
        .cmd("xenstore-watch")
        .args(["-n", "3", "/wt"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let out = w.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // The watch fires once when registered...
    assert_eq!(rx.recv_timeout(DEADLINE).unwrap(), "/wt");
    // ...then on each change at or below the path.
    assert!(d.run("xenstore-write", &["/wt/a", "1"]).0);
    assert_eq!(rx.recv_timeout(DEADLINE).unwrap(), "/wt/a");
    assert!(d.run("xenstore-write", &["/other", "1"]).0);
    assert!(d.run("xenstore-rm", &["/wt"]).0);
    assert_eq!(rx.recv_timeout(DEADLINE).unwrap(), "/wt");
    assert!(
        w.wait().unwrap().success(),
        "xenstore-watch -n 3 exits after 3 events"
    );
}
