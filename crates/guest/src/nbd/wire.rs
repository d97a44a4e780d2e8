//! Byte-level helpers: big-endian fields, reading a message that may meet
//! the end of the stream, and writing option replies.

use std::io::{self, Read, Write};

use super::defs::OPTION_REPLY_MAGIC;

pub fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

pub fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

/// Fills `buf`; `Ok(false)` if the stream ended before its first byte,
/// an `UnexpectedEof` error if it ended inside it.
pub fn read_message(r: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Sends one option reply: magic, option, reply type, length, data.
pub fn option_reply(w: &mut impl Write, option: u32, reply: u32, data: &[u8]) -> io::Result<()> {
    let mut m = Vec::with_capacity(20 + data.len());
    m.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    m.extend_from_slice(&option.to_be_bytes());
    m.extend_from_slice(&reply.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    w.write_all(&m)
}

/// A simple reply header: magic, error, cookie.
pub fn simple_reply_header(errno: u32, cookie: u64) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[..4].copy_from_slice(&super::defs::SIMPLE_REPLY_MAGIC.to_be_bytes());
    h[4..8].copy_from_slice(&errno.to_be_bytes());
    h[8..].copy_from_slice(&cookie.to_be_bytes());
    h
}

/// A structured reply chunk's header: magic, flags, type, cookie, payload
/// length.
pub fn structured_reply_header(flags: u16, kind: u16, cookie: u64, len: u32) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[..4].copy_from_slice(&super::defs::STRUCTURED_REPLY_MAGIC.to_be_bytes());
    h[4..6].copy_from_slice(&flags.to_be_bytes());
    h[6..8].copy_from_slice(&kind.to_be_bytes());
    h[8..16].copy_from_slice(&cookie.to_be_bytes());
    h[16..].copy_from_slice(&len.to_be_bytes());
    h
}
