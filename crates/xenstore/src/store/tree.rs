//! The node tree: a flat map from absolute path to node, each node holding
//! its value, permissions, ordered child names and generation count, like
//! C xenstored's TDB records (`struct xs_tdb_record_hdr`).

use crate::perms::Perms;
use std::collections::HashMap;

/// Size of C xenstored's record header (generation, num_perms, datalen,
/// childlen, padded): part of the `node-size` quota arithmetic.
const RECORD_HEADER: usize = 24;
/// Size of one `struct xs_permissions`.
const RECORD_PERM: usize = 8;

/// One node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub value: Vec<u8>,
    pub perms: Perms,
    /// Child names in creation order (what XS_DIRECTORY returns).
    pub children: Vec<String>,
    /// Global generation of the last change to this node (value, perms or
    /// child list); 0 is never used, it means "absent" in transactions.
    pub gen: u64,
}

impl Node {
    /// An empty node.
    pub fn new(perms: Perms) -> Self {
        Self {
            value: Vec::new(),
            perms,
            children: Vec::new(),
            gen: 0,
        }
    }

    /// Length of the NUL-separated child list.
    pub fn children_len(&self) -> usize {
        self.children.iter().map(|c| c.len() + 1).sum()
    }

    /// The child list as sent by XS_DIRECTORY: each name followed by a NUL.
    pub fn children_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.children_len());
        for c in &self.children {
            v.extend_from_slice(c.as_bytes());
            v.push(0);
        }
        v
    }

    /// The size C xenstored checks against the `node-size` quota.
    pub fn record_size(&self) -> usize {
        RECORD_HEADER
            + RECORD_PERM * self.perms.entries().len()
            + self.value.len()
            + self.children_len()
    }

    /// Removes a child name; false if it was not there.
    pub fn remove_child(&mut self, name: &str) -> bool {
        match self.children.iter().position(|c| c == name) {
            Some(i) => {
                self.children.remove(i);
                true
            }
            None => false,
        }
    }
}

/// The committed tree.
#[derive(Debug)]
pub struct Tree {
    nodes: HashMap<String, Node>,
}

impl Tree {
    /// The initial tree of C xenstored: `/`, `/tool`, `/tool/xenstored`,
    /// all owned by dom0 with no access for others.
    pub fn new() -> Self {
        let mut nodes = HashMap::new();
        let mut root = Node::new(Perms::owned_by(0));
        root.children.push("tool".into());
        root.gen = 1;
        let mut tool = Node::new(Perms::owned_by(0));
        tool.children.push("xenstored".into());
        tool.gen = 2;
        let mut xsd = Node::new(Perms::owned_by(0));
        xsd.gen = 3;
        nodes.insert("/".to_owned(), root);
        nodes.insert("/tool".to_owned(), tool);
        nodes.insert("/tool/xenstored".to_owned(), xsd);
        Self { nodes }
    }

    /// Generation of the last initial node.
    pub const INITIAL_GENERATION: u64 = 3;

    pub fn get(&self, path: &str) -> Option<&Node> {
        self.nodes.get(path)
    }

    pub fn insert(&mut self, path: String, node: Node) {
        self.nodes.insert(path, node);
    }

    pub fn remove(&mut self, path: &str) -> Option<Node> {
        self.nodes.remove(path)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Every (path, node), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Node)> {
        self.nodes.iter()
    }

    /// Changes nodes in place, without stamping a generation: for
    /// bookkeeping that clients must not see as a change (a released
    /// domain's permission entries).
    pub fn for_each_mut(&mut self, f: impl FnMut(&mut Node)) {
        self.nodes.values_mut().for_each(f);
    }
}

impl Default for Tree {
    fn default() -> Self {
        Self::new()
    }
}
