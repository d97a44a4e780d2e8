//! VBD slots: a VBD's `userdevice` (0..=254, XenAPI's position of the disk
//! in the VM) becomes the xenstore device id the backend and frontend use,
//! with Xen's xvd scheme (`docs/misc/vbd-interface.txt`): slots below 16
//! are `(202 << 8) | (n << 4)`, the rest use the extended form
//! `(1 << 28) | (n << 8)`. Linux names the disks `xvda`, `xvdb`, ...,
//! `xvdz`, `xvdaa`, ...

/// Slots per VM: userdevices 0..=254 (XenAPI allows up to 255 VBDs).
pub const MAX_VBDS_PER_VM: u32 = 255;

/// The largest userdevice.
pub const MAX_USERDEVICE: u32 = MAX_VBDS_PER_VM - 1;

/// The device id (`virtual-device`) of userdevice `n` with Xen's xvd scheme.
pub fn devid_of_userdevice(n: u32) -> u32 {
    if n < 16 {
        (202 << 8) | (n << 4)
    } else {
        (1 << 28) | (n << 8)
    }
}

/// The userdevice whose device id is `devid` (the inverse of
/// [`devid_of_userdevice`]).
pub fn userdevice_of_devid(devid: u32) -> Option<u32> {
    let n = if devid & (1 << 28) != 0 {
        (devid & !(1 << 28)) >> 8
    } else if devid >> 8 == 202 {
        (devid & 0xff) >> 4
    } else {
        return None;
    };
    (n <= MAX_USERDEVICE && devid_of_userdevice(n) == devid).then_some(n)
}

/// Linux's name for userdevice `n`: `xvda` for 0, `xvdz` for 25, `xvdaa` for 26.
pub fn device_name(n: u32) -> String {
    // Bijective base 26: a..z, aa..zz, aaa...
    let mut letters = Vec::new();
    let mut k = u64::from(n) + 1;
    while k > 0 {
        k -= 1;
        letters.push(b'a' + (k % 26) as u8);
        k /= 26;
    }
    letters.reverse();
    format!("xvd{}", String::from_utf8_lossy(&letters))
}

/// Parses a userdevice as `xe vbd-create device=` takes it: a number
/// 0..=254 (or a Linux name like `xvdb`, which xapi accepts too).
pub fn parse_userdevice(s: &str) -> Option<u32> {
    if let Ok(n) = s.parse::<u32>() {
        return (n <= MAX_USERDEVICE && (s == "0" || !s.starts_with('0'))).then_some(n);
    }
    let letters = s.strip_prefix("xvd")?;
    if letters.is_empty() || !letters.bytes().all(|b| b.is_ascii_lowercase()) || letters.len() > 2 {
        return None;
    }
    let mut k: u32 = 0;
    for b in letters.bytes() {
        k = k * 26 + u32::from(b - b'a') + 1;
    }
    let n = k - 1;
    (n <= MAX_USERDEVICE).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devids_follow_xens_xvd_scheme() {
        assert_eq!(devid_of_userdevice(0), 51712); // xvda
        assert_eq!(devid_of_userdevice(1), 51728); // xvdb
        assert_eq!(devid_of_userdevice(15), 51952); // xvdp
        assert_eq!(devid_of_userdevice(16), (1 << 28) | (16 << 8));
        assert_eq!(devid_of_userdevice(254), (1 << 28) | (254 << 8));
        let all: std::collections::HashSet<u32> =
            (0..=MAX_USERDEVICE).map(devid_of_userdevice).collect();
        assert_eq!(all.len(), 255, "two slots share a device id");
        for n in 0..=MAX_USERDEVICE {
            assert_eq!(userdevice_of_devid(devid_of_userdevice(n)), Some(n));
        }
        for bad in [0, 51713, 768, (1 << 28) | (255 << 8), (1 << 28) | 1] {
            assert_eq!(userdevice_of_devid(bad), None, "{bad}");
        }
    }

    #[test]
    fn names_and_numbers_agree() {
        assert_eq!(device_name(0), "xvda");
        assert_eq!(device_name(25), "xvdz");
        assert_eq!(device_name(26), "xvdaa");
        assert_eq!(device_name(254), "xvdiu");
        for n in 0..=MAX_USERDEVICE {
            assert_eq!(parse_userdevice(&n.to_string()), Some(n));
            assert_eq!(
                parse_userdevice(&device_name(n)),
                Some(n),
                "{}",
                device_name(n)
            );
        }
        for bad in [
            "255", "-1", "", "01", "x", "xvd", "xvdA", "xvdzz", "1e3", " 1",
        ] {
            assert_eq!(parse_userdevice(bad), None, "{bad:?}");
        }
    }
}
