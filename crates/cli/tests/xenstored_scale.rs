//! No connection limit from the event loop: 2,000 concurrent socket
//! clients, each served, and a watch event fanned out to all of them.

mod xenstored_common;
use pvio_xenstore::Client;
use xenstored_common::{Raw, Xenstored};

const CLIENTS: usize = 2000;

/// The two tests each hold 2,000+ descriptors; run them one at a time so
/// that a hard limit of 4,096 suffices.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn raise_nofile() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut l = getrlimit(Resource::Nofile);
    l.current = l.maximum;
    setrlimit(Resource::Nofile, l).unwrap();
    let cur = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    assert!(
        cur as usize > CLIENTS + 100,
        "descriptor limit {cur} too low for the test"
    );
}

#[test]
fn two_thousand_concurrent_raw_clients() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    raise_nofile();
    let mut d = Xenstored::start("scale-raw");
    let mut clients: Vec<Raw> = (0..CLIENTS).map(|_| d.raw()).collect();
    // Every client has a request in flight at the same time.
    for (i, c) in clients.iter_mut().enumerate() {
        c.send(11, i as u32, 0, format!("/scale/{i}\0value-{i}").as_bytes());
    }
    for (i, c) in clients.iter_mut().enumerate() {
        let (h, body) = c.recv().expect("reply");
        assert_eq!((h.ty, h.req_id), (11, i as u32));
        assert_eq!(body, b"OK\0");
    }
    for (i, c) in clients.iter_mut().enumerate().rev() {
        let (ty, v) = c.call(2, 0, format!("/scale/{i}\0").as_bytes());
        assert_eq!((ty, v), (2, format!("value-{i}").into_bytes()));
    }
    assert!(d.alive());
    drop(clients);
    assert!(d.stop().success());
}

#[test]
fn two_thousand_async_clients_receive_one_watch_event_each() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    raise_nofile();
    let mut d = Xenstored::start("scale-watch");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sock = d.sock.clone();
    rt.block_on(async move {
        let mut watchers = Vec::with_capacity(CLIENTS);
        let mut clients = Vec::with_capacity(CLIENTS);
        for _ in 0..CLIENTS {
            let c = Client::connect(&sock).await.unwrap();
            let mut w = c.watch("/fanout").await.unwrap();
            assert_eq!(w.next().await.unwrap().path, "/fanout");
            watchers.push(w);
            clients.push(c);
        }
        clients[0].write("/fanout/go", "1").await.unwrap();
        for w in &mut watchers {
            assert_eq!(w.next().await.unwrap().path, "/fanout/go");
        }
    });
    assert!(d.alive());
    assert!(d.stop().success());
}
