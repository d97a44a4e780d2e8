//! xe's command-line conventions (xen-api `cli_frontend.ml`
//! `parse_params_2`, `record_util.ml` `bytes_of_string`): arguments are
//! `key=value` (split at the first `=`; map entries as
//! `device-config:location=/x`), `--flag` means `flag=true`, sizes take
//! `KiB`/`MiB`/`GiB`/`TiB` suffixes (and xe's `k`/`kb`/`b`... spellings),
//! booleans are `true`/`false`. pvio adds `--socket PATH` to choose the
//! toolstackd to talk to, and `--help`.

use std::path::PathBuf;

/// A command line taken apart, before it is checked against a command.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawArgs {
    /// `key=value` pairs in the order given (`--x` is `x=true`).
    pub pairs: Vec<(String, String)>,
    /// `--socket PATH`.
    pub socket: Option<PathBuf>,
    /// `--help` (or `help`) was given.
    pub help: bool,
}

/// Why a command line could not be taken apart.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SyntaxError {
    #[error("expected key=value, got '{0}'")]
    NotKeyValue(String),
    #[error("Unknown switch: {0}")]
    UnknownSwitch(String),
    #[error("--socket requires a path")]
    SocketWithoutPath,
    #[error("parameter '{0}' given more than once")]
    Repeated(String),
}

impl RawArgs {
    /// Takes `args` (the words after the command name) apart.
    pub fn parse(args: &[String]) -> Result<RawArgs, SyntaxError> {
        let mut out = RawArgs::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == "--help" || a == "-h" || a == "help" {
                out.help = true;
            } else if a == "--socket" {
                let p = it.next().ok_or(SyntaxError::SocketWithoutPath)?;
                out.socket = Some(PathBuf::from(p));
            } else if let Some(p) = a.strip_prefix("--socket=") {
                out.socket = Some(PathBuf::from(p));
            } else if let Some(flag) = a.strip_prefix("--") {
                if flag.is_empty() || flag.contains('=') {
                    return Err(SyntaxError::UnknownSwitch(a.clone()));
                }
                out.push(flag, "true")?;
            } else if a.starts_with('-') {
                return Err(SyntaxError::UnknownSwitch(a.clone()));
            } else {
                match a.split_once('=') {
                    Some((k, v)) if !k.is_empty() => out.push(k, v)?,
                    _ => return Err(SyntaxError::NotKeyValue(a.clone())),
                }
            }
        }
        Ok(out)
    }

    fn push(&mut self, k: &str, v: &str) -> Result<(), SyntaxError> {
        if self.pairs.iter().any(|(x, _)| x == k) {
            return Err(SyntaxError::Repeated(k.to_string()));
        }
        self.pairs.push((k.to_string(), v.to_string()));
        Ok(())
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// A size in bytes as xe reads it: an integer, optionally followed by a
/// unit (`b`, `bytes`, `k`/`kb`/`kib`, `m`/`mb`/`mib`, `g`/`gb`/`gib`,
/// `t`/`tb`/`tib`, `p`/`pb`/`pib`, `e`/`eb`/`eib`; any case; all powers of
/// 1024).
pub fn parse_size(field: &str, s: &str) -> Result<u64, String> {
    let err = || {
        format!(
            "Failed to parse field '{field}': expecting an integer (possibly with suffix KiB, \
             MiB, GiB, TiB, PiB), got '{s}'"
        )
    };
    let t = s.trim_start();
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(err());
    }
    let n: u64 = t[..digits].parse().map_err(|_| err())?;
    let shift = match t[digits..].trim().to_ascii_lowercase().as_str() {
        "" | "b" | "bytes" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        "p" | "pb" | "pib" => 50,
        "e" | "eb" | "eib" => 60,
        _ => return Err(err()),
    };
    n.checked_mul(1 << shift).ok_or_else(err)
}

/// A boolean as xe reads it (`true`/`false`; also `yes`/`no`, `on`/`off`, `1`/`0`).
pub fn parse_bool(field: &str, s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Ok(true),
        "false" | "no" | "off" | "0" => Ok(false),
        _ => Err(format!(
            "Failed to parse field '{field}': expecting a boolean (true or false), got '{s}'"
        )),
    }
}

/// A non-negative integer.
pub fn parse_int(field: &str, s: &str) -> Result<u64, String> {
    s.parse::<u64>()
        .map_err(|_| format!("Failed to parse field '{field}': expecting an integer, got '{s}'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(words: &[&str]) -> Result<RawArgs, SyntaxError> {
        RawArgs::parse(&words.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn key_values_flags_and_maps() {
        let a = parse(&[
            "name-label=a=b",
            "device-config:location=/x",
            "--minimal",
            "empty=",
            "--socket",
            "/s",
        ])
        .unwrap();
        assert_eq!(
            a.pairs,
            [
                ("name-label".to_string(), "a=b".to_string()),
                ("device-config:location".into(), "/x".into()),
                ("minimal".into(), "true".into()),
                ("empty".into(), "".into()),
            ]
        );
        assert_eq!(a.socket.as_deref(), Some(std::path::Path::new("/s")));
        assert!(!a.help);
        assert_eq!(a.get("empty"), Some(""));
        assert!(parse(&["--help"]).unwrap().help);
        assert_eq!(
            parse(&["--socket=/t"]).unwrap().socket.unwrap(),
            PathBuf::from("/t")
        );
    }

    #[test]
    fn malformed_words_are_refused() {
        assert_eq!(
            parse(&["oops"]),
            Err(SyntaxError::NotKeyValue("oops".into()))
        );
        assert_eq!(parse(&["=x"]), Err(SyntaxError::NotKeyValue("=x".into())));
        assert_eq!(
            parse(&["-s", "h"]),
            Err(SyntaxError::UnknownSwitch("-s".into()))
        );
        assert_eq!(
            parse(&["--a=b"]),
            Err(SyntaxError::UnknownSwitch("--a=b".into()))
        );
        assert_eq!(parse(&["--socket"]), Err(SyntaxError::SocketWithoutPath));
        assert_eq!(
            parse(&["a=1", "a=2"]),
            Err(SyntaxError::Repeated("a".into()))
        );
    }

    #[test]
    fn sizes_take_xes_units() {
        assert_eq!(parse_size("s", "1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("s", "512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("s", "512 mb"), Ok(512 << 20));
        assert_eq!(parse_size("s", "4k"), Ok(4096));
        assert_eq!(parse_size("s", "2T"), Ok(2 << 40));
        assert_eq!(parse_size("s", "1PiB"), Ok(1 << 50));
        assert_eq!(parse_size("s", "7EiB"), Ok(7 << 60));
        assert_eq!(parse_size("s", "1048576"), Ok(1 << 20));
        assert_eq!(parse_size("s", "7 bytes"), Ok(7));
        for bad in [
            "",
            "GiB",
            "-1",
            "1.5GiB",
            "1 GiB x",
            "99999999999999999999",
            "16777216TiB",
            "16EiB",
        ] {
            let e = parse_size("virtual-size", bad).unwrap_err();
            assert!(e.contains("'virtual-size'") && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn booleans_and_integers() {
        assert_eq!(parse_bool("b", "TRUE"), Ok(true));
        assert_eq!(parse_bool("b", "no"), Ok(false));
        assert!(parse_bool("sharable", "maybe")
            .unwrap_err()
            .contains("'sharable'"));
        assert_eq!(parse_int("n", "12"), Ok(12));
        assert!(parse_int("VCPUs-max", "two")
            .unwrap_err()
            .contains("'VCPUs-max'"));
        assert!(parse_int("n", "-1").is_err());
    }
}
