//! Store semantics, with explicit domids for guests (their ring transport
//! arrives in phase 2, their permissions and quotas are enforced here).

use super::*;
use crate::codec::{Header, WatchPath};
use crate::perms::Perms;

struct H {
    s: Store,
    out: Vec<Outgoing>,
}

fn perms(s: &str) -> Perms {
    Perms::parse(s.split(' ').map(str::as_bytes)).unwrap()
}

impl H {
    fn new() -> Self {
        Self::with(Quotas::default())
    }
    fn with(q: Quotas) -> Self {
        Self {
            s: Store::new(q),
            out: Vec::new(),
        }
    }
    fn dom0(&mut self) -> ConnId {
        self.s.connect(Identity::DOM0)
    }
    fn guest(&mut self, d: DomId) -> ConnId {
        self.s.connect(Identity::guest(d))
    }
    fn op(&mut self, c: ConnId, tx: u32, r: Request) -> Result<Vec<u8>, XsError> {
        self.s.execute(c, tx, r, &mut self.out)
    }
    fn abs(c: &Store, conn: ConnId, p: &str) -> String {
        let d = c.identity(conn).unwrap().domid;
        path::canonicalize(d, p).into_owned()
    }
    fn write(&mut self, c: ConnId, p: &str, v: &str) -> Result<(), XsError> {
        self.write_tx(c, 0, p, v)
    }
    fn write_tx(&mut self, c: ConnId, tx: u32, p: &str, v: &str) -> Result<(), XsError> {
        let path = Self::abs(&self.s, c, p);
        self.op(
            c,
            tx,
            Request::Write {
                path,
                value: v.as_bytes().to_vec(),
            },
        )
        .map(|_| ())
    }
    fn read(&mut self, c: ConnId, p: &str) -> Result<String, XsError> {
        self.read_tx(c, 0, p)
    }
    fn read_tx(&mut self, c: ConnId, tx: u32, p: &str) -> Result<String, XsError> {
        let path = Self::abs(&self.s, c, p);
        self.op(c, tx, Request::Read(path))
            .map(|v| String::from_utf8(v).unwrap())
    }
    fn rm(&mut self, c: ConnId, p: &str) -> Result<(), XsError> {
        let path = Self::abs(&self.s, c, p);
        self.op(c, 0, Request::Rm(path)).map(|_| ())
    }
    fn mkdir(&mut self, c: ConnId, p: &str) -> Result<(), XsError> {
        let path = Self::abs(&self.s, c, p);
        self.op(c, 0, Request::Mkdir(path)).map(|_| ())
    }
    fn dir(&mut self, c: ConnId, p: &str) -> Result<Vec<String>, XsError> {
        let path = Self::abs(&self.s, c, p);
        self.op(c, 0, Request::Directory(path)).map(|v| split(&v))
    }
    fn get_perms(&mut self, c: ConnId, p: &str) -> Result<String, XsError> {
        let path = Self::abs(&self.s, c, p);
        self.op(c, 0, Request::GetPerms(path))
            .map(|v| split(&v).join(" "))
    }
    fn set_perms(&mut self, c: ConnId, p: &str, ps: &str) -> Result<(), XsError> {
        let path = Self::abs(&self.s, c, p);
        self.op(
            c,
            0,
            Request::SetPerms {
                target: PermTarget::Node(path),
                perms: perms(ps),
            },
        )
        .map(|_| ())
    }
    fn watch(&mut self, c: ConnId, p: &str, tok: &str) -> Result<(), XsError> {
        let path = if p.starts_with('@') {
            WatchPath::Special(p.into())
        } else {
            WatchPath::Node {
                path: Self::abs(&self.s, c, p),
                relative: !p.starts_with('/'),
            }
        };
        self.op(
            c,
            0,
            Request::Watch {
                path,
                token: tok.as_bytes().to_vec(),
            },
        )
        .map(|_| ())
    }
    fn tx_start(&mut self, c: ConnId) -> u32 {
        let v = self.op(c, 0, Request::TransactionStart).unwrap();
        split(&v)[0].parse().unwrap()
    }
    fn tx_end(&mut self, c: ConnId, tx: u32, commit: bool) -> Result<(), XsError> {
        self.op(c, tx, Request::TransactionEnd { commit })
            .map(|_| ())
    }
    /// Drains the watch events addressed to `c` as (path, token).
    fn events(&mut self, c: ConnId) -> Vec<(String, String)> {
        let mut v = Vec::new();
        self.out.retain(|o| {
            if o.conn != c {
                return true;
            }
            assert!(o.is_event);
            let parts = split(&o.msg[16..]);
            v.push((parts[0].clone(), parts[1].clone()));
            false
        });
        v
    }
    fn check(&self) {
        self.s.check_consistency().unwrap();
    }
}

fn split(v: &[u8]) -> Vec<String> {
    if v.is_empty() {
        return Vec::new();
    }
    let mut parts: Vec<String> = v
        .split(|b| *b == 0)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    if v.last() == Some(&0) {
        parts.pop();
    }
    parts
}

