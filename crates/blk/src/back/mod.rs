//! `pvio tapdisk`: the block backend of one virtual disk (tapdisk3's role),
//! one process per attached VBD.
//!
//! The control plane runs on a small tokio runtime: it reads the VBD's
//! backend directory that the toolstack wrote, opens the image, publishes
//! the backend's features and goes to InitWait; when the frontend reaches
//! Initialised it reads and validates the frontend's transport, maps each
//! queue's ring, binds each event channel, starts one datapath thread per
//! queue ([`queue`]), writes the disk's properties in one transaction and
//! goes to Connected. It follows the xenbus state machine to a clean close
//! from either side (Closing, Closed), and after a restart it waits for the
//! frontend to re-initialise rather than attaching to a stale ring.

pub mod grants;
pub mod metrics;
pub mod queue;
pub mod refusal_log;
pub mod transport;
pub mod waiter;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pvio_abi::blkif::{Blkif, VDISK_READONLY};
use pvio_abi::xenbus::XenbusState;
use pvio_abi::DomId;
use pvio_hv::{ForeignMemory, HvClient};
use pvio_poll::{AdaptiveConfig, HostLoad, PollPolicy, Tapdisk3Config};
use pvio_ring::BackRing;
use pvio_xenstore::xenbus::{read_keys, read_paths, state_path, switch_state};
use pvio_xenstore::Client;

use crate::engine::{open_engine, EngineChoice, EngineConfig};
use crate::image::Image;
use crate::image::{DirectIo, RawImage, RawOptions};
use crate::split::SplitSize;
use crate::xenbus_keys::backend as bk;

use metrics::{DiskMetrics, QueueMetrics};
use queue::{QueueSetup, StopSignal};
use refusal_log::RefusalLog;
use transport::{parse_transport, FrontendTransport};

/// Settings of one tapdisk (command-line defaults; per-VBD keys in the
/// backend directory override the polling, splitting and engine choices).
#[derive(Debug, Clone)]
pub struct TapdiskConfig {
    /// The VBD's backend directory, `/local/domain/0/backend/vbd/<fdom>/<devid>`.
    pub backend: String,
    pub hvd_socket: PathBuf,
    pub xenstore_socket: PathBuf,
    pub poll: PollPolicy,
    pub split: SplitSize,
    pub io_engine: EngineChoice,
    /// `multi-queue-max-queues` (Linux: the number of CPUs).
    pub max_queues: u32,
    /// `max-ring-page-order` (Linux: 4).
    pub max_ring_order: u32,
    /// `feature-max-indirect-segments` (Linux: 256).
    pub max_indirect_segments: u32,
    /// Offer `feature-persistent`.
    pub persistent: bool,
    /// Grants kept mapped per queue (Linux: 1056).
    pub max_persistent_grants: usize,
    /// Use O_DIRECT where the filesystem allows it.
    pub direct_io: DirectIo,
    /// Rewrite this file with the disk's counters every second.
    pub stats_file: Option<PathBuf>,
}

impl TapdiskConfig {
    /// Linux blkback's defaults for `backend`.
    pub fn new(backend: impl Into<String>, hvd_socket: PathBuf, xenstore_socket: PathBuf) -> Self {
        Self {
            backend: backend.into(),
            hvd_socket,
            xenstore_socket,
            poll: PollPolicy::Adaptive(AdaptiveConfig::default()),
            split: SplitSize::Off,
            io_engine: EngineChoice::Auto,
            max_queues: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
            max_ring_order: pvio_abi::blkif::BLKIF_MAX_RING_PAGE_ORDER,
            max_indirect_segments: pvio_abi::blkif::BLKIF_DEFAULT_MAX_INDIRECT_SEGMENTS as u32,
            persistent: true,
            max_persistent_grants: 1056,
            direct_io: DirectIo::Auto,
            stats_file: None,
        }
    }
}

