//! Property tests: random sequences of operations, permission changes and
//! transactions from dom0 and two guests, run against the store and against
//! a deliberately naive model (a sorted map of path → value and permissions
//! with children found by prefix scan). Replies and final trees must agree.
//!
//! Transactions are checked for serializability: a transaction that commits
//! must give, for every operation, the reply the model gives when its
//! operations are replayed at commit time; one that fails with EAGAIN must
//! have seen some concurrent successful change.

use proptest::prelude::*;
use pvio_xenstore::codec::{PermTarget, Request};
use pvio_xenstore::store::quota::Quotas;
use pvio_xenstore::store::{ConnId, Identity, Store};
use pvio_xenstore::{Perm, Perms, XsError};
use std::collections::BTreeMap;

const READ: u8 = 1;
const WRITE: u8 = 2;
const OWNER: u8 = 8;

#[derive(Clone, Debug)]
enum Op {
    Write(usize, String, Vec<u8>),
    Mkdir(usize, String),
    Rm(usize, String),
    Read(usize, String),
    Dir(usize, String),
    GetPerms(usize, String),
    SetPerms(usize, String, Vec<Perm>),
}

impl Op {
    fn who(&self) -> usize {
        match self {
            Op::Write(w, ..)
            | Op::Mkdir(w, _)
            | Op::Rm(w, _)
            | Op::Read(w, _)
            | Op::Dir(w, _)
            | Op::GetPerms(w, _)
            | Op::SetPerms(w, ..) => *w,
        }
    }

    fn mutates(&self) -> bool {
        matches!(
            self,
            Op::Write(..) | Op::Mkdir(..) | Op::Rm(..) | Op::SetPerms(..)
        )
    }

    fn request(&self) -> Request {
        match self.clone() {
            Op::Write(_, path, value) => Request::Write { path, value },
            Op::Mkdir(_, p) => Request::Mkdir(p),
            Op::Rm(_, p) => Request::Rm(p),
            Op::Read(_, p) => Request::Read(p),
            Op::Dir(_, p) => Request::Directory(p),
            Op::GetPerms(_, p) => Request::GetPerms(p),
            Op::SetPerms(_, p, v) => Request::SetPerms {
                target: PermTarget::Node(p),
                perms: Perms::new(v).unwrap(),
            },
        }
    }
}

/// Who: index 0 is dom0, 1 and 2 are guests with those domids.
fn ident(who: usize) -> Identity {
    if who == 0 {
        Identity::DOM0
    } else {
        Identity::guest(who as u16)
    }
}

fn path_strategy() -> impl Strategy<Value = String> {
    (
        prop_oneof!["", "/local/domain/1", "/local/domain/2"],
        proptest::collection::vec(prop_oneof!["a", "b", "c"], 1..=3),
    )
        .prop_map(|(prefix, comps)| format!("{prefix}/{}", comps.join("/")))
}

fn perm_strategy() -> impl Strategy<Value = Perm> {
    (0u16..3, 0u8..4).prop_map(|(d, a)| {
        let access = [
            pvio_xenstore::Access::None,
            pvio_xenstore::Access::Read,
            pvio_xenstore::Access::Write,
            pvio_xenstore::Access::Both,
        ][a as usize];
        Perm::new(access, d)
    })
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let who = 0usize..3;
    prop_oneof![
        4 => (who.clone(), path_strategy(), proptest::collection::vec(b'a'..=b'z', 0..70))
            .prop_map(|(w, p, v)| Op::Write(w, p, v)),
        1 => (who.clone(), path_strategy()).prop_map(|(w, p)| Op::Mkdir(w, p)),
        2 => (who.clone(), path_strategy()).prop_map(|(w, p)| Op::Rm(w, p)),
        2 => (who.clone(), path_strategy()).prop_map(|(w, p)| Op::Read(w, p)),
        1 => (who.clone(), path_strategy()).prop_map(|(w, p)| Op::Dir(w, p)),
        1 => (who.clone(), path_strategy()).prop_map(|(w, p)| Op::GetPerms(w, p)),
        2 => (who, path_strategy(), proptest::collection::vec(perm_strategy(), 1..5))
            .prop_map(|(w, p, v)| Op::SetPerms(w, p, v)),
    ]
}

