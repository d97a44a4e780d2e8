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
    let out = host
        .guest_command(d)
        .unwrap()
        .args(["--job", job, "--json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "guest failed: {}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[test]
fn a_guest_writes_and_verifies_through_tapdisk() {
    let host = host("blk-e2e");
    let img = make_image(&host.dir.0, "disk.img", 32 << 20).unwrap();
    let d = host.create_domain("vm1", 64).unwrap();
    let vbd = host
        .add_vbd(d.domid, xvd_devid(0), &img, true, &[])
        .unwrap();
    let _tap = host.start_tapdisk(&vbd, &[]).unwrap();
    host.wait_for_value(
        &format!("{}/state", vbd.backend),
        "2",
        Duration::from_secs(20),
    )
    .unwrap();
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
