//! `pvio xenstored`: a single-threaded epoll loop serving the store over
//! any [`Transport`]. Each loop iteration reads at most one buffer per ready
//! connection, answers at most [`Limits::requests_per_round`] requests per
//! connection, routes replies and watch events to their connections' queues
//! and writes each queue with one `writev`; a connection whose queue is over
//! [`Limits::pause_output_bytes`] (or, for a guest, over the `outstanding`
//! quota) is not read until it drains, and one that lets watch events pile
//! up past [`Limits::max_output_bytes`] or [`Limits::event_timeout`] is
//! dropped (XSA-349). Nothing here limits the number of connections except
//! the process's descriptor limit, which is raised to its hard maximum.
//! The loop never polls and arms no timer while only dom0 clients are
//! connected: on a VM, a wake-up and a timer each cost hypervisor exits, and
//! the round trip is dominated by them (see docs/benchmarks.md). With guests
//! it wakes once a second to sweep stalled watch events and, through the
//! hook, dead domains.
//!
//! The Unix socket's connections are dom0 (privileged). Guest connections
//! arrive through a [`DomainHook`]: before XS_INTRODUCE records a new
//! domain, the hook maps its xenbus ring and binds its event channel
//! ([`HvHook`], or any test double) and returns a transport, which the
//! daemon serves with the guest's identity; a failure is the reply to
//! XS_INTRODUCE. XS_RELEASE, or the hook reporting the domain gone (its
//! process died), releases the domain in the store (owned nodes removed,
//! `@releaseDomain` fired) and closes the connection.

pub mod conn;
pub mod hv_hook;
pub mod ring_transport;
pub mod signals;
pub mod transport;

use crate::codec::{self, Header, MsgType, ParseCtx, Request};
use crate::error::XsError;
use crate::store::domain::{DomainChange, DomainInfo};
use crate::store::quota::Quotas;
use crate::store::{ConnId, Identity, Outgoing, Store};
use conn::{Conn, Fill};
pub use hv_hook::HvHook;
use pvio_abi::{DomId, DOMID_SELF};
pub use ring_transport::RingTransport;
use rustix::event::epoll::{self, EventData, EventFlags};
use signals::TermSignals;
use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
pub use transport::{SocketTransport, Transport, Wake};

const LISTENER: u64 = 0;
const SIGNALS: u64 = u64::MAX;

/// Per-connection limits of the event loop.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Requests answered per connection per loop iteration (fairness).
    pub requests_per_round: usize,
    /// Bytes read per connection per loop iteration.
    pub read_chunk: usize,
    /// Stop reading a connection while this much output is queued for it.
    pub pause_output_bytes: usize,
    /// Drop a connection with more queued output than this (it does not
    /// read its watch events).
    pub max_output_bytes: usize,
    /// Drop a guest connection whose oldest queued watch event is older
    /// than this (C xenstored's watch-event timeout).
    pub event_timeout: Duration,
    /// Connections accepted per loop iteration.
    pub accepts_per_round: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            requests_per_round: 64,
            read_chunk: 64 * 1024,
            pause_output_bytes: 256 * 1024,
            max_output_bytes: 8 * 1024 * 1024,
            event_timeout: Duration::from_secs(20),
            accepts_per_round: 256,
        }
    }
}

/// What `pvio xenstored` is configured with.
#[derive(Clone, Debug)]
pub struct Config {
    /// The Unix socket for dom0 clients.
    pub socket: PathBuf,
    pub quotas: Quotas,
    pub limits: Limits,
    /// hvd's socket: serve introduced guests on their xenbus rings. Without
    /// it, XS_INTRODUCE only records domains.
    pub hvd_socket: Option<PathBuf>,
}

/// The transport layer's view of domain lifecycle: the seam where guest
/// xenbus rings plug in.
pub trait DomainHook {
    /// XS_INTRODUCE of a domain that is not introduced yet, before the
    /// store records it. Return the transport of its xenbus ring to have the
    /// daemon serve it as that guest, or `None` to only record it. An error
    /// is the reply to XS_INTRODUCE (`NotFound` ENOENT, `PermissionDenied`
    /// EACCES, `InvalidInput` EINVAL, others EIO), and the domain stays
    /// unknown.
    fn introduced(&mut self, info: &DomainInfo) -> io::Result<Option<Box<dyn Transport>>>;

