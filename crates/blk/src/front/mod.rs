//! blkfront: a guest's virtual disk served by a backend over shared rings
//! (Linux's `xen-blkfront`).
//!
//! [`connect`] runs the xenbus handshake with the real key names and state
//! sequence: wait for the backend's InitWait, read its limits and features,
//! place each queue's ring in guest memory and grant it, allocate an event
//! channel per queue, grant the I/O buffers (and indirect pages) once,
//! publish the transport in one transaction with `protocol = x86_64-abi`,
//! go to Initialised, wait for Connected, read the disk's size, and go to
//! Connected. [`BlkFront::supervise`] then follows the backend: when it
//! comes back in InitWait after a restart, it rebuilds the rings and event
//! channels and pushes the requests that were in flight again (writes are
//! idempotent, so no acknowledged write is lost); when it closes, the queues
//! report the disk disconnected.

pub mod queue;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pvio_abi::blkif::{Blkif, VDISK_READONLY};
use pvio_abi::grant_table::GrantRef;
use pvio_abi::xenbus::XenbusState;
use pvio_abi::{DomId, XEN_IO_PROTO_ABI_X86_64, XEN_PAGE_SIZE};
use pvio_hv::grant::GrantTable;
use pvio_hv::memory::FrameAllocator;
use pvio_hv::{EventChannel, Gfn, GuestDomain, GuestMemory, HvClient};
use pvio_poll::{AdaptiveConfig, HostLoad, PollPolicy, Poller};
use pvio_ring::{FrontRing, GuestPages, RingProtocol};
use pvio_xenstore::xenbus::{frontend_path, read_keys, read_state, switch_state, wait_for_state};
use pvio_xenstore::Client;

use crate::device::DiskInfo;
use crate::xenbus_keys::{backend as bk, frontend as fk};
pub use queue::BlkQueue;
use queue::{GrantedPages, QueueShared, RingState};

/// How a guest wants a disk set up.
#[derive(Debug, Clone)]
pub struct FrontendConfig {
    /// The VBD's device id (`virtual-device`), e.g. 51712 for xvda.
    pub devid: u32,
    /// Queues wanted (capped by the backend's `multi-queue-max-queues`).
    pub queues: u32,
    /// Ring pages per queue as an order (capped by `max-ring-page-order`).
    pub ring_order: u32,
    /// I/O buffers per queue.
    pub buffers: usize,
    /// Size of each buffer in bytes (a multiple of 4096).
    pub buffer_size: usize,
    /// How to wait for responses.
    pub poll: PollPolicy,
    /// Use indirect descriptors when the backend offers them.
    pub indirect: bool,
    /// Ask for persistent grants.
    pub persistent: bool,
    /// How long to wait for the backend at each step.
    pub timeout: Duration,
}

impl FrontendConfig {
    /// One queue, a 4-page ring, 64 buffers of 1 MiB, adaptive polling.
    pub fn new(devid: u32) -> Self {
        Self {
            devid,
            queues: 1,
            ring_order: 2,
            buffers: 64,
            buffer_size: 1 << 20,
            poll: frontend_default_policy(),
            indirect: true,
            persistent: true,
            timeout: Duration::from_secs(30),
        }
    }
}

/// The frontend's default: adaptive, calibrated to this host's wake-up
/// cost. A guest waiting on its own I/O spends its own vCPU spinning, and
/// the host-load gate stops it when others need the CPU.
///
/// It may spin three times as long per wake-up saved as a backend
/// ([`FRONTEND_SPIN_PER_SAVED`]): at queue depth 1 the guest waits a whole
/// disk I/O for each response (25–45 µs on a VM whose wake-up costs
/// 6.5–8 µs), and catching it by polling, as Linux's polled block I/O
/// does, spends the guest's own otherwise idle vCPU for 15–20% more IOPS.
/// With eight wake-ups the budget (52–64 µs) sat so close to the gap and
/// its spread that a third of the runs fell back to blocking.
pub fn frontend_default_policy() -> PollPolicy {
    let mut cfg = AdaptiveConfig {
        spin_per_saved: FRONTEND_SPIN_PER_SAVED,
        ..AdaptiveConfig::default()
    };
    if let Ok(ns) = pvio_poll::calibrate::host_wake_cost_ns(30) {
        cfg.wake_cost_ns = ns.clamp(2_000, 200_000);
    }
    PollPolicy::Adaptive(cfg)
}

