//! CPU cgroups for control-plane isolation (XenServer's control.slice):
//! the control daemons run in `pvio-control` with 10× the CPU share of
//! `pvio-datapath`, which holds one child group per running VM (its guest
//! and its tapdisks). Works on cgroup v1 (`cpu.shares`) and v2
//! (`cpu.weight`); where neither is usable, callers warn and carry on.

use std::io;
use std::path::{Path, PathBuf};

/// The control daemons' group.
pub const CONTROL_GROUP: &str = "pvio-control";
/// The datapath's group (tapdisks and guests).
pub const DATAPATH_GROUP: &str = "pvio-datapath";
/// CPU shares of the control group (cgroup v1 units; 1024 is the default).
pub const CONTROL_SHARES: u32 = 10240;
/// CPU shares of the datapath group.
pub const DATAPATH_SHARES: u32 = 1024;

/// Which cgroup hierarchy holds the CPU controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    /// cgroup v1: the `cpu` controller mounted here.
    V1(PathBuf),
    /// cgroup v2: the unified hierarchy mounted here, with `cpu` available.
    V2(PathBuf),
}

impl Hierarchy {
    /// Finds the CPU controller: v1's `/sys/fs/cgroup/cpu` (or `cpu,cpuacct`),
    /// else a v2 root that offers `cpu`.
    pub fn detect() -> Option<Self> {
        let root = Path::new("/sys/fs/cgroup");
        for v1 in ["cpu", "cpu,cpuacct"] {
            let p = root.join(v1);
            if p.join("cpu.shares").exists() {
                return Some(Hierarchy::V1(p));
            }
        }
        for v2 in [root.to_path_buf(), root.join("unified")] {
            let controllers = std::fs::read_to_string(v2.join("cgroup.controllers"));
            if controllers.is_ok_and(|c| c.split_whitespace().any(|w| w == "cpu")) {
                return Some(Hierarchy::V2(v2));
            }
        }
        None
    }

    /// Where the hierarchy is mounted.
    pub fn root(&self) -> &Path {
        match self {
            Hierarchy::V1(p) | Hierarchy::V2(p) => p,
        }
    }
}

/// A CPU cgroup this process made or found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuGroup {
    hierarchy: Hierarchy,
    path: PathBuf,
}

/// v1 shares to a v2 weight (1024 → 100, 10240 → 1000; within 1..=10000).
pub fn shares_to_weight(shares: u32) -> u32 {
    (u64::from(shares) * 100 / 1024).clamp(1, 10_000) as u32
}

impl CpuGroup {
    /// Creates (or reuses) the top-level group `name` with `shares`.
    pub fn top(hierarchy: &Hierarchy, name: &str, shares: u32) -> io::Result<Self> {
        let parent = CpuGroup {
            hierarchy: hierarchy.clone(),
            path: hierarchy.root().to_path_buf(),
        };
        parent.child(name, shares)
    }

