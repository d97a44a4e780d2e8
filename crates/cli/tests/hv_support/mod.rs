//! Test support: a real `pvio hvd` process and scriptable guest processes
//! (`pvio internal guest-shell`), with deadlines instead of sleeps.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use pvio_hv::HvClient;

pub const PVIO: &str = env!("CARGO_BIN_EXE_pvio");
pub const DEADLINE: Duration = Duration::from_secs(20);

/// A scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "pvio-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Polls `cond` until it holds or the deadline passes.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + DEADLINE;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A running `pvio hvd`.
pub struct Hvd {
    child: Child,
    pub socket: PathBuf,
    _dir: TempDir,
}

impl Hvd {
    pub fn start(extra: &[&str]) -> Self {
        let dir = TempDir::new("hvd");
        let socket = dir.0.join("hvd.sock");
        let mut child = Command::new(PVIO)
            .arg("hvd")
            .arg("--socket")
            .arg(&socket)
            .args(extra)
            .env("PVIO_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn pvio hvd");
        let end = Instant::now() + DEADLINE;
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                panic!("pvio hvd exited early: {st}");
            }
            if HvClient::connect_host(&socket).is_ok() {
                break;
            }
            assert!(Instant::now() < end, "hvd did not start listening");
            std::thread::sleep(Duration::from_millis(5));
        }
        Hvd {
            child,
            socket,
            _dir: dir,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn host(&self) -> HvClient {
        HvClient::connect_host(&self.socket).expect("connect to hvd")
    }

    /// Open descriptors of the hvd process.
    pub fn fd_count(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .expect("hvd is alive")
            .count()
    }

    /// hvd's descriptors once every client but one probe has gone (the
    /// probe's own socket is not counted).
    pub fn settled_fd_count(&self) -> usize {
        let probe = self.host();
        wait_until("other clients to disconnect", || {
            probe.info().unwrap().connections == 1
        });
        self.fd_count() - 1
    }

    /// Waits until hvd holds exactly `baseline` descriptors when idle.
    pub fn wait_fds_back_to(&self, baseline: usize) {
        let end = Instant::now() + DEADLINE;
        loop {
            let n = self.settled_fd_count();
            if n == baseline {
                return;
            }
            assert!(
                Instant::now() < end,
                "hvd holds {n} descriptors, {baseline} at the start: a leak"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Stops hvd with SIGTERM and returns its exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill").arg(self.pid().to_string()).status();
        let end = Instant::now() + DEADLINE;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(Instant::now() < end, "hvd did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Hvd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A guest process run by `pvio internal guest-shell`.
pub struct Guest {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    pub domid: u16,
}

impl Guest {
    pub fn spawn(socket: &Path, frames: u32) -> Self {
        Self::spawn_with(socket, &["--frames", &frames.to_string()])
    }

    pub fn spawn_with(socket: &Path, args: &[&str]) -> Self {
        let mut child = Command::new(PVIO)
            .args(["internal", "guest-shell", "--socket"])
            .arg(socket)
            .args(args)
            .env("PVIO_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn guest-shell");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                match line {
                    Ok(l) => {
                        if tx.send(l).is_err() {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
        });
        let mut g = Guest {
            child,
            stdin,
            lines: rx,
            domid: 0,
        };
        g.domid = g.ok("domid").parse().unwrap();
        g
    }

    /// Sends a command; returns `Ok(answer)` or `Err(message)`.
    pub fn cmd(&mut self, line: &str) -> Result<String, String> {
        writeln!(self.stdin, "{line}").expect("guest stdin");
        self.stdin.flush().unwrap();
        let ans = self
            .lines
            .recv_timeout(DEADLINE)
            .unwrap_or_else(|_| panic!("guest did not answer {line:?}"));
        if let Some(rest) = ans.strip_prefix("ok") {
            Ok(rest.trim_start().to_string())
        } else if let Some(rest) = ans.strip_prefix("err") {
            Err(rest.trim_start().to_string())
        } else {
            panic!("unexpected answer {ans:?} to {line:?}")
        }
    }

    /// Sends a command that must succeed.
    pub fn ok(&mut self, line: &str) -> String {
        self.cmd(line)
            .unwrap_or_else(|e| panic!("{line:?} failed in the guest: {e}"))
    }

    /// Kills the guest with SIGKILL (no clean-up of its own).
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Asks the guest to exit and waits.
    pub fn exit(mut self) {
        let _ = writeln!(self.stdin, "exit");
        let _ = self.child.wait();
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
