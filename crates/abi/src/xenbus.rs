//! Xenbus device states (`io/xenbus.h`), written as decimal strings to each
//! end's `state` node in the xenstore.

/// `enum xenbus_state`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum XenbusState {
    Unknown = 0,
    Initialising = 1,
    /// The backend is waiting for the frontend's transport details.
    InitWait = 2,
    /// The frontend has published its transport details.
    Initialised = 3,
    Connected = 4,
    /// The device is being closed.
    Closing = 5,
    Closed = 6,
    Reconfiguring = 7,
    Reconfigured = 8,
}

impl XenbusState {
    /// Every state, in numeric order.
    pub const ALL: [XenbusState; 9] = [
        Self::Unknown,
        Self::Initialising,
        Self::InitWait,
        Self::Initialised,
        Self::Connected,
        Self::Closing,
        Self::Closed,
        Self::Reconfiguring,
        Self::Reconfigured,
    ];

    /// Decodes a numeric state.
    pub fn from_u32(v: u32) -> Option<Self> {
        Self::ALL.get(v as usize).copied()
    }

    /// Parses the decimal string stored in a `state` node; surrounding
    /// whitespace and a trailing NUL are tolerated, anything else is `None`.
    pub fn parse(s: &str) -> Option<Self> {
        let t = s.trim_matches(|c: char| c.is_whitespace() || c == '\0');
        t.parse::<u32>().ok().and_then(Self::from_u32)
    }

    /// The decimal string to store in a `state` node.
    pub fn as_node_value(self) -> String {
        (self as u32).to_string()
    }

    /// The state's name as Xen spells it, e.g. `"InitWait"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Unknown => "Unknown",
            Self::Initialising => "Initialising",
            Self::InitWait => "InitWait",
            Self::Initialised => "Initialised",
            Self::Connected => "Connected",
            Self::Closing => "Closing",
            Self::Closed => "Closed",
            Self::Reconfiguring => "Reconfiguring",
            Self::Reconfigured => "Reconfigured",
        }
    }
}

impl core::fmt::Display for XenbusState {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} ({})", self.name(), *self as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_states() {
        assert_eq!(XenbusState::parse("4"), Some(XenbusState::Connected));
        assert_eq!(XenbusState::parse(" 6\0"), Some(XenbusState::Closed));
        assert_eq!(XenbusState::parse("9"), None);
        assert_eq!(XenbusState::parse("x"), None);
        assert_eq!(XenbusState::InitWait.as_node_value(), "2");
    }
}