#[derive(Clone, Debug, PartialEq)]
struct MNode {
    value: Vec<u8>,
    perms: Vec<Perm>,
}

/// The naive model.
#[derive(Clone, Debug)]
struct Model {
    nodes: BTreeMap<String, MNode>,
    q: Quotas,
}

fn parent(p: &str) -> String {
    match p.rfind('/') {
        Some(0) | None => "/".into(),
        Some(i) => p[..i].into(),
    }
}

fn bits(a: pvio_xenstore::Access) -> u8 {
    match a {
        pvio_xenstore::Access::None => 0,
        pvio_xenstore::Access::Read => READ,
        pvio_xenstore::Access::Write => WRITE,
        pvio_xenstore::Access::Both => READ | WRITE,
    }
}

impl Model {
    fn new(q: Quotas) -> Self {
        let n0 = || MNode {
            value: vec![],
            perms: vec![Perm::new(pvio_xenstore::Access::None, 0)],
        };
        let mut nodes = BTreeMap::new();
        for p in ["/", "/tool", "/tool/xenstored"] {
            nodes.insert(p.to_string(), n0());
        }
        Self { nodes, q }
    }

    fn children(&self, p: &str) -> Vec<String> {
        let prefix = if p == "/" {
            "/".to_string()
        } else {
            format!("{p}/")
        };
        self.nodes
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .filter(|(k, _)| !k[prefix.len()..].contains('/') && k.len() > prefix.len())
            .map(|(k, _)| k[prefix.len()..].to_string())
            .collect()
    }

    fn size(&self, p: &str, n: &MNode, extra_child: Option<&str>) -> usize {
        let childlen: usize = self.children(p).iter().map(|c| c.len() + 1).sum::<usize>()
            + extra_child.map_or(0, |c| c.len() + 1);
        24 + 8 * n.perms.len() + n.value.len() + childlen
    }

    fn rights(who: usize, perms: &[Perm]) -> u8 {
        let dom = who as u16;
        if who == 0 || perms[0].domid == dom {
            return READ | WRITE | OWNER;
        }
        for p in &perms[1..] {
            if p.domid == dom {
                return bits(p.access);
            }
        }
        bits(perms[0].access)
    }

    fn entries(&self, dom: u16) -> usize {
        self.nodes
            .values()
            .filter(|n| n.perms[0].domid == dom)
            .count()
    }

    fn check(&self, who: usize, p: &str, perm: u8) -> Result<(), XsError> {
        let err = match self.nodes.get(p) {
            Some(n) if Self::rights(who, &n.perms) & perm == perm => return Ok(()),
            Some(_) => XsError::Eacces,
            None => XsError::Enoent,
        };
        let mut cur = p.to_string();
        let rights = loop {
            if cur == "/" {
                break 0;
            }
            cur = parent(&cur);
            if let Some(n) = self.nodes.get(&cur) {
                break Self::rights(who, &n.perms);
            }
        };
        Err(if rights & perm != 0 {
            err
        } else {
            XsError::Eacces
        })
    }

    fn too_big(&self, who: usize, size: usize) -> bool {
        who != 0 && size >= self.q.node_size
    }

    fn create(&mut self, who: usize, p: &str, value: Vec<u8>) -> Result<(), XsError> {
        let mut missing = vec![p.to_string()];
        let mut cur = parent(p);
        while !self.nodes.contains_key(&cur) {
            missing.push(cur.clone());
            cur = parent(&cur);
        }
        if who != 0 && self.entries(who as u16) + missing.len() > self.q.nodes_per_domain {
            return Err(XsError::Enospc);
        }
        let top_child = missing
            .last()
            .unwrap()
            .rsplit('/')
            .next()
            .unwrap()
            .to_string();
        let anc = &self.nodes[&cur];
        if self.too_big(who, self.size(&cur, anc, Some(&top_child))) {
            return Err(XsError::Enospc);
        }
        let mut perms = anc.perms.clone();
        if who != 0 {
            perms[0].domid = who as u16;
        }
        let mut new = Vec::new();
        for (i, m) in missing.iter().rev().enumerate() {
            let leaf = i + 1 == missing.len();
            let n = MNode {
                value: if leaf { value.clone() } else { vec![] },
                perms: perms.clone(),
            };
            let child = if leaf {
                0
            } else {
                missing[missing.len() - 2 - i]
                    .rsplit('/')
                    .next()
                    .unwrap()
                    .len()
                    + 1
            };
            if self.too_big(who, 24 + 8 * n.perms.len() + n.value.len() + child) {
                return Err(XsError::Enospc);
            }
            new.push((m.clone(), n));
        }
        self.nodes.extend(new);
        Ok(())
    }

