//! The xenstore key names of the blkif handshake (`io/blkif.h`, Linux
//! blkback/blkfront), and pvio's own per-VBD settings.

/// Backend → frontend: transport limits and features, before InitWait.
pub mod backend {
    pub const FEATURE_FLUSH_CACHE: &str = "feature-flush-cache";
    pub const FEATURE_BARRIER: &str = "feature-barrier";
    pub const FEATURE_DISCARD: &str = "feature-discard";
    pub const DISCARD_GRANULARITY: &str = "discard-granularity";
    pub const DISCARD_ALIGNMENT: &str = "discard-alignment";
    pub const DISCARD_SECURE: &str = "discard-secure";
    pub const FEATURE_PERSISTENT: &str = "feature-persistent";
    pub const FEATURE_MAX_INDIRECT_SEGMENTS: &str = "feature-max-indirect-segments";
    pub const MULTI_QUEUE_MAX_QUEUES: &str = "multi-queue-max-queues";
    pub const MAX_RING_PAGE_ORDER: &str = "max-ring-page-order";
    pub const MAX_RING_PAGES: &str = "max-ring-pages";
    /// Device properties, written in one transaction at connect.
    pub const SECTORS: &str = "sectors";
    pub const INFO: &str = "info";
    pub const SECTOR_SIZE: &str = "sector-size";
    pub const PHYSICAL_SECTOR_SIZE: &str = "physical-sector-size";
    /// Written by the toolstack.
    pub const FRONTEND: &str = "frontend";
    pub const FRONTEND_ID: &str = "frontend-id";
    pub const ONLINE: &str = "online";
    pub const PARAMS: &str = "params";
    pub const MODE: &str = "mode";
    pub const TYPE: &str = "type";
    pub const DEVICE_TYPE: &str = "device-type";
    /// `xenbus_dev_fatal` writes its message here.
    pub const ERROR: &str = "error";
    /// pvio: polling policy (`off`, `spin`, `tapdisk3`, `adaptive`).
    pub const PVIO_POLLING: &str = "pvio-polling";
    /// tapdisk3's window in µs (the `tapdisk3` policy).
    pub const POLLING_DURATION: &str = "polling-duration";
    /// tapdisk3's idle threshold in percent (the `tapdisk3` policy).
    pub const POLLING_IDLE_THRESHOLD: &str = "polling-idle-threshold";
    /// pvio: request splitting (`off`, `auto`, or a size like `8k`).
    pub const PVIO_SPLIT_SIZE: &str = "pvio-split-size";
    /// pvio: I/O engine (`auto`, `uring`, `threads`).
    pub const PVIO_IO_ENGINE: &str = "pvio-io-engine";
    /// pvio: the backend answers `BLKIF_OP_PVIO_BLOCK_STATUS` (what the
    /// image holds: holes, zeroes, data).
    pub const FEATURE_PVIO_BLOCK_STATUS: &str = "feature-pvio-block-status";
}

/// Frontend → backend: the transport, before Initialised.
pub mod frontend {
    pub const RING_REF: &str = "ring-ref";
    pub const RING_PAGE_ORDER: &str = "ring-page-order";
    pub const EVENT_CHANNEL: &str = "event-channel";
    pub const PROTOCOL: &str = "protocol";
    pub const FEATURE_PERSISTENT: &str = "feature-persistent";
    pub const MULTI_QUEUE_NUM_QUEUES: &str = "multi-queue-num-queues";
    /// Written by the toolstack.
    pub const BACKEND: &str = "backend";
    pub const BACKEND_ID: &str = "backend-id";
    pub const VIRTUAL_DEVICE: &str = "virtual-device";

    /// `ring-ref<i>` of a multi-page ring.
    pub fn ring_ref_n(i: u32) -> String {
        format!("{RING_REF}{i}")
    }

    /// The directory of queue `i` under a multi-queue device.
    pub fn queue_dir(i: u32) -> String {
        format!("queue-{i}")
    }
}
