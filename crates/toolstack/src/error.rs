//! Errors as XenAPI reports them: a code (`UUID_INVALID`) and a list of
//! parameters, documented in xen-api's `ocaml/idl/datamodel_errors.ml`. The
//! code, the parameter names and the one-line text below are XenAPI's, so
//! that `pvio` prints a failure the way `xe` does:
//!
//! ```text
//! The uuid you supplied was invalid.
//! type: VM
//! uuid: 1234
//! ```

use serde::{Deserialize, Serialize};

/// The XenAPI error codes the toolstack raises, plus two of pvio's own,
/// `MISSING_PARAMETER` and `UNKNOWN_PARAMETER`: JSON-RPC calls name their
/// parameters, so a missing or misspelt one is named rather than counted
/// as in XML-RPC's `MESSAGE_PARAMETER_COUNT_MISMATCH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    UuidInvalid,
    VmBadPowerState,
    OtherOperationInProgress,
    VdiInUse,
    VdiReadonly,
    DeviceAlreadyExists,
    DeviceAlreadyAttached,
    DeviceAlreadyDetached,
    InvalidDevice,
    SrNotEmpty,
    SrUnknownDriver,
    SrBackendFailure,
    InvalidValue,
    ValueNotSupported,
    FieldTypeError,
    MacInvalid,
    OperationNotAllowed,
    VbdNotUnpluggable,
    MissingParameter,
    UnknownParameter,
    MessageMethodUnknown,
    InternalError,
}

impl Code {
    /// Every code, for lookups by name.
    pub const ALL: [Code; 22] = [
        Code::UuidInvalid,
        Code::VmBadPowerState,
        Code::OtherOperationInProgress,
        Code::VdiInUse,
        Code::VdiReadonly,
        Code::DeviceAlreadyExists,
        Code::DeviceAlreadyAttached,
        Code::DeviceAlreadyDetached,
        Code::InvalidDevice,
        Code::SrNotEmpty,
        Code::SrUnknownDriver,
        Code::SrBackendFailure,
        Code::InvalidValue,
        Code::ValueNotSupported,
        Code::FieldTypeError,
        Code::MacInvalid,
        Code::OperationNotAllowed,
        Code::VbdNotUnpluggable,
        Code::MissingParameter,
        Code::UnknownParameter,
        Code::MessageMethodUnknown,
        Code::InternalError,
    ];

