//! What a job does, in fio's vocabulary: a struct that clap can fill from
//! `--rw randread --bs 4k ...` and a parser for the compact form
//! `rw=randread,bs=4k,iodepth=32,runtime=10s` (see [`JobSpec::parse`]).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::ArgAction;

use super::error::SpecError;
use super::units::{format_duration, parse_bool, parse_duration, ByteSize};

/// The I/O pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RwMode {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Reads at random offsets.
    #[default]
    RandRead,
    /// Writes at random offsets.
    RandWrite,
    /// Reads and writes at random offsets, `rwmixread` percent reads.
    RandRw,
}

impl RwMode {
    /// The pattern issues writes.
    pub fn writes(self) -> bool {
        matches!(self, Self::Write | Self::RandWrite | Self::RandRw)
    }
    /// The pattern issues reads.
    pub fn reads(self) -> bool {
        matches!(self, Self::Read | Self::RandRead | Self::RandRw)
    }
    /// Offsets are random rather than sequential.
    pub fn random(self) -> bool {
        matches!(self, Self::RandRead | Self::RandWrite | Self::RandRw)
    }
}

impl FromStr for RwMode {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        Ok(match s {
            "read" => Self::Read,
            "write" => Self::Write,
            "randread" => Self::RandRead,
            "randwrite" => Self::RandWrite,
            "randrw" => Self::RandRw,
            _ => {
                return Err(SpecError::BadValue {
                    key: "rw",
                    value: s.to_string(),
                    expected: "read, write, randread, randwrite or randrw",
                })
            }
        })
    }
}

impl fmt::Display for RwMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::RandRead => "randread",
            Self::RandWrite => "randwrite",
            Self::RandRw => "randrw",
        })
    }
}

/// Data verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Verify {
    /// Data is not checked.
    #[default]
    None,
    /// Every written block carries a header and a CRC-32C; reads of blocks
    /// the job wrote are checked against the last acknowledged write.
    Crc32c,
}

impl FromStr for Verify {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        match s {
            "none" | "0" | "off" => Ok(Self::None),
            "crc32c" => Ok(Self::Crc32c),
            _ => Err(SpecError::BadValue {
                key: "verify",
                value: s.to_string(),
                expected: "none or crc32c",
            }),
        }
    }
}

impl fmt::Display for Verify {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::Crc32c => "crc32c",
        })
    }
}

/// One job description; `numjobs` copies of it run side by side, each on
/// its own device.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct JobSpec {
    /// I/O pattern: read, write, randread, randwrite or randrw.
    #[arg(long, default_value = "randread")]
    pub rw: RwMode,
    /// Percentage of reads in randrw.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub rwmixread: u8,
    /// Block size: a multiple of the sector size, at most the device's
    /// largest request (k/m suffixes).
    #[arg(long, default_value = "4k")]
    pub bs: ByteSize,
    /// Requests each job keeps in flight (at most the device's buffers).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub iodepth: u32,
    /// Jobs run side by side, each on its own device and thread.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub numjobs: u32,
    /// Stop issuing I/O after this long (after the ramp).
    #[arg(long, value_parser = parse_duration)]
    pub runtime: Option<Duration>,
    /// Bytes each job transfers (default: its whole range).
    #[arg(long)]
    pub size: Option<ByteSize>,
    /// Start of the range used, in bytes.
    #[arg(long, default_value = "0")]
    pub offset: ByteSize,
    /// Length of the range used (default: to the end of the device).
    #[arg(long)]
    pub range: Option<ByteSize>,
    /// Accepted for fio compatibility: the device is always direct.
    #[arg(long, default_value = "1", value_parser = parse_bool, action = ArgAction::Set)]
    pub direct: bool,
    /// Data verification: none or crc32c.
    #[arg(long, default_value = "none")]
    pub verify: Verify,
    /// Seed of the random offsets and of the verify payload.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Run this long before measuring.
    #[arg(long, value_parser = parse_duration)]
    pub ramp: Option<Duration>,
    /// Save the map of acknowledged writes here after the write phase
    /// (`PATH.N` for job N when numjobs > 1).
    #[arg(long)]
    pub verify_save: Option<PathBuf>,
    /// Only verify: read back the writes recorded in this saved map.
    #[arg(long)]
    pub verify_load: Option<PathBuf>,
}

impl Default for JobSpec {
    fn default() -> Self {
        Self {
            rw: RwMode::RandRead,
            rwmixread: 50,
            bs: ByteSize(4096),
            iodepth: 1,
            numjobs: 1,
            runtime: None,
            size: None,
            offset: ByteSize(0),
            range: None,
            direct: true,
            verify: Verify::None,
            seed: 1,
            ramp: None,
            verify_save: None,
            verify_load: None,
        }
    }
}