    /// Creates (or reuses) a child group with `shares`.
    pub fn child(&self, name: &str, shares: u32) -> io::Result<Self> {
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad cgroup name {name:?}"),
            ));
        }
        if let Hierarchy::V2(_) = self.hierarchy {
            // Children get the cpu controller only if the parent passes it on.
            let ctl = self.path.join("cgroup.subtree_control");
            let on = std::fs::read_to_string(&ctl)?;
            if !on.split_whitespace().any(|w| w == "cpu") {
                std::fs::write(&ctl, "+cpu")?;
            }
        }
        let path = self.path.join(name);
        match std::fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let g = CpuGroup {
            hierarchy: self.hierarchy.clone(),
            path,
        };
        g.set_shares(shares)?;
        Ok(g)
    }

    /// Creates the group again with `shares` if it is gone (a top-level
    /// group is shared by every host on the machine, and the last one to
    /// stop removes it while empty).
    pub fn recreate(&self, shares: u32) -> io::Result<()> {
        let (Some(parent), Some(name)) = (self.path.parent(), self.path.file_name()) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} has no parent group", self.path.display()),
            ));
        };
        let parent = CpuGroup::open(&self.hierarchy, parent.to_path_buf())?;
        parent.child(&name.to_string_lossy(), shares).map(|_| ())
    }

    /// Sets the group's CPU share (`cpu.shares`, or `cpu.weight` on v2).
    pub fn set_shares(&self, shares: u32) -> io::Result<()> {
        match self.hierarchy {
            Hierarchy::V1(_) => std::fs::write(self.path.join("cpu.shares"), shares.to_string()),
            Hierarchy::V2(_) => std::fs::write(
                self.path.join("cpu.weight"),
                shares_to_weight(shares).to_string(),
            ),
        }
    }

    /// The group's share as the kernel reports it (v1 units; v2 weights
    /// are converted back).
    pub fn shares(&self) -> io::Result<u32> {
        let (file, v2) = match self.hierarchy {
            Hierarchy::V1(_) => ("cpu.shares", false),
            Hierarchy::V2(_) => ("cpu.weight", true),
        };
        let text = std::fs::read_to_string(self.path.join(file))?;
        let n: u32 = text
            .trim()
            .parse()
            .map_err(|_| io::Error::other(format!("{file} reads {text:?}")))?;
        Ok(if v2 { n * 1024 / 100 } else { n })
    }

    /// Moves a process (all its threads) into the group.
    pub fn add_pid(&self, pid: u32) -> io::Result<()> {
        std::fs::write(self.path.join("cgroup.procs"), pid.to_string())
    }

    /// The processes in the group.
    pub fn pids(&self) -> io::Result<Vec<u32>> {
        let text = std::fs::read_to_string(self.path.join("cgroup.procs"))?;
        Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// Removes the group; it must hold no process any more.
    pub fn remove(&self) -> io::Result<()> {
        match std::fs::remove_dir(&self.path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }

    /// Where the group is in the cgroup filesystem.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the group at `path`, creating it with `shares` if it is gone:
    /// a top-level group is shared by every host on the machine, and
    /// another host that stopped may have removed it since it was handed
    /// over.
    pub fn open_or_recreate(hierarchy: &Hierarchy, path: PathBuf, shares: u32) -> io::Result<Self> {
        if path.starts_with(hierarchy.root()) && !path.exists() {
            let g = CpuGroup {
                hierarchy: hierarchy.clone(),
                path: path.clone(),
            };
            g.recreate(shares)?;
        }
        Self::open(hierarchy, path)
    }

    /// Opens an existing group by path (for callers handed a path).
    pub fn open(hierarchy: &Hierarchy, path: PathBuf) -> io::Result<Self> {
        if !path.starts_with(hierarchy.root()) || !path.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} is not a cgroup of {}",
                    path.display(),
                    hierarchy.root().display()
                ),
            ));
        }
        Ok(CpuGroup {
            hierarchy: hierarchy.clone(),
            path,
        })
    }
}

/// Which cgroup a process is in for the CPU controller (from
/// `/proc/PID/cgroup`), relative to the hierarchy's root.
pub fn cpu_cgroup_of(pid: u32) -> io::Result<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    let mut v2 = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrls, path) = (parts.next(), parts.next(), parts.next());
        let (Some(ctrls), Some(path)) = (ctrls, path) else {
            continue;
        };
        if ctrls.split(',').any(|c| c == "cpu") {
            return Ok(path.to_string());
        }
        if ctrls.is_empty() {
            v2 = Some(path.to_string());
        }
    }
    v2.ok_or_else(|| io::Error::other(format!("no cpu cgroup for pid {pid}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_follow_shares() {
        assert_eq!(shares_to_weight(1024), 100);
        assert_eq!(shares_to_weight(10240), 1000);
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(u32::MAX), 10_000);
    }

    #[test]
    fn a_group_takes_a_process_and_goes_away() {
        let Some(h) = Hierarchy::detect() else {
            eprintln!("no cpu cgroup controller here: skipped");
            return;
        };
        let name = format!("pvio-unit-{}", std::process::id());
        let g = match CpuGroup::top(&h, &name, 2048) {
            Ok(g) => g,
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                eprintln!("cgroups not writable: skipped");
                return;
            }
            Err(e) => panic!("creating {name}: {e}"),
        };
        assert_eq!(g.shares().unwrap(), 2048);
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        g.add_pid(child.id()).unwrap();
        assert_eq!(g.pids().unwrap(), vec![child.id()]);
        assert!(cpu_cgroup_of(child.id()).unwrap().ends_with(&name));
        assert!(g.remove().is_err(), "a group with a process was removed");
        child.kill().unwrap();
        child.wait().unwrap();
        g.remove().unwrap();
        assert!(!g.path().exists());
        // Gone from under a holder of its handle: children fail until it
        // is recreated, with its shares.
        let e = g.child("vm", 100).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        g.recreate(4096).unwrap();
        assert_eq!(g.shares().unwrap(), 4096);
        let c = g.child("vm", 100).unwrap();
        assert_eq!(c.shares().unwrap(), 100);
        c.remove().unwrap();
        g.remove().unwrap();
    }
}
