//! Child processes the engine runs (tapdisks and guests): spawned with their
//! output in a log file and, when configured, into a CPU cgroup; reaped by a
//! task of their own, so anyone can wait for the exit or ask for a signal
//! without racing the reaper (a signal is only sent to a pid not reaped yet).

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use rustix::process::Signal;
use tokio::sync::{mpsc, watch};

use crate::cgroup::CpuGroup;

/// A supervised child process. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Proc {
    pid: u32,
    exited: watch::Receiver<Option<ExitStatus>>,
    signals: mpsc::UnboundedSender<Signal>,
}

impl Proc {
    /// [`Proc::spawn`] on a blocking thread. The move into the group waits
    /// for an RCU grace period on cgroup v1 (~7 ms here): done on the
    /// engine's one thread, it held up every other plug of a 10-disk VM,
    /// whose xenstore trees then took 2.5 ms more each. The child starts
    /// up meanwhile. The engine never drops a plug or a start half-way;
    /// a caller that did would leave the spawned child running.
    pub async fn spawn_in_background(
        cmd: tokio::process::Command,
        log: PathBuf,
        cgroup: Option<CpuGroup>,
    ) -> std::io::Result<Self> {
        tokio::task::spawn_blocking(move || Self::spawn(cmd, &log, cgroup.as_ref()))
            .await
            .map_err(|e| std::io::Error::other(format!("spawning thread failed: {e}")))?
    }

    /// Spawns `cmd` with stdin from /dev/null and stdout and stderr appended
    /// to `log`, then moves it into `cgroup`. A process that cannot be
    /// moved is killed and the error returned.
    pub fn spawn(
        mut cmd: tokio::process::Command,
        log: &Path,
        cgroup: Option<&CpuGroup>,
    ) -> std::io::Result<Self> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .kill_on_drop(false);
        let mut child = cmd.spawn()?;
        let pid = child
            .id()
            .ok_or_else(|| std::io::Error::other("the child has no pid"))?;
        if let Some(g) = cgroup {
            if let Err(e) = g.add_pid(pid) {
                let _ = child.start_kill();
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("moving pid {pid} into {}: {e}", g.path().display()),
                ));
            }
        }
        let (tx, exited) = watch::channel(None);
        let (signals, mut sig_rx) = mpsc::unbounded_channel::<Signal>();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    st = child.wait() => {
                        let st = match st {
                            Ok(st) => st,
                            Err(e) => {
                                tracing::warn!(pid, "waiting for a child: {e}");
                                std::os::unix::process::ExitStatusExt::from_raw(-1)
                            }
                        };
                        tx.send_replace(Some(st));
                        return;
                    }
                    Some(sig) = sig_rx.recv() => {
                        // Not reaped yet, so the pid is still this child's.
                        if let Some(id) = child.id() {
                            if let Some(p) = rustix::process::Pid::from_raw(id as i32) {
                                let _ = rustix::process::kill_process(p, sig);
                            }
                        }
                    }
                }
            }
        });
        Ok(Self {
            pid,
            exited,
            signals,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// How it exited, if it did.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        *self.exited.borrow()
    }

    /// Sends a signal (nothing if it exited).
    pub fn signal(&self, sig: Signal) {
        let _ = self.signals.send(sig);
    }

    /// Waits for the exit.
    pub async fn wait(&self) -> ExitStatus {
        let mut rx = self.exited.clone();
        // The reaper drops its sender only after sending the status.
        let st = rx.wait_for(Option::is_some).await.ok().and_then(|st| *st);
        st.or_else(|| self.exit_status())
            .unwrap_or_else(|| std::os::unix::process::ExitStatusExt::from_raw(-1))
    }

    /// Waits for the exit at most `timeout`.
    pub async fn wait_timeout(&self, timeout: Duration) -> Option<ExitStatus> {
        tokio::time::timeout(timeout, self.wait()).await.ok()
    }

    /// Stops it: SIGTERM, then SIGKILL after `grace`.
    pub async fn stop(&self, grace: Duration) -> ExitStatus {
        if let Some(st) = self.exit_status() {
            return st;
        }
        self.signal(Signal::TERM);
        if let Some(st) = self.wait_timeout(grace).await {
            return st;
        }
        self.kill().await
    }

    /// Kills it (SIGKILL) and waits for the exit.
    pub async fn kill(&self) -> ExitStatus {
        self.signal(Signal::KILL);
        self.wait().await
    }
}

/// The last `max` bytes of a log file, for error messages.
pub fn log_tail(path: &Path, max: usize) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let start = text.len().saturating_sub(max);
    let tail = String::from_utf8_lossy(&text[start..]);
    tail.trim().to_string()
}
