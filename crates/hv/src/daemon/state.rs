//! hvd's state and the handling of every request. No sockets here: each
//! handler takes the calling connection and returns a reply (bytes and the
//! descriptors to pass), so the logic is testable on its own.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::fd::{AsFd, OwnedFd};

use pvio_abi::event_channel::{EvtchnPort, EvtchnStat};
use pvio_abi::grant_table::{
    GntStatus, GrantRef, GTF_PERMIT_ACCESS, GTF_READING, GTF_READONLY, GTF_TYPE_MASK, GTF_WRITING,
};
use pvio_abi::{DomId, DOMID_MASK, DOMID_SELF, XEN_PAGE_SIZE};

use crate::error::{ErrorCode, GrantFailure};
use crate::grant::{unpack, GrantTableMem};
use crate::proto::{
    DomainInfo, GrantMapItem, HvdInfo, MapResult, PortStatus, Request, Writer, MAX_NAME_LEN,
    REPLY_OK,
};
use crate::sys;

use super::config::Config;
use super::domain::{Domain, Port, PortState};
use super::ConnId;

/// A refusal: the code and a sentence for the client.
pub type Refusal = (ErrorCode, String);

/// What a connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Has not registered yet; may only register or claim.
    Unregistered,
    /// A process of domain 0.
    Host,
    /// The process that is guest domain `DomId`.
    Guest(DomId),
}

/// One grant mapped by a connection.
#[derive(Debug, Clone, Copy)]
struct MapEntry {
    granter: DomId,
    instance: u64,
    gref: GrantRef,
    readonly: bool,
}

/// A connection's grant mappings (Xen's maptrack), indexed by handle.
#[derive(Debug, Default)]
struct Maptrack {
    entries: Vec<Option<MapEntry>>,
    free: Vec<u32>,
    by_grant: HashMap<(u64, GrantRef), u32>,
}

impl Maptrack {
    fn insert(&mut self, e: MapEntry) -> u32 {
        let h = match self.free.pop() {
            Some(h) => {
                self.entries[h as usize] = Some(e);
                h
            }
            None => {
                self.entries.push(Some(e));
                (self.entries.len() - 1) as u32
            }
        };
        self.by_grant.insert((e.instance, e.gref), h);
        h
    }

    fn remove(&mut self, h: u32) -> Option<MapEntry> {
        let e = self.entries.get_mut(h as usize)?.take()?;
        self.free.push(h);
        self.by_grant.remove(&(e.instance, e.gref));
        Some(e)
    }

    fn len(&self) -> usize {
        self.by_grant.len()
    }

    fn drain(&mut self) -> Vec<MapEntry> {
        self.free.clear();
        self.by_grant.clear();
        self.entries.drain(..).flatten().collect()
    }
}

/// Per-connection state.
#[derive(Debug)]
pub struct ConnState {
    pub role: Role,
    pub pid: u32,
    maptrack: Maptrack,
}

impl ConnState {
    /// A fresh, unregistered connection from process `pid`.
    pub fn new(pid: u32) -> Self {
        Self {
            role: Role::Unregistered,
            pid,
            maptrack: Maptrack::default(),
        }
    }

    fn domid(&self) -> Option<DomId> {
        match self.role {
            Role::Unregistered => None,
            Role::Host => Some(0),
            Role::Guest(d) => Some(d),
        }
    }
}

/// Pins of one active grant (Xen's active grant entry).
#[derive(Debug, Default, Clone, Copy)]
struct Active {
    readers: u32,
    writers: u32,
}

/// A reply to send: payload and descriptors.
#[derive(Debug, Default)]
pub struct Reply {
    pub bytes: Vec<u8>,
    pub fds: Vec<OwnedFd>,
}

impl Reply {
    fn ok(w: Writer) -> Self {
        let mut bytes = Vec::with_capacity(64);
        bytes.extend_from_slice(&REPLY_OK.to_le_bytes());
        bytes.extend_from_slice(&w.into_bytes());
        Reply {
            bytes,
            fds: Vec::new(),
        }
    }

    fn empty() -> Self {
        Self::ok(Writer::new())
    }

    fn with_fds(mut self, fds: Vec<OwnedFd>) -> Self {
        self.fds = fds;
        self
    }
}

