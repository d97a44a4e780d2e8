//! System tests of `pvio hvd`: event channels and grants between real
//! processes, Xen's semantics and limits, hostile requests, processes killed
//! in the middle of a mapping, and descriptor leaks counted in /proc.

mod hv_support;

use hv_support::*;
use pvio_abi::event_channel::EvtchnStat;
use pvio_abi::grant_table::{GntStatus, GTF_PERMIT_ACCESS, GTF_READING, GTF_READONLY, GTF_WRITING};
use pvio_hv::proto::{GrantMapItem, Request, Writer};
use pvio_hv::{ErrorCode, GrantFailure, HvError};

fn item(gref: u32, readonly: bool) -> GrantMapItem {
    GrantMapItem { gref, readonly }
}

#[test]
fn event_channels_connect_notify_and_close_across_processes() {
    let hvd = Hvd::start(&[]);
    let host = hvd.host();
    let mut g = Guest::spawn(&hvd.socket, 16);
    assert!(g.domid >= 1);

    // Frontend pattern: the guest offers a port to dom0, dom0 binds it.
    let gport: u32 = g.ok("unbound 0").parse().unwrap();
    let st = host.evtchn_status(g.domid, gport).unwrap();
    assert_eq!((st.state, st.remote_dom), (EvtchnStat::Unbound, 0));

    // An event sent before the bind is pending once bound.
    g.ok(&format!("notify {gport}"));
    let chan = host.evtchn_bind_interdomain(g.domid, gport).unwrap();
    assert!(chan.wait_timeout(DEADLINE).unwrap(), "early event lost");

    let st = host.evtchn_status(g.domid, gport).unwrap();
    assert_eq!(st.state, EvtchnStat::Interdomain);
    assert_eq!((st.remote_dom, st.remote_port), (0, chan.port()));
    let hs = host.evtchn_status(0, chan.port()).unwrap();
    assert_eq!((hs.remote_dom, hs.remote_port), (g.domid, gport));

    // Ping-pong both ways.
    for _ in 0..100 {
        chan.notify().unwrap();
        assert_eq!(g.ok(&format!("wait {gport} 20000")), "event");
        g.ok(&format!("notify {gport}"));
        assert!(chan.wait_timeout(DEADLINE).unwrap());
    }
    assert!(!chan.try_consume().unwrap(), "spurious extra event");

    // lsevtchn shows both ends like Xen's tool.
    let out = std::process::Command::new(PVIO)
        .args(["lsevtchn", &g.domid.to_string(), "--socket"])
        .arg(&hvd.socket)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains(&format!(
            "{gport:4}: VCPU 0: Interdomain (Connected) - Remote Domain 0, Port {}",
            chan.port()
        )),
        "{text}"
    );

    // The guest closes its end: dom0's port becomes unbound (offered back to
    // the guest) and dom0 is woken.
    g.ok(&format!("close {gport}"));
    assert!(
        chan.wait_timeout(DEADLINE).unwrap(),
        "peer not woken on close"
    );
    let hs = host.evtchn_status(0, chan.port()).unwrap();
    assert_eq!((hs.state, hs.remote_dom), (EvtchnStat::Unbound, g.domid));
    assert_eq!(
        host.evtchn_status(g.domid, gport).unwrap().state,
        EvtchnStat::Closed
    );
    g.exit();
}

#[test]
fn binding_rules_are_enforced() {
    let hvd = Hvd::start(&[]);
    let host = hvd.host();
    let mut a = Guest::spawn(&hvd.socket, 16);
    let mut b = Guest::spawn(&hvd.socket, 16);

    // a offers a port to dom0 only: b may not bind it.
    let p: u32 = a.ok("unbound 0").parse().unwrap();
    let e = b.cmd(&format!("bind {} {p}", a.domid)).unwrap_err();
    assert!(e.contains("offered to domain 0"), "{e}");
    // Binding a closed or nonexistent port fails cleanly.
    let e = b.cmd(&format!("bind {} 4000", a.domid)).unwrap_err();
    assert!(e.contains("not open"), "{e}");
    let e = b.cmd("bind 9999 1").unwrap_err();
    assert!(e.contains("does not exist"), "{e}");
    // dom0 cannot close a port it does not have.
    assert_eq!(
        host.evtchn_close(p).unwrap_err().code(),
        Some(ErrorCode::BadPort),
        "dom0 has no port {p}"
    );
    // Guest-to-guest channels work when offered to the right domain.
    let q: u32 = a.ok(&format!("unbound {}", b.domid)).parse().unwrap();
    let bq: u32 = b.ok(&format!("bind {} {q}", a.domid)).parse().unwrap();
    b.ok(&format!("notify {bq}"));
    assert_eq!(a.ok(&format!("wait {q} 20000")), "event");
    // Already connected: a second bind is refused.
    let e = host.evtchn_bind_interdomain(a.domid, q).unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::BadPort), "{e}");
    a.exit();
    b.exit();
}