    /// The code as it travels on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Code::UuidInvalid => "UUID_INVALID",
            Code::VmBadPowerState => "VM_BAD_POWER_STATE",
            Code::OtherOperationInProgress => "OTHER_OPERATION_IN_PROGRESS",
            Code::VdiInUse => "VDI_IN_USE",
            Code::VdiReadonly => "VDI_READONLY",
            Code::DeviceAlreadyExists => "DEVICE_ALREADY_EXISTS",
            Code::DeviceAlreadyAttached => "DEVICE_ALREADY_ATTACHED",
            Code::DeviceAlreadyDetached => "DEVICE_ALREADY_DETACHED",
            Code::InvalidDevice => "INVALID_DEVICE",
            Code::SrNotEmpty => "SR_NOT_EMPTY",
            Code::SrUnknownDriver => "SR_UNKNOWN_DRIVER",
            Code::SrBackendFailure => "SR_BACKEND_FAILURE",
            Code::InvalidValue => "INVALID_VALUE",
            Code::ValueNotSupported => "VALUE_NOT_SUPPORTED",
            Code::FieldTypeError => "FIELD_TYPE_ERROR",
            Code::MacInvalid => "MAC_INVALID",
            Code::OperationNotAllowed => "OPERATION_NOT_ALLOWED",
            Code::VbdNotUnpluggable => "VBD_NOT_UNPLUGGABLE",
            Code::MissingParameter => "MISSING_PARAMETER",
            Code::UnknownParameter => "UNKNOWN_PARAMETER",
            Code::MessageMethodUnknown => "MESSAGE_METHOD_UNKNOWN",
            Code::InternalError => "INTERNAL_ERROR",
        }
    }

    /// The names of the code's parameters, in order.
    pub fn param_names(self) -> &'static [&'static str] {
        match self {
            Code::UuidInvalid => &["type", "uuid"],
            Code::VmBadPowerState => &["vm", "expected", "actual"],
            Code::OtherOperationInProgress => {
                &["class", "object", "operation_type", "operation_ref"]
            }
            Code::VdiInUse => &["vdi", "operation"],
            Code::VdiReadonly => &["vdi"],
            Code::DeviceAlreadyExists
            | Code::DeviceAlreadyAttached
            | Code::DeviceAlreadyDetached
            | Code::InvalidDevice => &["device"],
            Code::SrNotEmpty => &[],
            Code::SrUnknownDriver => &["driver"],
            Code::SrBackendFailure => &["status", "stdout", "stderr"],
            Code::InvalidValue => &["field", "value"],
            Code::ValueNotSupported => &["field", "value", "reason"],
            Code::FieldTypeError => &["field"],
            Code::MacInvalid => &["MAC"],
            Code::OperationNotAllowed => &["reason"],
            Code::VbdNotUnpluggable => &["vbd"],
            Code::MissingParameter => &["parameter"],
            Code::UnknownParameter => &["method", "parameter"],
            Code::MessageMethodUnknown => &["method"],
            Code::InternalError => &["message"],
        }
    }

    /// XenAPI's description of the error.
    pub fn doc(self) -> &'static str {
        match self {
            Code::UuidInvalid => "The uuid you supplied was invalid.",
            Code::VmBadPowerState => {
                "You attempted an operation on a VM that was not in an appropriate power state \
                 at the time; for example, you attempted to start a VM that was already running. \
                 The parameters returned are the VM's handle, and the expected and actual VM \
                 state at the time of the call."
            }
            Code::OtherOperationInProgress => {
                "Another operation involving the object is currently in progress"
            }
            Code::VdiInUse => {
                "This operation cannot be performed because this VDI is in use by some other \
                 operation"
            }
            Code::VdiReadonly => "The operation required write access but this VDI is read-only",
            Code::DeviceAlreadyExists => {
                "A device with the name given already exists on the selected VM"
            }
            Code::DeviceAlreadyAttached => "The device is already attached to a VM",
            Code::DeviceAlreadyDetached => "The device is not currently attached",
            Code::InvalidDevice => "The device name is invalid",
            Code::SrNotEmpty => "The SR operation cannot be performed because the SR is not empty.",
            Code::SrUnknownDriver => {
                "The SR could not be connected because the driver was not recognised."
            }
            Code::SrBackendFailure => "There was an SR backend failure.",
            Code::InvalidValue => "The value given is invalid",
            Code::ValueNotSupported => {
                "You attempted to set a value that is not supported by this implementation. The \
                 fully-qualified field name and the value that you tried to set are returned. \
                 Also returned is a developer-only diagnostic reason."
            }
            Code::FieldTypeError => "The value specified is of the wrong type",
            Code::MacInvalid => "The MAC address specified is not valid.",
            Code::OperationNotAllowed => "You attempted an operation that was not allowed.",
            Code::VbdNotUnpluggable => {
                "Drive could not be hot-unplugged because it is not marked as unpluggable"
            }
            Code::MissingParameter => "A required parameter of the call is missing.",
            Code::UnknownParameter => "The call has a parameter that the method does not take.",
            Code::MessageMethodUnknown => {
                "You tried to call a method that does not exist. The method name that you used \
                 is echoed."
            }
            Code::InternalError => {
                "The server failed to handle your request, due to an internal error. The given \
                 message may give details useful for debugging the problem."
            }
        }
    }

    /// The code named `name`, if the toolstack knows it.
    pub fn from_name(name: &str) -> Option<Code> {
        Code::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// A XenAPI error as it travels in a JSON-RPC error's `data`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub struct ApiError {
    pub code: String,
    pub params: Vec<String>,
}

impl std::fmt::Display for ApiError {
    /// The way `xe` prints a server error: the description, then one
    /// `name: value` line per parameter; a code it does not know as
    /// `Error code:` and `Error parameters:` lines.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(code) = Code::from_name(&self.code) else {
            write!(
                f,
                "Error code: {}\nError parameters: {}",
                self.code,
                self.params.join(", ")
            )?;
            return Ok(());
        };
        f.write_str(code.doc())?;
        let names = code.param_names();
        for i in 0..names.len().max(self.params.len()) {
            let name = names.get(i).copied().unwrap_or("<extra>");
            let value = self.params.get(i).map_or("<unknown>", String::as_str);
            write!(f, "\n{name}: {value}")?;
        }
        Ok(())
    }
}

impl ApiError {
    pub fn new(code: Code, params: Vec<String>) -> Self {
        ApiError {
            code: code.name().to_string(),
            params,
        }
    }

    /// Whether this is the error `code`.
    pub fn is(&self, code: Code) -> bool {
        self.code == code.name()
    }

    pub fn uuid_invalid(class: &str, uuid: &str) -> Self {
        Self::new(Code::UuidInvalid, vec![class.into(), uuid.into()])
    }

