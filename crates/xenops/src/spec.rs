//! What the toolstack asks the lifecycle engine to run.

use std::path::PathBuf;
use std::time::Duration;

/// One virtual disk of a VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VbdSpec {
    /// The VBD's device id (`virtual-device`; xvda = 51712).
    pub devid: u32,
    /// The VDI's image file.
    pub image: PathBuf,
    /// Mode RW (else RO).
    pub writable: bool,
    /// How long the SR takes to attach (and to detach) the VDI: the SR's
    /// `attach-delay-ms`, standing in for slow storage layers.
    pub attach_delay: Duration,
    /// Extra backend keys (`pvio-polling`, `pvio-split-size`, ...).
    pub backend_keys: Vec<(String, String)>,
}

/// What the guest process runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Workload {
    /// Connect the disks and wait.
    Idle,
    /// An fio-like job (`pvio guest --job SPEC`).
    Job(String),
    /// Read this many MiB from the first disk, then report ready in the
    /// xenstore (`data/ready = 1`).
    BootRead(u32),
    /// An NBD export of the first disk on this socket.
    Nbd(PathBuf),
}

/// A VM to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmSpec {
    /// The toolstack's VM uuid.
    pub uuid: String,
    pub name: String,
    pub memory_mib: u32,
    pub vcpus: u32,
    pub vbds: Vec<VbdSpec>,
    pub workload: Workload,
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Workload::Idle => f.write_str("idle"),
            Workload::Job(s) => write!(f, "job:{s}"),
            Workload::BootRead(m) => write!(f, "boot-read:{m}"),
            Workload::Nbd(p) => write!(f, "nbd:{}", p.display()),
        }
    }
}

impl std::str::FromStr for Workload {
    type Err = String;

    /// `idle`, `job:SPEC` (an fio-like job, e.g.
    /// `job:rw=randrw,bs=4k,iodepth=8,runtime=5s,verify=crc32c`),
    /// `boot-read:MIB` or `nbd:SOCKET`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, arg) = match s.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (s, None),
        };
        match (kind, arg) {
            ("idle", None) => Ok(Workload::Idle),
            ("job", Some(spec)) if !spec.is_empty() => Ok(Workload::Job(spec.to_string())),
            ("boot-read", Some(m)) => m
                .parse()
                .map(Workload::BootRead)
                .map_err(|_| format!("boot-read needs a size in MiB, not {m:?}")),
            ("nbd", Some(p)) if !p.is_empty() => Ok(Workload::Nbd(PathBuf::from(p))),
            _ => Err(format!(
                "unknown workload {s:?}: expected idle, job:SPEC, boot-read:MIB or nbd:SOCKET"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_round_trip_as_text() {
        for w in [
            Workload::Idle,
            Workload::Job("rw=randread,bs=4k".into()),
            Workload::BootRead(32),
            Workload::Nbd("/tmp/x.sock".into()),
        ] {
            assert_eq!(w.to_string().parse::<Workload>(), Ok(w));
        }
        for bad in ["", "job", "job:", "boot-read:x", "reboot", "idle:1"] {
            assert!(bad.parse::<Workload>().is_err(), "{bad:?} accepted");
        }
    }
}
