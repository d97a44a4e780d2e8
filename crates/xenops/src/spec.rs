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
    /// A boot: read the first disk's first MiBs, then report ready in the
    /// xenstore (`data/ready = 1`).
    BootRead(BootRead),
    /// An NBD export of the first disk on this socket.
    Nbd(PathBuf),
}

/// How a boot reads its disk: `mib` MiB from the start, in `bs`-byte
/// requests with `depth` of them in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootRead {
    pub mib: u32,
    pub bs: u32,
    pub depth: u32,
}

impl BootRead {
    /// `mib` MiB the way an OS's readahead reads (128 KiB, 8 in flight).
    pub fn readahead(mib: u32) -> Self {
        BootRead {
            mib,
            bs: 128 << 10,
            depth: 8,
        }
    }
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
            Workload::BootRead(b) if *b == BootRead::readahead(b.mib) => {
                write!(f, "boot-read:{}", b.mib)
            }
            Workload::BootRead(b) => {
                write!(f, "boot-read:{},bs={},depth={}", b.mib, b.bs, b.depth)
            }
            Workload::Nbd(p) => write!(f, "nbd:{}", p.display()),
        }
    }
}

impl std::str::FromStr for Workload {
    type Err = String;

    /// `idle`, `job:SPEC` (an fio-like job, e.g.
    /// `job:rw=randrw,bs=4k,iodepth=8,runtime=5s,verify=crc32c`),
    /// `boot-read:MIB[,bs=BYTES,depth=N]` or `nbd:SOCKET`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, arg) = match s.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (s, None),
        };
        match (kind, arg) {
            ("idle", None) => Ok(Workload::Idle),
            ("job", Some(spec)) if !spec.is_empty() => Ok(Workload::Job(spec.to_string())),
            ("boot-read", Some(a)) => parse_boot_read(a).map(Workload::BootRead),
            ("nbd", Some(p)) if !p.is_empty() => Ok(Workload::Nbd(PathBuf::from(p))),
            _ => Err(format!(
                "unknown workload {s:?}: expected idle, job:SPEC, boot-read:MIB or nbd:SOCKET"
            )),
        }
    }
}

fn parse_boot_read(a: &str) -> Result<BootRead, String> {
    let mut parts = a.split(',');
    let m = parts.next().unwrap_or_default();
    let mib = m
        .parse()
        .map_err(|_| format!("boot-read needs a size in MiB, not {m:?}"))?;
    let mut b = BootRead::readahead(mib);
    for kv in parts {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("boot-read: expected key=value, not {kv:?}"))?;
        let n: u32 = v
            .parse()
            .map_err(|_| format!("boot-read: {k} must be a number, not {v:?}"))?;
        match k {
            "bs" if n >= 512 && n.is_multiple_of(512) => b.bs = n,
            "bs" => return Err(format!("boot-read: bs must be a multiple of 512, not {n}")),
            "depth" if n >= 1 => b.depth = n,
            "depth" => return Err("boot-read: depth must be at least 1".into()),
            _ => return Err(format!("boot-read: unknown key {k:?} (bs, depth)")),
        }
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_round_trip_as_text() {
        for w in [
            Workload::Idle,
            Workload::Job("rw=randread,bs=4k".into()),
            Workload::BootRead(BootRead::readahead(32)),
            Workload::BootRead(BootRead {
                mib: 32,
                bs: 4096,
                depth: 1,
            }),
            Workload::Nbd("/tmp/x.sock".into()),
        ] {
            assert_eq!(w.to_string().parse::<Workload>(), Ok(w));
        }
        for bad in [
            "",
            "job",
            "job:",
            "boot-read:x",
            "boot-read:32,bs=100",
            "boot-read:32,depth=0",
            "boot-read:32,qd=1",
            "reboot",
            "idle:1",
        ] {
            assert!(bad.parse::<Workload>().is_err(), "{bad:?} accepted");
        }
    }
}
