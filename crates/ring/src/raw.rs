//! Protocol-free access to a ring, for tests, tools and playing a hostile
//! peer: read and write any index or slot, in any order, with no checks
//! beyond staying inside the region.

use core::fmt;
use core::sync::atomic::Ordering::SeqCst;

use pvio_abi::ring::{RingIdx, RingProtocol};

use crate::error::RingError;
use crate::protocol::{SharedIndex, SharedIndices};
use crate::shm::{Mapping, RawAccessError, RingMemory, ShmIndices};

/// A ring region seen without a protocol. Every index access is a
/// sequentially consistent atomic; every other byte is accessed volatile.
pub struct RawRing<P: RingProtocol, M: RingMemory> {
    map: Mapping<P, M>,
}

impl<P: RingProtocol, M: RingMemory> RawRing<P, M> {
    /// Checks the region as the endpoints do.
    pub fn new(mem: M) -> Result<Self, RingError> {
        Ok(Self {
            map: Mapping::new(mem)?,
        })
    }

    /// Number of slots.
    pub fn size(&self) -> u32 {
        self.map.size()
    }

    /// Reads a shared index.
    pub fn load(&self, index: SharedIndex) -> RingIdx {
        self.map.indices().load(index, SeqCst)
    }

    /// Writes a shared index.
    pub fn store(&self, index: SharedIndex, value: RingIdx) {
        self.map.indices().store(index, value, SeqCst)
    }

    /// The indices, for driving a [`crate::protocol`] core by hand.
    pub fn indices(&self) -> ShmIndices<'_> {
        self.map.indices()
    }

    /// Writes a request into the slot `idx` lands in.
    pub fn write_request(&self, idx: RingIdx, req: &P::Request) {
        self.map.write_request(idx, req)
    }

    /// Writes a response into the slot `idx` lands in.
    pub fn write_response(&self, idx: RingIdx, rsp: &P::Response) {
        self.map.write_response(idx, rsp)
    }

    /// Reads the request in the slot `idx` lands in.
    pub fn read_request(&self, idx: RingIdx) -> P::Request {
        self.map.read_request(idx)
    }

    /// Reads the response in the slot `idx` lands in.
    pub fn read_response(&self, idx: RingIdx) -> P::Response {
        self.map.read_response(idx)
    }

    /// Writes bytes at `offset` (at least 16: the indices are atomics, use
    /// [`RawRing::store`]).
    pub fn write_bytes(&self, offset: usize, bytes: &[u8]) -> Result<(), RawAccessError> {
        self.map.write_bytes(offset, bytes)
    }

    /// Reads bytes at `offset` (at least 16).
    pub fn read_bytes(&self, offset: usize, buf: &mut [u8]) -> Result<(), RawAccessError> {
        self.map.read_bytes(offset, buf)
    }

    /// The ring's memory.
    pub fn memory(&self) -> &M {
        self.map.memory()
    }
}

impl<P: RingProtocol, M: RingMemory> fmt::Debug for RawRing<P, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawRing")
            .field("protocol", &P::NAME)
            .field("size", &self.size())
            .field("shared", &self.map.indices())
            .finish()
    }
}
