//! Transactions (C xenstored's `transaction.c` model): optimistic, no
//! global lock. A transaction keeps its own copies of the nodes it changed
//! (`overlay`), and, as C xenstored's `access_node()` does since Xen 4.9,
//! a copy of every other node it touched as it was when first touched
//! (`seen`): inside the transaction, reads, directory listings and
//! permission checks of a node it has touched see that copy (or its
//! absence), whatever others commit meanwhile — repeatable reads. It also
//! keeps the generation of every node touched (`accessed`, 0 for
//! "absent"). Commit fails with EAGAIN if any touched node's generation
//! changed since; otherwise the overlay is applied and the queued watch
//! events fire.
//!
//! [`View`] is the one way node operations see the tree: directly, or
//! through a transaction.

use super::quota::Accounting;
use super::tree::{Node, Tree};
use crate::error::XsError;
use crate::perms::Perms;
use pvio_abi::DomId;
use std::collections::HashMap;

/// A watch event waiting to fire: a change at `path` (`exact` for nodes
/// deleted below the removed one), with the permissions the node had
/// before the change (a watcher that could read it then hears of it).
#[derive(Clone, Debug)]
pub struct QueuedEvent {
    pub path: String,
    pub exact: bool,
    pub old_perms: Option<Perms>,
}

/// One open transaction.
#[derive(Debug)]
pub struct Txn {
    pub id: u32,
    /// Nodes changed by the transaction; `None` = deleted.
    pub overlay: HashMap<String, Option<Node>>,
    /// Generation of every node touched, when first touched (0 = absent).
    pub accessed: HashMap<String, u64>,
    /// Each touched node as it was when first touched (`None` = absent):
    /// what the transaction sees of it unless it changed it itself.
    seen: HashMap<String, Option<Node>>,
    /// Events to fire at commit, one per path.
    pub events: Vec<QueuedEvent>,
    event_index: HashMap<String, usize>,
    /// Change of each domain's node count at commit.
    pub entry_delta: HashMap<DomId, i64>,
    /// A node was created (the node quota is checked at commit).
    pub created: bool,
    /// An operation inside failed half-way: commit must fail with this.
    pub failed: Option<XsError>,
}

impl Txn {
    pub fn new(id: u32) -> Self {
        Self {
            id,
            overlay: HashMap::new(),
            accessed: HashMap::new(),
            seen: HashMap::new(),
            events: Vec::new(),
            event_index: HashMap::new(),
            entry_delta: HashMap::new(),
            created: false,
            failed: None,
        }
    }

    /// Queues an event; a path already queued keeps one event, which is
    /// non-exact if any of the changes was.
    fn queue(&mut self, ev: QueuedEvent) {
        match self.event_index.get(&ev.path) {
            Some(&i) => {
                let e = &mut self.events[i];
                e.exact &= ev.exact;
                if e.old_perms.is_none() {
                    e.old_perms = ev.old_perms;
                }
            }
            None => {
                self.event_index.insert(ev.path.clone(), self.events.len());
                self.events.push(ev);
            }
        }
    }

    /// Removes a released domain's entries from the copies of nodes the
    /// transaction read, as the committed tree's are
    /// (`Store::revoke_rights`).
    pub fn revoke_rights(&mut self, domid: DomId) {
        for node in self.seen.values_mut().flatten() {
            if node.perms.entries().iter().any(|e| e.domid == domid) {
                node.perms = node.perms.without_domain(domid, 0);
            }
        }
    }

    /// The first touched node whose generation changed since, if any.
    pub fn conflict(&self, tree: &Tree) -> Option<&str> {
        self.accessed
            .iter()
            .find(|(p, g)| tree.get(p).map_or(0, |n| n.gen) != **g)
            .map(|(p, _)| p.as_str())
    }
}

/// The tree as one operation sees it.
pub struct View<'a> {
    pub tree: &'a mut Tree,
    pub gen: &'a mut u64,
    pub acct: &'a mut Accounting,
    pub tx: Option<&'a mut Txn>,
    /// `transaction-nodes` quota, for unprivileged callers.
    pub tx_node_limit: Option<usize>,
    /// Events of a direct (non-transaction) operation, fired after it.
    pub events: Vec<QueuedEvent>,
}