    /// XS_INTRODUCE for an already-introduced domain: C xenstored's way of
    /// recreating the event channel. A new transport replaces the
    /// domain's connection (its watches and transactions are dropped, as
    /// `domain_conn_reset()` does); `None` keeps the connection as it is.
    fn reintroduced(&mut self, _info: &DomainInfo) -> io::Result<Option<Box<dyn Transport>>> {
        Ok(None)
    }

    /// The domain was released (XS_RELEASE, or reported gone): the daemon
    /// has closed its connection.
    fn released(&mut self, _domid: DomId) {}

    /// Which introduced domains no longer exist (VIRQ_DOM_EXC's question).
    /// `suspects` are domains whose ring woke the daemon with no news since
    /// the last call ([`Wake::Nothing`]: hvd raises the port of a peer it
    /// unbinds); `sweep` is set about once a second while
    /// [`DomainHook::watching`] says so, to catch a death that coincided
    /// with a request.
    fn gone(&mut self, _suspects: &[DomId], _sweep: bool) -> Vec<DomId> {
        Vec::new()
    }

    /// Whether [`DomainHook::gone`] needs the periodic sweep.
    fn watching(&self) -> bool {
        false
    }
}

/// Without hvd: domains are recorded, rings are not served.
#[derive(Debug, Default)]
pub struct RecordOnly;

impl DomainHook for RecordOnly {
    fn introduced(&mut self, info: &DomainInfo) -> io::Result<Option<Box<dyn Transport>>> {
        tracing::info!(
            domid = info.domid,
            mfn = info.mfn,
            port = info.port,
            "domain introduced (no hvd: its ring is not served)"
        );
        Ok(None)
    }
}

/// The daemon.
pub struct Daemon<H: DomainHook = RecordOnly> {
    store: Store,
    epoll: OwnedFd,
    listener: Option<UnixListener>,
    listener_paused: bool,
    socket_path: Option<PathBuf>,
    signals: Option<TermSignals>,
    conns: HashMap<u64, Conn>,
    limits: Limits,
    hook: H,
    pending: Vec<u64>,
    dirty: Vec<u64>,
    /// Transports the hook prepared for XS_INTRODUCEs being processed.
    prepared: HashMap<DomId, Option<Box<dyn Transport>>>,
    /// Guests whose doorbell rang with no news (see [`DomainHook::gone`]).
    suspects: Vec<DomId>,
    doomed: Vec<(u64, &'static str)>,
    out: Vec<Outgoing>,
    scratch: Vec<u8>,
    stop: bool,
    last_sweep: Instant,
    /// Unprivileged connections (their stalled-event sweep needs a timer).
    guests: usize,
}

fn epoll_err(e: rustix::io::Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error())
}

/// Raises the soft descriptor limit to the hard one, so that thousands of
/// clients can connect. Returns the new soft limit.
pub fn raise_fd_limit() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut l = getrlimit(Resource::Nofile);
    if l.current != l.maximum {
        l.current = l.maximum;
        setrlimit(Resource::Nofile, l).ok()?;
    }
    l.current
}

impl<H: DomainHook> Daemon<H> {
    /// A daemon with no listener yet.
    pub fn new(quotas: Quotas, limits: Limits, hook: H) -> io::Result<Self> {
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(epoll_err)?;
        Ok(Self {
            store: Store::new(quotas),
            epoll,
            listener: None,
            listener_paused: false,
            socket_path: None,
            signals: None,
            conns: HashMap::new(),
            scratch: vec![0; limits.read_chunk.max(4096)],
            limits,
            hook,
            pending: Vec::new(),
            dirty: Vec::new(),
            prepared: HashMap::new(),
            suspects: Vec::new(),
            doomed: Vec::new(),
            out: Vec::new(),
            stop: false,
            last_sweep: Instant::now(),
            guests: 0,
        })
    }

