//! One job on one device: the workload phase, then (when verifying) saving
//! the map of acknowledged writes and reading every written block back; or,
//! with `verify_load`, only the read-back of a saved map.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pvio_blk::device::BlockDevice;

use super::acks::AckMap;
use super::engine::{Engine, PhaseStats};
use super::error::{JobError, SpecError};
use super::layout::Layout;
use super::plan::{MainPlan, ReadBack};
use super::report::{JobReport, OpReport, VerifyReport};
use super::spec::{JobSpec, Verify};

/// A job: a spec, its index among `numjobs`, and (when verifying) the map
/// of its acknowledged writes.
#[derive(Debug)]
pub struct Job {
    spec: JobSpec,
    id: u32,
    stop: Option<Arc<AtomicBool>>,
    acks: Option<AckMap>,
}

/// The file job `job` of `numjobs` saves to or loads from.
pub fn job_path(path: &Path, job: u32, numjobs: u32) -> PathBuf {
    if numjobs <= 1 {
        return path.to_path_buf();
    }
    let mut p = path.as_os_str().to_owned();
    p.push(format!(".{job}"));
    PathBuf::from(p)
}

impl Job {
    /// Job number `id` (0-based; written into every verify header).
    pub fn new(spec: JobSpec, id: u32) -> Self {
        Self {
            spec,
            id,
            stop: None,
            acks: None,
        }
    }

    /// Stops issuing I/O when `stop` becomes true (the report then covers
    /// what was done).
    pub fn with_stop(mut self, stop: Arc<AtomicBool>) -> Self {
        self.stop = Some(stop);
        self
    }

    /// The map of acknowledged writes (when verifying, after [`Job::run`]).
    pub fn acks(&self) -> Option<&AckMap> {
        self.acks.as_ref()
    }

    /// Takes the map of acknowledged writes.
    pub fn take_acks(&mut self) -> Option<AckMap> {
        self.acks.take()
    }

    /// Runs the job on `dev`. I/O errors and verify failures are counted in
    /// the report; `Err` means the job could not run at all.
    pub fn run<D: BlockDevice + ?Sized>(&mut self, dev: &mut D) -> Result<JobReport, JobError> {
        self.spec.validate()?;
        if let Some(path) = self.spec.verify_load.clone() {
            let path = job_path(&path, self.id, self.spec.numjobs);
            let map = AckMap::load(&path).map_err(|source| JobError::AckMap {
                job: self.id,
                source,
            })?;
            return self.verify_only(dev, map);
        }
        let info = dev.info();
        let geometry = |reason: String| JobError::Geometry {
            job: self.id,
            reason,
        };
        let layout =
            Layout::for_job(&self.spec, self.id, &info, dev.buffer_size()).map_err(geometry)?;
        if self.spec.rw.writes() && info.read_only {
            return Err(geometry("the device is read-only".to_string()));
        }
        if dev.buffer_count() == 0 {
            return Err(geometry("the device has no I/O buffers".to_string()));
        }
        if self.spec.iodepth as usize > dev.buffer_count() {
            tracing::warn!(
                job = self.id,
                "iodepth {} capped at the device's {} buffers",
                self.spec.iodepth,
                dev.buffer_count()
            );
        }
        let verifying = self.spec.verify != Verify::None;
        self.acks = verifying.then(|| {
            AckMap::new(
                self.id,
                layout.bs,
                layout.base,
                layout.blocks,
                self.spec.seed,
            )
        });

        let start = Instant::now();
        let measure_from = start + self.spec.ramp.unwrap_or_default();
        let deadline = self.spec.runtime.map(|r| measure_from + r);
        let bytes = self.spec.size.map_or(layout.bytes(), |s| s.0);
        let ios = (bytes / u64::from(layout.bs)).max(1);
        let seed = self.spec.seed ^ u64::from(self.id).rotate_left(32);
        let mut plan = MainPlan::new(
            self.spec.rw,
            self.spec.rwmixread,
            layout.blocks,
            ios,
            seed,
            deadline,
            self.stop.clone(),
        );
        let mut stats = PhaseStats {
            measure_from: Some(measure_from),
            ..PhaseStats::default()
        };
        let mut engine = Engine::new(dev, layout, self.spec.iodepth as usize);
        let depth = engine.depth();
        let mut aborted = engine.run(&mut plan, self.acks.as_mut(), &mut stats).err();
        let end = stats
            .last_completion
            .unwrap_or_else(Instant::now)
            .max(measure_from);
        let runtime = end.duration_since(measure_from);

        let mut verify = None;
        if let Some(acks) = self.acks.as_mut() {
            if let Some(path) = &self.spec.verify_save {
                acks.save(&job_path(path, self.id, self.spec.numjobs))
                    .map_err(|source| JobError::AckMap {
                        job: self.id,
                        source,
                    })?;
            }
            let mut report = VerifyReport {
                acked_blocks: acks.acked_count(),
                indeterminate_blocks: acks.indeterminate_count(),
                ..VerifyReport::default()
            };
            stats.verify.merge_into(&mut report);
            if aborted.is_none() {
                let (readback, abort) = read_back(&mut engine, acks, self.stop.clone());
                stats.errors.count += readback.errors.count;
                stats.errors.first.extend(readback.errors.first);
                readback.verify.merge_into(&mut report);
                report.readback_s = readback.secs;
                aborted = abort.map(|a| format!("verify read-back: {a}"));
            }
            verify = Some(report);
        }
        Ok(JobReport {
            job: self.id,
            spec: self.spec.to_string(),
            bs: layout.bs,
            iodepth: depth as u32,
            iodepth_max: engine.inflight_max as u32,
            runtime_s: runtime.as_secs_f64(),
            read: stats.read.finish(runtime),
            write: stats.write.finish(runtime),
            errors: stats.errors.count,
            first_errors: stats.errors.first,
            verify,
            aborted,
        })
    }

