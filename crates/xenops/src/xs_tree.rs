//! What the toolstack writes in the xenstore for a domain and its disks,
//! with libxl's layout and permissions.
//!
//! * The domain's home `/local/domain/<domid>`: `name`, `domid`, `vm`,
//!   `memory/target`, `cpu/<n>/availability`, and the directories the guest
//!   owns (`device`, `data`, `control`); `action-request = poweroff` marks a
//!   domain whose start is not finished (xenopsd's marker: a toolstack that
//!   finds it shuts the domain down).
//! * `/vm/<uuid>`: `name`, `uuid`, `domains/<domid>`.
//! * A VBD: the frontend directory `/local/domain/<domid>/device/vbd/<devid>`
//!   (owned by the guest, readable by dom0) and the backend directory
//!   `/local/domain/0/backend/vbd/<domid>/<devid>` (owned by dom0, readable
//!   by the guest), written in one transaction.

use std::path::Path;

use pvio_xenstore::{Access, Client, Perm, Perms, XsError};

use crate::spec::VmSpec;

/// A domain's home directory.
pub fn home(domid: u16) -> String {
    format!("/local/domain/{domid}")
}

/// The directory of a domain's VBD backends.
pub fn vbd_backends(domid: u16) -> String {
    format!("/local/domain/0/backend/vbd/{domid}")
}

/// A VM's `/vm/<uuid>` directory.
pub fn vm_dir(uuid: &str) -> String {
    format!("/vm/{uuid}")
}

/// The start-in-progress marker (xenopsd's `action-request`).
pub fn action_request(domid: u16) -> String {
    format!("{}/action-request", home(domid))
}

/// Writes a new domain's home and `/vm/<uuid>`, in one transaction.
pub async fn write_domain(
    xs: &Client,
    domid: u16,
    spec: &VmSpec,
) -> Result<(), pvio_xenstore::Error> {
    let home = home(domid);
    let vm = vm_dir(&spec.uuid);
    let be = vbd_backends(domid);
    let mut dom0_only: Vec<(String, String)> = vec![
        (format!("{home}/name"), spec.name.clone()),
        (format!("{home}/domid"), domid.to_string()),
        (format!("{home}/vm"), vm.clone()),
        (
            format!("{home}/memory/target"),
            (u64::from(spec.memory_mib) * 1024).to_string(),
        ),
        (action_request(domid), "poweroff".into()),
        (format!("{vm}/name"), spec.name.clone()),
        (format!("{vm}/uuid"), spec.uuid.clone()),
        (format!("{vm}/domains/{domid}"), home.clone()),
    ];
    for cpu in 0..spec.vcpus.max(1) {
        dom0_only.push((format!("{home}/cpu/{cpu}/availability"), "online".into()));
    }
    let guest_owned = [
        format!("{home}/device"),
        format!("{home}/device/vbd"),
        format!("{home}/data"),
        format!("{home}/control"),
        format!("{home}/control/shutdown"),
    ];
    let readable = Perms::new(vec![
        Perm::new(Access::None, 0),
        Perm::new(Access::Read, domid),
    ])
    .expect("two entries");
    let owned = Perms::owned_by(domid);
    // The top directories first, outside the transaction: creating a child
    // changes its parent, so concurrent transactions creating siblings
    // (domains started in parallel) would conflict and retry. Inside, the
    // transaction only touches this domain's own subtrees. They inherit
    // dom0-only permissions until the transaction sets the real ones.
    for d in [&home, &vm, &be] {
        xs.mkdir(d).await?;
    }
    xs.transaction(async |t| {
        for (k, v) in &dom0_only {
            t.write(k, v).await?;
        }
        // The guest reads its home (but may not change the toolstack's keys).
        t.set_perms(&home, &readable).await?;
        for (k, _) in &dom0_only {
            if k.starts_with(&home) {
                t.set_perms(k, &readable).await?;
            }
        }
        for d in &guest_owned {
            t.mkdir(d).await?;
            t.set_perms(d, &owned).await?;
        }
        Ok(())
    })
    .await
}

/// Removes what [`write_domain`] and the VBDs wrote (missing nodes are fine).
pub async fn remove_domain(
    xs: &Client,
    domid: u16,
    uuid: &str,
) -> Result<(), pvio_xenstore::Error> {
    for p in [home(domid), vbd_backends(domid), vm_dir(uuid)] {
        rm_quiet(xs, &p).await?;
    }
    Ok(())
}

/// Removes a node and its children; a missing node is not an error.
pub async fn rm_quiet(xs: &Client, path: &str) -> Result<(), pvio_xenstore::Error> {
    match xs.rm(path).await {
        Err(e) if e.xs() == Some(XsError::Enoent) => Ok(()),
        r => r,
    }
}

/// A VBD's two directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VbdPaths {
    pub frontend: String,
    pub backend: String,
}

impl VbdPaths {
    pub fn new(domid: u16, devid: u32) -> Self {
        Self {
            frontend: format!("{}/device/vbd/{devid}", home(domid)),
            backend: format!("{}/{devid}", vbd_backends(domid)),
        }
    }
}

