//! `numjobs` jobs side by side: each gets its own device from the caller's
//! factory and its own thread; their reports are added up.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use pvio_blk::device::BlockDevice;

use super::acks::AckMap;
use super::error::JobError;
use super::report::RunReport;
use super::single::Job;
use super::spec::JobSpec;

/// A run's report and, when verifying, each job's map of acknowledged
/// writes (indexed by job).
#[derive(Debug)]
pub struct RunOutcome {
    pub report: RunReport,
    pub acks: Vec<Option<AckMap>>,
}

/// Runs `spec.numjobs` jobs, job `j` on the device `factory(j)` returns,
/// each on its own thread; stops them early when `stop` becomes true.
///
/// Devices are made on the calling thread, one after the other, before any
/// job starts.
pub fn run_jobs<D, E, F>(
    spec: &JobSpec,
    mut factory: F,
    stop: Option<Arc<AtomicBool>>,
) -> Result<RunOutcome, JobError>
where
    D: BlockDevice,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
    F: FnMut(u32) -> Result<D, E>,
{
    spec.validate()?;
    let mut devices = Vec::with_capacity(spec.numjobs as usize);
    for j in 0..spec.numjobs {
        let dev = factory(j).map_err(|e| JobError::Factory {
            job: j,
            source: e.into(),
        })?;
        devices.push(dev);
    }
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = devices
            .into_iter()
            .enumerate()
            .map(|(j, mut dev)| {
                let mut job = Job::new(spec.clone(), j as u32);
                if let Some(stop) = &stop {
                    job = job.with_stop(stop.clone());
                }
                std::thread::Builder::new()
                    .name(format!("pvio-job-{j}"))
                    .spawn_scoped(s, move || {
                        let r = job.run(&mut dev);
                        (r, job.take_acks())
                    })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(j, h)| match h {
                Ok(h) => h
                    .join()
                    .unwrap_or((Err(JobError::Panicked(j as u32)), None)),
                Err(e) => (
                    Err(JobError::Geometry {
                        job: j as u32,
                        reason: format!("could not start its thread: {e}"),
                    }),
                    None,
                ),
            })
            .collect()
    });
    let mut reports = Vec::with_capacity(results.len());
    let mut acks = Vec::with_capacity(results.len());
    for (r, a) in results {
        reports.push(r?);
        acks.push(a);
    }
    Ok(RunOutcome {
        report: RunReport::from_jobs(reports),
        acks,
    })
}