    pub fn vm_bad_power_state(vm: &str, expected: &str, actual: &str) -> Self {
        Self::new(
            Code::VmBadPowerState,
            vec![vm.into(), expected.into(), actual.into()],
        )
    }

    pub fn other_operation_in_progress(class: &str, object: &str, op: &str, op_ref: &str) -> Self {
        Self::new(
            Code::OtherOperationInProgress,
            vec![class.into(), object.into(), op.into(), op_ref.into()],
        )
    }

    pub fn vdi_in_use(vdi: &str, operation: &str) -> Self {
        Self::new(Code::VdiInUse, vec![vdi.into(), operation.into()])
    }

    pub fn device_already_exists(device: &str) -> Self {
        Self::new(Code::DeviceAlreadyExists, vec![device.into()])
    }

    pub fn device_already_attached(device: &str) -> Self {
        Self::new(Code::DeviceAlreadyAttached, vec![device.into()])
    }

    pub fn device_already_detached(device: &str) -> Self {
        Self::new(Code::DeviceAlreadyDetached, vec![device.into()])
    }

    pub fn invalid_device(device: &str) -> Self {
        Self::new(Code::InvalidDevice, vec![device.into()])
    }

    pub fn sr_not_empty() -> Self {
        Self::new(Code::SrNotEmpty, Vec::new())
    }

    pub fn sr_unknown_driver(driver: &str) -> Self {
        Self::new(Code::SrUnknownDriver, vec![driver.into()])
    }

    pub fn invalid_value(field: &str, value: &str) -> Self {
        Self::new(Code::InvalidValue, vec![field.into(), value.into()])
    }

    pub fn value_not_supported(field: &str, value: &str, reason: &str) -> Self {
        Self::new(
            Code::ValueNotSupported,
            vec![field.into(), value.into(), reason.into()],
        )
    }

    pub fn field_type_error(field: &str) -> Self {
        Self::new(Code::FieldTypeError, vec![field.into()])
    }

    pub fn mac_invalid(mac: &str) -> Self {
        Self::new(Code::MacInvalid, vec![mac.into()])
    }

    pub fn operation_not_allowed(reason: &str) -> Self {
        Self::new(Code::OperationNotAllowed, vec![reason.into()])
    }

    pub fn missing_parameter(name: &str) -> Self {
        Self::new(Code::MissingParameter, vec![name.into()])
    }

    pub fn unknown_parameter(method: &str, name: &str) -> Self {
        Self::new(Code::UnknownParameter, vec![method.into(), name.into()])
    }

    pub fn vbd_not_unpluggable(vbd: &str) -> Self {
        Self::new(Code::VbdNotUnpluggable, vec![vbd.into()])
    }

    pub fn method_unknown(method: &str) -> Self {
        Self::new(Code::MessageMethodUnknown, vec![method.into()])
    }

    /// A storage operation failed in the OS: `status` is the errno's name
    /// (`ENOSPC`), `detail` says what was being done and why it failed.
    pub fn sr_backend_failure(status: &str, detail: &str) -> Self {
        Self::new(
            Code::SrBackendFailure,
            vec![status.into(), String::new(), detail.into()],
        )
    }

    pub fn internal(message: impl std::fmt::Display) -> Self {
        Self::new(Code::InternalError, vec![message.to_string()])
    }
}

impl From<rusqlite::Error> for ApiError {
    fn from(e: rusqlite::Error) -> Self {
        ApiError::internal(format!("database: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_print_like_xe() {
        let e = ApiError::uuid_invalid("VM", "nope");
        assert_eq!(
            e.to_string(),
            "The uuid you supplied was invalid.\ntype: VM\nuuid: nope"
        );
        let e = ApiError {
            code: "SR_NOT_EMPTY".into(),
            params: vec!["surprise".into()],
        };
        assert_eq!(
            e.to_string(),
            "The SR operation cannot be performed because the SR is not empty.\n<extra>: surprise"
        );
        let e = ApiError::new(Code::VdiInUse, vec!["v".into()]);
        assert!(
            e.to_string().ends_with("vdi: v\noperation: <unknown>"),
            "{e}"
        );
        let e = ApiError {
            code: "SOMETHING_NEW".into(),
            params: vec!["a".into(), "b".into()],
        };
        assert_eq!(
            e.to_string(),
            "Error code: SOMETHING_NEW\nError parameters: a, b"
        );
    }

    #[test]
    fn codes_round_trip_by_name() {
        for c in Code::ALL {
            assert_eq!(Code::from_name(c.name()), Some(c));
            assert!(!c.doc().is_empty());
        }
    }
}