impl JobSpec {
    /// Parses the compact form: comma-separated `key=value` items, keys as
    /// the field names, unnamed keys keeping their defaults; then checks
    /// the result with [`JobSpec::validate`].
    pub fn parse(s: &str) -> Result<Self, SpecError> {
        let mut spec = Self::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| SpecError::NotKeyValue(item.to_string()))?;
            spec.set(key.trim(), value.trim())?;
        }
        spec.validate()?;
        Ok(spec)
    }

    /// Sets one field from its compact-form key and value.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), SpecError> {
        let num = |key: &'static str| {
            move |_| SpecError::BadValue {
                key,
                value: value.to_string(),
                expected: "a whole number",
            }
        };
        match key {
            "rw" | "readwrite" => self.rw = value.parse()?,
            "rwmixread" => self.rwmixread = value.parse().map_err(num("rwmixread"))?,
            "bs" | "blocksize" => self.bs = value.parse()?,
            "iodepth" => self.iodepth = value.parse().map_err(num("iodepth"))?,
            "numjobs" => self.numjobs = value.parse().map_err(num("numjobs"))?,
            "runtime" => self.runtime = Some(parse_duration(value)?),
            "size" => self.size = Some(value.parse()?),
            "offset" => self.offset = value.parse()?,
            "range" => self.range = Some(value.parse()?),
            "direct" => self.direct = parse_bool(value)?,
            "verify" => self.verify = value.parse()?,
            "seed" | "randseed" => self.seed = value.parse().map_err(num("seed"))?,
            "ramp" | "ramp_time" => self.ramp = Some(parse_duration(value)?),
            "verify_save" => self.verify_save = Some(PathBuf::from(value)),
            "verify_load" => self.verify_load = Some(PathBuf::from(value)),
            _ => return Err(SpecError::UnknownKey(key.to_string())),
        }
        Ok(())
    }

    /// Checks what can be checked without a device.
    pub fn validate(&self) -> Result<(), SpecError> {
        let invalid = |m: &str| Err(SpecError::Invalid(m.to_string()));
        if self.rwmixread > 100 {
            return invalid("rwmixread is a percentage (0..=100)");
        }
        if self.bs.0 < 512 || self.bs.0 > u64::from(u32::MAX) {
            return invalid("bs must be at least 512 bytes and below 4 GiB");
        }
        if self.iodepth == 0 || self.numjobs == 0 {
            return invalid("iodepth and numjobs must be at least 1");
        }
        if self.runtime == Some(Duration::ZERO) {
            return invalid("runtime must be more than zero");
        }
        if self.size.is_some_and(|s| s.0 < self.bs.0) {
            return invalid("size must be at least one block (bs)");
        }
        if self.range.is_some_and(|r| r.0 < self.bs.0) {
            return invalid("range must be at least one block (bs)");
        }
        let verifying = self.verify != Verify::None;
        if (self.verify_save.is_some() || self.verify_load.is_some()) && !verifying {
            return invalid("verify_save and verify_load need verify=crc32c");
        }
        if self.verify_save.is_some() && self.verify_load.is_some() {
            return invalid("verify_save and verify_load cannot be combined");
        }
        if self.verify_load.is_some() && self.rw.writes() {
            return invalid("verify_load only reads: use rw=read or rw=randread");
        }
        if verifying && !self.rw.writes() && self.verify_load.is_none() {
            return invalid("verify with a read-only pattern needs verify_load (a saved map)");
        }
        Ok(())
    }
}

impl FromStr for JobSpec {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        Self::parse(s)
    }
}

