//! Shared by the `xenstored_*` system tests: start the real `pvio
//! xenstored` in a private directory, wait for conditions with deadlines,
//! and speak the raw wire protocol.
#![allow(dead_code)]

use pvio_xenstore::codec::{encode_message, Header, HEADER_LEN};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Generous deadline for conditions that hold within milliseconds normally.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// Polls `f` until it holds or `limit` passes; returns whether it held.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A running `pvio xenstored`.
pub struct Xenstored {
    pub child: Child,
    pub dir: PathBuf,
    pub sock: PathBuf,
}

impl Xenstored {
    pub fn start(name: &str) -> Self {
        Self::start_with(name, &[])
    }

    pub fn start_with(name: &str, args: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!("pvio-xst-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("xs.sock");
        let log = std::fs::File::create(dir.join("log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_pvio"))
            .arg("xenstored")
            .arg("--socket")
            .arg(&sock)
            .args(args)
            .env("PVIO_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn pvio xenstored");
        let mut d = Self { child, dir, sock };
        let ok = wait_until(DEADLINE, || UnixStream::connect(&d.sock).is_ok());
        assert!(ok, "xenstored did not come up: {}", d.log());
        assert!(d.alive());
        d
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    /// A command with `XENSTORED_PATH` pointing at this daemon.
    pub fn cmd(&self, prog: &str) -> Command {
        let mut c = Command::new(prog);
        c.env("XENSTORED_PATH", &self.sock);
        c
    }

    /// Runs a command to completion; (success, stdout, stderr).
    pub fn run(&self, prog: &str, args: &[&str]) -> (bool, String, String) {
        let o = self.cmd(prog).args(args).output().expect(prog);
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }

    /// SIGTERM, then waits for the exit.
    pub fn stop(&mut self) -> ExitStatus {
        let pid = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let mut status = None;
        let ok = wait_until(DEADLINE, || {
            status = self.child.try_wait().ok().flatten();
            status.is_some()
        });
        assert!(ok, "xenstored ignored SIGTERM");
        status.unwrap()
    }

    pub fn raw(&self) -> Raw {
        Raw::connect(&self.sock)
    }
}

impl Drop for Xenstored {
    fn drop(&mut self) {
        if self.alive() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A raw wire-protocol client with blocking I/O and a read timeout.
pub struct Raw {
    pub s: UnixStream,
}

impl Raw {
    pub fn connect(p: &Path) -> Self {
        let s = UnixStream::connect(p).unwrap();
        s.set_read_timeout(Some(DEADLINE)).unwrap();
        Self { s }
    }

    pub fn send(&mut self, ty: u32, req_id: u32, tx: u32, payload: &[u8]) {
        let mut m = Vec::new();
        encode_message(&mut m, ty, req_id, tx, payload);
        self.s.write_all(&m).unwrap();
    }

    /// The next message, or `None` on EOF (or a reset connection).
    pub fn recv(&mut self) -> Option<(Header, Vec<u8>)> {
        let mut h = [0u8; HEADER_LEN];
        if self.s.read_exact(&mut h).is_err() {
            return None;
        }
        let h = Header::decode(&h).unwrap();
        let mut body = vec![0; h.len as usize];
        self.s.read_exact(&mut body).ok()?;
        Some((h, body))
    }

    /// Sends a request and returns the reply (skipping watch events).
    pub fn call(&mut self, ty: u32, tx: u32, payload: &[u8]) -> (u32, Vec<u8>) {
        self.send(ty, 4242, tx, payload);
        loop {
            let (h, b) = self.recv().expect("reply");
            if h.ty != 15 {
                assert_eq!(h.req_id, 4242);
                return (h.ty, b);
            }
        }
    }
}
