//! Raw images on real files: opening (O_DIRECT probing, sizes, errors that
//! name the file), mapping, and the blocking flush and discard.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use pvio_blk::image::{
    DirectIo, Extent, Image, ImageError, MapOp, MapOutcome, RawImage, RawOptions,
};

struct Temp(PathBuf);

impl Temp {
    fn file(name: &str, len: u64) -> Self {
        let t = Self::path(name);
        File::create(&t.0).unwrap().set_len(len).unwrap();
        t
    }
    fn path(name: &str) -> Self {
        Temp(std::env::temp_dir().join(format!("pvio-blk-image-{}-{name}", std::process::id())))
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn opens_with_o_direct_where_the_filesystem_allows() {
    let t = Temp::file("direct", 1 << 20);
    let required = RawImage::open(
        &t.0,
        &RawOptions {
            direct_io: DirectIo::Required,
            ..Default::default()
        },
    );
    let auto = RawImage::open(&t.0, &RawOptions::default()).unwrap();
    match required {
        Ok(img) => {
            assert!(img.direct_io());
            assert!(auto.direct_io(), "auto must use O_DIRECT where it works");
        }
        Err(ImageError::DirectIoUnsupported { .. }) => assert!(!auto.direct_io()),
        Err(e) => panic!("{e}"),
    }
    let lbs = auto.logical_block_size();
    assert!(
        lbs.is_power_of_two() && (512..=65536).contains(&lbs),
        "{lbs}"
    );
    assert_eq!(auto.size(), 1 << 20);
    assert_eq!(auto.format(), "raw");
    assert!(!auto.read_only());
    assert!(auto.supports_discard());

    let off = RawImage::open(
        &t.0,
        &RawOptions {
            direct_io: DirectIo::Off,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!off.direct_io());
    assert_eq!(off.logical_block_size(), 512);
    assert_eq!(off.memory_alignment(), 1);
}

#[test]
fn open_errors_name_the_file() {
    let missing = Temp::path("missing");
    let e = RawImage::open(&missing.0, &RawOptions::default()).unwrap_err();
    assert!(matches!(e, ImageError::NotFound { .. }), "{e}");
    assert!(e.to_string().contains("missing"), "{e}");

    let dir = Temp::path("dir");
    std::fs::create_dir(&dir.0).unwrap();
    let e = RawImage::open(&dir.0, &RawOptions::default()).unwrap_err();
    assert!(matches!(e, ImageError::NotAFileOrDevice { .. }), "{e}");

    let empty = Temp::file("empty", 0);
    let e = RawImage::open(&empty.0, &RawOptions::default()).unwrap_err();
    assert!(matches!(e, ImageError::BadSize { size: 0, .. }), "{e}");
    assert!(e.to_string().contains("empty"), "{e}");

    let odd = Temp::file("odd", 1000);
    let e = RawImage::open(&odd.0, &RawOptions::default()).unwrap_err();
    assert!(matches!(e, ImageError::BadSize { size: 1000, .. }), "{e}");

    let t = Temp::file("sized", 8192);
    let e = RawImage::open(
        &t.0,
        &RawOptions {
            expected_size: Some(4096),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            ImageError::SizeMismatch {
                expected: 4096,
                actual: 8192,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("sized"), "{e}");

    // Without CAP_DAC_OVERRIDE, a read-only file cannot be opened for
    // writing (root bypasses the mode, so this only runs as a user; the
    // mapping of EACCES is unit-tested in image/raw.rs).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&t.0, std::fs::Permissions::from_mode(0o400)).unwrap();
        let e = RawImage::open(&t.0, &RawOptions::default()).unwrap_err();
        assert!(
            matches!(e, ImageError::PermissionDenied { writable: true, .. }),
            "{e}"
        );
        let ro = RawOptions {
            read_only: true,
            ..Default::default()
        };
        assert!(RawImage::open(&t.0, &ro).is_ok());
    }
}

#[test]
fn map_checks_range_and_mode() {
    let t = Temp::file("map", 1 << 20);
    let img = RawImage::open(&t.0, &RawOptions::default()).unwrap();
    let mut out = Vec::new();
    for op in [MapOp::Read, MapOp::Write, MapOp::Discard] {
        out.clear();
        assert_eq!(
            img.map(op, 4096, 8192, &mut out).unwrap(),
            MapOutcome::Complete
        );
        assert_eq!(
            out,
            [Extent::File {
                file: 0,
                offset: 4096,
                len: 8192
            }]
        );
    }
    out.clear();
    assert!(img.map(MapOp::Read, (1 << 20) - 512, 512, &mut out).is_ok());
    let e = img
        .map(MapOp::Read, (1 << 20) - 512, 1024, &mut out)
        .unwrap_err();
    assert!(matches!(e, ImageError::OutOfRange { .. }), "{e}");
    let e = img.map(MapOp::Read, u64::MAX, 2, &mut out).unwrap_err();
    assert!(matches!(e, ImageError::OutOfRange { .. }), "{e}");
    assert_eq!(img.sync_files(), [0]);
    let limits = img.disk_limits();
    assert_eq!(limits.sectors, (1 << 20) / 512);
    assert_eq!(limits.logical_block_size, img.logical_block_size());
    assert!(limits.discard && !limits.read_only);

    let ro = RawImage::open(
        &t.0,
        &RawOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(ro.read_only());
    assert!(!ro.files()[0].writable());
    assert!(ro.sync_files().is_empty());
    assert!(ro.disk_limits().read_only && !ro.disk_limits().discard);
    assert!(ro.map(MapOp::Read, 0, 512, &mut out).is_ok());
    for op in [MapOp::Write, MapOp::Discard] {
        let e = ro.map(op, 0, 512, &mut out).unwrap_err();
        assert!(matches!(e, ImageError::ReadOnly { .. }), "{e}");
    }
    assert!(matches!(
        ro.discard(0, 512),
        Err(ImageError::ReadOnly { .. })
    ));
}

#[test]
fn blocking_discard_zeroes_and_keeps_the_size() {
    let t = Temp::file("discard", 1 << 20);
    let data = vec![0xabu8; 64 << 10];
    File::options()
        .write(true)
        .open(&t.0)
        .unwrap()
        .write_all_at(&data, 0)
        .unwrap();
    let img = RawImage::open(&t.0, &RawOptions::default()).unwrap();
    img.discard(8192, 16384).unwrap();
    img.flush().unwrap();
    let back = std::fs::read(&t.0).unwrap();
    assert_eq!(back.len(), 1 << 20);
    assert!(back[..8192].iter().all(|&b| b == 0xab));
    assert!(back[8192..24576].iter().all(|&b| b == 0));
    assert!(back[24576..65536].iter().all(|&b| b == 0xab));
    assert!(matches!(
        img.discard(1 << 20, 512),
        Err(ImageError::OutOfRange { .. })
    ));
}