/// Why a tapdisk stopped.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("xenstore: {0}")]
    Xenstore(#[from] pvio_xenstore::Error),
    #[error("hvd: {0}")]
    Hv(#[from] pvio_hv::HvError),
    #[error("image: {0}")]
    Image(#[from] crate::image::ImageError),
    #[error("frontend transport: {0}")]
    Transport(#[from] transport::TransportError),
    #[error("ring: {0}")]
    Ring(#[from] pvio_ring::RingError),
    #[error("I/O engine: {0}")]
    Engine(#[from] crate::engine::EngineError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("configuration: {0}")]
    Config(String),
}

/// A live connection to the frontend.
struct Connection {
    threads: Vec<std::thread::JoinHandle<Result<(), queue::QueueError>>>,
    stops: Vec<Arc<StopSignal>>,
    ring_handles: Vec<u32>,
    ports: Vec<u32>,
}

/// Everything the backend knows about its disk.
struct Disk {
    cfg: TapdiskConfig,
    xs: Client,
    host: Arc<HvClient>,
    fe_dir: String,
    fdom: DomId,
    image: Arc<dyn Image>,
    limits: crate::request::DiskLimits,
    poll: PollPolicy,
    split: SplitSize,
    engine: EngineChoice,
    load: HostLoad,
    metrics: DiskMetrics,
    /// Refused and failed requests, logged for every queue of the disk.
    refusals: Arc<RefusalLog>,
    /// What the stats file holds now.
    stats_written: String,
}

/// Runs a tapdisk until its VBD is unplugged or SIGTERM.
pub fn run(cfg: TapdiskConfig) -> Result<(), BackendError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(run_async(cfg))
}

fn fatal_msg(e: &dyn std::fmt::Display) -> String {
    format!("pvio tapdisk: {e}")
}

async fn run_async(cfg: TapdiskConfig) -> Result<(), BackendError> {
    let xs = Client::connect(&cfg.xenstore_socket).await?;
    let host = Arc::new(HvClient::connect_host(&cfg.hvd_socket)?);
    let be = cfg.backend.clone();
    let key = |k: &str| format!("{be}/{k}");
    // Everything the toolstack wrote for us, in one round trip (a VM of
    // 255 disks starts 255 tapdisks at once).
    let [fe_dir, fdom, params, mode, polling, duration, threshold, split_size, io_engine] =
        read_keys(
            &xs,
            &be,
            [
                bk::FRONTEND,
                bk::FRONTEND_ID,
                bk::PARAMS,
                bk::MODE,
                bk::PVIO_POLLING,
                bk::POLLING_DURATION,
                bk::POLLING_IDLE_THRESHOLD,
                bk::PVIO_SPLIT_SIZE,
                bk::PVIO_IO_ENGINE,
            ],
        )
        .await?;
    let required = |v: Option<String>, k: &str| {
        v.ok_or_else(|| BackendError::Config(format!("{} is missing", key(k))))
    };
    let fe_dir = required(fe_dir, bk::FRONTEND)?;
    let fdom: DomId = required(fdom, bk::FRONTEND_ID)?
        .trim()
        .parse()
        .map_err(|_| {
            BackendError::Config(format!("{} is not a domain id", key(bk::FRONTEND_ID)))
        })?;
    let params = required(params, bk::PARAMS)?;
    let mode = mode.unwrap_or_else(|| "w".into());
    // Per-VBD settings written by the toolstack override the defaults.
    let mut poll = cfg.poll;
    if let Some(p) = polling {
        poll = p.parse().map_err(BackendError::Config)?;
    }
    if let PollPolicy::Tapdisk3(ref mut t) = poll {
        if let Some(d) = duration {
            // xapi: invalid values fall back to 0 (no polling).
            t.window_ns = d.parse::<u64>().unwrap_or(0) * 1000;
        }
        if let Some(th) = threshold {
            t.idle_threshold_pct = th.parse().unwrap_or(50.0);
        }
        if t.window_ns == 0 {
            poll = PollPolicy::Off;
        }
    }
    if let PollPolicy::Adaptive(ref mut a) = poll {
        // Learn what a wake-up costs on this host: that is what polling saves.
        let measured =
            tokio::task::spawn_blocking(|| pvio_poll::calibrate::host_wake_cost_ns(40)).await;
        if let Ok(Ok(ns)) = measured {
            a.wake_cost_ns = ns.clamp(2_000, 200_000);
        }
    }
    let mut split = cfg.split;
    if let Some(s) = split_size {
        split = s.parse().map_err(BackendError::Config)?;
    }
    let mut engine = cfg.io_engine;
    if let Some(e) = io_engine {
        engine = e
            .parse()
            .map_err(|e| BackendError::Config(format!("{e}")))?;
    }
    let read_only = !mode.contains('w');
    let image: Arc<dyn Image> = Arc::new(RawImage::open(
        &params,
        &RawOptions {
            read_only,
            direct_io: cfg.direct_io,
            expected_size: None,
        },
    )?);
    let mut limits = image.disk_limits();
    limits.max_indirect_segments = cfg.max_indirect_segments;
    tracing::info!(
        backend = %be, frontend = fdom, image = %params, read_only,
        polling = poll.name(), split = %split, direct_io = image.direct_io(),
        "tapdisk starting"
    );
    let mut disk = Disk {
        cfg: cfg.clone(),
        xs: xs.clone(),
        host,
        fe_dir,
        fdom,
        image,
        limits,
        poll,
        split,
        engine,
        load: HostLoad::start(Duration::from_secs(1)),
        metrics: DiskMetrics::default(),
        refusals: Arc::new(RefusalLog::new(format!(
            "vbd {fdom}/{}",
            be.rsplit('/').next().unwrap_or("?")
        ))),
        stats_written: String::new(),
    };
    disk.publish_features().await?;
    switch_state(&xs, &be, XenbusState::InitWait).await?;

    let mut fe_watch = xs.watch(&state_path(&disk.fe_dir)).await?;
    let mut be_watch = xs.watch(&be).await?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut conn: Option<Connection> = None;
    // After a restart the frontend may still say Connected about the old
    // ring: connect only to a transport published since we started.
    let mut fresh_transport = false;
    let mut closing_deadline: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = fe_watch.next() => {}
            _ = be_watch.next() => {}
            _ = tick.tick() => {
                disk.write_stats(conn.is_some());
                if closing_deadline.is_none_or(|d| tokio::time::Instant::now() < d) {
                    continue;
                }
            }
            _ = term.recv() => { tracing::info!("SIGTERM: closing"); break; }
            _ = int.recv() => { tracing::info!("SIGINT: closing"); break; }
        }
        // Events queued meanwhile say nothing the reads below do not see
        // (writing our own keys alone queues one per key).
        while fe_watch.try_next().is_some() || be_watch.try_next().is_some() {}
        // Whether the device is still there, both ends' states and whether
        // the toolstack asked to unplug, in one round trip.
        let [dir, fe, ours, online] = read_paths(
            &xs,
            [
                be.clone(),
                state_path(&disk.fe_dir),
                state_path(&be),
                key(bk::ONLINE),
            ],
        )
        .await?;
        if dir.is_none() {
            tracing::info!("backend directory removed: exiting");
            break;
        }
        let state = |v: Option<String>| {
            v.and_then(|v| XenbusState::parse(&v))
                .unwrap_or(XenbusState::Unknown)
        };
        let (fe, ours) = (state(fe), state(ours));
        let online = online.is_none_or(|v| v != "0");
        if !online {
            // Unplug requested by the toolstack: close, wait for the frontend
            // (with a deadline), then go.
            let gone = matches!(fe, XenbusState::Closed | XenbusState::Unknown);
            let late = closing_deadline.is_some_and(|d| tokio::time::Instant::now() >= d);
            if conn.is_some() && !gone && !late {
                if ours != XenbusState::Closing {
                    switch_state(&xs, &be, XenbusState::Closing).await?;
                    closing_deadline = Some(tokio::time::Instant::now() + Duration::from_secs(10));
                }
                continue;
            }
            break;
        }
        match fe {
            XenbusState::Initialising | XenbusState::InitWait => {
                fresh_transport = true;
                if ours == XenbusState::Closed {
                    switch_state(&xs, &be, XenbusState::InitWait).await?;
                }
            }
            XenbusState::Initialised | XenbusState::Connected
                if conn.is_none() && ours == XenbusState::InitWait =>
            {
                if fe == XenbusState::Connected && !fresh_transport {
                    continue;
                }
                match disk.connect().await {
                    Ok(c) => {
                        conn = Some(c);
                        disk.write_properties().await?;
                        switch_state(&xs, &be, XenbusState::Connected).await?;
                        tracing::info!(
                            queues = conn.as_ref().map_or(0, |c| c.threads.len()),
                            "connected"
                        );
                    }
                    Err(e) => {
                        tracing::error!("cannot connect: {e}");
                        let _ = xs.write(&key(bk::ERROR), fatal_msg(&e)).await;
                        switch_state(&xs, &be, XenbusState::Closing).await?;
                    }
                }
                fresh_transport = false;
            }
            XenbusState::Closing if ours != XenbusState::Closing && ours != XenbusState::Closed => {
                switch_state(&xs, &be, XenbusState::Closing).await?;
            }
            XenbusState::Closed | XenbusState::Unknown
                if ours != XenbusState::Closed
                    && (conn.is_some() || ours == XenbusState::Closing) =>
            {
                if let Some(c) = conn.take() {
                    disk.disconnect(c).await;
                }
                switch_state(&xs, &be, XenbusState::Closed).await?;
            }
            _ => {}
        }
    }
    if let Some(c) = conn.take() {
        disk.disconnect(c).await;
    }
    disk.write_stats(false);
    if xs.exists(&be).await.unwrap_or(false) {
        let _ = switch_state(&xs, &be, XenbusState::Closed).await;
    }
    tracing::info!("tapdisk stopped");
    Ok(())
}

impl Disk {
    /// Features and transport limits, before InitWait (one transaction).
    async fn publish_features(&self) -> Result<(), BackendError> {
        let mut kv: Vec<(&str, String)> = vec![
            (bk::FEATURE_FLUSH_CACHE, "1".into()),
            (bk::FEATURE_BARRIER, "1".into()),
            (
                bk::FEATURE_PERSISTENT,
                u8::from(self.cfg.persistent).to_string(),
            ),
            (
                bk::FEATURE_MAX_INDIRECT_SEGMENTS,
                self.cfg.max_indirect_segments.to_string(),
            ),
            (bk::MULTI_QUEUE_MAX_QUEUES, self.cfg.max_queues.to_string()),
            (bk::MAX_RING_PAGE_ORDER, self.cfg.max_ring_order.to_string()),
            (
                bk::FEATURE_DISCARD,
                u8::from(self.limits.discard).to_string(),
            ),
            (
                bk::FEATURE_PVIO_BLOCK_STATUS,
                u8::from(self.limits.block_status).to_string(),
            ),
        ];
        if self.limits.discard {
            kv.push((
                bk::DISCARD_GRANULARITY,
                self.image.logical_block_size().to_string(),
            ));
            kv.push((bk::DISCARD_ALIGNMENT, "0".into()));
            kv.push((bk::DISCARD_SECURE, "0".into()));
        }
        self.write_keys(&kv).await
    }

    /// Writes backend keys in one transaction and one round trip.
    async fn write_keys(&self, kv: &[(&str, String)]) -> Result<(), BackendError> {
        let be = &self.cfg.backend;
        let kvs: Vec<(String, String)> = kv
            .iter()
            .map(|(k, v)| (format!("{be}/{k}"), v.clone()))
            .collect();
        self.xs
            .transaction(async |t| t.write_many(&kvs).await)
            .await?;
        Ok(())
    }

    /// Disk properties, in one transaction, before Connected.
    async fn write_properties(&self) -> Result<(), BackendError> {
        let ss = self.image.logical_block_size();
        let sectors = self.image.size() / u64::from(ss);
        let info = if self.limits.read_only {
            VDISK_READONLY
        } else {
            0
        };
        let kv = [
            (bk::SECTORS, sectors.to_string()),
            (bk::INFO, info.to_string()),
            (bk::SECTOR_SIZE, ss.to_string()),
            (bk::PHYSICAL_SECTOR_SIZE, ss.max(4096).to_string()),
        ];
        self.write_keys(&kv).await
    }

    /// Reads the frontend's transport keys.
    async fn read_transport(&self) -> Result<FrontendTransport, BackendError> {
        let top = self.xs.directory(&self.fe_dir).await?;
        let mut wanted: Vec<String> = Vec::new();
        for name in &top {
            if name.starts_with("queue-") {
                for sub in self
                    .xs
                    .directory(&format!("{}/{name}", self.fe_dir))
                    .await?
                {
                    wanted.push(format!("{name}/{sub}"));
                }
            } else {
                wanted.push(name.clone());
            }
        }
        // Every key in one round trip.
        let paths: Vec<String> = wanted
            .iter()
            .map(|k| format!("{}/{k}", self.fe_dir))
            .collect();
        let values = self.xs.try_read_texts(&paths).await?;
        let keys: HashMap<String, String> = wanted
            .into_iter()
            .zip(values)
            .filter_map(|(k, v)| Some((k, v?)))
            .collect();
        Ok(parse_transport(
            &keys,
            self.cfg.max_queues,
            self.cfg.max_ring_order,
        )?)
    }

    async fn connect(&mut self) -> Result<Connection, BackendError> {
        let t = self.read_transport().await?;
        let mem = Arc::new(self.host.foreign_memory(self.fdom)?);
        let mut c = Connection {
            threads: Vec::new(),
            stops: Vec::new(),
            ring_handles: Vec::new(),
            ports: Vec::new(),
        };
        self.metrics = DiskMetrics::default();
        for (i, q) in t.queues.iter().enumerate() {
            if let Err(e) = self.start_queue(i as u32, q, &t, &mem, &mut c) {
                self.disconnect(c).await;
                return Err(e);
            }
        }
        Ok(c)
    }

    fn start_queue(
        &mut self,
        index: u32,
        q: &transport::QueueTransport,
        t: &FrontendTransport,
        mem: &Arc<ForeignMemory>,
        c: &mut Connection,
    ) -> Result<(), BackendError> {
        let mapped = self.host.map_grant_refs(self.fdom, &q.ring_refs, false)?;
        c.ring_handles.extend(mapped.iter().map(|m| m.handle));
        let frames: Vec<u32> = mapped.iter().map(|m| m.frame).collect();
        let pages = mem.map_frames(&frames)?;
        let ring = BackRing::<Blkif, _>::attach(pages)?;
        let chan = self
            .host
            .evtchn_bind_interdomain(self.fdom, q.event_channel)?;
        c.ports.push(chan.port());
        let depth = (ring.size() * 4).max(256);
        let engine = open_engine(
            self.engine,
            &EngineConfig {
                queue_depth: depth,
                threads: 4,
            },
        )?;
        let metrics = Arc::new(QueueMetrics::default());
        self.metrics.queues.push(metrics.clone());
        let stop = StopSignal::new()?;
        c.stops.push(stop.clone());
        let setup = QueueSetup {
            index,
            domid: self.fdom,
            ring,
            chan,
            mem: mem.clone(),
            grants: grants::GrantMapper::new(
                self.host.clone(),
                self.fdom,
                t.persistent && self.cfg.persistent,
                self.cfg.max_persistent_grants,
            ),
            image: self.image.clone(),
            limits: self.limits,
            engine,
            poll: self.poll,
            load: self.load.clone(),
            split: self.split,
            metrics,
            refusals: self.refusals.clone(),
            stop,
        };
        c.threads.push(queue::spawn(setup)?);
        Ok(())
    }

    async fn disconnect(&mut self, c: Connection) {
        for s in &c.stops {
            s.request();
        }
        for t in c.threads {
            match tokio::task::spawn_blocking(move || t.join()).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => tracing::warn!("queue ended with an error: {e}"),
                _ => tracing::error!("a queue thread panicked"),
            }
        }
        if !c.ring_handles.is_empty() {
            if let Err(e) = self.host.unmap_grants(&c.ring_handles) {
                tracing::warn!("unmapping rings: {e}");
            }
        }
        for p in c.ports {
            if let Err(e) = self.host.evtchn_close(p) {
                tracing::debug!("closing port {p}: {e}");
            }
        }
        tracing::info!("disconnected");
    }

    /// Rewrites the stats file if anything in it changed: a new file and a
    /// rename each time (readers never see half a file) cost an inode
    /// allocation, which a host of 255 idle disks per VM should not pay
    /// every second (it took a fifth of the CPU while a 255-disk VM
    /// started).
    fn write_stats(&mut self, connected: bool) {
        let Some(path) = &self.cfg.stats_file else {
            return;
        };
        let v = serde_json::json!({
            "backend": self.cfg.backend,
            "frontend_domid": self.fdom,
            "connected": connected,
            "polling": self.poll.name(),
            "split_size": self.split.to_string(),
            "metrics": self.metrics.snapshot(),
        });
        let text = v.to_string();
        if text == self.stats_written {
            return;
        }
        let tmp = path.with_extension("tmp");
        if std::fs::write(&tmp, &text)
            .and_then(|_| std::fs::rename(&tmp, path))
            .is_err()
        {
            tracing::debug!("cannot write {}", path.display());
            return;
        }
        self.stats_written = text;
    }
}

/// Turns a policy name and tapdisk3 parameters into a policy (for the CLI).
pub fn policy_from(
    name: &str,
    duration_us: u64,
    idle_threshold_pct: f32,
) -> Result<PollPolicy, String> {
    let mut p: PollPolicy = name.parse()?;
    if let PollPolicy::Tapdisk3(ref mut t) = p {
        *t = Tapdisk3Config {
            window_ns: duration_us * 1000,
            idle_threshold_pct,
        };
    }
    Ok(p)
}
