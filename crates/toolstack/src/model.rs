//! The toolstack's objects, typed: what the database stores and what the
//! RPC methods return (`VM.get_record` gives a [`VmRecord`], serialised
//! with XenAPI's field names: `name_label`, `VCPUs_max`, `power_state`
//! ...). Where XenAPI has a reference to another object, pvio puts that
//! object's uuid (`VBD.VM` is the VM's uuid): uuids are the only handles.
//! Sizes are bytes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The object classes, with XenAPI's names (`VM`, `SR`, ...): the `type`
/// parameter of `UUID_INVALID` and the prefix of RPC method names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    Host,
    Sr,
    Vdi,
    Vm,
    Vbd,
    Vif,
}

impl Class {
    /// XenAPI's class name (`host`, `SR`, `VDI`, `VM`, `VBD`, `VIF`).
    pub fn api_name(self) -> &'static str {
        match self {
            Class::Host => "host",
            Class::Sr => "SR",
            Class::Vdi => "VDI",
            Class::Vm => "VM",
            Class::Vbd => "VBD",
            Class::Vif => "VIF",
        }
    }

    /// The CLI's prefix (`vm` in `vm-list`).
    pub fn cli_name(self) -> &'static str {
        match self {
            Class::Host => "host",
            Class::Sr => "sr",
            Class::Vdi => "vdi",
            Class::Vm => "vm",
            Class::Vbd => "vbd",
            Class::Vif => "vif",
        }
    }

    /// The database table.
    pub fn table(self) -> &'static str {
        self.cli_name()
    }
}

/// A VM's power state (pvio has no paused or suspended VMs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PowerState {
    Halted,
    Running,
}

impl PowerState {
    /// Lower case, as `xe` prints it and the database stores it.
    pub fn as_str(self) -> &'static str {
        match self {
            PowerState::Halted => "halted",
            PowerState::Running => "running",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "halted" => Some(PowerState::Halted),
            "running" => Some(PowerState::Running),
            _ => None,
        }
    }
}

/// A VBD's access mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum VbdMode {
    RO,
    RW,
}

impl VbdMode {
    pub fn as_str(self) -> &'static str {
        match self {
            VbdMode::RO => "RO",
            VbdMode::RW => "RW",
        }
    }

    /// `RO` or `RW`, any case (as `xe vbd-create mode=` takes it).
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "ro" => Some(VbdMode::RO),
            "rw" => Some(VbdMode::RW),
            _ => None,
        }
    }
}

/// The host (one per toolstack database).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRecord {
    pub uuid: String,
    pub name_label: String,
    pub name_description: String,
    pub hostname: String,
    /// `cpu_count` and `cpu_model`.
    pub cpu_info: BTreeMap<String, String>,
    pub memory_total: u64,
    /// Measured when the record is read (MemAvailable).
    pub memory_free: u64,
    #[serde(rename = "API_version_major")]
    pub api_version_major: u32,
    #[serde(rename = "API_version_minor")]
    pub api_version_minor: u32,
    pub software_version: BTreeMap<String, String>,
    #[serde(rename = "resident_VMs")]
    pub resident_vms: Vec<String>,
}

/// A storage repository: a directory of raw VDI files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SrRecord {
    pub uuid: String,
    pub name_label: String,
    pub name_description: String,
    /// The uuid of the host the SR is attached to.
    pub host: String,
    #[serde(rename = "type")]
    pub sr_type: String,
    pub content_type: String,
    pub shared: bool,
    /// In XenAPI this belongs to the SR's PBD; pvio has one PBD per SR and
    /// shows it here: `location`, `attach-delay-ms`.
    pub device_config: BTreeMap<String, String>,
    #[serde(rename = "VDIs")]
    pub vdis: Vec<String>,
    /// Sum of the VDIs' virtual sizes.
    pub virtual_allocation: u64,
    /// Bytes the VDI files occupy.
    pub physical_utilisation: u64,
    /// Size of the filesystem holding the SR.
    pub physical_size: u64,
}

/// A virtual disk: a sparse raw file in its SR.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VdiRecord {
    pub uuid: String,
    pub name_label: String,
    pub name_description: String,
    #[serde(rename = "SR")]
    pub sr: String,
    #[serde(rename = "VBDs")]
    pub vbds: Vec<String>,
    pub virtual_size: u64,
    /// Bytes the file occupies on disk.
    pub physical_utilisation: u64,
    /// The image file.
    pub location: String,
    #[serde(rename = "type")]
    pub vdi_type: String,
    pub sharable: bool,
    pub read_only: bool,
}

/// A VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmRecord {
    pub uuid: String,
    pub name_label: String,
    pub name_description: String,
    pub power_state: PowerState,
    pub memory_static_max: u64,
    #[serde(rename = "VCPUs_max")]
    pub vcpus_max: u32,
    /// What its guest runs (`idle`, `job:SPEC`, `boot-read:MIB`, `nbd:SOCKET`).
    pub workload: String,
    /// -1 when halted.
    pub domid: i64,
    /// The host's uuid when running, else empty.
    pub resident_on: String,
    #[serde(rename = "VBDs")]
    pub vbds: Vec<String>,
    #[serde(rename = "VIFs")]
    pub vifs: Vec<String>,
    /// Lifecycle operations in flight (`start`, `clean_shutdown` ...).
    pub current_operations: Vec<String>,
    /// Plugged VBDs that failed (their tapdisk died too often): device
    /// name (`xvdb`) and why.
    #[serde(default)]
    pub failed_vbds: std::collections::BTreeMap<String, String>,
}

/// A virtual block device: a VDI plugged into a VM at a userdevice slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VbdRecord {
    pub uuid: String,
    #[serde(rename = "VM")]
    pub vm: String,
    #[serde(rename = "VDI")]
    pub vdi: String,
    pub userdevice: u32,
    /// Linux's name for the slot (`xvda` for userdevice 0).
    pub device: String,
    pub mode: VbdMode,
    #[serde(rename = "type")]
    pub vbd_type: String,
    pub bootable: bool,
    pub unpluggable: bool,
    pub currently_attached: bool,
    /// Times its tapdisk died and was restarted since the VBD was plugged.
    #[serde(default)]
    pub tapdisk_restarts: u32,
    /// Why the VBD failed while plugged (its tapdisk died too often);
    /// empty while it is fine.
    #[serde(default)]
    pub status_detail: String,
}

/// A virtual network interface (recorded only: nothing plugs VIFs yet).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VifRecord {
    pub uuid: String,
    #[serde(rename = "VM")]
    pub vm: String,
    pub device: u32,
    #[serde(rename = "MAC")]
    pub mac: String,
    #[serde(rename = "MAC_autogenerated")]
    pub mac_autogenerated: bool,
    #[serde(rename = "MTU")]
    pub mtu: u32,
    /// The network's name (pvio has no network objects yet).
    pub network: String,
    pub currently_attached: bool,
}

/// A new random uuid, as XenAPI makes them (version 4).
pub fn new_uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Whether `s` is a uuid in its canonical hyphenated form.
pub fn is_uuid(s: &str) -> bool {
    s.len() == 36 && uuid::Uuid::try_parse(s).is_ok()
}
