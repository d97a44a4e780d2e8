//! The xe-style CLI end to end against a whole host (`pvio host up`): the
//! objects of one VM created and listed (`params=`, `--minimal`), the VM
//! started (its guest and tapdisk processes running in the datapath
//! cgroup, on every CPU, its tree in the xenstore), shut down and destroyed; command
//! lines that are wrong refused with nothing changed; and a VM start that
//! fails on its 7th of 10 disks leaving no trace (no process, domain,
//! xenstore node or cgroup) and then succeeding once the disk is fixed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pvio_bench::hostproc::HostProc;

const PVIO: &str = env!("CARGO_BIN_EXE_pvio");

/// A host for one test, with helpers to run commands against it.
struct Host(HostProc);

impl Host {
    fn start(tag: &str) -> Host {
        std::env::set_var("PVIO_BIN", PVIO);
        Host(HostProc::start(tag, &[]).expect("pvio host up"))
    }

    fn run(&self, args: &[&str]) -> Output {
        self.0.xe_command(args).unwrap().output().unwrap()
    }

    /// A command that must succeed; its standard output.
    fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(
            o.status.success(),
            "pvio {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    }

    /// A command that must fail with nothing on standard output; its
    /// standard error.
    fn fails(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert_eq!(o.status.code(), Some(1), "pvio {args:?} did not fail");
        assert!(o.stdout.is_empty(), "pvio {args:?} printed on failure");
        String::from_utf8(o.stderr).unwrap()
    }

    /// A create command; the new object's uuid.
    fn create(&self, args: &[&str]) -> String {
        let out = self.ok(args);
        let uuid = out.trim().to_string();
        assert_eq!(uuid.len(), 36, "{args:?} printed {out:?}");
        uuid
    }

    /// A file SR at the default location; its uuid.
    fn sr(&self) -> String {
        self.create(&["sr-create", "name-label=local", "type=file"])
    }

    /// A VDI of `size` (as typed, e.g. `4MiB`) in SR `sr`; its uuid.
    fn vdi(&self, sr: &str, name: &str, size: &str) -> String {
        self.create(&[
            "vdi-create",
            &format!("sr-uuid={sr}"),
            &format!("name-label={name}"),
            &format!("virtual-size={size}"),
        ])
    }

    /// A VBD of `vdi` in `vm` at `device`; its uuid.
    fn vbd(&self, vm: &str, vdi: &str, device: u32) -> String {
        self.create(&[
            "vbd-create",
            &format!("vm-uuid={vm}"),
            &format!("vdi-uuid={vdi}"),
            &format!("device={device}"),
        ])
    }

    /// Every object the toolstack holds, as the CLI prints it.
    fn objects(&self) -> String {
        ["sr", "vdi", "vm", "vbd"]
            .iter()
            .map(|c| self.ok(&[&format!("{c}-list"), "params=all"]))
            .collect::<Vec<_>>()
            .join("----\n")
    }

    fn param(&self, vm: &str, name: &str) -> String {
        self.ok(&[
            "vm-param-get",
            &format!("uuid={vm}"),
            &format!("param-name={name}"),
        ])
        .trim()
        .to_string()
    }

    /// `xenstore-list PATH` through Debian's xenstore-utils.
    fn xs_list(&self, path: &str) -> Vec<String> {
        let o = Command::new("xenstore-list")
            .arg(path)
            .env("XENSTORED_PATH", self.0.state().join("xenstored.sock"))
            .output()
            .expect("xenstore-list (xenstore-utils)");
        if !o.status.success() {
            return Vec::new();
        }
        String::from_utf8(o.stdout)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Tapdisk and guest processes of this host: (pid, command line).
    fn vm_procs(&self) -> Vec<(u32, String)> {
        let state = self.0.state().display().to_string();
        processes(|cmd| {
            (cmd.contains(" tapdisk ") || cmd.contains(" guest ")) && cmd.contains(&state)
        })
    }

    fn vm_processes(&self) -> Vec<String> {
        self.vm_procs().into_iter().map(|(_, c)| c).collect()
    }

    fn vm_pids(&self) -> Vec<u32> {
        self.vm_procs().into_iter().map(|(p, _)| p).collect()
    }

    /// Pids of this host's hvd, xenstored and toolstackd.
    fn daemon_pids(&self) -> Vec<u32> {
        let sock = self.0.state().join("hvd.sock").display().to_string();
        processes(|cmd| {
            let daemon = [" hvd ", " xenstored ", " toolstackd "]
                .iter()
                .any(|d| cmd.contains(d));
            daemon && cmd.contains(&sock)
        })
        .into_iter()
        .map(|(p, _)| p)
        .collect()
    }

    /// The datapath cgroup that `host up` put VMs in, if cgroups work here.
    fn datapath_cgroup(&self) -> Option<PathBuf> {
        let log = std::fs::read_to_string(self.0.dir.0.join("host.log")).unwrap_or_default();
        if log.contains("not isolated") {
            return None;
        }
        pvio_xenops::cgroup::Hierarchy::detect()
            .map(|h| h.root().join(pvio_xenops::cgroup::DATAPATH_GROUP))
    }

    /// Asserts that nothing of VM `uuid` runs or is left anywhere.
    fn assert_no_trace(&self, uuid: &str) {
        assert_eq!(self.vm_processes(), Vec::<String>::new(), "processes left");
        assert_eq!(self.xs_list("/local/domain"), vec!["0"], "domains left");
        assert_eq!(
            self.xs_list("/local/domain/0/backend/vbd"),
            Vec::<String>::new(),
            "backends left"
        );
        assert_eq!(self.xs_list(&format!("/vm/{uuid}")), Vec::<String>::new());
        if let Some(g) = self.datapath_cgroup() {
            assert!(!g.join(uuid).exists(), "a cgroup of the VM exists");
        }
        assert_eq!(self.param(uuid, "power-state"), "halted");
        assert_eq!(self.param(uuid, "dom-id"), "-1");
    }
}

/// Processes whose command line (arguments joined by spaces) matches.
fn processes(matches: impl Fn(&str) -> bool) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if matches(&cmd) {
            found.push((pid, cmd));
        }
    }
    found
}