    /// Listens on a Unix socket for dom0 clients, replacing a stale socket
    /// file but never one a live daemon serves.
    pub fn listen(&mut self, path: &Path) -> io::Result<()> {
        if let Ok(md) = std::fs::symlink_metadata(path) {
            if md.file_type().is_socket() {
                if std::os::unix::net::UnixStream::connect(path).is_ok() {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("a running xenstored already serves {}", path.display()),
                    ));
                }
                std::fs::remove_file(path)?;
            } else {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a socket", path.display()),
                ));
            }
        }
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir)?;
            }
        }
        let l = UnixListener::bind(path)?;
        l.set_nonblocking(true)?;
        epoll::add(
            &self.epoll,
            &l,
            EventData::new_u64(LISTENER),
            EventFlags::IN,
        )
        .map_err(epoll_err)?;
        self.listener = Some(l);
        self.socket_path = Some(path.to_owned());
        Ok(())
    }

    /// Stops cleanly on SIGTERM, SIGINT or SIGHUP.
    pub fn stop_on_signals(&mut self) -> io::Result<()> {
        let s = TermSignals::new()?;
        epoll::add(&self.epoll, &s, EventData::new_u64(SIGNALS), EventFlags::IN)
            .map_err(epoll_err)?;
        self.signals = Some(s);
        Ok(())
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Number of open connections.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// The domain hook.
    pub fn hook(&self) -> &H {
        &self.hook
    }

    /// Serves a connection with the given identity.
    pub fn add_connection(
        &mut self,
        transport: Box<dyn Transport>,
        identity: Identity,
    ) -> io::Result<ConnId> {
        let id = self.store.connect(identity);
        let mut c = Conn::new(id, identity, transport);
        c.interest = EventFlags::IN | EventFlags::RDHUP;
        if let Err(e) = epoll::add(
            &self.epoll,
            c.transport.fd(),
            EventData::new_u64(id.0),
            c.interest,
        ) {
            self.store.disconnect(id);
            return Err(epoll_err(e));
        }
        tracing::debug!(conn = id.0, peer = c.transport.describe(), "connected");
        if !identity.privileged {
            self.guests += 1;
        }
        self.conns.insert(id.0, c);
        Ok(id)
    }

    /// Runs until a termination signal (or forever without one).
    pub fn run(&mut self) -> io::Result<()> {
        let mut events: Vec<epoll::Event> = Vec::with_capacity(512);
        let sweep = rustix::time::Timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        while !self.stop {
            events.clear();
            let timeout = if !self.pending.is_empty() {
                Some(&zero)
            } else if self.guests > 0 || self.hook.watching() {
                Some(&sweep)
            } else {
                None
            };
            match epoll::wait(
                &self.epoll,
                rustix::buffer::spare_capacity(&mut events),
                timeout,
            ) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(epoll_err(e)),
            }
            for ev in &events {
                let flags = ev.flags;
                match ev.data.u64() {
                    LISTENER => self.accept(),
                    SIGNALS => self.on_signal(),
                    id => self.on_conn_event(id, flags),
                }
            }
            for id in std::mem::take(&mut self.pending) {
                self.progress(id);
            }
            let now = Instant::now();
            let sweep_due = now.duration_since(self.last_sweep) >= Duration::from_secs(1);
            if sweep_due {
                self.last_sweep = now;
                self.sweep_stalled(now);
            }
            self.check_domains(sweep_due);
            self.domain_changes();
            self.flush_dirty();
            self.close_doomed();
        }
        tracing::info!(connections = self.conns.len(), "xenstored stopping");
        Ok(())
    }

    fn on_signal(&mut self) {
        if let Some(s) = &self.signals {
            while let Some(sig) = s.take() {
                tracing::info!(signal = sig, "termination signal");
                self.stop = true;
            }
        }
    }

    fn accept(&mut self) {
        for _ in 0..self.limits.accepts_per_round {
            let Some(l) = &self.listener else { return };
            match l.accept() {
                Ok((stream, _)) => {
                    let r = SocketTransport::new(stream)
                        .and_then(|t| self.add_connection(Box::new(t), Identity::DOM0));
                    if let Err(e) = r {
                        tracing::warn!(error = %e, "cannot serve new connection");
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors: stop accepting until one closes,
                    // rather than spinning on a listener that stays readable.
                    tracing::warn!(error = %e, "accept failed; pausing the listener");
                    if let Some(l) = &self.listener {
                        let _ = epoll::delete(&self.epoll, l);
                    }
                    self.listener_paused = true;
                    return;
                }
            }
        }
    }

    fn on_conn_event(&mut self, id: u64, flags: EventFlags) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let has_output = c.has_output();
        if !c.transport.poll_writable() {
            self.on_doorbell(id);
            return;
        }
        if flags.contains(EventFlags::OUT) {
            self.mark_dirty(id);
        }
        if flags.intersects(EventFlags::IN | EventFlags::HUP | EventFlags::ERR | EventFlags::RDHUP)
            && !self.paused(id)
        {
            self.fill_and_serve(id);
        } else if flags.intersects(EventFlags::HUP | EventFlags::ERR) && !has_output {
            self.doomed.push((id, "hang-up"));
        }
    }

    /// A ring's event channel fired: it may announce requests, freed reply
    /// space, a reset request or the guest's death, and it stays armed
    /// while the connection is paused.
    fn on_doorbell(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        match c.transport.wake() {
            Ok(Wake::News) => {}
            Ok(Wake::Nothing) => {
                if !c.identity.privileged {
                    self.suspects.push(c.identity.domid);
                }
            }
            Ok(Wake::Reset) => {
                self.reset_connection(id);
                return;
            }
            Err(e) => {
                tracing::warn!(conn = id, error = %e, "event channel failed");
                self.doomed.push((id, "event channel error"));
                return;
            }
        }
        if c.has_output() {
            self.mark_dirty(id);
        }
        if self.paused(id) {
            if let Some(c) = self.conns.get_mut(&id) {
                c.needs_fill = true;
            }
        } else {
            self.fill_and_serve(id);
        }
    }

    /// One read from the connection, then its buffered requests.
    fn fill_and_serve(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.needs_fill = false;
        match c.fill(&mut self.scratch) {
            Ok(Fill::Data) | Ok(Fill::Empty) => {}
            Ok(Fill::Eof) => {
                c.eof = true;
                self.mark_dirty(id);
            }
            Err(e) => {
                if e.kind() == io::ErrorKind::InvalidData {
                    tracing::warn!(conn = id, peer = c.transport.describe(), error = %e, "hostile peer");
                    self.doomed.push((id, "hostile peer"));
                } else {
                    tracing::debug!(conn = id, error = %e, "read failed");
                    self.doomed.push((id, "read error"));
                }
                return;
            }
        }
        self.serve(id);
    }

    /// A connection in the pending list: more buffered requests, or a
    /// doorbell connection that was paused with input possibly waiting.
    fn progress(&mut self, id: u64) {
        let needs_fill = self.conns.get(&id).is_some_and(|c| c.needs_fill);
        if needs_fill && !self.paused(id) {
            self.fill_and_serve(id);
        } else {
            self.serve(id);
        }
    }

    /// The ring reconnection protocol: the guest asked for a clean slate.
    fn reset_connection(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.clear();
        self.store.reset_connection(c.id);
        match c.transport.reset() {
            Ok(()) => tracing::info!(
                conn = id,
                peer = c.transport.describe(),
                "connection reset at the peer's request"
            ),
            Err(e) => {
                tracing::warn!(conn = id, error = %e, "connection reset failed");
                self.doomed.push((id, "reset failed"));
            }
        }
    }

    /// Whether a connection is not read for now: too much output queued, or
    /// a guest with too many unanswered requests.
    fn paused(&self, id: u64) -> bool {
        self.conns.get(&id).is_some_and(|c| {
            c.out_bytes >= self.limits.pause_output_bytes
                || (!c.identity.privileged
                    && c.replies_queued >= self.store.quotas().outstanding_per_domain)
        })
    }

    fn mark_dirty(&mut self, id: u64) {
        if let Some(c) = self.conns.get_mut(&id) {
            if !c.dirty {
                c.dirty = true;
                self.dirty.push(id);
            }
        }
    }

    /// Answers buffered requests of one connection, up to the per-round limit.
    fn serve(&mut self, id: u64) {
        let mut served = 0;
        loop {
            if self.paused(id) {
                break;
            }
            let Some(c) = self.conns.get_mut(&id) else {
                return;
            };
            match c.next_frame() {
                Ok(Some((hdr, payload))) => {
                    let len = payload.len();
                    if c.identity.privileged && hdr.ty == MsgType::Introduce as u32 {
                        let (conn, payload) = (c.id, payload.to_vec());
                        c.consume(len);
                        self.introduce(conn, &hdr, &payload);
                    } else {
                        self.store.process(c.id, &hdr, payload, &mut self.out);
                        c.consume(len);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(conn = id, peer = c.transport.describe(), error = %e,
                        "framing violation; dropping connection");
                    c.transport.protocol_error();
                    self.doomed.push((id, "framing violation"));
                    return;
                }
            }
            self.route();
            served += 1;
            if served == self.limits.requests_per_round {
                if self.conns.get(&id).is_some_and(Conn::has_frame) {
                    self.pending.push(id);
                }
                break;
            }
        }
        self.mark_dirty(id);
    }

    /// XS_INTRODUCE from dom0: a new domain's ring is mapped and its event
    /// channel bound *before* the store records it, so that a failure is
    /// the reply (as in C xenstored); the store then answers and fires
    /// `@introduceDomain`, and [`Self::domain_changes`] serves the ring.
    fn introduce(&mut self, conn: ConnId, hdr: &Header, payload: &[u8]) {
        if let Ok(Request::Introduce { domid, mfn, port }) =
            codec::parse_request(hdr.ty, payload, &ParseCtx::DOM0)
        {
            if domid != 0 && domid < DOMID_SELF && !self.store.is_introduced(domid) {
                let info = DomainInfo {
                    domid,
                    mfn,
                    port,
                    shutdown: false,
                };
                match self.hook.introduced(&info) {
                    Ok(t) => {
                        self.prepared.insert(domid, t);
                    }
                    Err(e) => {
                        tracing::warn!(domid, mfn, port, error = %e, "cannot introduce domain");
                        self.store
                            .error_reply(conn, hdr, io_to_xs(&e), &mut self.out);
                        return;
                    }
                }
            }
        }
        self.store.process(conn, hdr, payload, &mut self.out);
    }

    /// Moves the store's output to the connections' queues.
    fn route(&mut self) {
        let now = Instant::now();
        for o in self.out.drain(..) {
            let Some(c) = self.conns.get_mut(&o.conn.0) else {
                continue;
            };
            c.enqueue(o.msg, o.is_event, now);
            if c.out_bytes > self.limits.max_output_bytes {
                self.doomed.push((o.conn.0, "output queue overflow"));
            }
            if !c.dirty {
                c.dirty = true;
                self.dirty.push(o.conn.0);
            }
        }
    }

    fn flush_dirty(&mut self) {
        for id in std::mem::take(&mut self.dirty) {
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            c.dirty = false;
            let was_paused = self.paused(id);
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            match c.flush() {
                Ok(done) => {
                    if done && c.eof {
                        self.doomed.push((id, "closed by peer"));
                        continue;
                    }
                }
                Err(e) => {
                    tracing::debug!(conn = id, error = %e, "write failed");
                    self.doomed.push((id, "write error"));
                    continue;
                }
            }
            if was_paused
                && !self.paused(id)
                && self
                    .conns
                    .get(&id)
                    .is_some_and(|c| c.needs_fill || c.has_frame())
            {
                self.pending.push(id);
            }
            self.update_interest(id);
        }
    }

    fn update_interest(&mut self, id: u64) {
        let paused = self.paused(id);
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let mut want = EventFlags::RDHUP;
        // A doorbell also announces freed output space: always armed.
        if (!paused || !c.transport.poll_writable()) && !c.eof {
            want |= EventFlags::IN;
        }
        if c.has_output() && c.transport.poll_writable() {
            want |= EventFlags::OUT;
        }
        if want != c.interest {
            c.interest = want;
            if let Err(e) =
                epoll::modify(&self.epoll, c.transport.fd(), EventData::new_u64(id), want)
            {
                tracing::warn!(conn = id, error = %e, "epoll modify failed");
                self.doomed.push((id, "epoll error"));
            }
        }
    }

    /// Asks the hook which introduced domains died, and releases them.
    fn check_domains(&mut self, sweep: bool) {
        if self.suspects.is_empty() && !sweep {
            return;
        }
        let suspects = std::mem::take(&mut self.suspects);
        for domid in self.hook.gone(&suspects, sweep) {
            if self.store.domain_gone(domid, &mut self.out) {
                tracing::info!(domid, "domain is gone; released");
                self.route();
            }
        }
    }

    fn guest_conns(&self, domid: DomId) -> Vec<u64> {
        let guest = Identity::guest(domid);
        self.conns
            .values()
            .filter(|c| c.identity == guest)
            .map(|c| c.id.0)
            .collect()
    }

    fn domain_changes(&mut self) {
        for change in self.store.take_domain_changes() {
            match change {
                DomainChange::Introduced(info) => {
                    let t = match self.prepared.remove(&info.domid) {
                        Some(t) => Ok(t),
                        None => self.hook.introduced(&info),
                    };
                    match t {
                        Ok(Some(t)) => {
                            if let Err(e) = self.add_connection(t, Identity::guest(info.domid)) {
                                tracing::warn!(domid = info.domid, error = %e, "cannot serve domain");
                            } else {
                                tracing::info!(
                                    domid = info.domid,
                                    mfn = info.mfn,
                                    port = info.port,
                                    "domain introduced"
                                );
                            }
                        }
                        Ok(None) => {}
                        Err(e) => tracing::warn!(domid = info.domid, error = %e, "introduce hook"),
                    }
                }
                DomainChange::Reintroduced(info) => match self.hook.reintroduced(&info) {
                    Ok(Some(t)) => {
                        for id in self.guest_conns(info.domid) {
                            self.close(id, "domain re-introduced");
                        }
                        if let Err(e) = self.add_connection(t, Identity::guest(info.domid)) {
                            tracing::warn!(domid = info.domid, error = %e, "cannot serve domain");
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(domid = info.domid, error = %e, "cannot re-introduce domain")
                    }
                },
                DomainChange::Released(domid) => {
                    for id in self.guest_conns(domid) {
                        self.close(id, "domain released");
                    }
                    self.prepared.remove(&domid);
                    self.hook.released(domid);
                }
            }
        }
        // Prepared for an XS_INTRODUCE the store then refused.
        for (domid, t) in std::mem::take(&mut self.prepared) {
            drop(t);
            self.hook.released(domid);
        }
    }

    /// Drops guests whose watch events have waited too long.
    fn sweep_stalled(&mut self, now: Instant) {
        let timeout = self.limits.event_timeout;
        for c in self.conns.values() {
            if !c.identity.privileged
                && c.oldest_event()
                    .is_some_and(|t| now.duration_since(t) > timeout)
            {
                self.doomed.push((c.id.0, "watch events not consumed"));
            }
        }
    }

    fn close_doomed(&mut self) {
        for (id, why) in std::mem::take(&mut self.doomed) {
            self.close(id, why);
        }
    }

    fn close(&mut self, id: u64, why: &str) {
        let Some(c) = self.conns.remove(&id) else {
            return;
        };
        let _ = epoll::delete(&self.epoll, c.transport.fd());
        self.store.disconnect(c.id);
        if !c.identity.privileged {
            self.guests -= 1;
        }
        if why == "closed by peer" {
            tracing::debug!(conn = id, "disconnected");
        } else {
            tracing::info!(
                conn = id,
                peer = c.transport.describe(),
                reason = why,
                "connection dropped"
            );
        }
        if self.listener_paused {
            if let Some(l) = &self.listener {
                if epoll::add(&self.epoll, l, EventData::new_u64(LISTENER), EventFlags::IN).is_ok()
                {
                    self.listener_paused = false;
                }
            }
        }
    }
}

impl<H: DomainHook> Drop for Daemon<H> {
    fn drop(&mut self) {
        if let (Some(l), Some(p)) = (self.listener.take(), self.socket_path.take()) {
            drop(l);
            let _ = std::fs::remove_file(&p);
        }
    }
}

/// The xenstore error that answers an XS_INTRODUCE the hook refused.
fn io_to_xs(e: &io::Error) -> XsError {
    match e.kind() {
        io::ErrorKind::NotFound => XsError::Enoent,
        io::ErrorKind::PermissionDenied => XsError::Eacces,
        io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData => XsError::Einval,
        _ => XsError::Eio,
    }
}

/// `pvio xenstored`: serves the socket until SIGTERM/SIGINT/SIGHUP, then
/// removes it. With `hvd_socket`, introduced guests are served on their
/// xenbus rings.
pub fn serve(config: Config) -> io::Result<()> {
    match &config.hvd_socket {
        Some(hvd) => {
            let hook = HvHook::connect(hvd)?;
            tracing::info!(hvd = %hvd.display(), "serving guests on their xenbus rings");
            serve_with(config, hook)
        }
        None => serve_with(config, RecordOnly),
    }
}

fn serve_with<H: DomainHook>(config: Config, hook: H) -> io::Result<()> {
    let nofile = raise_fd_limit();
    let mut d = Daemon::new(config.quotas, config.limits, hook)?;
    d.stop_on_signals()?;
    d.listen(&config.socket)?;
    tracing::info!(
        socket = %config.socket.display(),
        fd_limit = nofile,
        "xenstored listening"
    );
    d.run()
}
