//! One client connection: the handshake, then transmission with two
//! threads: a reader that parses and validates requests (consuming write
//! payloads) and hands them over a bounded queue, and the executor on the
//! calling thread that drives the device and writes the replies.

use std::io::Read;
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::time::Duration;

use pvio_blk::device::BlockDevice;

use super::defs::{CMD_DISC, CMD_WRITE, MAX_PAYLOAD};
use super::error::NbdError;
use super::exec::{Executor, Msg};
use super::handshake::{negotiate, Export, Mode, Outcome};
use super::request::{validate, Limits, RawRequest};
use super::stats::NbdStats;
use super::wire::read_message;

/// Requests parsed ahead of the executor.
const QUEUE_DEPTH: usize = 4;

/// What a session serves and its timeouts.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub export: Export,
    pub limits: Limits,
    /// The whole negotiation must not stall longer than this per read.
    pub handshake_timeout: Duration,
    /// A client that does not take its replies for this long is dropped.
    pub write_timeout: Duration,
}

/// Serves one client on `dev` until it leaves, then closes the connection
/// (other handles on the socket, such as the acceptor's, see it shut down).
pub fn run<D: BlockDevice + ?Sized>(
    stream: UnixStream,
    dev: &mut D,
    cfg: &SessionConfig,
    stats: &NbdStats,
    tag_base: u64,
) -> Result<(), NbdError> {
    let ctl = stream.try_clone();
    let result = serve(stream, dev, cfg, stats, tag_base);
    if let Ok(s) = ctl {
        let _ = s.shutdown(Shutdown::Both);
    }
    result
}

fn serve<D: BlockDevice + ?Sized>(
    mut stream: UnixStream,
    dev: &mut D,
    cfg: &SessionConfig,
    stats: &NbdStats,
    tag_base: u64,
) -> Result<(), NbdError> {
    stream.set_read_timeout(Some(cfg.handshake_timeout))?;
    stream.set_write_timeout(Some(cfg.write_timeout))?;
    let features = match negotiate(&mut stream, Mode::Serve(&cfg.export))? {
        Outcome::Closed => return Ok(()),
        Outcome::Transmission(f) => f,
    };
    let limits = Limits {
        block_status: features.base_allocation,
        ..cfg.limits
    };
    stream.set_read_timeout(None)?;
    let reader_stream = stream.try_clone()?;
    let (tx, rx) = sync_channel(QUEUE_DEPTH);
    std::thread::scope(|s| {
        let reader = std::thread::Builder::new()
            .name("pvio-nbd-reader".into())
            .spawn_scoped(s, move || read_requests(reader_stream, tx, &limits, stats))?;
        let result =
            Executor::new(dev, &mut stream, stats, tag_base, features.structured).serve(&rx);
        // Wake the reader wherever it is blocked: on the socket or the queue.
        let _ = stream.shutdown(Shutdown::Both);
        drop(rx);
        if reader.join().is_err() {
            return Err(NbdError::Panicked);
        }
        result
    })
}

/// The reader thread: requests off the socket, validated, into the queue.
fn read_requests(mut s: UnixStream, tx: SyncSender<Msg>, limits: &Limits, stats: &NbdStats) {
    let close = |why: Option<String>| {
        let _ = tx.send(Msg::Closed(why));
    };
    let violation = |why: String| {
        NbdStats::add(&stats.protocol_errors, 1);
        tracing::warn!("nbd: {why}; disconnecting");
        close(Some(why));
    };
    loop {
        let mut h = [0u8; 28];
        match read_message(&mut s, &mut h) {
            Ok(true) => {}
            Ok(false) => return close(None),
            Err(e) => return close(Some(format!("reading a request: {e}"))),
        }
        let Some(raw) = RawRequest::parse(&h) else {
            return violation(format!(
                "bad request magic {:#010x}",
                u32::from_be_bytes([h[0], h[1], h[2], h[3]])
            ));
        };
        if raw.kind == CMD_DISC {
            let _ = tx.send(Msg::Disconnect);
            return;
        }
        let payload = if raw.kind == CMD_WRITE {
            if raw.len > MAX_PAYLOAD {
                return violation(format!(
                    "write of {} bytes is over the {MAX_PAYLOAD}-byte limit",
                    raw.len
                ));
            }
            let mut p = vec![0u8; raw.len as usize];
            if let Err(e) = s.read_exact(&mut p) {
                return close(Some(format!("reading a write payload: {e}")));
            }
            Some(p)
        } else {
            None
        };
        NbdStats::add(&stats.requests, 1);
        let cmd = validate(&raw, payload, limits);
        if tx
            .send(Msg::Request {
                cookie: raw.cookie,
                cmd,
            })
            .is_err()
        {
            return;
        }
    }
}
