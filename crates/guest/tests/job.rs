//! The job runner against an in-memory disk and a disk that misbehaves on
//! purpose: coverage and alignment of offsets, iodepth, verification that
//! catches corruption and lost writes, the saved map of acknowledged writes,
//! numjobs, stop conditions and reports.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use pvio_blk::device::{BlockDevice, DeviceOp, DeviceRequest, MemDevice};
use pvio_guest::job::{run_jobs, AckMap, BlockState, Job, JobReport, JobSpec};
use pvio_guest::testing::{FaultConfig, FaultCounters, FaultyDevice};

const MIB: u64 = 1 << 20;

fn mem(bytes: u64) -> MemDevice {
    MemDevice::new(bytes, 64, 128 * 1024)
}

fn run(spec: &str, dev: &mut impl BlockDevice) -> JobReport {
    Job::new(JobSpec::parse(spec).unwrap(), 0).run(dev).unwrap()
}

fn faulty(bytes: u64, cfg: FaultConfig) -> FaultyDevice<MemDevice> {
    FaultyDevice::new(mem(bytes), cfg)
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("pvio-guest-job-{}-{name}", std::process::id()))
}

/// Writes `len` zero bytes at `offset` straight through the device.
fn zero_block(dev: &mut impl BlockDevice, offset: u64, len: u32) {
    dev.buffer_mut(0)[..len as usize].fill(0);
    dev.submit(DeviceRequest {
        op: DeviceOp::Write,
        offset,
        len,
        buf: 0,
        tag: 99,
    })
    .unwrap();
    dev.kick().unwrap();
    let mut out = Vec::new();
    while out.is_empty() {
        dev.wait(&mut out, None).unwrap();
    }
    assert!(out[0].result.is_ok());
}

#[test]
fn randread_counts_every_io_of_the_whole_device() {
    let mut dev = mem(MIB);
    let r = run("rw=randread,bs=4k,iodepth=8", &mut dev);
    assert_eq!(r.read.ios, 256);
    assert_eq!(r.read.bytes, MIB);
    assert_eq!((r.write.ios, r.errors), (0, 0));
    assert!(r.read.lat_us.max >= r.read.lat_us.p50 && r.read.lat_us.p50 > 0.0);
    assert!(r.ok());
}

#[test]
fn random_offsets_cover_the_range_once_and_stay_aligned() {
    let mut dev = faulty(
        4 * MIB,
        FaultConfig {
            record: true,
            ..FaultConfig::default()
        },
    );
    let r = run(
        "rw=randwrite,bs=8k,offset=64k,range=1m,iodepth=4,seed=3",
        &mut dev,
    );
    assert_eq!(r.write.ios, 128);
    let offsets: Vec<u64> = dev.log().iter().map(|q| q.offset).collect();
    assert_eq!(offsets.len(), 128);
    for &o in &offsets {
        assert!(
            (64 * 1024..64 * 1024 + MIB).contains(&o),
            "offset {o} outside the range"
        );
        assert_eq!(o % 8192, 0, "offset {o} not aligned to bs");
    }
    let distinct: HashSet<u64> = offsets.iter().copied().collect();
    assert_eq!(distinct.len(), 128, "a pass must touch every block once");
    let ascending = offsets.windows(2).filter(|w| w[1] == w[0] + 8192).count();
    assert!(
        ascending < 16,
        "{ascending} sequential steps: offsets are not random"
    );
    assert!(dev
        .log()
        .iter()
        .all(|q| q.len == 8192 && q.op == DeviceOp::Write));

    // Another seed, another order; the same seed, the same order.
    let order = |seed: u32| {
        let mut d = faulty(
            4 * MIB,
            FaultConfig {
                record: true,
                ..FaultConfig::default()
            },
        );
        run(&format!("rw=randread,bs=8k,range=1m,seed={seed}"), &mut d);
        d.log().iter().map(|q| q.offset).collect::<Vec<_>>()
    };
    assert_eq!(order(3), order(3));
    assert_ne!(order(3), order(4));
}