    fn apply(&mut self, op: &Op) -> Result<Vec<u8>, XsError> {
        let who = op.who();
        let ok = || b"OK\0".to_vec();
        match op {
            Op::Read(_, p) => {
                self.check(who, p, READ)?;
                Ok(self.nodes[p].value.clone())
            }
            Op::Dir(_, p) => {
                self.check(who, p, READ)?;
                let mut v = Vec::new();
                for c in self.children(p) {
                    v.extend_from_slice(c.as_bytes());
                    v.push(0);
                }
                Ok(v)
            }
            Op::GetPerms(_, p) => {
                self.check(who, p, READ)?;
                let mut v = Vec::new();
                for x in &self.nodes[p].perms {
                    v.extend_from_slice(x.to_string().as_bytes());
                    v.push(0);
                }
                Ok(v)
            }
            Op::Write(_, p, value) => {
                match self.check(who, p, WRITE) {
                    Ok(()) => {
                        let mut n = self.nodes[p].clone();
                        n.value = value.clone();
                        if self.too_big(who, self.size(p, &n, None)) {
                            return Err(XsError::Enospc);
                        }
                        self.nodes.insert(p.clone(), n);
                    }
                    Err(XsError::Enoent) => self.create(who, p, value.clone())?,
                    Err(e) => return Err(e),
                }
                Ok(ok())
            }
            Op::Mkdir(_, p) => {
                match self.check(who, p, WRITE) {
                    Ok(()) => {}
                    Err(XsError::Enoent) => self.create(who, p, vec![])?,
                    Err(e) => return Err(e),
                }
                Ok(ok())
            }
            Op::Rm(_, p) => {
                match self.check(who, p, WRITE) {
                    Ok(()) => {}
                    Err(XsError::Enoent) => {
                        return if self.nodes.contains_key(&parent(p)) {
                            Ok(ok())
                        } else {
                            Err(XsError::Enoent)
                        }
                    }
                    Err(e) => return Err(e),
                }
                let sub = format!("{p}/");
                self.nodes.retain(|k, _| k != p && !k.starts_with(&sub));
                Ok(ok())
            }
            Op::SetPerms(_, p, perms) => {
                if who != 0 && perms.len() > self.q.perms_per_node {
                    return Err(XsError::Enospc);
                }
                self.check(who, p, WRITE | OWNER)?;
                let mut n = self.nodes[p].clone();
                if who != 0 && perms[0].domid != n.perms[0].domid {
                    return Err(XsError::Eperm);
                }
                n.perms = perms.clone();
                if self.too_big(who, self.size(p, &n, None)) {
                    return Err(XsError::Enospc);
                }
                self.nodes.insert(p.clone(), n);
                Ok(ok())
            }
        }
    }

    fn dump(&self) -> Vec<(String, Vec<u8>, String)> {
        self.nodes
            .iter()
            .map(|(p, n)| {
                let perms: Vec<String> = n.perms.iter().map(|x| x.to_string()).collect();
                (p.clone(), n.value.clone(), perms.join(" "))
            })
            .collect()
    }
}

/// Directory replies are compared as sets (the store keeps creation order).
fn normalise(op: &Op, r: Result<Vec<u8>, XsError>) -> Result<Vec<u8>, XsError> {
    match (op, r) {
        (Op::Dir(..), Ok(v)) => {
            let mut names: Vec<&[u8]> = v.split(|b| *b == 0).filter(|s| !s.is_empty()).collect();
            names.sort();
            Ok(names.join(&0u8))
        }
        (_, r) => r,
    }
}

struct World {
    store: Store,
    model: Model,
    conns: Vec<ConnId>,
}