/// Everything hvd knows.
#[derive(Debug)]
pub struct HvState {
    config: Config,
    domains: BTreeMap<DomId, Domain>,
    conns: HashMap<ConnId, ConnState>,
    active: HashMap<(u64, GrantRef), Active>,
    next_domid: DomId,
    next_instance: u64,
    /// Connections whose domain was destroyed by another; the event loop
    /// disconnects them.
    kicked: Vec<ConnId>,
}

/// Owner of ports prepared for a domain no process has claimed yet.
const NO_CONN: ConnId = 0;

fn refuse<T>(code: ErrorCode, msg: impl Into<String>) -> Result<T, Refusal> {
    Err((code, msg.into()))
}

fn internal(e: impl std::fmt::Display) -> Refusal {
    (ErrorCode::Internal, e.to_string())
}

fn random_token() -> u64 {
    use std::io::Read;
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut b);
    }
    u64::from_ne_bytes(b) | 1
}

fn dup(fd: &OwnedFd) -> Result<OwnedFd, Refusal> {
    fd.try_clone().map_err(internal)
}

impl HvState {
    /// Empty state with only domain 0.
    pub fn new(config: Config) -> Self {
        let mut s = Self {
            config,
            domains: BTreeMap::new(),
            conns: HashMap::new(),
            active: HashMap::new(),
            next_domid: 1,
            next_instance: 1,
            kicked: Vec::new(),
        };
        let dom0 = s.new_domain(0, "Domain-0".into(), 0, None, None, None, 0);
        s.domains.insert(0, dom0);
        s
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    #[allow(clippy::too_many_arguments)]
    fn new_domain(
        &mut self,
        domid: DomId,
        name: String,
        frames: u32,
        mem_fd: Option<OwnedFd>,
        grant_fd: Option<OwnedFd>,
        grant_table: Option<GrantTableMem>,
        grant_frames: u32,
    ) -> Domain {
        self.next_instance += 1;
        Domain {
            domid,
            instance: self.next_instance,
            name,
            frames,
            mem_fd,
            grant_fd,
            grant_table,
            grant_frames,
            token: random_token(),
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

    /// Connections to disconnect because their domain was destroyed.
    pub fn take_kicked(&mut self) -> Vec<ConnId> {
        std::mem::take(&mut self.kicked)
    }

    /// Records a new connection.
    pub fn add_conn(&mut self, id: ConnId, pid: u32) {
        self.conns.insert(id, ConnState::new(pid));
    }

    /// Number of connections.
    pub fn conn_count(&self) -> usize {
        self.conns.len()
    }

    fn caller(&self, conn: ConnId) -> Result<(DomId, bool), Refusal> {
        match self.conns.get(&conn).and_then(|c| c.domid()) {
            Some(d) => Ok((d, d == 0)),
            None => refuse(
                ErrorCode::PermissionDenied,
                "register first (as the host, a new guest, or by claiming a domain)",
            ),
        }
    }

    fn privileged(&self, conn: ConnId, what: &str) -> Result<(), Refusal> {
        match self.caller(conn)? {
            (_, true) => Ok(()),
            (d, false) => refuse(
                ErrorCode::PermissionDenied,
                format!("domain {d} is not privileged: only domain 0 may {what}"),
            ),
        }
    }

    fn resolve(&self, caller: DomId, dom: DomId) -> DomId {
        if dom == DOMID_SELF {
            caller
        } else {
            dom
        }
    }

    fn domain(&self, domid: DomId) -> Result<&Domain, Refusal> {
        self.domains.get(&domid).ok_or_else(|| {
            (
                ErrorCode::NoSuchDomain,
                format!("domain {domid} does not exist"),
            )
        })
    }

    fn domain_mut(&mut self, domid: DomId) -> Result<&mut Domain, Refusal> {
        self.domains.get_mut(&domid).ok_or_else(|| {
            (
                ErrorCode::NoSuchDomain,
                format!("domain {domid} does not exist"),
            )
        })
    }

    /// Handles one decoded request from `conn`.
    pub fn handle(&mut self, conn: ConnId, req: Request) -> Result<Reply, Refusal> {
        match req {
            Request::RegisterHost => self.register_host(conn),
            Request::RegisterGuest { name, frames } => {
                self.check_unregistered(conn)?;
                let domid = self.create_domain(&name, frames)?;
                let token = self.domain(domid)?.token;
                self.claim(conn, domid, token)
            }
            Request::CreateDomain { name, frames } => {
                self.privileged(conn, "create domains")?;
                let domid = self.create_domain(&name, frames)?;
                let d = self.domain(domid)?;
                let mut w = Writer::new();
                w.u16(domid).u64(d.token).u32(d.store_port);
                Ok(Reply::ok(w))
            }
            Request::ClaimDomain { domid, token } => {
                self.check_unregistered(conn)?;
                self.claim(conn, domid, token)
            }
            Request::DestroyDomain { domid } => {
                self.privileged(conn, "destroy domains")?;
                if domid == 0 {
                    return refuse(ErrorCode::InvalidArgument, "domain 0 cannot be destroyed");
                }
                self.domain(domid)?;
                if let Some(owner) = self.destroy_domain(domid) {
                    self.kicked.push(owner);
                }
                Ok(Reply::empty())
            }
            Request::ListDomains => {
                self.caller(conn)?;
                let mut w = Writer::new();
                w.u32(self.domains.len() as u32);
                for d in self.domains.values() {
                    self.domain_info(d).write(&mut w);
                }
                Ok(Reply::ok(w))
            }
            Request::EvtchnAllocUnbound { remote_dom } => self.alloc_unbound(conn, remote_dom),
            Request::EvtchnBindInterdomain {
                remote_dom,
                remote_port,
            } => self.bind_interdomain(conn, remote_dom, remote_port),
            Request::EvtchnClose { port } => {
                let (dom, _) = self.caller(conn)?;
                self.check_owned(conn, dom, port)?;
                self.close_port(dom, port);
                Ok(Reply::empty())
            }
            Request::EvtchnSend { port } => {
                let (dom, _) = self.caller(conn)?;
                self.check_owned(conn, dom, port)?;
                self.signal_peer(dom, port);
                Ok(Reply::empty())
            }
            Request::EvtchnStatus { dom, port } => {
                let dom = self.visible_domain(conn, dom)?;
                if port >= self.config.max_ports() {
                    return refuse(
                        ErrorCode::BadPort,
                        format!(
                            "port {port} is beyond the limit of {} ports",
                            self.config.max_ports()
                        ),
                    );
                }
                let st = self.port_status(dom, port)?;
                let mut w = Writer::new();
                st.write(&mut w);
                Ok(Reply::ok(w))
            }
            Request::EvtchnList { dom } => {
                let dom = self.visible_domain(conn, dom)?;
                let ports: Vec<EvtchnPort> = self.domain(dom)?.ports.keys().copied().collect();
                let mut w = Writer::new();
                w.u32(ports.len() as u32);
                for p in ports {
                    self.port_status(dom, p)?.write(&mut w);
                }
                Ok(Reply::ok(w))
            }
            Request::ForeignMemory { dom } => {
                self.privileged(conn, "map foreign memory")?;
                let d = self.domain(dom)?;
                let fd = d.mem_fd.as_ref().ok_or_else(|| {
                    (
                        ErrorCode::InvalidArgument,
                        format!("domain {dom} has no memory to map"),
                    )
                })?;
                let mut w = Writer::new();
                w.u32(d.frames);
                Ok(Reply::ok(w).with_fds(vec![dup(fd)?]))
            }
            Request::GrantMap { dom, items } => self.grant_map(conn, dom, &items),
            Request::GrantUnmap { handles } => {
                self.caller(conn)?;
                let mut w = Writer::new();
                w.u32(handles.len() as u32);
                for h in handles {
                    let r = self.unmap_one(conn, h);
                    r.write(&mut w);
                }
                Ok(Reply::ok(w))
            }
            Request::Info => {
                self.caller(conn)?;
                let mut w = Writer::new();
                self.info().write(&mut w);
                Ok(Reply::ok(w))
            }
        }
    }

    /// Counters and limits.
    pub fn info(&self) -> HvdInfo {
        HvdInfo {
            domains: self.domains.len() as u32,
            connections: self.conns.len() as u32,
            ports: self.domains.values().map(|d| d.ports.len() as u32).sum(),
            active_grants: self.active.len() as u32,
            maptrack_entries: self.conns.values().map(|c| c.maptrack.len() as u32).sum(),
            max_grant_frames: self.config.max_grant_frames,
            max_maptrack_entries: self.config.max_maptrack_entries,
            max_ports: self.config.max_ports(),
            evtchn_abi: self.config.evtchn_abi.name().to_string(),
        }
    }

    fn domain_info(&self, d: &Domain) -> DomainInfo {
        DomainInfo {
            domid: d.domid,
            name: d.name.clone(),
            frames: d.frames,
            grant_frames: d.grant_frames,
            running: d.domid == 0 || d.owner.is_some(),
            pid: d.pid,
            ports: d.ports.len() as u32,
            grants_mapped: d.grants_mapped,
        }
    }

    fn check_unregistered(&self, conn: ConnId) -> Result<(), Refusal> {
        match self.conns.get(&conn).map(|c| c.role) {
            Some(Role::Unregistered) => Ok(()),
            _ => refuse(ErrorCode::Busy, "this connection is already registered"),
        }
    }

    fn register_host(&mut self, conn: ConnId) -> Result<Reply, Refusal> {
        self.check_unregistered(conn)?;
        if let Some(c) = self.conns.get_mut(&conn) {
            c.role = Role::Host;
        }
        let mut w = Writer::new();
        w.u16(0);
        Ok(Reply::ok(w))
    }

    fn create_domain(&mut self, name: &str, frames: u32) -> Result<DomId, Refusal> {
        if name.is_empty() || name.len() > MAX_NAME_LEN || !name.chars().all(|c| !c.is_control()) {
            return refuse(
                ErrorCode::InvalidArgument,
                format!("domain name must be 1 to {MAX_NAME_LEN} printable characters"),
            );
        }
        if frames == 0 || frames > self.config.max_domain_frames {
            return refuse(
                ErrorCode::InvalidArgument,
                format!(
                    "memory of {frames} frames is outside 1..={} frames",
                    self.config.max_domain_frames
                ),
            );
        }
        let domid = self.alloc_domid()?;
        let mem_fd = sys::create_sealed_memfd(
            &format!("pvio-dom{domid}-mem"),
            u64::from(frames) * XEN_PAGE_SIZE as u64,
        )
        .map_err(internal)?;
        let gframes = self.config.max_grant_frames;
        let grant_fd = sys::create_sealed_memfd(
            &format!("pvio-dom{domid}-gnttab"),
            u64::from(gframes) * XEN_PAGE_SIZE as u64,
        )
        .map_err(internal)?;
        let table = GrantTableMem::from_fd(&grant_fd, gframes).map_err(internal)?;
        // Like Xen's domain builder, give the guest its xenstore event
        // channel, offered to dom0, before it runs; the toolstack passes the
        // port to xenstored with XS_INTRODUCE.
        let efd = sys::create_eventfd().map_err(internal)?;
        let peer_efd = sys::create_eventfd().map_err(internal)?;
        let mut d = self.new_domain(
            domid,
            name.to_string(),
            frames,
            Some(mem_fd),
            Some(grant_fd),
            Some(table),
            gframes,
        );
        let port = d.take_free_port(self.config.max_ports()).unwrap_or(1);
        d.ports.insert(
            port,
            Port {
                owner: NO_CONN,
                efd,
                state: PortState::Unbound {
                    remote_dom: 0,
                    peer_efd: Some(peer_efd),
                },
            },
        );
        d.store_port = port;
        self.domains.insert(domid, d);
        tracing::info!(domid, name, frames, "domain created");
        Ok(domid)
    }

    fn alloc_domid(&mut self) -> Result<DomId, Refusal> {
        // Like Xen, hand out increasing domids and wrap below the reserved
        // range, so a domid is not reused while tools may still remember it.
        let limit = DOMID_SELF; // 0x7ff0: first reserved id
        for _ in 0..limit {
            let d = self.next_domid;
            self.next_domid = if d + 1 >= limit { 1 } else { d + 1 };
            if d != 0 && d <= DOMID_MASK && !self.domains.contains_key(&d) {
                return Ok(d);
            }
        }
        refuse(ErrorCode::Limit, "every domain id is in use")
    }

    fn claim(&mut self, conn: ConnId, domid: DomId, token: u64) -> Result<Reply, Refusal> {
        let pid = self.conns.get(&conn).map(|c| c.pid).unwrap_or(0);
        let d = self.domain_mut(domid)?;
        if domid == 0 {
            return refuse(ErrorCode::PermissionDenied, "domain 0 cannot be claimed");
        }
        if d.owner.is_some() {
            return refuse(
                ErrorCode::Busy,
                format!("domain {domid} is already running"),
            );
        }
        if d.token != token {
            return refuse(
                ErrorCode::PermissionDenied,
                format!("wrong claim token for domain {domid}"),
            );
        }
        d.owner = Some(conn);
        d.pid = pid;
        // Ports prepared before the guest ran (its store channel) are the
        // guest's now.
        for p in d.ports.values_mut() {
            if p.owner == NO_CONN {
                p.owner = conn;
            }
        }
        let store_port = d.store_port;
        let mut fds = vec![
            dup(d.mem_fd.as_ref().expect("guests have memory"))?,
            dup(d.grant_fd.as_ref().expect("guests have a grant table"))?,
        ];
        let (wait, peer) = match d.ports.get(&store_port) {
            Some(sp) => (
                dup(&sp.efd)?,
                match &sp.state {
                    PortState::Unbound {
                        peer_efd: Some(e), ..
                    } => Ok(dup(e)?),
                    PortState::Interdomain {
                        remote_dom,
                        remote_port,
                    } => Err((*remote_dom, *remote_port)),
                    PortState::Unbound { peer_efd: None, .. } => {
                        return refuse(
                            ErrorCode::BadPort,
                            format!("the store port of domain {domid} was closed"),
                        )
                    }
                },
            ),
            None => {
                return refuse(
                    ErrorCode::Internal,
                    format!("domain {domid} lost its store port"),
                )
            }
        };
        let notify = match peer {
            Ok(fd) => fd,
            Err((rd, rp)) => {
                let p = self
                    .domains
                    .get(&rd)
                    .and_then(|d| d.ports.get(&rp))
                    .ok_or_else(|| (ErrorCode::Internal, "store port peer missing".to_string()))?;
                dup(&p.efd)?
            }
        };
        fds.push(wait);
        fds.push(notify);
        let info = self.domain_info(self.domain(domid)?);
        if let Some(c) = self.conns.get_mut(&conn) {
            c.role = Role::Guest(domid);
        }
        tracing::info!(domid, pid, "domain claimed");
        let mut w = Writer::new();
        info.write(&mut w);
        w.u32(store_port);
        Ok(Reply::ok(w).with_fds(fds))
    }

    /// Destroys a guest domain: closes its ports (peers see them unbound and
    /// are woken), forgets its grants, releases its memory. Returns the
    /// connection that was the domain, for the caller to close.
    pub fn destroy_domain(&mut self, domid: DomId) -> Option<ConnId> {
        let ports: Vec<EvtchnPort> = match self.domains.get(&domid) {
            Some(d) => d.ports.keys().copied().collect(),
            None => return None,
        };
        for p in ports {
            self.close_port(domid, p);
        }
        let d = self.domains.remove(&domid)?;
        self.active.retain(|(inst, _), _| *inst != d.instance);
        if let Some(owner) = d.owner {
            if let Some(c) = self.conns.get_mut(&owner) {
                c.role = Role::Unregistered;
            }
        }
        tracing::info!(domid, name = %d.name, "domain destroyed");
        d.owner
    }

    /// Forgets a connection: its ports close, its mappings are released and
    /// a guest connection takes its domain with it.
    pub fn remove_conn(&mut self, conn: ConnId) {
        let Some(mut c) = self.conns.remove(&conn) else {
            return;
        };
        for e in c.maptrack.drain() {
            self.unpin(e);
            if let Some(d) = self.domains.get_mut(&c.domid().unwrap_or(0)) {
                d.maptrack_used = d.maptrack_used.saturating_sub(1);
            }
        }
        match c.role {
            Role::Guest(domid) => {
                self.destroy_domain(domid);
            }
            Role::Host => {
                let owned: Vec<EvtchnPort> = self.domains[&0]
                    .ports
                    .iter()
                    .filter(|(_, p)| p.owner == conn)
                    .map(|(n, _)| *n)
                    .collect();
                for p in owned {
                    self.close_port(0, p);
                }
            }
            Role::Unregistered => {}
        }
    }

    // ---- event channels ----------------------------------------------------

    fn visible_domain(&self, conn: ConnId, dom: DomId) -> Result<DomId, Refusal> {
        let (caller, privileged) = self.caller(conn)?;
        let dom = self.resolve(caller, dom);
        if dom != caller && !privileged {
            return refuse(
                ErrorCode::PermissionDenied,
                format!("domain {caller} may not inspect domain {dom}"),
            );
        }
        self.domain(dom)?;
        Ok(dom)
    }

    fn check_owned(&self, conn: ConnId, dom: DomId, port: EvtchnPort) -> Result<(), Refusal> {
        match self.domain(dom)?.ports.get(&port) {
            None => refuse(
                ErrorCode::BadPort,
                format!("port {port} of domain {dom} is not open"),
            ),
            Some(p) if p.owner != conn => refuse(
                ErrorCode::PermissionDenied,
                format!("port {port} of domain {dom} belongs to another process"),
            ),
            Some(_) => Ok(()),
        }
    }

    fn new_port_number(&mut self, dom: DomId) -> Result<EvtchnPort, Refusal> {
        let max = self.config.max_ports();
        let d = self.domain_mut(dom)?;
        d.take_free_port(max).ok_or_else(|| {
            (
                ErrorCode::Limit,
                format!("domain {dom} has no free event-channel port (limit {max} with the configured ABI)"),
            )
        })
    }

    fn alloc_unbound(&mut self, conn: ConnId, remote_dom: DomId) -> Result<Reply, Refusal> {
        let (dom, _) = self.caller(conn)?;
        let remote_dom = self.resolve(dom, remote_dom);
        self.domain(remote_dom)?;
        let efd = sys::create_eventfd().map_err(internal)?;
        let peer_efd = sys::create_eventfd().map_err(internal)?;
        let fds = vec![dup(&efd)?, dup(&peer_efd)?];
        let port = self.new_port_number(dom)?;
        self.domain_mut(dom)?.ports.insert(
            port,
            Port {
                owner: conn,
                efd,
                state: PortState::Unbound {
                    remote_dom,
                    peer_efd: Some(peer_efd),
                },
            },
        );
        let mut w = Writer::new();
        w.u32(port);
        Ok(Reply::ok(w).with_fds(fds))
    }

    fn bind_interdomain(
        &mut self,
        conn: ConnId,
        remote_dom: DomId,
        remote_port: EvtchnPort,
    ) -> Result<Reply, Refusal> {
        let (dom, _) = self.caller(conn)?;
        let remote_dom = self.resolve(dom, remote_dom);
        let rd = self.domain(remote_dom)?;
        match rd.ports.get(&remote_port).map(|p| &p.state) {
            None => {
                return refuse(
                    ErrorCode::BadPort,
                    format!("port {remote_port} of domain {remote_dom} is not open"),
                )
            }
            Some(PortState::Interdomain { .. }) => {
                return refuse(
                    ErrorCode::BadPort,
                    format!("port {remote_port} of domain {remote_dom} is already connected"),
                )
            }
            Some(PortState::Unbound { remote_dom: allowed, .. }) if *allowed != dom => {
                return refuse(
                    ErrorCode::PermissionDenied,
                    format!(
                        "port {remote_port} of domain {remote_dom} is offered to domain {allowed}, not {dom}"
                    ),
                )
            }
            Some(PortState::Unbound { .. }) => {}
        }
        let port = self.new_port_number(dom)?;
        // Take the eventfd the unbound side prepared for us (or a new one if
        // the port was left unbound by a closed peer).
        let peer_efd = {
            let rp = self
                .domain_mut(remote_dom)?
                .ports
                .get_mut(&remote_port)
                .expect("checked above");
            let taken = match &mut rp.state {
                PortState::Unbound { peer_efd, .. } => peer_efd.take(),
                PortState::Interdomain { .. } => None,
            };
            rp.state = PortState::Interdomain {
                remote_dom: dom,
                remote_port: port,
            };
            taken
        };
        let efd = match peer_efd {
            Some(e) => e,
            None => match sys::create_eventfd() {
                Ok(e) => e,
                Err(e) => {
                    self.domain_mut(dom)?.release_port(port);
                    return Err(internal(e));
                }
            },
        };
        let remote_efd = dup(&self.domain(remote_dom)?.ports[&remote_port].efd)?;
        let fds = vec![dup(&efd)?, remote_efd];
        self.domain_mut(dom)?.ports.insert(
            port,
            Port {
                owner: conn,
                efd,
                state: PortState::Interdomain {
                    remote_dom,
                    remote_port,
                },
            },
        );
        let mut w = Writer::new();
        w.u32(port);
        Ok(Reply::ok(w).with_fds(fds))
    }

    /// Closes a port; an interdomain peer becomes unbound (offered back to
    /// this domain, as in Xen) and is woken so it notices.
    fn close_port(&mut self, dom: DomId, port: EvtchnPort) {
        let Some(d) = self.domains.get_mut(&dom) else {
            return;
        };
        let Some(p) = d.ports.remove(&port) else {
            return;
        };
        d.release_port(port);
        if let PortState::Interdomain {
            remote_dom,
            remote_port,
        } = p.state
        {
            if let Some(rp) = self
                .domains
                .get_mut(&remote_dom)
                .and_then(|rd| rd.ports.get_mut(&remote_port))
            {
                rp.state = PortState::Unbound {
                    remote_dom: dom,
                    peer_efd: None,
                };
                let _ = sys::eventfd_signal(rp.efd.as_fd());
            }
        }
    }

    fn signal_peer(&self, dom: DomId, port: EvtchnPort) {
        let Some(p) = self.domains.get(&dom).and_then(|d| d.ports.get(&port)) else {
            return;
        };
        match &p.state {
            PortState::Interdomain {
                remote_dom,
                remote_port,
            } => {
                if let Some(rp) = self
                    .domains
                    .get(remote_dom)
                    .and_then(|rd| rd.ports.get(remote_port))
                {
                    let _ = sys::eventfd_signal(rp.efd.as_fd());
                }
            }
            PortState::Unbound {
                peer_efd: Some(e), ..
            } => {
                let _ = sys::eventfd_signal(e.as_fd());
            }
            PortState::Unbound { peer_efd: None, .. } => {}
        }
    }

    fn port_status(&self, dom: DomId, port: EvtchnPort) -> Result<PortStatus, Refusal> {
        let d = self.domain(dom)?;
        let closed = PortStatus {
            port,
            state: EvtchnStat::Closed,
            remote_dom: 0,
            remote_port: 0,
            owner_pid: 0,
        };
        let Some(p) = d.ports.get(&port) else {
            return Ok(closed);
        };
        let owner_pid = self.conns.get(&p.owner).map(|c| c.pid).unwrap_or(0);
        Ok(match &p.state {
            PortState::Unbound { remote_dom, .. } => PortStatus {
                state: EvtchnStat::Unbound,
                remote_dom: *remote_dom,
                owner_pid,
                ..closed
            },
            PortState::Interdomain {
                remote_dom,
                remote_port,
            } => PortStatus {
                state: EvtchnStat::Interdomain,
                remote_dom: *remote_dom,
                remote_port: *remote_port,
                owner_pid,
                ..closed
            },
        })
    }

    // ---- grants ------------------------------------------------------------

    fn grant_map(
        &mut self,
        conn: ConnId,
        dom: DomId,
        items: &[GrantMapItem],
    ) -> Result<Reply, Refusal> {
        self.privileged(conn, "map foreign grants")?;
        let (mapper, _) = self.caller(conn)?;
        let mut w = Writer::new();
        w.u32(items.len() as u32);
        for it in items {
            let r = self.map_one(conn, mapper, dom, *it);
            if r.status != GntStatus::Okay {
                tracing::debug!(
                    dom,
                    gref = it.gref,
                    reason = r.reason.describe(),
                    "grant map refused"
                );
            }
            r.write(&mut w);
        }
        Ok(Reply::ok(w))
    }

    fn map_one(&mut self, conn: ConnId, mapper: DomId, dom: DomId, it: GrantMapItem) -> MapResult {
        let fail = |reason: GrantFailure| MapResult {
            status: reason.status(),
            reason,
            handle: 0,
            frame: 0,
        };
        let max_maptrack = self.config.max_maptrack_entries;
        let Some(granter) = self.domains.get(&dom) else {
            return fail(GrantFailure::NoSuchDomain);
        };
        let Some(table) = granter.grant_table.as_ref() else {
            return fail(GrantFailure::NoSuchDomain);
        };
        if it.gref >= table.nr_refs() {
            return fail(GrantFailure::RefOutOfRange);
        }
        let instance = granter.instance;
        let frames = granter.frames;
        let already = self
            .conns
            .get(&conn)
            .is_none_or(|c| c.maptrack.by_grant.contains_key(&(instance, it.gref)));
        let maptrack_full = self
            .domains
            .get(&mapper)
            .map(|d| d.maptrack_used)
            .unwrap_or(0)
            >= max_maptrack;
        // Pin the entry: validate a snapshot, then set the in-use flags with
        // a compare-exchange of the whole entry, so a granter racing to
        // change it cannot slip a different frame or grantee past the checks.
        let mut frame = 0;
        let mut pinned = false;
        for _ in 0..8 {
            let Some(v) = table.load(it.gref) else {
                return fail(GrantFailure::RefOutOfRange);
            };
            let e = unpack(v);
            if e.flags & GTF_TYPE_MASK != GTF_PERMIT_ACCESS {
                return fail(GrantFailure::NotGranted);
            }
            if e.domid != mapper {
                return fail(GrantFailure::WrongGrantee);
            }
            if !it.readonly && e.flags & GTF_READONLY != 0 {
                return fail(GrantFailure::ReadOnlyGrant);
            }
            if e.frame >= frames {
                return fail(GrantFailure::BadFrame);
            }
            // Bookkeeping refusals come after the entry's own checks, so the
            // reason names the first thing wrong with the grant itself.
            if already {
                return fail(GrantFailure::AlreadyMapped);
            }
            if maptrack_full {
                return fail(GrantFailure::MaptrackFull);
            }
            let mut set = GTF_READING;
            if !it.readonly {
                set |= GTF_WRITING;
            }
            if table
                .compare_exchange(it.gref, v, v | u64::from(set))
                .is_ok()
            {
                frame = e.frame;
                pinned = true;
                break;
            }
        }
        if !pinned {
            return fail(GrantFailure::EntryChanged);
        }
        let a = self.active.entry((instance, it.gref)).or_default();
        if a.readers == 0 && a.writers == 0 {
            if let Some(g) = self.domains.get_mut(&dom) {
                g.grants_mapped += 1;
            }
        }
        if it.readonly {
            a.readers += 1;
        } else {
            a.writers += 1;
        }
        if let Some(m) = self.domains.get_mut(&mapper) {
            m.maptrack_used += 1;
        }
        let handle = self
            .conns
            .get_mut(&conn)
            .expect("checked above")
            .maptrack
            .insert(MapEntry {
                granter: dom,
                instance,
                gref: it.gref,
                readonly: it.readonly,
            });
        MapResult {
            status: GntStatus::Okay,
            reason: GrantFailure::None,
            handle,
            frame,
        }
    }

    fn unmap_one(&mut self, conn: ConnId, handle: u32) -> MapResult {
        let entry = self
            .conns
            .get_mut(&conn)
            .and_then(|c| c.maptrack.remove(handle));
        let Some(e) = entry else {
            return MapResult {
                status: GrantFailure::BadHandle.status(),
                reason: GrantFailure::BadHandle,
                handle,
                frame: 0,
            };
        };
        if let Some(mapper) = self.conns.get(&conn).and_then(|c| c.domid()) {
            if let Some(d) = self.domains.get_mut(&mapper) {
                d.maptrack_used = d.maptrack_used.saturating_sub(1);
            }
        }
        self.unpin(e);
        MapResult {
            status: GntStatus::Okay,
            reason: GrantFailure::None,
            handle,
            frame: 0,
        }
    }

    /// Drops one pin; clears `GTF_writing` when the last writer goes and
    /// `GTF_reading` when the last mapping goes. A granter that is gone is
    /// nothing to update.
    fn unpin(&mut self, e: MapEntry) {
        let key = (e.instance, e.gref);
        let Some(a) = self.active.get_mut(&key) else {
            return;
        };
        if e.readonly {
            a.readers = a.readers.saturating_sub(1);
        } else {
            a.writers = a.writers.saturating_sub(1);
        }
        let (readers, writers) = (a.readers, a.writers);
        let Some(g) = self
            .domains
            .get_mut(&e.granter)
            .filter(|g| g.instance == e.instance)
        else {
            self.active.remove(&key);
            return;
        };
        let mut clear = 0;
        if writers == 0 {
            clear |= GTF_WRITING;
        }
        if readers == 0 && writers == 0 {
            clear |= GTF_READING;
            self.active.remove(&key);
            g.grants_mapped = g.grants_mapped.saturating_sub(1);
        }
        if let Some(t) = g.grant_table.as_ref() {
            t.clear_flags(e.gref, clear);
        }
    }
}
