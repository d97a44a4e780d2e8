//! The store: node tree, permissions, transactions, watches, quotas and
//! domain bookkeeping, behind one entry point per request.
//!
//! The store knows connections only by [`ConnId`] and [`Identity`] (domid,
//! privileged or not); it never does I/O. [`Store::process`] takes a framed
//! request and appends the encoded reply and every watch event it caused,
//! each addressed to a connection, to an output list that the daemon
//! routes. Domain lifecycle changes for the transport layer are collected
//! in [`Store::take_domain_changes`].

pub mod control;
pub mod domain;
pub mod ops;
pub mod quota;
pub mod tree;
pub mod txn;
pub mod watch;

use crate::codec::{
    self, encode_error, encode_message, encode_watch_event, ignores_tx_id, is_privileged_type,
    Header, MsgType, ParseCtx, PermTarget, Request, WatchPath,
};
use crate::error::XsError;
use crate::path;
use crate::perms::{Who, PERM_OWNER, PERM_READ, PERM_WRITE};
use domain::{DomainChange, DomainInfo, Domains, INTRODUCE_DOMAIN, RELEASE_DOMAIN};
use pvio_abi::xs_wire::XENSTORE_PAYLOAD_MAX;
use pvio_abi::{DomId, DOMID_SELF};
use quota::{Accounting, Quotas};
use std::collections::HashMap;
use tree::Tree;
use txn::{QueuedEvent, Txn, View};
use watch::Watches;

/// A connection as the store knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// Who is on the other end of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    pub domid: DomId,
    /// Dom0 tools: every right, no quotas.
    pub privileged: bool,
}

impl Identity {
    /// A dom0 tool on the Unix socket.
    pub const DOM0: Identity = Identity {
        domid: 0,
        privileged: true,
    };

    /// A guest on its xenbus ring.
    pub fn guest(domid: DomId) -> Self {
        Self {
            domid,
            privileged: false,
        }
    }
}

/// An encoded message for one connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    pub conn: ConnId,
    pub msg: Vec<u8>,
    /// A watch event (asynchronous, counted against the event queue bound)
    /// rather than a reply.
    pub is_event: bool,
}

#[derive(Debug)]
struct ConnState {
    identity: Identity,
    txns: HashMap<u32, Txn>,
    next_tx: u32,
}

/// Counters exported by XS_CONTROL and the daemon's logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub requests: u64,
    pub errors: u64,
    pub events: u64,
    pub commits: u64,
    pub conflicts: u64,
}

/// The xenstore.
#[derive(Debug)]
pub struct Store {
    tree: Tree,
    gen: u64,
    acct: Accounting,
    quotas: Quotas,
    watches: Watches,
    domains: Domains,
    conns: HashMap<ConnId, ConnState>,
    next_conn: u64,
    changes: Vec<DomainChange>,
    log_requests: bool,
    stats: Stats,
}

impl Store {
    /// A store holding C xenstored's initial nodes.
    pub fn new(quotas: Quotas) -> Self {
        let mut acct = Accounting::default();
        acct.add(0, 3);
        Self {
            tree: Tree::new(),
            gen: Tree::INITIAL_GENERATION,
            acct,
            quotas,
            watches: Watches::default(),
            domains: Domains::default(),
            conns: HashMap::new(),
            next_conn: 1,
            changes: Vec::new(),
            log_requests: false,
            stats: Stats::default(),
        }
    }

