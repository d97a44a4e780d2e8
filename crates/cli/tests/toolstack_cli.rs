//! `pvio toolstackd` as a process and the xe-style commands against it:
//! objects created, listed and printed as xe prints them, filters,
//! `params=` and `--minimal`, VDI files, refused command lines that change
//! nothing, the 255-VBD limit, persistence across a restart, many clients
//! at once, the raw JSON-RPC, and one VM start in flight (with hvd and
//! xenstored) during which reads are served and other operations refused.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use pvio_toolstack::rpc::Client;
use serde_json::{json, Value};

const PVIO: &str = env!("CARGO_BIN_EXE_pvio");
const DEADLINE: Duration = Duration::from_secs(30);

/// A scratch directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("pvio-ts-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `pvio toolstackd`.
struct Daemon {
    child: Option<Child>,
    socket: PathBuf,
    log: PathBuf,
}

impl Daemon {
    /// Starts toolstackd on `state`; hvd and xenstored sockets that nobody
    /// serves unless given (object operations never need them).
    fn start(state: &Path) -> Daemon {
        Self::start_with(state, &state.join("no-hvd.sock"), &state.join("no-xs.sock"))
    }

    fn start_with(state: &Path, hvd: &Path, xs: &Path) -> Daemon {
        std::fs::create_dir_all(state).unwrap();
        let log = state.join("toolstackd.log");
        let socket = state.join("toolstackd.sock");
        let child = Command::new(PVIO)
            .arg("toolstackd")
            .arg("--state")
            .arg(state)
            .arg("--hvd-socket")
            .arg(hvd)
            .arg("--xenstore-socket")
            .arg(xs)
            .arg("--shutdown-timeout-s")
            .arg("10")
            .env("PVIO_BIN", PVIO)
            .env_remove("PVIO_STATE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut d = Daemon {
            child: Some(child),
            socket,
            log,
        };
        let end = Instant::now() + DEADLINE;
        loop {
            if let Some(st) = d.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("toolstackd exited at start ({st}):\n{}", d.log_text());
            }
            if UnixStream::connect(&d.socket).is_ok() {
                return d;
            }
            assert!(
                Instant::now() < end,
                "toolstackd did not start:\n{}",
                d.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then waits for the exit.
    fn stop(mut self) -> ExitStatus {
        let mut child = self.child.take().unwrap();
        let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        let end = Instant::now() + DEADLINE;
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st;
            }
            assert!(Instant::now() < end, "toolstackd ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn client(&self) -> Client {
        Client::connect(&self.socket).unwrap()
    }

    /// Runs `pvio <args>` against this daemon.
    fn xe(&self, args: &[&str]) -> Out {
        let out = Command::new(PVIO)
            .args(args)
            .env("PVIO_TOOLSTACK_SOCKET", &self.socket)
            .env_remove("PVIO_STATE")
            .output()
            .unwrap();
        Out {
            code: out.status.code(),
            stdout: String::from_utf8(out.stdout).unwrap(),
            stderr: String::from_utf8(out.stderr).unwrap(),
        }
    }

    /// Runs a command that must succeed; returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let o = self.xe(args);
        assert_eq!(o.code, Some(0), "pvio {args:?} failed: {}", o.stderr);
        assert_eq!(o.stderr, "", "pvio {args:?}");
        o.stdout
    }

    /// Runs a create command; returns the new uuid.
    fn create(&self, args: &[&str]) -> String {
        let out = self.ok(args);
        let uuid = out.strip_suffix('\n').expect("one line");
        assert!(is_uuid(uuid), "{args:?} printed {out:?}");
        uuid.to_string()
    }

    /// Runs a command that must fail; returns its stderr.
    fn fails(&self, args: &[&str]) -> String {
        let o = self.xe(args);
        assert_eq!(o.code, Some(1), "pvio {args:?} did not fail: {}", o.stdout);
        assert_eq!(o.stdout, "", "pvio {args:?} printed on failure");
        o.stderr
    }

    /// Everything the toolstack holds, as the CLI prints it.
    fn everything(&self) -> String {
        ["sr", "vdi", "vm", "vbd", "vif", "host"]
            .iter()
            .map(|c| {
                let out = self.ok(&[&format!("{c}-list"), "params=all"]);
                // Measured, not recorded: these move on their own.
                out.lines()
                    .filter(|l| !l.contains("memory-free") && !l.contains("physical-"))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .collect::<Vec<_>>()
            .join("\n----\n")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[derive(Debug)]
struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| {
            if [8, 13, 18, 23].contains(&i) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
}

/// The value of field `name` in xe record text.
fn field<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(": ")?;
            let k = k.trim();
            (k.split(' ').next() == Some(name)).then_some(v)
        })
        .collect()
}

struct Objects {
    sr: String,
    vdi: String,
    vm: String,
    vbd: String,
}

fn make_objects(d: &Daemon) -> Objects {
    let sr = d.create(&["sr-create", "name-label=local", "type=file"]);
    let vdi = d.create(&[
        "vdi-create",
        &format!("sr-uuid={sr}"),
        "name-label=disk, one",
        "virtual-size=1GiB",
    ]);
    let vm = d.create(&[
        "vm-create",
        "name-label=web",
        "VCPUs-max=2",
        "memory=512MiB",
        "workload=job:rw=randread,bs=4k",
    ]);
    let vbd = d.create(&[
        "vbd-create",
        &format!("vm-uuid={vm}"),
        &format!("vdi-uuid={vdi}"),
        "device=0",
    ]);
    Objects { sr, vdi, vm, vbd }
}

#[test]
fn objects_are_created_listed_and_printed_like_xe() {
    let dir = TempDir::new("print");
    let d = Daemon::start(&dir.0);
    let o = make_objects(&d);
    let other = d.create(&["vm-create", "name-label=db", "name-description=second"]);

    // vm-list: xe's default columns, widths and record separators.
    assert_eq!(
        d.ok(&["vm-list"]),
        format!(
            "uuid ( RO)           : {}\n     name-label ( RW): web\n    power-state ( RO): halted\n\n\n\
             uuid ( RO)           : {other}\n     name-label ( RW): db\n    power-state ( RO): halted\n\n\n",
            o.vm
        )
    );
    // params= picks fields but record order wins; --minimal takes the first.
    assert_eq!(
        d.ok(&["vm-list", "params=power-state,name-label"]),
        "name-label ( RW)     : web\n    power-state ( RO): halted\n\n\n\
         name-label ( RW)     : db\n    power-state ( RO): halted\n\n\n"
    );
    assert_eq!(
        d.ok(&["vm-list", "--minimal"]),
        format!("{},{other}\n", o.vm)
    );
    assert_eq!(
        d.ok(&["vm-list", "params=name-label,uuid", "--minimal"]),
        format!("{},{other}\n", o.vm)
    );
    assert_eq!(
        d.ok(&["vdi-list", "params=name-label", "--minimal"]),
        "disk\\, one\n"
    );
    // Filters: scalar, vm= pseudo-field, map and set fields.
    assert_eq!(
        d.ok(&["vm-list", "name-label=db", "--minimal"]),
        format!("{other}\n")
    );
    assert_eq!(d.ok(&["vm-list", "power-state=running", "--minimal"]), "\n");
    assert_eq!(
        d.ok(&["vm-list", "power-state=HALTED", "--minimal"])
            .matches(',')
            .count(),
        1
    );
    assert_eq!(
        d.ok(&["vm-list", &format!("vm={other}"), "--minimal"]),
        format!("{other}\n")
    );
    assert_eq!(
        d.ok(&["vm-list", "vm=web", "--minimal"]),
        format!("{}\n", o.vm)
    );
    assert_eq!(
        d.ok(&["vm-list", &format!("VBDs:contains={}", o.vbd), "--minimal"]),
        format!("{}\n", o.vm)
    );
    assert_eq!(
        d.ok(&["sr-list", "device-config:attach-delay-ms=0", "--minimal"]),
        format!("{}\n", o.sr)
    );
    assert_eq!(
        d.ok(&["vbd-list", &format!("vm-uuid={other}"), "--minimal"]),
        "\n"
    );

    // The full VM record, line by line.
    let rec = d.ok(&["vm-param-list", &format!("uuid={}", o.vm)]);
    let want = format!(
        "uuid ( RO)                  : {vm}\n\
         \x20           name-label ( RW): web\n\
         \x20     name-description ( RW): \n\
         \x20        is-a-template ( RW): false\n\
         \x20    is-control-domain ( RO): false\n\
         \x20          power-state ( RO): halted\n\
         \x20        memory-actual ( RO): 0\n\
         \x20    memory-static-max ( RW): 536870912\n\
         \x20            VCPUs-max ( RW): 2\n\
         \x20     VCPUs-at-startup ( RW): 2\n\
         \x20   allowed-operations (SRO): start; destroy\n\
         \x20   current-operations (SRO): \n\
         \x20          resident-on ( RO): <not in database>\n\
         \x20               dom-id ( RO): -1\n\
         \x20                 VBDs (SRO): {vbd}\n\
         \x20          failed-VBDs (MRO): \n\
         \x20        guest-metrics (MRO): \n\
         \x20             workload ( RW): job:rw=randread,bs=4k\n\n\n",
        vm = o.vm,
        vbd = o.vbd
    );
    assert_eq!(rec, want);

    // The VBD, VDI and SR records and their default lists.
    let vbds = d.ok(&["vbd-list"]);
    assert_eq!(
        vbds,
        format!(
            "uuid ( RO)             : {}\n\
             \x20         vm-uuid ( RO): {}\n\
             \x20   vm-name-label ( RO): web\n\
             \x20        vdi-uuid ( RO): {}\n\
             \x20           empty ( RO): false\n\
             \x20          device ( RO): xvda\n\n\n",
            o.vbd, o.vm, o.vdi
        )
    );
    let vbd = d.ok(&["vbd-param-list", &format!("uuid={}", o.vbd)]);
    assert_eq!(field(&vbd, "userdevice"), ["0"]);
    assert_eq!(field(&vbd, "mode"), ["RW"]);
    assert_eq!(field(&vbd, "type"), ["Disk"]);
    assert_eq!(field(&vbd, "currently-attached"), ["false"]);
    assert_eq!(field(&vbd, "vdi-name-label"), ["disk, one"]);
    let vdi = d.ok(&["vdi-list"]);
    assert_eq!(field(&vdi, "virtual-size"), ["1073741824"]);
    assert_eq!(field(&vdi, "sr-uuid"), [o.sr.as_str()]);
    assert!(
        vdi.starts_with(&format!("uuid ( RO)                : {}\n", o.vdi)),
        "{vdi}"
    );
    let sr = d.ok(&["sr-param-list", &format!("uuid={}", o.sr)]);
    assert_eq!(field(&sr, "type"), ["file"]);
    assert_eq!(field(&sr, "VDIs"), [o.vdi.as_str()]);
    assert_eq!(field(&sr, "virtual-allocation"), ["1073741824"]);
    let loc = dir.0.join("sr").join(&o.sr);
    assert_eq!(
        field(&sr, "device-config"),
        [format!("attach-delay-ms: 0; location: {}", loc.display()).as_str()]
    );

    // param-get: scalars, maps by key, aliases; param-set.
    let get =
        |args: &[&str]| d.ok(&[&["vm-param-get", &format!("uuid={}", o.vm)][..], args].concat());
    assert_eq!(get(&["param-name=power-state"]), "halted\n");
    assert_eq!(get(&["param-name=domid"]), "-1\n");
    assert_eq!(get(&["param-name=workload"]), "job:rw=randread,bs=4k\n");
    d.ok(&[
        "vm-param-set",
        &format!("uuid={}", o.vm),
        "name-description=front end",
        "VCPUs-max=4",
        "workload=idle",
    ]);
    assert_eq!(get(&["param-name=VCPUs-max"]), "4\n");
    assert_eq!(get(&["param-name=name-description"]), "front end\n");
    assert_eq!(get(&["param-name=workload"]), "idle\n");
    assert_eq!(
        d.ok(&[
            "sr-param-get",
            &format!("uuid={}", o.sr),
            "param-name=device-config",
            "param-key=location"
        ]),
        format!("{}\n", loc.display())
    );

    // The host: one, named after the machine.
    let hosts = d.ok(&["host-list", "--minimal"]);
    let host = hosts.trim_end();
    assert!(is_uuid(host), "{hosts}");
    let h = d.ok(&["host-param-list", &format!("uuid={host}")]);
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(field(&h, "name-label"), [hostname.trim()]);
    let cpus = std::thread::available_parallelism()
        .unwrap()
        .get()
        .to_string();
    assert!(
        field(&h, "cpu_info")[0].contains(&format!("cpu_count: {cpus}")),
        "{h}"
    );
    assert!(field(&h, "memory-total")[0].parse::<u64>().unwrap() > 0);

    // VIFs: generated and given MACs.
    let vif = d.create(&["vif-create", &format!("vm-uuid={}", o.vm), "device=0"]);
    let mac = d.ok(&["vif-param-get", &format!("uuid={vif}"), "param-name=MAC"]);
    assert_eq!(mac.len(), 18, "{mac}");
    let vif2 = d.create(&[
        "vif-create",
        &format!("vm-uuid={}", o.vm),
        "device=1",
        "mac=AA:00:00:00:00:01",
    ]);
    assert_eq!(
        d.ok(&["vif-list", "MAC-autogenerated=false", "--minimal"]),
        format!("{vif2}\n")
    );
    let e = d.fails(&["vif-create", &format!("vm-uuid={}", o.vm), "device=1"]);
    assert!(
        e.contains("A device with the name given already exists") && e.contains("device: 1"),
        "{e}"
    );
    d.ok(&["vif-destroy", &format!("uuid={vif2}")]);
    assert_eq!(d.ok(&["vif-list", "--minimal"]), format!("{vif}\n"));

    // vm-destroy takes the VBDs and VIFs but leaves the VDI.
    d.ok(&["vm-destroy", &format!("uuid={}", o.vm)]);
    assert_eq!(d.ok(&["vbd-list", "--minimal"]), "\n");
    assert_eq!(d.ok(&["vif-list", "--minimal"]), "\n");
    assert_eq!(d.ok(&["vdi-list", "--minimal"]), format!("{}\n", o.vdi));
    assert!(d.stop().success());
}

#[test]
fn vdi_files_follow_create_and_destroy() {
    let dir = TempDir::new("files");
    let d = Daemon::start(&dir.0);
    let own = dir.0.join("elsewhere");
    // A location given in device-config is a directory that exists.
    std::fs::create_dir(&own).unwrap();
    let sr = d.create(&[
        "sr-create",
        "name-label=mine",
        "type=file",
        &format!("device-config:location={}", own.display()),
        "device-config:attach-delay-ms=250",
    ]);
    assert!(own.is_dir());
    let mut vdis = Vec::new();
    for (size, bytes) in [
        ("1GiB", 1u64 << 30),
        ("512MiB", 512 << 20),
        ("1048576", 1 << 20),
        ("3 KiB", 3072),
    ] {
        let vdi = d.create(&[
            "vdi-create",
            &format!("sr-uuid={sr}"),
            "name-label=d",
            &format!("virtual-size={size}"),
        ]);
        let file = own.join(format!("{vdi}.raw"));
        let meta = std::fs::metadata(&file).unwrap();
        assert_eq!(meta.len(), bytes, "{size}");
        assert!(
            meta.blocks() * 512 < 1 << 20,
            "{size}: the image is not sparse"
        );
        let got = d.ok(&[
            "vdi-param-get",
            &format!("uuid={vdi}"),
            "param-name=virtual-size",
        ]);
        assert_eq!(got, format!("{bytes}\n"));
        let loc = d.ok(&[
            "vdi-param-get",
            &format!("uuid={vdi}"),
            "param-name=location",
        ]);
        assert_eq!(loc, format!("{}\n", file.display()));
        vdis.push((vdi, file));
    }
    // A size that is not whole sectors is rounded up, as SMs do.
    let odd = d.create(&[
        "vdi-create",
        &format!("sr-uuid={sr}"),
        "name-label=o",
        "virtual-size=1000",
    ]);
    assert_eq!(
        std::fs::metadata(own.join(format!("{odd}.raw")))
            .unwrap()
            .len(),
        1024
    );
    // A VDI in use by a VBD stays, file and all.
    let vm = d.create(&["vm-create", "name-label=v"]);
    let vbd = d.create(&[
        "vbd-create",
        &format!("vm-uuid={vm}"),
        &format!("vdi-uuid={}", vdis[0].0),
        "device=1",
    ]);
    let e = d.fails(&["vdi-destroy", &format!("uuid={}", vdis[0].0)]);
    assert!(
        e.contains("this VDI is in use")
            && e.contains(&vdis[0].0)
            && e.contains("operation: destroy"),
        "{e}"
    );
    assert!(vdis[0].1.exists());
    // An SR with VDIs stays.
    let e = d.fails(&["sr-destroy", &format!("uuid={sr}")]);
    assert!(e.contains("the SR is not empty"), "{e}");
    d.ok(&["vbd-destroy", &format!("uuid={vbd}")]);
    for (vdi, file) in &vdis {
        d.ok(&["vdi-destroy", &format!("uuid={vdi}")]);
        assert!(!file.exists(), "{} left behind", file.display());
    }
    d.ok(&["vdi-destroy", &format!("uuid={odd}")]);
    assert_eq!(d.ok(&["vdi-list", "--minimal"]), "\n");
    d.ok(&["sr-destroy", &format!("uuid={sr}")]);
    assert!(!own.exists(), "the emptied SR directory stayed");
    assert!(d.stop().success());
}

#[test]
fn refused_command_lines_change_nothing() {
    let dir = TempDir::new("refuse");
    let d = Daemon::start(&dir.0);
    let o = make_objects(&d);
    let before = d.everything();
    let files_before: Vec<_> = std::fs::read_dir(dir.0.join("sr").join(&o.sr))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let sr = format!("sr-uuid={}", o.sr);
    let vm = format!("vm-uuid={}", o.vm);
    let vdi = format!("vdi-uuid={}", o.vdi);
    let bogus = "00000000-0000-4000-8000-00000000dead";
    let uuid = |u: &str| format!("uuid={u}");
    let bogus_sr = format!("sr-uuid={bogus}");
    let bogus_vm = format!("vm-uuid={bogus}");
    let (ovm, ovbd) = (uuid(&o.vm), uuid(&o.vbd));
    let bogus_uuid = uuid(bogus);
    let c = |args: &[&str], wants: &[&str]| -> (Vec<String>, Vec<String>) {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        (own(args), own(wants))
    };
    #[rustfmt::skip]
    let cases = [
        c(&["vdi-create", &sr, "virtual-size=1GiB"], &["Required parameter not found: name-label", "For usage run: 'pvio vdi-create --help'"]),
        c(&["vdi-create", &sr, "name-label=x", "virtual-size=1GiB", "colour=red"], &["Unknown parameter: colour"]),
        c(&["vdi-create", &sr, "name-label=x", "virtual-size=lots"], &["Failed to parse field 'virtual-size'", "got 'lots'"]),
        c(&["vdi-create", &sr, "name-label=x", "virtual-size=0"], &["not supported", "field: virtual-size", "a VDI is 1 byte to"]),
        c(&["vdi-create", &bogus_sr, "name-label=x", "virtual-size=1MiB"], &["The uuid you supplied was invalid.", "type: SR", &format!("uuid: {bogus}")]),
        c(&["vdi-create", "sr-uuid=not-a-uuid", "name-label=x", "virtual-size=1MiB"], &["The uuid you supplied was invalid.", "uuid: not-a-uuid"]),
        c(&["sr-create", "name-label=x", "type=nfs"], &["driver was not recognised", "driver: nfs"]),
        c(&["sr-create", "name-label=x", "type=file", "device-config:location=relative"], &["field: device-config:location"]),
        c(&["sr-create", "name-label=x", "type=file", "device-config:speed=fast"], &["device-config:speed"]),
        c(&["sr-create", "type=file"], &["Required parameter not found: name-label"]),
        c(&["vm-create", "name-label=x", "VCPUs-max=0"], &["field: VCPUs-max", "value: 0", "1 to 64"]),
        c(&["vm-create", "name-label=x", "workload=dance"], &["field: workload", "value: dance"]),
        c(&["vm-create", "name-label=x", "memory=12parsecs"], &["Failed to parse field 'memory'"]),
        c(&["vm-create", "name-label=x", "cores=2"], &["Unknown parameter: cores"]),
        c(&["vbd-create", &vm, &vdi, "device=0"], &["A device with the name given already exists", "device: 0"]),
        c(&["vbd-create", &vm, &vdi, "device=255"], &["The device name is invalid", "device: 255"]),
        c(&["vbd-create", &vm, &vdi, "device=1", "mode=RX"], &["field: mode", "value: RX"]),
        c(&["vbd-create", &vm, &vdi, "device=1", "type=CD"], &["field: type", "value: CD"]),
        c(&["vbd-create", &bogus_vm, &vdi, "device=1"], &["type: VM", &format!("uuid: {bogus}")]),
        c(&["vbd-create", &vm, "device=1"], &["Required parameter not found: vdi-uuid"]),
        c(&["vif-create", &vm, "device=0", "mac=zz:00:00:00:00:00"], &["The MAC address specified is not valid.", "MAC: zz:00:00:00:00:00"]),
        c(&["vif-create", &vm], &["Required parameter not found: device"]),
        c(&["vm-destroy", &bogus_uuid], &["type: VM"]),
        c(&["vm-list", "colour=red"], &["Unknown parameter: colour"]),
        c(&["vm-list", "params=uuid,colour"], &["'colour' is not a field of the VM class"]),
        c(&["vm-param-get", &ovm, "param-name=colour"], &["Parameter 'colour' is not a field of the VM class"]),
        c(&["vm-param-get", &ovm, "param-name=guest-metrics", "param-key=nope"], &["Key nope not found in map"]),
        c(&["vm-param-set", &ovm, "VCPUs-max=1000"], &["field: VCPUs-max"]),
        c(&["vm-param-set", &ovm, "name-label=renamed", "workload=dance"], &["value: dance"]),
        c(&["vm-shutdown", "vm=web"], &["expected: running", "actual: halted"]),
        c(&["vm-start", "vm=nobody"], &["Error: No matching VMs found"]),
        c(&["vbd-plug", &ovbd], &["expected: running"]),
        c(&["vbd-unplug", &ovbd], &["expected: running"]),
        c(&["vm-list", "stray"], &["Syntax error: expected key=value, got 'stray'"]),
        c(&["vm-list", "-s", "host"], &["Unknown switch: -s"]),
    ];
    for (args, wants) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let err = d.fails(&args);
        for want in wants {
            assert!(
                err.contains(want.as_str()),
                "pvio {args:?}: wanted {want:?} in:\n{err}"
            );
        }
    }
    assert_eq!(
        d.everything(),
        before,
        "a refused command changed something"
    );
    let files_after: Vec<_> = std::fs::read_dir(dir.0.join("sr").join(&o.sr))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(files_after, files_before);
    assert!(d.stop().success());
}

#[test]
fn a_vm_has_at_most_255_vbds_one_per_userdevice() {
    let dir = TempDir::new("limit");
    let d = Daemon::start(&dir.0);
    let sr = d.create(&["sr-create", "name-label=s", "type=file"]);
    let vm = d.create(&["vm-create", "name-label=many"]);
    // Through the RPC for speed; the limits are checked through the CLI.
    let mut c = d.client();
    let vdi: String = c
        .call_as(
            "VDI.create",
            json!({"SR": sr, "name_label": "shared", "virtual_size": 1 << 20, "sharable": true}),
        )
        .unwrap();
    for n in 0..254u32 {
        let userdevice = if n % 2 == 0 {
            json!(n)
        } else {
            json!(n.to_string())
        };
        let _: String = c
            .call_as(
                "VBD.create",
                json!({"VM": vm, "VDI": vdi, "userdevice": userdevice, "mode": "RO"}),
            )
            .unwrap();
    }
    let vmp = format!("vm-uuid={vm}");
    let vdip = format!("vdi-uuid={vdi}");
    let e = d.fails(&["vbd-create", &vmp, &vdip, "device=17"]);
    assert!(
        e.contains("A device with the name given already exists") && e.contains("device: 17"),
        "{e}"
    );
    let last = d.create(&["vbd-create", &vmp, &vdip, "device=autodetect", "mode=RO"]);
    assert_eq!(
        d.ok(&[
            "vbd-param-get",
            &format!("uuid={last}"),
            "param-name=userdevice"
        ]),
        "254\n"
    );
    assert_eq!(
        d.ok(&[
            "vbd-param-get",
            &format!("uuid={last}"),
            "param-name=device"
        ]),
        "xvdiu\n"
    );
    let e = d.fails(&["vbd-create", &vmp, &vdip, "device=autodetect"]);
    assert!(e.contains("255 VBDs"), "{e}");
    let e = d.fails(&["vbd-create", &vmp, &vdip, "device=255"]);
    assert!(e.contains("The device name is invalid"), "{e}");
    let list = d.ok(&["vbd-list", &format!("vm-uuid={vm}"), "--minimal"]);
    assert_eq!(list.trim_end().split(',').count(), 255);
    let vbds = d.ok(&["vm-param-get", &format!("uuid={vm}"), "param-name=VBDs"]);
    assert_eq!(vbds.trim_end().split("; ").count(), 255);
    // Freeing a slot lets autodetect find it.
    let at_100 = d.ok(&["vbd-list", &vmp, "userdevice=100", "--minimal"]);
    d.ok(&["vbd-destroy", &format!("uuid={}", at_100.trim_end())]);
    let again = d.create(&["vbd-create", &vmp, &vdip, "device=autodetect"]);
    assert_eq!(
        d.ok(&[
            "vbd-param-get",
            &format!("uuid={again}"),
            "param-name=userdevice"
        ]),
        "100\n"
    );
    assert!(d.stop().success());
}

#[test]
fn the_objects_survive_a_restart_and_running_vms_come_back_halted() {
    let dir = TempDir::new("restart");
    let d = Daemon::start(&dir.0);
    let o = make_objects(&d);
    let before = d.everything();
    assert!(d.stop().success(), "toolstackd did not exit 0 on SIGTERM");
    assert!(
        !dir.0.join("toolstackd.sock").exists(),
        "the socket was left behind"
    );

    // A crash with a VM recorded running: the next toolstackd halts it.
    {
        let db = rusqlite::Connection::open(dir.0.join("toolstack.db")).unwrap();
        let v: i64 = db
            .query_row("SELECT version FROM schema_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v, pvio_toolstack::db::SCHEMA_VERSION);
        db.execute("UPDATE vm SET power_state = 'running', domid = 7", [])
            .unwrap();
        db.execute("UPDATE vbd SET currently_attached = 1", [])
            .unwrap();
    }
    let d = Daemon::start(&dir.0);
    assert_eq!(d.everything(), before);
    assert!(d.log_text().contains("now halted"), "{}", d.log_text());
    let host_before = d.ok(&["host-list", "--minimal"]);
    assert!(d.stop().success());

    // And once more, cleanly: the same host, the same objects.
    let d = Daemon::start(&dir.0);
    assert_eq!(d.ok(&["host-list", "--minimal"]), host_before);
    assert_eq!(d.everything(), before);
    assert!(d.ok(&["vm-list", "--minimal"]).contains(&o.vm));
    // A second daemon on the same state directory is refused before it
    // touches anything: the first one's running VM stays running.
    let db = rusqlite::Connection::open(dir.0.join("toolstack.db")).unwrap();
    db.execute("UPDATE vm SET power_state = 'running', domid = 7", [])
        .unwrap();
    for socket in [dir.0.join("toolstackd.sock"), dir.0.join("other.sock")] {
        let second = Command::new(PVIO)
            .args(["toolstackd", "--state"])
            .arg(&dir.0)
            .arg("--socket")
            .arg(&socket)
            .env_remove("PVIO_STATE")
            .output()
            .unwrap();
        assert!(!second.status.success());
        let err = String::from_utf8_lossy(&second.stderr);
        assert!(err.contains("another toolstackd"), "{err}");
    }
    assert_eq!(
        d.ok(&["vm-list", "params=power-state", "--minimal"]),
        "running\n"
    );
    db.execute("UPDATE vm SET power_state = 'halted', domid = -1", [])
        .unwrap();
    assert_eq!(d.everything(), before);
    assert!(d.stop().success());
}

#[test]
fn fifty_clients_at_once() {
    let dir = TempDir::new("parallel");
    let d = Daemon::start(&dir.0);
    let o = make_objects(&d);
    let want = d.ok(&["vm-list"]);
    let socket = d.socket.clone();
    let lists: Vec<_> = (0..50)
        .map(|_| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let out = Command::new(PVIO)
                    .arg("vm-list")
                    .env("PVIO_TOOLSTACK_SOCKET", &socket)
                    .output()
                    .unwrap();
                assert!(out.status.success());
                String::from_utf8(out.stdout).unwrap()
            })
        })
        .collect();
    // Meanwhile, writers: fifty VMs created over the RPC from other threads.
    let creators: Vec<_> = (0..5)
        .map(|t| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(&socket).unwrap();
                (0..10)
                    .map(|i| {
                        c.call_as::<String>("VM.create", json!({"name_label": format!("p{t}-{i}")}))
                            .unwrap()
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for l in lists {
        let out = l.join().unwrap();
        // Every answer is whole records, the original VM among them.
        assert!(out.contains(&want), "{out}");
        assert!(out.ends_with("\n\n\n"));
    }
    let mut created: Vec<String> = creators
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    created.push(o.vm);
    created.sort();
    let mut listed: Vec<String> = d
        .ok(&["vm-list", "--minimal"])
        .trim_end()
        .split(',')
        .map(String::from)
        .collect();
    listed.sort();
    assert_eq!(listed, created);
    assert!(d.stop().success());
}

#[test]
fn raw_json_rpc_requests_and_errors() {
    let dir = TempDir::new("rpc");
    let d = Daemon::start(&dir.0);
    let mut s = UnixStream::connect(&d.socket).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut quiet = s.try_clone().unwrap();
    let mut ask = |line: &str| -> Value {
        s.write_all(line.as_bytes()).unwrap();
        s.write_all(b"\n").unwrap();
        let mut answer = String::new();
        r.read_line(&mut answer).unwrap();
        serde_json::from_str(&answer).unwrap()
    };
    let v = ask(r#"{"jsonrpc":"2.0","id":1,"method":"VM.create","params":{"name_label":"rpc"}}"#);
    let uuid = v["result"].as_str().unwrap().to_string();
    assert!(is_uuid(&uuid));
    let v = ask(&format!(
        r#"{{"jsonrpc":"2.0","id":"two","method":"VM.get_record","params":{{"uuid":"{uuid}"}}}}"#
    ));
    assert_eq!(v["id"], "two");
    assert_eq!(v["result"]["power_state"], "Halted");
    assert_eq!(v["result"]["VCPUs_max"], 1);
    assert_eq!(v["result"]["memory_static_max"], 256 << 20);
    assert_eq!(v["result"]["workload"], "idle");
    assert_eq!(v["result"]["domid"], -1);
    let v = ask(r#"{"jsonrpc":"2.0","id":3,"method":"VM.get_record","params":{"uuid":"nope"}}"#);
    assert_eq!(v["error"]["code"], -32000);
    assert_eq!(
        v["error"]["data"],
        json!({"code": "UUID_INVALID", "params": ["VM", "nope"]})
    );
    let v = ask(r#"{"jsonrpc":"2.0","id":4,"method":"VM.fly"}"#);
    assert_eq!(v["error"]["code"], -32601);
    assert_eq!(v["error"]["data"]["code"], "MESSAGE_METHOD_UNKNOWN");
    let v = ask(r#"{"jsonrpc":"2.0","id":5,"method":"VM.create","params":{}}"#);
    assert_eq!(v["error"]["code"], -32602);
    assert_eq!(
        v["error"]["data"],
        json!({"code": "MISSING_PARAMETER", "params": ["name_label"]})
    );
    let v = ask(
        r#"{"jsonrpc":"2.0","id":6,"method":"VM.create","params":{"name_label":"x","cpus":2}}"#,
    );
    assert_eq!(
        v["error"]["data"],
        json!({"code": "UNKNOWN_PARAMETER", "params": ["VM.create", "cpus"]})
    );
    let v = ask(r#"{"jsonrpc":"2.0","id":7,"method":"VM.create","params":{"name_label":5}}"#);
    assert_eq!(v["error"]["data"]["code"], "FIELD_TYPE_ERROR");
    let v = ask(r#"{"jsonrpc":"2.0","id":8"#);
    assert_eq!(
        (v["error"]["code"].clone(), v["id"].clone()),
        (json!(-32700), Value::Null)
    );
    let v = ask(r#"{"jsonrpc":"2.0","id":9,"method":"system.listMethods"}"#);
    let methods: Vec<&str> = v["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    for m in [
        "VM.start",
        "VM.shutdown",
        "VBD.plug",
        "VBD.unplug",
        "SR.create",
        "VDI.create",
        "host.get_record",
    ] {
        assert!(methods.contains(&m), "{m}");
    }
    // A notification is run but not answered: the next answer is for id 10.
    quiet
        .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"VM.create\",\"params\":{\"name_label\":\"quiet\"}}\n")
        .unwrap();
    let v = ask(r#"{"jsonrpc":"2.0","id":10,"method":"VM.get_all_records"}"#);
    assert_eq!(v["id"], 10);
    assert_eq!(v["result"].as_array().unwrap().len(), 2);
    // A start that the engine refuses (no hvd here) leaves the VM halted.
    let v = ask(&format!(
        r#"{{"jsonrpc":"2.0","id":11,"method":"VM.start","params":{{"uuid":"{uuid}"}}}}"#
    ));
    assert_eq!(v["error"]["data"]["code"], "INTERNAL_ERROR", "{v}");
    let v = ask(&format!(
        r#"{{"jsonrpc":"2.0","id":12,"method":"VM.get_record","params":{{"uuid":"{uuid}"}}}}"#
    ));
    assert_eq!(v["result"]["power_state"], "Halted");
    assert_eq!(v["result"]["current_operations"], json!([]));
    drop(r);
    assert!(d.stop().success());
}

#[test]
fn a_failed_start_leaves_the_vm_halted_and_its_disks_detached() {
    let dir = TempDir::new("nostart");
    let d = Daemon::start(&dir.0);
    let o = make_objects(&d);
    let before = d.everything();
    let e = d.fails(&["vm-start", &format!("uuid={}", o.vm)]);
    assert!(
        e.contains("The server failed to handle your request"),
        "{e}"
    );
    assert!(e.contains("hvd"), "the reason is not given: {e}");
    assert_eq!(d.everything(), before);
    // Without a selector every VM is meant: more than one needs --multiple,
    // and then each failure is reported.
    let other = d.create(&["vm-create", "name-label=other"]);
    let before = d.everything();
    let e = d.fails(&["vm-start"]);
    assert!(e.contains("add --multiple"), "{e}");
    let e = d.fails(&["vm-start", "--multiple"]);
    assert!(
        e.contains(&format!("operation failed on {}: ", o.vm)),
        "{e}"
    );
    assert!(e.contains(&format!("operation failed on {other}: ")), "{e}");
    assert_eq!(d.everything(), before);
    assert!(d.stop().success());
}

/// With hvd and xenstored: one VM start in flight (its SR takes seconds to
/// attach each disk) while other clients read and try other operations.
#[test]
fn reads_are_served_and_other_operations_refused_while_a_vm_starts() {
    std::env::set_var("PVIO_BIN", PVIO);
    let host = pvio_bench::host::MiniHost::start("ts-inflight").unwrap();
    let dir = TempDir::new("inflight");
    let d = Daemon::start_with(&dir.0, &host.hvd_socket, &host.xs_socket);
    let sr = d.create(&[
        "sr-create",
        "name-label=slow",
        "type=file",
        "device-config:attach-delay-ms=4000",
    ]);
    let vm = d.create(&["vm-create", "name-label=slowpoke", "memory=64MiB"]);
    for n in 0..2 {
        let vdi = d.create(&[
            "vdi-create",
            &format!("sr-uuid={sr}"),
            "name-label=d",
            "virtual-size=16MiB",
        ]);
        d.create(&[
            "vbd-create",
            &format!("vm-uuid={vm}"),
            &format!("vdi-uuid={vdi}"),
            &format!("device={n}"),
        ]);
    }
    let socket = d.socket.clone();
    let vm2 = vm.clone();
    let starter = std::thread::spawn(move || {
        Command::new(PVIO)
            .args(["vm-start", &format!("uuid={vm2}")])
            .env("PVIO_TOOLSTACK_SOCKET", &socket)
            .output()
            .unwrap()
    });
    // Reads answer while the start is in flight, and show it.
    let end = Instant::now() + DEADLINE;
    loop {
        let ops = d.ok(&[
            "vm-param-get",
            &format!("uuid={vm}"),
            "param-name=current-operations",
        ]);
        if ops == "start\n" {
            break;
        }
        if starter.is_finished() {
            let out = starter.join().unwrap();
            panic!(
                "the start ended ({}) before it was seen in flight: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(Instant::now() < end, "the start never showed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        d.ok(&["vm-list", "params=power-state", "--minimal"]),
        "halted\n"
    );
    for args in [
        vec!["vm-start".to_string(), format!("uuid={vm}")],
        vec!["vm-destroy".to_string(), format!("uuid={vm}")],
        vec![
            "vm-param-set".to_string(),
            format!("uuid={vm}"),
            "VCPUs-max=2".into(),
        ],
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let e = d.fails(&args);
        assert!(
            e.contains("Another operation involving the object is currently in progress")
                && e.contains(&format!("object: {vm}"))
                && e.contains("operation_type: start"),
            "{args:?}: {e}"
        );
    }
    assert!(
        !starter.is_finished(),
        "the checks outlasted the start: make the SR slower"
    );
    let out = starter.join().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        d.ok(&["vm-list", "params=power-state", "--minimal"]),
        "running\n"
    );
    assert_eq!(
        d.ok(&["vbd-list", "params=currently-attached", "--minimal"]),
        "true,true\n"
    );
    assert!(d
        .fails(&["vm-destroy", &format!("uuid={vm}")])
        .contains("actual: running"));
    d.ok(&["vm-shutdown", "--force", &format!("uuid={vm}")]);
    assert_eq!(
        d.ok(&["vm-list", "params=power-state,dom-id", "--minimal"]),
        "halted\n"
    );
    assert_eq!(
        d.ok(&["vbd-list", "params=currently-attached", "--minimal"]),
        "false,false\n"
    );
    assert!(d.stop().success());
}
