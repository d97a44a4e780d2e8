//! The NBD export against real clients from Debian: nbdinfo and nbdcopy
//! (libnbd-bin), qemu-io and qemu-img (qemu-utils), all through
//! `nbd+unix:///?socket=PATH` URIs. Each client runs under `timeout`, so a
//! server that hangs fails the test instead of stalling it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pvio_blk::device::MemDevice;
use pvio_guest::nbd::{NbdConfig, NbdServer};

const MIB: u64 = 1 << 20;

fn sock(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("pvio-nbd-{}-{name}.sock", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

fn uri(path: &Path) -> String {
    format!("nbd+unix:///?socket={}", path.display())
}

/// Runs a client under `timeout 60`; panics with a clear message if the
/// tool is not installed.
fn tool(name: &str, args: &[&str]) -> Output {
    let out = Command::new("timeout")
        .arg("60")
        .arg(name)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {name}: {e}"));
    assert_ne!(
        out.status.code(),
        Some(127),
        "{name} is not installed (scripts/install-deps.sh installs it)"
    );
    assert_ne!(
        out.status.code(),
        Some(124),
        "{name} timed out: the server hung"
    );
    out
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A MemDevice whose largest request (64 KiB) is smaller than the clients'
/// requests, so splitting is exercised.
fn disk(bytes: u64) -> MemDevice {
    MemDevice::new(bytes, 32, 64 * 1024)
}

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

#[test]
fn nbdinfo_reports_size_and_export() {
    let path = sock("info");
    let cfg = NbdConfig {
        export_name: "pvio-disk".into(),
        ..NbdConfig::default()
    };
    let server = NbdServer::start(&path, disk(8 * MIB), cfg).unwrap();
    let out = tool("nbdinfo", &["--size", &uri(&path)]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        (8 * MIB).to_string()
    );

    let out = tool(
        "nbdinfo",
        &[&format!("nbd+unix:///pvio-disk?socket={}", path.display())],
    );
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("export-size: 8388608"), "{t}");
    assert!(
        t.contains("can_flush: true") && t.contains("can_trim: true"),
        "{t}"
    );
    assert!(t.contains("block_size_minimum: 512"), "{t}");

    let out = tool("nbdinfo", &["--list", &uri(&path)]);
    assert!(
        out.status.success() && text(&out).contains("pvio-disk"),
        "{}",
        text(&out)
    );

    let out = tool(
        "nbdinfo",
        &[&format!("nbd+unix:///other?socket={}", path.display())],
    );
    assert!(
        !out.status.success(),
        "an unknown export name must be refused"
    );

    let stats = server.stats();
    assert!(stats.connections >= 4);
    server.shutdown().unwrap();
    assert!(!path.exists(), "the socket is removed on shutdown");
}

#[test]
fn qemu_io_writes_and_reads_a_pattern() {
    let path = sock("qemu-io");
    let server = NbdServer::start(&path, disk(4 * MIB), NbdConfig::default()).unwrap();
    let out = tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0xab 0 64k",
            "-c",
            "read -P 0xab 0 64k",
            "-c",
            "write -P 0xcd 1m 256k",
            "-c",
            "write -z 2m 128k",
            "-c",
            "flush",
            "-c",
            "read -P 0xcd 1m 256k",
            &uri(&path),
        ],
    );
    let t = text(&out);
    assert!(
        out.status.success() && !t.contains("Pattern verification failed"),
        "{t}"
    );
    let dev = server.shutdown().unwrap();
    let c = dev.contents();
    assert!(c[..65536].iter().all(|&b| b == 0xab));
    assert!(c[65536..MIB as usize].iter().all(|&b| b == 0));
    assert!(c[MIB as usize..MIB as usize + 262144]
        .iter()
        .all(|&b| b == 0xcd));
}

#[test]
fn qemu_img_convert_into_the_export_then_compare() {
    let path = sock("convert");
    let size = 6 * MIB + 512 * 3;
    let file = std::env::temp_dir().join(format!("pvio-nbd-{}-src.img", std::process::id()));
    let data = random_bytes(size as usize, 42);
    std::fs::write(&file, &data).unwrap();
    let server = NbdServer::start(&path, disk(size), NbdConfig::default()).unwrap();
    let f = file.display().to_string();
    let out = tool(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", &f, &uri(&path)],
    );
    assert!(out.status.success(), "{}", text(&out));
    let out = tool(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", &f, &uri(&path)],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("identical"), "{}", text(&out));

    // nbdcopy reads it all back with many requests in flight.
    let copy = std::env::temp_dir().join(format!("pvio-nbd-{}-copy.img", std::process::id()));
    let out = tool("nbdcopy", &[&uri(&path), &copy.display().to_string()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        std::fs::read(&copy).unwrap() == data,
        "nbdcopy read back different data"
    );

    // One byte changed on the export: compare must notice.
    let out = tool(
        "qemu-io",
        &["-f", "raw", "-c", "write -P 0x00 4096 512", &uri(&path)],
    );
    assert!(out.status.success(), "{}", text(&out));
    let out = tool(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", &f, &uri(&path)],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));

    let stats = server.stats();
    let dev = server.shutdown().unwrap();
    assert_eq!(&dev.contents()[8192..], &data[8192..]);
    assert!(stats.bytes_written >= size && stats.bytes_read >= 2 * size);
    std::fs::remove_file(&file).unwrap();
    std::fs::remove_file(&copy).unwrap();
}

#[test]
fn read_only_export_refuses_writes() {
    let path = sock("ro");
    let dev = disk(MIB);
    let cfg = NbdConfig {
        read_only: true,
        ..NbdConfig::default()
    };
    let server = NbdServer::start(&path, dev, cfg).unwrap();
    let out = tool("nbdinfo", &[&uri(&path)]);
    assert!(text(&out).contains("is_read_only: true"), "{}", text(&out));
    let out = tool(
        "qemu-io",
        &["-f", "raw", "-c", "write -P 0x11 0 4k", &uri(&path)],
    );
    let t = text(&out);
    // qemu sees the read-only flag and refuses to open the image for writing.
    assert!(
        !out.status.success() && t.contains("Permission denied"),
        "{t}"
    );
    let out = tool(
        "qemu-io",
        &["-r", "-f", "raw", "-c", "read -P 0 0 4k", &uri(&path)],
    );
    assert!(out.status.success(), "{}", text(&out));
    let dev = server.shutdown().unwrap();
    assert!(dev.contents().iter().all(|&b| b == 0));
}
