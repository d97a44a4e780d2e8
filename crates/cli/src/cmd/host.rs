//! `pvio host up`: one foreground supervisor for a host's control daemons —
//! `pvio hvd`, `pvio xenstored` and `pvio toolstackd` — in a state
//! directory. The daemons (and the supervisor) run in the `pvio-control` CPU
//! cgroup with 10× the share of `pvio-datapath`, where the toolstack puts
//! each VM's guest and tapdisks (XenServer's control.slice). SIGTERM or
//! Ctrl-C stops every VM (toolstackd shuts them down), then xenstored and
//! hvd, and removes the sockets.
//!
//! The state directory holds the sockets, `logs/` of each daemon, the
//! toolstack's database, the SRs' default directories and each VM's logs.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args as ClapArgs, Subcommand};
use pvio_xenops::affinity;
use pvio_xenops::cgroup::{self, CpuGroup, Hierarchy};
use pvio_xenops::process::{log_tail, Proc};

/// `pvio host ...`.
#[derive(Subcommand, Debug)]
pub enum HostCommand {
    /// Start hvd, xenstored and toolstackd in the foreground until SIGTERM or Ctrl-C.
    Up(UpArgs),
}

/// Options of `pvio host up`.
#[derive(ClapArgs, Debug)]
#[command(after_help = "Then, from another shell:\n  \
    export PVIO_STATE=DIR\n  pvio sr-create name-label=local type=file\n  \
    pvio vm-list\nStop with Ctrl-C or SIGTERM: every VM is shut down first.")]
pub struct UpArgs {
    /// The host's state directory (sockets, logs, the toolstack's database).
    #[arg(long, env = "PVIO_STATE", value_name = "DIR")]
    pub state: PathBuf,
    /// Device operations in flight host-wide (xenopsd's worker-pool-size).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub worker_pool_size: u32,
    /// Device operations in flight per VM.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=255))]
    pub max_parallel_per_vm: u32,
    /// Seconds a guest gets to shut down before it is killed.
    #[arg(long, default_value_t = 30)]
    pub shutdown_timeout_s: u64,
    /// Do not put the daemons in a CPU cgroup of their own (for comparison:
    /// the control plane then competes with the datapath on equal terms).
    #[arg(long)]
    pub no_control_slice: bool,
    /// CPUs the control slice runs on (a list like `0-1,4`; default: the
    /// first eighth of the CPUs, at least one). A mostly idle cgroup spread
    /// over every CPU gets only part of its share where it wakes.
    #[arg(long, value_name = "LIST")]
    pub control_cpus: Option<String>,
    /// Leave VMs' processes wherever the scheduler puts them (by default,
    /// while the CPUs are contended, each VM's guest and tapdisks share the
    /// VM's CPU and the VMs rotate over the CPUs, so a storm is fair).
    #[arg(long)]
    pub no_vm_placement: bool,
    /// Nodes a guest may own in the xenstore (a VM of 255 disks needs ~3000).
    #[arg(long, default_value_t = pvio_xenops::GUEST_XS_QUOTA_NODES)]
    pub xenstore_quota_nodes: u32,
    /// Watches a guest may hold (one or two per disk).
    #[arg(long, default_value_t = pvio_xenops::GUEST_XS_QUOTA_WATCHES)]
    pub xenstore_quota_watches: u32,
}

/// Runs `pvio host ...`.
pub fn run(cmd: HostCommand) -> anyhow::Result<()> {
    match cmd {
        HostCommand::Up(a) => up(a),
    }
}

/// Where a host's files are, given its state directory.
pub struct Layout {
    pub state: PathBuf,
}

impl Layout {
    pub fn hvd_socket(&self) -> PathBuf {
        self.state.join("hvd.sock")
    }
    pub fn xenstored_socket(&self) -> PathBuf {
        self.state.join("xenstored.sock")
    }
    pub fn toolstackd_socket(&self) -> PathBuf {
        self.state.join("toolstackd.sock")
    }
    pub fn logs(&self) -> PathBuf {
        self.state.join("logs")
    }
}

