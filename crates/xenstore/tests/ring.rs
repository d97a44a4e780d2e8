//! The daemon serving guests on xenbus rings, in one process without hvd:
//! the hook hands out [`RingTransport`]s over private pages and event
//! channels made of two eventfds, and the guests are [`Client`]s over the
//! same pages (or raw ring ends playing hostile guests). Checks the guest's
//! identity, permissions and quotas, pipelining past the `outstanding`
//! quota, large messages crossing the 1 KiB ring, the reconnection
//! protocol, hostile indices and lengths, a flooding guest that never reads,
//! and domain death.

use pvio_abi::xs_wire::{
    XENSTORE_CONNECTED, XENSTORE_ERROR_PROTO, XENSTORE_ERROR_RINGIDX, XENSTORE_RECONNECT,
};
use pvio_abi::DomId;
use pvio_hv::EventChannel;
use pvio_ring::AnonRingMemory;
use pvio_xenstore::codec::{encode_message, Header, HEADER_LEN};
use pvio_xenstore::daemon::{Daemon, DomainHook, Limits, RingTransport, Transport};
use pvio_xenstore::ring::{End, Field, XenbusRing};
use pvio_xenstore::store::domain::DomainInfo;
use pvio_xenstore::store::quota::Quotas;
use pvio_xenstore::{Client, Error, Perms, XsError};
use std::io;
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(20);

type Page = Arc<AnonRingMemory>;

fn eventfd() -> std::os::fd::OwnedFd {
    rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap()
}

/// Both ends of an event channel without hvd.
fn channel_pair(domid: DomId) -> (EventChannel, EventChannel) {
    let (a, b) = (eventfd(), eventfd());
    let dup = |f: &std::os::fd::OwnedFd| f.try_clone().unwrap();
    (
        EventChannel::from_fds(1, domid, dup(&a), dup(&b)),
        EventChannel::from_fds(1, 0, b, a),
    )
}

#[derive(Default)]
struct Shared {
    /// Domains the test declares dead.
    dead: Vec<DomId>,
    /// Every suspect the daemon reported.
    suspects: Vec<DomId>,
}

struct PageHook {
    guests: mpsc::Sender<(DomId, Page, EventChannel)>,
    shared: Arc<Mutex<Shared>>,
}

impl DomainHook for PageHook {
    fn introduced(&mut self, info: &DomainInfo) -> io::Result<Option<Box<dyn Transport>>> {
        if info.mfn == 666 {
            return Err(io::Error::new(io::ErrorKind::NotFound, "no such domain"));
        }
        let page = Arc::new(AnonRingMemory::new(1));
        let (ours, theirs) = channel_pair(info.domid);
        let t = RingTransport::new(page.clone(), ours, info.domid, false, None)?;
        let _ = self.guests.send((info.domid, page, theirs));
        Ok(Some(Box::new(t)))
    }

    fn gone(&mut self, suspects: &[DomId], _sweep: bool) -> Vec<DomId> {
        let mut s = self.shared.lock().unwrap();
        s.suspects.extend_from_slice(suspects);
        std::mem::take(&mut s.dead)
    }

    fn watching(&self) -> bool {
        true
    }
}

