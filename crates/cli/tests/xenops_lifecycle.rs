//! The VM lifecycle engine against real daemons: hvd, xenstored, one
//! `pvio tapdisk` per disk and a `pvio guest` per VM, all processes.
//! Starts, shutdowns, a start that fails on one disk of ten (nothing may be
//! left: no process, domain, xenstore node, nothing in the datapath
//! group), a guest that dies, and hot plug and unplug.

use std::path::PathBuf;
use std::time::Duration;

use pvio_bench::host::{make_image, xvd_devid, MiniHost};
use pvio_xenops::cgroup::{CpuGroup, Hierarchy};
use pvio_xenops::{VbdSpec, VmEvent, VmSpec, Workload, Xenops, XenopsConfig, XenopsError};

struct Host {
    mini: MiniHost,
    xenops: Xenops,
    events: tokio::sync::mpsc::UnboundedReceiver<VmEvent>,
    cgroup: Option<CpuGroup>,
    rt: tokio::runtime::Runtime,
}

impl Host {
    fn start(tag: &str) -> Host {
        std::env::set_var("PVIO_BIN", env!("CARGO_BIN_EXE_pvio"));
        let mini = MiniHost::start(tag).unwrap();
        // A datapath group of this test's own, so parallel tests do not
        // share one.
        let cgroup = Hierarchy::detect().and_then(|h| {
            CpuGroup::top(&h, &format!("pvio-test-{tag}-{}", std::process::id()), 1024).ok()
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let cfg = XenopsConfig {
            hvd_socket: mini.hvd_socket.clone(),
            xenstore_socket: mini.xs_socket.clone(),
            pvio_bin: PathBuf::from(env!("CARGO_BIN_EXE_pvio")),
            state_dir: mini.dir.0.join("state"),
            worker_pool_size: 16,
            max_parallel_per_vm: 10,
            shutdown_timeout: Duration::from_secs(20),
            datapath_cgroup: cgroup.clone(),
            placement: true,
        };
        let (xenops, events) = {
            let _g = rt.enter();
            Xenops::start(cfg).unwrap()
        };
        Host {
            mini,
            xenops,
            events,
            cgroup,
            rt,
        }
    }

    fn image(&self, name: &str, mib: u64) -> PathBuf {
        make_image(&self.mini.dir.0, name, mib << 20).unwrap()
    }

    fn spec(&self, name: &str, disks: &[PathBuf], workload: Workload) -> VmSpec {
        VmSpec {
            uuid: format!(
                "00000000-0000-4000-8000-{:012}",
                name.len() * 1000 + disks.len()
            ),
            name: name.to_string(),
            memory_mib: 128,
            vcpus: 1,
            vbds: pvio_bench::vmhost::VmHost::vbds(disks, Duration::ZERO),
            workload,
        }
    }

    fn xs_exists(&self, path: &str) -> bool {
        self.mini.xs(async |xs| xs.exists(path).await).unwrap()
    }

    /// Domains hvd knows, besides dom0.
    fn guest_domains(&self) -> Vec<u16> {
        self.mini
            .host
            .list_domains()
            .unwrap()
            .into_iter()
            .map(|d| d.domid)
            .filter(|d| *d != 0)
            .collect()
    }

    /// Processes whose command line mentions this host's directory
    /// (tapdisks and guests pass its sockets), except the daemons.
    fn host_processes(&self) -> Vec<String> {
        let dir = self.mini.dir.0.display().to_string();
        let mut found = Vec::new();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
                continue;
            };
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            let is_child = cmd.contains(" tapdisk ") || cmd.contains(" guest ");
            if is_child && cmd.contains(&dir) {
                found.push(cmd);
            }
        }
        found
    }

