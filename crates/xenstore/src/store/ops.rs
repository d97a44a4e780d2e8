//! The node operations (READ, WRITE, MKDIR, RM, DIRECTORY, DIRECTORY_PART,
//! GET_PERMS, SET_PERMS) with C xenstored 4.17's semantics, written once
//! against a [`View`] so they behave the same inside and outside
//! transactions.

use super::quota::Quotas;
use super::tree::Node;
use super::txn::View;
use crate::error::XsError;
use crate::path;
use crate::perms::{Perms, Who, PERM_OWNER, PERM_READ, PERM_WRITE};
use pvio_abi::xs_wire::XENSTORE_PAYLOAD_MAX;

/// The "OK\0" reply.
pub fn ok() -> Vec<u8> {
    b"OK\0".to_vec()
}

/// `errno_from_parents()`: a failure on a node the caller may not know
/// about is reported as EACCES unless the nearest existing ancestor grants
/// some of the wanted rights.
fn errno_from_parents(
    view: &mut View<'_>,
    who: &Who,
    node: &str,
    err: XsError,
    perm: u8,
) -> XsError {
    let mut p = node;
    let rights = loop {
        if p == "/" {
            break 0;
        }
        p = path::parent(p);
        match view.get(p) {
            Ok(Some(n)) => break n.perms.rights_for(who),
            Ok(None) => continue,
            Err(e) => return e,
        }
    };
    if rights & perm != 0 {
        err
    } else {
        XsError::Eacces
    }
}

/// `get_node()`: Ok if the node exists and `who` has all of `perm` on it;
/// ENOENT (or EACCES, see [`errno_from_parents`]) otherwise.
fn check(view: &mut View<'_>, who: &Who, p: &str, perm: u8) -> Result<(), XsError> {
    let err = match view.get(p)? {
        Some(n) if n.perms.rights_for(who) & perm == perm => return Ok(()),
        Some(_) => XsError::Eacces,
        None => XsError::Enoent,
    };
    Err(errno_from_parents(view, who, p, err, perm))
}

/// The node after a successful [`check`].
fn fetch(view: &mut View<'_>, p: &str) -> Result<Node, XsError> {
    view.get(p)?.cloned().ok_or(XsError::Eio)
}

fn check_size(who: &Who, q: &Quotas, n: &Node) -> Result<(), XsError> {
    if !who.privileged && n.record_size() >= q.node_size {
        return Err(XsError::Enospc);
    }
    Ok(())
}

pub fn read(view: &mut View<'_>, who: &Who, p: &str) -> Result<Vec<u8>, XsError> {
    check(view, who, p, PERM_READ)?;
    Ok(view.get(p)?.map(|n| n.value.clone()).unwrap_or_default())
}

pub fn directory(view: &mut View<'_>, who: &Who, p: &str) -> Result<Vec<u8>, XsError> {
    check(view, who, p, PERM_READ)?;
    let bytes = fetch(view, p)?.children_bytes();
    if bytes.len() > XENSTORE_PAYLOAD_MAX {
        return Err(XsError::E2big);
    }
    Ok(bytes)
}

/// XS_DIRECTORY_PART: `<generation>\0` then as many whole child names from
/// byte `offset` of the child list as fit; an extra NUL marks the end.
pub fn directory_part(
    view: &mut View<'_>,
    who: &Who,
    p: &str,
    offset: u32,
) -> Result<Vec<u8>, XsError> {
    check(view, who, p, PERM_READ)?;
    let node = fetch(view, p)?;
    let children = node.children_bytes();
    let mut out = node.gen.to_string().into_bytes();
    out.push(0);
    let off = offset as usize;
    if off >= children.len() {
        out.push(0);
        return Ok(out);
    }
    let max = XENSTORE_PAYLOAD_MAX - out.len() - 1;
    let mut len = 0;
    loop {
        let rest = &children[off + len..];
        let name_len = rest.iter().position(|b| *b == 0).unwrap_or(rest.len());
        if len + name_len >= max {
            break;
        }
        len += name_len + 1;
        if off + len >= children.len() {
            break;
        }
    }
    let end = (off + len).min(children.len());
    out.extend_from_slice(&children[off..end]);
    if end == children.len() {
        out.push(0);
    }
    Ok(out)
}

pub fn get_perms(view: &mut View<'_>, who: &Who, p: &str) -> Result<Vec<u8>, XsError> {
    check(view, who, p, PERM_READ)?;
    let mut out = Vec::new();
    fetch(view, p)?.perms.encode(&mut out);
    Ok(out)
}