struct Host {
    dom0: Client,
    guests: mpsc::Receiver<(DomId, Page, EventChannel)>,
    shared: Arc<Mutex<Shared>>,
    dir: PathBuf,
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn host(name: &str, quotas: Quotas) -> Host {
    let dir = std::env::temp_dir().join(format!("pvio-xs-ring-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("sock");
    let (tx, rx) = mpsc::channel();
    let shared = Arc::new(Mutex::new(Shared::default()));
    let hook = PageHook {
        guests: tx,
        shared: shared.clone(),
    };
    let mut d = Daemon::new(quotas, Limits::default(), hook).unwrap();
    d.listen(&sock).unwrap();
    std::thread::spawn(move || d.run());
    Host {
        dom0: Client::connect(&sock).await.unwrap(),
        guests: rx,
        shared,
        dir,
    }
}

impl Host {
    /// The toolstack's part: home owned by the guest, then XS_INTRODUCE.
    async fn introduce(&self, domid: DomId) -> (Page, EventChannel) {
        let home = format!("/local/domain/{domid}");
        self.dom0.mkdir(&home).await.unwrap();
        self.dom0
            .set_perms(
                &home,
                &Perms::parse([format!("n{domid}").as_bytes()]).unwrap(),
            )
            .await
            .unwrap();
        // Created after the home's permissions, so it inherits them.
        self.dom0
            .write(&format!("{home}/name"), "vm")
            .await
            .unwrap();
        self.dom0.introduce(domid, 1, 1).await.unwrap();
        let (d, page, chan) = self.guests.recv_timeout(DEADLINE).unwrap();
        assert_eq!(d, domid);
        (page, chan)
    }

    async fn connections(&self, domid: DomId) -> Option<u32> {
        let text = self
            .dom0
            .control(&["quota", &domid.to_string()])
            .await
            .ok()?;
        let line = text.lines().find(|l| l.starts_with("connections"))?;
        line.split(':').nth(1)?.trim().parse().ok()
    }
}

async fn wait_for<F: AsyncFnMut() -> bool>(what: &str, mut cond: F) {
    let end = Instant::now() + DEADLINE;
    while !cond().await {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn xs(e: Result<impl std::fmt::Debug, Error>) -> XsError {
    e.unwrap_err().xs().expect("a xenstore error")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_is_served_on_its_ring_with_its_identity() {
    let h = host(
        "serve",
        Quotas {
            nodes_per_domain: 40,
            ..Quotas::default()
        },
    )
    .await;
    h.dom0.write("/local/domain/6/private", "no").await.unwrap();
    h.dom0
        .set_perms("/local/domain/6", &Perms::parse([&b"n6"[..]]).unwrap())
        .await
        .unwrap();
    let (page, chan) = h.introduce(5).await;
    let g = Client::connect_ring_page(page, chan).await.unwrap();

    // Relative and absolute paths land in its home.
    g.write("data/a", "1").await.unwrap();
    assert_eq!(g.read_string("/local/domain/5/data/a").await.unwrap(), "1");
    assert_eq!(g.read_string("name").await.unwrap(), "vm");
    assert_eq!(g.get_domain_path(5).await.unwrap(), "/local/domain/5");
    assert_eq!(
        h.dom0
            .get_perms("/local/domain/5/data/a")
            .await
            .unwrap()
            .to_string(),
        "n5"
    );
    // Nothing of dom0's or another guest's.
    assert_eq!(xs(g.read("/tool").await), XsError::Eacces);
    assert_eq!(xs(g.write("/tool/x", "1").await), XsError::Eacces);
    assert_eq!(xs(g.read("/local/domain/6/private").await), XsError::Eacces);
    assert_eq!(xs(g.is_domain_introduced(5).await), XsError::Eacces);
    assert!(h.dom0.is_domain_introduced(5).await.unwrap());

    // A relative watch reports relative paths.
    let mut w = g.watch("data").await.unwrap();
    assert_eq!(w.next().await.unwrap().path, "data");
    h.dom0.write("/local/domain/5/data/b", "2").await.unwrap();
    assert_eq!(w.next().await.unwrap().path, "data/b");

    // Transactions retry on conflict.
    let n = g
        .transaction(async |t| {
            let v: u32 = t.read_string("data/a").await?.parse().unwrap();
            t.write("data/a", (v + 1).to_string()).await?;
            Ok(v + 1)
        })
        .await
        .unwrap();
    assert_eq!(n, 2);

    // A value near the payload limit crosses the 1 KiB ring in pieces.
    let big = "x".repeat(1900);
    g.write("data/big", &big).await.unwrap();
    assert_eq!(g.read_string("data/big").await.unwrap(), big);
    assert_eq!(
        xs(g.write("data/huge", "y".repeat(3000)).await),
        XsError::Enospc
    );

    // Far more requests in flight than the `outstanding` quota (20): the
    // guest is throttled, never dropped, and every request is answered.
    let mut set = tokio::task::JoinSet::new();
    for i in 0..300 {
        let g = g.clone();
        set.spawn(async move {
            if i % 3 == 0 {
                g.write(&format!("data/p{}", i % 9), i.to_string()).await
            } else {
                g.read("data/a").await.map(drop)
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap().unwrap();
    }

    // The node quota holds: home(1) + name + data + a, b, big, p0..p8.
    let mut made = 0;
    let err = loop {
        match g.write(&format!("fill/n{made}"), "x").await {
            Ok(()) => made += 1,
            Err(e) => break e,
        }
        assert!(made < 100, "quota not enforced");
    };
    assert_eq!(err.xs(), Some(XsError::Enospc));
    assert_eq!(
        h.dom0
            .directory("/local/domain/5/fill")
            .await
            .unwrap()
            .len(),
        made
    );
    assert_eq!(h.connections(5).await, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn introduce_failure_is_the_reply() {
    let h = host("fail", Quotas::default()).await;
    let mut w = h.dom0.watch("@introduceDomain").await.unwrap();
    w.next().await.unwrap();
    assert_eq!(xs(h.dom0.introduce(9, 666, 1).await), XsError::Enoent);
    assert!(!h.dom0.is_domain_introduced(9).await.unwrap());
    // Invalid requests never reach the hook.
    assert_eq!(xs(h.dom0.introduce(0, 1, 1).await), XsError::Einval);
    h.introduce(9).await;
    assert!(h.dom0.is_domain_introduced(9).await.unwrap());
    let ev = w.next().await.unwrap();
    assert_eq!(ev.path, "@introduceDomain");
    assert!(w.try_next().is_none(), "one event, for the success");
}

/// A raw guest end: request bytes in, reply bytes out.
struct RawGuest {
    ring: XenbusRing<Page>,
    chan: EventChannel,
    got: Vec<u8>,
}

impl RawGuest {
    fn new(page: Page, chan: EventChannel) -> Self {
        Self {
            ring: XenbusRing::attach(page, End::Guest).unwrap(),
            chan,
            got: Vec::new(),
        }
    }

    fn send(&mut self, ty: u32, req_id: u32, payload: &[u8]) {
        let mut m = Vec::new();
        encode_message(&mut m, ty, req_id, 0, payload);
        assert_eq!(self.ring.write(&m).unwrap(), m.len());
        self.chan.notify().unwrap();
    }

    fn recv(&mut self) -> (Header, Vec<u8>) {
        let end = Instant::now() + DEADLINE;
        loop {
            if let Some(h) = Header::decode(&self.got) {
                let total = HEADER_LEN + h.len as usize;
                if self.got.len() >= total {
                    let body = self.got[HEADER_LEN..total].to_vec();
                    self.got.drain(..total);
                    return (h, body);
                }
            }
            let mut buf = [0u8; 1024];
            let n = self.ring.read(&mut buf).unwrap();
            if n > 0 {
                self.chan.notify().unwrap();
                self.got.extend_from_slice(&buf[..n]);
                continue;
            }
            assert!(Instant::now() < end, "no reply");
            self.chan.wait_timeout(Duration::from_millis(50)).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ring_reconnection_starts_afresh() {
    let h = host("reconnect", Quotas::default()).await;
    let (page, chan) = h.introduce(7).await;
    let mut g = RawGuest::new(page, chan);
    assert_eq!(g.ring.load(Field::ServerFeatures), 3);
    g.send(4, 1, b"name\0tok\0");
    assert_eq!(g.recv().1, b"OK\0");
    assert_eq!(g.recv().0.ty, 15, "the watch's first event");
    // Half a request, then a reset.
    g.ring.write(&[2, 0, 0, 0, 9]).unwrap();
    g.ring.store(Field::Connection, XENSTORE_RECONNECT);
    g.chan.notify().unwrap();
    let end = Instant::now() + DEADLINE;
    while g.ring.load(Field::Connection) != XENSTORE_CONNECTED {
        assert!(Instant::now() < end, "no reconnection");
        g.chan.wait_timeout(Duration::from_millis(50)).unwrap();
    }
    for f in [
        Field::ReqCons,
        Field::ReqProd,
        Field::RspCons,
        Field::RspProd,
    ] {
        assert_eq!(g.ring.load(f), 0);
    }
    g.ring.resync();
    // The watch is gone: a change to `name` sends nothing; the next reply
    // is the first thing on the fresh ring.
    h.dom0
        .write("/local/domain/7/name", "renamed")
        .await
        .unwrap();
    g.send(2, 2, b"name\0");
    let (hdr, body) = g.recv();
    assert_eq!(
        (hdr.ty, hdr.req_id, body.as_slice()),
        (2, 2, &b"renamed"[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_guests_are_cut_off_alone() {
    let h = host("hostile", Quotas::default()).await;
    let (page, chan) = h.introduce(11).await;
    let good = Client::connect_ring_page(page, chan).await.unwrap();
    good.write("alive", "1").await.unwrap();

    // Guest 12 claims 5000 bytes of requests in a 1024-byte ring.
    let (page, chan) = h.introduce(12).await;
    let bad = RawGuest::new(page, chan);
    let cons = bad.ring.load(Field::ReqCons);
    bad.ring.store(Field::ReqProd, cons.wrapping_add(5000));
    bad.chan.notify().unwrap();
    // Guest 13 announces a 100000-byte request.
    let (page, chan) = h.introduce(13).await;
    let mut long = RawGuest::new(page, chan);
    let mut hdr = Vec::new();
    encode_message(&mut hdr, 11, 1, 0, b"");
    hdr[12..16].copy_from_slice(&100_000u32.to_ne_bytes());
    long.ring.write(&hdr).unwrap();
    long.chan.notify().unwrap();

    // Guest 14 floods requests and never reads a reply: throttled by the
    // `outstanding` quota and its full reply ring, never starving others.
    let (page, chan) = h.introduce(14).await;
    let mut flood = RawGuest::new(page, chan);
    let mut req = Vec::new();
    encode_message(&mut req, 2, 1, 0, b"name\0");
    for _ in 0..200 {
        while flood.ring.writable().unwrap() as usize >= req.len() {
            flood.ring.write(&req).unwrap();
        }
        flood.chan.notify().unwrap();
        assert_eq!(good.read_string("alive").await.unwrap(), "1");
    }
    assert_eq!(h.connections(14).await, Some(1), "throttled, not dropped");
    let (hdr, body) = flood.recv();
    assert_eq!(
        (hdr.ty, body.as_slice()),
        (2, &b"vm"[..]),
        "and still served"
    );

    wait_for("the error words", async || {
        bad.ring.load(Field::Error) == XENSTORE_ERROR_RINGIDX
            && long.ring.load(Field::Error) == XENSTORE_ERROR_PROTO
    })
    .await;
    wait_for("the connections to go", async || {
        h.connections(12).await == Some(0) && h.connections(13).await == Some(0)
    })
    .await;
    // Still introduced (released when they die), and nobody else noticed.
    assert!(h.dom0.is_domain_introduced(12).await.unwrap());
    assert_eq!(good.read_string("alive").await.unwrap(), "1");
    assert_eq!(h.connections(11).await, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_domain_is_released() {
    let h = host("death", Quotas::default()).await;
    let mut rel = h.dom0.watch("@releaseDomain").await.unwrap();
    rel.next().await.unwrap();
    let (page, chan) = h.introduce(21).await;
    let g = Client::connect_ring_page(page, chan).await.unwrap();
    g.write("state", "running").await.unwrap();
    // The hook reports it gone (at the next sweep, within a second).
    h.shared.lock().unwrap().dead.push(21);
    let ev = tokio::time::timeout(DEADLINE, rel.next()).await.unwrap();
    assert_eq!(ev.unwrap().path, "@releaseDomain");
    assert!(!h.dom0.is_domain_introduced(21).await.unwrap());
    assert!(!h.dom0.exists("/local/domain/21").await.unwrap());
    wait_for("the connection to close", async || {
        h.connections(21).await.is_none()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_up_with_nothing_new_makes_a_suspect() {
    let h = host("suspect", Quotas::default()).await;
    let (page, chan) = h.introduce(31).await;
    let mut g = RawGuest::new(page, chan);
    g.send(2, 1, b"name\0");
    assert_eq!(g.recv().1, b"vm");
    h.shared.lock().unwrap().suspects.clear();
    // Notify with nothing new (again, in case the first one merged with
    // the notification of consuming the reply).
    wait_for("the suspect", async || {
        g.chan.notify().unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        h.shared.lock().unwrap().suspects.contains(&31)
    })
    .await;
}
