//! The client of hvd: how a process becomes a domain and asks for event
//! channels, grant mappings and foreign memory.
//!
//! One [`HvClient`] is one connection, and the connection is the process's
//! membership of its domain: when it closes (or the process dies) hvd closes
//! the ports it opened and drops the grants it mapped, and a guest domain is
//! destroyed.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex};

use pvio_abi::event_channel::EvtchnPort;
use pvio_abi::grant_table::{GntStatus, GrantRef};
use pvio_abi::DomId;

use crate::error::HvError;
use crate::evtchn::EventChannel;
use crate::grant::{GrantTable, GrantTableMem};
use crate::memory::{ForeignMemory, GuestMemory};
use crate::proto::{
    reply_payload, DomainInfo, GrantMapItem, HvdInfo, MapResult, PortStatus, Reader, Request,
    MAX_MESSAGE,
};
use crate::sys;

/// A connection to hvd.
#[derive(Debug)]
pub struct HvClient {
    sock: Mutex<OwnedFd>,
    domid: DomId,
}

/// A process that is a guest domain: its connection, memory and grant table.
#[derive(Debug)]
pub struct GuestDomain {
    pub client: HvClient,
    /// Shared so that rings and buffers placed in it can hold it alive.
    pub memory: Arc<GuestMemory>,
    pub grants: Arc<GrantTable>,
    /// The xenstore event channel hvd prepared (offered to dom0); the
    /// xenbus ring is frame [`crate::memory::STORE_FRAME`].
    pub store: EventChannel,
}

/// A domain created by [`HvClient::create_domain`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreatedDomain {
    pub domid: DomId,
    /// What the guest process presents to claim the domain.
    pub token: u64,
    /// The guest's xenstore event channel, for `XS_INTRODUCE`.
    pub store_port: EvtchnPort,
}

/// A grant mapped by [`HvClient::map_grant_refs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MappedGrant {
    pub gref: GrantRef,
    pub handle: u32,
    pub frame: u32,
}

fn decode_err(e: crate::proto::DecodeError) -> HvError {
    HvError::Protocol(e.0)
}

impl HvClient {
    fn connect(path: &Path) -> Result<OwnedFd, HvError> {
        sys::seqpacket_connect(path).map_err(|e| {
            HvError::Io(format!(
                "cannot connect to hvd at {}: {e} (is `pvio hvd` running?)",
                path.display()
            ))
        })
    }

    /// Sends a request and returns the reply payload and descriptors.
    fn call(&self, req: &Request) -> Result<(Vec<u8>, Vec<OwnedFd>), HvError> {
        let sock = self
            .sock
            .lock()
            .map_err(|_| HvError::Io("hvd connection lock poisoned".into()))?;
        Self::call_on(&sock, req)
    }