/// `construct_node()` + `create_node()`: creates `p` and its missing
/// parents. New nodes inherit their parent's permissions; an unprivileged
/// creator becomes their owner.
fn create(
    view: &mut View<'_>,
    who: &Who,
    q: &Quotas,
    p: &str,
    value: Vec<u8>,
) -> Result<(), XsError> {
    let mut missing = vec![p];
    let mut cur = p;
    let existing = loop {
        cur = path::parent(cur);
        if let Some(n) = view.get(cur)? {
            break n.clone();
        }
        if cur == "/" {
            return Err(XsError::Eio);
        }
        missing.push(cur);
    };
    if !who.privileged && view.entries(who.domid) + missing.len() as i64 > q.nodes_per_domain as i64
    {
        return Err(XsError::Enospc);
    }
    let mut writes: Vec<(&str, Node, bool)> = Vec::with_capacity(missing.len() + 1);
    let (mut parent_path, mut parent) = (cur, existing);
    let mut parent_is_new = false;
    let mut value = Some(value);
    for (i, name) in missing.iter().rev().enumerate() {
        parent.children.push(path::basename(name).to_owned());
        let perms = if who.privileged {
            parent.perms.clone()
        } else {
            parent.perms.with_owner(who.domid)
        };
        let mut n = Node::new(perms);
        if i + 1 == missing.len() {
            n.value = value.take().unwrap_or_default();
        }
        writes.push((parent_path, parent, parent_is_new));
        parent_path = name;
        parent = n;
        parent_is_new = true;
    }
    writes.push((parent_path, parent, true));
    for (_, n, _) in &writes {
        check_size(who, q, n)?;
    }
    for (wp, n, new) in writes {
        if new {
            view.entries_add(n.perms.owner(), 1);
        }
        view.put(wp, n)?;
    }
    Ok(())
}

pub fn write(
    view: &mut View<'_>,
    who: &Who,
    q: &Quotas,
    p: &str,
    value: Vec<u8>,
) -> Result<Vec<u8>, XsError> {
    match check(view, who, p, PERM_WRITE) {
        Ok(()) => {
            let mut n = fetch(view, p)?;
            n.value = value;
            check_size(who, q, &n)?;
            view.put(p, n)?;
        }
        Err(XsError::Enoent) => create(view, who, q, p, value)?,
        Err(e) => return Err(e),
    }
    view.event(p, false, None);
    Ok(ok())
}

pub fn mkdir(view: &mut View<'_>, who: &Who, q: &Quotas, p: &str) -> Result<Vec<u8>, XsError> {
    match check(view, who, p, PERM_WRITE) {
        Ok(()) => {}
        Err(XsError::Enoent) => {
            create(view, who, q, p, Vec::new())?;
            view.event(p, false, None);
        }
        Err(e) => return Err(e),
    }
    Ok(ok())
}

pub fn rm(view: &mut View<'_>, who: &Who, p: &str) -> Result<Vec<u8>, XsError> {
    match check(view, who, p, PERM_WRITE) {
        Ok(()) => {}
        Err(XsError::Enoent) => {
            // Deleting a missing node is fine if its parent exists.
            return match view.get(path::parent(p))? {
                Some(_) => Ok(ok()),
                None => Err(XsError::Enoent),
            };
        }
        Err(e) => return Err(e),
    }
    if p == "/" {
        return Err(XsError::Einval);
    }
    rm_node(view, p)?;
    Ok(ok())
}

/// Deletes `p` and everything below it, children before parents, then
/// unlinks it from its parent. Fires an event for the removed node (and,
/// exact, for each removed descendant).
pub fn rm_node(view: &mut View<'_>, p: &str) -> Result<(), XsError> {
    let parent_path = path::parent(p);
    let mut parent = view.get(parent_path)?.cloned().ok_or(XsError::Einval)?;
    // Iterative post-order walk: (path, children already pushed).
    let mut stack: Vec<(String, bool)> = vec![(p.to_owned(), false)];
    while let Some((cur, expanded)) = stack.pop() {
        let Some(node) = view.get(&cur)?.cloned() else {
            continue;
        };
        if !expanded {
            stack.push((cur.clone(), true));
            for c in node.children.iter().rev() {
                stack.push((path::child_path(&cur, c), false));
            }
            continue;
        }
        view.del(&cur)?;
        view.entries_add(node.perms.owner(), -1);
        view.event(&cur, cur != p, Some(node.perms));
    }
    parent.remove_child(path::basename(p));
    view.put(parent_path, parent)
}

pub fn set_perms(
    view: &mut View<'_>,
    who: &Who,
    q: &Quotas,
    p: &str,
    perms: Perms,
) -> Result<Vec<u8>, XsError> {
    check(view, who, p, PERM_WRITE | PERM_OWNER)?;
    let mut n = fetch(view, p)?;
    if !who.privileged && perms.owner() != n.perms.owner() {
        return Err(XsError::Eperm);
    }
    let old = std::mem::replace(&mut n.perms, perms);
    check_size(who, q, &n)?;
    if old.owner() != n.perms.owner() {
        view.entries_add(old.owner(), -1);
        view.entries_add(n.perms.owner(), 1);
    }
    view.put(p, n)?;
    view.event(p, false, Some(old));
    Ok(ok())
}