    /// The quotas in force (XS_CONTROL can change them).
    pub fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.tree.len()
    }

    /// Nodes owned by `domid`.
    pub fn entries(&self, domid: DomId) -> i64 {
        self.acct.entries(domid)
    }

    /// The introduced domains.
    pub fn domains(&self) -> impl Iterator<Item = &DomainInfo> {
        self.domains.iter()
    }

    /// Registers a connection.
    pub fn connect(&mut self, identity: Identity) -> ConnId {
        let id = ConnId(self.next_conn);
        self.next_conn += 1;
        self.conns.insert(
            id,
            ConnState {
                identity,
                txns: HashMap::new(),
                next_tx: 1,
            },
        );
        id
    }

    /// Forgets a connection, its watches and its open transactions.
    pub fn disconnect(&mut self, conn: ConnId) {
        self.watches.remove_conn(conn);
        self.conns.remove(&conn);
    }

    /// The identity of a connection.
    pub fn identity(&self, conn: ConnId) -> Option<Identity> {
        self.conns.get(&conn).map(|c| c.identity)
    }

    /// Domain changes since the last call, for the transport layer.
    pub fn take_domain_changes(&mut self) -> Vec<DomainChange> {
        std::mem::take(&mut self.changes)
    }

    /// Whether XS_INTRODUCE recorded `domid` (dom0 is not listed).
    pub fn is_introduced(&self, domid: DomId) -> bool {
        self.domains.get(domid).is_some()
    }

    /// Answers a request with an error decided outside the store (the
    /// daemon's XS_INTRODUCE when the ring cannot be mapped).
    pub fn error_reply(&mut self, conn: ConnId, hdr: &Header, e: XsError, out: &mut Vec<Outgoing>) {
        self.stats.requests += 1;
        self.stats.errors += 1;
        let mut msg = Vec::new();
        encode_error(&mut msg, hdr.req_id, hdr.tx_id, e);
        out.push(Outgoing {
            conn,
            msg,
            is_event: false,
        });
    }

    /// The transport layer found an introduced domain dead (Xen's
    /// VIRQ_DOM_EXC): released as by XS_RELEASE. False if it was not
    /// introduced.
    pub fn domain_gone(&mut self, domid: DomId, out: &mut Vec<Outgoing>) -> bool {
        self.is_introduced(domid) && self.release(domid, out).is_ok()
    }

    /// The ring reconnection protocol: drops the connection's watches and
    /// transactions (as XS_RESET_WATCHES does).
    pub fn reset_connection(&mut self, conn: ConnId) {
        self.watches.remove_conn(conn);
        if let Some(c) = self.conns.get_mut(&conn) {
            c.txns.clear();
        }
    }

    fn who(&self, identity: Identity) -> Who {
        Who {
            domid: identity.domid,
            privileged: identity.privileged,
            target: self.domains.target_of(identity.domid),
        }
    }

    /// Type-level checks in C xenstored's order: privileged-only types, then
    /// the transaction id.
    fn precheck(&self, conn: ConnId, t: MsgType, tx_id: u32) -> Result<Identity, XsError> {
        let c = self.conns.get(&conn).ok_or(XsError::Einval)?;
        if is_privileged_type(t) && !c.identity.privileged {
            return Err(XsError::Eacces);
        }
        if !ignores_tx_id(t) && tx_id != 0 && !c.txns.contains_key(&tx_id) {
            return Err(XsError::Enoent);
        }
        Ok(c.identity)
    }

    /// Handles one framed request from `conn`: appends the reply (or error)
    /// and every watch event the request caused, in the order the wire
    /// must carry them, to `out`.
    pub fn process(&mut self, conn: ConnId, hdr: &Header, payload: &[u8], out: &mut Vec<Outgoing>) {
        self.stats.requests += 1;
        let mut after = Vec::new();
        let result = self.process_inner(conn, hdr, payload, out, &mut after);
        if self.log_requests {
            tracing::info!(
                conn = conn.0,
                ty = hdr.ty,
                req_id = hdr.req_id,
                tx_id = hdr.tx_id,
                ok = result.is_ok(),
                "request"
            );
        }
        let mut msg = Vec::new();
        match result {
            Ok(p) if p.len() <= XENSTORE_PAYLOAD_MAX => {
                encode_message(&mut msg, hdr.ty, hdr.req_id, hdr.tx_id, &p)
            }
            Ok(_) => encode_error(&mut msg, hdr.req_id, hdr.tx_id, XsError::E2big),
            Err(e) => {
                self.stats.errors += 1;
                encode_error(&mut msg, hdr.req_id, hdr.tx_id, e)
            }
        }
        out.push(Outgoing {
            conn,
            msg,
            is_event: false,
        });
        out.append(&mut after);
    }

    fn process_inner(
        &mut self,
        conn: ConnId,
        hdr: &Header,
        payload: &[u8],
        out: &mut Vec<Outgoing>,
        after: &mut Vec<Outgoing>,
    ) -> Result<Vec<u8>, XsError> {
        let t = codec::request_type(hdr.ty)?;
        let identity = self.precheck(conn, t, hdr.tx_id)?;
        let ctx = ParseCtx {
            domid: identity.domid,
            path_max: self.quotas.path_max,
        };
        let req = codec::parse_payload(t, payload, &ctx)?;
        self.run(conn, identity, hdr.tx_id, req, out, after)
    }

    /// Executes a parsed request (the typed entry point for tests and
    /// in-process users). Watch events, including the one a new watch fires
    /// at once, are appended to `out`; the reply payload is returned.
    pub fn execute(
        &mut self,
        conn: ConnId,
        tx_id: u32,
        req: Request,
        out: &mut Vec<Outgoing>,
    ) -> Result<Vec<u8>, XsError> {
        let identity = self.precheck(conn, req.msg_type(), tx_id)?;
        let mut after = Vec::new();
        let r = self.run(conn, identity, tx_id, req, out, &mut after);
        out.append(&mut after);
        r
    }

    fn run(
        &mut self,
        conn: ConnId,
        identity: Identity,
        tx_id: u32,
        req: Request,
        out: &mut Vec<Outgoing>,
        after: &mut Vec<Outgoing>,
    ) -> Result<Vec<u8>, XsError> {
        let who = self.who(identity);
        let tx_id = if ignores_tx_id(req.msg_type()) {
            0
        } else {
            tx_id
        };
        match req {
            Request::Read(_)
            | Request::Directory(_)
            | Request::DirectoryPart { .. }
            | Request::GetPerms(_)
            | Request::Write { .. }
            | Request::Mkdir(_)
            | Request::Rm(_)
            | Request::SetPerms {
                target: PermTarget::Node(_),
                ..
            } => self.node_op(conn, &who, tx_id, req, out),
            Request::SetPerms {
                target: PermTarget::Special(name),
                perms,
            } => {
                if !who.privileged && perms.entries().len() > self.quotas.perms_per_node {
                    return Err(XsError::Enospc);
                }
                let cur = self
                    .domains
                    .special_perms_mut(&name)
                    .ok_or(XsError::Einval)?;
                let need = PERM_WRITE | PERM_OWNER;
                if cur.rights_for(&who) & need != need {
                    return Err(XsError::Eacces);
                }
                *cur = perms;
                Ok(ops::ok())
            }
            Request::Watch { path, token } => self.watch(conn, identity, path, token, after),
            Request::Unwatch { path, token } => {
                if self.watches.remove(conn, &path, &token) {
                    Ok(ops::ok())
                } else {
                    Err(XsError::Enoent)
                }
            }
            Request::TransactionStart => {
                if tx_id != 0 {
                    return Err(XsError::Ebusy);
                }
                let limit = self.quotas.transactions_per_domain;
                let c = self.conns.get_mut(&conn).ok_or(XsError::Einval)?;
                if !identity.privileged && c.txns.len() >= limit {
                    return Err(XsError::Enospc);
                }
                let mut id = c.next_tx;
                while id == 0 || c.txns.contains_key(&id) {
                    id = id.wrapping_add(1);
                }
                c.next_tx = id.wrapping_add(1);
                c.txns.insert(id, Txn::new(id));
                let mut reply = id.to_string().into_bytes();
                reply.push(0);
                Ok(reply)
            }
            Request::TransactionEnd { commit } => {
                if tx_id == 0 {
                    return Err(XsError::Enoent);
                }
                let txn = self
                    .conns
                    .get_mut(&conn)
                    .and_then(|c| c.txns.remove(&tx_id))
                    .ok_or(XsError::Enoent)?;
                if commit {
                    self.commit(&who, txn, out)?;
                }
                Ok(ops::ok())
            }
            Request::Introduce { domid, mfn, port } => {
                if domid == 0 || domid >= DOMID_SELF {
                    return Err(XsError::Einval);
                }
                match self.domains.get_mut(domid) {
                    Some(d) => {
                        d.port = port;
                        d.mfn = mfn;
                        let info = d.clone();
                        self.changes.push(DomainChange::Reintroduced(info));
                    }
                    None => {
                        let info = DomainInfo {
                            domid,
                            mfn,
                            port,
                            shutdown: false,
                        };
                        self.domains.insert(info.clone());
                        self.changes.push(DomainChange::Introduced(info));
                        self.fire_special(INTRODUCE_DOMAIN, out);
                    }
                }
                Ok(ops::ok())
            }
            Request::Release(domid) => {
                self.release(domid, out)?;
                Ok(ops::ok())
            }
            Request::Resume(domid) => {
                let d = self.domains.get_mut(domid).ok_or(XsError::Enoent)?;
                d.shutdown = false;
                Ok(ops::ok())
            }
            Request::SetTarget { domid, target } => {
                if self.domains.get(domid).is_none() || self.domains.get(target).is_none() {
                    return Err(XsError::Enoent);
                }
                self.domains.set_target(domid, target);
                Ok(ops::ok())
            }
            Request::GetDomainPath(domid) => {
                let mut v = path::domain_path(domid).into_bytes();
                v.push(0);
                Ok(v)
            }
            Request::IsDomainIntroduced(domid) => {
                let yes = domid == DOMID_SELF || self.domains.is_introduced(domid);
                Ok(if yes {
                    b"T\0".to_vec()
                } else {
                    b"F\0".to_vec()
                })
            }
            Request::ResetWatches => {
                self.watches.remove_conn(conn);
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.txns.clear();
                }
                Ok(ops::ok())
            }
            Request::Control { cmd, args } => self.control(&cmd, &args),
        }
    }

    /// Runs a node operation directly or inside transaction `tx_id`, then
    /// fires the events of a direct operation.
    fn node_op(
        &mut self,
        conn: ConnId,
        who: &Who,
        tx_id: u32,
        req: Request,
        out: &mut Vec<Outgoing>,
    ) -> Result<Vec<u8>, XsError> {
        let mut txn = match tx_id {
            0 => None,
            id => Some(
                self.conns
                    .get_mut(&conn)
                    .and_then(|c| c.txns.remove(&id))
                    .ok_or(XsError::Enoent)?,
            ),
        };
        let q = &self.quotas;
        let mut view = View {
            tree: &mut self.tree,
            gen: &mut self.gen,
            acct: &mut self.acct,
            tx: txn.as_mut(),
            tx_node_limit: (!who.privileged).then_some(q.nodes_per_transaction),
            events: Vec::new(),
        };
        let result = match req {
            Request::Read(p) => ops::read(&mut view, who, &p),
            Request::Directory(p) => ops::directory(&mut view, who, &p),
            Request::DirectoryPart { path, offset } => {
                ops::directory_part(&mut view, who, &path, offset)
            }
            Request::GetPerms(p) => ops::get_perms(&mut view, who, &p),
            Request::Write { path, value } => ops::write(&mut view, who, q, &path, value),
            Request::Mkdir(p) => ops::mkdir(&mut view, who, q, &p),
            Request::Rm(p) => ops::rm(&mut view, who, &p),
            Request::SetPerms {
                target: PermTarget::Node(p),
                perms,
            } => {
                if !who.privileged && perms.entries().len() > q.perms_per_node {
                    Err(XsError::Enospc)
                } else {
                    ops::set_perms(&mut view, who, q, &p, perms)
                }
            }
            _ => Err(XsError::Einval),
        };
        let events = std::mem::take(&mut view.events);
        drop(view);
        if let Some(t) = txn {
            if let Some(c) = self.conns.get_mut(&conn) {
                c.txns.insert(t.id, t);
            }
        }
        for ev in &events {
            self.fire(ev, out);
        }
        result
    }

    fn commit(&mut self, who: &Who, txn: Txn, out: &mut Vec<Outgoing>) -> Result<(), XsError> {
        if let Some(e) = txn.failed {
            return Err(e);
        }
        if let Some(p) = txn.conflict(&self.tree) {
            tracing::debug!(path = p, tx = txn.id, "transaction conflict");
            self.stats.conflicts += 1;
            return Err(XsError::Eagain);
        }
        if !who.privileged && txn.created {
            let limit = self.quotas.nodes_per_domain as i64;
            for (d, delta) in &txn.entry_delta {
                if *d != 0 && *delta > 0 && self.acct.entries(*d) + delta > limit {
                    return Err(XsError::Enospc);
                }
            }
        }
        for (p, n) in txn.overlay {
            match n {
                Some(mut n) => {
                    self.gen += 1;
                    n.gen = self.gen;
                    self.tree.insert(p, n);
                }
                None => {
                    self.tree.remove(&p);
                }
            }
        }
        for (d, delta) in txn.entry_delta {
            self.acct.add(d, delta);
        }
        self.stats.commits += 1;
        for ev in &txn.events {
            self.fire(ev, out);
        }
        Ok(())
    }

    fn watch(
        &mut self,
        conn: ConnId,
        identity: Identity,
        wpath: WatchPath,
        token: Vec<u8>,
        after: &mut Vec<Outgoing>,
    ) -> Result<Vec<u8>, XsError> {
        let (abs, relative) = match wpath {
            WatchPath::Node { path, relative } => (path, relative),
            WatchPath::Special(name) => (name, false),
        };
        if self.watches.contains(conn, &abs, &token) {
            return Err(XsError::Eexist);
        }
        if !identity.privileged && self.watches.count(conn) >= self.quotas.watches_per_domain {
            return Err(XsError::E2big);
        }
        // The watch fires once at once, after the reply.
        let shown = if relative {
            path::relative_to(&abs, &path::domain_path(identity.domid)).to_owned()
        } else {
            abs.clone()
        };
        let mut msg = Vec::new();
        if encode_watch_event(&mut msg, &shown, &token) {
            self.stats.events += 1;
            after.push(Outgoing {
                conn,
                msg,
                is_event: true,
            });
        }
        self.watches.add(conn, abs, token, relative);
        Ok(ops::ok())
    }

    /// Sends the events of one change to every matching watch whose
    /// connection may know about it (`fire_watches()` + `watch_permitted()`).
    fn fire(&mut self, ev: &QueuedEvent, out: &mut Vec<Outgoing>) {
        let mut sent = 0;
        {
            let mut deliver = |w: &watch::WatchEntry| {
                let Some(c) = self.conns.get(&w.conn) else {
                    return;
                };
                if !c.identity.privileged && !self.permitted(c.identity, ev) {
                    return;
                }
                let shown = if w.relative {
                    path::relative_to(&ev.path, &path::domain_path(c.identity.domid))
                } else {
                    &ev.path
                };
                let mut msg = Vec::new();
                if encode_watch_event(&mut msg, shown, &w.token) {
                    sent += 1;
                    out.push(Outgoing {
                        conn: w.conn,
                        msg,
                        is_event: true,
                    });
                }
            };
            if ev.exact || ev.path.starts_with('@') {
                self.watches.on(&ev.path).iter().for_each(&mut deliver);
            } else {
                for anc in path::ancestors_inclusive(&ev.path) {
                    self.watches.on(anc).iter().for_each(&mut deliver);
                }
            }
        }
        self.stats.events += sent;
    }

    /// Whether an unprivileged watcher may hear of a change: it could read
    /// the node before or after the change, or its parent.
    fn permitted(&self, identity: Identity, ev: &QueuedEvent) -> bool {
        let who = self.who(identity);
        if let Some(special) = self.domains.special_perms(&ev.path) {
            return special.rights_for(&who) & PERM_READ != 0;
        }
        let readable = |p: &crate::perms::Perms| p.rights_for(&who) & PERM_READ != 0;
        if ev.old_perms.as_ref().is_some_and(readable) {
            return true;
        }
        if let Some(n) = self.tree.get(&ev.path) {
            if readable(&n.perms) {
                return true;
            }
        }
        self.tree
            .get(path::parent(&ev.path))
            .is_some_and(|n| readable(&n.perms))
    }

    fn fire_special(&mut self, name: &str, out: &mut Vec<Outgoing>) {
        let ev = QueuedEvent {
            path: name.to_owned(),
            exact: true,
            old_perms: None,
        };
        self.fire(&ev, out);
    }

    /// XS_RELEASE: forgets the domain, drops its connections' watches and
    /// transactions (no events for its own nodes' removal), deletes the
    /// nodes it owned (C xenstored's default without `--keep-orphans`),
    /// revokes the rights other nodes grant it, fires @releaseDomain.
    fn release(&mut self, domid: DomId, out: &mut Vec<Outgoing>) -> Result<(), XsError> {
        if self.domains.remove(domid).is_none() {
            return Err(XsError::Enoent);
        }
        let guest = Identity::guest(domid);
        for (id, c) in self.conns.iter_mut() {
            if c.identity == guest {
                self.watches.remove_conn(*id);
                c.txns.clear();
            }
        }
        if self.acct.entries(domid) > 0 {
            let mut owned = Vec::new();
            let mut stack = vec!["/".to_owned()];
            while let Some(p) = stack.pop() {
                let Some(n) = self.tree.get(&p) else { continue };
                if n.perms.owner() == domid && p != "/" {
                    owned.push(p);
                    continue;
                }
                for c in n.children.iter().rev() {
                    stack.push(path::child_path(&p, c));
                }
            }
            let mut events = Vec::new();
            for p in owned {
                let mut view = View::direct(&mut self.tree, &mut self.gen, &mut self.acct);
                if let Err(e) = ops::rm_node(&mut view, &p) {
                    tracing::warn!(path = p, error = %e, "removing orphaned node");
                }
                events.append(&mut view.events);
            }
            for ev in &events {
                self.fire(ev, out);
            }
        }
        self.revoke_rights(domid);
        self.fire_special(RELEASE_DOMAIN, out);
        self.changes.push(DomainChange::Released(domid));
        Ok(())
    }

    /// XSA-322: permission entries naming a released domain must not
    /// grant anything to a later domain that reuses its id. C xenstored
    /// (4.14 and later) flags such entries `XS_PERM_IGNORE` when it reads a
    /// node whose generation predates the domain; pvio removes them from
    /// every node here, which permission checks and XS_GET_PERMS see the
    /// same way. The nodes keep their generation and no watch fires, as
    /// in C xenstored. An open transaction holding a changed node that
    /// names the domain fails with EAGAIN at commit, so it cannot write the
    /// entry back; its retry starts from the cleaned tree.
    fn revoke_rights(&mut self, domid: DomId) {
        let names = |p: &crate::perms::Perms| p.entries().iter().any(|e| e.domid == domid);
        let (mut n, mut orphans) = (0, 0);
        self.tree.for_each_mut(|node| {
            if names(&node.perms) {
                // An owner entry can only be left if removing its node
                // failed: such a node goes to dom0 (`--keep-orphans` style).
                if node.perms.owner() == domid {
                    orphans += 1;
                }
                node.perms = node.perms.without_domain(domid, 0);
                n += 1;
            }
        });
        if orphans > 0 {
            self.acct.add(domid, -orphans);
            self.acct.add(0, orphans);
        }
        if n > 0 {
            tracing::debug!(domid, nodes = n, "revoked a released domain's rights");
        }
        for c in self.conns.values_mut() {
            for t in c.txns.values_mut() {
                let stale = t
                    .overlay
                    .values()
                    .any(|node| node.as_ref().is_some_and(|node| names(&node.perms)));
                if stale && t.failed.is_none() {
                    t.failed = Some(XsError::Eagain);
                }
                t.revoke_rights(domid);
            }
        }
    }

    /// (watches, open transactions, connections) of a domain.
    fn domain_usage(&self, domid: DomId) -> (usize, usize, usize) {
        let mut r = (0, 0, 0);
        for (id, c) in &self.conns {
            if c.identity.domid == domid {
                r.0 += self.watches.count(*id);
                r.1 += c.txns.len();
                r.2 += 1;
            }
        }
        r
    }

    /// Checks the tree's invariants: every child listed exists, every node
    /// but the root is listed by its parent, and the per-domain counts match.
    pub fn check_consistency(&self) -> Result<(), String> {
        let mut counts: HashMap<DomId, i64> = HashMap::new();
        for (p, n) in self.tree.iter() {
            *counts.entry(n.perms.owner()).or_insert(0) += 1;
            for c in &n.children {
                let cp = path::child_path(p, c);
                if self.tree.get(&cp).is_none() {
                    return Err(format!("{p} lists missing child {c}"));
                }
            }
            if p != "/" {
                let parent = self
                    .tree
                    .get(path::parent(p))
                    .ok_or_else(|| format!("{p} has no parent"))?;
                if !parent.children.iter().any(|c| c == path::basename(p)) {
                    return Err(format!("{p} is not listed by its parent"));
                }
            }
        }
        for (d, n) in &counts {
            if self.acct.entries(*d) != *n {
                return Err(format!(
                    "domain {d} owns {n} nodes, accounted {}",
                    self.acct.entries(*d)
                ));
            }
        }
        if self.acct.iter().any(|(d, n)| counts.get(&d) != Some(&n)) {
            return Err("accounting lists a domain owning no nodes".into());
        }
        Ok(())
    }

    /// Every node as (path, value, perms), sorted by path: for tests and
    /// model comparison.
    pub fn dump(&self) -> Vec<(String, Vec<u8>, String)> {
        let mut v: Vec<_> = self
            .tree
            .iter()
            .map(|(p, n)| (p.clone(), n.value.clone(), n.perms.to_string()))
            .collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests;
