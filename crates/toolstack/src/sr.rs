//! The `file` SR: a directory holding one sparse raw image per VDI,
//! `<location>/<vdi-uuid>.raw`. Its device-config keys are `location`
//! (default `<state>/sr/<sr-uuid>`) and `attach-delay-ms` (default 0):
//! how long each attach or detach of one of its VDIs takes, standing in
//! for slow storage (passed to the lifecycle engine as
//! `VbdSpec::attach_delay`).

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::ApiError;

/// The only SR type pvio has.
pub const SR_TYPE_FILE: &str = "file";
/// device-config key: the SR's directory.
pub const KEY_LOCATION: &str = "location";
/// device-config key: milliseconds each VDI attach or detach takes.
pub const KEY_ATTACH_DELAY_MS: &str = "attach-delay-ms";
/// The longest attach delay accepted (an hour).
pub const MAX_ATTACH_DELAY_MS: u64 = 3_600_000;

/// A file SR's settings, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSr {
    pub location: PathBuf,
    pub attach_delay_ms: u64,
    /// The location came from device-config (it must exist already); the
    /// default one is made.
    pub given: bool,
}

impl FileSr {
    /// Checks an `SR.create` device-config, filling in the defaults for an
    /// SR `uuid` whose default home is under `default_parent`.
    pub fn from_device_config(
        dc: &BTreeMap<String, String>,
        default_parent: &Path,
        uuid: &str,
    ) -> Result<Self, ApiError> {
        for (k, v) in dc {
            if k != KEY_LOCATION && k != KEY_ATTACH_DELAY_MS {
                return Err(ApiError::value_not_supported(
                    &format!("device-config:{k}"),
                    v,
                    "file SRs take device-config:location and device-config:attach-delay-ms",
                ));
            }
        }
        let given = dc.contains_key(KEY_LOCATION);
        let location = match dc.get(KEY_LOCATION) {
            None => default_parent.join(uuid),
            Some(l) => {
                let p = PathBuf::from(l);
                if !p.is_absolute() || l.contains('\0') {
                    return Err(ApiError::invalid_value("device-config:location", l));
                }
                p
            }
        };
        let attach_delay_ms = match dc.get(KEY_ATTACH_DELAY_MS) {
            None => 0,
            Some(v) => match v.parse::<u64>() {
                Ok(ms) if ms <= MAX_ATTACH_DELAY_MS => ms,
                _ => return Err(ApiError::invalid_value("device-config:attach-delay-ms", v)),
            },
        };
        Ok(FileSr {
            location,
            attach_delay_ms,
            given,
        })
    }

    /// The device-config as stored and shown (every key, defaults filled in).
    pub fn device_config(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (
                KEY_LOCATION.to_string(),
                self.location.display().to_string(),
            ),
            (
                KEY_ATTACH_DELAY_MS.to_string(),
                self.attach_delay_ms.to_string(),
            ),
        ])
    }

    /// Where VDI `vdi_uuid` of this SR lives.
    pub fn vdi_path(&self, vdi_uuid: &str) -> PathBuf {
        vdi_path(&self.location, vdi_uuid)
    }
}

/// Where VDI `vdi_uuid` of the SR at `location` lives.
pub fn vdi_path(location: &Path, vdi_uuid: &str) -> PathBuf {
    location.join(format!("{vdi_uuid}.raw"))
}

/// Makes the SR's directory; true if it did not exist before.
pub fn create_dir(location: &Path) -> io::Result<bool> {
    if location.is_dir() {
        return Ok(false);
    }
    std::fs::create_dir_all(location)?;
    Ok(true)
}

/// Readies an SR's directory for `SR.create`: the default location is
/// made; one given in device-config must be an existing directory in which
/// files can be made (a probe file is made and removed). True if the
/// directory was made here.
pub fn prepare_location(sr: &FileSr) -> Result<bool, ApiError> {
    let loc = &sr.location;
    let shown = loc.display().to_string();
    let refuse = |why: String| {
        ApiError::value_not_supported(&format!("device-config:{KEY_LOCATION}"), &shown, &why)
    };
    if !sr.given {
        return create_dir(loc)
            .map_err(|e| os_failure(&e, &format!("creating the SR's directory {shown}")));
    }
    match std::fs::metadata(loc) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(refuse("no such directory: create it first".into()))
        }
        Err(e) => return Err(refuse(format!("cannot look at it: {e}"))),
        Ok(m) if !m.is_dir() => {
            return Err(refuse(
                "it is a file, not a directory: an SR's location is a directory".into(),
            ))
        }
        Ok(_) => {}
    }
    let probe = loc.join(format!(".pvio-sr-probe-{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(false)
        }
        Err(e) => Err(refuse(format!("VDI images cannot be made there: {e}"))),
    }
}

