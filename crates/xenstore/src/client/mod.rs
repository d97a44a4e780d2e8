//! The async xenstore client (tokio) every pvio crate uses: read, write,
//! mkdir, rm, directory, permissions, watches and transactions with
//! automatic retry on EAGAIN, over the daemon's Unix socket (dom0 tools,
//! [`Client::connect`]) or over a guest's own xenbus ring
//! ([`Client::connect_ring`], see [`ring_stream`]).
//!
//! Everything above the byte stream is shared by the two: one background
//! task reads the stream and hands each reply to the request with its
//! `req_id` and each watch event to its [`Watcher`]; requests are written
//! directly by the calling task, so a round trip costs one write, one
//! wake-up of the reader and one of the caller.

pub mod ring_stream;

use crate::codec::{encode_message, Header, MsgType, HEADER_LEN};
use crate::error::{Error, XsError};
use crate::perms::Perms;
use pvio_abi::xs_wire::XENSTORE_PAYLOAD_MAX;
use pvio_abi::DomId;
use pvio_hv::{EventChannel, GuestMemory};
use pvio_ring::{GuestPages, RingMemory};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

/// Where [`Client::connect_env`] looks when `XENSTORED_PATH` is unset.
pub const DEFAULT_SOCKET: &str = "/run/pvio/xenstored.sock";

/// How often [`Client::transaction`] retries a transaction that keeps
/// failing with EAGAIN before giving up.
pub const TRANSACTION_RETRIES: usize = 64;

type Reply = Result<(u32, Vec<u8>), Error>;

/// The receiving half of a client's byte stream.
pub type StreamReader = Box<dyn AsyncRead + Send + Unpin>;
/// The sending half of a client's byte stream.
pub type StreamWriter = Box<dyn AsyncWrite + Send + Unpin>;

struct Inner {
    writer: tokio::sync::Mutex<StreamWriter>,
    pending: Mutex<HashMap<u32, oneshot::Sender<Reply>>>,
    watches: Mutex<HashMap<Vec<u8>, mpsc::UnboundedSender<WatchEvent>>>,
    next_req: AtomicU32,
    next_token: AtomicU64,
    closed: AtomicBool,
    reader: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Bounds this connection's open transactions.
    tx_slots: Arc<tokio::sync::Semaphore>,
}

/// Transactions a guest's client keeps open at once: below xenstored's
/// default per-domain quota (10), so concurrent tasks of one guest (e.g.
/// disks connecting in parallel) wait for a slot instead of failing with
/// ENOSPC. Dom0's socket connections are exempt from quotas and get
/// [`MAX_OPEN_TRANSACTIONS_DOM0`].
pub const MAX_OPEN_TRANSACTIONS: usize = 8;
/// Transactions a dom0 (socket) client keeps open at once.
pub const MAX_OPEN_TRANSACTIONS_DOM0: usize = 1024;

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(mut r) = self.reader.lock() {
            if let Some(h) = r.take() {
                h.abort();
            }
        }
    }
}

/// A connection to `pvio xenstored` (or any xenstore daemon on a socket),
/// or a guest's connection over its xenbus ring. Cheap to clone; clones
/// share the connection.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

/// A watch event: the path that changed (relative if the watch was) and
/// the watch's token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    pub path: String,
    pub token: Vec<u8>,
}

/// A registered watch. Events arrive in order; the first one arrives at
/// once after registration. Dropping it stops delivery and unregisters the
/// watch in the background.
pub struct Watcher {
    client: Client,
    path: String,
    token: Vec<u8>,
    rx: mpsc::UnboundedReceiver<WatchEvent>,
    active: bool,
}

/// An open transaction. Operations through it see its own changes; nothing
/// is visible to others before [`Transaction::commit`].
pub struct Transaction<'a> {
    client: &'a Client,
    id: u32,
    done: bool,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

fn path_arg(p: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(p.len() + 1);
    v.extend_from_slice(p.as_bytes());
    v.push(0);
    v
}

