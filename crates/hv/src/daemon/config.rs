//! hvd's limits and settings, with Xen's defaults.

use std::path::PathBuf;

use pvio_abi::event_channel::{EVTCHN_2L_NR_CHANNELS_64, EVTCHN_FIFO_NR_CHANNELS};
use pvio_abi::grant_table::{
    DEFAULT_MAX_GRANT_FRAMES, DEFAULT_MAX_MAPTRACK_FRAMES, MAPTRACK_ENTRY_SIZE,
};
use pvio_abi::XEN_PAGE_SIZE;

/// Which event-channel ABI's port limit applies to every domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvtchnAbi {
    /// The 2-level ABI of a 64-bit domain: 4096 ports.
    TwoLevel,
    /// The FIFO ABI: 131072 ports.
    Fifo,
}

impl EvtchnAbi {
    /// Ports per domain under this ABI (port 0 is never used).
    pub fn nr_ports(self) -> u32 {
        match self {
            EvtchnAbi::TwoLevel => EVTCHN_2L_NR_CHANNELS_64,
            EvtchnAbi::Fifo => EVTCHN_FIFO_NR_CHANNELS,
        }
    }

    /// The name used on the command line and in `Info`.
    pub fn name(self) -> &'static str {
        match self {
            EvtchnAbi::TwoLevel => "2l",
            EvtchnAbi::Fifo => "fifo",
        }
    }
}

impl std::str::FromStr for EvtchnAbi {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "2l" | "2-level" => Ok(EvtchnAbi::TwoLevel),
            "fifo" => Ok(EvtchnAbi::Fifo),
            _ => Err(format!(
                "unknown event-channel ABI {s:?} (expected 2l or fifo)"
            )),
        }
    }
}

/// Settings of one hvd.
#[derive(Debug, Clone)]
pub struct Config {
    /// The Unix socket to listen on.
    pub socket: PathBuf,
    /// Grant-table frames per domain (Xen's `gnttab_max_frames`, default 64).
    pub max_grant_frames: u32,
    /// Simultaneous grant mappings per mapping domain (Xen's maptrack:
    /// 1024 frames of 256 entries by default).
    pub max_maptrack_entries: u32,
    /// Event-channel ABI, which sets the per-domain port limit.
    pub evtchn_abi: EvtchnAbi,
    /// Largest guest memory, in 4 KiB frames.
    pub max_domain_frames: u32,
}

impl Config {
    /// Xen's defaults, listening on `socket`.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            max_grant_frames: DEFAULT_MAX_GRANT_FRAMES,
            max_maptrack_entries: DEFAULT_MAX_MAPTRACK_FRAMES
                * (XEN_PAGE_SIZE / MAPTRACK_ENTRY_SIZE) as u32,
            evtchn_abi: EvtchnAbi::TwoLevel,
            max_domain_frames: 16 << 18, // 16 GiB
        }
    }

    /// Ports per domain.
    pub fn max_ports(&self) -> u32 {
        self.evtchn_abi.nr_ports()
    }
}