fn pid_cgroup(pid: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    text.lines()
        .find(|l| {
            l.split(':')
                .nth(1)
                .is_some_and(|c| c.split(',').any(|c| c == "cpu"))
        })
        .or_else(|| text.lines().find(|l| l.starts_with("0::")))
        .and_then(|l| l.splitn(3, ':').nth(2))
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_vm_is_created_started_shut_down_and_destroyed_through_the_cli() {
    let h = Host::start("cli-e2e");
    let sr = h.create(&["sr-create", "name-label=local", "type=file"]);
    let vdi = h.create(&[
        "vdi-create",
        &format!("sr-uuid={sr}"),
        "name-label=root",
        "virtual-size=16MiB",
    ]);
    let vm = h.create(&["vm-create", "name-label=web", "memory=128MiB"]);
    let vbd = h.create(&[
        "vbd-create",
        &format!("vm-uuid={vm}"),
        &format!("vdi-uuid={vdi}"),
        "device=0",
        "mode=RW",
    ]);

    // Lists: xe's record layout, params= and --minimal.
    let list = h.ok(&["vm-list"]);
    assert!(
        list.contains(&format!("uuid ( RO)           : {vm}")),
        "{list}"
    );
    assert!(list.contains("     name-label ( RW): web"), "{list}");
    assert!(list.contains("    power-state ( RO): halted"), "{list}");
    assert_eq!(h.ok(&["vm-list", "--minimal"]), format!("{vm}\n"));
    assert_eq!(
        h.ok(&[
            "vm-list",
            "name-label=web",
            "params=name-label",
            "--minimal"
        ]),
        "web\n"
    );
    assert_eq!(h.ok(&["vm-list", "name-label=nope", "--minimal"]), "\n");
    assert_eq!(
        h.ok(&["vbd-list", &format!("vm-uuid={vm}"), "--minimal"]),
        format!("{vbd}\n")
    );
    let vdi_rec = h.ok(&["vdi-list", &format!("uuid={vdi}"), "params=virtual-size"]);
    assert!(vdi_rec.contains(": 16777216"), "{vdi_rec}");

    // Wrong command lines name what is wrong and change nothing.
    let before = h.objects();
    let e = h.fails(&["vm-start", "uuid=00000000-0000-0000-0000-000000000000"]);
    assert!(e.contains("No matching VMs found"), "{e}");
    let e = h.fails(&["vbd-create", &format!("vm-uuid={vm}"), "device=1"]);
    assert!(e.contains("Required parameter not found: vdi-uuid"), "{e}");
    let e = h.fails(&["vm-create", "name-label=x", "bogus=1"]);
    assert!(e.contains("Unknown parameter: bogus"), "{e}");
    let e = h.fails(&[
        "vdi-create",
        &format!("sr-uuid={sr}"),
        "name-label=x",
        "virtual-size=lots",
    ]);
    assert!(e.contains("virtual-size"), "{e}");
    assert_eq!(h.objects(), before);

    // Start: a domain, its guest and tapdisk, connected, in its cgroup.
    assert_eq!(h.ok(&["vm-start", &format!("uuid={vm}")]), "");
    assert_eq!(h.param(&vm, "power-state"), "running");
    let domid = h.param(&vm, "dom-id");
    assert!(domid.parse::<u16>().is_ok_and(|d| d > 0), "dom-id {domid}");
    let procs = h.vm_processes();
    assert_eq!(procs.len(), 2, "one guest and one tapdisk: {procs:?}");
    assert_eq!(
        h.xs_list(&format!("/local/domain/0/backend/vbd/{domid}")),
        vec!["51712"]
    );
    if let Some(g) = h.datapath_cgroup() {
        let name = g.file_name().unwrap().to_string_lossy().into_owned();
        for p in h.vm_pids() {
            assert_eq!(pid_cgroup(&p.to_string()), format!("/{name}"), "pid {p}");
        }
        // The control slice is pinned to its CPUs; the VM's processes are
        // started on all (PVIO_CPUS=all), and a contended host may then
        // place them together on the VM's CPU (pvio_xenops::placement).
        let cpus = std::thread::available_parallelism().unwrap().get();
        let count = |pid: u32| {
            let pid = rustix::process::Pid::from_raw(pid as i32);
            rustix::thread::sched_getaffinity(pid).unwrap().count() as usize
        };
        for p in h.vm_pids() {
            let env = std::fs::read(format!("/proc/{p}/environ")).unwrap();
            assert!(
                env.split(|&b| b == 0).any(|v| v == b"PVIO_CPUS=all"),
                "pid {p} was not started on every CPU"
            );
            assert!(
                count(p) == cpus || count(p) == 1,
                "pid {p} is on {} CPUs",
                count(p)
            );
        }
        let control = pvio_xenops::affinity::control_cpus(cpus).len();
        let daemons = h.daemon_pids();
        assert_eq!(daemons.len(), 3, "hvd, xenstored, toolstackd");
        for pid in daemons {
            assert_eq!(count(pid), control, "daemon {pid} is not pinned");
        }
    }
    // A running VM refuses what needs it halted, and stays as it was.
    let before = h.objects();
    let e = h.fails(&["vm-destroy", &format!("uuid={vm}")]);
    assert!(e.contains("expected: halted"), "{e}");
    let e = h.fails(&["vm-start", &format!("uuid={vm}")]);
    assert!(e.contains("actual: running"), "{e}");
    assert_eq!(h.objects(), before);
    assert_eq!(h.vm_processes().len(), 2);

    // Shutdown: the guest asked, everything gone.
    assert_eq!(h.ok(&["vm-shutdown", &format!("uuid={vm}")]), "");
    h.assert_no_trace(&vm);

    // Destroy: the VM and its VBD go, the VDI and its file stay.
    assert_eq!(h.ok(&["vm-destroy", &format!("uuid={vm}")]), "");
    assert_eq!(h.ok(&["vm-list", "--minimal"]), "\n");
    assert_eq!(h.ok(&["vbd-list", "--minimal"]), "\n");
    assert_eq!(h.ok(&["vdi-list", "--minimal"]), format!("{vdi}\n"));
    let location = h.ok(&[
        "vdi-param-get",
        &format!("uuid={vdi}"),
        "param-name=location",
    ]);
    assert!(Path::new(location.trim()).exists(), "{location}");
}

#[test]
fn a_start_that_fails_on_the_seventh_of_ten_disks_leaves_no_trace() {
    let h = Host::start("cli-fail7");
    let sr = h.create(&["sr-create", "name-label=local", "type=file"]);
    let vm = h.create(&["vm-create", "name-label=ten-disks"]);
    let mut files = Vec::new();
    for n in 0..10 {
        let vdi = h.create(&[
            "vdi-create",
            &format!("sr-uuid={sr}"),
            &format!("name-label=d{n}"),
            "virtual-size=4MiB",
        ]);
        h.create(&[
            "vbd-create",
            &format!("vm-uuid={vm}"),
            &format!("vdi-uuid={vdi}"),
            &format!("device={n}"),
        ]);
        let loc = h.ok(&[
            "vdi-param-get",
            &format!("uuid={vdi}"),
            "param-name=location",
        ]);
        files.push(PathBuf::from(loc.trim()));
    }
    // The 7th disk's image is gone: its tapdisk cannot open it.
    let seventh = &files[6];
    std::fs::remove_file(seventh).unwrap();
    let before = h.objects();
    let e = h.fails(&["vm-start", &format!("uuid={vm}")]);
    assert!(
        e.contains(&seventh.display().to_string()),
        "the error names the missing image: {e}"
    );
    h.assert_no_trace(&vm);
    assert_eq!(h.objects(), before, "the failed start changed objects");

    // Fixed, the same VM starts with all ten disks connected.
    std::fs::File::create(seventh)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    assert_eq!(h.ok(&["vm-start", &format!("uuid={vm}")]), "");
    let domid = h.param(&vm, "dom-id");
    let backends = h.xs_list(&format!("/local/domain/0/backend/vbd/{domid}"));
    assert_eq!(backends.len(), 10, "{backends:?}");
    assert_eq!(h.vm_processes().len(), 11, "one guest and ten tapdisks");
    assert_eq!(h.ok(&["vm-shutdown", &format!("uuid={vm}")]), "");
    h.assert_no_trace(&vm);
}

impl Host {
    /// The tapdisks of this host: (pid, command line).
    fn tapdisks(&self) -> Vec<(u32, String)> {
        let state = self.0.state().display().to_string();
        processes(|cmd| cmd.contains(" tapdisk ") && cmd.contains(&state))
    }

    fn vbd_param(&self, vbd: &str, name: &str) -> String {
        self.ok(&[
            "vbd-param-get",
            &format!("uuid={vbd}"),
            &format!("param-name={name}"),
        ])
        .trim()
        .to_string()
    }

    /// Waits (with a deadline) until `cond` holds.
    fn wait(&self, what: &str, secs: u64, mut cond: impl FnMut() -> bool) -> std::time::Duration {
        let t0 = std::time::Instant::now();
        while !cond() {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(secs),
                "{what} within {secs} s"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        t0.elapsed()
    }
}

/// SIGKILL to a process this test started (through `pvio host up`).
fn kill9(pid: u32) {
    let p = rustix::process::Pid::from_raw(pid as i32).unwrap();
    rustix::process::kill_process(p, rustix::process::Signal::KILL).unwrap();
}

#[test]
fn a_tapdisk_killed_under_a_verifying_writer_is_replaced_and_one_that_keeps_dying_fails_the_vbd() {
    let h = Host::start("cli-supervise");
    let sr = h.sr();
    let vdi = h.vdi(&sr, "data", "256MiB");
    let sock = h.0.dir.0.join("nbd.sock");
    let vm = h.create(&[
        "vm-create",
        "name-label=writer",
        "memory=256MiB",
        &format!("workload=nbd:{}", sock.display()),
    ]);
    let vbd = h.vbd(&vm, &vdi, 0);
    h.ok(&["vm-start", &format!("uuid={vm}")]);
    h.wait("the NBD export appears", 30, || sock.exists());
    assert_eq!(h.vbd_param(&vbd, "tapdisk-restarts"), "0");

    // A verifying writer through the guest's export...
    let fio = Command::new("timeout")
        .args(["300", "fio", "--name=writer", "--ioengine=nbd"])
        .arg(format!("--uri=nbd+unix:///?socket={}", sock.display()))
        .args([
            "--rw=randwrite",
            // Sizes a filesystem's writes vary over, from one sector up.
            "--bssplit=512/10:4k/30:64k/30:256k/20:1m/10",
            "--iodepth=16",
            "--size=128m",
            "--verify=crc32c",
            "--verify_state_save=0",
            "--output-format=json",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("fio (scripts/install-deps.sh installs it)");
    let stats =
        h.0.state()
            .join("vms/vms")
            .join(&vm)
            .join("tapdisk-51712.json");
    h.wait("the writer gets going", 60, || {
        std::fs::read_to_string(&stats)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v["metrics"]["total"]["writes"].as_u64())
            .is_some_and(|w| w >= 100)
    });
    // ...loses its tapdisk.
    let before = h.tapdisks();
    assert_eq!(before.len(), 1, "{before:?}");
    kill9(before[0].0);
    let took = h.wait("a new tapdisk", 5, || {
        h.tapdisks().iter().any(|(p, _)| *p != before[0].0)
    });
    assert!(
        took < std::time::Duration::from_secs(1),
        "replaced after {took:?}"
    );
    assert_eq!(h.tapdisks()[0].1, before[0].1, "not the same command line");
    let out = fio.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fio failed after the restart: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap();
    assert_eq!(v["jobs"][0]["error"].as_u64(), Some(0), "{text}");
    h.wait("the restart is recorded", 10, || {
        h.vbd_param(&vbd, "tapdisk-restarts") == "1"
    });
    assert_eq!(h.vbd_param(&vbd, "status-detail"), "");
    assert_eq!(h.param(&vm, "power-state"), "running");

    // An image that is gone: every restart dies at once. The VBD fails
    // after a few tries instead of looping, and the CLI says so.
    let location = h.ok(&[
        "vdi-param-get",
        &format!("uuid={vdi}"),
        "param-name=location",
    ]);
    std::fs::remove_file(location.trim()).unwrap();
    kill9(h.tapdisks()[0].0);
    h.wait("the VBD is marked failed", 30, || {
        h.vbd_param(&vbd, "status-detail").contains("died")
    });
    let failed = h.param(&vm, "failed-VBDs");
    assert!(failed.starts_with("xvda: its tapdisk died"), "{failed}");
    let restarts: u32 = h.vbd_param(&vbd, "tapdisk-restarts").parse().unwrap();
    assert_eq!(
        restarts as usize,
        pvio_xenops::supervise::RESTART_LIMIT,
        "restarts"
    );
    assert_eq!(h.tapdisks(), Vec::new(), "a tapdisk is still being started");
    let domid = h.param(&vm, "dom-id");
    let be = format!("/local/domain/0/backend/vbd/{domid}/51712");
    let state = Command::new("xenstore-read")
        .arg(format!("{be}/state"))
        .env("XENSTORED_PATH", h.0.state().join("xenstored.sock"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&state.stdout).trim(),
        "6",
        "backend state"
    );
    // The VM still shuts down cleanly and leaves nothing.
    h.ok(&["vm-shutdown", &format!("uuid={vm}"), "--force"]);
    h.assert_no_trace(&vm);
}

#[test]
fn a_second_daemon_on_a_running_hosts_socket_is_refused_and_the_host_lives_on() {
    let h = Host::start("cli-takeover");
    let state = h.0.state();
    for (daemon, sock, extra) in [
        ("xenstored", "xenstored.sock", vec![]),
        ("hvd", "hvd.sock", vec![]),
        (
            "toolstackd",
            "toolstackd.sock",
            vec!["--state".to_string(), state.display().to_string()],
        ),
    ] {
        let path = state.join(sock);
        assert!(path.exists(), "{}", path.display());
        let mut cmd = Command::new(PVIO);
        cmd.arg(daemon);
        if daemon != "toolstackd" {
            cmd.arg("--socket").arg(&path);
        }
        let out = Command::new("timeout")
            .arg("20")
            .arg(cmd.get_program())
            .args(cmd.get_args())
            .args(&extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(
            out.status.code(),
            Some(124),
            "pvio {daemon} took the socket over and ran"
        );
        assert!(!out.status.success(), "pvio {daemon} started: {err}");
        assert!(
            err.contains("already") || err.contains("another"),
            "pvio {daemon} does not say why: {err}"
        );
        assert!(path.exists(), "pvio {daemon} removed {}", path.display());
    }
    // Every daemon still answers.
    let xs = Command::new("xenstore-exists")
        .arg("/")
        .env("XENSTORED_PATH", state.join("xenstored.sock"))
        .status()
        .expect("xenstore-exists (xenstore-utils)");
    assert!(xs.success(), "xenstored no longer answers");
    let sr = h.sr();
    let vdi = h.vdi(&sr, "d", "4MiB");
    let vm = h.create(&["vm-create", "name-label=after"]);
    h.vbd(&vm, &vdi, 0);
    h.ok(&["vm-start", &format!("uuid={vm}")]);
    assert_eq!(h.param(&vm, "power-state"), "running");
    h.ok(&["vm-shutdown", &format!("uuid={vm}")]);
    h.assert_no_trace(&vm);
}

#[test]
fn a_non_sharable_vdi_is_attached_once_even_to_the_same_vm() {
    let h = Host::start("cli-vdi-once");
    let sr = h.sr();
    let vdi = h.vdi(&sr, "d", "4MiB");
    let vm = h.create(&["vm-create", "name-label=twice"]);
    let first = h.vbd(&vm, &vdi, 0);
    // Two VBDs of one VDI in a halted VM: the start is refused.
    let second = h.vbd(&vm, &vdi, 1);
    let e = h.fails(&["vm-start", &format!("uuid={vm}")]);
    assert!(e.contains("VDI_IN_USE") || e.contains("in use"), "{e}");
    assert_eq!(h.vm_processes(), Vec::<String>::new());
    assert_eq!(h.param(&vm, "power-state"), "halted");
    h.ok(&["vbd-destroy", &format!("uuid={second}")]);
    // Running with the VDI attached: a second VBD of it is refused at
    // create, and one made while halted is refused at plug.
    h.ok(&["vm-start", &format!("uuid={vm}")]);
    let e = h.fails(&[
        "vbd-create",
        &format!("vm-uuid={vm}"),
        &format!("vdi-uuid={vdi}"),
        "device=2",
    ]);
    assert!(e.contains("VDI_IN_USE") || e.contains("in use"), "{e}");
    let vbds = h.ok(&["vbd-list", &format!("vm-uuid={vm}"), "--minimal"]);
    assert_eq!(vbds.trim(), first, "the refused VBD was created");
    h.ok(&["vbd-unplug", &format!("uuid={first}")]);
    let spare = h.vbd(&vm, &vdi, 3);
    h.ok(&["vbd-plug", &format!("uuid={spare}")]);
    let e = h.fails(&["vbd-plug", &format!("uuid={first}")]);
    assert!(e.contains("VDI_IN_USE") || e.contains("in use"), "{e}");
    assert_eq!(h.tapdisks().len(), 1, "two tapdisks on one image");
    h.ok(&["vm-shutdown", &format!("uuid={vm}")]);
    h.assert_no_trace(&vm);
}

#[test]
fn host_param_list_counts_the_hosts_cpus() {
    let h = Host::start("cli-host-cpus");
    let host = h.ok(&["host-list", "--minimal"]);
    let cpus = h
        .ok(&[
            "host-param-get",
            &format!("uuid={}", host.trim()),
            "param-name=cpu_info",
            "param-key=cpu_count",
        ])
        .trim()
        .to_string();
    let online = pvio_xenops::affinity::online_cpus();
    assert_eq!(cpus, online.to_string(), "host-param-list says {cpus} CPUs");
}

#[test]
fn bad_input_is_refused_up_front_in_the_clis_words() {
    let h = Host::start("cli-bad-input");
    let sr = h.sr();
    let before = h.objects();
    let refused = |args: &[&str], words: &[&str]| {
        let e = h.fails(args);
        assert!(!e.contains("internal error"), "{args:?}: {e}");
        for w in words {
            assert!(e.contains(w), "{args:?} does not say {w:?}: {e}");
        }
    };
    // What a later vm-start needs is checked at vm-create, with the limit.
    refused(
        &["vm-create", "name-label=big", "memory=1TiB"],
        &["field: memory", "this host's"],
    );
    refused(
        &["vm-create", "name-label=tiny", "memory-static-max=12"],
        &["field: memory-static-max", "1 MiB"],
    );
    refused(
        &["vm-create", "name-label=wide", "VCPUs-max=999"],
        &["field: VCPUs-max", "1 to 64"],
    );
    refused(
        &["vm-create", "name-label=job", "workload=job:garbage"],
        &["field: workload", "job spec"],
    );
    // Sizes: every unit up to PiB parses; beyond what a file can be, the
    // range is stated; what the SR's filesystem cannot hold says so.
    refused(
        &[
            "vdi-create",
            &format!("sr-uuid={sr}"),
            "name-label=huge",
            "virtual-size=9EiB",
        ],
        &["field: virtual-size", "a VDI is 1 byte to"],
    );
    let o = h.run(&[
        "vdi-create",
        &format!("sr-uuid={sr}"),
        "name-label=peta",
        "virtual-size=1PiB",
    ]);
    let e = String::from_utf8_lossy(&o.stderr);
    if o.status.success() {
        let vdi = String::from_utf8_lossy(&o.stdout).trim().to_string();
        h.ok(&["vdi-destroy", &format!("uuid={vdi}")]);
    } else {
        assert!(
            e.contains("field: virtual-size") && e.contains("at most"),
            "1 PiB on this SR: {e}"
        );
    }
    // An SR's location must be a directory that exists and takes files.
    let file = h.0.dir.0.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let missing = h.0.dir.0.join("no/such/dir");
    for (loc, why) in [
        (file.display().to_string(), "not a directory"),
        (missing.display().to_string(), "no such directory"),
        ("/proc".to_string(), "cannot be made there"),
    ] {
        refused(
            &[
                "sr-create",
                "name-label=bad",
                "type=file",
                &format!("device-config:location={loc}"),
            ],
            &["device-config:location", why],
        );
    }
    assert!(!missing.exists(), "sr-create made {}", missing.display());
    // Two VMs of one name: plain English.
    h.create(&["vm-create", "name-label=twin"]);
    h.create(&["vm-create", "name-label=twin"]);
    let e = h.fails(&["vm-start", "vm=twin"]);
    assert!(e.contains("2 VMs match") && e.contains("--multiple"), "{e}");
    // A backend that dies says why once.
    let vdi = h.vdi(&sr, "gone", "4MiB");
    let vm = h.create(&["vm-create", "name-label=lost-disk"]);
    h.vbd(&vm, &vdi, 0);
    let loc = h.ok(&[
        "vdi-param-get",
        &format!("uuid={vdi}"),
        "param-name=location",
    ]);
    std::fs::remove_file(loc.trim()).unwrap();
    let e = h.fails(&["vm-start", &format!("uuid={vm}")]);
    assert_eq!(
        e.matches(loc.trim()).count(),
        1,
        "the path is repeated: {e}"
    );
    assert!(e.contains("does not exist"), "{e}");
    // None of the refusals left anything behind.
    let after = h.objects();
    for line in before.lines().filter(|l| l.contains("uuid")) {
        assert!(after.contains(line), "{line} went missing");
    }
    assert!(!after.contains("name-label ( RW): big"), "{after}");
    assert!(!after.contains("name-label ( RW): bad"), "{after}");
}