#[test]
fn iodepth_is_reached_and_capped_by_buffers() {
    let mut dev = faulty(MIB, FaultConfig::default());
    let c = dev.counters();
    let r = run("rw=randread,bs=4k,iodepth=32", &mut dev);
    assert_eq!(FaultCounters::get(&c.max_inflight), 32);
    assert_eq!((r.iodepth, r.iodepth_max), (32, 32));

    let mut dev = FaultyDevice::new(MemDevice::new(MIB, 16, 65536), FaultConfig::default());
    let c = dev.counters();
    let r = run("rw=randread,bs=4k,iodepth=100", &mut dev);
    assert_eq!(FaultCounters::get(&c.max_inflight), 16);
    assert_eq!((r.iodepth, r.iodepth_max, r.read.ios), (16, 16, 256));
}

#[test]
fn busy_device_is_retried_not_failed() {
    let cfg = FaultConfig {
        queue_limit: Some(3),
        ..FaultConfig::default()
    };
    let mut dev = faulty(MIB, cfg);
    let c = dev.counters();
    let r = run("rw=randwrite,bs=4k,iodepth=16,verify=crc32c", &mut dev);
    assert!(FaultCounters::get(&c.busy) > 0);
    assert_eq!(FaultCounters::get(&c.max_inflight), 3);
    assert_eq!((r.write.ios, r.errors), (256, 0));
    assert_eq!(r.verify.as_ref().unwrap().checked, 256);
    assert!(r.ok());
}

#[test]
fn verify_passes_through_reordered_delayed_completions() {
    let cfg = FaultConfig {
        reorder: true,
        delay: Some(std::time::Duration::from_micros(50)),
        seed: 11,
        ..FaultConfig::default()
    };
    let mut dev = faulty(2 * MIB, cfg);
    let c = dev.counters();
    // Two passes, so blocks are rewritten and generations move on.
    let r = run(
        "rw=randwrite,bs=4k,iodepth=16,size=4m,verify=crc32c",
        &mut dev,
    );
    assert!(FaultCounters::get(&c.reordered) > 0);
    let v = r.verify.as_ref().unwrap();
    assert_eq!(
        (r.write.ios, v.acked_blocks, v.checked, v.failures),
        (1024, 512, 512, 0)
    );
    assert!(r.ok(), "{:?}", v.first_failures);
}

#[test]
fn verify_catches_a_corrupted_byte() {
    let bad = 3 * MIB / 2 + 4096;
    let cfg = FaultConfig {
        corrupt_reads_at: Some(bad + 7),
        ..FaultConfig::default()
    };
    let mut dev = faulty(2 * MIB, cfg);
    let r = run("rw=randwrite,bs=8k,iodepth=8,verify=crc32c", &mut dev);
    let v = r.verify.as_ref().unwrap();
    assert_eq!(v.failures, 1);
    assert_eq!(v.first_failures[0].offset, bad - bad % 8192);
    assert!(
        v.first_failures[0].reason.contains("corrupt"),
        "{}",
        v.first_failures[0].reason
    );
    assert!(!r.ok());
}

#[test]
fn verify_catches_lost_writes() {
    // Lost on the first write: the block never got a header.
    let at = 300 * 1024;
    let cfg = FaultConfig {
        lose_writes_at: Some(at),
        ..FaultConfig::default()
    };
    let mut dev = faulty(MIB, cfg);
    let r = run("rw=randwrite,bs=4k,iodepth=4,verify=crc32c", &mut dev);
    let v = r.verify.as_ref().unwrap();
    assert_eq!((v.failures, v.first_failures[0].offset), (1, at));
    assert!(v.first_failures[0].reason.contains("no verify header"));

    // Lost on the rewrite: the block holds the older generation.
    let cfg = FaultConfig {
        lose_writes_at: Some(at),
        lose_skip: 1,
        ..FaultConfig::default()
    };
    let mut dev = faulty(MIB, cfg);
    let r = run("rw=write,bs=4k,iodepth=4,size=2m,verify=crc32c", &mut dev);
    let v = r.verify.as_ref().unwrap();
    assert_eq!(FaultCounters::get(&dev.counters().lost), 1);
    assert_eq!((v.failures, v.first_failures[0].offset), (1, at));
    assert!(
        v.first_failures[0].reason.contains("lost write"),
        "{}",
        v.first_failures[0].reason
    );
}

