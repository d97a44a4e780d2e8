//! fio's spelling of sizes (`4k`, `1m`, `2g`: powers of 1024) and durations
//! (`10s`, `500ms`, `2m`; a bare number is seconds), parsed and printed so
//! that printing then parsing gives the same value back.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::error::SpecError;

/// A byte count written fio's way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The count in bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for ByteSize {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, SpecError> {
        let bad = || SpecError::BadValue {
            key: "size",
            value: s.to_string(),
            expected: "a byte count such as 512, 4k, 1m or 2g",
        };
        let t = s.trim();
        let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        if digits == 0 {
            return Err(bad());
        }
        let n: u64 = t[..digits].parse().map_err(|_| bad())?;
        let unit = t[digits..].to_ascii_lowercase();
        let shift = match unit.as_str() {
            "" | "b" => 0,
            "k" | "kb" | "kib" => 10,
            "m" | "mb" | "mib" => 20,
            "g" | "gb" | "gib" => 30,
            "t" | "tb" | "tib" => 40,
            _ => return Err(bad()),
        };
        n.checked_mul(1u64 << shift).map(ByteSize).ok_or_else(bad)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        for (shift, unit) in [(40, "t"), (30, "g"), (20, "m"), (10, "k")] {
            if n != 0 && n.is_multiple_of(1u64 << shift) {
                return write!(f, "{}{unit}", n >> shift);
            }
        }
        write!(f, "{n}")
    }
}

/// Parses a duration: a whole number followed by `ns`, `us`, `ms`, `s`,
/// `m` or `h` (none: seconds).
pub fn parse_duration(s: &str) -> Result<Duration, SpecError> {
    let bad = || SpecError::BadValue {
        key: "duration",
        value: s.to_string(),
        expected: "a duration such as 10s, 500ms, 2m or 1h",
    };
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    if digits == 0 {
        return Err(bad());
    }
    let n: u64 = t[..digits].parse().map_err(|_| bad())?;
    let scale = |mul: u64| n.checked_mul(mul).ok_or_else(bad);
    Ok(match t[digits..].to_ascii_lowercase().as_str() {
        "ns" => Duration::from_nanos(n),
        "us" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" | "min" => Duration::from_secs(scale(60)?),
        "h" => Duration::from_secs(scale(3600)?),
        _ => return Err(bad()),
    })
}

/// Prints a duration in the largest unit that keeps it exact.
pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".to_string();
    }
    for (div, unit) in [
        (3_600_000_000_000u128, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
    ] {
        if ns.is_multiple_of(div) {
            return format!("{}{unit}", ns / div);
        }
    }
    format!("{ns}ns")
}

/// Parses fio's booleans: `1`/`0`, `true`/`false`, `yes`/`no`, `on`/`off`.
pub fn parse_bool(s: &str) -> Result<bool, SpecError> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(SpecError::BadValue {
            key: "flag",
            value: s.to_string(),
            expected: "1 or 0",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        let p = |s: &str| s.parse::<ByteSize>().map(ByteSize::bytes);
        assert_eq!(p("512").unwrap(), 512);
        assert_eq!(p("4k").unwrap(), 4096);
        assert_eq!(p("4K").unwrap(), 4096);
        assert_eq!(p("4KiB").unwrap(), 4096);
        assert_eq!(p("1m").unwrap(), 1 << 20);
        assert_eq!(p("2g").unwrap(), 2 << 30);
        for bad in [
            "",
            "k",
            "4x",
            "-1",
            "4 k k",
            "99999999999999999999",
            "20000000t",
        ] {
            assert!(p(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn durations_parse_with_units() {
        let p = |s: &str| parse_duration(s).unwrap();
        assert_eq!(p("10"), Duration::from_secs(10));
        assert_eq!(p("10s"), Duration::from_secs(10));
        assert_eq!(p("500ms"), Duration::from_millis(500));
        assert_eq!(p("2m"), Duration::from_secs(120));
        assert_eq!(p("1h"), Duration::from_secs(3600));
        assert_eq!(p("7us"), Duration::from_micros(7));
        for bad in ["", "s", "1d", "1.5s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} parsed");
        }
    }

    proptest! {
        #[test]
        fn sizes_round_trip(n in 0u64..(1u64 << 50)) {
            let s = ByteSize(n).to_string();
            prop_assert_eq!(s.parse::<ByteSize>().unwrap(), ByteSize(n));
        }

        #[test]
        fn durations_round_trip(ns in 0u64..(1u64 << 50)) {
            let d = Duration::from_nanos(ns);
            prop_assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
        }
    }
}
