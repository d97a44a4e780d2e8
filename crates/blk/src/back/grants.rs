//! The backend's view of the frontend's grants.
//!
//! hvd validates and pins every grant the backend touches; the backend then
//! reaches the granted frame through its mapping of the guest's memory.
//! With `feature-persistent` the frontend reuses a fixed pool of granted
//! pages, so a grant is mapped once and kept (Linux blkback keeps up to 1056
//! per ring); without it, or once the cache is full, a request's grants are
//! mapped for the request and unmapped when it completes.

use std::collections::HashMap;
use std::sync::Arc;

use pvio_abi::grant_table::{GntStatus, GrantRef};
use pvio_abi::DomId;
use pvio_hv::proto::GrantMapItem;
use pvio_hv::{GrantFailure, HvClient, HvError};

/// A grant the backend may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    handle: u32,
    frame: u32,
}

/// Why a request's grants could not be mapped.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GrantError {
    #[error("grant ref {gref} of domain {domid}: {}", .reason.describe())]
    Refused {
        domid: DomId,
        gref: GrantRef,
        status: GntStatus,
        reason: GrantFailure,
    },
    #[error("hvd: {0}")]
    Hv(#[from] HvError),
}

/// Maps the frontend's grants for one queue.
#[derive(Debug)]
pub struct GrantMapper {
    host: Arc<HvClient>,
    domid: DomId,
    persistent: bool,
    max_persistent: usize,
    cache: HashMap<GrantRef, Held>,
    /// hvd round trips made.
    pub map_calls: u64,
}

impl GrantMapper {
    /// A mapper for grants of `domid`; with `persistent`, up to
    /// `max_persistent` grants stay mapped.
    pub fn new(host: Arc<HvClient>, domid: DomId, persistent: bool, max_persistent: usize) -> Self {
        Self {
            host,
            domid,
            persistent,
            max_persistent,
            cache: HashMap::new(),
            map_calls: 0,
        }
    }

    /// Grants currently kept mapped.
    pub fn persistent_count(&self) -> usize {
        self.cache.len()
    }

    /// Frames for `grefs`, in order. `backend_writes` says whether the
    /// backend will write into the pages (a disk read): otherwise they are
    /// mapped read-only. Handles to release when the request completes are
    /// appended to `temp` (grants not kept persistently).
    pub fn map(
        &mut self,
        grefs: &[GrantRef],
        backend_writes: bool,
        frames: &mut Vec<u32>,
        temp: &mut Vec<u32>,
    ) -> Result<(), GrantError> {
        frames.clear();
        // Persistent grants are mapped writable once and reused either way.
        let mut misses: Vec<GrantRef> = Vec::new();
        if self.persistent {
            for g in grefs {
                if !self.cache.contains_key(g) && !misses.contains(g) {
                    misses.push(*g);
                }
            }
            if !misses.is_empty() && self.cache.len() + misses.len() <= self.max_persistent {
                self.map_calls += 1;
                let items: Vec<GrantMapItem> = misses
                    .iter()
                    .map(|&gref| GrantMapItem {
                        gref,
                        readonly: false,
                    })
                    .collect();
                let res = self.host.map_grants(self.domid, &items)?;
                for (r, &gref) in res.iter().zip(&misses) {
                    if r.status == GntStatus::Okay {
                        self.cache.insert(
                            gref,
                            Held {
                                handle: r.handle,
                                frame: r.frame,
                            },
                        );
                    }
                }
            }
            if grefs.iter().all(|g| self.cache.contains_key(g)) {
                frames.extend(grefs.iter().map(|g| self.cache[g].frame));
                return Ok(());
            }
        }
        // Map for this request only.
        self.map_calls += 1;
        let items: Vec<GrantMapItem> = grefs
            .iter()
            .map(|&gref| GrantMapItem {
                gref,
                readonly: !backend_writes,
            })
            .collect();
        let res = self.host.map_grants(self.domid, &items)?;
        let mut bad = None;
        for (r, &gref) in res.iter().zip(grefs) {
            if r.status == GntStatus::Okay {
                temp.push(r.handle);
                frames.push(r.frame);
            } else if bad.is_none() {
                bad = Some(GrantError::Refused {
                    domid: self.domid,
                    gref,
                    status: r.status,
                    reason: r.reason,
                });
            }
        }
        match bad {
            None => Ok(()),
            Some(e) => {
                self.release(temp);
                temp.clear();
                frames.clear();
                Err(e)
            }
        }
    }

    /// The frame of one grant, for copying an indirect page (read-only use).
    pub fn frame_for_read(
        &mut self,
        gref: GrantRef,
        temp: &mut Vec<u32>,
    ) -> Result<u32, GrantError> {
        let mut frames = Vec::with_capacity(1);
        self.map(&[gref], false, &mut frames, temp)?;
        Ok(frames[0])
    }

    /// Unmaps per-request grants.
    pub fn release(&mut self, handles: &[u32]) {
        if handles.is_empty() {
            return;
        }
        if let Err(e) = self.host.unmap_grants(handles) {
            tracing::warn!(
                "unmapping {} grants of domain {}: {e}",
                handles.len(),
                self.domid
            );
        }
    }

    /// Unmaps every persistent grant (at disconnect).
    pub fn unmap_all(&mut self) {
        let handles: Vec<u32> = self.cache.values().map(|h| h.handle).collect();
        self.cache.clear();
        for chunk in handles.chunks(pvio_hv::proto::MAX_GRANTS_PER_OP) {
            self.release(chunk);
        }
    }
}

impl Drop for GrantMapper {
    fn drop(&mut self) {
        self.unmap_all();
    }
}
