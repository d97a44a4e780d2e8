//! The backend's view of the frontend's grants.
//!
//! hvd validates and pins every grant the backend touches; the backend then
//! reaches the granted frame through its mapping of the guest's memory.
//! With `feature-persistent` the frontend reuses a fixed pool of granted
//! pages, so a grant is mapped once and kept (Linux blkback keeps up to 1056
//! per ring); without it, or for the grants that no longer fit once the
//! cache is full, a grant is mapped for the request and unmapped when the
//! request completes.

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
    /// Scratch for one call of [`GrantMapper::map`]: the frames of grants
    /// mapped by that call.
    fresh: HashMap<GrantRef, u32>,
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
            fresh: HashMap::new(),
            map_calls: 0,
        }
    }

    /// Grants currently kept mapped.
    pub fn persistent_count(&self) -> usize {
        self.cache.len()
    }

    /// Frames for `grefs`, in order. `backend_writes` says whether the
    /// backend will write into the pages (a disk read): otherwise grants
    /// mapped for this request only are mapped read-only. Handles to release
    /// when the request completes are appended to `temp`.
    ///
    /// As Linux blkback does, grants the cache already holds are used from
    /// it, new grants are kept while the cache has room, and only the rest
    /// are mapped for this request: a request may mix all three. A grant
    /// named twice in one request is mapped once. On failure nothing this
    /// call mapped for the request stays mapped (grants it added to the
    /// cache stay there: they are valid).
    pub fn map(
        &mut self,
        grefs: &[GrantRef],
        backend_writes: bool,
        frames: &mut Vec<u32>,
        temp: &mut Vec<u32>,
    ) -> Result<(), GrantError> {
        frames.clear();
        if self.persistent && grefs.iter().all(|g| self.cache.contains_key(g)) {
            frames.extend(grefs.iter().map(|g| self.cache[g].frame));
            return Ok(());
        }
        // The distinct grants to map, in order of first use; `keep` says
        // which go into the cache.
        let mut room = if self.persistent {
            self.max_persistent.saturating_sub(self.cache.len())
        } else {
            0
        };
        let fresh = &mut self.fresh;
        fresh.clear();
        let mut items: Vec<GrantMapItem> = Vec::new();
        let mut keep: Vec<bool> = Vec::new();
        for &gref in grefs {
            if (self.persistent && self.cache.contains_key(&gref)) || fresh.contains_key(&gref) {
                continue;
            }
            fresh.insert(gref, 0);
            let kept = room > 0;
            room -= usize::from(kept);
            // Persistent grants are mapped writable once and reused either way.
            items.push(GrantMapItem {
                gref,
                readonly: !kept && !backend_writes,
            });
            keep.push(kept);
        }
        self.map_calls += 1;
        let res = self.host.map_grants(self.domid, &items)?;
        let first_temp = temp.len();
        let mut bad = None;
        for ((r, it), &kept) in res.iter().zip(&items).zip(&keep) {
            if r.status != GntStatus::Okay {
                bad.get_or_insert(GrantError::Refused {
                    domid: self.domid,
                    gref: it.gref,
                    status: r.status,
                    reason: r.reason,
                });
                continue;
            }
            if kept {
                self.cache.insert(
                    it.gref,
                    Held {
                        handle: r.handle,
                        frame: r.frame,
                    },
                );
            } else {
                temp.push(r.handle);
            }
            fresh.insert(it.gref, r.frame);
        }
        if let Some(e) = bad {
            let mapped: Vec<u32> = temp.drain(first_temp..).collect();
            self.release(&mapped);
            return Err(e);
        }
        let (cache, fresh) = (&self.cache, &self.fresh);
        frames.extend(
            grefs
                .iter()
                .map(|g| cache.get(g).map_or_else(|| fresh[g], |h| h.frame)),
        );
        Ok(())
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