    fn call_on(sock: &OwnedFd, req: &Request) -> Result<(Vec<u8>, Vec<OwnedFd>), HvError> {
        sys::send_with_fds(sock.as_fd(), &req.encode(), &[], false).map_err(|e| {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                HvError::Disconnected
            } else {
                HvError::from(e)
            }
        })?;
        let mut buf = vec![0u8; MAX_MESSAGE];
        let got = sys::recv_with_fds(sock.as_fd(), &mut buf, false)?;
        if got.len == 0 {
            return Err(HvError::Disconnected);
        }
        if got.truncated {
            return Err(HvError::Protocol("reply truncated".into()));
        }
        buf.truncate(got.len);
        Ok((buf, got.fds))
    }

    fn expect_fds(fds: Vec<OwnedFd>, n: usize, what: &str) -> Result<Vec<OwnedFd>, HvError> {
        if fds.len() != n {
            return Err(HvError::Protocol(format!(
                "{what}: expected {n} descriptors, got {}",
                fds.len()
            )));
        }
        Ok(fds)
    }

    /// Connects as a process of domain 0 (the host).
    pub fn connect_host(path: &Path) -> Result<Self, HvError> {
        let sock = Self::connect(path)?;
        let (buf, _) = Self::call_on(&sock, &Request::RegisterHost)?;
        let mut r = reply_payload(&buf)?;
        let domid = r.u16("domid").map_err(decode_err)?;
        Ok(Self {
            sock: Mutex::new(sock),
            domid,
        })
    }

    fn guest_from_reply(
        sock: OwnedFd,
        buf: &[u8],
        fds: Vec<OwnedFd>,
    ) -> Result<GuestDomain, HvError> {
        let mut r = reply_payload(buf)?;
        let info = DomainInfo::read(&mut r).map_err(decode_err)?;
        let store_port = r.u32("store port").map_err(decode_err)?;
        let mut fds = Self::expect_fds(fds, 4, "domain memory")?.into_iter();
        let (mem_fd, grant_fd) = (fds.next().unwrap(), fds.next().unwrap());
        let (store_wait, store_notify) = (fds.next().unwrap(), fds.next().unwrap());
        let memory = Arc::new(GuestMemory::from_fd(mem_fd, info.frames)?);
        let grants = Arc::new(GrantTable::new(GrantTableMem::from_fd(
            &grant_fd,
            info.grant_frames,
        )?));
        Ok(GuestDomain {
            client: Self {
                sock: Mutex::new(sock),
                domid: info.domid,
            },
            memory,
            grants,
            store: EventChannel::from_fds(store_port, 0, store_wait, store_notify),
        })
    }

    /// Creates a fresh guest domain of `frames` 4 KiB pages and becomes it.
    pub fn register_guest(path: &Path, name: &str, frames: u32) -> Result<GuestDomain, HvError> {
        let sock = Self::connect(path)?;
        let (buf, fds) = Self::call_on(
            &sock,
            &Request::RegisterGuest {
                name: name.to_string(),
                frames,
            },
        )?;
        Self::guest_from_reply(sock, &buf, fds)
    }

    /// Becomes a domain that the toolstack created with
    /// [`HvClient::create_domain`].
    pub fn claim_domain(path: &Path, domid: DomId, token: u64) -> Result<GuestDomain, HvError> {
        let sock = Self::connect(path)?;
        let (buf, fds) = Self::call_on(&sock, &Request::ClaimDomain { domid, token })?;
        Self::guest_from_reply(sock, &buf, fds)
    }

    /// This connection's domain.
    pub fn domid(&self) -> DomId {
        self.domid
    }

    /// Creates a guest domain for another process to claim (privileged).
    pub fn create_domain(&self, name: &str, frames: u32) -> Result<CreatedDomain, HvError> {
        let (buf, _) = self.call(&Request::CreateDomain {
            name: name.to_string(),
            frames,
        })?;
        let mut r = reply_payload(&buf)?;
        Ok(CreatedDomain {
            domid: r.u16("domid").map_err(decode_err)?,
            token: r.u64("token").map_err(decode_err)?,
            store_port: r.u32("store port").map_err(decode_err)?,
        })
    }

    /// Destroys a domain (privileged).
    pub fn destroy_domain(&self, domid: DomId) -> Result<(), HvError> {
        let (buf, _) = self.call(&Request::DestroyDomain { domid })?;
        reply_payload(&buf).map(|_| ())
    }

    /// Lists the domains.
    pub fn list_domains(&self) -> Result<Vec<DomainInfo>, HvError> {
        let (buf, _) = self.call(&Request::ListDomains)?;
        let mut r = reply_payload(&buf)?;
        let n = r
            .count(u16::MAX as usize, 1, "domain count")
            .map_err(decode_err)?;
        (0..n)
            .map(|_| DomainInfo::read(&mut r).map_err(decode_err))
            .collect()
    }

    fn channel_reply(&self, req: &Request, remote_dom: DomId) -> Result<EventChannel, HvError> {
        let (buf, fds) = self.call(req)?;
        let mut r: Reader<'_> = reply_payload(&buf)?;
        let port = r.u32("port").map_err(decode_err)?;
        let mut fds = Self::expect_fds(fds, 2, req.name())?.into_iter();
        let (wait, notify) = (fds.next().unwrap(), fds.next().unwrap());
        Ok(EventChannel::from_fds(port, remote_dom, wait, notify))
    }

    /// `EVTCHNOP_alloc_unbound`: a new port that `remote_dom` may bind to.
    pub fn evtchn_alloc_unbound(&self, remote_dom: DomId) -> Result<EventChannel, HvError> {
        self.channel_reply(&Request::EvtchnAllocUnbound { remote_dom }, remote_dom)
    }

    /// `EVTCHNOP_bind_interdomain`: connects a new port to `remote_port` of
    /// `remote_dom`, which must be unbound and offered to this domain.
    pub fn evtchn_bind_interdomain(
        &self,
        remote_dom: DomId,
        remote_port: EvtchnPort,
    ) -> Result<EventChannel, HvError> {
        self.channel_reply(
            &Request::EvtchnBindInterdomain {
                remote_dom,
                remote_port,
            },
            remote_dom,
        )
    }

    /// `EVTCHNOP_close`.
    pub fn evtchn_close(&self, port: EvtchnPort) -> Result<(), HvError> {
        let (buf, _) = self.call(&Request::EvtchnClose { port })?;
        reply_payload(&buf).map(|_| ())
    }

    /// `EVTCHNOP_send` through hvd.
    pub fn evtchn_send(&self, port: EvtchnPort) -> Result<(), HvError> {
        let (buf, _) = self.call(&Request::EvtchnSend { port })?;
        reply_payload(&buf).map(|_| ())
    }

    /// `EVTCHNOP_status`.
    pub fn evtchn_status(&self, dom: DomId, port: EvtchnPort) -> Result<PortStatus, HvError> {
        let (buf, _) = self.call(&Request::EvtchnStatus { dom, port })?;
        let mut r = reply_payload(&buf)?;
        PortStatus::read(&mut r).map_err(decode_err)
    }

    /// Every open port of `dom`.
    pub fn evtchn_list(&self, dom: DomId) -> Result<Vec<PortStatus>, HvError> {
        let (buf, _) = self.call(&Request::EvtchnList { dom })?;
        let mut r = reply_payload(&buf)?;
        let n = r.count(usize::MAX, 18, "port count").map_err(decode_err)?;
        (0..n)
            .map(|_| PortStatus::read(&mut r).map_err(decode_err))
            .collect()
    }

    /// Maps the whole memory of guest `dom` (privileged).
    pub fn foreign_memory(&self, dom: DomId) -> Result<ForeignMemory, HvError> {
        let (buf, fds) = self.call(&Request::ForeignMemory { dom })?;
        let mut r = reply_payload(&buf)?;
        let frames = r.u32("frames").map_err(decode_err)?;
        let fd = Self::expect_fds(fds, 1, "foreign memory")?.pop().unwrap();
        ForeignMemory::from_fd(dom, fd, frames)
    }

    /// `GNTTABOP_map_grant_ref` for a batch: one result per item, in order.
    pub fn map_grants(
        &self,
        dom: DomId,
        items: &[GrantMapItem],
    ) -> Result<Vec<MapResult>, HvError> {
        let (buf, _) = self.call(&Request::GrantMap {
            dom,
            items: items.to_vec(),
        })?;
        let mut r = reply_payload(&buf)?;
        let n = r
            .count(items.len(), 11, "result count")
            .map_err(decode_err)?;
        if n != items.len() {
            return Err(HvError::Protocol(format!(
                "{n} results for {} grants",
                items.len()
            )));
        }
        (0..n)
            .map(|_| MapResult::read(&mut r).map_err(decode_err))
            .collect()
    }

    /// Maps all of `refs` or none (like `xengnttab_map_domain_grant_refs`):
    /// on the first failure, the grants already mapped are unmapped and the
    /// failure is returned.
    pub fn map_grant_refs(
        &self,
        dom: DomId,
        refs: &[GrantRef],
        readonly: bool,
    ) -> Result<Vec<MappedGrant>, HvError> {
        let items: Vec<GrantMapItem> = refs
            .iter()
            .map(|&gref| GrantMapItem { gref, readonly })
            .collect();
        let results = self.map_grants(dom, &items)?;
        if let Some((i, bad)) = results
            .iter()
            .enumerate()
            .find(|(_, r)| r.status != GntStatus::Okay)
        {
            let ok: Vec<u32> = results
                .iter()
                .filter(|r| r.status == GntStatus::Okay)
                .map(|r| r.handle)
                .collect();
            if !ok.is_empty() {
                self.unmap_grants(&ok)?;
            }
            return Err(HvError::Grant {
                domid: dom,
                gref: refs[i],
                status: bad.status,
                reason: bad.reason,
            });
        }
        Ok(results
            .iter()
            .zip(refs)
            .map(|(r, &gref)| MappedGrant {
                gref,
                handle: r.handle,
                frame: r.frame,
            })
            .collect())
    }

    /// `GNTTABOP_unmap_grant_ref` for a batch of handles; one result each.
    pub fn unmap_grants(&self, handles: &[u32]) -> Result<Vec<MapResult>, HvError> {
        let (buf, _) = self.call(&Request::GrantUnmap {
            handles: handles.to_vec(),
        })?;
        let mut r = reply_payload(&buf)?;
        let n = r
            .count(handles.len(), 11, "result count")
            .map_err(decode_err)?;
        (0..n)
            .map(|_| MapResult::read(&mut r).map_err(decode_err))
            .collect()
    }

    /// hvd's counters and limits.
    pub fn info(&self) -> Result<HvdInfo, HvError> {
        let (buf, _) = self.call(&Request::Info)?;
        let mut r = reply_payload(&buf)?;
        HvdInfo::read(&mut r).map_err(decode_err)
    }

    /// Sends raw bytes as a request and returns the raw reply (hostile-input
    /// tests use this to send what the typed API never would).
    pub fn call_raw(&self, bytes: &[u8]) -> Result<Vec<u8>, HvError> {
        let sock = self
            .sock
            .lock()
            .map_err(|_| HvError::Io("hvd connection lock poisoned".into()))?;
        sys::send_with_fds(sock.as_fd(), bytes, &[], false)?;
        let mut buf = vec![0u8; MAX_MESSAGE];
        let got = sys::recv_with_fds(sock.as_fd(), &mut buf, false)?;
        if got.len == 0 {
            return Err(HvError::Disconnected);
        }
        buf.truncate(got.len);
        Ok(buf)
    }
}
