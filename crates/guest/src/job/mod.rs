//! An fio-like job runner over [`BlockDevice`](pvio_blk::device::BlockDevice):
//! a job spec in fio's vocabulary, an engine that keeps `iodepth` requests
//! in flight on one device, end-to-end data verification with a map of
//! acknowledged writes that can be saved and checked by another process,
//! and reports (a table, or JSON).
//!
//! ```text
//! spec    := item ("," item)*          item := key "=" value
//! rw      := read | write | randread | randwrite | randrw   (default randread)
//! rwmixread := 0..=100 (percent reads in randrw, default 50)
//! bs      := size (default 4k; a multiple of the sector, <= the largest request)
//! iodepth := 1.. (default 1)           numjobs := 1..=4096 (default 1)
//! runtime := duration                  ramp := duration (run unmeasured first)
//! size    := size (bytes per job; default its whole range)
//! offset  := size (default 0)          range := size (default to the end)
//! direct  := 1 | 0 (accepted, ignored) seed := u64 (default 1)
//! verify  := none | crc32c             verify_save := path   verify_load := path
//! size    := digits [k|m|g|t] (powers of 1024)
//! duration:= digits [ns|us|ms|s|m|h] (default seconds)
//! ```
//!
//! ```no_run
//! use pvio_blk::device::MemDevice;
//! use pvio_guest::job::{run_jobs, JobSpec};
//!
//! let spec: JobSpec = "rw=randwrite,bs=4k,iodepth=32,numjobs=2,verify=crc32c".parse()?;
//! let out = run_jobs(&spec, |_job| Ok::<_, std::io::Error>(MemDevice::new(64 << 20, 32, 65536)), None)?;
//! println!("{}", out.report); // a table; out.report.to_json() for JSON
//! assert!(out.report.ok());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod acks;
mod crc32c;
mod engine;
mod error;
mod layout;
mod multi;
mod pattern;
mod plan;
mod report;
mod rng;
mod single;
mod spec;
mod stats;
mod units;

pub use acks::{AckMap, BlockState, MAX_BLOCKS};
pub use crc32c::{crc32c, Crc32c};
pub use engine::STALL_TIMEOUT;
pub use error::{AckMapError, JobError, SpecError};
pub use layout::Layout;
pub use multi::{run_jobs, RunOutcome};
pub use pattern::{check_block, write_block, Mismatch, Stamp, HEADER_LEN};
pub use report::{
    JobReport, Latency, OpReport, RunReport, TotalReport, VerifyFailure, VerifyReport,
};
pub use single::{job_path, Job};
pub use spec::{JobSpec, RwMode, Verify};
pub use units::{format_duration, parse_bool, parse_duration, ByteSize};
