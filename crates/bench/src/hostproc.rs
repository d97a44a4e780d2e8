//! A whole pvio host as a child process (`pvio host up --state DIR`), for
//! benchmarks that go through the toolstack as a user would: xe-style
//! commands and JSON-RPC calls. Stopped (SIGTERM: every VM shut down first)
//! when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::procs::{pvio_exe, ScratchDir};

/// A running `pvio host up`.
pub struct HostProc {
    pub dir: ScratchDir,
    child: Option<Child>,
}

impl HostProc {
    /// Starts a host in a scratch directory with extra `host up` options
    /// and waits until toolstackd answers.
    pub fn start(tag: &str, extra: &[&str]) -> anyhow::Result<Self> {
        let dir = ScratchDir::new(tag)?;
        let state = dir.0.join("state");
        let log = std::fs::File::create(dir.0.join("host.log"))?;
        let child = Command::new(pvio_exe()?)
            .args(["host", "up", "--state"])
            .arg(&state)
            .args(extra)
            .env(
                "PVIO_LOG",
                std::env::var("PVIO_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting pvio host up")?;
        let mut h = Self {
            dir,
            child: Some(child),
        };
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(c) = h.child.as_mut() {
                if let Some(st) = c.try_wait()? {
                    h.child = None;
                    bail!(
                        "pvio host up exited ({st}): {}",
                        std::fs::read_to_string(h.dir.0.join("host.log")).unwrap_or_default()
                    );
                }
            }
            if h.rpc().is_ok_and(|mut c| {
                c.call("host.get_all_records", serde_json::Value::Null)
                    .is_ok()
            }) {
                return Ok(h);
            }
            if Instant::now() > end {
                bail!("the host did not come up within 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The host's state directory.
    pub fn state(&self) -> PathBuf {
        self.dir.0.join("state")
    }

    /// toolstackd's socket.
    pub fn socket(&self) -> PathBuf {
        self.state().join("toolstackd.sock")
    }

    /// A JSON-RPC connection to toolstackd.
    pub fn rpc(&self) -> anyhow::Result<pvio_toolstack::rpc::Client> {
        Ok(pvio_toolstack::rpc::Client::connect(&self.socket())?)
    }

    /// Runs an xe-style command (`pvio vm-create ...`) and returns its
    /// standard output, trimmed.
    pub fn xe(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.xe_command(args)?.output()?;
        if !out.status.success() {
            bail!(
                "pvio {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// The command line of an xe-style command against this host.
    pub fn xe_command(&self, args: &[&str]) -> anyhow::Result<Command> {
        let mut c = Command::new(pvio_exe()?);
        c.args(args)
            .env("PVIO_STATE", self.state())
            .stdin(Stdio::null());
        Ok(c)
    }

    /// Where the host's daemons log.
    pub fn logs(&self) -> PathBuf {
        self.state().join("logs")
    }

    /// Stops the host (SIGTERM, then SIGKILL after `grace`).
    pub fn stop(&mut self, grace: Duration) -> anyhow::Result<()> {
        let Some(mut c) = self.child.take() else {
            return Ok(());
        };
        if let Some(p) = rustix::process::Pid::from_raw(c.id() as i32) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
        }
        let end = Instant::now() + grace;
        loop {
            if let Some(st) = c.try_wait()? {
                if !st.success() {
                    bail!("pvio host up exited with {st}");
                }
                return Ok(());
            }
            if Instant::now() > end {
                let _ = c.kill();
                let _ = c.wait();
                bail!("pvio host up did not stop within {grace:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for HostProc {
    fn drop(&mut self) {
        let _ = self.stop(Duration::from_secs(120));
    }
}

/// Whether `path` is a socket something listens on.
pub fn listening(path: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(path).is_ok()
}
