//! Xen's own client library against `pvio xenstored`: a C program linked
//! with -lxenstore (tests/c/xs_client.c) uses transactions, a conflict that
//! must yield EAGAIN and succeed on retry, watches and domain calls.

mod xenstored_common;
use xenstored_common::Xenstored;

#[test]
fn libxenstore_program_passes() {
    let mut d = Xenstored::start("libxs");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/xs_client.c");
    let bin = d.dir.join("xs_client");
    let cc = std::process::Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&bin)
        .arg(src)
        .arg("-lxenstore")
        .output()
        .expect("cc");
    assert!(
        cc.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = d
        .cmd(bin.to_str().unwrap())
        .output()
        .expect("run xs_client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "xs_client failed:\n{stdout}\n{}\ndaemon log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    assert!(stdout.contains("conflicting commit: EAGAIN"));
    assert!(stdout.contains("libxenstore: all checks passed"));
    assert!(d.alive());
    assert!(d.stop().success());
}