#[test]
fn initial_tree_and_basic_ops() {
    let mut h = H::new();
    let c = h.dom0();
    assert_eq!(h.dir(c, "/").unwrap(), ["tool"]);
    assert_eq!(h.dir(c, "/tool").unwrap(), ["xenstored"]);
    assert_eq!(h.s.entries(0), 3);
    h.write(c, "/a/b/c", "v").unwrap();
    assert_eq!(h.read(c, "/a/b/c").unwrap(), "v");
    assert_eq!(h.read(c, "/a/b").unwrap(), "");
    assert_eq!(h.dir(c, "/").unwrap(), ["tool", "a"]);
    h.write(c, "/a/z", "").unwrap();
    h.write(c, "/a/m", "").unwrap();
    assert_eq!(h.dir(c, "/a").unwrap(), ["b", "z", "m"], "creation order");
    assert_eq!(h.read(c, "/nope"), Err(XsError::Enoent));
    // Relative paths resolve under /local/domain/0.
    h.write(c, "rel", "x").unwrap();
    assert_eq!(h.read(c, "/local/domain/0/rel").unwrap(), "x");
    h.mkdir(c, "/a/b").unwrap();
    assert_eq!(
        h.read(c, "/a/b/c").unwrap(),
        "v",
        "mkdir keeps an existing node"
    );
    h.mkdir(c, "/d/e").unwrap();
    assert_eq!(h.dir(c, "/d").unwrap(), ["e"]);
    assert_eq!(h.get_perms(c, "/a/b").unwrap(), "n0");
    h.check();
}

#[test]
fn rm_semantics() {
    let mut h = H::new();
    let c = h.dom0();
    h.write(c, "/a/b/c", "1").unwrap();
    h.write(c, "/a/b/d", "2").unwrap();
    let before = h.s.entries(0);
    h.rm(c, "/a/b").unwrap();
    assert_eq!(h.s.entries(0), before - 3);
    assert_eq!(h.read(c, "/a/b/c"), Err(XsError::Enoent));
    assert_eq!(h.dir(c, "/a").unwrap(), Vec::<String>::new());
    // Missing node with an existing parent: fine. Missing parent: ENOENT.
    assert_eq!(h.rm(c, "/a/nothing"), Ok(()));
    assert_eq!(h.rm(c, "/x/y"), Err(XsError::Enoent));
    assert_eq!(h.rm(c, "/"), Err(XsError::Einval));
    h.check();
}

#[test]
fn guest_permissions() {
    let mut h = H::new();
    let d0 = h.dom0();
    let g = h.guest(5);
    let other = h.guest(6);
    h.write(d0, "/secret", "s").unwrap();
    assert_eq!(h.read(g, "/secret"), Err(XsError::Eacces));
    assert_eq!(h.write(g, "/secret", "x"), Err(XsError::Eacces));
    // Non-existence is hidden behind EACCES unless the parent is readable.
    assert_eq!(h.read(g, "/missing"), Err(XsError::Eacces));
    h.write(d0, "/pub", "").unwrap();
    h.set_perms(d0, "/pub", "r0").unwrap();
    assert_eq!(h.read(g, "/pub/missing"), Err(XsError::Enoent));
    assert_eq!(
        h.write(g, "/pub/x", "1"),
        Err(XsError::Eacces),
        "read-only parent"
    );
    // The toolstack gives the guest its home.
    h.write(d0, "/local/domain/5", "").unwrap();
    h.set_perms(d0, "/local/domain/5", "n5 r0").unwrap();
    h.write(g, "data/x", "1").unwrap();
    assert_eq!(h.get_perms(d0, "/local/domain/5/data/x").unwrap(), "n5 r0");
    assert_eq!(h.get_perms(d0, "/local/domain/5/data").unwrap(), "n5 r0");
    assert_eq!(h.s.entries(5), 3);
    assert_eq!(
        h.read(other, "/local/domain/5/data/x"),
        Err(XsError::Eacces)
    );
    // The owner may change the rest of the list but not give the node away.
    h.set_perms(g, "data/x", "n5 r6").unwrap();
    assert_eq!(h.read(other, "/local/domain/5/data/x").unwrap(), "1");
    assert_eq!(
        h.write(other, "/local/domain/5/data/x", "2"),
        Err(XsError::Eacces)
    );
    assert_eq!(h.set_perms(g, "data/x", "n6"), Err(XsError::Eperm));
    assert_eq!(
        h.set_perms(other, "/local/domain/5/data/x", "n6"),
        Err(XsError::Eacces)
    );
    // Write access granted to another domain: what it creates, it owns.
    h.set_perms(g, "data", "n5 b6").unwrap();
    h.write(other, "/local/domain/5/data/y", "o").unwrap();
    assert_eq!(h.get_perms(d0, "/local/domain/5/data/y").unwrap(), "n6 b6");
    assert_eq!(h.s.entries(6), 1);
    // Dom0 changes the owner: accounting follows.
    h.set_perms(d0, "/local/domain/5/data/y", "n5").unwrap();
    assert_eq!(h.s.entries(6), 0);
    assert_eq!(h.s.entries(5), 4);
    h.check();
}

#[test]
fn device_model_target() {
    let mut h = H::new();
    let d0 = h.dom0();
    let dm = h.guest(9);
    for d in [5u16, 9] {
        h.op(
            d0,
            0,
            Request::Introduce {
                domid: d,
                mfn: 1,
                port: 1,
            },
        )
        .unwrap();
    }
    h.write(d0, "/local/domain/5/x", "1").unwrap();
    h.set_perms(d0, "/local/domain/5/x", "n5").unwrap();
    assert_eq!(h.read(dm, "/local/domain/5/x"), Err(XsError::Eacces));
    h.op(
        d0,
        0,
        Request::SetTarget {
            domid: 9,
            target: 5,
        },
    )
    .unwrap();
    assert_eq!(h.read(dm, "/local/domain/5/x").unwrap(), "1");
    assert_eq!(
        h.op(
            d0,
            0,
            Request::SetTarget {
                domid: 9,
                target: 7
            }
        ),
        Err(XsError::Enoent)
    );
}