impl World {
    fn new(q: Quotas) -> Self {
        let mut store = Store::new(q.clone());
        let conns = (0..3).map(|w| store.connect(ident(w))).collect();
        let mut w = Self {
            store,
            model: Model::new(q),
            conns,
        };
        // The toolstack gives each guest its home.
        for d in [1u16, 2] {
            let home = format!("/local/domain/{d}");
            let _ = w.both(&Op::Mkdir(0, home.clone()));
            let _ = w.both(&Op::SetPerms(
                0,
                home,
                vec![Perm::new(pvio_xenstore::Access::None, d)],
            ));
        }
        w
    }

    fn store_op(&mut self, op: &Op, tx: u32) -> Result<Vec<u8>, XsError> {
        let c = self.conns[op.who()];
        let mut out = Vec::new();
        normalise(op, self.store.execute(c, tx, op.request(), &mut out))
    }

    fn both(&mut self, op: &Op) -> Result<Vec<u8>, XsError> {
        let s = self.store_op(op, 0);
        let m = normalise(op, self.model.apply(op));
        assert_eq!(s, m, "{op:?}");
        s
    }

    fn check_trees(&self) {
        assert_eq!(self.store.dump(), self.model.dump());
        self.store.check_consistency().unwrap();
        for d in 0..3u16 {
            assert_eq!(
                self.store.entries(d),
                self.model.entries(d) as i64,
                "domain {d}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Direct operations with tight quotas: every reply and the final tree agree.
    #[test]
    fn store_matches_model(ops in proptest::collection::vec(op_strategy(), 1..80)) {
        let q = Quotas { nodes_per_domain: 8, node_size: 80, perms_per_node: 3, ..Quotas::default() };
        let mut w = World::new(q);
        for op in &ops {
            let _ = w.both(op);
        }
        w.check_trees();
    }

    /// A transaction by one connection interleaved with direct operations by
    /// the others: serializable commits, EAGAIN only after a concurrent change.
    #[test]
    fn transactions_are_serializable(
        txer in 0usize..3,
        steps in proptest::collection::vec((any::<bool>(), op_strategy()), 1..40),
        commit in any::<bool>(),
        prefix in proptest::collection::vec(op_strategy(), 0..20),
    ) {
        let q = Quotas { node_size: 80, perms_per_node: 3, ..Quotas::default() };
        let mut w = World::new(q);
        for op in &prefix {
            let _ = w.both(op);
        }
        let c = w.conns[txer];
        let mut out = Vec::new();
        let r = w.store.execute(c, 0, Request::TransactionStart, &mut out).unwrap();
        let id: u32 = String::from_utf8_lossy(&r[..r.len() - 1]).parse().unwrap();
        let mut in_tx: Vec<(Op, Result<Vec<u8>, XsError>)> = Vec::new();
        let mut concurrent_change = false;
        for (inside, op) in steps {
            if inside {
                let op = match op {
                    Op::Write(_, p, v) => Op::Write(txer, p, v),
                    Op::Mkdir(_, p) => Op::Mkdir(txer, p),
                    Op::Rm(_, p) => Op::Rm(txer, p),
                    Op::Read(_, p) => Op::Read(txer, p),
                    Op::Dir(_, p) => Op::Dir(txer, p),
                    Op::GetPerms(_, p) => Op::GetPerms(txer, p),
                    Op::SetPerms(_, p, v) => Op::SetPerms(txer, p, v),
                };
                let r = w.store_op(&op, id);
                in_tx.push((op, r));
            } else {
                let r = w.both(&op);
                concurrent_change |= op.mutates() && r.is_ok();
            }
        }
        let end = w.store.execute(c, id, Request::TransactionEnd { commit }, &mut out);
        match end {
            Ok(_) if commit => {
                for (op, r) in &in_tx {
                    let m = normalise(op, w.model.apply(op));
                    prop_assert_eq!(&m, r, "replayed {:?}", op);
                }
            }
            Ok(_) => {}
            Err(XsError::Eagain) => prop_assert!(concurrent_change, "spurious EAGAIN"),
            Err(e) => prop_assert!(false, "commit failed with {e}"),
        }
        w.check_trees();
    }
}