fn strings(v: &[u8]) -> Vec<String> {
    let body = v.strip_suffix(&[0]).unwrap_or(v);
    if body.is_empty() {
        return Vec::new();
    }
    body.split(|b| *b == 0)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

async fn reader_task(inner: std::sync::Weak<Inner>, read: StreamReader) {
    let mut r = BufReader::with_capacity(64 * 1024, read);
    let mut hdr = [0u8; HEADER_LEN];
    let result: Result<(), Error> = async {
        loop {
            r.read_exact(&mut hdr).await?;
            let h = Header::decode(&hdr).ok_or_else(|| Error::Protocol("short header".into()))?;
            if h.len as usize > XENSTORE_PAYLOAD_MAX {
                return Err(Error::Protocol(format!("payload of {} bytes", h.len)));
            }
            let mut body = vec![0u8; h.len as usize];
            r.read_exact(&mut body).await?;
            let Some(inner) = inner.upgrade() else {
                return Ok(());
            };
            if h.ty == MsgType::WatchEvent as u32 {
                let mut parts = body.split(|b| *b == 0);
                let path = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
                let token = parts.next().unwrap_or_default().to_vec();
                let tx = inner
                    .watches
                    .lock()
                    .ok()
                    .and_then(|w| w.get(&token).cloned());
                if let Some(tx) = tx {
                    let _ = tx.send(WatchEvent { path, token });
                }
                continue;
            }
            let waiter = inner
                .pending
                .lock()
                .ok()
                .and_then(|mut p| p.remove(&h.req_id));
            match waiter {
                Some(w) => {
                    let _ = w.send(Ok((h.ty, body)));
                }
                None => tracing::warn!(req_id = h.req_id, "xenstore reply for no request"),
            }
        }
    }
    .await;
    if let Some(inner) = inner.upgrade() {
        inner.closed.store(true, Ordering::SeqCst);
        if let Err(e) = &result {
            tracing::debug!(error = %e, "xenstore connection ended");
        }
        if let Ok(mut p) = inner.pending.lock() {
            for (_, w) in p.drain() {
                let _ = w.send(Err(Error::Closed));
            }
        }
        if let Ok(mut w) = inner.watches.lock() {
            w.clear();
        }
    }
}

impl Client {
    /// Connects to the daemon's socket.
    pub async fn connect(path: impl AsRef<Path>) -> Result<Self, Error> {
        let stream = UnixStream::connect(path).await?;
        let (read, write) = stream.into_split();
        Ok(Self::over_with_limit(
            Box::new(read),
            Box::new(write),
            MAX_OPEN_TRANSACTIONS_DOM0,
        ))
    }

    /// A guest's connection over its own xenbus ring: frame
    /// [`pvio_hv::memory::STORE_FRAME`] of `memory`, signalled through its
    /// xenstore event channel `store` (what
    /// [`pvio_hv::HvClient::claim_domain`] returns). The daemon serves it
    /// once the toolstack introduced the domain; requests written before
    /// wait in the ring. Must be called inside a tokio runtime.
    pub async fn connect_ring(
        memory: Arc<GuestMemory>,
        store: EventChannel,
    ) -> Result<Self, Error> {
        let page = GuestPages::new(memory, pvio_hv::memory::STORE_FRAME, 1)
            .map_err(|e| Error::Protocol(format!("no xenbus ring page: {e}")))?;
        Self::connect_ring_page(page, store).await
    }

    /// [`Client::connect_ring`] over any memory holding the ring page.
    pub async fn connect_ring_page<M>(page: M, store: EventChannel) -> Result<Self, Error>
    where
        M: RingMemory + Send + 'static,
    {
        let (read, write) = ring_stream::split(page, store)?;
        Ok(Self::over(Box::new(read), Box::new(write)))
    }

    /// A client over any byte stream carrying the xenstore wire protocol.
    /// Must be called inside a tokio runtime (it spawns the reader task).
    /// At most [`MAX_OPEN_TRANSACTIONS`] transactions are open at once.
    pub fn over(read: StreamReader, write: StreamWriter) -> Self {
        Self::over_with_limit(read, write, MAX_OPEN_TRANSACTIONS)
    }

    /// [`Client::over`] with another bound on open transactions.
    pub fn over_with_limit(read: StreamReader, write: StreamWriter, transactions: usize) -> Self {
        let inner = Arc::new(Inner {
            writer: tokio::sync::Mutex::new(write),
            pending: Mutex::new(HashMap::new()),
            watches: Mutex::new(HashMap::new()),
            next_req: AtomicU32::new(1),
            next_token: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            reader: Mutex::new(None),
            tx_slots: Arc::new(tokio::sync::Semaphore::new(transactions.max(1))),
        });
        let task = tokio::spawn(reader_task(Arc::downgrade(&inner), read));
        if let Ok(mut r) = inner.reader.lock() {
            *r = Some(task);
        }
        Self { inner }
    }

    /// Connects to `$XENSTORED_PATH`, or [`DEFAULT_SOCKET`].
    pub async fn connect_env() -> Result<Self, Error> {
        let p = std::env::var_os("XENSTORED_PATH").unwrap_or_else(|| DEFAULT_SOCKET.into());
        Self::connect(p).await
    }

    /// Sends one request and awaits its reply payload.
    pub async fn request(&self, ty: MsgType, tx_id: u32, payload: &[u8]) -> Result<Vec<u8>, Error> {
        let mut pending = self.send(&[(ty, payload)], tx_id).await?;
        pending.remove(0).reply().await
    }

    /// Sends several requests in one write, then awaits every reply in
    /// order (xenstored answers a connection's requests in order); the
    /// first error is returned once all have answered. One round trip for
    /// a batch of writes instead of one each.
    pub async fn request_many(
        &self,
        tx_id: u32,
        requests: &[(MsgType, Vec<u8>)],
    ) -> Result<Vec<Vec<u8>>, Error> {
        let reqs: Vec<(MsgType, &[u8])> = requests.iter().map(|(t, p)| (*t, &p[..])).collect();
        self.send_all(&reqs, tx_id).await?.into_iter().collect()
    }

    /// Sends several requests in one write and awaits every reply, in
    /// order, whatever each says (none is left behind).
    async fn send_all(
        &self,
        reqs: &[(MsgType, &[u8])],
        tx_id: u32,
    ) -> Result<Vec<Result<Vec<u8>, Error>>, Error> {
        let pending = self.send(reqs, tx_id).await?;
        let mut out = Vec::with_capacity(pending.len());
        for p in pending {
            out.push(p.reply().await);
        }
        Ok(out)
    }

    /// Registers and writes requests; their replies come through the
    /// returned handles.
    async fn send(&self, reqs: &[(MsgType, &[u8])], tx_id: u32) -> Result<Vec<Pending>, Error> {
        if reqs.iter().any(|(_, p)| p.len() > XENSTORE_PAYLOAD_MAX) {
            return Err(Error::Xen(XsError::E2big));
        }
        if self.inner.closed.load(Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        let mut msg = Vec::new();
        let mut pending = Vec::with_capacity(reqs.len());
        for (ty, payload) in reqs {
            let req_id = self.inner.next_req.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = oneshot::channel();
            if let Ok(mut p) = self.inner.pending.lock() {
                p.insert(req_id, tx);
            }
            encode_message(&mut msg, *ty as u32, req_id, tx_id, payload);
            pending.push(Pending {
                ty: *ty,
                req_id,
                rx,
            });
        }
        let sent = self.inner.writer.lock().await.write_all(&msg).await;
        if let Err(e) = sent {
            if let Ok(mut p) = self.inner.pending.lock() {
                for r in &pending {
                    p.remove(&r.req_id);
                }
            }
            return Err(e.into());
        }
        Ok(pending)
    }

    fn scope(&self, tx: u32) -> Scope<'_> {
        Scope { c: self, tx }
    }

    /// A node's value.
    pub async fn read(&self, path: &str) -> Result<Vec<u8>, Error> {
        self.scope(0).read(path).await
    }

    /// A node's value as UTF-8 (lossy).
    pub async fn read_string(&self, path: &str) -> Result<String, Error> {
        Ok(String::from_utf8_lossy(&self.read(path).await?).into_owned())
    }

    /// A node's value, or `None` if it does not exist.
    pub async fn try_read(&self, path: &str) -> Result<Option<Vec<u8>>, Error> {
        self.scope(0).try_read(path).await
    }

    /// Whether a node exists.
    pub async fn exists(&self, path: &str) -> Result<bool, Error> {
        Ok(self.try_read(path).await?.is_some())
    }

    /// Reads several nodes in one round trip (requests pipelined); a
    /// missing node is `None`. Any other error fails the whole batch.
    pub async fn try_read_many(&self, paths: &[String]) -> Result<Vec<Option<Vec<u8>>>, Error> {
        self.scope(0).try_read_many(paths).await
    }

    /// [`Client::try_read_many`], each value as [`value_text`].
    pub async fn try_read_texts(&self, paths: &[String]) -> Result<Vec<Option<String>>, Error> {
        Ok(self
            .try_read_many(paths)
            .await?
            .into_iter()
            .map(|v| v.as_deref().map(value_text))
            .collect())
    }

    /// Writes a value, creating missing parents.
    pub async fn write(&self, path: &str, value: impl AsRef<[u8]>) -> Result<(), Error> {
        self.scope(0).write(path, value.as_ref()).await
    }

    /// Writes several `(path, value)` pairs in one round trip (requests
    /// pipelined, applied in order).
    pub async fn write_many(&self, kvs: &[(String, String)]) -> Result<(), Error> {
        self.scope(0).write_many(kvs).await
    }

    /// Creates a node (and parents) if missing.
    pub async fn mkdir(&self, path: &str) -> Result<(), Error> {
        self.scope(0).simple(MsgType::Mkdir, path).await
    }

    /// Removes a node and everything below it.
    pub async fn rm(&self, path: &str) -> Result<(), Error> {
        self.scope(0).simple(MsgType::Rm, path).await
    }

    /// A node's children, in creation order (any length).
    pub async fn directory(&self, path: &str) -> Result<Vec<String>, Error> {
        self.scope(0).directory(path).await
    }

    /// A node's permissions.
    pub async fn get_perms(&self, path: &str) -> Result<Perms, Error> {
        self.scope(0).get_perms(path).await
    }

    /// Replaces a node's permissions.
    pub async fn set_perms(&self, path: &str, perms: &Perms) -> Result<(), Error> {
        self.scope(0).set_perms(path, perms).await
    }

    /// Starts a transaction.
    pub async fn transaction_start(&self) -> Result<Transaction<'_>, Error> {
        let slot = self
            .inner
            .tx_slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Error::Closed)?;
        let r = self.request(MsgType::TransactionStart, 0, b"\0").await?;
        let id = strings(&r)
            .first()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| Error::Protocol("bad transaction id".into()))?;
        Ok(Transaction {
            client: self,
            id,
            done: false,
            _slot: slot,
        })
    }

    /// Runs `body` in a transaction and commits it, starting over when the
    /// commit (or an operation) fails with EAGAIN. An error from `body`
    /// aborts the transaction and is returned.
    pub async fn transaction<T, F>(&self, mut body: F) -> Result<T, Error>
    where
        F: AsyncFnMut(&Transaction<'_>) -> Result<T, Error>,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let t = self.transaction_start().await?;
            let r = body(&t).await;
            let r = match r {
                Ok(v) => t.commit().await.map(|()| v),
                Err(e) => {
                    let _ = t.abort().await;
                    Err(e)
                }
            };
            match r {
                Err(Error::Xen(XsError::Eagain)) if attempt < TRANSACTION_RETRIES => {
                    tokio::task::yield_now().await;
                }
                r => return r,
            }
        }
    }

    /// Registers a watch on `path` (absolute, relative to the connection's
    /// domain home, or `@introduceDomain` / `@releaseDomain`).
    pub async fn watch(&self, path: &str) -> Result<Watcher, Error> {
        let n = self.inner.next_token.fetch_add(1, Ordering::Relaxed);
        let token = format!("pvio-{n}").into_bytes();
        let (tx, rx) = mpsc::unbounded_channel();
        if let Ok(mut w) = self.inner.watches.lock() {
            w.insert(token.clone(), tx);
        }
        let mut payload = path_arg(path);
        payload.extend_from_slice(&token);
        payload.push(0);
        if let Err(e) = self.request(MsgType::Watch, 0, &payload).await {
            if let Ok(mut w) = self.inner.watches.lock() {
                w.remove(&token);
            }
            return Err(e);
        }
        Ok(Watcher {
            client: self.clone(),
            path: path.to_owned(),
            token,
            rx,
            active: true,
        })
    }

    /// XS_INTRODUCE (dom0 only): a domain's xenbus ring frame and port.
    pub async fn introduce(&self, domid: DomId, mfn: u64, port: u32) -> Result<(), Error> {
        let p = format!("{domid}\0{mfn}\0{port}\0");
        self.request(MsgType::Introduce, 0, p.as_bytes())
            .await
            .map(drop)
    }

    /// XS_RELEASE (dom0 only).
    pub async fn release(&self, domid: DomId) -> Result<(), Error> {
        self.request(MsgType::Release, 0, format!("{domid}\0").as_bytes())
            .await
            .map(drop)
    }

    /// XS_IS_DOMAIN_INTRODUCED (dom0 only).
    pub async fn is_domain_introduced(&self, domid: DomId) -> Result<bool, Error> {
        let r = self
            .request(
                MsgType::IsDomainIntroduced,
                0,
                format!("{domid}\0").as_bytes(),
            )
            .await?;
        Ok(r.first() == Some(&b'T'))
    }

    /// XS_GET_DOMAIN_PATH: `/local/domain/<domid>`.
    pub async fn get_domain_path(&self, domid: DomId) -> Result<String, Error> {
        let r = self
            .request(MsgType::GetDomainPath, 0, format!("{domid}\0").as_bytes())
            .await?;
        strings(&r)
            .into_iter()
            .next()
            .ok_or_else(|| Error::Protocol("empty domain path".into()))
    }

    /// XS_SET_TARGET (dom0 only): `domid` becomes the device model of `target`.
    pub async fn set_target(&self, domid: DomId, target: DomId) -> Result<(), Error> {
        self.request(
            MsgType::SetTarget,
            0,
            format!("{domid}\0{target}\0").as_bytes(),
        )
        .await
        .map(drop)
    }

    /// XS_RESET_WATCHES: drops every watch and transaction of this connection.
    pub async fn reset_watches(&self) -> Result<(), Error> {
        self.request(MsgType::ResetWatches, 0, b"\0")
            .await
            .map(drop)
    }

    /// XS_CONTROL (dom0 only), e.g. `["quota"]`; returns the text reply.
    pub async fn control(&self, args: &[&str]) -> Result<String, Error> {
        let mut p = Vec::new();
        for a in args {
            p.extend_from_slice(a.as_bytes());
            p.push(0);
        }
        let r = self.request(MsgType::Control, 0, &p).await?;
        Ok(String::from_utf8_lossy(r.strip_suffix(&[0]).unwrap_or(&r)).into_owned())
    }
}

