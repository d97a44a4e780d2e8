//! A transmission request, parsed once from its 28-byte header (plus the
//! payload of a write) and checked against the export in one place; the
//! result is a typed [`Command`] or the NBD error to answer with.
//!
//! Errors follow proto.md's "Error values": `EINVAL` for unknown commands
//! or flags, misalignment, zero lengths and reads or trims beyond the end;
//! `ENOSPC` for writes beyond the end; `EPERM` for writes and trims on a
//! read-only export.

use super::defs::*;
use super::wire::{be16, be32, be64};

/// A request header as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawRequest {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u32,
}

impl RawRequest {
    /// Parses a header; `None` if the magic is wrong.
    pub fn parse(h: &[u8; 28]) -> Option<Self> {
        (be32(h, 0) == REQUEST_MAGIC).then(|| Self {
            flags: be16(h, 4),
            kind: be16(h, 6),
            cookie: be64(h, 8),
            offset: be64(h, 16),
            len: be32(h, 24),
        })
    }
}

/// A valid request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Read {
        offset: u64,
        len: u32,
    },
    Write {
        offset: u64,
        data: Vec<u8>,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        len: u32,
        fua: bool,
    },
    WriteZeroes {
        offset: u64,
        len: u32,
        fua: bool,
    },
    /// `base:allocation` of the range; `one`: only the first extent
    /// (`NBD_CMD_FLAG_REQ_ONE`).
    BlockStatus {
        offset: u64,
        len: u32,
        one: bool,
    },
}

impl Command {
    /// Bytes of memory the request holds while it runs.
    pub fn footprint(&self) -> u64 {
        match self {
            Self::Read { len, .. } => u64::from(*len),
            Self::Write { data, .. } => data.len() as u64,
            _ => 0,
        }
    }
}

/// What the export allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub size: u64,
    /// Offsets and lengths must be multiples of this.
    pub block: u32,
    pub read_only: bool,
    pub flush: bool,
    pub trim: bool,
    /// `base:allocation` was selected: `NBD_CMD_BLOCK_STATUS` is valid.
    pub block_status: bool,
}

/// A refused request: the NBD error and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub errno: u32,
    pub reason: String,
}

fn refuse(errno: u32, reason: impl Into<String>) -> Result<Command, Refusal> {
    Err(Refusal {
        errno,
        reason: reason.into(),
    })
}