/// The control and datapath groups, if cgroups are usable here.
fn control_slice() -> Option<(CpuGroup, CpuGroup)> {
    let Some(h) = Hierarchy::detect() else {
        tracing::warn!("no CPU cgroup controller: the control plane is not isolated");
        return None;
    };
    let made = CpuGroup::top(&h, cgroup::CONTROL_GROUP, cgroup::CONTROL_SHARES).and_then(|c| {
        let d = CpuGroup::top(&h, cgroup::DATAPATH_GROUP, cgroup::DATAPATH_SHARES)?;
        Ok((c, d))
    });
    match made {
        Ok(g) => Some(g),
        Err(e) => {
            tracing::warn!(
                "cannot create the CPU cgroups ({e}): the control plane is not isolated"
            );
            None
        }
    }
}

/// Holds an exclusive lock on the state directory for the supervisor's life.
fn lock_state(state: &Path) -> anyhow::Result<std::fs::File> {
    let path = state.join("host.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(f),
        Err(rustix::io::Errno::WOULDBLOCK) => bail!(
            "another pvio host is running with the state directory {}",
            state.display()
        ),
        Err(e) => Err(e).context("locking the state directory"),
    }
}

/// Waits until `ready` holds, the process exits, or the deadline passes.
async fn wait_ready(
    name: &str,
    p: &Proc,
    log: &Path,
    ready: impl Fn() -> bool,
) -> anyhow::Result<()> {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(st) = p.exit_status() {
            bail!("{name} exited at start ({st}):\n{}", log_tail(log, 1500));
        }
        if ready() {
            return Ok(());
        }
        if Instant::now() > end {
            bail!(
                "{name} did not become ready within 30 s:\n{}",
                log_tail(log, 1500)
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn can_connect(path: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(path).is_ok()
}

fn up(a: UpArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&a.state)
        .with_context(|| format!("creating the state directory {}", a.state.display()))?;
    let state = std::fs::canonicalize(&a.state)?;
    let _lock = lock_state(&state)?;
    let l = Layout { state };
    std::fs::create_dir_all(l.logs())?;
    for s in [l.hvd_socket(), l.xenstored_socket(), l.toolstackd_socket()] {
        // Left by a host that was killed: the lock says no one serves them.
        let _ = std::fs::remove_file(s);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(supervise(a, l))
}

async fn supervise(a: UpArgs, l: Layout) -> anyhow::Result<()> {
    let slice = if a.no_control_slice {
        None
    } else {
        control_slice()
    };
    let control = slice.as_ref().map(|(c, _)| c);
    let mut control_cpus = None;
    if let Some(c) = control {
        c.add_pid(std::process::id())?;
        let cpus = match &a.control_cpus {
            Some(list) => {
                affinity::parse_cpus(list).map_err(|e| anyhow::anyhow!("--control-cpus: {e}"))?
            }
            None => {
                let n = std::thread::available_parallelism().map_or(1, |n| n.get());
                Some(affinity::control_cpus(n))
            }
        };
        // This thread starts the daemons: they inherit it.
        match affinity::pin(cpus.as_deref()) {
            Ok(()) => control_cpus = cpus,
            Err(e) => tracing::warn!("cannot pin the control slice to its CPUs: {e}"),
        }
    }
    let exe = std::env::current_exe().context("locating the pvio binary")?;
    let log_level = std::env::var("PVIO_LOG").unwrap_or_else(|_| "info".into());
    let spawn = |name: &str, args: Vec<std::ffi::OsString>| -> anyhow::Result<(Proc, PathBuf)> {
        let log = l.logs().join(format!("{name}.log"));
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.args(args).env("PVIO_LOG", &log_level);
        let p = Proc::spawn(cmd, &log, control).with_context(|| format!("starting {name}"))?;
        Ok((p, log))
    };
    let os = |s: &str| std::ffi::OsString::from(s);
    let path = |p: PathBuf| p.into_os_string();

    let mut started: Vec<(&str, Proc)> = Vec::new();
    let result = async {
        let (hvd, log) = spawn("hvd", vec![os("hvd"), os("--socket"), path(l.hvd_socket())])?;
        started.push(("hvd", hvd.clone()));
        let hs = l.hvd_socket();
        wait_ready("hvd", &hvd, &log, || {
            pvio_hv::HvClient::connect_host(&hs).is_ok()
        })
        .await?;

        let (xsd, log) = spawn(
            "xenstored",
            vec![
                os("xenstored"),
                os("--socket"),
                path(l.xenstored_socket()),
                os("--hvd-socket"),
                path(l.hvd_socket()),
                os("--quota-nodes"),
                os(&a.xenstore_quota_nodes.to_string()),
                os("--quota-watches"),
                os(&a.xenstore_quota_watches.to_string()),
            ],
        )?;
        started.push(("xenstored", xsd.clone()));
        let xs = l.xenstored_socket();
        wait_ready("xenstored", &xsd, &log, || can_connect(&xs)).await?;

        let mut args = vec![
            os("toolstackd"),
            os("--state"),
            path(l.state.clone()),
            os("--socket"),
            path(l.toolstackd_socket()),
            os("--hvd-socket"),
            path(l.hvd_socket()),
            os("--xenstore-socket"),
            path(l.xenstored_socket()),
            os("--worker-pool-size"),
            os(&a.worker_pool_size.to_string()),
            os("--max-parallel-per-vm"),
            os(&a.max_parallel_per_vm.to_string()),
            os("--shutdown-timeout-s"),
            os(&a.shutdown_timeout_s.to_string()),
        ];
        if let Some((_, d)) = &slice {
            args.push(os("--datapath-cgroup"));
            args.push(path(d.path().to_path_buf()));
        }
        if a.no_vm_placement {
            args.push(os("--no-vm-placement"));
        }
        let (tsd, log) = spawn("toolstackd", args)?;
        started.push(("toolstackd", tsd.clone()));
        let ts = l.toolstackd_socket();
        wait_ready("toolstackd", &tsd, &log, || can_connect(&ts)).await?;
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = result {
        stop_all(&started).await;
        return Err(e);
    }
    println!(
        "pvio host up: state {}\n  hvd        {}\n  xenstored  {}\n  toolstackd {}\n  control slice: {}\n\
         Use `PVIO_STATE={} pvio vm-list`; Ctrl-C or SIGTERM stops every VM and the host.",
        l.state.display(),
        l.hvd_socket().display(),
        l.xenstored_socket().display(),
        l.toolstackd_socket().display(),
        match &slice {
            Some((c, d)) => format!(
                "{} (cpu share {}, CPUs {}) vs {} (cpu share {})",
                c.path().display(),
                cgroup::CONTROL_SHARES,
                control_cpus
                    .as_deref()
                    .map_or("all".into(), affinity::format_cpus),
                d.path().display(),
                cgroup::DATAPATH_SHARES
            ),
            None => "off".into(),
        },
        l.state.display(),
    );
    use std::io::Write;
    let _ = std::io::stdout().flush();

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut died = tokio::task::JoinSet::new();
    for (name, p) in &started {
        let (name, p) = (name.to_string(), p.clone());
        died.spawn(async move { (name, p.wait().await) });
    }
    let outcome = tokio::select! {
        _ = term.recv() => Ok(()),
        _ = int.recv() => Ok(()),
        Some(Ok((name, st))) = died.join_next() => Err(anyhow::anyhow!(
            "{name} exited ({st}); stopping the host. Its log: {}",
            l.logs().join(format!("{name}.log")).display()
        )),
    };
    eprintln!("pvio host: stopping (VMs first)");
    stop_all(&started).await;
    for s in [l.hvd_socket(), l.xenstored_socket(), l.toolstackd_socket()] {
        let _ = std::fs::remove_file(s);
    }
    if let Some((c, d)) = &slice {
        // Shared with other hosts on this machine: removed only when empty.
        let _ = d.remove();
        if let Some(root) = c.path().parent() {
            let _ = std::fs::write(root.join("cgroup.procs"), std::process::id().to_string());
        }
        let _ = c.remove();
    }
    eprintln!("pvio host: stopped");
    outcome
}

/// Stops daemons in reverse order: toolstackd first (it shuts every VM
/// down, so it gets long), then xenstored and hvd.
async fn stop_all(started: &[(&str, Proc)]) {
    for (name, p) in started.iter().rev() {
        let grace = if *name == "toolstackd" {
            Duration::from_secs(180)
        } else {
            Duration::from_secs(10)
        };
        let st = p.stop(grace).await;
        tracing::info!("{name} stopped ({st})");
    }
}
