//! Domain bookkeeping of XS_INTRODUCE / XS_RELEASE / XS_SET_TARGET and the
//! permissions of the special watch names `@introduceDomain` and
//! `@releaseDomain`. Mapping a domain's xenbus ring is not done here: the
//! daemon is told through [`DomainChange`] and plugs in a transport.

use crate::perms::Perms;
use pvio_abi::DomId;
use std::collections::{BTreeMap, HashMap};

/// `@introduceDomain`.
pub const INTRODUCE_DOMAIN: &str = "@introduceDomain";
/// `@releaseDomain`.
pub const RELEASE_DOMAIN: &str = "@releaseDomain";

/// What XS_INTRODUCE recorded about a domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainInfo {
    pub domid: DomId,
    /// Frame of the xenbus ring page (the guest's `store/ring-ref`).
    pub mfn: u64,
    /// The guest's event-channel port for the ring (`store/port`).
    pub port: u32,
    /// Set by a shutdown, cleared by XS_RESUME.
    pub shutdown: bool,
}

/// A change the transport layer must act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DomainChange {
    /// A new domain: its ring should be mapped and served.
    Introduced(DomainInfo),
    /// An introduced domain's event channel changed (XS_INTRODUCE again).
    Reintroduced(DomainInfo),
    /// The domain is gone: its ring connection must be closed.
    Released(DomId),
}

/// The domain table.
#[derive(Debug)]
pub struct Domains {
    introduced: BTreeMap<DomId, DomainInfo>,
    /// Device-model domain → the domain it serves.
    targets: HashMap<DomId, DomId>,
    pub introduce_perms: Perms,
    pub release_perms: Perms,
}

impl Default for Domains {
    fn default() -> Self {
        Self {
            introduced: BTreeMap::new(),
            targets: HashMap::new(),
            introduce_perms: Perms::owned_by(0),
            release_perms: Perms::owned_by(0),
        }
    }
}

impl Domains {
    pub fn get(&self, domid: DomId) -> Option<&DomainInfo> {
        self.introduced.get(&domid)
    }

    pub fn get_mut(&mut self, domid: DomId) -> Option<&mut DomainInfo> {
        self.introduced.get_mut(&domid)
    }

    pub fn is_introduced(&self, domid: DomId) -> bool {
        domid == 0 || self.introduced.contains_key(&domid)
    }

    pub fn insert(&mut self, info: DomainInfo) {
        self.introduced.insert(info.domid, info);
    }

    /// Forgets a domain, its target relations and its special-watch
    /// permission entries.
    pub fn remove(&mut self, domid: DomId) -> Option<DomainInfo> {
        self.targets.remove(&domid);
        self.targets.retain(|_, t| *t != domid);
        self.introduce_perms = self.introduce_perms.without_domain(domid, 0);
        self.release_perms = self.release_perms.without_domain(domid, 0);
        self.introduced.remove(&domid)
    }

    pub fn set_target(&mut self, domid: DomId, target: DomId) {
        self.targets.insert(domid, target);
    }

    pub fn target_of(&self, domid: DomId) -> Option<DomId> {
        self.targets.get(&domid).copied()
    }

    /// Every introduced domain.
    pub fn iter(&self) -> impl Iterator<Item = &DomainInfo> {
        self.introduced.values()
    }

    /// Permissions of a special watch name.
    pub fn special_perms(&self, name: &str) -> Option<&Perms> {
        match name {
            INTRODUCE_DOMAIN => Some(&self.introduce_perms),
            RELEASE_DOMAIN => Some(&self.release_perms),
            _ => None,
        }
    }

    pub fn special_perms_mut(&mut self, name: &str) -> Option<&mut Perms> {
        match name {
            INTRODUCE_DOMAIN => Some(&mut self.introduce_perms),
            RELEASE_DOMAIN => Some(&mut self.release_perms),
            _ => None,
        }
    }
}