#[test]
fn grants_follow_xen_semantics() {
    let hvd = Hvd::start(&[]);
    let host = hvd.host();
    let mut g = Guest::spawn(&hvd.socket, 64);
    let d = g.domid;
    g.ok("write 10 0 hello from the guest");
    let ro: u32 = g.ok("grant 0 10 ro").parse().unwrap();
    let rw: u32 = g.ok("grant 0 11 rw").parse().unwrap();
    let other: u32 = g.ok("grant 7 12 rw").parse().unwrap();
    let bad_frame: u32 = g.ok("grant 0 12 rw").parse().unwrap();
    g.ok(&format!(
        "raw-entry {bad_frame} {:x}",
        (5000u64 << 32) | u64::from(GTF_PERMIT_ACCESS)
    ));

    let mem = host.foreign_memory(d).unwrap();
    let res = host
        .map_grants(
            d,
            &[
                item(ro, true),
                item(ro, false),
                item(other, true),
                item(9999, true),
                item(1_000_000, true),
                item(bad_frame, true),
                item(rw, false),
            ],
        )
        .unwrap();
    let statuses: Vec<(GntStatus, GrantFailure)> =
        res.iter().map(|r| (r.status, r.reason)).collect();
    assert_eq!(
        statuses,
        vec![
            (GntStatus::Okay, GrantFailure::None),
            (GntStatus::PermissionDenied, GrantFailure::ReadOnlyGrant),
            (GntStatus::PermissionDenied, GrantFailure::WrongGrantee),
            (GntStatus::PermissionDenied, GrantFailure::NotGranted),
            (GntStatus::BadGntref, GrantFailure::RefOutOfRange),
            (GntStatus::BadPage, GrantFailure::BadFrame),
            (GntStatus::Okay, GrantFailure::None),
        ]
    );
    assert_eq!(res[0].frame, 10);
    let mut buf = [0u8; 20];
    mem.read(res[0].frame, 0, &mut buf).unwrap();
    assert_eq!(&buf, b"hello from the guest");
    // The backend writes through the writable grant; the guest sees it.
    mem.write(res[6].frame, 0, b"written by dom0").unwrap();
    assert_eq!(g.ok("read 11 0 15"), "written by dom0");

    // While mapped the granter cannot revoke, and the flags say why.
    assert_eq!(g.ok(&format!("mapped {ro}")), "1");
    let e = g.cmd(&format!("end {ro}")).unwrap_err();
    assert!(e.contains("still mapped"), "{e}");
    let e = g.cmd(&format!("end {rw}")).unwrap_err();
    assert!(e.contains("still mapped"), "{e}");

    // A double map by the same process is refused; a double unmap too.
    let again = host.map_grants(d, &[item(ro, true)]).unwrap();
    assert_eq!(again[0].reason, GrantFailure::AlreadyMapped);
    let un = host
        .unmap_grants(&[res[0].handle, res[0].handle, 12345])
        .unwrap();
    assert_eq!(un[0].status, GntStatus::Okay);
    assert_eq!(un[1].reason, GrantFailure::BadHandle);
    assert_eq!(un[2].status, GntStatus::BadHandle);
    g.ok(&format!("end {ro}"));
    host.unmap_grants(&[res[6].handle]).unwrap();
    g.ok(&format!("end {rw}"));
    assert_eq!(host.info().unwrap().active_grants, 0);

    // All-or-nothing mapping unmaps what it mapped when one ref fails.
    let r1: u32 = g.ok("grant 0 20 rw").parse().unwrap();
    let err = host.map_grant_refs(d, &[r1, other], false).unwrap_err();
    assert!(
        matches!(
            err,
            HvError::Grant {
                reason: GrantFailure::WrongGrantee,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(g.ok(&format!("mapped {r1}")), "0");

    // A read-only mapping sets reading but not writing.
    let m = host.map_grant_refs(d, &[r1], true).unwrap();
    let raw = g.ok(&format!("mapped {r1}"));
    assert_eq!(raw, "1");
    host.unmap_grants(&[m[0].handle]).unwrap();
    assert_eq!(g.ok(&format!("mapped {r1}")), "0");
    g.exit();
}

#[test]
fn flags_track_readers_and_writers_across_mappers() {
    let hvd = Hvd::start(&[]);
    let h1 = hvd.host();
    let h2 = hvd.host();
    let mut g = Guest::spawn(&hvd.socket, 16);
    let r: u32 = g.ok("grant 0 3 rw").parse().unwrap();
    let flags = |g: &mut Guest| -> u16 {
        let e = g.ok(&format!("entry {r}"));
        e.split(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(flags(&mut g), GTF_PERMIT_ACCESS);
    let a = h1.map_grant_refs(g.domid, &[r], false).unwrap();
    let _b = h2.map_grant_refs(g.domid, &[r], true).unwrap();
    assert_eq!(flags(&mut g), GTF_PERMIT_ACCESS | GTF_READING | GTF_WRITING);
    h1.unmap_grants(&[a[0].handle]).unwrap(); // the writer goes, a reader stays
    assert_eq!(flags(&mut g), GTF_PERMIT_ACCESS | GTF_READING);
    assert!(g.cmd(&format!("end {r}")).is_err());
    drop(h2); // closing the connection releases its mapping
    wait_until("reader released", || flags(&mut g) == GTF_PERMIT_ACCESS);
    g.ok(&format!("end {r}"));
    assert_eq!(flags(&mut g), 0);
    // A read-only grant is never mapped writable, whoever asks.
    let ro: u32 = g.ok("grant 0 4 ro").parse().unwrap();
    assert_eq!(
        g.ok(&format!("entry {ro}")).split(' ').next().unwrap(),
        (GTF_PERMIT_ACCESS | GTF_READONLY).to_string()
    );
    assert_eq!(
        h1.map_grants(g.domid, &[item(ro, false)]).unwrap()[0].reason,
        GrantFailure::ReadOnlyGrant
    );
    g.exit();
}

#[test]
fn killing_a_guest_mid_mapping_cleans_up_and_leaks_nothing() {
    let hvd = Hvd::start(&[]);
    let baseline = hvd.settled_fd_count();
    let host = hvd.host();
    for round in 0..20 {
        let mut g = Guest::spawn(&hvd.socket, 32);
        let d = g.domid;
        g.ok(&format!("write 5 0 round {round}"));
        let r: u32 = g.ok("grant 0 5 rw").parse().unwrap();
        let p: u32 = g.ok("unbound 0").parse().unwrap();
        let chan = host.evtchn_bind_interdomain(d, p).unwrap();
        let mem = host.foreign_memory(d).unwrap();
        let m = host.map_grant_refs(d, &[r], false).unwrap();
        g.kill();
        // dom0's port is left unbound and dom0 is woken.
        assert!(
            chan.wait_timeout(DEADLINE).unwrap(),
            "not woken by the peer's death"
        );
        wait_until("domain gone", || {
            host.list_domains().unwrap().iter().all(|x| x.domid != d)
        });
        assert_eq!(
            host.evtchn_status(0, chan.port()).unwrap().state,
            EvtchnStat::Unbound
        );
        // The backend's mapping of the dead guest's memory stays valid.
        let mut buf = [0u8; 6];
        mem.read(m[0].frame, 0, &mut buf).unwrap();
        assert_eq!(&buf, b"round ");
        // Stale handles unmap cleanly.
        assert_eq!(
            host.unmap_grants(&[m[0].handle]).unwrap()[0].status,
            GntStatus::Okay
        );
        host.evtchn_close(chan.port()).unwrap();
    }
    let info = host.info().unwrap();
    assert_eq!(
        (
            info.domains,
            info.ports,
            info.active_grants,
            info.maptrack_entries
        ),
        (1, 0, 0, 0)
    );
    drop(host);
    hvd.wait_fds_back_to(baseline);
}

#[test]
fn killing_a_mapper_mid_mapping_releases_its_pins() {
    let hvd = Hvd::start(&[]);
    let baseline = hvd.settled_fd_count();
    let mut g = Guest::spawn(&hvd.socket, 32);
    let refs: Vec<u32> = (0..10)
        .map(|i| g.ok(&format!("grant 0 {} rw", 3 + i)).parse().unwrap())
        .collect();
    let gport: u32 = g.ok("unbound 0").parse().unwrap();
    // The mapper is a separate process: a dom0 backend we kill -9 while it
    // holds every mapping and a bound port.
    let mut mapper = std::process::Command::new(PVIO)
        .args(["internal", "map-and-hold", "--socket"])
        .arg(&hvd.socket)
        .arg("--domid")
        .arg(g.domid.to_string())
        .arg("--port")
        .arg(gport.to_string())
        .args(refs.iter().map(|r| r.to_string()))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(mapper.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "mapped 10");
    for r in &refs {
        assert_eq!(g.ok(&format!("mapped {r}")), "1");
    }
    mapper.kill().unwrap();
    mapper.wait().unwrap();
    // hvd notices the death: pins released, the guest can revoke, and its
    // port is unbound again; the guest is woken.
    wait_until("pins released", || {
        refs.iter().all(|r| g.ok(&format!("mapped {r}")) == "0")
    });
    for r in &refs {
        g.ok(&format!("end {r}"));
    }
    assert_eq!(g.ok(&format!("wait {gport} 20000")), "event");
    assert_eq!(g.ok(&format!("status {gport}")), "unbound 0 0");
    g.exit();
    hvd.wait_fds_back_to(baseline);
}

#[test]
fn hostile_requests_get_errors_and_hvd_survives() {
    let mut hvd = Hvd::start(&[]);
    let baseline = hvd.settled_fd_count();
    let watcher = hvd.host();

    // Raw, unregistered connections sending garbage.
    let sock = pvio_hv::sys::seqpacket_connect(&hvd.socket).unwrap();
    let send = |bytes: &[u8]| -> Vec<u8> {
        use std::os::fd::AsFd;
        pvio_hv::sys::send_with_fds(sock.as_fd(), bytes, &[], false).unwrap();
        let mut buf = vec![0u8; 70_000];
        let got = pvio_hv::sys::recv_with_fds(sock.as_fd(), &mut buf, false).unwrap();
        assert!(got.len > 0, "hvd hung up on {bytes:?}");
        buf.truncate(got.len);
        buf
    };
    let expect_err = |reply: Vec<u8>, code: ErrorCode| match pvio_hv::proto::reply_payload(&reply) {
        Err(HvError::Remote { code: c, message }) => {
            assert_eq!(c, code, "{message}");
            assert!(!message.is_empty());
        }
        other => panic!("expected {code:?}, got {other:?}"),
    };
    expect_err(send(&[1, 2, 3]), ErrorCode::Protocol);
    expect_err(send(&0xdead_beefu32.to_le_bytes()), ErrorCode::Protocol);
    expect_err(send(&Request::Info.encode()), ErrorCode::PermissionDenied);
    expect_err(
        send(&Request::EvtchnAllocUnbound { remote_dom: 0 }.encode()),
        ErrorCode::PermissionDenied,
    );
    let mut w = Writer::new();
    w.u32(21).u16(1).u32(u32::MAX); // grant map claiming 4 billion items
    expect_err(send(&w.into_bytes()), ErrorCode::Protocol);
    expect_err(
        send(&Request::ClaimDomain { domid: 0, token: 1 }.encode()),
        ErrorCode::PermissionDenied,
    );
    expect_err(
        send(
            &Request::ClaimDomain {
                domid: 777,
                token: 1,
            }
            .encode(),
        ),
        ErrorCode::NoSuchDomain,
    );
    expect_err(
        send(
            &Request::RegisterGuest {
                name: "x".into(),
                frames: 0,
            }
            .encode(),
        ),
        ErrorCode::InvalidArgument,
    );
    expect_err(
        send(
            &Request::RegisterGuest {
                name: "bad\nname".into(),
                frames: 1,
            }
            .encode(),
        ),
        ErrorCode::InvalidArgument,
    );
    // Deterministic pseudo-random garbage with plausible opcodes.
    let mut x: u64 = 0x1234_5678;
    for _ in 0..2000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = (x % 40) as usize;
        let mut m: Vec<u8> = (0..len).map(|i| (x >> (i % 8 * 8)) as u8).collect();
        if len >= 4 {
            m[..4].copy_from_slice(&((x % 35) as u32).to_le_bytes());
        }
        if m.is_empty() {
            continue; // a zero-length datagram reads as a hang-up
        }
        let reply = send(&m);
        assert!(pvio_hv::proto::reply_payload(&reply).is_err() || reply.len() >= 2);
    }
    // An oversized datagram is refused.
    expect_err(send(&vec![7u8; 66_000]), ErrorCode::Protocol);
    // Descriptors passed to hvd are refused (and closed).
    {
        use std::os::fd::AsFd;
        let efd = pvio_hv::sys::create_eventfd().unwrap();
        pvio_hv::sys::send_with_fds(sock.as_fd(), &Request::Info.encode(), &[efd.as_fd()], false)
            .unwrap();
        let mut buf = vec![0u8; 1024];
        let got = pvio_hv::sys::recv_with_fds(sock.as_fd(), &mut buf, false).unwrap();
        buf.truncate(got.len);
        expect_err(buf, ErrorCode::Protocol);
    }

    // A registered guest asking for privileged things.
    let gd = pvio_hv::HvClient::register_guest(&hvd.socket, "hostile", 8).unwrap();
    let c = &gd.client;
    assert_eq!(
        c.foreign_memory(0).unwrap_err().code(),
        Some(ErrorCode::PermissionDenied)
    );
    assert_eq!(
        c.create_domain("x", 1).unwrap_err().code(),
        Some(ErrorCode::PermissionDenied)
    );
    assert_eq!(
        c.destroy_domain(gd.client.domid()).unwrap_err().code(),
        Some(ErrorCode::PermissionDenied)
    );
    assert_eq!(
        c.map_grants(0, &[item(8, true)]).unwrap_err().code(),
        Some(ErrorCode::PermissionDenied)
    );
    assert_eq!(
        c.evtchn_list(0).unwrap_err().code(),
        Some(ErrorCode::PermissionDenied)
    );
    assert_eq!(
        c.evtchn_close(77).unwrap_err().code(),
        Some(ErrorCode::BadPort)
    );
    assert_eq!(
        c.evtchn_send(99).unwrap_err().code(),
        Some(ErrorCode::BadPort)
    );
    assert_eq!(
        c.evtchn_status(gd.client.domid(), 1 << 20)
            .unwrap_err()
            .code(),
        Some(ErrorCode::BadPort)
    );
    assert_eq!(
        c.evtchn_alloc_unbound(4321).unwrap_err().code(),
        Some(ErrorCode::NoSuchDomain)
    );
    // A second registration on the same connection is refused.
    let again = c.call_raw(&Request::RegisterHost.encode()).unwrap();
    expect_err(again, ErrorCode::Busy);

    // A grant table filled with garbage by its hostile owner.
    for r in 8..64u32 {
        let v = (u64::from(r) * 0x9e37_79b9_7f4a_7c15) | 1;
        gd.grants.raw().store(r, v).unwrap();
    }
    let items: Vec<GrantMapItem> = (0..80).map(|r| item(r, r % 2 == 0)).collect();
    for r in watcher.map_grants(gd.client.domid(), &items).unwrap() {
        assert_ne!(r.status, GntStatus::Okay, "garbage entry was mapped");
    }

    // A client that floods requests and never reads replies is dropped,
    // and hvd keeps serving others.
    {
        use std::os::fd::AsFd;
        let flood = pvio_hv::sys::seqpacket_connect(&hvd.socket).unwrap();
        rustix::io::ioctl_fionbio(&flood, true).unwrap();
        let m = Request::RegisterHost.encode();
        for _ in 0..100_000 {
            if pvio_hv::sys::send_with_fds(flood.as_fd(), &m, &[], true).is_err() {
                break;
            }
        }
        watcher.info().unwrap();
    }

    drop(gd);
    drop(sock);
    assert!(hvd.alive(), "hvd died");
    let info = watcher.info().unwrap();
    wait_until("guest gone", || watcher.info().unwrap().domains == 1);
    let _ = info;
    drop(watcher);
    hvd.wait_fds_back_to(baseline);
    assert!(hvd.stop().success(), "hvd did not exit cleanly on SIGTERM");
}

#[test]
fn limits_are_real_and_configurable() {
    // Two-level ABI: 4095 usable ports per domain, then a clear refusal.
    let hvd = Hvd::start(&["--max-grant-frames", "1", "--max-maptrack-entries", "4"]);
    let host = hvd.host();
    assert_eq!(host.info().unwrap().max_ports, 4096);
    let mut chans = Vec::new();
    loop {
        match host.evtchn_alloc_unbound(0) {
            Ok(c) => chans.push(c),
            Err(e) => {
                assert_eq!(e.code(), Some(ErrorCode::Limit), "{e}");
                assert!(e.to_string().contains("4096"), "{e}");
                break;
            }
        }
        assert!(chans.len() <= 4095, "port limit not enforced");
    }
    assert_eq!(chans.len(), 4095);
    for c in chans.drain(..) {
        host.evtchn_close(c.port()).unwrap();
    }

    // One grant frame: refs 0..511 only.
    let mut g = Guest::spawn(&hvd.socket, 16);
    let e = g.cmd("grant-ref 512 0 1 rw").unwrap_err();
    assert!(e.contains("beyond"), "{e}");
    let res = host.map_grants(g.domid, &[item(512, true)]).unwrap();
    assert_eq!(res[0].status, GntStatus::BadGntref);
    // Maptrack of 4: the fifth mapping is refused with no_space.
    let refs: Vec<u32> = (0..5)
        .map(|i| g.ok(&format!("grant 0 {} ro", 1 + i)).parse().unwrap())
        .collect();
    let items: Vec<GrantMapItem> = refs.iter().map(|&r| item(r, true)).collect();
    let res = host.map_grants(g.domid, &items).unwrap();
    assert!(res[..4].iter().all(|r| r.status == GntStatus::Okay));
    assert_eq!(
        (res[4].status, res[4].reason),
        (GntStatus::NoSpace, GrantFailure::MaptrackFull)
    );
    g.exit();

    // The FIFO ABI raises the port limit.
    let fifo = Hvd::start(&["--evtchn-abi", "fifo"]);
    let host = fifo.host();
    assert_eq!(host.info().unwrap().max_ports, 131_072);
    let many: Vec<_> = (0..5000)
        .map(|_| host.evtchn_alloc_unbound(0).unwrap())
        .collect();
    assert_eq!(many.last().unwrap().port(), 5000);
}

#[test]
fn toolstack_creates_and_a_guest_claims() {
    let hvd = Hvd::start(&[]);
    let host = hvd.host();
    let created = host.create_domain("vm1", 64).unwrap();
    let (domid, token) = (created.domid, created.token);
    // Like Xen's domain builder, hvd prepared the xenstore event channel,
    // offered to dom0, before the guest runs.
    let st = host.evtchn_status(domid, created.store_port).unwrap();
    assert_eq!((st.state, st.remote_dom), (EvtchnStat::Unbound, 0));
    // dom0 (xenstored) may bind it before the guest process exists.
    let store = host
        .evtchn_bind_interdomain(domid, created.store_port)
        .unwrap();
    let doms = host.list_domains().unwrap();
    let d = doms.iter().find(|x| x.domid == domid).unwrap();
    assert!(!d.running);
    assert_eq!((d.name.as_str(), d.frames, d.grant_frames), ("vm1", 64, 64));
    // A wrong token is refused; the right one works once.
    let e = Guest::try_claim(&hvd.socket, domid, token ^ 2);
    assert!(e.contains("wrong claim token"), "{e}");
    let mut g = Guest::spawn_with(
        &hvd.socket,
        &["--domid", &domid.to_string(), "--token", &token.to_string()],
    );
    assert_eq!(g.domid, domid);
    // The guest got the store channel's descriptors with its memory.
    g.ok("notify-store");
    assert!(
        store.wait_timeout(DEADLINE).unwrap(),
        "store event not delivered"
    );
    let e = Guest::try_claim(&hvd.socket, domid, token);
    assert!(e.contains("already running"), "{e}");
    // Destroying it from the toolstack disconnects the guest process.
    g.ok("unbound 0");
    host.destroy_domain(domid).unwrap();
    // Whichever way the socket reports it (EOF, EPIPE, ECONNRESET), the
    // guest's next request fails.
    let e = g.cmd("unbound 0").unwrap_err();
    assert!(!e.is_empty());
    wait_until("domain destroyed", || {
        host.list_domains()
            .unwrap()
            .iter()
            .all(|x| x.domid != domid)
    });
    assert_eq!(
        host.destroy_domain(0).unwrap_err().code(),
        Some(ErrorCode::InvalidArgument)
    );
    assert_eq!(
        host.destroy_domain(domid).unwrap_err().code(),
        Some(ErrorCode::NoSuchDomain)
    );
}

impl Guest {
    /// Tries to claim a domain in a fresh guest-shell; returns its error.
    fn try_claim(socket: &std::path::Path, domid: u16, token: u64) -> String {
        let out = std::process::Command::new(PVIO)
            .args(["internal", "guest-shell", "--socket"])
            .arg(socket)
            .args(["--domid", &domid.to_string(), "--token", &token.to_string()])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}
