//! The NBD server: a listening Unix socket, an acceptor thread, and one
//! session at a time on the exported device.
//!
//! One client is served at a time (the device has one owner). A connection
//! that arrives while a session runs waits up to a second for it to end (a
//! client reconnecting right after leaving), then is refused politely: it
//! gets the newstyle greeting and `NBD_REP_ERR_POLICY` ("in use by another
//! client") to its options, on a short-lived thread with timeouts, so
//! clients report why. [`NbdServer::shutdown`] wakes the acceptor through a pipe, ends the
//! running session (its socket is shut down; device requests in flight are
//! finished first) and hands the device back.

use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use pvio_blk::device::BlockDevice;
use rustix::event::{poll, PollFd, PollFlags};
use rustix::io::Errno;

use super::defs::*;
use super::error::NbdError;
use super::handshake::{negotiate, Export, Mode};
use super::request::Limits;
use super::session::{self, SessionConfig};
use super::stats::{NbdStats, NbdStatsSnapshot};

/// How the export looks.
#[derive(Debug, Clone)]
pub struct NbdConfig {
    /// The export's name (the empty name always selects it too).
    pub export_name: String,
    /// Refuse writes even if the device allows them.
    pub read_only: bool,
    /// A client stalling the handshake this long per read is dropped.
    pub handshake_timeout: Duration,
    /// A client not taking its replies this long is dropped.
    pub write_timeout: Duration,
}

impl Default for NbdConfig {
    fn default() -> Self {
        Self {
            export_name: String::new(),
            read_only: false,
            handshake_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(60),
        }
    }
}

/// Connections being refused at once; more are simply closed.
const MAX_REFUSING: usize = 4;
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a new connection waits for the previous session to end.
const RECONNECT_GRACE: Duration = Duration::from_secs(1);
const BUSY: &str = "the export is in use by another client (pvio serves one client at a time)";

/// A running NBD export of a device.
pub struct NbdServer<D: BlockDevice + 'static> {
    path: PathBuf,
    export: Export,
    stats: Arc<NbdStats>,
    stop: Arc<AtomicBool>,
    wake: Option<OwnedFd>,
    thread: Option<JoinHandle<Result<D, NbdError>>>,
}

impl<D: BlockDevice + 'static> NbdServer<D> {
    /// Listens on a new Unix socket at `path` (which must not exist) and
    /// serves `dev` there on a background thread.
    pub fn start(path: impl Into<PathBuf>, dev: D, cfg: NbdConfig) -> Result<Self, NbdError> {
        let path = path.into();
        let info = dev.info();
        let ro = cfg.read_only || info.read_only;
        let mut flags = FLAG_HAS_FLAGS;
        if ro {
            flags |= FLAG_READ_ONLY;
        } else {
            flags |= FLAG_SEND_WRITE_ZEROES;
            if info.discard {
                flags |= FLAG_SEND_TRIM;
            }
        }
        if info.flush {
            flags |= FLAG_SEND_FLUSH | FLAG_SEND_FUA;
        }
        let export = Export {
            name: cfg.export_name.clone(),
            size: info.size_bytes(),
            flags,
            min_block: info.sector_size.max(1),
            block_status: info.block_status,
        };
        let session_cfg = SessionConfig {
            export: export.clone(),
            limits: Limits {
                size: export.size,
                block: export.min_block,
                read_only: ro,
                flush: info.flush,
                trim: !ro && info.discard,
                block_status: false,
            },
            handshake_timeout: cfg.handshake_timeout,
            write_timeout: cfg.write_timeout,
        };
        let bind_err = |source| NbdError::Bind {
            path: path.display().to_string(),
            source,
        };
        let listener = UnixListener::bind(&path).map_err(bind_err)?;
        listener.set_nonblocking(true).map_err(bind_err)?;
        let (wake_rx, wake_tx) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| NbdError::Io(e.into()))?;
        let stats = Arc::new(NbdStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let acceptor = Acceptor {
            listener,
            wake: wake_rx,
            cfg: session_cfg,
            stop: stop.clone(),
            stats: stats.clone(),
            refusing: Arc::new(AtomicUsize::new(0)),
        };
        let thread = std::thread::Builder::new()
            .name("pvio-nbd-accept".into())
            .spawn(move || acceptor.run(dev))?;
        tracing::info!(socket = %path.display(), size = export.size, read_only = ro, "nbd: export ready");
        Ok(Self {
            path,
            export,
            stats,
            stop,
            wake: Some(wake_tx),
            thread: Some(thread),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The export as clients see it (name, size, transmission flags).
    pub fn export(&self) -> &Export {
        &self.export
    }

    /// The counters now.
    pub fn stats(&self) -> NbdStatsSnapshot {
        self.stats.snapshot()
    }

    /// The server has stopped on its own (only after a fatal error).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Stops listening, ends the session if any, removes the socket and
    /// returns the device.
    pub fn shutdown(mut self) -> Result<D, NbdError> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> Result<D, NbdError> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(w) = self.wake.take() {
            // If this fails the pipe is broken, which also wakes poll.
            let _ = rustix::io::write(&w, &[1]);
        }
        let result = match self.thread.take() {
            Some(t) => t.join().unwrap_or(Err(NbdError::Panicked)),
            None => Err(NbdError::Panicked),
        };
        let _ = std::fs::remove_file(&self.path);
        result
    }
}

impl<D: BlockDevice + 'static> Drop for NbdServer<D> {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.stop_and_join();
        }
    }
}