    /// Asserts that nothing of a VM is left.
    fn assert_no_trace(&self, uuid: &str, domid: Option<u16>) {
        assert_eq!(
            self.host_processes(),
            Vec::<String>::new(),
            "processes left"
        );
        assert_eq!(self.guest_domains(), Vec::<u16>::new(), "domains left");
        if let Some(d) = domid {
            for p in [
                format!("/local/domain/{d}"),
                format!("/local/domain/0/backend/vbd/{d}"),
            ] {
                assert!(!self.xs_exists(&p), "{p} is left");
            }
        }
        assert!(
            !self.xs_exists(&format!("/vm/{uuid}")),
            "/vm/{uuid} is left"
        );
        // Nothing under the backend directory of any domain either.
        let backends = self
            .mini
            .xs(
                async |xs| match xs.directory("/local/domain/0/backend/vbd").await {
                    Ok(d) => Ok(d),
                    Err(e) if e.xs() == Some(pvio_xenstore::XsError::Enoent) => Ok(Vec::new()),
                    Err(e) => Err(e),
                },
            )
            .unwrap();
        assert_eq!(backends, Vec::<String>::new(), "backend directories left");
        if let Some(g) = &self.cgroup {
            assert!(!g.path().join(uuid).exists(), "a cgroup of the VM exists");
            assert_eq!(g.pids().unwrap(), Vec::<u32>::new(), "processes left");
        }
        let list = self.rt.block_on(self.xenops.list()).unwrap();
        assert!(list.is_empty(), "the engine still lists {list:?}");
    }

    /// The domid that xenstore's `/vm/<uuid>/domains` names, if any.
    fn backend_state(&self, domid: u16, devid: u32) -> Option<String> {
        self.mini
            .xs(async |xs| {
                xs.try_read(&format!(
                    "/local/domain/0/backend/vbd/{domid}/{devid}/state"
                ))
                .await
            })
            .unwrap()
            .map(|v| String::from_utf8_lossy(&v).into_owned())
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.rt.block_on(self.xenops.shutdown_all());
        if let Some(g) = &self.cgroup {
            let _ = g.remove();
        }
    }
}

fn cgroup_of(pid: u32) -> String {
    pvio_xenops::cgroup::cpu_cgroup_of(pid).unwrap()
}

#[test]
fn a_vm_starts_with_its_disks_connected_and_shuts_down_cleanly() {
    let h = Host::start("xo-start");
    let disks = [h.image("a.img", 8), h.image("b.img", 8)];
    let spec = h.spec("vm-ab", &disks, Workload::Idle);
    let vm = h.rt.block_on(h.xenops.start_vm(spec.clone())).unwrap();
    assert_eq!(vm.vbds, vec![xvd_devid(0), xvd_devid(1)]);
    for devid in &vm.vbds {
        assert_eq!(h.backend_state(vm.domid, *devid).as_deref(), Some("4"));
    }
    // libxl's permissions on every key of both directories: the frontend
    // is the guest's (dom0 reads it), the backend dom0's (the guest reads
    // it).
    let d = vm.domid;
    let fe = format!("/local/domain/{d}/device/vbd/{}", vm.vbds[0]);
    let be = format!("/local/domain/0/backend/vbd/{d}/{}", vm.vbds[0]);
    for (path, want) in [
        (fe.clone(), format!("n{d} r0")),
        (format!("{fe}/backend"), format!("n{d} r0")),
        (format!("{fe}/virtual-device"), format!("n{d} r0")),
        (be.clone(), format!("n0 r{d}")),
        (format!("{be}/params"), format!("n0 r{d}")),
        (format!("{be}/frontend-id"), format!("n0 r{d}")),
    ] {
        let p = path.clone();
        let perms = h.mini.xs(async move |xs| xs.get_perms(&p).await).unwrap();
        assert_eq!(perms.to_string(), want, "permissions of {path}");
    }
    // The start marker is gone; the guest owns its control directory.
    assert!(!h.xs_exists(&format!("/local/domain/{}/action-request", vm.domid)));
    assert!(h.xs_exists(&format!("/local/domain/{}/control/shutdown", vm.domid)));
    assert_eq!(h.guest_domains(), vec![vm.domid]);
    assert_eq!(h.host_processes().len(), 3, "{:?}", h.host_processes());
    if let Some(g) = &h.cgroup {
        let pids = g.pids().unwrap();
        assert_eq!(
            pids.len(),
            3,
            "guest and two tapdisks in the datapath group"
        );
        let name = g.path().file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(cgroup_of(vm.guest_pid), format!("/{name}"));
    }
    assert_eq!(h.rt.block_on(h.xenops.list()).unwrap(), vec![vm.clone()]);
    // A second start of the same VM is refused.
    let again = h.rt.block_on(h.xenops.start_vm(spec.clone()));
    assert!(
        matches!(again, Err(XenopsError::AlreadyRunning(_))),
        "{again:?}"
    );

    h.rt.block_on(h.xenops.shutdown_vm(&spec.uuid, false))
        .unwrap();
    h.assert_no_trace(&spec.uuid, Some(vm.domid));
    // The guest went because it was asked: it acknowledged and closed its
    // disks, so its log shows no kill.
    let log = std::fs::read_to_string(
        h.mini
            .dir
            .0
            .join("state/vms")
            .join(&spec.uuid)
            .join("guest.log"),
    )
    .unwrap();
    assert!(log.contains("shutdown requested by the toolstack"), "{log}");
}

