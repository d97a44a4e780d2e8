//! The async client and xenbus helpers against an in-process daemon.

use pvio_abi::xenbus::XenbusState;
use pvio_xenstore::daemon::{Daemon, Limits, RecordOnly};
use pvio_xenstore::store::quota::Quotas;
use pvio_xenstore::{xenbus, Client, Error, Perms, XsError};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Starts a daemon thread on a fresh socket; the thread lives as long as
/// the test process.
fn daemon(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pvio-xs-client-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("sock");
    let mut d = Daemon::new(Quotas::default(), Limits::default(), RecordOnly).unwrap();
    d.listen(&sock).unwrap();
    std::thread::spawn(move || d.run());
    sock
}

#[tokio::test]
async fn node_operations() {
    let c = Client::connect(daemon("ops")).await.unwrap();
    c.write("/a/b", "1").await.unwrap();
    assert_eq!(c.read("/a/b").await.unwrap(), b"1");
    assert_eq!(c.read_string("/a/b").await.unwrap(), "1");
    assert_eq!(c.try_read("/a/zz").await.unwrap(), None);
    assert!(c.exists("/a").await.unwrap());
    assert!(matches!(
        c.read("/nope").await,
        Err(Error::Xen(XsError::Enoent))
    ));
    c.mkdir("/a/c").await.unwrap();
    assert_eq!(c.directory("/a").await.unwrap(), ["b", "c"]);
    let p: Perms = Perms::parse([&b"n0"[..], b"r5"]).unwrap();
    c.set_perms("/a/b", &p).await.unwrap();
    assert_eq!(c.get_perms("/a/b").await.unwrap(), p);
    c.rm("/a").await.unwrap();
    assert!(!c.exists("/a").await.unwrap());
    assert_eq!(c.get_domain_path(3).await.unwrap(), "/local/domain/3");
    assert!(!c.is_domain_introduced(3).await.unwrap());
    c.introduce(3, 77, 5).await.unwrap();
    assert!(c.is_domain_introduced(3).await.unwrap());
    c.release(3).await.unwrap();
    assert!(c
        .control(&["quota"])
        .await
        .unwrap()
        .starts_with("Quota settings:"));
    // Binary values survive.
    c.write("/bin", [0u8, 1, 2, 255]).await.unwrap();
    assert_eq!(c.read("/bin").await.unwrap(), [0u8, 1, 2, 255]);
}