#[test]
fn guest_quotas() {
    let mut h = H::with(Quotas {
        nodes_per_domain: 4,
        watches_per_domain: 2,
        transactions_per_domain: 2,
        perms_per_node: 2,
        node_size: 100,
        nodes_per_transaction: 3,
        ..Quotas::default()
    });
    let d0 = h.dom0();
    let g = h.guest(5);
    h.write(d0, "/local/domain/5", "").unwrap();
    h.set_perms(d0, "/local/domain/5", "n5").unwrap();
    assert_eq!(h.s.entries(5), 1);
    h.write(g, "a", "").unwrap();
    h.write(g, "b", "").unwrap();
    h.write(g, "c", "").unwrap();
    assert_eq!(h.write(g, "d", ""), Err(XsError::Enospc), "nodes");
    assert_eq!(h.write(g, "x/y", ""), Err(XsError::Enospc));
    h.check();
    // Dom0 is exempt, even writing nodes the guest owns.
    h.write(d0, "/local/domain/5/d", "").unwrap();
    assert_eq!(h.s.entries(5), 5);
    h.rm(d0, "/local/domain/5/d").unwrap();
    h.rm(d0, "/local/domain/5/c").unwrap();
    // Node size: header 24 + 8 per perm + value (+ child names) < quota.
    assert_eq!(h.write(g, "a", &"v".repeat(67)), Ok(()));
    assert_eq!(h.write(g, "a", &"v".repeat(68)), Err(XsError::Enospc));
    assert_eq!(
        h.read(g, "a").unwrap().len(),
        67,
        "a refused write changes nothing"
    );
    h.write(d0, "/local/domain/5/a", &"v".repeat(1000)).unwrap();
    // Permission entries.
    assert_eq!(h.set_perms(g, "b", "n5 r1 r2"), Err(XsError::Enospc));
    h.set_perms(g, "b", "n5 r1").unwrap();
    // Watches.
    h.watch(g, "a", "1").unwrap();
    h.watch(g, "b", "2").unwrap();
    assert_eq!(h.watch(g, "b", "3"), Err(XsError::E2big));
    assert_eq!(h.watch(g, "a", "1"), Err(XsError::Eexist));
    // Transactions.
    let t1 = h.tx_start(g);
    let _t2 = h.tx_start(g);
    assert_eq!(h.op(g, 0, Request::TransactionStart), Err(XsError::Enospc));
    // Nodes touched by one transaction.
    h.read_tx(g, t1, "a").unwrap();
    h.read_tx(g, t1, "b").unwrap();
    h.read_tx(g, t1, "/local/domain/5").unwrap();
    assert_eq!(h.read_tx(g, t1, "missing"), Err(XsError::Enospc));
    assert_eq!(
        h.tx_end(g, t1, true),
        Err(XsError::Enospc),
        "a failed transaction cannot commit"
    );
    h.check();
}

#[test]
fn node_quota_inside_transaction_and_at_commit() {
    let mut h = H::with(Quotas {
        nodes_per_domain: 3,
        ..Quotas::default()
    });
    let d0 = h.dom0();
    let g = h.guest(5);
    h.write(d0, "/local/domain/5", "").unwrap();
    h.set_perms(d0, "/local/domain/5", "n5").unwrap();
    let t = h.tx_start(g);
    h.write_tx(g, t, "a", "").unwrap();
    h.write_tx(g, t, "b", "").unwrap();
    assert_eq!(h.write_tx(g, t, "c", ""), Err(XsError::Enospc));
    // Meanwhile dom0 gives the guest another node: the commit would exceed.
    h.write(d0, "/local/domain/5x", "").unwrap();
    h.set_perms(d0, "/local/domain/5x", "n5").unwrap();
    assert_eq!(h.tx_end(g, t, true), Err(XsError::Enospc));
    assert_eq!(h.s.entries(5), 2);
    h.check();
}