/// The frontend's CPU budget for a spin, in wake-ups saved per request
/// (a backend's is [`AdaptiveConfig::default`]'s 4).
pub const FRONTEND_SPIN_PER_SAVED: f64 = 12.0;

/// Why a disk could not be connected.
#[derive(Debug, thiserror::Error)]
pub enum FrontError {
    #[error("xenstore: {0}")]
    Xenstore(#[from] pvio_xenstore::Error),
    #[error("hvd: {0}")]
    Hv(#[from] pvio_hv::HvError),
    #[error("ring: {0}")]
    Ring(#[from] pvio_ring::RingError),
    #[error("the backend's {key} = {value:?} is invalid")]
    BadBackendKey { key: String, value: String },
    #[error("the backend closed the device: {0}")]
    Closed(String),
    #[error("{0}")]
    Config(String),
}

/// Resources of the guest that frontends share: its hvd connection,
/// memory, grant table and frame allocator.
#[derive(Clone)]
pub struct GuestResources {
    pub client: Arc<HvClient>,
    pub memory: Arc<GuestMemory>,
    pub grants: Arc<GrantTable>,
    pub frames: Arc<Mutex<FrameAllocator>>,
}

impl GuestResources {
    /// Takes a guest domain apart: its resources for frontends, and its
    /// xenstore event channel (for the xenbus ring client). Frames below
    /// `reserved` are never allocated.
    pub fn new(dom: GuestDomain, reserved: u32) -> (Self, EventChannel) {
        let GuestDomain {
            client,
            memory,
            grants,
            store,
        } = dom;
        let frames = memory.frames();
        (
            Self {
                client: Arc::new(client),
                memory,
                grants,
                frames: Arc::new(Mutex::new(FrameAllocator::new(frames, reserved))),
            },
            store,
        )
    }

    fn alloc(&self, n: u32) -> Result<Gfn, FrontError> {
        Ok(self
            .frames
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .alloc(n)?)
    }

    /// Allocates `pages` contiguous frames and grants each to `backend`.
    fn grant_pages(&self, pages: u32, backend: DomId) -> Result<GrantedPages, FrontError> {
        let first = self.alloc(pages)?;
        let grefs = (0..pages)
            .map(|i| self.grants.grant_access(backend, first + i, false))
            .collect::<Result<Vec<GrantRef>, _>>()?;
        Ok(GrantedPages { first, grefs })
    }
}

/// The control side of a connected disk.
pub struct BlkFront {
    res: GuestResources,
    xs: Client,
    fe_dir: String,
    be_dir: String,
    backend_id: DomId,
    ring_order: u32,
    persistent: bool,
    queues: Vec<Arc<QueueShared>>,
    info: DiskInfo,
    timeout: Duration,
    closed: Arc<AtomicBool>,
}

impl std::fmt::Debug for BlkFront {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlkFront")
            .field("frontend", &self.fe_dir)
            .field("backend", &self.be_dir)
            .field("info", &self.info)
            .finish()
    }
}

/// A number a backend published at `path`, `default` where it did not.
fn parse_num<T: std::str::FromStr>(
    path: &str,
    value: Option<String>,
    default: T,
) -> Result<T, FrontError> {
    match value {
        None => Ok(default),
        Some(v) => v.parse().map_err(|_| FrontError::BadBackendKey {
            key: path.to_string(),
            value: v,
        }),
    }
}

fn not_closed(s: XenbusState) -> Result<(), FrontError> {
    if matches!(s, XenbusState::Closing | XenbusState::Closed) {
        Err(FrontError::Closed(format!("backend state {s}")))
    } else {
        Ok(())
    }
}

/// Connects disk `cfg.devid` of this guest and returns its control handle
/// and one [`BlkQueue`] per queue.
pub async fn connect(
    res: GuestResources,
    xs: Client,
    cfg: &FrontendConfig,
) -> Result<(BlkFront, Vec<BlkQueue>), FrontError> {
    if cfg.buffer_size == 0 || !cfg.buffer_size.is_multiple_of(XEN_PAGE_SIZE) || cfg.buffers == 0 {
        return Err(FrontError::Config(format!(
            "buffers must be a non-zero number of whole pages (got {} x {} bytes)",
            cfg.buffers, cfg.buffer_size
        )));
    }
    let domid = res.client.domid();
    let fe_dir = frontend_path(domid, "vbd", cfg.devid);
    let f = |k: &str| format!("{fe_dir}/{k}");
    let [be_dir, id] = read_keys(&xs, &fe_dir, [fk::BACKEND, fk::BACKEND_ID]).await?;
    let be_dir = be_dir.ok_or(pvio_xenstore::Error::Xen(pvio_xenstore::XsError::Enoent))?;
    let backend_id: DomId = parse_num(&f(fk::BACKEND_ID), id, 0)?;
    let deadline = Instant::now() + cfg.timeout;
    let s = wait_for_state(&xs, &be_dir, deadline, |s| s >= XenbusState::InitWait).await?;
    not_closed(s)?;
    let b = |k: &str| format!("{be_dir}/{k}");
    let [q, order, indirect, persistent] = read_keys(
        &xs,
        &be_dir,
        [
            bk::MULTI_QUEUE_MAX_QUEUES,
            bk::MAX_RING_PAGE_ORDER,
            bk::FEATURE_MAX_INDIRECT_SEGMENTS,
            bk::FEATURE_PERSISTENT,
        ],
    )
    .await?;
    let max_q: u32 = parse_num(&b(bk::MULTI_QUEUE_MAX_QUEUES), q, 1)?;
    let max_order: u32 = parse_num(&b(bk::MAX_RING_PAGE_ORDER), order, 0)?;
    let max_indirect: u32 = parse_num(&b(bk::FEATURE_MAX_INDIRECT_SEGMENTS), indirect, 0)?;
    let be_persistent: u32 = parse_num(&b(bk::FEATURE_PERSISTENT), persistent, 0)?;
    let nq = cfg.queues.clamp(1, max_q.max(1));
    let order = cfg
        .ring_order
        .min(max_order)
        .min(pvio_abi::blkif::BLKIF_MAX_RING_PAGE_ORDER);
    let ring_slots = Blkif::ring_size_for_pages(1 << order) as u32;
    let indirect_segs = if cfg.indirect {
        max_indirect.min(4096)
    } else {
        0
    };
    let per_page = (XEN_PAGE_SIZE / 8) as u32;
    let buffer_pages = (cfg.buffer_size / XEN_PAGE_SIZE) as u32;
    // Indirect pages only where a buffer is larger than a direct request
    // carries (an idle disk's one-page buffer needs none: a VM of 255
    // disks would otherwise spend 128 frames on each).
    let direct_max = pvio_abi::blkif::BLKIF_MAX_SEGMENTS_PER_REQUEST as u32;
    let indirect_per_req = if indirect_segs > direct_max && buffer_pages > direct_max {
        buffer_pages.min(indirect_segs).div_ceil(per_page) as usize
    } else {
        0
    };
    let max_pages = if indirect_per_req > 0 {
        buffer_pages.min(indirect_segs)
    } else {
        buffer_pages.min(11)
    };
    let load = HostLoad::process_wide();

    let mut shared = Vec::new();
    let mut queues = Vec::new();
    for q in 0..nq {
        let pages = res.alloc(1 << order)?;
        let ring_pages = GuestPages::new(res.memory.clone(), pages, 1 << order)?;
        let front = FrontRing::<Blkif, _>::init(ring_pages.clone())?;
        let grefs = (0..1u32 << order)
            .map(|i| res.grants.grant_access(backend_id, pages + i, false))
            .collect::<Result<Vec<_>, _>>()?;
        let chan = res.client.evtchn_alloc_unbound(backend_id)?;
        let sh = Arc::new(QueueShared {
            state: Mutex::new(RingState {
                front,
                chan: Arc::new(chan),
                pages: ring_pages,
                grefs,
                inflight: (0..ring_slots).map(|_| None).collect(),
                free_ids: (0..ring_slots).rev().collect(),
                connected: true,
                closed: None,
                suppressed: false,
            }),
            reconnecting: AtomicBool::new(false),
        });
        let buffers = (0..cfg.buffers)
            .map(|_| res.grant_pages(buffer_pages, backend_id))
            .collect::<Result<Vec<_>, _>>()?;
        let indirect = if indirect_per_req > 0 {
            Some(res.grant_pages(ring_slots * indirect_per_req as u32, backend_id)?)
        } else {
            None
        };
        shared.push(sh.clone());
        queues.push(BlkQueue {
            shared: sh,
            index: q,
            devid: cfg.devid,
            info: DiskInfo {
                sectors: 0,
                sector_size: 512,
                read_only: false,
                flush: false,
                discard: false,
                max_request_bytes: max_pages * XEN_PAGE_SIZE as u32,
                block_status: false,
            },
            mem: res.memory.clone(),
            buffers,
            buffer_size: cfg.buffer_size,
            indirect,
            indirect_per_req,
            poller: Poller::new(cfg.poll),
            load: load.clone(),
        });
    }
    let mut front = BlkFront {
        res,
        xs,
        fe_dir,
        be_dir,
        backend_id,
        ring_order: order,
        persistent: cfg.persistent && be_persistent == 1,
        queues: shared,
        info: queues[0].info,
        timeout: cfg.timeout,
        closed: Arc::new(AtomicBool::new(false)),
    };
    front.handshake().await?;
    for q in &mut queues {
        q.info = DiskInfo {
            max_request_bytes: q.info.max_request_bytes,
            ..front.info
        };
    }
    tracing::info!(
        devid = cfg.devid,
        queues = nq,
        ring_order = order,
        indirect = indirect_segs,
        persistent = front.persistent,
        sectors = front.info.sectors,
        "disk connected"
    );
    Ok((front, queues))
}

impl BlkFront {
    /// Size and features of the disk.
    pub fn info(&self) -> DiskInfo {
        self.info
    }

    /// The frontend directory.
    pub fn frontend_dir(&self) -> &str {
        &self.fe_dir
    }

    /// Publishes the transport, goes Initialised, waits for the backend to
    /// connect, reads the disk's properties and goes Connected.
    async fn handshake(&mut self) -> Result<(), FrontError> {
        let mut kv: Vec<(String, String)> = vec![
            (fk::PROTOCOL.into(), XEN_IO_PROTO_ABI_X86_64.into()),
            (
                fk::FEATURE_PERSISTENT.into(),
                u8::from(self.persistent).to_string(),
            ),
        ];
        let nq = self.queues.len();
        if nq > 1 {
            kv.push((fk::MULTI_QUEUE_NUM_QUEUES.into(), nq.to_string()));
        }
        if self.ring_order > 0 {
            kv.push((fk::RING_PAGE_ORDER.into(), self.ring_order.to_string()));
        }
        for (i, q) in self.queues.iter().enumerate() {
            let st = q.lock();
            let prefix = if nq > 1 {
                format!("{}/", fk::queue_dir(i as u32))
            } else {
                String::new()
            };
            if self.ring_order == 0 {
                kv.push((format!("{prefix}{}", fk::RING_REF), st.grefs[0].to_string()));
            } else {
                for (n, g) in st.grefs.iter().enumerate() {
                    kv.push((
                        format!("{prefix}{}", fk::ring_ref_n(n as u32)),
                        g.to_string(),
                    ));
                }
            }
            kv.push((
                format!("{prefix}{}", fk::EVENT_CHANNEL),
                st.chan.port().to_string(),
            ));
        }
        let kv: Vec<(String, String)> = kv
            .into_iter()
            .map(|(k, v)| (format!("{}/{k}", self.fe_dir), v))
            .collect();
        self.xs
            .transaction(async |t| t.write_many(&kv).await)
            .await?;
        switch_state(&self.xs, &self.fe_dir, XenbusState::Initialised).await?;
        let deadline = Instant::now() + self.timeout;
        let s = wait_for_state(&self.xs, &self.be_dir, deadline, |s| {
            s == XenbusState::Connected || s >= XenbusState::Closing
        })
        .await?;
        not_closed(s)?;
        let b = |k: &str| format!("{}/{k}", self.be_dir);
        let [ss, n, info, flush, discard, status] = read_keys(
            &self.xs,
            &self.be_dir,
            [
                bk::SECTOR_SIZE,
                bk::SECTORS,
                bk::INFO,
                bk::FEATURE_FLUSH_CACHE,
                bk::FEATURE_DISCARD,
                bk::FEATURE_PVIO_BLOCK_STATUS,
            ],
        )
        .await?;
        let sector_size: u32 = parse_num(&b(bk::SECTOR_SIZE), ss, 512)?;
        let sectors: u64 = parse_num(&b(bk::SECTORS), n, 0)?;
        let info: u32 = parse_num(&b(bk::INFO), info, 0)?;
        if sector_size < 512 || !sector_size.is_power_of_two() {
            return Err(FrontError::BadBackendKey {
                key: b(bk::SECTOR_SIZE),
                value: sector_size.to_string(),
            });
        }
        self.info = DiskInfo {
            sectors,
            sector_size,
            read_only: info & VDISK_READONLY != 0,
            flush: parse_num::<u32>(&b(bk::FEATURE_FLUSH_CACHE), flush, 0)? == 1,
            discard: parse_num::<u32>(&b(bk::FEATURE_DISCARD), discard, 0)? == 1,
            max_request_bytes: self.info.max_request_bytes,
            block_status: parse_num::<u32>(&b(bk::FEATURE_PVIO_BLOCK_STATUS), status, 0)? == 1,
        };
        switch_state(&self.xs, &self.fe_dir, XenbusState::Connected).await?;
        Ok(())
    }

    /// Follows the backend until the device closes or `stop` resolves:
    /// reconnects after a backend restart, and closes cleanly.
    pub async fn supervise(
        mut self,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<(), FrontError> {
        let mut w = self
            .xs
            .watch(&pvio_xenstore::xenbus::state_path(&self.be_dir))
            .await?;
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => {
                    self.close().await;
                    return Ok(());
                }
                ev = w.next() => {
                    if ev.is_none() {
                        return Err(FrontError::Closed("xenstore connection lost".into()));
                    }
                }
            }
            let be = read_state(&self.xs, &self.be_dir).await?;
            let ours = read_state(&self.xs, &self.fe_dir).await?;
            match be {
                XenbusState::InitWait if ours == XenbusState::Connected => {
                    tracing::warn!(backend = %self.be_dir, "backend restarted: reconnecting");
                    if let Err(e) = self.reconnect().await {
                        tracing::error!("reconnect failed: {e}");
                        self.mark_closed(&format!("reconnect failed: {e}"));
                        return Err(e);
                    }
                }
                XenbusState::Closing if ours != XenbusState::Closed => {
                    // The backend (or the toolstack) is closing the device.
                    self.close().await;
                    return Ok(());
                }
                XenbusState::Closed if ours == XenbusState::Connected => {
                    self.mark_closed("the backend closed the device");
                    let _ = switch_state(&self.xs, &self.fe_dir, XenbusState::Closed).await;
                    return Ok(());
                }
                _ => {}
            }
        }
    }

    fn mark_closed(&self, why: &str) {
        self.closed.store(true, Ordering::Release);
        for q in &self.queues {
            let mut st = q.lock();
            st.closed = Some(why.to_string());
            st.connected = false;
            // Wake a queue thread blocked on its event channel.
            let _ = pvio_hv::sys::eventfd_signal(st.chan.wait_fd());
        }
    }

    /// Closing → Closed, releasing the event channels.
    pub async fn close(&mut self) {
        let _ = switch_state(&self.xs, &self.fe_dir, XenbusState::Closing).await;
        let deadline = Instant::now() + self.timeout.min(Duration::from_secs(10));
        let _ = wait_for_state(&self.xs, &self.be_dir, deadline, |s| {
            s >= XenbusState::Closing || s == XenbusState::Unknown
        })
        .await;
        self.mark_closed("the device was closed");
        for q in &self.queues {
            let port = q.lock().chan.port();
            let _ = self.res.client.evtchn_close(port);
        }
        let _ = switch_state(&self.xs, &self.fe_dir, XenbusState::Closed).await;
    }

    /// Rebuilds every queue's ring and event channel after a backend
    /// restart and pushes the requests in flight again.
    async fn reconnect(&mut self) -> Result<(), FrontError> {
        for q in &self.queues {
            q.reconnecting.store(true, Ordering::Release);
            let mut st = q.lock();
            st.connected = false;
            let _ = pvio_hv::sys::eventfd_signal(st.chan.wait_fd());
        }
        for q in &self.queues {
            let chan = self.res.client.evtchn_alloc_unbound(self.backend_id)?;
            let mut st = q.lock();
            let old = std::mem::replace(&mut st.chan, Arc::new(chan));
            let _ = self.res.client.evtchn_close(old.port());
            let pages = st.pages.clone();
            st.front = FrontRing::<Blkif, _>::init(pages)?;
            st.suppressed = false;
        }
        switch_state(&self.xs, &self.fe_dir, XenbusState::Initialising).await?;
        self.handshake().await?;
        for q in &self.queues {
            queue::resume(q).map_err(FrontError::Config)?;
        }
        tracing::info!(frontend = %self.fe_dir, "reconnected");
        Ok(())
    }
}
