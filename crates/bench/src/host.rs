//! A minimal host for benchmarks and tests of the datapath: a private
//! `pvio hvd` and `pvio xenstored`, and the few toolstack steps a VBD needs
//! (create the domain, write its xenstore home and the VBD's frontend and
//! backend directories with libxl's permissions, introduce the domain to
//! xenstored, start a tapdisk and the guest process).
//!
//! It is not the toolstack (that is `pvio toolstackd`); it is the smallest
//! correct sequence, kept in one place so benches and tests agree.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use pvio_hv::{CreatedDomain, HvClient};
use pvio_xenops::xs_tree;
use pvio_xenstore::Client;

use crate::procs::{pvio_exe, start_hvd, ChildGuard, ScratchDir};

/// The xvd device id of disk `n` (xvda = 51712), per docs/misc/vbd-interface.txt.
pub fn xvd_devid(n: u32) -> u32 {
    if n < 16 {
        (202 << 8) | (n << 4)
    } else {
        (1 << 28) | (n << 8)
    }
}

/// hvd, xenstored and a runtime to talk to them.
pub struct MiniHost {
    pub dir: ScratchDir,
    pub hvd_socket: PathBuf,
    pub xs_socket: PathBuf,
    _hvd: ChildGuard,
    _xenstored: ChildGuard,
    pub host: HvClient,
    rt: tokio::runtime::Runtime,
    xs: Client,
}

/// A VBD set up by [`MiniHost::add_vbd`].
#[derive(Debug, Clone)]
pub struct Vbd {
    pub domid: u16,
    pub devid: u32,
    pub backend: String,
    pub frontend: String,
}