#[test]
fn a_start_that_fails_on_its_seventh_of_ten_disks_leaves_no_trace() {
    let h = Host::start("xo-fail7");
    let mut disks: Vec<PathBuf> = (0..10).map(|i| h.image(&format!("d{i}.img"), 4)).collect();
    // The 7th disk's image does not exist: its tapdisk fails to open it.
    disks[6] = h.mini.dir.0.join("missing.img");
    let spec = h.spec("vm-fail", &disks, Workload::Idle);
    let err = h.rt.block_on(h.xenops.start_vm(spec.clone())).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("disk {}", xvd_devid(6))) && msg.contains("missing.img"),
        "the error names the disk and its image: {msg}"
    );
    h.assert_no_trace(&spec.uuid, None);
    // Nothing of the domain is left in the xenstore either.
    let doms = h
        .mini
        .xs(async |xs| xs.directory("/local/domain").await)
        .unwrap();
    assert_eq!(doms, vec!["0".to_string()], "domain homes left: {doms:?}");
    // And the same VM starts once its disk is fixed.
    let mut fixed = spec.clone();
    fixed.vbds[6].image = h.image("d6.img", 4);
    let vm = h.rt.block_on(h.xenops.start_vm(fixed.clone())).unwrap();
    assert_eq!(vm.vbds.len(), 10);
    h.rt.block_on(h.xenops.shutdown_vm(&fixed.uuid, true))
        .unwrap();
    h.assert_no_trace(&fixed.uuid, Some(vm.domid));
}

#[test]
fn a_job_reports_its_results_in_the_xenstore() {
    let h = Host::start("xo-job");
    let disks = [h.image("a.img", 16), h.image("b.img", 16)];
    let spec = h.spec(
        "vm-job",
        &disks,
        Workload::Job("rw=randrw,bs=4k,iodepth=4,numjobs=2,size=2m,verify=crc32c".into()),
    );
    let vm = h.rt.block_on(h.xenops.start_vm(spec.clone())).unwrap();
    let key = format!("/local/domain/{}/data/workload/state", vm.domid);
    h.mini
        .wait_for_value(&key, "done", Duration::from_secs(60))
        .unwrap();
    let m = h.rt.block_on(h.xenops.guest_metrics(&spec.uuid)).unwrap();
    assert_eq!(
        m.get("workload/verify").map(String::as_str),
        Some("ok"),
        "{m:?}"
    );
    assert_eq!(m.get("workload/errors").map(String::as_str), Some("0"));
    let iops: f64 = m["workload/iops"].parse().unwrap();
    assert!(iops > 0.0, "{m:?}");
    h.rt.block_on(h.xenops.shutdown_vm(&spec.uuid, false))
        .unwrap();
    h.assert_no_trace(&spec.uuid, Some(vm.domid));
    // Both disks did I/O (job j runs on disk j mod 2), as each tapdisk's
    // last statistics show.
    for devid in &vm.vbds {
        let p = h
            .mini
            .dir
            .0
            .join("state/vms")
            .join(&spec.uuid)
            .join(format!("tapdisk-{devid}.json"));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        let writes = v["metrics"]["total"]["writes"].as_u64().unwrap_or(0);
        assert!(writes > 0, "disk {devid} saw no writes: {v}");
    }
}

#[test]
fn a_guest_that_dies_halts_its_vm_and_is_cleaned_up() {
    let mut h = Host::start("xo-die");
    let disks = [h.image("a.img", 4)];
    let spec = h.spec("vm-die", &disks, Workload::Idle);
    let vm = h.rt.block_on(h.xenops.start_vm(spec.clone())).unwrap();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(vm.guest_pid as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let ev = h
        .rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(30), h.events.recv()).await })
        .expect("no event within 30 s")
        .expect("event stream closed");
    let VmEvent::Halted { uuid, reason } = ev else {
        panic!("expected the VM halted, got {ev:?}");
    };
    assert_eq!(uuid, spec.uuid);
    assert!(reason.contains("signal: 9"), "{reason}");
    h.assert_no_trace(&spec.uuid, Some(vm.domid));
}