/// The compact form; parsing it gives the same spec back (paths must not
/// contain commas).
impl fmt::Display for JobSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = Self::default();
        write!(f, "rw={},bs={},iodepth={}", self.rw, self.bs, self.iodepth)?;
        if self.rwmixread != d.rwmixread {
            write!(f, ",rwmixread={}", self.rwmixread)?;
        }
        if self.numjobs != d.numjobs {
            write!(f, ",numjobs={}", self.numjobs)?;
        }
        if let Some(r) = self.runtime {
            write!(f, ",runtime={}", format_duration(r))?;
        }
        if let Some(s) = self.size {
            write!(f, ",size={s}")?;
        }
        if self.offset != d.offset {
            write!(f, ",offset={}", self.offset)?;
        }
        if let Some(r) = self.range {
            write!(f, ",range={r}")?;
        }
        if self.direct != d.direct {
            write!(f, ",direct={}", u8::from(self.direct))?;
        }
        if self.verify != d.verify {
            write!(f, ",verify={}", self.verify)?;
        }
        if self.seed != d.seed {
            write!(f, ",seed={}", self.seed)?;
        }
        if let Some(r) = self.ramp {
            write!(f, ",ramp={}", format_duration(r))?;
        }
        if let Some(p) = &self.verify_save {
            write!(f, ",verify_save={}", p.display())?;
        }
        if let Some(p) = &self.verify_load {
            write!(f, ",verify_load={}", p.display())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use proptest::prelude::*;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        job: JobSpec,
    }

    #[test]
    fn parses_the_compact_form() {
        let s = JobSpec::parse("rw=randread,bs=4k,iodepth=32,runtime=10s").unwrap();
        assert_eq!(s.rw, RwMode::RandRead);
        assert_eq!(s.bs, ByteSize(4096));
        assert_eq!(s.iodepth, 32);
        assert_eq!(s.runtime, Some(Duration::from_secs(10)));
        assert_eq!(s.size, None);
        let s = JobSpec::parse(
            "rw=randrw, rwmixread=70, bs=64k, numjobs=2, size=1m, offset=1m, range=4m, \
             direct=0, seed=9, ramp=1s",
        )
        .unwrap();
        assert_eq!((s.rw, s.rwmixread, s.numjobs), (RwMode::RandRw, 70, 2));
        assert_eq!(
            (s.size, s.offset, s.range),
            (
                Some(ByteSize(1 << 20)),
                ByteSize(1 << 20),
                Some(ByteSize(4 << 20))
            )
        );
        assert_eq!(
            (s.direct, s.seed, s.ramp),
            (false, 9, Some(Duration::from_secs(1)))
        );
        assert_eq!(JobSpec::parse("").unwrap(), JobSpec::default());
    }

    #[test]
    fn rejects_bad_specs_with_the_reason() {
        let err = |s: &str| JobSpec::parse(s).unwrap_err().to_string();
        assert!(err("rw=rw").contains("randrw"));
        assert!(err("bogus=1").contains("unknown job key"));
        assert!(err("iodepth").contains("not key=value"));
        assert!(err("iodepth=0").contains("at least 1"));
        assert!(err("bs=256").contains("at least 512"));
        assert!(err("rwmixread=101").contains("percentage"));
        assert!(err("rw=randread,verify=crc32c").contains("verify_load"));
        assert!(err("rw=randwrite,verify_save=/tmp/x").contains("need verify"));
        assert!(err("rw=write,verify=crc32c,verify_load=/tmp/x").contains("only reads"));
        assert!(err("size=1k,bs=4k").contains("size"));
        assert!(err("runtime=0").contains("runtime"));
    }

    #[test]
    fn clap_defaults_match_default() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.job, JobSpec::default());
        let cli = Cli::try_parse_from([
            "x",
            "--rw",
            "randwrite",
            "--bs",
            "8k",
            "--iodepth",
            "4",
            "--direct",
            "0",
            "--verify",
            "crc32c",
            "--runtime",
            "2s",
        ])
        .unwrap();
        assert_eq!(
            cli.job,
            JobSpec::parse("rw=randwrite,bs=8k,iodepth=4,direct=0,verify=crc32c,runtime=2s")
                .unwrap()
        );
        assert!(Cli::try_parse_from(["x", "--iodepth", "0"]).is_err());
    }

    fn arb_spec() -> impl Strategy<Value = JobSpec> {
        let modes = prop_oneof![
            Just(RwMode::Read),
            Just(RwMode::Write),
            Just(RwMode::RandRead),
            Just(RwMode::RandWrite),
            Just(RwMode::RandRw)
        ];
        (
            modes,
            0u8..=100,
            1u64..64,
            1u32..256,
            1u32..8,
            proptest::option::of(1u64..100_000),
            proptest::option::of(64u64..1 << 20),
            0u64..1 << 20,
            any::<bool>(),
            any::<bool>(),
            any::<u64>(),
        )
            .prop_map(
                |(rw, mix, bs, depth, jobs, ms, size, off, direct, verify, seed)| {
                    let bs = bs * 512;
                    JobSpec {
                        rw,
                        rwmixread: mix,
                        bs: ByteSize(bs),
                        iodepth: depth,
                        numjobs: jobs,
                        runtime: ms.map(Duration::from_millis),
                        size: size.map(|s| ByteSize(s * 512 + bs)),
                        offset: ByteSize(off * 512),
                        range: None,
                        direct,
                        verify: if verify && rw.writes() {
                            Verify::Crc32c
                        } else {
                            Verify::None
                        },
                        seed,
                        ramp: ms.map(Duration::from_micros),
                        verify_save: None,
                        verify_load: None,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn display_round_trips(spec in arb_spec()) {
            prop_assert_eq!(JobSpec::parse(&spec.to_string()).unwrap(), spec);
        }
    }
}
