//! A guest's NBD export driven by software nobody here wrote (fio's `nbd`
//! engine, qemu-io, qemu-img, nbdcopy, nbdinfo) through the whole block
//! datapath: the NBD server in the guest process, blkfront, the rings and
//! grants, hvd and a real `pvio tapdisk` on a raw image.
//!
//! The guest's NBD export holds 32 buffers of 1 MiB (8,192 granted pages),
//! far more than the backend's persistent-grant cache (1,056), so once a
//! large request has filled the cache every later request mixes grants the
//! cache holds with grants it must map for that request only. Every test
//! fills the cache first and then varies request sizes from 512 B to the
//! export's advertised maximum, verifying the data.

use std::path::PathBuf;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use pvio_bench::host::{make_image, xvd_devid, MiniHost, Vbd};
use pvio_bench::procs::ChildGuard;

const MIB: u64 = 1 << 20;

/// A host with one VM whose first disk is exported over NBD.
struct Export {
    host: MiniHost,
    vbd: Vbd,
    img: PathBuf,
    sock: PathBuf,
    guest: Child,
    _tap: ChildGuard,
}

impl Export {
    /// An export of a raw image of `image_bytes` filled with a pattern.
    fn start(tag: &str, image_bytes: u64, tapdisk_args: &[&str]) -> Self {
        Self::start_on(tag, tapdisk_args, |dir| {
            make_image(dir, "disk.img", image_bytes).unwrap()
        })
    }

    /// An export of the image `make` creates in the host's directory.
    fn start_on(
        tag: &str,
        tapdisk_args: &[&str],
        make: impl FnOnce(&std::path::Path) -> PathBuf,
    ) -> Self {
        std::env::set_var("PVIO_BIN", env!("CARGO_BIN_EXE_pvio"));
        let host = MiniHost::start(tag).unwrap();
        let img = make(&host.dir.0);
        let d = host.create_domain("vm1", 128).unwrap();
        let vbd = host
            .add_vbd(d.domid, xvd_devid(0), &img, true, &[])
            .unwrap();
        let tap = host.start_tapdisk_ready(&vbd, tapdisk_args).unwrap();
        let sock = host.dir.0.join("nbd.sock");
        let mut guest = host
            .guest_command(&d)
            .unwrap()
            .arg("--nbd")
            .arg(&sock)
            .spawn()
            .unwrap();
        let end = Instant::now() + Duration::from_secs(30);
        while !sock.exists() {
            assert!(guest.try_wait().unwrap().is_none(), "the guest exited");
            assert!(Instant::now() < end, "no NBD export appeared");
            std::thread::sleep(Duration::from_millis(10));
        }
        Self {
            host,
            vbd,
            img,
            sock,
            guest,
            _tap: tap,
        }
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.sock.display())
    }

    fn path(&self, name: &str) -> PathBuf {
        self.host.dir.0.join(name)
    }

    /// Requests the tapdisk refused or failed, once its counters are final.
    fn refused(&self) -> u64 {
        let s = settled_stats(&self.host, &self.vbd);
        let t = &s["metrics"]["total"];
        t["invalid"].as_u64().unwrap_or(0) + t["io_errors"].as_u64().unwrap_or(0)
    }

    /// Stops the guest (SIGTERM) and waits for it, so the image is final.
    fn stop_guest(&mut self) {
        let _ = Command::new("kill")
            .arg(self.guest.id().to_string())
            .status();
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = self.guest.try_wait().unwrap() {
                assert!(st.success(), "the guest failed: {st}");
                return;
            }
            assert!(Instant::now() < end, "the guest did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        let _ = self.guest.kill();
        let _ = self.guest.wait();
    }
}

/// The tapdisk's stats once no I/O changes them: the file is rewritten each
/// second while its contents change, so once it is over a second old it
/// holds the final counters.
fn settled_stats(host: &MiniHost, vbd: &Vbd) -> serde_json::Value {
    let p = host
        .dir
        .0
        .join(format!("tapdisk-{}-{}.json", vbd.domid, vbd.devid));
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let age = std::fs::metadata(&p)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok());
        if age.is_some_and(|a| a > Duration::from_millis(1500)) {
            return host.tapdisk_stats(vbd).unwrap();
        }
        assert!(Instant::now() < end, "{} never settled", p.display());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs a client under `timeout 300` and returns its output; a missing tool