/// Node operations, outside (`tx` 0) or inside a transaction.
struct Scope<'a> {
    c: &'a Client,
    tx: u32,
}

/// A request on the wire, waiting for its reply.
struct Pending {
    ty: MsgType,
    req_id: u32,
    rx: oneshot::Receiver<Reply>,
}

impl Pending {
    async fn reply(self) -> Result<Vec<u8>, Error> {
        let (rty, body) = self.rx.await.map_err(|_| Error::Closed)??;
        if rty == MsgType::Error as u32 {
            let name =
                String::from_utf8_lossy(body.strip_suffix(&[0]).unwrap_or(&body)).into_owned();
            return Err(XsError::from_name(&name)
                .map(Error::Xen)
                .unwrap_or_else(|| Error::Protocol(format!("unknown error {name:?}"))));
        }
        if rty != self.ty as u32 {
            return Err(Error::Protocol(format!(
                "reply type {rty} to request type {}",
                self.ty as u32
            )));
        }
        Ok(body)
    }
}

/// A node's value as text, the way drivers read numbers and names: lossy
/// UTF-8, without a trailing NUL or surrounding white space.
pub fn value_text(v: &[u8]) -> String {
    String::from_utf8_lossy(v)
        .trim_end_matches('\0')
        .trim()
        .to_string()
}