#[tokio::test]
async fn long_directories_use_directory_part() {
    let c = Client::connect(daemon("dirpart")).await.unwrap();
    let names: Vec<String> = (0..400)
        .map(|i| format!("a-fairly-long-child-name-{i}"))
        .collect();
    c.transaction(async |t| {
        for n in &names {
            t.write(&format!("/big/{n}"), "").await?;
        }
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(c.directory("/big").await.unwrap(), names);
}

#[tokio::test]
async fn transactions_retry_on_conflict() {
    let sock = daemon("tx");
    let c = Client::connect(&sock).await.unwrap();
    let other = Client::connect(&sock).await.unwrap();
    c.write("/counter", "0").await.unwrap();
    // A manual conflict first.
    let t = c.transaction_start().await.unwrap();
    assert_eq!(t.read_string("/counter").await.unwrap(), "0");
    other.write("/counter", "10").await.unwrap();
    t.write("/counter", "1").await.unwrap();
    assert!(matches!(t.commit().await, Err(Error::Xen(XsError::Eagain))));
    // The helper redoes the body; the first attempt meets a conflict.
    let mut attempts = 0;
    c.transaction(async |t| {
        attempts += 1;
        let v: u32 = t.read_string("/counter").await?.parse().unwrap();
        if attempts == 1 {
            other.write("/counter", "20").await?;
        }
        t.write("/counter", (v + 1).to_string()).await
    })
    .await
    .unwrap();
    assert_eq!(attempts, 2);
    assert_eq!(c.read_string("/counter").await.unwrap(), "21");
    // An error from the body aborts.
    let r: Result<(), Error> = c
        .transaction(async |t| {
            t.write("/counter", "99").await?;
            Err(Error::Xen(XsError::Einval))
        })
        .await;
    assert!(matches!(r, Err(Error::Xen(XsError::Einval))));
    assert_eq!(c.read_string("/counter").await.unwrap(), "21");
    // Concurrent increments from several connections all land.
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let sock = sock.clone();
        tasks.push(tokio::spawn(async move {
            let c = Client::connect(&sock).await.unwrap();
            for _ in 0..25 {
                c.transaction(async |t| {
                    let v: u32 = t.read_string("/counter").await?.parse().unwrap();
                    t.write("/counter", (v + 1).to_string()).await
                })
                .await
                .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(c.read_string("/counter").await.unwrap(), "121");
}

#[tokio::test]
async fn watches_deliver_events() {
    let sock = daemon("watch");
    let c = Client::connect(&sock).await.unwrap();
    let writer = Client::connect(&sock).await.unwrap();
    let mut w = c.watch("/w").await.unwrap();
    assert_eq!(w.next().await.unwrap().path, "/w");
    writer.write("/w/x", "1").await.unwrap();
    assert_eq!(w.next().await.unwrap().path, "/w/x");
    let mut rel = c.watch("device").await.unwrap();
    assert_eq!(rel.next().await.unwrap().path, "device");
    writer
        .write("/local/domain/0/device/vbd", "")
        .await
        .unwrap();
    assert_eq!(rel.next().await.unwrap().path, "device/vbd");
    let mut intro = c.watch("@introduceDomain").await.unwrap();
    assert_eq!(intro.next().await.unwrap().path, "@introduceDomain");
    writer.introduce(9, 1, 1).await.unwrap();
    assert_eq!(intro.next().await.unwrap().path, "@introduceDomain");
    w.unwatch().await.unwrap();
    writer.write("/w/y", "1").await.unwrap();
    // Transaction changes fire at commit.
    let t = writer.transaction_start().await.unwrap();
    t.write("/local/domain/0/device/in-tx", "").await.unwrap();
    writer.write("/fence", "").await.unwrap();
    assert!(rel.try_next().is_none());
    t.commit().await.unwrap();
    assert_eq!(rel.next().await.unwrap().path, "device/in-tx");
}

#[tokio::test]
async fn xenbus_state_handshake() {
    let sock = daemon("xenbus");
    let back = Client::connect(&sock).await.unwrap();
    let front = Client::connect(&sock).await.unwrap();
    let fe = xenbus::frontend_path(5, "vbd", 51712);
    let be = xenbus::backend_path(0, "vbd", 5, 51712);
    assert_eq!(
        xenbus::read_state(&back, &fe).await.unwrap(),
        XenbusState::Unknown
    );
    assert!(matches!(
        xenbus::switch_state(&back, &be, XenbusState::InitWait).await,
        Err(Error::Xen(XsError::Enoent))
    ));
    back.transaction(async |t| {
        t.write(&format!("{be}/frontend"), &fe).await?;
        t.write(&format!("{fe}/backend"), &be).await?;
        t.write(&xenbus::state_path(&be), "1").await?;
        t.write(&xenbus::state_path(&fe), "1").await
    })
    .await
    .unwrap();
    assert_eq!(xenbus::peer_dir(&front, &fe, "backend").await.unwrap(), be);
    let waiter = {
        let back = back.clone();
        let fe = fe.clone();
        tokio::spawn(async move {
            xenbus::wait_for_state(&back, &fe, Instant::now() + Duration::from_secs(30), |s| {
                s == XenbusState::Connected
            })
            .await
        })
    };
    xenbus::switch_state(&back, &be, XenbusState::InitWait)
        .await
        .unwrap();
    xenbus::switch_state(&front, &fe, XenbusState::Initialised)
        .await
        .unwrap();
    xenbus::switch_state(&front, &fe, XenbusState::Connected)
        .await
        .unwrap();
    assert_eq!(waiter.await.unwrap().unwrap(), XenbusState::Connected);
    // A deadline that passes yields Timeout, not a hang.
    let r = xenbus::wait_for_state(
        &back,
        &fe,
        Instant::now() + Duration::from_millis(50),
        |s| s == XenbusState::Closed,
    )
    .await;
    assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
}

#[tokio::test]
async fn batched_writes_apply_in_order_and_report_the_first_error() {
    let c = Client::connect(daemon("many")).await.unwrap();
    let kvs: Vec<(String, String)> = (0..50)
        .map(|i| (format!("/batch/k{i:02}"), format!("v{i}")))
        .chain([("/batch/k07".to_string(), "again".to_string())])
        .collect();
    c.write_many(&kvs).await.unwrap();
    let names = c.directory("/batch").await.unwrap();
    assert_eq!(names.len(), 50);
    assert_eq!(c.read_string("/batch/k49").await.unwrap(), "v49");
    // The later write of the same key wins: requests were applied in order.
    assert_eq!(c.read_string("/batch/k07").await.unwrap(), "again");
    // Inside a transaction too, and the transaction commits them together.
    c.transaction(async |t| {
        t.write_many(&[
            ("/tx/a".to_string(), "1".to_string()),
            ("/tx/b".to_string(), "2".to_string()),
        ])
        .await
    })
    .await
    .unwrap();
    assert_eq!(c.read_string("/tx/b").await.unwrap(), "2");
    // A bad path in the middle: the error comes back, the others are done,
    // and the connection still answers.
    let bad = vec![
        ("/mixed/a".to_string(), "1".to_string()),
        ("/bad path".to_string(), "x".to_string()),
        ("/mixed/c".to_string(), "3".to_string()),
    ];
    assert!(matches!(
        c.write_many(&bad).await,
        Err(Error::Xen(XsError::Einval))
    ));
    assert_eq!(c.read_string("/mixed/a").await.unwrap(), "1");
    assert_eq!(c.read_string("/mixed/c").await.unwrap(), "3");
    // Too big a request is refused before anything is sent.
    let huge = vec![("/huge".to_string(), "x".repeat(5000))];
    assert!(matches!(
        c.write_many(&huge).await,
        Err(Error::Xen(XsError::E2big))
    ));
    assert!(!c.exists("/huge").await.unwrap());
}

#[tokio::test]
async fn batched_reads_answer_each_path_in_order() {
    let c = Client::connect(daemon("readmany")).await.unwrap();
    c.write("/r/a", "1").await.unwrap();
    c.write("/r/b", " two \0").await.unwrap();
    let paths: Vec<String> = ["/r/a", "/r/missing", "/r/b", "/r"]
        .iter()
        .map(|p| p.to_string())
        .collect();
    // A missing node is None in its place; the others keep their order.
    let raw = c.try_read_many(&paths).await.unwrap();
    assert_eq!(raw.len(), 4);
    assert_eq!(raw[0].as_deref(), Some(&b"1"[..]));
    assert_eq!(raw[1], None);
    assert_eq!(raw[2].as_deref(), Some(&b" two \0"[..]));
    // As text: trimmed of white space and the trailing NUL.
    let text = c.try_read_texts(&paths).await.unwrap();
    assert_eq!(
        text,
        vec![
            Some("1".into()),
            None,
            Some("two".into()),
            Some(String::new())
        ]
    );
    // Inside a transaction, its own writes are seen.
    let in_tx = c
        .transaction(async |t| {
            t.write("/r/c", "3").await?;
            t.try_read_many(&["/r/c".to_string(), "/r/a".to_string()])
                .await
        })
        .await
        .unwrap();
    assert_eq!(in_tx[0].as_deref(), Some(&b"3"[..]));
    // Any error but ENOENT fails the batch, and the connection goes on.
    let bad = vec!["/r/a".to_string(), "/bad path".to_string()];
    assert!(matches!(
        c.try_read_many(&bad).await,
        Err(Error::Xen(XsError::Einval))
    ));
    assert_eq!(c.read_string("/r/a").await.unwrap(), "1");
}