/// or a hang fails with a clear message.
fn tool(name: &str, args: &[&str]) -> Output {
    let out = Command::new("timeout")
        .arg("300")
        .arg(name)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {name}: {e}"));
    assert_ne!(
        out.status.code(),
        Some(127),
        "{name} is not installed (scripts/install-deps.sh installs it)"
    );
    assert_ne!(out.status.code(), Some(124), "{name} {args:?} hung");
    out
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs a client and fails the test unless it succeeds.
fn ok(name: &str, args: &[&str]) -> String {
    let o = tool(name, args);
    let t = text(&o);
    assert!(o.status.success(), "{name} {args:?} failed:\n{t}");
    t
}

/// `qemu-img compare` of two raw images (files or NBD URIs): they must
/// hold the same bytes.
fn same(a: &str, b: &str) {
    ok("qemu-img", &["compare", "-f", "raw", "-F", "raw", a, b]);
}

/// qemu-io commands against the export; every command must succeed (qemu-io
/// reports a failed command or a pattern mismatch in its output, and in its
/// exit status on newer versions).
fn qemu_io(uri: &str, cmds: &[String]) -> String {
    let mut args = vec!["-f".to_string(), "raw".to_string()];
    for c in cmds {
        args.push("-c".into());
        args.push(c.clone());
    }
    args.push(uri.to_string());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let t = ok("qemu-io", &refs);
    for bad in ["error", "failed", "Pattern verification"] {
        assert!(
            !t.to_lowercase().contains(&bad.to_lowercase()),
            "qemu-io reported {bad:?}:\n{t}"
        );
    }
    t
}

/// The export's advertised maximum request size, as nbdinfo reads it.
fn max_block_size(uri: &str) -> u64 {
    let t = ok("nbdinfo", &["--json", uri]);
    let v: serde_json::Value = serde_json::from_str(&t).unwrap_or_else(|e| panic!("{e}: {t}"));
    v["exports"][0]["block_size_maximum"]
        .as_u64()
        .unwrap_or_else(|| panic!("no block_size_maximum in {t}"))
}

#[test]
fn fio_nbd_engine_verifies_every_request_size_after_the_grant_cache_fills() {
    let e = Export::start("nbd-fio", 256 * MIB, &[]);
    let uri = e.uri();
    let max = max_block_size(&uri);
    assert!(max >= MIB, "the export advertises only {max} bytes");
    let fio = |name: &str, extra: &[&str]| {
        let uri_arg = format!("--uri={uri}");
        let mut args = vec![
            "--name",
            name,
            "--ioengine=nbd",
            &uri_arg,
            "--output-format=json",
            "--verify_state_save=0",
        ];
        args.extend_from_slice(extra);
        let t = ok("fio", &args);
        let json = &t[t
            .find('{')
            .unwrap_or_else(|| panic!("no JSON from fio: {t}"))..];
        let v: serde_json::Value =
            serde_json::from_str(json).unwrap_or_else(|err| panic!("{err}: {t}"));
        let job = &v["jobs"][0];
        assert_eq!(job["error"].as_u64(), Some(0), "fio {name}: {t}");
        job.clone()
    };
    // The reproducer: 1 MiB writes, 8 in flight, md5-verified. The
    // first requests fill the persistent-grant cache.
    let j = fio(
        "seq-1m",
        &[
            "--rw=write",
            "--bs=1m",
            "--iodepth=8",
            "--size=64m",
            "--verify=md5",
            "--do_verify=1",
        ],
    );
    assert_eq!(j["write"]["io_bytes"].as_u64(), Some(64 * MIB), "{j}");
    // 64 KiB at queue depth 1, at random offsets.
    fio(
        "rand-64k",
        &[
            "--rw=randwrite",
            "--bs=64k",
            "--iodepth=1",
            "--offset=64m",
            "--size=16m",
            "--verify=crc32c",
        ],
    );
    // Every size from one sector to the advertised maximum, in one
    // sequential pass (no block overwritten, so each verifies).
    let max_k = format!("{}k", max / 1024);
    let split = format!(
        "--bssplit=512/10:1k/5:4k/10:8k/10:12k/5:60k/10:64k/10:128k/10:1m/10:4m/10:{max_k}/10"
    );
    fio(
        "all-sizes",
        &[
            "--rw=write",
            &split,
            "--iodepth=4",
            "--offset=96m",
            "--size=160m",
            "--verify=crc32c",
            "--do_verify=1",
        ],
    );
    assert_eq!(e.refused(), 0, "the tapdisk refused requests");
}

#[test]
fn qemu_io_serves_every_command_the_export_advertises() {
    let e = Export::start("nbd-qemu-io", 128 * MIB, &[]);
    let uri = e.uri();
    let max = max_block_size(&uri);
    let t = ok("nbdinfo", &[&uri]);
    for flag in [
        "can_flush: true",
        "can_fua: true",
        "can_trim: true",
        "can_zero: true",
    ] {
        assert!(t.contains(flag), "nbdinfo does not show {flag}:\n{t}");
    }
    let mut cmds: Vec<String> = Vec::new();
    // Fill the grant cache with one request of the maximum size.
    cmds.push(format!("write -P 0x11 0 {max}"));
    cmds.push(format!("read -P 0x11 0 {max}"));
    // Then every size, each at its own offset, written and read back; the
    // repeated 8-64 KiB sequence is the one that failed 28 times in 32.
    let mut off = max;
    let mut pat = 0x20u8;
    let mut sizes = vec![512u64, 1024, 2048, 4096, 8192, 12 << 10, 60 << 10, 64 << 10];
    for _ in 0..4 {
        sizes.extend([8u64 << 10, 16 << 10, 32 << 10, 64 << 10]);
    }
    sizes.extend([128 << 10, MIB, 4 * MIB, max]);
    for len in sizes {
        cmds.push(format!("write -P {pat} {off} {len}"));
        cmds.push(format!("read -P {pat} {off} {len}"));
        off += len;
        pat = pat.wrapping_add(1);
    }
    // FUA writes.
    cmds.push(format!("write -f -P 0x55 {off} 4k"));
    cmds.push(format!("write -f -P 0x56 {} 1m", off + 4096));
    cmds.push(format!("read -P 0x55 {off} 4k"));
    cmds.push(format!("read -P 0x56 {} 1m", off + 4096));
    cmds.push("flush".into());
    // Trim: the hole reads back as zeroes (tapdisk punches it).
    let base = 100 * MIB;
    cmds.push(format!("write -P 0x66 {base} 1m"));
    cmds.push(format!("discard {base} 4k"));
    cmds.push(format!("read -P 0 {base} 4k"));
    cmds.push(format!("read -P 0x66 {} 1020k", base + 4096));
    cmds.push("discard 512 512".into());
    // Write-zeroes without NO_HOLE (may unmap) and with it.
    cmds.push(format!("write -z -u {} 64k", base + MIB));
    cmds.push(format!("read -P 0 {} 64k", base + MIB));
    cmds.push(format!("write -P 0x77 {} 2m", base + 2 * MIB));
    cmds.push(format!("write -z {} 1m", base + 2 * MIB));
    cmds.push(format!("read -P 0 {} 1m", base + 2 * MIB));
    cmds.push(format!("read -P 0x77 {} 1m", base + 3 * MIB));
    cmds.push("flush".into());
    qemu_io(&uri, &cmds);
    assert_eq!(e.refused(), 0, "the tapdisk refused requests");
}

#[test]
fn qemu_img_convert_and_nbdcopy_write_sparse_images_into_the_export() {
    let mut e = Export::start("nbd-copy", 64 * MIB, &[]);
    let uri = e.uri();
    // Small I/O first, then large: the cache fills while small requests run.
    qemu_io(
        &uri,
        &[
            "write -P 0x31 0 4k".into(),
            "write -P 0x32 8k 512".into(),
            "write -P 0x33 1m 32m".into(),
        ],
    );
    // A sparse source: data at a few places, holes between them.
    let src = e.path("src.img");
    let write_at = |f: &std::fs::File, at: u64, len: usize, seed: u8| {
        use std::os::unix::fs::FileExt;
        let data: Vec<u8> = (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect();
        f.write_all_at(&data, at).unwrap();
    };
    {
        let f = std::fs::File::create(&src).unwrap();
        f.set_len(64 * MIB).unwrap();
        write_at(&f, 0, 512, 1);
        write_at(&f, 3 * MIB + 4096, 200 << 10, 2);
        write_at(&f, 20 * MIB, 5 * MIB as usize, 3);
        write_at(&f, 63 * MIB, MIB as usize, 4);
    }
    let s = src.to_str().unwrap();
    ok(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", s, &uri],
    );
    same(s, &uri);
    // Overwrite with other data, then nbdcopy the sparse source in, with
    // extents (it zeroes or trims the holes on the export).
    qemu_io(&uri, &["write -P 0x44 0 64m".into()]);
    ok("nbdcopy", &[s, &uri]);
    same(s, &uri);
    // And back out again.
    let back = e.path("back.img");
    ok("nbdcopy", &[&uri, back.to_str().unwrap()]);
    same(s, back.to_str().unwrap());
    assert_eq!(e.refused(), 0, "the tapdisk refused requests");
    e.stop_guest();
    same(s, e.img.to_str().unwrap());
}

/// The `base:allocation` map of the export as `nbdinfo --map` prints it:
/// (offset, length, description) per line.
fn nbdinfo_map(uri: &str) -> Vec<(u64, u64, String)> {
    ok("nbdinfo", &["--map", uri])
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((
                f.first()?.parse().ok()?,
                f.get(1)?.parse().ok()?,
                f.get(3)?.to_string(),
            ))
        })
        .collect()
}

