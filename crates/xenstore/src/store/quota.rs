//! Quotas with C xenstored 4.17's defaults and `xenstore-control quota`
//! names, and the per-domain node accounting they are checked against.
//! Privileged connections (dom0) are exempt from every quota, as in C
//! xenstored; their nodes are still counted.

use pvio_abi::xs_wire::XENSTORE_REL_PATH_MAX;
use pvio_abi::DomId;
use std::collections::HashMap;

/// The configurable limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quotas {
    /// Nodes a domain may own (`nodes`, ENOSPC).
    pub nodes_per_domain: usize,
    /// Largest node record in bytes, header + perms + value + child list
    /// (`node-size`, ENOSPC).
    pub node_size: usize,
    /// Watches per domain (`watches`, E2BIG).
    pub watches_per_domain: usize,
    /// Open transactions per domain (`transactions`, ENOSPC).
    pub transactions_per_domain: usize,
    /// Requests whose replies are not yet consumed before the daemon stops
    /// reading from the domain (`outstanding`).
    pub outstanding_per_domain: usize,
    /// Nodes one transaction may touch (`transaction-nodes`, ENOSPC).
    pub nodes_per_transaction: usize,
    /// Entries in one permission list (`permissions`, ENOSPC).
    pub perms_per_node: usize,
    /// Longest path below a domain's home, or absolute (`path-max`, EINVAL);
    /// never more than `XENSTORE_REL_PATH_MAX`.
    pub path_max: usize,
}

impl Default for Quotas {
    fn default() -> Self {
        Self {
            nodes_per_domain: 1000,
            node_size: 2048,
            watches_per_domain: 128,
            transactions_per_domain: 10,
            outstanding_per_domain: 20,
            nodes_per_transaction: 1024,
            perms_per_node: 5,
            path_max: XENSTORE_REL_PATH_MAX,
        }
    }
}

impl Quotas {
    /// (name, value, description) in `xenstore-control quota` order.
    pub fn table(&self) -> [(&'static str, usize, &'static str); 8] {
        [
            ("nodes", self.nodes_per_domain, "Nodes per domain"),
            ("watches", self.watches_per_domain, "Watches per domain"),
            (
                "transactions",
                self.transactions_per_domain,
                "Transactions per domain",
            ),
            (
                "outstanding",
                self.outstanding_per_domain,
                "Outstanding requests per domain",
            ),
            (
                "transaction-nodes",
                self.nodes_per_transaction,
                "Max. number of accessed nodes per transaction",
            ),
            ("node-size", self.node_size, "Max. size of a node"),
            ("path-max", self.path_max, "Max. length of a node path"),
            (
                "permissions",
                self.perms_per_node,
                "Max. number of permissions per node",
            ),
        ]
    }

    /// Sets a quota by its control name; false for an unknown name or a
    /// value below 1.
    pub fn set(&mut self, name: &str, value: usize) -> bool {
        if value < 1 {
            return false;
        }
        let slot = match name {
            "nodes" => &mut self.nodes_per_domain,
            "watches" => &mut self.watches_per_domain,
            "transactions" => &mut self.transactions_per_domain,
            "outstanding" => &mut self.outstanding_per_domain,
            "transaction-nodes" => &mut self.nodes_per_transaction,
            "node-size" => &mut self.node_size,
            "path-max" => {
                self.path_max = value.min(XENSTORE_REL_PATH_MAX);
                return true;
            }
            "permissions" => &mut self.perms_per_node,
            _ => return false,
        };
        *slot = value;
        true
    }
}

/// Nodes owned per domain.
#[derive(Debug, Default, Clone)]
pub struct Accounting {
    entries: HashMap<DomId, i64>,
}

impl Accounting {
    /// Nodes `domid` owns.
    pub fn entries(&self, domid: DomId) -> i64 {
        self.entries.get(&domid).copied().unwrap_or(0)
    }

    /// Adds `delta` to `domid`'s count.
    pub fn add(&mut self, domid: DomId, delta: i64) {
        let e = self.entries.entry(domid).or_insert(0);
        *e += delta;
        if *e == 0 {
            self.entries.remove(&domid);
        }
    }

    /// Every nonzero count.
    pub fn iter(&self) -> impl Iterator<Item = (DomId, i64)> + '_ {
        self.entries.iter().map(|(d, n)| (*d, *n))
    }
}