#[test]
fn transactions() {
    let mut h = H::new();
    let a = h.dom0();
    let b = h.dom0();
    h.write(a, "/x", "0").unwrap();
    h.watch(b, "/x", "w").unwrap();
    assert_eq!(h.events(b), [("/x".into(), "w".into())]);
    // Isolation and events at commit only.
    let t = h.tx_start(a);
    assert_eq!(t, 1);
    h.write_tx(a, t, "/x", "1").unwrap();
    h.write_tx(a, t, "/new/node", "n").unwrap();
    assert_eq!(h.read_tx(a, t, "/x").unwrap(), "1");
    assert_eq!(h.read(b, "/x").unwrap(), "0");
    assert_eq!(h.read(b, "/new/node"), Err(XsError::Enoent));
    assert!(h.events(b).is_empty());
    h.tx_end(a, t, true).unwrap();
    assert_eq!(h.read(b, "/x").unwrap(), "1");
    assert_eq!(h.read(b, "/new/node").unwrap(), "n");
    assert_eq!(h.events(b), [("/x".into(), "w".into())]);
    // Conflict: something the transaction read changed.
    let t = h.tx_start(a);
    h.read_tx(a, t, "/x").unwrap();
    h.write(b, "/x", "other").unwrap();
    h.write_tx(a, t, "/x", "mine").unwrap();
    assert_eq!(h.tx_end(a, t, true), Err(XsError::Eagain));
    assert_eq!(h.read(a, "/x").unwrap(), "other");
    assert_eq!(
        h.tx_end(a, t, true),
        Err(XsError::Enoent),
        "gone after EAGAIN"
    );
    // A read of a missing node conflicts with its creation.
    let t = h.tx_start(a);
    assert_eq!(h.read_tx(a, t, "/y"), Err(XsError::Enoent));
    h.write(b, "/y", "1").unwrap();
    assert_eq!(h.tx_end(a, t, true), Err(XsError::Eagain));
    // Unrelated changes do not conflict.
    let t = h.tx_start(a);
    h.read_tx(a, t, "/x").unwrap();
    h.write(b, "/unrelated", "1").unwrap();
    h.write_tx(a, t, "/x", "ok").unwrap();
    h.tx_end(a, t, true).unwrap();
    assert_eq!(h.read(b, "/x").unwrap(), "ok");
    // Abort discards.
    let t = h.tx_start(a);
    h.write_tx(a, t, "/x", "never").unwrap();
    h.tx_end(a, t, false).unwrap();
    assert_eq!(h.read(a, "/x").unwrap(), "ok");
    // Nested start: EBUSY; unknown id: ENOENT; end without id: ENOENT.
    let t = h.tx_start(a);
    assert_eq!(h.op(a, t, Request::TransactionStart), Err(XsError::Ebusy));
    assert_eq!(h.read_tx(a, 999, "/x"), Err(XsError::Enoent));
    assert_eq!(
        h.read_tx(b, t, "/x"),
        Err(XsError::Enoent),
        "ids are per connection"
    );
    assert_eq!(h.tx_end(a, 0, true), Err(XsError::Enoent));
    // rm inside a transaction.
    h.write(a, "/tree/a/b", "1").unwrap();
    h.rm_tx(a, t, "/tree/a");
    assert_eq!(h.read_tx(a, t, "/tree/a/b"), Err(XsError::Enoent));
    assert_eq!(h.read(a, "/tree/a/b").unwrap(), "1");
    h.tx_end(a, t, true).unwrap();
    assert_eq!(h.read(a, "/tree/a/b"), Err(XsError::Enoent));
    h.check();
}

impl H {
    fn rm_tx(&mut self, c: ConnId, tx: u32, p: &str) {
        self.op(c, tx, Request::Rm(p.into())).unwrap();
    }
    fn dir_tx(&mut self, c: ConnId, tx: u32, p: &str) -> Result<Vec<String>, XsError> {
        let path = Self::abs(&self.s, c, p);
        self.op(c, tx, Request::Directory(path)).map(|v| split(&v))
    }
    fn get_perms_tx(&mut self, c: ConnId, tx: u32, p: &str) -> Result<String, XsError> {
        let path = Self::abs(&self.s, c, p);
        self.op(c, tx, Request::GetPerms(path))
            .map(|v| split(&v).join(" "))
    }
}

/// C xenstored (4.9 and later) gives a transaction its own copy of every
/// node it touches, read or written: later reads inside it see that copy,
/// whatever others commit, and the commit then fails with EAGAIN.
#[test]
fn transactions_read_their_own_snapshot_of_what_they_touched() {
    let mut h = H::new();
    let a = h.dom0();
    let b = h.dom0();
    h.write(a, "/a", "a").unwrap();
    // A value changed outside.
    let t = h.tx_start(a);
    assert_eq!(h.read_tx(a, t, "/a").unwrap(), "a");
    h.write(b, "/a", "b").unwrap();
    assert_eq!(h.read_tx(a, t, "/a").unwrap(), "a", "repeatable read");
    assert_eq!(h.read(a, "/a").unwrap(), "b");
    // The transaction's own write wins over its copy.
    h.write_tx(a, t, "/a", "mine").unwrap();
    assert_eq!(h.read_tx(a, t, "/a").unwrap(), "mine");
    assert_eq!(h.tx_end(a, t, true), Err(XsError::Eagain));
    assert_eq!(h.read(a, "/a").unwrap(), "b");

    // A node removed outside still reads, and lists, inside.
    h.write(a, "/d/x", "1").unwrap();
    h.write(a, "/d/y", "2").unwrap();
    let t = h.tx_start(a);
    assert_eq!(h.dir_tx(a, t, "/d").unwrap(), ["x", "y"]);
    assert_eq!(h.read_tx(a, t, "/d/x").unwrap(), "1");
    h.rm(b, "/d/x").unwrap();
    h.write(b, "/d/z", "3").unwrap();
    assert_eq!(h.dir_tx(a, t, "/d").unwrap(), ["x", "y"], "listing is kept");
    assert_eq!(h.read_tx(a, t, "/d/x").unwrap(), "1", "removed outside");
    // A node not touched before is read as it is now (C xenstored reads
    // the committed tree for nodes a transaction has not accessed).
    assert_eq!(h.read_tx(a, t, "/d/z").unwrap(), "3");
    assert_eq!(h.tx_end(a, t, true), Err(XsError::Eagain));

    // A node absent when first read stays absent inside.
    let t = h.tx_start(a);
    assert_eq!(h.read_tx(a, t, "/late"), Err(XsError::Enoent));
    h.write(b, "/late", "x").unwrap();
    assert_eq!(h.read_tx(a, t, "/late"), Err(XsError::Enoent));
    assert_eq!(h.tx_end(a, t, true), Err(XsError::Eagain));

    // Permissions changed outside: the transaction checks and reports the
    // permissions it saw.
    h.write(a, "/p", "v").unwrap();
    h.set_perms(a, "/p", "n0 r5").unwrap();
    let g = h.guest(5);
    let t = h.tx_start(g);
    assert_eq!(h.read_tx(g, t, "/p").unwrap(), "v");
    assert_eq!(h.get_perms_tx(g, t, "/p").unwrap(), "n0 r5");
    h.set_perms(a, "/p", "n0").unwrap();
    assert_eq!(h.read(g, "/p"), Err(XsError::Eacces));
    assert_eq!(h.read_tx(g, t, "/p").unwrap(), "v");
    assert_eq!(h.get_perms_tx(g, t, "/p").unwrap(), "n0 r5");
    assert_eq!(h.tx_end(g, t, true), Err(XsError::Eagain));

    // Reads alone, with nothing changed outside, commit.
    let t = h.tx_start(a);
    assert_eq!(h.read_tx(a, t, "/a").unwrap(), "b");
    assert_eq!(h.dir_tx(a, t, "/d").unwrap(), ["y", "z"]);
    h.tx_end(a, t, true).unwrap();
    h.check();
}