#[test]
fn the_export_shows_the_holes_of_a_sparse_image() {
    // A sparse 64 MiB image with data at 1 MiB (64 KiB) and 10 MiB (1 MiB).
    let e = Export::start_on("nbd-map", &[], |dir| {
        use std::os::unix::fs::FileExt;
        let img = dir.join("sparse.img");
        let f = std::fs::File::create(&img).unwrap();
        f.set_len(64 * MIB).unwrap();
        f.write_all_at(&[7u8; 64 << 10], MIB).unwrap();
        f.write_all_at(&vec![9u8; MIB as usize], 10 * MIB).unwrap();
        img
    });
    let uri = e.uri();
    let data_at = |map: &[(u64, u64, String)], at: u64| {
        map.iter()
            .find(|(o, l, _)| *o <= at && at < o + l)
            .map(|(_, _, d)| d.clone())
            .unwrap_or_default()
    };
    let map = nbdinfo_map(&uri);
    assert_eq!(map.iter().map(|m| m.1).sum::<u64>(), 64 * MIB, "{map:?}");
    assert_eq!(data_at(&map, 0), "hole,zero", "{map:?}");
    assert_eq!(data_at(&map, MIB), "data", "{map:?}");
    assert_eq!(data_at(&map, 5 * MIB), "hole,zero", "{map:?}");
    assert_eq!(data_at(&map, 10 * MIB + 4096), "data", "{map:?}");
    assert_eq!(data_at(&map, 63 * MIB), "hole,zero", "{map:?}");
    // A write into a hole allocates it; a trim makes a hole again.
    qemu_io(&uri, &["write -P 0x5a 32m 128k".into()]);
    let map = nbdinfo_map(&uri);
    assert_eq!(data_at(&map, 32 * MIB), "data", "{map:?}");
    qemu_io(&uri, &["discard 10m 1m".into()]);
    let map = nbdinfo_map(&uri);
    assert_eq!(data_at(&map, 10 * MIB + 4096), "hole,zero", "{map:?}");
    // qemu-img sees the same allocation.
    let t = ok("qemu-img", &["map", "--output=json", "-f", "raw", &uri]);
    let v: serde_json::Value = serde_json::from_str(&t).unwrap_or_else(|e| panic!("{e}: {t}"));
    let allocated: u64 = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["data"].as_bool() == Some(true))
        .map(|e| e["length"].as_u64().unwrap())
        .sum();
    assert!(
        (MIB / 16..=4 * MIB).contains(&allocated),
        "qemu-img map says {allocated} bytes are data: {t}"
    );
}