impl MiniHost {
    /// Starts hvd and xenstored in a scratch directory.
    pub fn start(tag: &str) -> anyhow::Result<Self> {
        let dir = ScratchDir::new(tag)?;
        let hvd_socket = dir.0.join("hvd.sock");
        let xs_socket = dir.0.join("xenstored.sock");
        let hvd = start_hvd(&hvd_socket)?;
        let xenstored = Command::new(pvio_exe()?)
            .arg("xenstored")
            .arg("--socket")
            .arg(&xs_socket)
            .arg("--hvd-socket")
            .arg(&hvd_socket)
            .arg("--quota-nodes")
            .arg(pvio_xenops::GUEST_XS_QUOTA_NODES.to_string())
            .arg("--quota-watches")
            .arg(pvio_xenops::GUEST_XS_QUOTA_WATCHES.to_string())
            .env("PVIO_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .context("starting pvio xenstored")?;
        let mut xenstored = ChildGuard(xenstored);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let end = Instant::now() + Duration::from_secs(20);
        let xs = loop {
            if let Some(st) = xenstored.0.try_wait()? {
                bail!("pvio xenstored exited at start: {st}");
            }
            if let Ok(c) = rt.block_on(Client::connect(&xs_socket)) {
                break c;
            }
            if Instant::now() > end {
                bail!("pvio xenstored did not start");
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let host = HvClient::connect_host(&hvd_socket)?;
        Ok(Self {
            dir,
            hvd_socket,
            xs_socket,
            _hvd: hvd,
            _xenstored: xenstored,
            host,
            rt,
            xs,
        })
    }

    /// Runs an async xenstore operation to completion.
    pub fn xs<T>(
        &self,
        f: impl AsyncFnOnce(&Client) -> Result<T, pvio_xenstore::Error>,
    ) -> anyhow::Result<T> {
        Ok(self.rt.block_on(f(&self.xs))?)
    }

    /// Creates a domain of `memory_mib` and its xenstore home (the
    /// toolstack's layout, [`pvio_xenops::xs_tree::write_domain`]), and
    /// introduces it to xenstored.
    pub fn create_domain(&self, name: &str, memory_mib: u32) -> anyhow::Result<CreatedDomain> {
        let d = self.host.create_domain(name, memory_mib * 256)?;
        let spec = pvio_xenops::VmSpec {
            uuid: format!("minihost-{}", d.domid),
            name: name.to_string(),
            memory_mib,
            vcpus: 1,
            vbds: Vec::new(),
            workload: pvio_xenops::Workload::Idle,
        };
        self.xs(async |xs| {
            xs_tree::write_domain(xs, d.domid, &spec).await?;
            xs.rm(&xs_tree::action_request(d.domid)).await?;
            xs.introduce(
                d.domid,
                u64::from(pvio_hv::memory::STORE_FRAME),
                d.store_port,
            )
            .await?;
            Ok(())
        })?;
        Ok(d)
    }

    /// Writes a VBD's frontend and backend directories (libxl's layout and
    /// permissions, [`pvio_xenops::xs_tree::write_vbd`]) in one transaction.
    /// `extra` adds backend keys such as `pvio-polling`.
    pub fn add_vbd(
        &self,
        domid: u16,
        devid: u32,
        image: &Path,
        writable: bool,
        extra: &[(&str, String)],
    ) -> anyhow::Result<Vbd> {
        let extra: Vec<(String, String)> = extra
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        let p = self
            .xs(async |xs| xs_tree::write_vbd(xs, domid, devid, image, writable, &extra).await)?;
        Ok(Vbd {
            domid,
            devid,
            backend: p.backend,
            frontend: p.frontend,
        })
    }

    /// Starts `pvio tapdisk` for a VBD.
    pub fn start_tapdisk(&self, vbd: &Vbd, extra: &[&str]) -> anyhow::Result<ChildGuard> {
        let child = self
            .tapdisk_command(vbd, extra)?
            .spawn()
            .context("starting pvio tapdisk")?;
        Ok(ChildGuard(child))
    }

    /// Starts `pvio tapdisk` for a VBD and waits until it reaches InitWait
    /// (ready for a frontend).
    pub fn start_tapdisk_ready(&self, vbd: &Vbd, extra: &[&str]) -> anyhow::Result<ChildGuard> {
        let tap = self.start_tapdisk(vbd, extra)?;
        self.wait_for_value(
            &format!("{}/state", vbd.backend),
            "2",
            Duration::from_secs(20),
        )?;
        Ok(tap)
    }

    /// Runs a `pvio guest --job SPEC --json` in domain `d` to its end and
    /// returns its report; an error says how the guest failed.
    pub fn run_job(&self, d: &CreatedDomain, job: &str) -> anyhow::Result<serde_json::Value> {
        let out = self
            .guest_command(d)?
            .args(["--job", job, "--json"])
            .output()
            .context("running pvio guest")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!(
                "guest job {job} failed: {}\nstdout: {stdout}\nstderr: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        serde_json::from_str(&stdout).with_context(|| format!("the guest's report: {stdout}"))
    }

    /// The `pvio tapdisk` command line for a VBD, with `extra` arguments
    /// (the caller may add environment, such as `PVIO_CPUS`, and spawn it).
    pub fn tapdisk_command(&self, vbd: &Vbd, extra: &[&str]) -> anyhow::Result<Command> {
        let stats = self
            .dir
            .0
            .join(format!("tapdisk-{}-{}.json", vbd.domid, vbd.devid));
        let mut c = Command::new(pvio_exe()?);
        c.arg("tapdisk")
            .arg("--backend")
            .arg(&vbd.backend)
            .arg("--hvd-socket")
            .arg(&self.hvd_socket)
            .arg("--xenstore-socket")
            .arg(&self.xs_socket)
            .arg("--stats-file")
            .arg(&stats)
            .args(extra)
            .env(
                "PVIO_LOG",
                std::env::var("PVIO_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null());
        Ok(c)
    }

    /// The stats file a tapdisk started by [`MiniHost::start_tapdisk`] writes.
    pub fn tapdisk_stats(&self, vbd: &Vbd) -> anyhow::Result<serde_json::Value> {
        let p = self
            .dir
            .0
            .join(format!("tapdisk-{}-{}.json", vbd.domid, vbd.devid));
        let text =
            std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        Ok(serde_json::from_str(&text)?)
    }

    /// The `pvio guest` command line for domain `d` (add the workload).
    pub fn guest_command(&self, d: &CreatedDomain) -> anyhow::Result<Command> {
        let mut c = Command::new(pvio_exe()?);
        c.arg("guest")
            .arg("--hvd-socket")
            .arg(&self.hvd_socket)
            .arg("--xenstore-socket")
            .arg(&self.xs_socket)
            .arg("--domid")
            .arg(d.domid.to_string())
            .arg("--token")
            .arg(d.token.to_string())
            .env(
                "PVIO_LOG",
                std::env::var("PVIO_LOG").unwrap_or_else(|_| "warn".into()),
            );
        Ok(c)
    }

    /// Waits until the xenstore node `path` reads `value`.
    pub fn wait_for_value(&self, path: &str, value: &str, timeout: Duration) -> anyhow::Result<()> {
        let end = Instant::now() + timeout;
        loop {
            let v = self.xs(async |xs| xs.try_read(path).await)?;
            if v.as_deref() == Some(value.as_bytes()) {
                return Ok(());
            }
            if Instant::now() > end {
                bail!(
                    "{path} did not become {value:?} (it is {:?})",
                    v.map(|b| String::from_utf8_lossy(&b).into_owned())
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Creates a raw image of `bytes` filled with a pattern (so reads of it are
/// real reads, not holes), under `dir`.
pub fn make_image(dir: &Path, name: &str, bytes: u64) -> anyhow::Result<PathBuf> {
    use std::io::Write;
    let p = dir.join(name);
    let mut f = std::fs::File::create(&p).with_context(|| format!("creating {}", p.display()))?;
    let mut block = vec![0u8; 1 << 20];
    for (i, b) in block.iter_mut().enumerate() {
        *b = (i * 7 + 13) as u8;
    }
    let mut left = bytes;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])?;
        left -= n as u64;
    }
    f.sync_all()?;
    Ok(p)
}