struct Acceptor {
    listener: UnixListener,
    wake: OwnedFd,
    cfg: SessionConfig,
    stop: Arc<AtomicBool>,
    stats: Arc<NbdStats>,
    refusing: Arc<AtomicUsize>,
}

/// A running session: its thread, a handle on its socket to end it, and
/// the channel on which it hands the device back when it ends.
struct Running<D> {
    thread: JoinHandle<()>,
    socket: UnixStream,
    done: Receiver<D>,
}

impl<D> Running<D> {
    /// The device, once the session has ended (waiting up to `grace`).
    fn reclaim(&self, grace: Duration) -> Result<Option<D>, NbdError> {
        match self.done.recv_timeout(grace) {
            Ok(d) => Ok(Some(d)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => Err(NbdError::Panicked),
        }
    }
}

impl Acceptor {
    fn run<D: BlockDevice + 'static>(self, dev: D) -> Result<D, NbdError> {
        let mut idle = Some(dev);
        let mut running: Option<Running<D>> = None;
        let mut sessions: u64 = 0;
        loop {
            let (incoming, woken) = {
                let mut fds = [
                    PollFd::new(&self.listener, PollFlags::IN),
                    PollFd::new(&self.wake, PollFlags::IN),
                ];
                match poll(&mut fds, None) {
                    Ok(_) => {}
                    Err(Errno::INTR) => continue,
                    Err(e) => return Err(NbdError::Io(e.into())),
                }
                (!fds[0].revents().is_empty(), !fds[1].revents().is_empty())
            };
            if woken || self.stop.load(Ordering::SeqCst) {
                break;
            }
            if !incoming {
                continue;
            }
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => {
                    tracing::warn!("nbd: accept failed: {e}");
                    continue;
                }
            };
            // A client that reconnects right after leaving finds its old
            // session still winding down: give that a moment.
            if let Some(r) = &running {
                if let Some(d) = r.reclaim(RECONNECT_GRACE)? {
                    idle = Some(d);
                    if let Some(r) = running.take() {
                        let _ = r.thread.join();
                    }
                }
            }
            match idle.take() {
                Some(dev) => {
                    sessions += 1;
                    running = Some(self.spawn_session(stream, dev, sessions)?);
                }
                None => self.refuse(stream),
            }
        }
        if let Some(r) = running.take() {
            let _ = r.socket.shutdown(std::net::Shutdown::Both);
            let d = r.done.recv().map_err(|_| NbdError::Panicked)?;
            let _ = r.thread.join();
            idle = Some(d);
        }
        idle.ok_or(NbdError::Panicked)
    }

    fn spawn_session<D: BlockDevice + 'static>(
        &self,
        stream: UnixStream,
        dev: D,
        n: u64,
    ) -> Result<Running<D>, NbdError> {
        stream.set_nonblocking(false)?;
        let socket = stream.try_clone()?;
        let cfg = self.cfg.clone();
        let stats = self.stats.clone();
        let (tx, done) = sync_channel(1);
        NbdStats::add(&stats.connections, 1);
        let thread = std::thread::Builder::new()
            .name("pvio-nbd-session".into())
            .spawn(move || {
                let mut dev = dev;
                match session::run(stream, &mut dev, &cfg, &stats, n << 40) {
                    Ok(()) => tracing::debug!("nbd: session {n} ended"),
                    Err(e) => tracing::info!("nbd: session {n} ended: {e}"),
                }
                // Hand the device back before counting the session as ended,
                // so whoever sees the count can connect again.
                let _ = tx.send(dev);
                NbdStats::add(&stats.sessions_ended, 1);
            })?;
        Ok(Running {
            thread,
            socket,
            done,
        })
    }

    fn refuse(&self, mut stream: UnixStream) {
        NbdStats::add(&self.stats.refused, 1);
        if self.refusing.fetch_add(1, Ordering::SeqCst) >= MAX_REFUSING {
            self.refusing.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        let refusing = self.refusing.clone();
        let spawned = std::thread::Builder::new()
            .name("pvio-nbd-refuse".into())
            .spawn(move || {
                let setup = stream
                    .set_nonblocking(false)
                    .and_then(|()| stream.set_read_timeout(Some(REFUSAL_TIMEOUT)))
                    .and_then(|()| stream.set_write_timeout(Some(REFUSAL_TIMEOUT)));
                if setup.is_ok() {
                    let _ = negotiate(&mut stream, Mode::Refuse(BUSY));
                }
                refusing.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            self.refusing.fetch_sub(1, Ordering::SeqCst);
        }
    }
}