#[test]
fn blkfront_jobs_whose_buffers_rotate_past_the_grant_cache_verify() {
    std::env::set_var("PVIO_BIN", env!("CARGO_BIN_EXE_pvio"));
    let host = MiniHost::start("blk-rotate").unwrap();
    let img = make_image(&host.dir.0, "disk.img", 96 * MIB).unwrap();
    // The job takes its buffers in turn from a FIFO of iodepth buffers of
    // bs bytes: iodepth x bs / 4 KiB distinct grants, over the cache's
    // 1,056 in every case but the first. A guest's domain ends with its
    // process, so each job runs in a VM of its own on the same image.
    for (i, spec) in [
        "rw=randwrite,bs=512,iodepth=16,size=1m,verify=crc32c",
        "rw=randwrite,bs=1m,iodepth=8,size=32m,verify=crc32c",
        "rw=write,bs=192k,iodepth=32,size=24m,verify=crc32c",
        "rw=randwrite,bs=4m,iodepth=4,size=64m,verify=crc32c",
        // Two queues, each with its own cache.
        "rw=randwrite,bs=1m,iodepth=8,size=16m,numjobs=2,verify=crc32c",
    ]
    .into_iter()
    .enumerate()
    {
        let d = host.create_domain(&format!("vm{i}"), 128).unwrap();
        let vbd = host
            .add_vbd(d.domid, xvd_devid(0), &img, true, &[])
            .unwrap();
        // Indirect requests of up to 1,024 segments: 4 MiB per request.
        let _tap = host
            .start_tapdisk_ready(&vbd, &["--max-indirect-segments", "1024"])
            .unwrap();
        let r = host.run_job(&d, spec).unwrap_or_else(|e| panic!("{e:#}"));
        for j in r["jobs"].as_array().unwrap() {
            assert_eq!(j["errors"].as_u64(), Some(0), "{spec}: {r}");
            assert_eq!(j["verify"]["failures"].as_u64(), Some(0), "{spec}: {r}");
            assert!(j["verify"]["checked"].as_u64().unwrap() > 0, "{spec}: {r}");
        }
        let s = settled_stats(&host, &vbd);
        let t = &s["metrics"]["total"];
        assert_eq!(t["invalid"].as_u64(), Some(0), "{spec}: {s}");
        assert_eq!(t["io_errors"].as_u64(), Some(0), "{spec}: {s}");
    }
}
