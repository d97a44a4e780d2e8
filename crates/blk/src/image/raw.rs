//! Raw images: the virtual disk is the file (or block device) byte for byte,
//! like tapdisk's `block-aio.c`. Nothing is ever allocated by the format;
//! discard punches holes.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use super::direct::{dio_alignment, probe_read, DirectIo};
use super::{check_range, Extent, Image, ImageError, ImageFile, MapOp, MapOutcome};
use crate::device::StatusExtent;

/// How to open a raw image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawOptions {
    /// Open read-only (writes and discards are refused).
    pub read_only: bool,
    /// Whether to use `O_DIRECT`.
    pub direct_io: DirectIo,
    /// Fail unless the image has exactly this many bytes.
    pub expected_size: Option<u64>,
}

/// A raw image.
#[derive(Debug)]
pub struct RawImage {
    files: Vec<ImageFile>,
    size: u64,
    logical_block_size: u32,
    memory_alignment: usize,
    read_only: bool,
}

impl RawImage {
    /// Opens the raw image at `path`.
    pub fn open(path: impl AsRef<Path>, opts: &RawOptions) -> Result<Self, ImageError> {
        Self::open_with(path.as_ref(), opts, &mut |p, writable, direct| {
            open_file(p, writable, direct)
        })
    }

    /// [`RawImage::open`] with the `open` call replaceable, so tests can
    /// make `O_DIRECT` fail the way tmpfs does.
    fn open_with(
        path: &Path,
        opts: &RawOptions,
        opener: &mut dyn FnMut(&Path, bool, bool) -> std::io::Result<File>,
    ) -> Result<Self, ImageError> {
        let writable = !opts.read_only;
        let meta = std::fs::metadata(path).map_err(|e| open_error(path, writable, e))?;
        let is_bdev = meta.file_type().is_block_device();
        if !meta.is_file() && !is_bdev {
            return Err(ImageError::NotAFileOrDevice {
                path: path.to_owned(),
            });
        }
        let want_direct = opts.direct_io != DirectIo::Off;
        let mut file = None;
        if want_direct {
            match opener(path, writable, true) {
                Ok(f) => file = Some(f),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(open_error(path, writable, e)),
            }
        }
        let mut size = match &file {
            Some(f) => file_size(f, is_bdev, path)?,
            None => 0,
        };
        let (mut lbs, mut mem_align) = (512u32, 1usize);
        if let Some(f) = &file {
            let (off_align, m_align) = dio_alignment(f, is_bdev);
            lbs = off_align.max(512).next_power_of_two();
            mem_align = (m_align as usize).max(1).next_power_of_two();
            // Some filesystems accept the flag and refuse the I/O.
            if size >= u64::from(lbs) {
                if let Err(e) = probe_read(f, lbs as usize, mem_align) {
                    if e.raw_os_error() != Some(libc::EINVAL) {
                        return Err(ImageError::io(path, "O_DIRECT probe read", e));
                    }
                    file = None;
                }
            }
        }
        let direct = file.is_some();
        if want_direct && !direct {
            if opts.direct_io == DirectIo::Required {
                return Err(ImageError::DirectIoUnsupported {
                    path: path.to_owned(),
                });
            }
            tracing::info!(path = %path.display(), "the filesystem refuses O_DIRECT; using buffered I/O");
        }
        let file = match file {
            Some(f) => f,
            None => {
                let f = opener(path, writable, false).map_err(|e| open_error(path, writable, e))?;
                size = file_size(&f, is_bdev, path)?;
                (lbs, mem_align) = (512, 1);
                f
            }
        };
        let bad = |reason: String| ImageError::BadSize {
            path: path.to_owned(),
            size,
            reason,
        };
        if size == 0 {
            return Err(bad("the image is empty".into()));
        }
        if size % u64::from(lbs) != 0 {
            return Err(bad(format!(
                "not a multiple of the {lbs}-byte logical block"
            )));
        }
        if let Some(expected) = opts.expected_size {
            if expected != size {
                return Err(ImageError::SizeMismatch {
                    path: path.to_owned(),
                    expected,
                    actual: size,
                });
            }
        }
        tracing::debug!(path = %path.display(), size, lbs, direct, writable, "opened raw image");
        Ok(Self {
            files: vec![ImageFile::new(file, path.to_owned(), direct, writable)],
            size,
            logical_block_size: lbs,
            memory_alignment: mem_align,
            read_only: opts.read_only,
        })
    }