#[test]
fn watches() {
    let mut h = H::new();
    let d0 = h.dom0();
    let w = h.dom0();
    h.watch(w, "/a", "t").unwrap();
    assert_eq!(
        h.events(w),
        [("/a".into(), "t".into())],
        "fires once at once"
    );
    h.write(d0, "/a/b/c", "1").unwrap();
    assert_eq!(h.events(w), [("/a/b/c".into(), "t".into())]);
    h.write(d0, "/ab", "1").unwrap();
    assert!(h.events(w).is_empty(), "/ab is not below /a");
    h.set_perms(d0, "/a/b", "r0").unwrap();
    assert_eq!(h.events(w), [("/a/b".into(), "t".into())]);
    // Relative watches report relative paths.
    h.watch(w, "rel", "r").unwrap();
    assert_eq!(h.events(w), [("rel".into(), "r".into())]);
    h.write(d0, "/local/domain/0/rel/x", "1").unwrap();
    assert_eq!(h.events(w), [("rel/x".into(), "r".into())]);
    // Recursive removal: removed descendants under a watch fire exactly.
    h.watch(w, "/a/b/c", "deep").unwrap();
    h.events(w);
    h.rm(d0, "/a").unwrap();
    let ev = h.events(w);
    assert!(ev.contains(&("/a/b/c".into(), "deep".into())), "{ev:?}");
    assert!(ev.contains(&("/a".into(), "t".into())), "{ev:?}");
    // Unwatch and reset.
    h.op(
        w,
        0,
        Request::Unwatch {
            path: "/a".into(),
            token: b"t".to_vec(),
        },
    )
    .unwrap();
    assert_eq!(
        h.op(
            w,
            0,
            Request::Unwatch {
                path: "/a".into(),
                token: b"t".to_vec()
            }
        ),
        Err(XsError::Enoent)
    );
    h.write(d0, "/a", "").unwrap();
    assert!(h.events(w).is_empty());
    h.op(w, 0, Request::ResetWatches).unwrap();
    h.write(d0, "/local/domain/0/rel", "2").unwrap();
    assert!(h.events(w).is_empty());
    // A watch on / sees everything but special events.
    h.watch(w, "/", "root").unwrap();
    h.events(w);
    h.write(d0, "/q", "").unwrap();
    assert_eq!(h.events(w), [("/q".into(), "root".into())]);
}

#[test]
fn guest_watch_events_respect_read_permission() {
    let mut h = H::new();
    let d0 = h.dom0();
    let g = h.guest(5);
    h.watch(g, "/", "t").unwrap();
    h.events(g);
    h.write(d0, "/secret", "1").unwrap();
    assert!(h.events(g).is_empty());
    h.write(d0, "/shared", "1").unwrap();
    h.events(g);
    h.set_perms(d0, "/shared", "n0 r5").unwrap();
    assert_eq!(h.events(g), [("/shared".into(), "t".into())]);
    h.write(d0, "/shared", "2").unwrap();
    assert_eq!(h.events(g), [("/shared".into(), "t".into())]);
    // Losing access: the change that takes it away is still seen.
    h.set_perms(d0, "/shared", "n0").unwrap();
    assert_eq!(h.events(g), [("/shared".into(), "t".into())]);
    h.write(d0, "/shared", "3").unwrap();
    assert!(h.events(g).is_empty());
}