#[test]
fn failed_writes_are_counted_and_not_verified() {
    let cfg = FaultConfig {
        fail_every: Some(10),
        ..FaultConfig::default()
    };
    let mut dev = faulty(MIB, cfg);
    let r = run("rw=randwrite,bs=4k,iodepth=8,verify=crc32c", &mut dev);
    let v = r.verify.as_ref().unwrap();
    // 256 writes, every 10th failed; the read-back reads are counted too.
    assert_eq!(r.write.errors, 25);
    assert_eq!(v.indeterminate_blocks, 25);
    assert_eq!(v.acked_blocks, 231);
    assert!(r.errors >= 25 && !r.first_errors.is_empty());
    assert!(
        r.first_errors[0].contains("I/O error"),
        "{}",
        r.first_errors[0]
    );
    assert!(!r.ok());
}

#[test]
fn randrw_checks_reads_inline_and_catches_corruption() {
    let mut dev = mem(MIB);
    let r = run(
        "rw=randrw,rwmixread=50,bs=4k,iodepth=8,size=4m,verify=crc32c",
        &mut dev,
    );
    let v = r.verify.as_ref().unwrap();
    assert!(r.read.ios > 300 && r.write.ios > 300);
    assert!(
        v.checked > v.acked_blocks,
        "reads during the workload were checked too"
    );
    assert_eq!(v.failures, 0);

    let cfg = FaultConfig {
        corrupt_reads_at: Some(0),
        ..FaultConfig::default()
    };
    let mut dev = faulty(MIB, cfg);
    let r = run("rw=randrw,bs=4k,iodepth=8,size=4m,verify=crc32c", &mut dev);
    let v = r.verify.as_ref().unwrap();
    assert!(v.failures >= 1);
    assert!(v.first_failures.iter().all(|f| f.offset == 0));
}

