//! Event channels (`event_channel.h`): port numbers, operation codes and the
//! per-domain port limits of the 2-level and FIFO ABIs.

/// `evtchn_port_t`.
pub type EvtchnPort = u32;

/// `EVTCHNOP_*` operation numbers.
pub mod op {
    pub const BIND_INTERDOMAIN: u32 = 0;
    pub const BIND_VIRQ: u32 = 1;
    pub const BIND_PIRQ: u32 = 2;
    pub const CLOSE: u32 = 3;
    pub const SEND: u32 = 4;
    pub const STATUS: u32 = 5;
    pub const ALLOC_UNBOUND: u32 = 6;
    pub const BIND_IPI: u32 = 7;
    pub const BIND_VCPU: u32 = 8;
    pub const UNMASK: u32 = 9;
    pub const RESET: u32 = 10;
    pub const INIT_CONTROL: u32 = 11;
    pub const EXPAND_ARRAY: u32 = 12;
    pub const SET_PRIORITY: u32 = 13;
}

/// Bits in `xen_ulong_t` on a 64-bit guest.
pub const BITS_PER_XEN_ULONG_64: u32 = 64;

/// `EVTCHN_2L_NR_CHANNELS` for a 64-bit domain: `sizeof(xen_ulong_t)^2 * 64`.
pub const EVTCHN_2L_NR_CHANNELS_64: u32 = 8 * 8 * 64;
/// `EVTCHN_2L_NR_CHANNELS` for a 32-bit domain.
pub const EVTCHN_2L_NR_CHANNELS_32: u32 = 4 * 4 * 64;

/// `EVTCHN_FIFO_LINK_BITS`.
pub const EVTCHN_FIFO_LINK_BITS: u32 = 17;
/// `EVTCHN_FIFO_NR_CHANNELS`.
pub const EVTCHN_FIFO_NR_CHANNELS: u32 = 1 << EVTCHN_FIFO_LINK_BITS;

/// `EVTCHNSTAT_*`: the state of a port as `EVTCHNOP_status` reports it.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EvtchnStat {
    Closed = 0,
    Unbound = 1,
    Interdomain = 2,
    Pirq = 3,
    Virq = 4,
    Ipi = 5,
}

impl EvtchnStat {
    /// Decodes a status value.
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::Closed,
            1 => Self::Unbound,
            2 => Self::Interdomain,
            3 => Self::Pirq,
            4 => Self::Virq,
            5 => Self::Ipi,
            _ => return None,
        })
    }

    /// The word `lsevtchn` prints for this state.
    pub fn name(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Unbound => "unbound",
            Self::Interdomain => "interdomain",
            Self::Pirq => "pirq",
            Self::Virq => "virq",
            Self::Ipi => "ipi",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits() {
        assert_eq!(EVTCHN_2L_NR_CHANNELS_64, 4096);
        assert_eq!(EVTCHN_2L_NR_CHANNELS_32, 1024);
        assert_eq!(EVTCHN_FIFO_NR_CHANNELS, 131072);
        assert_eq!(EvtchnStat::from_u32(2), Some(EvtchnStat::Interdomain));
        assert_eq!(EvtchnStat::from_u32(9), None);
    }
}