/// Checks `raw` (with its payload if a write) against `limits`.
pub fn validate(
    raw: &RawRequest,
    payload: Option<Vec<u8>>,
    limits: &Limits,
) -> Result<Command, Refusal> {
    let mut allowed = if limits.flush { CMD_FLAG_FUA } else { 0 };
    if raw.kind == CMD_WRITE_ZEROES {
        allowed |= CMD_FLAG_NO_HOLE;
    }
    if raw.kind == CMD_BLOCK_STATUS {
        allowed |= CMD_FLAG_REQ_ONE;
    }
    if raw.flags & !allowed != 0 {
        return refuse(
            EINVAL,
            format!("flags {:#x} not valid for command {}", raw.flags, raw.kind),
        );
    }
    let fua = raw.flags & CMD_FLAG_FUA != 0;
    let writes = matches!(raw.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if writes && limits.read_only {
        return refuse(EPERM, "the export is read-only");
    }
    let (offset, len) = (raw.offset, raw.len);
    let ranged = || -> Result<(), Refusal> {
        let b = u64::from(limits.block.max(1));
        if len == 0 || offset % b != 0 || u64::from(len) % b != 0 {
            return Err(Refusal {
                errno: EINVAL,
                reason: format!(
                    "offset {offset} and length {len} must be non-zero multiples of {b}"
                ),
            });
        }
        if offset
            .checked_add(u64::from(len))
            .is_none_or(|end| end > limits.size)
        {
            let errno = if matches!(raw.kind, CMD_WRITE | CMD_WRITE_ZEROES) {
                ENOSPC
            } else {
                EINVAL
            };
            return Err(Refusal {
                errno,
                reason: format!(
                    "{offset}+{len} is beyond the export's {} bytes",
                    limits.size
                ),
            });
        }
        Ok(())
    };
    match raw.kind {
        CMD_READ => {
            if len > MAX_PAYLOAD {
                return refuse(
                    EINVAL,
                    format!("read of {len} bytes is over the {MAX_PAYLOAD}-byte limit"),
                );
            }
            ranged()?;
            Ok(Command::Read { offset, len })
        }
        CMD_WRITE => {
            ranged()?;
            let data = payload.unwrap_or_default();
            if data.len() != len as usize {
                return refuse(EINVAL, "write payload length mismatch");
            }
            Ok(Command::Write { offset, data, fua })
        }
        CMD_FLUSH => {
            if !limits.flush {
                return refuse(EINVAL, "flush is not supported");
            }
            if offset != 0 || len != 0 {
                return refuse(EINVAL, "flush takes no offset or length");
            }
            Ok(Command::Flush)
        }
        CMD_TRIM => {
            if !limits.trim {
                return refuse(EINVAL, "trim is not supported");
            }
            ranged()?;
            Ok(Command::Trim { offset, len, fua })
        }
        CMD_WRITE_ZEROES => {
            ranged()?;
            Ok(Command::WriteZeroes { offset, len, fua })
        }
        CMD_BLOCK_STATUS => {
            if !limits.block_status {
                return refuse(EINVAL, "no metadata context was selected");
            }
            ranged()?;
            Ok(Command::BlockStatus {
                offset,
                len,
                one: raw.flags & CMD_FLAG_REQ_ONE != 0,
            })
        }
        other => refuse(EINVAL, format!("unknown command {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        size: 1 << 20,
        block: 512,
        read_only: false,
        flush: true,
        trim: true,
        block_status: true,
    };

    fn raw(kind: u16, flags: u16, offset: u64, len: u32) -> RawRequest {
        RawRequest {
            flags,
            kind,
            cookie: 7,
            offset,
            len,
        }
    }

    fn errno(r: RawRequest, limits: &Limits) -> u32 {
        let payload = (r.kind == CMD_WRITE).then(|| vec![0; r.len as usize]);
        validate(&r, payload, limits).unwrap_err().errno
    }

    #[test]
    fn parses_the_header() {
        let mut h = [0u8; 28];
        h[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        h[4..6].copy_from_slice(&1u16.to_be_bytes());
        h[6..8].copy_from_slice(&CMD_WRITE.to_be_bytes());
        h[8..16].copy_from_slice(&0xabcdu64.to_be_bytes());
        h[16..24].copy_from_slice(&4096u64.to_be_bytes());
        h[24..].copy_from_slice(&512u32.to_be_bytes());
        assert_eq!(
            RawRequest::parse(&h),
            Some(raw(CMD_WRITE, 1, 4096, 512)).map(|r| RawRequest {
                cookie: 0xabcd,
                ..r
            })
        );
        h[0] ^= 1;
        assert_eq!(RawRequest::parse(&h), None);
    }

    #[test]
    fn valid_requests_become_commands() {
        let ok = |r: RawRequest, p: Option<Vec<u8>>| validate(&r, p, &LIMITS).unwrap();
        assert_eq!(
            ok(raw(CMD_READ, 0, 0, 4096), None),
            Command::Read {
                offset: 0,
                len: 4096
            }
        );
        assert_eq!(
            ok(raw(CMD_WRITE, CMD_FLAG_FUA, 512, 512), Some(vec![1; 512])),
            Command::Write {
                offset: 512,
                data: vec![1; 512],
                fua: true
            }
        );
        assert_eq!(ok(raw(CMD_FLUSH, 0, 0, 0), None), Command::Flush);
        assert_eq!(
            ok(raw(CMD_TRIM, 0, 0, 1 << 20), None),
            Command::Trim {
                offset: 0,
                len: 1 << 20,
                fua: false
            }
        );
        assert_eq!(
            ok(raw(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 1024, 512), None),
            Command::WriteZeroes {
                offset: 1024,
                len: 512,
                fua: false
            }
        );
        assert_eq!(
            ok(raw(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 4096, 8192), None),
            Command::BlockStatus {
                offset: 4096,
                len: 8192,
                one: true
            }
        );
        // The last sector is inside.
        assert!(validate(&raw(CMD_READ, 0, (1 << 20) - 512, 512), None, &LIMITS).is_ok());
    }

    #[test]
    fn bad_requests_get_the_right_error() {
        assert_eq!(errno(raw(CMD_READ, 0, 1, 512), &LIMITS), EINVAL);
        assert_eq!(errno(raw(CMD_READ, 0, 0, 100), &LIMITS), EINVAL);
        assert_eq!(errno(raw(CMD_READ, 0, 0, 0), &LIMITS), EINVAL);
        assert_eq!(errno(raw(CMD_READ, 0, 1 << 20, 512), &LIMITS), EINVAL);
        assert_eq!(
            errno(raw(CMD_READ, 0, u64::MAX - 511, 512), &LIMITS),
            EINVAL
        );
        assert_eq!(
            errno(raw(CMD_READ, 0, 0, MAX_PAYLOAD + 512), &LIMITS),
            EINVAL
        );
        assert_eq!(
            errno(raw(CMD_WRITE, 0, (1 << 20) - 512, 1024), &LIMITS),
            ENOSPC
        );
        assert_eq!(
            errno(raw(CMD_WRITE_ZEROES, 0, 1 << 20, 512), &LIMITS),
            ENOSPC
        );
        assert_eq!(errno(raw(CMD_TRIM, 0, 1 << 20, 512), &LIMITS), EINVAL);
        assert_eq!(errno(raw(CMD_FLUSH, 0, 4096, 0), &LIMITS), EINVAL);
        assert_eq!(errno(raw(CMD_READ, 1 << 5, 0, 512), &LIMITS), EINVAL);
        assert_eq!(
            errno(raw(CMD_READ, CMD_FLAG_NO_HOLE, 0, 512), &LIMITS),
            EINVAL
        );
        assert_eq!(errno(raw(9, 0, 0, 512), &LIMITS), EINVAL);
        assert_eq!(errno(raw(5, 0, 0, 512), &LIMITS), EINVAL);
        let ro = Limits {
            read_only: true,
            ..LIMITS
        };
        assert_eq!(errno(raw(CMD_WRITE, 0, 0, 512), &ro), EPERM);
        assert_eq!(errno(raw(CMD_TRIM, 0, 0, 512), &ro), EPERM);
        assert_eq!(errno(raw(CMD_WRITE_ZEROES, 0, 0, 512), &ro), EPERM);
        let plain = Limits {
            flush: false,
            trim: false,
            block_status: false,
            ..LIMITS
        };
        assert_eq!(errno(raw(CMD_BLOCK_STATUS, 0, 0, 512), &plain), EINVAL);
        assert_eq!(
            errno(raw(CMD_BLOCK_STATUS, 0, 1 << 20, 512), &LIMITS),
            EINVAL
        );
        assert_eq!(errno(raw(CMD_BLOCK_STATUS, 0, 0, 0), &LIMITS), EINVAL);
        assert_eq!(
            errno(raw(CMD_BLOCK_STATUS, CMD_FLAG_NO_HOLE, 0, 512), &LIMITS),
            EINVAL
        );
        assert_eq!(errno(raw(CMD_FLUSH, 0, 0, 0), &plain), EINVAL);
        assert_eq!(errno(raw(CMD_TRIM, 0, 0, 512), &plain), EINVAL);
        assert_eq!(errno(raw(CMD_WRITE, CMD_FLAG_FUA, 0, 512), &plain), EINVAL);
    }
}