#[test]
fn domains_and_special_watches() {
    let mut h = H::new();
    let d0 = h.dom0();
    let g = h.guest(5);
    h.watch(d0, "@introduceDomain", "i").unwrap();
    h.watch(d0, "@releaseDomain", "r").unwrap();
    h.watch(g, "@releaseDomain", "gr").unwrap();
    h.events(d0);
    h.events(g);
    assert_eq!(
        h.op(
            g,
            0,
            Request::Introduce {
                domid: 7,
                mfn: 1,
                port: 2
            }
        ),
        Err(XsError::Eacces)
    );
    assert_eq!(h.op(d0, 0, Request::IsDomainIntroduced(7)).unwrap(), b"F\0");
    h.op(
        d0,
        0,
        Request::Introduce {
            domid: 7,
            mfn: 0x1234,
            port: 3,
        },
    )
    .unwrap();
    assert_eq!(h.events(d0), [("@introduceDomain".into(), "i".into())]);
    assert_eq!(
        h.s.take_domain_changes(),
        [DomainChange::Introduced(DomainInfo {
            domid: 7,
            mfn: 0x1234,
            port: 3,
            shutdown: false
        })]
    );
    assert_eq!(h.op(d0, 0, Request::IsDomainIntroduced(7)).unwrap(), b"T\0");
    assert_eq!(h.op(d0, 0, Request::IsDomainIntroduced(0)).unwrap(), b"T\0");
    assert_eq!(
        h.op(g, 0, Request::IsDomainIntroduced(7)),
        Err(XsError::Eacces)
    );
    // Introducing again only updates the channel.
    h.op(
        d0,
        0,
        Request::Introduce {
            domid: 7,
            mfn: 0x1234,
            port: 4,
        },
    )
    .unwrap();
    assert!(h.events(d0).is_empty());
    assert_eq!(
        h.op(g, 0, Request::GetDomainPath(7)).unwrap(),
        b"/local/domain/7\0"
    );
    // Nodes owned by the domain go away with it.
    h.write(d0, "/local/domain/7/owned/x", "1").unwrap();
    h.set_perms(d0, "/local/domain/7/owned", "n7").unwrap();
    h.write(d0, "/local/domain/7/name", "vm").unwrap();
    h.op(d0, 0, Request::Release(7)).unwrap();
    assert_eq!(h.read(d0, "/local/domain/7/owned"), Err(XsError::Enoent));
    assert_eq!(h.read(d0, "/local/domain/7/name").unwrap(), "vm");
    assert_eq!(h.events(d0), [("@releaseDomain".into(), "r".into())]);
    assert!(h.events(g).is_empty(), "@releaseDomain is n0 by default");
    assert_eq!(h.op(d0, 0, Request::Release(7)), Err(XsError::Enoent));
    // Dom0 opens @releaseDomain to guest 5.
    h.op(
        d0,
        0,
        Request::SetPerms {
            target: PermTarget::Special(RELEASE_DOMAIN.into()),
            perms: perms("n0 r5"),
        },
    )
    .unwrap();
    h.op(
        d0,
        0,
        Request::Introduce {
            domid: 8,
            mfn: 1,
            port: 1,
        },
    )
    .unwrap();
    h.op(d0, 0, Request::Release(8)).unwrap();
    assert_eq!(h.events(g), [("@releaseDomain".into(), "gr".into())]);
    h.check();
}

#[test]
fn directory_part_chunks_long_lists() {
    let mut h = H::new();
    let c = h.dom0();
    let names: Vec<String> = (0..300)
        .map(|i| format!("child-with-a-long-name-{i:04}"))
        .collect();
    for n in &names {
        h.write(c, &format!("/big/{n}"), "").unwrap();
    }
    assert_eq!(h.dir(c, "/big"), Err(XsError::E2big));
    // libxenstore's xs_directory_part loop.
    let mut all = Vec::new();
    let mut gen: Option<String> = None;
    let mut chunks = 0;
    loop {
        let r = h
            .op(
                c,
                0,
                Request::DirectoryPart {
                    path: "/big".into(),
                    offset: all.len() as u32,
                },
            )
            .unwrap();
        assert!(r.len() <= 4096);
        chunks += 1;
        let nul = r.iter().position(|b| *b == 0).unwrap();
        let g = String::from_utf8(r[..nul].to_vec()).unwrap();
        assert_eq!(*gen.get_or_insert(g.clone()), g);
        let body = &r[nul + 1..];
        all.extend_from_slice(body);
        if all.len() <= 1 || all[all.len() - 2] == 0 {
            break;
        }
    }
    all.pop();
    assert!(chunks >= 3);
    assert_eq!(split(&all), names);
    // Past the end: just the generation and an empty string.
    let r = h
        .op(
            c,
            0,
            Request::DirectoryPart {
                path: "/big".into(),
                offset: 999_999,
            },
        )
        .unwrap();
    assert_eq!(r.iter().filter(|b| **b == 0).count(), 2);
}

