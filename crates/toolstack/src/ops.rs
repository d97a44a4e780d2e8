//! Lifecycle operations in flight, one per VM at a time (xapi's
//! `current_operations`): a second start, shutdown, destroy or disk plug
//! on a VM that is busy is refused with `OTHER_OPERATION_IN_PROGRESS`.
//!
//! A guest can die while an operation on its VM is in flight (a start that
//! just succeeded, a shutdown racing the guest's own exit). Its `Halted`
//! event is then held here and applied when the operation ends, after the
//! operation's own database writes, so the later truth wins.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::ApiError;

#[derive(Debug)]
struct InFlight {
    op: &'static str,
    op_ref: String,
    pending_halt: Option<String>,
}

/// The table of operations in flight.
#[derive(Debug, Clone, Default)]
pub struct Ops {
    inner: Arc<Mutex<HashMap<String, InFlight>>>,
}

/// An operation in flight on one VM; ends when finished or dropped.
#[derive(Debug)]
pub struct OpToken {
    ops: Ops,
    vm: String,
    op_ref: String,
    done: bool,
}

impl Ops {
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, InFlight>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts operation `op` on `vm`, or says which one is in the way.
    pub fn begin(&self, vm: &str, op: &'static str) -> Result<OpToken, ApiError> {
        let mut t = self.table();
        if let Some(f) = t.get(vm) {
            return Err(ApiError::other_operation_in_progress(
                "VM", vm, f.op, &f.op_ref,
            ));
        }
        let op_ref = format!("OpaqueRef:{}", crate::model::new_uuid());
        t.insert(
            vm.to_string(),
            InFlight {
                op,
                op_ref: op_ref.clone(),
                pending_halt: None,
            },
        );
        Ok(OpToken {
            ops: self.clone(),
            vm: vm.to_string(),
            op_ref,
            done: false,
        })
    }

    /// The operation in flight on `vm`, if any.
    pub fn current(&self, vm: &str) -> Option<&'static str> {
        self.table().get(vm).map(|f| f.op)
    }

    /// A guest died: if an operation is in flight on its VM, hold the event
    /// for the operation's end and return true.
    pub fn defer_halt(&self, vm: &str, reason: &str) -> bool {
        match self.table().get_mut(vm) {
            Some(f) => {
                f.pending_halt = Some(reason.to_string());
                true
            }
            None => false,
        }
    }

    fn end(&self, vm: &str, op_ref: &str) -> Option<String> {
        let mut t = self.table();
        match t.get(vm) {
            Some(f) if f.op_ref == op_ref => t.remove(vm).and_then(|f| f.pending_halt),
            _ => None,
        }
    }
}

impl OpToken {
    /// Ends the operation; returns the reason of a guest death that
    /// happened meanwhile, which the caller must now record.
    pub fn finish(mut self) -> Option<String> {
        self.done = true;
        self.ops.end(&self.vm, &self.op_ref)
    }
}

impl Drop for OpToken {
    fn drop(&mut self) {
        if !self.done {
            if let Some(reason) = self.ops.end(&self.vm, &self.op_ref) {
                tracing::warn!(vm = %self.vm, %reason, "guest death lost with an abandoned operation");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;

    #[test]
    fn one_operation_per_vm() {
        let ops = Ops::default();
        let t = ops.begin("a", "start").unwrap();
        let e = ops.begin("a", "clean_shutdown").unwrap_err();
        assert!(e.is(Code::OtherOperationInProgress));
        assert_eq!(e.params[..3], ["VM", "a", "start"]);
        assert!(e.params[3].starts_with("OpaqueRef:"));
        let other = ops.begin("b", "start").unwrap();
        assert_eq!(ops.current("a"), Some("start"));
        assert_eq!(t.finish(), None);
        assert_eq!(ops.current("a"), None);
        drop(other);
        assert_eq!(ops.current("b"), None);
        ops.begin("a", "destroy").unwrap().finish();
    }

    #[test]
    fn a_death_during_an_operation_is_held_until_its_end() {
        let ops = Ops::default();
        assert!(
            !ops.defer_halt("a", "crashed"),
            "nothing in flight to hold it"
        );
        let t = ops.begin("a", "start").unwrap();
        assert!(ops.defer_halt("a", "crashed"));
        assert_eq!(t.finish().as_deref(), Some("crashed"));
        assert!(!ops.defer_halt("a", "again"));
    }
}