impl Scope<'_> {
    async fn read(&self, path: &str) -> Result<Vec<u8>, Error> {
        self.c
            .request(MsgType::Read, self.tx, &path_arg(path))
            .await
    }

    async fn try_read(&self, path: &str) -> Result<Option<Vec<u8>>, Error> {
        match self.read(path).await {
            Ok(v) => Ok(Some(v)),
            Err(Error::Xen(XsError::Enoent)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn try_read_many(&self, paths: &[String]) -> Result<Vec<Option<Vec<u8>>>, Error> {
        let reqs: Vec<(MsgType, Vec<u8>)> =
            paths.iter().map(|p| (MsgType::Read, path_arg(p))).collect();
        let reqs: Vec<(MsgType, &[u8])> = reqs.iter().map(|(t, p)| (*t, &p[..])).collect();
        self.c
            .send_all(&reqs, self.tx)
            .await?
            .into_iter()
            .map(|r| match r {
                Ok(v) => Ok(Some(v)),
                Err(Error::Xen(XsError::Enoent)) => Ok(None),
                Err(e) => Err(e),
            })
            .collect()
    }

    async fn write(&self, path: &str, value: &[u8]) -> Result<(), Error> {
        let mut p = path_arg(path);
        p.extend_from_slice(value);
        self.c.request(MsgType::Write, self.tx, &p).await.map(drop)
    }

    async fn write_many(&self, kvs: &[(String, String)]) -> Result<(), Error> {
        let reqs: Vec<(MsgType, Vec<u8>)> = kvs
            .iter()
            .map(|(k, v)| {
                let mut p = path_arg(k);
                p.extend_from_slice(v.as_bytes());
                (MsgType::Write, p)
            })
            .collect();
        self.c.request_many(self.tx, &reqs).await.map(drop)
    }

    async fn simple(&self, ty: MsgType, path: &str) -> Result<(), Error> {
        self.c.request(ty, self.tx, &path_arg(path)).await.map(drop)
    }

    async fn directory(&self, path: &str) -> Result<Vec<String>, Error> {
        match self
            .c
            .request(MsgType::Directory, self.tx, &path_arg(path))
            .await
        {
            Ok(v) => Ok(strings(&v)),
            Err(Error::Xen(XsError::E2big)) => self.directory_part(path).await,
            Err(e) => Err(e),
        }
    }

    /// The XS_DIRECTORY_PART loop of libxenstore: restart if the node's
    /// generation changes between chunks.
    async fn directory_part(&self, path: &str) -> Result<Vec<String>, Error> {
        'restart: for _ in 0..TRANSACTION_RETRIES {
            let mut all: Vec<u8> = Vec::new();
            let mut gen: Option<Vec<u8>> = None;
            loop {
                let mut p = path_arg(path);
                p.extend_from_slice(format!("{}\0", all.len()).as_bytes());
                let r = self.c.request(MsgType::DirectoryPart, self.tx, &p).await?;
                let nul = r
                    .iter()
                    .position(|b| *b == 0)
                    .ok_or_else(|| Error::Protocol("directory part without generation".into()))?;
                let g = r[..nul].to_vec();
                match &gen {
                    Some(old) if *old != g => continue 'restart,
                    Some(_) => {}
                    None => gen = Some(g),
                }
                all.extend_from_slice(&r[nul + 1..]);
                if all.len() <= 1 || all[all.len() - 2] == 0 {
                    all.pop();
                    return Ok(strings(&all));
                }
            }
        }
        Err(Error::Xen(XsError::Eagain))
    }

    async fn get_perms(&self, path: &str) -> Result<Perms, Error> {
        let r = self
            .c
            .request(MsgType::GetPerms, self.tx, &path_arg(path))
            .await?;
        let body = r.strip_suffix(&[0]).unwrap_or(&r);
        Perms::parse(body.split(|b| *b == 0))
            .map_err(|_| Error::Protocol("bad permission list".into()))
    }

    async fn set_perms(&self, path: &str, perms: &Perms) -> Result<(), Error> {
        let mut p = path_arg(path);
        perms.encode(&mut p);
        self.c
            .request(MsgType::SetPerms, self.tx, &p)
            .await
            .map(drop)
    }
}

impl Transaction<'_> {
    /// The transaction id.
    pub fn id(&self) -> u32 {
        self.id
    }

    fn scope(&self) -> Scope<'_> {
        Scope {
            c: self.client,
            tx: self.id,
        }
    }

    pub async fn read(&self, path: &str) -> Result<Vec<u8>, Error> {
        self.scope().read(path).await
    }

    pub async fn read_string(&self, path: &str) -> Result<String, Error> {
        Ok(String::from_utf8_lossy(&self.read(path).await?).into_owned())
    }

    pub async fn try_read(&self, path: &str) -> Result<Option<Vec<u8>>, Error> {
        self.scope().try_read(path).await
    }

    pub async fn exists(&self, path: &str) -> Result<bool, Error> {
        Ok(self.try_read(path).await?.is_some())
    }

    /// Reads several nodes in one round trip; a missing node is `None`.
    pub async fn try_read_many(&self, paths: &[String]) -> Result<Vec<Option<Vec<u8>>>, Error> {
        self.scope().try_read_many(paths).await
    }

    pub async fn write(&self, path: &str, value: impl AsRef<[u8]>) -> Result<(), Error> {
        self.scope().write(path, value.as_ref()).await
    }

    /// Writes several `(path, value)` pairs in one round trip.
    pub async fn write_many(&self, kvs: &[(String, String)]) -> Result<(), Error> {
        self.scope().write_many(kvs).await
    }

    pub async fn mkdir(&self, path: &str) -> Result<(), Error> {
        self.scope().simple(MsgType::Mkdir, path).await
    }

    pub async fn rm(&self, path: &str) -> Result<(), Error> {
        self.scope().simple(MsgType::Rm, path).await
    }

    pub async fn directory(&self, path: &str) -> Result<Vec<String>, Error> {
        self.scope().directory(path).await
    }

    pub async fn get_perms(&self, path: &str) -> Result<Perms, Error> {
        self.scope().get_perms(path).await
    }

    pub async fn set_perms(&self, path: &str, perms: &Perms) -> Result<(), Error> {
        self.scope().set_perms(path, perms).await
    }

    async fn end(mut self, commit: bool) -> Result<(), Error> {
        self.done = true;
        let arg: &[u8] = if commit { b"T\0" } else { b"F\0" };
        self.client
            .request(MsgType::TransactionEnd, self.id, arg)
            .await
            .map(drop)
    }

    /// Commits; `Err(Error::Xen(XsError::Eagain))` means something it read
    /// changed meanwhile and the whole transaction must be redone.
    pub async fn commit(self) -> Result<(), Error> {
        self.end(true).await
    }

    /// Discards every change.
    pub async fn abort(self) -> Result<(), Error> {
        self.end(false).await
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if !self.done {
            // Abort in the background so the daemon does not keep it open.
            let c = self.client.clone();
            let id = self.id;
            if let Ok(h) = tokio::runtime::Handle::try_current() {
                h.spawn(async move {
                    let _ = c.request(MsgType::TransactionEnd, id, b"F\0").await;
                });
            }
        }
    }
}