/// The `xvdX` name of a device id (docs/misc/vbd-interface.txt).
pub fn disk_name(devid: u32) -> String {
    let n = if devid >> 28 == 1 {
        (devid >> 8) & 0xfffff
    } else {
        (devid >> 4) & 0xf
    };
    // xvda..xvdz, then xvdaa.. as Linux names them.
    let mut name = String::new();
    let mut i = n + 1;
    while i > 0 {
        i -= 1;
        name.insert(0, (b'a' + (i % 26) as u8) as char);
        i /= 26;
    }
    format!("xvd{name}")
}

/// Writes a VBD's frontend and backend directories in one transaction.
pub async fn write_vbd(
    xs: &Client,
    domid: u16,
    devid: u32,
    image: &Path,
    writable: bool,
    extra: &[(String, String)],
) -> Result<VbdPaths, pvio_xenstore::Error> {
    let p = VbdPaths::new(domid, devid);
    let fe_keys: Vec<(String, String)> = vec![
        ("backend".into(), p.backend.clone()),
        ("backend-id".into(), "0".into()),
        ("state".into(), "1".into()),
        ("virtual-device".into(), devid.to_string()),
        ("device-type".into(), "disk".into()),
    ];
    let mut be_keys: Vec<(String, String)> = vec![
        ("frontend".into(), p.frontend.clone()),
        ("frontend-id".into(), domid.to_string()),
        ("online".into(), "1".into()),
        ("state".into(), "1".into()),
        ("params".into(), image.display().to_string()),
        ("type".into(), "file".into()),
        ("mode".into(), if writable { "w" } else { "r" }.into()),
        ("device-type".into(), "disk".into()),
        ("dev".into(), disk_name(devid)),
    ];
    be_keys.extend(extra.iter().cloned());
    // libxl__device_generic_add: the frontend is the guest's, readable by
    // the backend; the backend is dom0's, readable by the guest.
    let fe_perms = Perms::new(vec![
        Perm::new(Access::None, domid),
        Perm::new(Access::Read, 0),
    ])
    .expect("two entries");
    let be_perms = Perms::new(vec![
        Perm::new(Access::None, 0),
        Perm::new(Access::Read, domid),
    ])
    .expect("two entries");
    // Both directories first, outside the transaction (see write_domain):
    // disks plugged in parallel would otherwise conflict on their parents.
    // An empty frontend directory has no `backend` key yet; a frontend
    // waits for it.
    xs.mkdir(&p.backend).await?;
    xs.mkdir(&p.frontend).await?;
    // Permissions on the two directories first: the keys written below
    // inherit them (as libxl relies on), one request each instead of two.
    xs.transaction(async |t| {
        t.set_perms(&p.frontend, &fe_perms).await?;
        t.set_perms(&p.backend, &be_perms).await?;
        let kvs: Vec<(String, String)> = fe_keys
            .iter()
            .map(|(k, v)| (format!("{}/{k}", p.frontend), v.clone()))
            .chain(
                be_keys
                    .iter()
                    .map(|(k, v)| (format!("{}/{k}", p.backend), v.clone())),
            )
            .collect();
        t.write_many(&kvs).await
    })
    .await?;
    Ok(p)
}

/// Reads a directory tree as `relative/path = value` pairs (at most
/// `depth` levels; values that are not UTF-8 are shown lossily).
pub async fn read_tree(
    xs: &Client,
    dir: &str,
    depth: usize,
) -> Result<std::collections::BTreeMap<String, String>, pvio_xenstore::Error> {
    let mut out = std::collections::BTreeMap::new();
    let mut todo = vec![(String::new(), 0usize)];
    while let Some((rel, level)) = todo.pop() {
        let path = if rel.is_empty() {
            dir.to_string()
        } else {
            format!("{dir}/{rel}")
        };
        let children = match xs.directory(&path).await {
            Ok(c) => c,
            Err(e) if e.xs() == Some(XsError::Enoent) => continue,
            Err(e) => return Err(e),
        };
        for c in children {
            let r = if rel.is_empty() {
                c.clone()
            } else {
                format!("{rel}/{c}")
            };
            if let Some(v) = xs.try_read(&format!("{dir}/{r}")).await? {
                if !v.is_empty() {
                    out.insert(r.clone(), String::from_utf8_lossy(&v).into_owned());
                }
            }
            if level + 1 < depth {
                todo.push((r, level + 1));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_names_follow_linux() {
        assert_eq!(disk_name(51712), "xvda");
        assert_eq!(disk_name(51728), "xvdb");
        assert_eq!(disk_name(51712 + 15 * 16), "xvdp");
        assert_eq!(disk_name((1 << 28) | (16 << 8)), "xvdq");
        assert_eq!(disk_name((1 << 28) | (25 << 8)), "xvdz");
        assert_eq!(disk_name((1 << 28) | (26 << 8)), "xvdaa");
        assert_eq!(disk_name((1 << 28) | (254 << 8)), "xvdiu");
    }
}
