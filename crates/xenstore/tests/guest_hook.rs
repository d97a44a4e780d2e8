//! The seam for phase 2: a [`DomainHook`] that hands the daemon a transport
//! for each introduced domain. Here the "ring" is one end of a socketpair,
//! so the test plays the guest: its requests carry the guest's identity and
//! meet guest permissions and quotas; XS_RELEASE closes it.

use pvio_xenstore::codec::{encode_message, Header, HEADER_LEN};
use pvio_xenstore::daemon::{Daemon, DomainHook, Limits, SocketTransport, Transport};
use pvio_xenstore::store::domain::DomainInfo;
use pvio_xenstore::store::quota::Quotas;
use pvio_xenstore::{Client, Perms};
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::time::Duration;

struct PairHook(mpsc::Sender<(DomainInfo, UnixStream)>);

impl DomainHook for PairHook {
    fn introduced(&mut self, info: &DomainInfo) -> io::Result<Option<Box<dyn Transport>>> {
        let (ours, guest) = UnixStream::pair()?;
        let _ = self.0.send((info.clone(), guest));
        Ok(Some(Box::new(SocketTransport::new(ours)?)))
    }
}

fn call(s: &mut UnixStream, ty: u32, payload: &[u8]) -> (u32, Vec<u8>) {
    let mut m = Vec::new();
    encode_message(&mut m, ty, 9, 0, payload);
    s.write_all(&m).unwrap();
    loop {
        let mut h = [0u8; HEADER_LEN];
        s.read_exact(&mut h).unwrap();
        let h = Header::decode(&h).unwrap();
        let mut b = vec![0; h.len as usize];
        s.read_exact(&mut b).unwrap();
        if h.ty != 15 {
            return (h.ty, b);
        }
    }
}

#[tokio::test]
async fn introduced_guest_is_served_with_its_identity() {
    let dir = std::env::temp_dir().join(format!("pvio-xs-hook-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("sock");
    let (tx, rx) = mpsc::channel();
    let quotas = Quotas {
        nodes_per_domain: 3,
        ..Quotas::default()
    };
    let mut d = Daemon::new(quotas, Limits::default(), PairHook(tx)).unwrap();
    d.listen(&sock).unwrap();
    std::thread::spawn(move || d.run());

    let dom0 = Client::connect(&sock).await.unwrap();
    dom0.write("/local/domain/5/name", "guest").await.unwrap();
    dom0.introduce(5, 0xfeed, 3).await.unwrap();
    let (info, mut g) = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!((info.domid, info.mfn, info.port), (5, 0xfeed, 3));
    g.set_read_timeout(Some(Duration::from_secs(20))).unwrap();

    // The guest is unprivileged: dom0's nodes are closed to it...
    assert_eq!(call(&mut g, 2, b"/tool\0"), (16, b"EACCES\0".to_vec()));
    assert_eq!(call(&mut g, 0, b"quota\0"), (16, b"EACCES\0".to_vec()));
    assert_eq!(call(&mut g, 11, b"name\0x"), (16, b"EACCES\0".to_vec()));
    // ...until the toolstack hands it its home; relative paths resolve there.
    dom0.set_perms("/local/domain/5", &Perms::parse([&b"n5"[..]]).unwrap())
        .await
        .unwrap();
    assert_eq!(call(&mut g, 11, b"data/a\0v"), (11, b"OK\0".to_vec()));
    assert_eq!(call(&mut g, 2, b"data/a\0"), (2, b"v".to_vec()));
    assert_eq!(
        dom0.get_perms("/local/domain/5/data/a")
            .await
            .unwrap()
            .to_string(),
        "n5"
    );
    // A guest that pipelines far more requests than the `outstanding`
    // quota without reading is throttled, not dropped, and every request
    // is answered in order once it reads.
    const N: u32 = 20_000;
    let mut w = g.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let mut all = Vec::new();
        for i in 0..N {
            encode_message(&mut all, 2, i, 0, b"data/a\0");
        }
        w.write_all(&all).unwrap();
    });
    for i in 0..N {
        let mut h = [0u8; HEADER_LEN];
        g.read_exact(&mut h).unwrap();
        let h = Header::decode(&h).unwrap();
        let mut b = vec![0; h.len as usize];
        g.read_exact(&mut b).unwrap();
        assert_eq!((h.ty, h.req_id, b.as_slice()), (2, i, &b"v"[..]));
    }
    writer.join().unwrap();
    // Its node quota holds (home + data + data/a = 3).
    assert_eq!(call(&mut g, 11, b"data/b\0v"), (16, b"ENOSPC\0".to_vec()));
    // Release closes the guest's connection and removes what it owned.
    dom0.release(5).await.unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(g.read(&mut buf).unwrap(), 0, "connection closed on release");
    assert!(!dom0.exists("/local/domain/5").await.unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}