impl<'a> View<'a> {
    /// A view straight onto the committed tree.
    pub fn direct(tree: &'a mut Tree, gen: &'a mut u64, acct: &'a mut Accounting) -> Self {
        Self {
            tree,
            gen,
            acct,
            tx: None,
            tx_node_limit: None,
            events: Vec::new(),
        }
    }

    /// Whether the operation runs inside a transaction.
    pub fn in_tx(&self) -> bool {
        self.tx.is_some()
    }

    /// Records the first access to `path` in a transaction: its generation
    /// for the commit-time check, and a copy of it for later reads.
    fn touch(&mut self, path: &str) -> Result<(), XsError> {
        let limit = self.tx_node_limit;
        if let Some(tx) = self.tx.as_deref_mut() {
            if !tx.accessed.contains_key(path) {
                if limit.is_some_and(|l| tx.accessed.len() >= l) {
                    tx.failed = Some(XsError::Enospc);
                    return Err(XsError::Enospc);
                }
                let current = self.tree.get(path);
                tx.accessed
                    .insert(path.to_owned(), current.map_or(0, |n| n.gen));
                tx.seen.insert(path.to_owned(), current.cloned());
            }
        }
        Ok(())
    }

    /// Reads a node, recording the access in a transaction. Inside one,
    /// a node the transaction changed reads as it left it, and any other
    /// node it touched reads as it was when first touched.
    pub fn get(&mut self, path: &str) -> Result<Option<&Node>, XsError> {
        if self.tx.is_none() {
            return Ok(self.tree.get(path));
        }
        self.touch(path)?;
        let tx = self.tx.as_deref().expect("in a transaction");
        Ok(match tx.overlay.get(path) {
            Some(changed) => changed.as_ref(),
            None => tx.seen.get(path).and_then(Option::as_ref),
        })
    }

    /// Stores a node (stamping a fresh generation).
    pub fn put(&mut self, path: &str, mut node: Node) -> Result<(), XsError> {
        *self.gen += 1;
        node.gen = *self.gen;
        if self.tx.is_some() {
            self.touch(path)?;
        }
        match self.tx.as_deref_mut() {
            Some(tx) => {
                tx.overlay.insert(path.to_owned(), Some(node));
            }
            None => self.tree.insert(path.to_owned(), node),
        }
        Ok(())
    }

    /// Deletes a node.
    pub fn del(&mut self, path: &str) -> Result<(), XsError> {
        if self.tx.is_some() {
            self.touch(path)?;
        }
        match self.tx.as_deref_mut() {
            Some(tx) => {
                tx.overlay.insert(path.to_owned(), None);
            }
            None => {
                self.tree.remove(path);
            }
        }
        Ok(())
    }

    /// Nodes `domid` owns as this view sees it.
    pub fn entries(&self, domid: DomId) -> i64 {
        let base = self.acct.entries(domid);
        match self.tx.as_deref() {
            Some(tx) => base + tx.entry_delta.get(&domid).copied().unwrap_or(0),
            None => base,
        }
    }

    /// Changes `domid`'s node count (at commit, inside a transaction).
    pub fn entries_add(&mut self, domid: DomId, delta: i64) {
        match self.tx.as_deref_mut() {
            Some(tx) => {
                *tx.entry_delta.entry(domid).or_insert(0) += delta;
                if delta > 0 {
                    tx.created = true;
                }
            }
            None => self.acct.add(domid, delta),
        }
    }

    /// Records a watch event: queued in a transaction, fired after a
    /// direct operation.
    pub fn event(&mut self, path: &str, exact: bool, old_perms: Option<Perms>) {
        let ev = QueuedEvent {
            path: path.to_owned(),
            exact,
            old_perms,
        };
        match self.tx.as_deref_mut() {
            Some(tx) => tx.queue(ev),
            None => self.events.push(ev),
        }
    }
}