    /// The path the image was opened from.
    pub fn path(&self) -> &Path {
        self.files[0].path()
    }
}

fn open_file(path: &Path, writable: bool, direct: bool) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(writable);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path)
}

fn open_error(path: &Path, writable: bool, e: std::io::Error) -> ImageError {
    match e.kind() {
        ErrorKind::NotFound => ImageError::NotFound {
            path: path.to_owned(),
        },
        ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem => {
            ImageError::PermissionDenied {
                path: path.to_owned(),
                writable,
            }
        }
        ErrorKind::IsADirectory => ImageError::NotAFileOrDevice {
            path: path.to_owned(),
        },
        _ => ImageError::io(path, "open", e),
    }
}

fn file_size(file: &File, is_bdev: bool, path: &Path) -> Result<u64, ImageError> {
    if is_bdev {
        let mut f = file;
        f.seek(SeekFrom::End(0))
            .map_err(|e| ImageError::io(path, "seek to end", e))
    } else {
        file.metadata()
            .map(|m| m.len())
            .map_err(|e| ImageError::io(path, "fstat", e))
    }
}

impl Image for RawImage {
    fn format(&self) -> &'static str {
        "raw"
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn logical_block_size(&self) -> u32 {
        self.logical_block_size
    }

    fn memory_alignment(&self) -> usize {
        self.memory_alignment
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn supports_discard(&self) -> bool {
        !self.read_only
    }

    fn files(&self) -> &[ImageFile] {
        &self.files
    }

    fn map(
        &self,
        op: MapOp,
        offset: u64,
        len: u64,
        out: &mut Vec<Extent>,
    ) -> Result<MapOutcome, ImageError> {
        if self.read_only && op != MapOp::Read {
            return Err(ImageError::ReadOnly {
                path: self.path().to_owned(),
            });
        }
        check_range(self, offset, len)?;
        if len > 0 {
            out.push(Extent::File {
                file: 0,
                offset,
                len,
            });
        }
        Ok(MapOutcome::Complete)
    }

    /// Holes and data of the file, from `SEEK_DATA` and `SEEK_HOLE`. A
    /// file or device that cannot say is all data. Boundaries are rounded
    /// to 512 bytes towards more data.
    fn block_status(
        &self,
        offset: u64,
        len: u64,
        max_extents: usize,
        out: &mut Vec<StatusExtent>,
    ) -> Result<(), ImageError> {
        check_range(self, offset, len)?;
        let f = &self.files[0];
        let end = offset + len;
        let seek = |to: rustix::fs::SeekFrom| -> Result<Option<u64>, ImageError> {
            match rustix::fs::seek(f.file().as_ref(), to) {
                Ok(p) => Ok(Some(p)),
                // No data (or no hole) from there to the end of the file.
                Err(rustix::io::Errno::NXIO) => Ok(Some(end)),
                // Not supported here (a block device, an old filesystem).
                Err(rustix::io::Errno::INVAL | rustix::io::Errno::OPNOTSUPP) => Ok(None),
                Err(e) => Err(ImageError::io(
                    f.path(),
                    "lseek(SEEK_DATA/SEEK_HOLE)",
                    e.into(),
                )),
            }
        };
        let first = out.len();
        let mut at = offset;
        while at < end && out.len() - first < max_extents {
            let Some(data) = seek(rustix::fs::SeekFrom::Data(at))? else {
                out.push(StatusExtent::data(end - at));
                break;
            };
            let data = (data.min(end) / 512 * 512).max(at);
            if data > at {
                out.push(StatusExtent::hole(data - at));
                at = data;
                continue;
            }
            // At least one sector of data, rounded up, never past `end`.
            let hole = seek(rustix::fs::SeekFrom::Hole(at))?
                .map_or(end, |h| h.div_ceil(512) * 512)
                .clamp((at + 512).min(end), end);
            out.push(StatusExtent::data(hole - at));
            at = hole;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_image(name: &str, len: u64) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("pvio-blk-raw-{}-{name}", std::process::id()));
        let f = File::create(&p).unwrap();
        f.set_len(len).unwrap();
        p
    }

    #[test]
    fn einval_on_o_direct_falls_back_to_buffered() {
        let p = temp_image("einval", 1 << 20);
        let mut calls = Vec::new();
        let img = RawImage::open_with(&p, &RawOptions::default(), &mut |p, w, direct| {
            calls.push(direct);
            if direct {
                Err(std::io::Error::from_raw_os_error(libc::EINVAL))
            } else {
                open_file(p, w, false)
            }
        })
        .unwrap();
        assert_eq!(calls, [true, false]);
        assert!(!img.direct_io());
        assert_eq!(img.logical_block_size(), 512);
        assert_eq!(img.size(), 1 << 20);

        let err = RawImage::open_with(
            &p,
            &RawOptions {
                direct_io: DirectIo::Required,
                ..Default::default()
            },
            &mut |_, _, _| Err(std::io::Error::from_raw_os_error(libc::EINVAL)),
        )
        .unwrap_err();
        assert!(
            matches!(err, ImageError::DirectIoUnsupported { .. }),
            "{err}"
        );
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn block_status_shows_the_files_holes_and_data() {
        use std::os::unix::fs::FileExt;
        const M: u64 = 1 << 20;
        let p = temp_image("status", 8 * M);
        let f = OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(&[1u8; 4096], M).unwrap();
        f.write_all_at(&vec![2u8; 3 * M as usize], 4 * M).unwrap();
        drop(f);
        let img = RawImage::open(&p, &RawOptions::default()).unwrap();
        let mut out = Vec::new();
        img.block_status(0, 8 * M, 64, &mut out).unwrap();
        let total: u64 = out.iter().map(|s| s.len).sum();
        assert_eq!(total, 8 * M, "{out:?}");
        assert!(out.iter().all(|s| s.len % 512 == 0 && s.len > 0), "{out:?}");
        // Every written byte is in a data extent; the first MiB is a hole.
        let mut at = 0;
        let mut data = Vec::new();
        for s in &out {
            assert_eq!(s.hole, s.zero, "{out:?}");
            if !s.hole {
                data.push((at, at + s.len));
            }
            at += s.len;
        }
        let covered = |o: u64| data.iter().any(|&(a, b)| a <= o && o < b);
        assert!(covered(M) && covered(M + 4095), "{out:?}");
        assert!(covered(4 * M) && covered(7 * M - 1), "{out:?}");
        assert_eq!(out[0], StatusExtent::hole(M), "{out:?}");
        assert!(!covered(7 * M + 4096), "{out:?}");
        // A range in the middle of a data extent, and a cap on the count.
        out.clear();
        img.block_status(5 * M, 512, 64, &mut out).unwrap();
        assert_eq!(out, [StatusExtent::data(512)]);
        out.clear();
        img.block_status(0, 8 * M, 2, &mut out).unwrap();
        assert_eq!(out.len(), 2);
        assert!(img.block_status(8 * M, 512, 1, &mut out).is_err());
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn other_open_errors_do_not_fall_back() {
        let p = temp_image("eacces", 4096);
        let err = RawImage::open_with(&p, &RawOptions::default(), &mut |_, _, _| {
            Err(std::io::Error::from_raw_os_error(libc::EACCES))
        })
        .unwrap_err();
        assert!(
            matches!(err, ImageError::PermissionDenied { writable: true, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("eacces"), "{err}");
        std::fs::remove_file(p).unwrap();
    }
}
