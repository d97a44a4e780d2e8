//! pvio's benchmarks: each one runs its baseline and pvio in the same run and
//! reports both and their ratio, as a table or (with `--json`) as one JSON
//! object.
//!
//! This crate owns workload generators and measurement; it never defines a
//! protocol or a policy of its own, it only drives the crates below it.

pub mod blk;
pub mod bootstorm;
pub mod control_latency;
pub mod host;
pub mod hostproc;
pub mod plug;
pub mod procs;
pub mod report;
pub mod ring;
pub mod vmhost;
pub mod xenstore;
