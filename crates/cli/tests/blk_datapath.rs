//! End-to-end tests of the block datapath: a guest process with blkfront
//! and the job runner, a `pvio tapdisk` backend, hvd and xenstored, all real
//! processes talking over rings, grants, event channels and the xenstore.

use std::time::Duration;

use pvio_bench::host::{make_image, xvd_devid, MiniHost};

fn host(tag: &str) -> MiniHost {
    std::env::set_var("PVIO_BIN", env!("CARGO_BIN_EXE_pvio"));
    MiniHost::start(tag).unwrap()
}

fn run_job(host: &MiniHost, d: &pvio_hv::CreatedDomain, job: &str) -> serde_json::Value {
    host.run_job(d, job).unwrap_or_else(|e| panic!("{e:#}"))
}

#[test]
fn a_guest_writes_and_verifies_through_tapdisk() {
    let host = host("blk-e2e");
    let img = make_image(&host.dir.0, "disk.img", 32 << 20).unwrap();
    let d = host.create_domain("vm1", 64).unwrap();
    let vbd = host
        .add_vbd(d.domid, xvd_devid(0), &img, true, &[])
        .unwrap();
    let _tap = host.start_tapdisk_ready(&vbd, &[]).unwrap();
    let r = run_job(
        &host,
        &d,
        "rw=randwrite,bs=4k,iodepth=8,size=2m,verify=crc32c",
    );
    let total = &r["total"];
    assert!(total["write"]["ios"].as_u64().unwrap() >= 512, "{r}");
    let v = &r["jobs"][0]["verify"];
    assert_eq!(v["failures"].as_u64(), Some(0), "{r}");
    assert!(v["checked"].as_u64().unwrap() >= 512, "{r}");
}

fn wait_for_child(c: &mut std::process::Child, what: &str) -> std::process::ExitStatus {
    let end = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            return st;
        }
        assert!(std::time::Instant::now() < end, "{what} did not finish");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn no_acknowledged_write_is_lost_across_a_backend_restart() {
    let host = host("blk-restart");
    let img = make_image(&host.dir.0, "disk.img", 32 << 20).unwrap();
    let d = host.create_domain("vm1", 64).unwrap();
    let vbd = host
        .add_vbd(d.domid, xvd_devid(0), &img, true, &[])
        .unwrap();
    let mut tap = host.start_tapdisk_ready(&vbd, &[]).unwrap();
    let mut guest = host
        .guest_command(&d)
        .unwrap()
        .args([
            "--job",
            "rw=randwrite,bs=4k,iodepth=8,size=4g,runtime=3s,verify=crc32c",
            "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Kill the backend in the middle of the write phase...
    let end = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let s = host.tapdisk_stats(&vbd).unwrap_or_default();
        if s["metrics"]["total"]["writes"].as_u64().unwrap_or(0) >= 300 {
            break;
        }
        assert!(
            std::time::Instant::now() < end,
            "the guest never started writing"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    tap.0.kill().unwrap();
    tap.0.wait().unwrap();
    // ...and start a new one: the frontend reconnects and pushes again what
    // was in flight.
    let _tap2 = host.start_tapdisk(&vbd, &[]).unwrap();
    let st = wait_for_child(&mut guest, "the guest");
    let mut out = String::new();
    std::io::Read::read_to_string(&mut guest.stdout.take().unwrap(), &mut out).unwrap();
    assert!(st.success(), "guest failed: {out}");
    let r: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let job = &r["jobs"][0];
    assert_eq!(job["verify"]["failures"].as_u64(), Some(0), "{r}");
    let acked = job["verify"]["acked_blocks"].as_u64().unwrap();
    assert!(acked > 300, "{r}");
    assert_eq!(job["verify"]["checked"].as_u64(), Some(acked), "{r}");
    assert_eq!(job["errors"].as_u64(), Some(0), "{r}");
    // The job really ran on both backends: the second one served requests.
    let end = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let s = host.tapdisk_stats(&vbd).unwrap_or_default();
        if s["metrics"]["total"]["requests"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < end,
            "the restarted backend served nothing: {s}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn qemu_img_reads_and_writes_a_disk_through_the_nbd_export() {
    let host = host("blk-nbd");
    let img = make_image(&host.dir.0, "disk.img", 16 << 20).unwrap();
    let d = host.create_domain("vm1", 64).unwrap();
    let vbd = host
        .add_vbd(d.domid, xvd_devid(0), &img, true, &[])
        .unwrap();
    let _tap = host.start_tapdisk_ready(&vbd, &[]).unwrap();
    let sock = host.dir.0.join("nbd.sock");
    let mut guest = host
        .guest_command(&d)
        .unwrap()
        .arg("--nbd")
        .arg(&sock)
        .spawn()
        .unwrap();
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while !sock.exists() {
        assert!(guest.try_wait().unwrap().is_none(), "the guest exited");
        assert!(std::time::Instant::now() < end, "no NBD export appeared");
        std::thread::sleep(Duration::from_millis(10));
    }
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    let run = |args: &[&str]| {
        let o = std::process::Command::new(args[0])
            .args(&args[1..])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    };
    // Read the whole disk through the datapath and compare with the image.
    let out = host.dir.0.join("copy.img");
    run(&[
        "qemu-img",
        "convert",
        "-f",
        "raw",
        "-O",
        "raw",
        &uri,
        out.to_str().unwrap(),
    ]);
    run(&[
        "qemu-img",
        "compare",
        "-f",
        "raw",
        "-F",
        "raw",
        img.to_str().unwrap(),
        out.to_str().unwrap(),
    ]);
    // Write new contents through it, compare through it...
    let fresh = host.dir.0.join("fresh.img");
    let mut bytes = vec![0u8; 16 << 20];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for b in bytes.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    std::fs::write(&fresh, &bytes).unwrap();
    run(&[
        "qemu-img",
        "convert",
        "-n",
        "-f",
        "raw",
        "-O",
        "raw",
        fresh.to_str().unwrap(),
        &uri,
    ]);
    run(&[
        "qemu-img",
        "compare",
        "-f",
        "raw",
        "-F",
        "raw",
        fresh.to_str().unwrap(),
        &uri,
    ]);
    // ...and, once the guest has closed its disk, on the image file itself.
    let _ = std::process::Command::new("kill")
        .arg(guest.id().to_string())
        .status();
    assert!(wait_for_child(&mut guest, "the guest").success());
    assert!(
        std::fs::read(&img).unwrap() == bytes,
        "the image does not hold what was written"
    );
}
