//! A domain as hvd keeps it: memory, grant table, event-channel ports, and
//! which connection (process) currently is the domain.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::OwnedFd;

use pvio_abi::event_channel::EvtchnPort;
use pvio_abi::DomId;

use crate::grant::GrantTableMem;

use super::ConnId;

/// An event-channel port of a domain.
#[derive(Debug)]
pub struct Port {
    /// The connection that opened the port; it closes with that connection.
    pub owner: ConnId,
    /// The eventfd this port's owner waits on; peers raise it.
    pub efd: OwnedFd,
    pub state: PortState,
}

/// `ECS_UNBOUND` or `ECS_INTERDOMAIN`.
#[derive(Debug)]
pub enum PortState {
    /// Waiting for `remote_dom` to bind. `peer_efd` is the eventfd the
    /// binder's port will wait on; the owner already holds it as its notify
    /// fd, so events sent before the bind are pending at bind time.
    Unbound {
        remote_dom: DomId,
        peer_efd: Option<OwnedFd>,
    },
    /// Connected to `remote_port` of `remote_dom`.
    Interdomain {
        remote_dom: DomId,
        remote_port: EvtchnPort,
    },
}

/// A domain.
#[derive(Debug)]
pub struct Domain {
    pub domid: DomId,
    /// Unique for hvd's lifetime, so a stale mapping can never touch a later
    /// domain that reuses the domid.
    pub instance: u64,
    pub name: String,
    /// Memory size in frames (0 for dom0).
    pub frames: u32,
    pub mem_fd: Option<OwnedFd>,
    pub grant_fd: Option<OwnedFd>,
    pub grant_table: Option<GrantTableMem>,
    pub grant_frames: u32,
    /// Token a process must present to claim the domain.
    pub token: u64,
    /// The connection that is this domain (guests only).
    pub owner: Option<ConnId>,
    pub pid: u32,
    pub ports: BTreeMap<EvtchnPort, Port>,
    /// Port numbers below `next_port` that are free again.
    pub freed_ports: BTreeSet<EvtchnPort>,
    /// One past the highest port ever handed out and still in use.
    pub next_port: EvtchnPort,
    /// Grant mappings held by this domain's processes.
    pub maptrack_used: u32,
    /// Grants of this domain currently mapped by others.
    pub grants_mapped: u32,
    /// The xenstore event channel prepared at creation (0 for dom0).
    pub store_port: EvtchnPort,
}

impl Domain {
    /// Takes the lowest free port in `1..max_ports` (Xen hands out the
    /// lowest free port too), in O(log n).
    pub fn take_free_port(&mut self, max_ports: u32) -> Option<EvtchnPort> {
        if let Some(p) = self.freed_ports.pop_first() {
            return Some(p);
        }
        if self.next_port < max_ports {
            self.next_port += 1;
            Some(self.next_port - 1)
        } else {
            None
        }
    }

    /// Returns a port number to the free pool.
    pub fn release_port(&mut self, port: EvtchnPort) {
        if port + 1 == self.next_port {
            self.next_port -= 1;
            while self.next_port > 1 && self.freed_ports.remove(&(self.next_port - 1)) {
                self.next_port -= 1;
            }
        } else {
            self.freed_ports.insert(port);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dom() -> Domain {
        Domain {
            domid: 1,
            instance: 1,
            name: "t".into(),
            frames: 0,
            mem_fd: None,
            grant_fd: None,
            grant_table: None,
            grant_frames: 0,
            token: 0,
            owner: None,
            pid: 0,
            ports: BTreeMap::new(),
            freed_ports: BTreeSet::new(),
            next_port: 1,
            maptrack_used: 0,
            grants_mapped: 0,
            store_port: 0,
        }
    }

    #[test]
    fn lowest_free_port_first() {
        let mut d = dom();
        assert_eq!(d.take_free_port(5), Some(1));
        assert_eq!(d.take_free_port(5), Some(2));
        assert_eq!(d.take_free_port(5), Some(3));
        assert_eq!(d.take_free_port(5), Some(4));
        assert_eq!(d.take_free_port(5), None);
        d.release_port(2);
        d.release_port(1);
        assert_eq!(d.take_free_port(5), Some(1));
        d.release_port(4);
        d.release_port(3);
        assert_eq!(d.next_port, 2);
        assert!(d.freed_ports.is_empty());
        assert_eq!(d.take_free_port(5), Some(2));
    }
}