/// An OS error of a storage operation as XenAPI reports it.
pub fn os_failure(e: &io::Error, doing: &str) -> ApiError {
    use rustix::io::Errno;
    let status = match e.raw_os_error().map(Errno::from_raw_os_error) {
        Some(Errno::NOSPC) => "ENOSPC".to_string(),
        Some(Errno::DQUOT) => "EDQUOT".to_string(),
        Some(Errno::FBIG) => "EFBIG".to_string(),
        Some(Errno::ACCESS) => "EACCES".to_string(),
        Some(Errno::PERM) => "EPERM".to_string(),
        Some(Errno::ROFS) => "EROFS".to_string(),
        Some(Errno::NOENT) => "ENOENT".to_string(),
        Some(Errno::EXIST) => "EEXIST".to_string(),
        Some(Errno::NOTDIR) => "ENOTDIR".to_string(),
        Some(n) => format!("errno {}", n.raw_os_error()),
        None => "EIO".to_string(),
    };
    ApiError::sr_backend_failure(&status, &format!("{doing}: {e}"))
}

/// Why a VDI's image of `size` bytes could not be made at `path` in the SR
/// at `location`: a size the filesystem cannot hold is named with the
/// largest it can; other OS errors as [`os_failure`].
pub fn image_error(location: &Path, path: &Path, size: u64, e: io::Error) -> ApiError {
    if e.raw_os_error() == Some(rustix::io::Errno::FBIG.raw_os_error()) {
        let max = largest_file(location);
        let reason = match max {
            Some(m) => format!(
                "larger than the SR's filesystem takes in one file: at most {m} bytes ({})",
                crate::api::human_bytes(m)
            ),
            None => "larger than the SR's filesystem takes in one file".into(),
        };
        return ApiError::value_not_supported("virtual_size", &size.to_string(), &reason);
    }
    os_failure(&e, &format!("creating {}", path.display()))
}

/// The largest file (a multiple of 512 bytes) the filesystem holding the
/// directory `dir` takes, found by growing a sparse probe file; `None` if
/// no probe can be made there.
pub fn largest_file(dir: &Path) -> Option<u64> {
    let probe = dir.join(format!(".pvio-size-probe-{}", std::process::id()));
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .ok()?;
    // Invariant: `lo` fits, `hi` does not (in 512-byte units).
    let (mut lo, mut hi) = (0u64, (i64::MAX as u64 / 512) + 1);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if f.set_len(mid * 512).is_ok() {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    drop(f);
    let _ = std::fs::remove_file(&probe);
    Some(lo * 512)
}

/// Creates a VDI's image: a new sparse file of `size` bytes.
pub fn create_image(path: &Path, size: u64) -> io::Result<()> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    if let Err(e) = f.set_len(size) {
        drop(f);
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(())
}

/// Deletes a VDI's image (gone already is fine).
pub fn remove_image(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Bytes a file occupies on disk (0 if it is missing).
pub fn allocated_bytes(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.blocks() * 512)
}

/// Size in bytes of the filesystem holding `path` (0 if unknown).
pub fn filesystem_size(path: &Path) -> u64 {
    rustix::fs::statvfs(path).map_or(0, |s| s.f_blocks.saturating_mul(s.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dc(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn device_config_defaults_and_checks() {
        let parent = Path::new("/state/sr");
        let sr = FileSr::from_device_config(&dc(&[]), parent, "u").unwrap();
        assert_eq!(sr.location, Path::new("/state/sr/u"));
        assert_eq!(sr.attach_delay_ms, 0);
        assert_eq!(sr.vdi_path("v"), Path::new("/state/sr/u/v.raw"));
        let sr = FileSr::from_device_config(
            &dc(&[("location", "/x"), ("attach-delay-ms", "250")]),
            parent,
            "u",
        )
        .unwrap();
        assert_eq!(
            (sr.location.as_path(), sr.attach_delay_ms),
            (Path::new("/x"), 250)
        );
        assert_eq!(
            sr.device_config(),
            dc(&[("location", "/x"), ("attach-delay-ms", "250")])
        );
        for bad in [
            dc(&[("location", "relative")]),
            dc(&[("attach-delay-ms", "-1")]),
            dc(&[("attach-delay-ms", "3600001")]),
            dc(&[("colour", "blue")]),
        ] {
            assert!(
                FileSr::from_device_config(&bad, parent, "u").is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn images_are_sparse_and_sized() {
        let dir = std::env::temp_dir().join(format!("pvio-sr-unit-{}", std::process::id()));
        assert!(create_dir(&dir).unwrap());
        assert!(!create_dir(&dir).unwrap());
        let img = vdi_path(&dir, "a");
        create_image(&img, 1 << 30).unwrap();
        assert_eq!(std::fs::metadata(&img).unwrap().len(), 1 << 30);
        assert!(allocated_bytes(&img) < 1 << 20, "not sparse");
        assert!(
            create_image(&img, 1).is_err(),
            "an existing image was overwritten"
        );
        remove_image(&img).unwrap();
        remove_image(&img).unwrap();
        assert!(filesystem_size(&dir) > 0);
        std::fs::remove_dir(&dir).unwrap();
    }
}
