//! Node permissions: the `<letter><domid>` strings of XS_GET_PERMS and
//! XS_SET_PERMS, and `perm_for_conn()`: which rights a domain has on a node.
//!
//! The first entry names the owner and gives the default access of every
//! domain not listed; later entries override it per domain.

use crate::error::XsError;
use pvio_abi::DomId;

/// Right to read a node (`XS_PERM_READ`).
pub const PERM_READ: u8 = 1;
/// Right to write a node (`XS_PERM_WRITE`).
pub const PERM_WRITE: u8 = 2;
/// Ownership: may change permissions (`XS_PERM_OWNER`).
pub const PERM_OWNER: u8 = 8;
/// Every right.
pub const PERM_ALL: u8 = PERM_READ | PERM_WRITE | PERM_OWNER;

/// The access letter of one permission entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// `n`
    None,
    /// `r`
    Read,
    /// `w`
    Write,
    /// `b`: read and write.
    Both,
}

impl Access {
    /// The rights bits this letter grants.
    pub fn bits(self) -> u8 {
        match self {
            Access::None => 0,
            Access::Read => PERM_READ,
            Access::Write => PERM_WRITE,
            Access::Both => PERM_READ | PERM_WRITE,
        }
    }

    fn letter(self) -> char {
        match self {
            Access::None => 'n',
            Access::Read => 'r',
            Access::Write => 'w',
            Access::Both => 'b',
        }
    }
}

/// One permission entry, e.g. `r5`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Perm {
    pub access: Access,
    pub domid: DomId,
}

impl Perm {
    /// An entry.
    pub const fn new(access: Access, domid: DomId) -> Self {
        Self { access, domid }
    }

    /// Parses `<n|r|w|b><decimal domid>`.
    pub fn parse(s: &[u8]) -> Result<Self, XsError> {
        let (&first, digits) = s.split_first().ok_or(XsError::Einval)?;
        let access = match first {
            b'n' => Access::None,
            b'r' => Access::Read,
            b'w' => Access::Write,
            b'b' => Access::Both,
            _ => return Err(XsError::Einval),
        };
        if digits.is_empty() || digits.len() > 5 || !digits.iter().all(u8::is_ascii_digit) {
            return Err(XsError::Einval);
        }
        let v: u32 = digits
            .iter()
            .fold(0u32, |acc, d| acc * 10 + u32::from(d - b'0'));
        let domid = DomId::try_from(v).map_err(|_| XsError::Einval)?;
        Ok(Self { access, domid })
    }
}

impl core::fmt::Display for Perm {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}{}", self.access.letter(), self.domid)
    }
}

impl core::str::FromStr for Perm {
    type Err = XsError;
    fn from_str(s: &str) -> Result<Self, XsError> {
        Self::parse(s.as_bytes())
    }
}

/// Who is asking, as far as permissions are concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Who {
    pub domid: DomId,
    /// Dom0 and the toolstack: every right everywhere.
    pub privileged: bool,
    /// The domain this one is a device model for (XS_SET_TARGET).
    pub target: Option<DomId>,
}

/// A node's permission list; never empty.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Perms(Vec<Perm>);

impl Perms {
    /// A list; `None` if it is empty.
    pub fn new(list: Vec<Perm>) -> Option<Self> {
        (!list.is_empty()).then_some(Self(list))
    }

    /// `<owner>` with default access `n`: what the daemon's own nodes get.
    pub fn owned_by(domid: DomId) -> Self {
        Self(vec![Perm::new(Access::None, domid)])
    }

    /// The entries, owner first.
    pub fn entries(&self) -> &[Perm] {
        &self.0
    }

    /// The owning domain.
    pub fn owner(&self) -> DomId {
        self.0[0].domid
    }

    /// A copy with a different owner (creation by an unprivileged domain).
    pub fn with_owner(&self, domid: DomId) -> Self {
        let mut v = self.0.clone();
        v[0].domid = domid;
        Self(v)
    }

    /// A copy without the per-domain entries naming `domid`; an owner equal
    /// to `domid` becomes `new_owner` (a released domain's leftovers).
    pub fn without_domain(&self, domid: DomId, new_owner: DomId) -> Self {
        let mut v = vec![self.0[0]];
        if v[0].domid == domid {
            v[0].domid = new_owner;
        }
        v.extend(self.0[1..].iter().filter(|p| p.domid != domid));
        Self(v)
    }

    /// Parses the NUL-separated entries of XS_SET_PERMS.
    pub fn parse<'a>(items: impl IntoIterator<Item = &'a [u8]>) -> Result<Self, XsError> {
        let v = items
            .into_iter()
            .map(Perm::parse)
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(v).ok_or(XsError::Einval)
    }

    /// The XS_GET_PERMS payload: each entry followed by a NUL.
    pub fn encode(&self, out: &mut Vec<u8>) {
        for p in &self.0 {
            out.extend_from_slice(p.to_string().as_bytes());
            out.push(0);
        }
    }

    /// `perm_for_conn()`: the rights of `who` on a node with these permissions.
    pub fn rights_for(&self, who: &Who) -> u8 {
        let owner = self.owner();
        if who.privileged || owner == who.domid || who.target == Some(owner) {
            return PERM_ALL;
        }
        for p in &self.0[1..] {
            if p.domid == who.domid || who.target == Some(p.domid) {
                return p.access.bits();
            }
        }
        self.0[0].access.bits()
    }
}

impl core::fmt::Display for Perms {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guest(domid: DomId) -> Who {
        Who {
            domid,
            privileged: false,
            target: None,
        }
    }

    #[test]
    fn parse_and_format() {
        let p = Perms::parse([&b"n5"[..], b"r0", b"b65535", b"w12"]).unwrap();
        assert_eq!(p.owner(), 5);
        let mut out = Vec::new();
        p.encode(&mut out);
        assert_eq!(out, b"n5\0r0\0b65535\0w12\0");
        for bad in [
            &b""[..],
            b"x1",
            b"r",
            b"r-1",
            b"r65536",
            b"r0x5",
            b"r1 ",
            b"r123456",
        ] {
            assert_eq!(Perm::parse(bad), Err(XsError::Einval), "{bad:?}");
        }
        assert_eq!(Perms::parse(std::iter::empty()), Err(XsError::Einval));
        assert_eq!("b7".parse::<Perm>(), Ok(Perm::new(Access::Both, 7)));
    }

    #[test]
    fn rights() {
        let p = Perms::parse([&b"r5"[..], b"n6", b"w7"]).unwrap();
        assert_eq!(p.rights_for(&guest(5)), PERM_ALL);
        assert_eq!(p.rights_for(&guest(6)), 0);
        assert_eq!(p.rights_for(&guest(7)), PERM_WRITE);
        assert_eq!(p.rights_for(&guest(8)), PERM_READ);
        let dom0 = Who {
            domid: 0,
            privileged: true,
            target: None,
        };
        assert_eq!(p.rights_for(&dom0), PERM_ALL);
        let dm = Who {
            domid: 9,
            privileged: false,
            target: Some(5),
        };
        assert_eq!(p.rights_for(&dm), PERM_ALL);
        let q = p.without_domain(5, 0);
        assert_eq!(q.to_string(), "r0 n6 w7");
        assert_eq!(p.without_domain(7, 0).to_string(), "r5 n6");
    }
}