    /// Reads back every block recorded in `map` and checks it.
    fn verify_only<D: BlockDevice + ?Sized>(
        &mut self,
        dev: &mut D,
        map: AckMap,
    ) -> Result<JobReport, JobError> {
        let info = dev.info();
        let layout = Layout {
            base: map.base_offset(),
            bs: map.block_size(),
            blocks: map.blocks(),
        };
        let end = layout.base.checked_add(layout.bytes());
        let fits = end.is_some_and(|e| e <= info.size_bytes())
            && layout.bs.is_multiple_of(info.sector_size.max(1))
            && layout.bs <= info.max_request_bytes
            && layout.bs as usize <= dev.buffer_size()
            && dev.buffer_count() > 0;
        if !fits {
            return Err(JobError::Spec(SpecError::Invalid(format!(
                "the saved map ({} blocks of {} bytes from {}) does not fit this device",
                layout.blocks, layout.bs, layout.base
            ))));
        }
        let mut engine = Engine::new(dev, layout, self.spec.iodepth as usize);
        let mut map = map;
        let (readback, abort) = read_back(&mut engine, &mut map, self.stop.clone());
        let mut report = VerifyReport {
            acked_blocks: map.acked_count(),
            indeterminate_blocks: map.indeterminate_count(),
            readback_s: readback.secs,
            ..VerifyReport::default()
        };
        readback.verify.merge_into(&mut report);
        let depth = engine.depth() as u32;
        let iodepth_max = engine.inflight_max as u32;
        self.acks = Some(map);
        Ok(JobReport {
            job: self.id,
            spec: self.spec.to_string(),
            bs: layout.bs,
            iodepth: depth,
            iodepth_max,
            runtime_s: 0.0,
            read: OpReport::default(),
            write: OpReport::default(),
            errors: readback.errors.count,
            first_errors: readback.errors.first,
            verify: Some(report),
            aborted: abort.map(|a| format!("verify read-back: {a}")),
        })
    }
}

struct ReadBackResult {
    verify: super::stats::VerifyStats,
    errors: super::stats::ErrorLog,
    secs: f64,
}

fn read_back<D: BlockDevice + ?Sized>(
    engine: &mut Engine<'_, D>,
    acks: &mut AckMap,
    stop: Option<Arc<AtomicBool>>,
) -> (ReadBackResult, Option<String>) {
    let start = Instant::now();
    let blocks: Vec<u64> = acks.acked().map(|(b, _)| b).collect();
    let mut plan = ReadBack::new(blocks, stop);
    let mut stats = PhaseStats::default();
    let abort = engine.run(&mut plan, Some(acks), &mut stats).err();
    let secs = stats
        .last_completion
        .map_or(Duration::ZERO, |t| t.duration_since(start))
        .as_secs_f64();
    (
        ReadBackResult {
            verify: stats.verify,
            errors: stats.errors,
            secs,
        },
        abort,
    )
}