#[test]
fn wire_level_processing() {
    let mut h = H::new();
    let c = h.dom0();
    let mut out = Vec::new();
    let hdr = |ty: u32, tx_id: u32, len: usize| Header {
        ty,
        req_id: 77,
        tx_id,
        len: len as u32,
    };
    let one = |h: &mut H, out: &mut Vec<Outgoing>, ty: u32, tx: u32, p: &[u8]| {
        out.clear();
        h.s.process(c, &hdr(ty, tx, p.len()), p, out);
        let m = &out[0].msg;
        let rh = Header::decode(m).unwrap();
        assert_eq!(rh.req_id, 77);
        assert_eq!(rh.tx_id, tx);
        (rh.ty, m[16..].to_vec())
    };
    assert_eq!(one(&mut h, &mut out, 2, 0, b"/tool\0"), (2, vec![]));
    assert_eq!(
        one(&mut h, &mut out, 11, 0, b"/w\0val"),
        (11, b"OK\0".to_vec())
    );
    assert_eq!(one(&mut h, &mut out, 2, 0, b"/w\0"), (2, b"val".to_vec()));
    assert_eq!(
        one(&mut h, &mut out, 99, 0, b""),
        (16, b"ENOSYS\0".to_vec())
    );
    assert_eq!(
        one(&mut h, &mut out, 15, 0, b""),
        (16, b"ENOSYS\0".to_vec())
    );
    assert_eq!(
        one(&mut h, &mut out, 2, 5, b"/w\0"),
        (16, b"ENOENT\0".to_vec())
    );
    assert_eq!(
        one(&mut h, &mut out, 2, 0, b"/w"),
        (16, b"EINVAL\0".to_vec())
    );
    let long = format!("/{}\0", "x".repeat(2048));
    assert_eq!(
        one(&mut h, &mut out, 11, 0, long.as_bytes()),
        (16, b"EINVAL\0".to_vec())
    );
    // WATCH ignores the transaction id; its first event follows the reply.
    let (ty, _) = one(&mut h, &mut out, 4, 12345, b"/w\0tok\0");
    assert_eq!(ty, 4);
    assert_eq!(out.len(), 2);
    assert!(out[1].is_event);
    assert_eq!(&out[1].msg[16..], b"/w\0tok\0");
    // A WRITE's own event precedes its reply, as in C xenstored.
    out.clear();
    h.s.process(c, &hdr(11, 0, 4), b"/w\0v", &mut out);
    assert!(out[0].is_event && !out[1].is_event);
    // Guests cannot use privileged types.
    let g = h.guest(3);
    out.clear();
    h.s.process(g, &hdr(0, 0, 6), b"quota\0", &mut out);
    assert_eq!(&out[0].msg[16..], b"EACCES\0");
}

#[test]
fn control_commands() {
    let mut h = H::new();
    let c = h.dom0();
    let r = h
        .op(
            c,
            0,
            Request::Control {
                cmd: "quota".into(),
                args: vec![],
            },
        )
        .unwrap();
    let text = String::from_utf8(r).unwrap();
    assert!(text.starts_with("Quota settings:\n"), "{text}");
    assert!(
        text.contains("nodes            :     1000 Nodes per domain"),
        "{text}"
    );
    h.op(
        c,
        0,
        Request::Control {
            cmd: "quota".into(),
            args: vec!["set".into(), "watches".into(), "7".into()],
        },
    )
    .unwrap();
    assert_eq!(h.s.quotas().watches_per_domain, 7);
    let r = h
        .op(
            c,
            0,
            Request::Control {
                cmd: "quota".into(),
                args: vec!["0".into()],
            },
        )
        .unwrap();
    assert!(String::from_utf8(r)
        .unwrap()
        .contains("nodes           :        3"));
    h.op(
        c,
        0,
        Request::Control {
            cmd: "check".into(),
            args: vec![],
        },
    )
    .unwrap();
    h.op(
        c,
        0,
        Request::Control {
            cmd: "log".into(),
            args: vec!["on".into()],
        },
    )
    .unwrap();
    assert_eq!(
        h.op(
            c,
            0,
            Request::Control {
                cmd: "bogus".into(),
                args: vec![]
            }
        ),
        Err(XsError::Einval)
    );
    let r = h
        .op(
            c,
            0,
            Request::Control {
                cmd: "help".into(),
                args: vec![],
            },
        )
        .unwrap();
    assert!(String::from_utf8(r).unwrap().contains("quota\t"));
}

#[test]
fn disconnect_drops_watches_and_transactions() {
    let mut h = H::new();
    let d0 = h.dom0();
    let w = h.dom0();
    h.watch(w, "/", "t").unwrap();
    let _t = h.tx_start(w);
    h.s.disconnect(w);
    h.out.clear();
    h.write(d0, "/x", "1").unwrap();
    assert!(h.out.is_empty());
    assert_eq!(h.s.watches.total(), 0);
}

mod arbitrary_frames {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Arbitrary well-framed requests from dom0 and a guest: every one
        /// gets exactly one reply, addressed to its sender, and the tree
        /// stays consistent. Nothing panics.
        #[test]
        fn every_request_gets_one_reply(
            reqs in proptest::collection::vec(
                (any::<bool>(), 0u32..24, 0u32..3,
                 proptest::collection::vec(
                     prop_oneof![Just(0u8), Just(b'/'), Just(b'a'), Just(b'@'), any::<u8>()],
                     0..40)),
                1..60)
        ) {
            let mut s = Store::new(Quotas { nodes_per_domain: 10, ..Quotas::default() });
            let d0 = s.connect(Identity::DOM0);
            let g = s.connect(Identity::guest(4));
            for (guest, ty, tx, payload) in reqs {
                let c = if guest { g } else { d0 };
                let hdr = Header { ty, req_id: 1, tx_id: tx, len: payload.len() as u32 };
                let mut out = Vec::new();
                s.process(c, &hdr, &payload, &mut out);
                let replies: Vec<_> = out.iter().filter(|o| !o.is_event).collect();
                prop_assert_eq!(replies.len(), 1);
                prop_assert_eq!(replies[0].conn, c);
                let h = Header::decode(&replies[0].msg).unwrap();
                prop_assert!(h.len as usize <= pvio_abi::xs_wire::XENSTORE_PAYLOAD_MAX);
                prop_assert_eq!(h.len as usize + 16, replies[0].msg.len());
                prop_assert!(s.check_consistency().is_ok());
            }
        }
    }
}