#[test]
fn disks_plug_and_unplug_while_the_vm_runs() {
    let h = Host::start("xo-hot");
    let disks = [h.image("a.img", 4)];
    let spec = h.spec("vm-hot", &disks, Workload::Idle);
    let vm = h.rt.block_on(h.xenops.start_vm(spec.clone())).unwrap();
    let extra = VbdSpec {
        devid: xvd_devid(1),
        image: h.image("b.img", 4),
        writable: false,
        attach_delay: Duration::from_millis(20),
        backend_keys: Vec::new(),
    };
    h.rt.block_on(h.xenops.plug_vbd(&spec.uuid, extra.clone()))
        .unwrap();
    assert_eq!(h.backend_state(vm.domid, extra.devid).as_deref(), Some("4"));
    let listed = h.rt.block_on(h.xenops.list()).unwrap();
    assert_eq!(listed[0].vbds, vec![xvd_devid(0), xvd_devid(1)]);
    // Plugging it twice is refused and changes nothing.
    assert!(h
        .rt
        .block_on(h.xenops.plug_vbd(&spec.uuid, extra.clone()))
        .is_err());
    h.rt.block_on(h.xenops.unplug_vbd(&spec.uuid, extra.devid, false))
        .unwrap();
    assert_eq!(h.backend_state(vm.domid, extra.devid), None);
    assert!(!h.xs_exists(&format!(
        "/local/domain/{}/device/vbd/{}",
        vm.domid, extra.devid
    )));
    assert_eq!(h.host_processes().len(), 2, "{:?}", h.host_processes());
    h.rt.block_on(h.xenops.shutdown_vm(&spec.uuid, false))
        .unwrap();
    h.assert_no_trace(&spec.uuid, Some(vm.domid));
}

/// The CPUs `pid` may run on.
fn affinity(pid: u32) -> Vec<usize> {
    let set = rustix::thread::sched_getaffinity(rustix::thread::Pid::from_raw(pid as i32)).unwrap();
    (0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&c| set.is_set(c))
        .collect()
}

#[test]
fn a_contended_host_keeps_each_vm_on_its_own_cpu_and_rotates_it() {
    let cpus = pvio_xenops::affinity::online_cpus();
    if cpus < 2 || std::fs::read_to_string("/proc/pressure/cpu").is_err() {
        eprintln!("skipped: needs two CPUs and CPU pressure figures");
        return;
    }
    let h = Host::start("xo-place");
    let disks = [h.image("a.img", 4)];
    let spec = h.spec("vm-place", &disks, Workload::Idle);
    h.rt.block_on(h.xenops.start_vm(spec.clone())).unwrap();
    let dir = h.mini.dir.0.display().to_string();
    let pids: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            ((cmd.contains(" tapdisk ") || cmd.contains(" guest ")) && cmd.contains(&dir))
                .then_some(pid)
        })
        .collect();
    assert_eq!(pids.len(), 2, "one guest and one tapdisk");
    // More spinning threads than CPUs, at the lowest priority (they queue,
    // which is CPU pressure, without slowing the tests beside this one).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spinners: Vec<_> = (0..cpus + 1)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let idle = libc::sched_param { sched_priority: 0 };
                // SAFETY: changes only the calling thread's policy.
                unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &idle) };
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    // Pinned together to one CPU...
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let first = loop {
        let a: Vec<Vec<usize>> = pids.iter().map(|&p| affinity(p)).collect();
        if a[0].len() == 1 && a[0] == a[1] {
            break a[0][0];
        }
        assert!(std::time::Instant::now() < deadline, "never placed: {a:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    // ...and moved on to another, together.
    loop {
        let a: Vec<Vec<usize>> = pids.iter().map(|&p| affinity(p)).collect();
        if a[0].len() == 1 && a[0] == a[1] && a[0][0] != first {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never rotated: {a:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for s in spinners {
        s.join().unwrap();
    }
    // A quiet host frees them.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while pids.iter().any(|&p| affinity(p).len() < cpus) {
        assert!(std::time::Instant::now() < deadline, "never freed");
        std::thread::sleep(Duration::from_millis(50));
    }
    h.rt.block_on(h.xenops.shutdown_vm(&spec.uuid, false))
        .unwrap();
}