impl Watcher {
    /// The next event; `None` once the connection is closed.
    pub async fn next(&mut self) -> Option<WatchEvent> {
        self.rx.recv().await
    }

    /// An event if one is already queued.
    pub fn try_next(&mut self) -> Option<WatchEvent> {
        self.rx.try_recv().ok()
    }

    /// The watched path as registered.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The token the client chose for this watch.
    pub fn token(&self) -> &[u8] {
        &self.token
    }

    /// Unregisters the watch and waits for the daemon's answer.
    pub async fn unwatch(mut self) -> Result<(), Error> {
        self.active = false;
        if let Ok(mut w) = self.client.inner.watches.lock() {
            w.remove(&self.token);
        }
        let mut p = path_arg(&self.path);
        p.extend_from_slice(&self.token);
        p.push(0);
        self.client.request(MsgType::Unwatch, 0, &p).await.map(drop)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if !self.active {
            return;
        }
        if let Ok(mut w) = self.client.inner.watches.lock() {
            w.remove(&self.token);
        }
        let c = self.client.clone();
        let mut p = path_arg(&self.path);
        p.extend_from_slice(&self.token);
        p.push(0);
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            h.spawn(async move {
                let _ = c.request(MsgType::Unwatch, 0, &p).await;
            });
        }
    }
}