fn introduce(h: &mut H, d0: ConnId, domid: DomId) {
    h.op(
        d0,
        0,
        Request::Introduce {
            domid,
            mfn: 1,
            port: 1,
        },
    )
    .unwrap();
    h.s.take_domain_changes();
}

#[test]
fn released_domain_rights_are_not_inherited_by_its_successor() {
    // XSA-322: a later domain reusing the id must not inherit the grants.
    let mut h = H::new();
    let d0 = h.dom0();
    let other = h.guest(6);
    introduce(&mut h, d0, 5);
    h.write(d0, "/vm/shared", "secret").unwrap();
    h.set_perms(d0, "/vm/shared", "n0 r5 b6").unwrap();
    h.write(d0, "/local/domain/6/backend", "x").unwrap();
    h.set_perms(d0, "/local/domain/6/backend", "n6 b5").unwrap();
    h.write(d0, "/vm/unrelated", "v").unwrap();
    h.set_perms(d0, "/vm/unrelated", "r0").unwrap();
    let g5 = h.guest(5);
    assert_eq!(h.read(g5, "/vm/shared").unwrap(), "secret");
    // Dom0 has a transaction holding a changed node that names domain 5.
    let tx = h.tx_start(d0);
    let p = "/vm/pending".to_string();
    h.write_tx(d0, tx, &p, "1").unwrap();
    h.op(
        d0,
        tx,
        Request::SetPerms {
            target: PermTarget::Node(p.clone()),
            perms: perms("n0 w5"),
        },
    )
    .unwrap();
    // A transaction that only read a node naming 5 is not disturbed.
    let tx2 = h.tx_start(d0);
    assert_eq!(h.read_tx(d0, tx2, "/vm/shared").unwrap(), "secret");
    h.write_tx(d0, tx2, "/vm/other", "o").unwrap();

    h.s.disconnect(g5);
    h.op(d0, 0, Request::Release(5)).unwrap();
    assert_eq!(h.get_perms(d0, "/vm/shared").unwrap(), "n0 b6");
    assert_eq!(h.get_perms(d0, "/local/domain/6/backend").unwrap(), "n6");
    assert_eq!(h.get_perms(d0, "/vm/unrelated").unwrap(), "r0");
    assert_eq!(h.tx_end(d0, tx, true), Err(XsError::Eagain));
    assert_eq!(h.read(d0, "/vm/pending"), Err(XsError::Enoent));
    h.tx_end(d0, tx2, true).unwrap();
    // Domain 6 keeps its rights.
    assert_eq!(h.read(other, "/vm/shared").unwrap(), "secret");

    // A new domain 5 gets nothing from its predecessor...
    introduce(&mut h, d0, 5);
    let new5 = h.guest(5);
    assert_eq!(h.read(new5, "/vm/shared"), Err(XsError::Eacces));
    assert_eq!(
        h.write(new5, "/local/domain/6/backend", "y"),
        Err(XsError::Eacces)
    );
    // ...but what the toolstack grants it after the release holds.
    h.set_perms(d0, "/vm/shared", "n0 r5").unwrap();
    assert_eq!(h.read(new5, "/vm/shared").unwrap(), "secret");
    h.check();
}

#[test]
fn a_dead_domain_is_released_like_xs_release() {
    let mut h = H::new();
    let d0 = h.dom0();
    h.watch(d0, "@releaseDomain", "r").unwrap();
    h.events(d0);
    assert!(!h.s.domain_gone(9, &mut h.out), "not introduced");
    introduce(&mut h, d0, 9);
    assert!(h.s.is_introduced(9));
    h.write(d0, "/local/domain/9/data", "1").unwrap();
    h.set_perms(d0, "/local/domain/9", "n9").unwrap();
    let g = h.guest(9);
    h.watch(g, "data", "mine").unwrap();
    let t = h.tx_start(g);
    h.events(g);
    assert!(h.s.domain_gone(9, &mut h.out));
    assert!(!h.s.is_introduced(9));
    assert_eq!(h.events(d0), [("@releaseDomain".into(), "r".into())]);
    assert!(h.events(g).is_empty(), "its own watches went first");
    assert_eq!(h.read(d0, "/local/domain/9"), Err(XsError::Enoent));
    assert_eq!(h.s.take_domain_changes(), [DomainChange::Released(9)]);
    assert_eq!(h.tx_end(g, t, false), Err(XsError::Enoent));
    h.check();
}

#[test]
fn reset_connection_and_error_replies() {
    let mut h = H::new();
    let d0 = h.dom0();
    let g = h.guest(3);
    h.write(d0, "/local/domain/3/x", "1").unwrap();
    h.set_perms(d0, "/local/domain/3", "n3").unwrap();
    h.watch(g, "x", "t").unwrap();
    let t = h.tx_start(g);
    h.events(g);
    h.s.reset_connection(g);
    h.write(d0, "/local/domain/3/x", "2").unwrap();
    assert!(h.events(g).is_empty(), "watch dropped");
    assert_eq!(
        h.tx_end(g, t, true),
        Err(XsError::Enoent),
        "transaction dropped"
    );
    let hdr = Header {
        ty: 8,
        req_id: 77,
        tx_id: 0,
        len: 0,
    };
    h.s.error_reply(d0, &hdr, XsError::Enoent, &mut h.out);
    let o = h.out.pop().unwrap();
    assert_eq!(o.conn, d0);
    assert_eq!(&o.msg[16..], b"ENOENT\0");
    assert_eq!(Header::decode(&o.msg).unwrap().req_id, 77);
}
