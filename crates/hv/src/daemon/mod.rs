//! `pvio hvd`: the hypervisor services daemon.
//!
//! A single-threaded epoll loop over a `SOCK_SEQPACKET` listener: each
//! connection is a process of a domain, each datagram one request. The loop
//! bounds the work it does per connection per turn so that a flooding client
//! cannot starve the others, and it drops a client that stops reading its
//! replies. Request handling lives in [`state`].

pub mod config;
pub mod domain;
pub mod state;

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::event::epoll;
use rustix::io::Errno;
use rustix::net::SocketFlags;

use crate::error::{ErrorCode, HvError};
use crate::proto::{encode_error, Request, MAX_MESSAGE};
use crate::sys;

pub use config::{Config, EvtchnAbi};
use state::HvState;

/// Identifies a connection for its whole life.
pub type ConnId = u64;

const LISTENER: u64 = 0;
const STOP: u64 = 1;
const FIRST_CONN: u64 = 16;
/// Requests served from one connection before others get a turn.
const REQUESTS_PER_TURN: usize = 32;

/// A running hvd.
pub struct Hvd {
    state: HvState,
    listener: OwnedFd,
    epoll: OwnedFd,
    socks: HashMap<ConnId, OwnedFd>,
    next_conn: ConnId,
    buf: Vec<u8>,
}

impl Hvd {
    /// Binds the socket named in `config`.
    pub fn bind(config: Config) -> Result<Self, HvError> {
        let listener = sys::seqpacket_listen(&config.socket, true).map_err(|e| {
            HvError::Io(format!("cannot listen on {}: {e}", config.socket.display()))
        })?;
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        epoll::add(
            &epoll,
            &listener,
            epoll::EventData::new_u64(LISTENER),
            epoll::EventFlags::IN,
        )?;
        Ok(Self {
            state: HvState::new(config),
            listener,
            epoll,
            socks: HashMap::new(),
            next_conn: FIRST_CONN,
            buf: vec![0u8; MAX_MESSAGE + 1],
        })
    }

    /// Serves until `stop` becomes readable (a signalfd or eventfd), then
    /// removes the socket. Every domain dies with hvd.
    pub fn serve(mut self, stop: BorrowedFd<'_>) -> Result<(), HvError> {
        epoll::add(
            &self.epoll,
            stop,
            epoll::EventData::new_u64(STOP),
            epoll::EventFlags::IN,
        )?;
        tracing::info!(
            socket = %self.state.config().socket.display(),
            max_grant_frames = self.state.config().max_grant_frames,
            max_ports = self.state.config().max_ports(),
            "hvd listening"
        );
        let mut events: Vec<epoll::Event> = Vec::with_capacity(256);
        loop {
            events.clear();
            match epoll::wait(
                &self.epoll,
                rustix::buffer::spare_capacity(&mut events),
                None,
            ) {
                Ok(_) => {}
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
            for ev in &events {
                match ev.data.u64() {
                    LISTENER => self.accept_all(),
                    STOP => {
                        tracing::info!("hvd stopping");
                        let _ = std::fs::remove_file(&self.state.config().socket);
                        return Ok(());
                    }
                    id => self.serve_conn(id),
                }
            }
        }
    }

    fn accept_all(&mut self) {
        for _ in 0..64 {
            match rustix::net::accept_with(
                &self.listener,
                SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            ) {
                Ok(sock) => {
                    let pid = rustix::net::sockopt::socket_peercred(&sock)
                        .map(|c| c.pid.as_raw_nonzero().get() as u32)
                        .unwrap_or(0);
                    let id = self.next_conn;
                    self.next_conn += 1;
                    if let Err(e) = epoll::add(
                        &self.epoll,
                        &sock,
                        epoll::EventData::new_u64(id),
                        epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
                    ) {
                        tracing::warn!("cannot watch a new connection: {e}");
                        continue;
                    }
                    self.state.add_conn(id, pid);
                    self.socks.insert(id, sock);
                }
                Err(Errno::AGAIN) => return,
                Err(Errno::INTR) | Err(Errno::CONNABORTED) => continue,
                Err(e) => {
                    // Out of fds, most likely: keep serving the others.
                    tracing::warn!("accept failed: {e}");
                    return;
                }
            }
        }
    }

    fn serve_conn(&mut self, id: ConnId) {
        for _ in 0..REQUESTS_PER_TURN {
            let Some(sock) = self.socks.get(&id) else {
                return;
            };
            let got = match sys::recv_with_fds(sock.as_fd(), &mut self.buf, true) {
                Ok(g) => g,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    tracing::debug!(conn = id, "receive failed: {e}");
                    self.disconnect(id);
                    return;
                }
            };
            if got.len == 0 {
                self.disconnect(id);
                return;
            }
            let reply = if !got.fds.is_empty() {
                // Whatever was passed is closed when `got` drops.
                Err((
                    ErrorCode::Protocol,
                    "hvd accepts no file descriptors".to_string(),
                ))
            } else if got.truncated || got.len > MAX_MESSAGE {
                Err((
                    ErrorCode::Protocol,
                    format!("request longer than {MAX_MESSAGE} bytes"),
                ))
            } else {
                match Request::decode(&self.buf[..got.len]) {
                    Ok(req) => {
                        tracing::trace!(conn = id, request = req.name(), "request");
                        self.state.handle(id, req)
                    }
                    Err(e) => Err((ErrorCode::Protocol, e.0)),
                }
            };
            let (bytes, fds) = match reply {
                Ok(r) => (r.bytes, r.fds),
                Err((code, msg)) => {
                    tracing::debug!(conn = id, ?code, "refused: {msg}");
                    (encode_error(code, &msg), Vec::new())
                }
            };
            let sent = {
                let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
                sys::send_with_fds(sock.as_fd(), &bytes, &borrowed, true)
            };
            drop(fds);
            if let Err(e) = sent {
                tracing::warn!(
                    conn = id,
                    "dropping a client that does not read its replies: {e}"
                );
                self.disconnect(id);
                return;
            }
            for victim in self.state.take_kicked() {
                self.disconnect(victim);
            }
        }
    }

    fn disconnect(&mut self, id: ConnId) {
        if let Some(sock) = self.socks.remove(&id) {
            let _ = epoll::delete(&self.epoll, &sock);
        }
        self.state.remove_conn(id);
        for victim in self.state.take_kicked() {
            self.disconnect(victim);
        }
    }
}

/// Binds and serves in one call (what `pvio hvd` does).
pub fn run(config: Config, stop: BorrowedFd<'_>) -> Result<(), HvError> {
    Hvd::bind(config)?.serve(stop)
}
