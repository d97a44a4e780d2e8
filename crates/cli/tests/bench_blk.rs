//! `pvio bench blk --quick` end to end: fio and every polling mode run on
//! one image, and the report has the shape the block issue names (the
//! figures themselves are for docs/benchmarks.md, not for a test).

use std::process::Command;

#[test]
fn the_quick_block_bench_reports_every_mode_and_draws_its_charts() {
    let out_dir = std::env::temp_dir().join(format!("pvio-test-bench-blk-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_pvio"))
        .args(["bench", "blk", "--quick", "--json", "--no-split", "--out"])
        .arg(&out_dir)
        .env("PVIO_BIN", env!("CARGO_BIN_EXE_pvio"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    for qd in ["qd1_4k", "qd32_4k"] {
        for key in ["fio_iops", "off_iops", "tapdisk3_iops", "adaptive_iops"] {
            let iops = v[qd][key]
                .as_f64()
                .unwrap_or_else(|| panic!("{qd}.{key} missing: {v}"));
            assert!(iops > 0.0, "{qd}.{key} = {iops}");
        }
        assert_eq!(
            v[qd]["rounds"]["adaptive"].as_array().map(Vec::len),
            Some(2),
            "quick runs take two rounds"
        );
    }
    for (key, points) in [("gap_sweep", 4), ("poisson_sweep", 1)] {
        let sweep = v[key].as_array().unwrap_or_else(|| panic!("{key} missing"));
        for mode in ["off", "spin", "tapdisk3", "adaptive"] {
            let of_mode: Vec<_> = sweep.iter().filter(|p| p["mode"] == mode).collect();
            assert_eq!(of_mode.len(), points, "{key} {mode}: {of_mode:?}");
            for p in of_mode {
                assert!(p["latency_us_p50"].as_f64().unwrap() > 0.0, "{p}");
                assert!(p["cpu_us_per_req"].as_f64().unwrap() > 0.0, "{p}");
            }
        }
    }
    let idle = v["idle_backend_cpu_pct"]
        .as_f64()
        .expect("idle_backend_cpu_pct");
    assert!(idle >= 0.0, "idle phase did not run: {idle}");
    assert_eq!(v["placement"], "split");
    for chart in ["blk-gap-latency.svg", "blk-gap-cpu.svg"] {
        let svg = std::fs::read_to_string(out_dir.join(chart)).unwrap();
        assert!(svg.contains("<svg"), "{chart} is not an SVG");
    }
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("blk.json")).unwrap()).unwrap();
    assert_eq!(saved, v);
    let _ = std::fs::remove_dir_all(&out_dir);
}
