//! Helpers for benchmarks that run several processes: a scratch directory,
//! a private hvd, spawning `pvio internal ...` children, CPU pinning, and
//! reading a child's one-line JSON result.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

/// A scratch directory, removed on drop.
pub struct ScratchDir(pub PathBuf);

impl ScratchDir {
    /// Creates `$TMPDIR/pvio-bench-<tag>-<pid>`.
    pub fn new(tag: &str) -> anyhow::Result<Self> {
        let p = std::env::temp_dir().join(format!("pvio-bench-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
        Ok(Self(p))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        // PVIO_BENCH_KEEP=1 keeps the logs of a run for a post-mortem.
        if std::env::var_os("PVIO_BENCH_KEEP").is_some() {
            eprintln!("kept {}", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `pvio` binary: `$PVIO_BIN` if set (tests set it), else the binary
/// running this benchmark.
pub fn pvio_exe() -> anyhow::Result<PathBuf> {
    match std::env::var_os("PVIO_BIN") {
        Some(p) => Ok(PathBuf::from(p)),
        None => std::env::current_exe().context("locating the pvio binary"),
    }
}

/// A child process killed on drop.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a private `pvio hvd` on `socket` and waits until it accepts.
pub fn start_hvd(socket: &Path) -> anyhow::Result<ChildGuard> {
    let child = Command::new(pvio_exe()?)
        .arg("hvd")
        .arg("--socket")
        .arg(socket)
        .env("PVIO_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .context("starting pvio hvd")?;
    let mut g = ChildGuard(child);
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(st) = g.0.try_wait()? {
            bail!("pvio hvd exited at start: {st}");
        }
        if pvio_hv::HvClient::connect_host(socket).is_ok() {
            return Ok(g);
        }
        if Instant::now() > end {
            bail!("pvio hvd did not start listening on {}", socket.display());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A `pvio internal ...` child speaking lines on stdin/stdout.
pub struct LineChild {
    pub guard: ChildGuard,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl LineChild {
    /// Spawns `pvio <args>` with piped stdin and stdout.
    pub fn spawn(args: &[String]) -> anyhow::Result<Self> {
        let mut child = Command::new(pvio_exe()?)
            .args(args)
            .env("PVIO_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("spawning pvio {}", args.join(" ")))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        Ok(Self {
            guard: ChildGuard(child),
            stdin,
            stdout,
        })
    }

    /// Reads one line (the child must answer; a dead child is an error).
    pub fn read_line(&mut self) -> anyhow::Result<String> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            let st = self.guard.0.wait()?;
            bail!("helper process exited ({st}) before answering");
        }
        Ok(line.trim_end().to_string())
    }

    /// Sends one line.
    pub fn send(&mut self, line: &str) -> anyhow::Result<()> {
        writeln!(self.stdin, "{line}")?;
        self.stdin.flush()?;
        Ok(())
    }

    /// Waits for the child to exit successfully.
    pub fn finish(mut self) -> anyhow::Result<()> {
        let st = self.guard.0.wait()?;
        if !st.success() {
            bail!("helper process failed: {st}");
        }
        Ok(())
    }
}

/// Pins the calling thread to `cpu` (ignored when the CPU does not exist).
pub fn pin_to_cpu(cpu: usize) -> anyhow::Result<()> {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpu >= n {
        return Ok(());
    }
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set).map_err(|e| anyhow!("pinning to CPU {cpu}: {e}"))
}

/// Number of CPUs.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