#[test]
fn saved_map_lets_another_run_check_no_acknowledged_write_was_lost() {
    let path = temp_path("acks-restart");
    let mut dev = mem(2 * MIB);
    let spec = format!(
        "rw=randwrite,bs=4k,iodepth=16,size=1m,verify=crc32c,verify_save={}",
        path.display()
    );
    let mut job = Job::new(JobSpec::parse(&spec).unwrap(), 0);
    let first = job.run(&mut dev).unwrap();
    assert!(first.ok());
    let saved = AckMap::load(&path).unwrap();
    assert_eq!(&saved, job.acks().unwrap());
    assert_eq!(saved.acked_count(), 256);

    // "Another process": a verify-only job reading the saved map.
    let check = format!(
        "rw=read,verify=crc32c,iodepth=8,verify_load={}",
        path.display()
    );
    let again = run(&check, &mut dev);
    let v = again.verify.as_ref().unwrap();
    assert_eq!((v.checked, v.failures, again.write.ios), (256, 0, 0));

    // An acknowledged write that went missing is found.
    let (victim, _) = saved.acked().nth(100).unwrap();
    zero_block(&mut dev, saved.offset_of(victim), 4096);
    let lost = run(&check, &mut dev);
    let v = lost.verify.as_ref().unwrap();
    assert_eq!((v.checked, v.failures), (256, 1));
    assert_eq!(v.first_failures[0].offset, saved.offset_of(victim));
    assert!(!lost.ok());
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_lost_rewrite_is_found_by_the_second_process() {
    let path = temp_path("acks-stale");
    let at = 4096 * 17;
    let cfg = FaultConfig {
        lose_writes_at: Some(at),
        lose_skip: 1,
        ..FaultConfig::default()
    };
    let mut dev = faulty(MIB, cfg);
    let spec = format!(
        "rw=write,bs=4k,iodepth=4,size=2m,verify=crc32c,verify_save={}",
        path.display()
    );
    Job::new(JobSpec::parse(&spec).unwrap(), 0)
        .run(&mut dev)
        .unwrap();
    let map = AckMap::load(&path).unwrap();
    assert!(matches!(map.state(17), BlockState::Acked(g) if g > 256));
    let mut disk = dev.into_inner();
    let r = run(
        &format!("rw=read,verify=crc32c,verify_load={}", path.display()),
        &mut disk,
    );
    let v = r.verify.as_ref().unwrap();
    assert_eq!((v.failures, v.first_failures[0].offset), (1, at));
    assert!(v.first_failures[0].reason.contains("lost write"));
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn numjobs_get_their_own_devices_and_disjoint_slices() {
    let path = temp_path("acks-multi");
    let spec = JobSpec::parse(&format!(
        "rw=randwrite,bs=4k,iodepth=4,numjobs=3,verify=crc32c,verify_save={}",
        path.display()
    ))
    .unwrap();
    let mut made = Vec::new();
    let out = run_jobs(
        &spec,
        |j| {
            made.push(j);
            Ok::<_, std::io::Error>(mem(3 * MIB))
        },
        None,
    )
    .unwrap();
    assert_eq!(made, [0, 1, 2]);
    assert!(out.report.ok());
    assert_eq!(out.report.jobs.len(), 3);
    assert_eq!(out.report.total.write.ios, 3 * 256);
    let maps: Vec<AckMap> = out.acks.into_iter().map(Option::unwrap).collect();
    for (j, m) in maps.iter().enumerate() {
        assert_eq!(m.job(), j as u32);
        assert_eq!(m.base_offset(), j as u64 * MIB);
        let saved = AckMap::load(&pvio_guest::job::job_path(&path, j as u32, 3)).unwrap();
        assert_eq!(&saved, m);
        std::fs::remove_file(pvio_guest::job::job_path(&path, j as u32, 3)).unwrap();
    }

    let err = run_jobs(
        &spec,
        |_| Err::<MemDevice, _>(std::io::Error::other("no disk")),
        None,
    )
    .unwrap_err();
    assert!(err.to_string().contains("no disk"), "{err}");
}

#[test]
fn runtime_stop_and_ramp_end_the_measurement() {
    // A slow device and a short runtime: the job ends long before its size.
    let cfg = FaultConfig {
        delay: Some(std::time::Duration::from_millis(1)),
        ..FaultConfig::default()
    };
    let mut dev = faulty(64 * MIB, cfg);
    let r = run("rw=randread,bs=512,iodepth=1,runtime=200ms", &mut dev);
    assert!(r.read.ios > 0 && r.read.ios < 131_072, "{} ios", r.read.ios);
    assert!(r.runtime_s > 0.0);

    let stop = Arc::new(AtomicBool::new(true));
    let mut dev = mem(MIB);
    let r = Job::new(JobSpec::parse("rw=randread").unwrap(), 0)
        .with_stop(stop)
        .run(&mut dev)
        .unwrap();
    assert_eq!(r.read.ios, 0);

    // Everything happens inside a long ramp: nothing is measured.
    let r = run("rw=randread,bs=4k,ramp=1h", &mut mem(MIB));
    assert_eq!((r.read.ios, r.runtime_s), (0, 0.0));
}

#[test]
fn specs_that_do_not_fit_the_device_are_refused() {
    let err = |s: &str| {
        Job::new(JobSpec::parse(s).unwrap(), 0)
            .run(&mut mem(MIB))
            .unwrap_err()
            .to_string()
    };
    assert!(err("bs=256k").contains("largest request"));
    assert!(err("offset=2m").contains("beyond"));
    assert!(
        err("rw=read,verify=crc32c,verify_load=/nonexistent/pvio").contains("/nonexistent/pvio")
    );
}

#[test]
fn reports_print_as_a_table_and_as_json() {
    let mut dev = mem(MIB);
    let r = run("rw=randwrite,bs=4k,iodepth=4,verify=crc32c", &mut dev);
    let report = pvio_guest::job::RunReport::from_jobs(vec![r]);
    let table = report.to_string();
    assert!(
        table.contains("IOPS")
            && table.contains("write")
            && table.contains("verify: 256 block(s) checked")
    );
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(json["jobs"][0]["write"]["ios"], 256);
    assert!(
        json["jobs"][0]["write"]["lat_us"]["p99_9"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert_eq!(json["jobs"][0]["verify"]["failures"], 0);
    assert_eq!(json["total"]["write"]["bytes"], MIB);
}
