//! The files an engine may do I/O on, each kept open while requests on it
//! are in flight (so a request can never hit a closed, reused fd).

use std::fs::File;
use std::sync::Arc;

use super::{EngineError, FileId};

#[derive(Debug, Default)]
pub(crate) struct FileTable {
    slots: Vec<Option<Entry>>,
}

#[derive(Debug)]
struct Entry {
    file: Arc<File>,
    in_flight: usize,
}

impl FileTable {
    pub(crate) fn add(&mut self, file: Arc<File>) -> FileId {
        let entry = Some(Entry { file, in_flight: 0 });
        if let Some(i) = self.slots.iter().position(Option::is_none) {
            self.slots[i] = entry;
            return FileId(i as u32);
        }
        self.slots.push(entry);
        FileId((self.slots.len() - 1) as u32)
    }

    pub(crate) fn remove(&mut self, id: FileId) -> Result<(), EngineError> {
        let slot = self
            .slots
            .get_mut(id.0 as usize)
            .ok_or(EngineError::UnknownFile(id.0))?;
        match slot {
            None => Err(EngineError::UnknownFile(id.0)),
            Some(e) if e.in_flight > 0 => Err(EngineError::FileBusy {
                id: id.0,
                in_flight: e.in_flight,
            }),
            Some(_) => {
                *slot = None;
                Ok(())
            }
        }
    }

    /// The file, for a request about to be queued.
    pub(crate) fn get(&self, id: FileId) -> Result<&Arc<File>, EngineError> {
        self.slots
            .get(id.0 as usize)
            .and_then(Option::as_ref)
            .map(|e| &e.file)
            .ok_or(EngineError::UnknownFile(id.0))
    }

    /// Counts a queued request on `id` (which [`FileTable::get`] found).
    pub(crate) fn begin(&mut self, id: FileId) {
        if let Some(Some(e)) = self.slots.get_mut(id.0 as usize) {
            e.in_flight += 1;
        }
    }

    /// Counts a completed request on `id`.
    pub(crate) fn end(&mut self, id: FileId) {
        if let Some(Some(e)) = self.slots.get_mut(id.0 as usize) {
            e.in_flight = e.in_flight.saturating_sub(1);
        }
    }
}
