//! A host that runs whole VMs for benchmarks and tests: [`MiniHost`]'s hvd
//! and xenstored plus the lifecycle engine (`pvio-xenops`) with a datapath
//! CPU cgroup of its own. Several engines with different limits may share
//! one host (e.g. sequential against parallel plug in the same run).

use std::path::PathBuf;
use std::time::Duration;

use pvio_xenops::cgroup::{CpuGroup, Hierarchy};
use pvio_xenops::{VbdSpec, VmEvent, Xenops, XenopsConfig};

use crate::host::{make_image, xvd_devid, MiniHost};
use crate::procs::pvio_exe;

/// hvd, xenstored and a runtime for engines.
pub struct VmHost {
    pub mini: MiniHost,
    pub rt: tokio::runtime::Runtime,
    /// This host's datapath group (removed on drop when empty).
    pub cgroup: Option<CpuGroup>,
    /// Engines place VMs on their CPUs under contention
    /// ([`pvio_xenops::placement`]); on by default, as in `pvio host up`.
    pub placement: bool,
}

impl VmHost {
    /// Starts hvd and xenstored in a scratch directory.
    pub fn start(tag: &str) -> anyhow::Result<Self> {
        let mini = MiniHost::start(tag)?;
        let cgroup = Hierarchy::detect().and_then(|h| {
            CpuGroup::top(
                &h,
                &format!("pvio-{tag}-{}", std::process::id()),
                pvio_xenops::cgroup::DATAPATH_SHARES,
            )
            .ok()
        });
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        Ok(Self {
            mini,
            rt,
            cgroup,
            placement: true,
        })
    }

    /// Starts a lifecycle engine with these limits.
    pub fn engine(
        &self,
        worker_pool_size: usize,
        max_parallel_per_vm: usize,
    ) -> anyhow::Result<(Xenops, tokio::sync::mpsc::UnboundedReceiver<VmEvent>)> {
        let cfg = XenopsConfig {
            hvd_socket: self.mini.hvd_socket.clone(),
            xenstore_socket: self.mini.xs_socket.clone(),
            pvio_bin: pvio_exe()?,
            state_dir: self.mini.dir.0.join("state"),
            worker_pool_size,
            max_parallel_per_vm,
            shutdown_timeout: Duration::from_secs(30),
            datapath_cgroup: self.cgroup.clone(),
            placement: self.placement,
        };
        let _g = self.rt.enter();
        Ok(Xenops::start(cfg)?)
    }

    /// `n` disk images of `mib` MiB each (filled, so reads are real).
    pub fn images(&self, prefix: &str, n: usize, mib: u64) -> anyhow::Result<Vec<PathBuf>> {
        (0..n)
            .map(|i| make_image(&self.mini.dir.0, &format!("{prefix}-{i}.img"), mib << 20))
            .collect()
    }

    /// VBD specs for images: xvda, xvdb, ...
    pub fn vbds(images: &[PathBuf], attach_delay: Duration) -> Vec<VbdSpec> {
        images
            .iter()
            .enumerate()
            .map(|(i, p)| VbdSpec {
                devid: xvd_devid(i as u32),
                image: p.clone(),
                writable: true,
                attach_delay,
                backend_keys: Vec::new(),
            })
            .collect()
    }
}

impl Drop for VmHost {
    fn drop(&mut self) {
        if let Some(g) = &self.cgroup {
            let _ = g.remove();
        }
    }
}
