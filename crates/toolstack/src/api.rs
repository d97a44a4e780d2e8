//! The RPC methods: every object operation, checked in full before
//! anything is written, each write one database transaction, and VM
//! lifecycle calls handed to the lifecycle engine ([`pvio_xenops`]).
//!
//! Reads only touch the database (on a blocking thread, never behind a
//! lifecycle call); the one exception, `VM.get_guest_metrics`, asks the
//! engine with a deadline. The method list is in the crate docs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use pvio_xenops::{VbdSpec, VmEvent, VmSpec, Workload, Xenops, XenopsError};
use serde_json::{Map, Value};

use crate::db::{self, Db};
use crate::error::ApiError;
use crate::model::{new_uuid, Class, PowerState, VbdMode, VbdRecord, VmRecord};
use crate::ops::Ops;
use crate::sr::{self, FileSr, SR_TYPE_FILE};
use crate::vbd::{devid_of_userdevice, parse_userdevice, MAX_USERDEVICE};

/// Default memory of a new VM.
pub const DEFAULT_MEMORY: u64 = 256 << 20;
/// Most vCPUs a VM may have.
pub const MAX_VCPUS: u32 = 64;
/// Largest VM memory.
pub const MAX_MEMORY: u64 = 1 << 40;
/// Largest VDI the toolstack takes (what a file offset holds); the SR's
/// filesystem may take less (ext4: 16 TiB), which `VDI.create` reports.
pub const MAX_VIRTUAL_SIZE: u64 = i64::MAX as u64 / 512 * 512;
/// Default network of a VIF.
pub const DEFAULT_NETWORK: &str = "xenbr0";
/// Default MTU of a VIF.
pub const DEFAULT_MTU: u32 = 1500;
/// How long `VM.get_guest_metrics` waits for the engine.
pub const GUEST_METRICS_TIMEOUT: Duration = Duration::from_secs(5);

/// Every method, for documentation and `system.listMethods`.
pub const METHODS: &[&str] = &[
    "system.listMethods",
    "host.get_all_records",
    "host.get_record",
    "host.set",
    "SR.create",
    "SR.destroy",
    "SR.get_all_records",
    "SR.get_record",
    "SR.set",
    "VDI.create",
    "VDI.destroy",
    "VDI.get_all_records",
    "VDI.get_record",
    "VDI.set",
    "VM.create",
    "VM.destroy",
    "VM.start",
    "VM.shutdown",
    "VM.get_all_records",
    "VM.get_record",
    "VM.get_guest_metrics",
    "VM.set",
    "VBD.create",
    "VBD.destroy",
    "VBD.plug",
    "VBD.unplug",
    "VBD.get_all_records",
    "VBD.get_record",
    "VIF.create",
    "VIF.destroy",
    "VIF.get_all_records",
    "VIF.get_record",
];

/// The toolstack's state: the database, the engine and the operations in flight.
#[derive(Debug)]
pub struct Toolstack {
    db: Arc<Db>,
    xenops: Xenops,
    ops: Ops,
    /// Where SRs without a `device-config:location` go.
    sr_parent: PathBuf,
}

/// A call's named parameters, taken one by one; what is left at the end
/// is refused as unknown.
struct Params {
    method: String,
    map: Map<String, Value>,
}

impl Params {
    fn new(method: &str, params: Value) -> Result<Self, ApiError> {
        let map = match params {
            Value::Null => Map::new(),
            Value::Object(m) => m,
            _ => return Err(ApiError::field_type_error("params")),
        };
        Ok(Params {
            method: method.to_string(),
            map,
        })
    }

    fn take(&mut self, name: &str) -> Option<Value> {
        self.map.remove(name).filter(|v| !v.is_null())
    }

    fn opt_str(&mut self, name: &str) -> Result<Option<String>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ApiError::field_type_error(name)),
        }
    }

    fn str(&mut self, name: &str) -> Result<String, ApiError> {
        self.opt_str(name)?
            .ok_or_else(|| ApiError::missing_parameter(name))
    }

    /// A string, or a number given as one (userdevice, device).
    fn opt_str_or_int(&mut self, name: &str) -> Result<Option<String>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(_) => Err(ApiError::field_type_error(name)),
        }
    }

    fn opt_bool(&mut self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(_) => Err(ApiError::field_type_error(name)),
        }
    }

    fn opt_u64(&mut self, name: &str) -> Result<Option<u64>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_u64()
                .map(Some)
                .ok_or_else(|| ApiError::invalid_value(name, &n.to_string())),
            Some(_) => Err(ApiError::field_type_error(name)),
        }
    }

    fn opt_map(&mut self, name: &str) -> Result<BTreeMap<String, String>, ApiError> {
        match self.take(name) {
            None => Ok(BTreeMap::new()),
            Some(Value::Object(m)) => m
                .into_iter()
                .map(|(k, v)| match v {
                    Value::String(s) => Ok((k, s)),
                    _ => Err(ApiError::field_type_error(&format!("{name}:{k}"))),
                })
                .collect(),
            Some(_) => Err(ApiError::field_type_error(name)),
        }
    }

    /// Refuses parameters nobody took.
    fn done(self) -> Result<(), ApiError> {
        match self.map.keys().next() {
            Some(k) => Err(ApiError::unknown_parameter(&self.method, k)),
            None => Ok(()),
        }
    }
}

fn to_value<T: serde::Serialize>(v: T) -> Result<Value, ApiError> {
    serde_json::to_value(v).map_err(ApiError::internal)
}

fn xenops_error(vm: &str, e: XenopsError) -> ApiError {
    match e {
        XenopsError::NotRunning(_) => ApiError::vm_bad_power_state(vm, "running", "halted"),
        XenopsError::AlreadyRunning(_) => ApiError::vm_bad_power_state(vm, "halted", "running"),
        other => ApiError::internal(other),
    }
}

/// XenAPI rounds sizes up to whole sectors.
fn round_to_sector(n: u64) -> u64 {
    n.div_ceil(512).saturating_mul(512)
}

/// A MAC address `aa:bb:cc:dd:ee:ff`, lower-cased.
fn parse_mac(s: &str) -> Option<String> {
    let parts: Vec<&str> = s.split(':').collect();
    let ok = parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()));
    ok.then(|| s.to_ascii_lowercase())
}

/// A random locally administered unicast MAC (as xapi makes them).
pub fn random_mac() -> String {
    let b = *uuid::Uuid::new_v4().as_bytes();
    let first = (b[0] | 0x02) & !0x01;
    format!(
        "{first:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        b[1], b[2], b[3], b[4], b[5]
    )
}

/// A workload as `VM.create`/`VM.set` take it, checked as far as a later
/// `VM.start` needs it (a job's spec is parsed now, not in the guest).
fn parse_workload(s: &str) -> Result<Workload, ApiError> {
    let w = s
        .parse::<Workload>()
        .map_err(|reason| ApiError::value_not_supported("workload", s, &reason))?;
    if let Workload::Job(spec) = &w {
        pvio_guest::job::JobSpec::parse(spec).map_err(|e| {
            ApiError::value_not_supported("workload", s, &format!("the job spec is wrong: {e}"))
        })?;
    }
    Ok(w)
}

fn check_vcpus(v: u64) -> Result<u32, ApiError> {
    if (1..=u64::from(MAX_VCPUS)).contains(&v) {
        Ok(v as u32)
    } else {
        Err(ApiError::value_not_supported(
            "VCPUs_max",
            &v.to_string(),
            &format!("a VM has 1 to {MAX_VCPUS} vCPUs"),
        ))
    }
}

/// A VM's memory: at least 1 MiB, at most the host's memory (a VM that
/// could never start is refused when it is made).
fn check_memory(m: u64) -> Result<u64, ApiError> {
    let host = meminfo("MemTotal:").unwrap_or(MAX_MEMORY).min(MAX_MEMORY);
    if ((1 << 20)..=host).contains(&m) {
        Ok(m)
    } else {
        Err(ApiError::value_not_supported(
            "memory_static_max",
            &m.to_string(),
            &format!(
                "a VM's memory is 1 MiB to this host's {} ({host} bytes)",
                human_bytes(host)
            ),
        ))
    }
}

/// `bytes` in the largest binary unit that keeps one decimal: 23.4 GiB.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} bytes")
    } else if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Why a VBD is about to be attached (VDI_IN_USE's `operation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attach {
    /// `VM.start`: every VBD of the VM at once.
    Start,
    /// `VBD.plug`.
    Plug,
    /// `VBD.create` on a running VM (the VBD would be plugged next).
    Create,
}

impl Attach {
    fn as_str(self) -> &'static str {
        match self {
            Attach::Start => "start",
            Attach::Plug => "plug",
            Attach::Create => "create",
        }
    }
}

/// Whether attaching `vbd` would open its non-sharable VDI a second time
/// with one of the two writable: another attached VBD of the VDI in a
/// running VM (this VM's included), or, for a VM being started, another
/// VBD of the same VM, since a start attaches them all.
fn check_vdi_free(
    conn: &rusqlite::Connection,
    vbd: &VbdRecord,
    why: Attach,
) -> Result<(), ApiError> {
    let vdi = db::vdi(conn, &vbd.vdi)?;
    if vdi.sharable {
        return Ok(());
    }
    let writable = vbd.mode == VbdMode::RW && !vdi.read_only;
    let starting = why == Attach::Start;
    for (other, state) in db::vbds_of_vdi(conn, &vbd.vdi)? {
        if other.uuid == vbd.uuid {
            continue;
        }
        let other_writable = other.mode == VbdMode::RW && !vdi.read_only;
        if !(writable || other_writable) {
            continue;
        }
        let attached = other.currently_attached && state == PowerState::Running;
        if attached || (starting && other.vm == vbd.vm) {
            return Err(ApiError::vdi_in_use(&vbd.vdi, why.as_str()));
        }
    }
    Ok(())
}

/// What the engine needs to plug `vbd`.
fn vbd_spec(conn: &rusqlite::Connection, vbd: &VbdRecord) -> Result<VbdSpec, ApiError> {
    let vdi = db::vdi(conn, &vbd.vdi)?;
    let (_, delay_ms) = db::sr_storage(conn, &vdi.sr)?;
    Ok(VbdSpec {
        devid: devid_of_userdevice(vbd.userdevice),
        image: PathBuf::from(&vdi.location),
        writable: vbd.mode == VbdMode::RW && !vdi.read_only,
        attach_delay: Duration::from_millis(delay_ms),
        backend_keys: Vec::new(),
    })
}

/// Free memory of the host (MemAvailable), 0 if unknown.
fn memory_available() -> u64 {
    meminfo("MemAvailable:").unwrap_or(0)
}

/// A `/proc/meminfo` line's value in bytes.
pub fn meminfo(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line[key.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

impl Toolstack {
    pub fn new(db: Arc<Db>, xenops: Xenops, sr_parent: PathBuf) -> Arc<Self> {
        Arc::new(Toolstack {
            db,
            xenops,
            ops: Ops::default(),
            sr_parent,
        })
    }

    /// Runs a database read on a blocking thread.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.read(f))
            .await
            .map_err(ApiError::internal)?
    }

    /// Runs a database write on a blocking thread.
    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.write(f))
            .await
            .map_err(ApiError::internal)?
    }

    /// Runs one RPC method.
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, ApiError> {
        let mut p = Params::new(method, params)?;
        let result = match method {
            "system.listMethods" => to_value(METHODS),
            "host.get_all_records" => self.host_records(None).await.and_then(to_value),
            "host.get_record" => {
                let uuid = p.str("uuid")?;
                let mut v = self.host_records(Some(uuid)).await?;
                to_value(v.remove(0))
            }
            "host.set" => {
                let uuid = p.str("uuid")?;
                let label = p.opt_str("name_label")?;
                let desc = p.opt_str("name_description")?;
                p.done()?;
                return self
                    .write(move |tx| {
                        db::set_host_name(tx, &uuid, label.as_deref(), desc.as_deref())
                    })
                    .await
                    .map(|()| Value::Null);
            }
            "SR.create" => return self.sr_create(p).await,
            "SR.destroy" => {
                let uuid = p.str("uuid")?;
                p.done()?;
                return self.sr_destroy(uuid).await;
            }
            "SR.get_all_records" => self.sr_records(None).await.and_then(to_value),
            "SR.get_record" => {
                let uuid = p.str("uuid")?;
                let mut v = self.sr_records(Some(uuid)).await?;
                to_value(v.remove(0))
            }
            "SR.set" => {
                let uuid = p.str("uuid")?;
                let label = p.opt_str("name_label")?;
                let desc = p.opt_str("name_description")?;
                p.done()?;
                return self
                    .write(move |tx| db::set_sr_name(tx, &uuid, label.as_deref(), desc.as_deref()))
                    .await
                    .map(|()| Value::Null);
            }
            "VDI.create" => return self.vdi_create(p).await,
            "VDI.destroy" => {
                let uuid = p.str("uuid")?;
                p.done()?;
                return self.vdi_destroy(uuid).await;
            }
            "VDI.get_all_records" => self.vdi_records(None).await.and_then(to_value),
            "VDI.get_record" => {
                let uuid = p.str("uuid")?;
                let mut v = self.vdi_records(Some(uuid)).await?;
                to_value(v.remove(0))
            }
            "VDI.set" => {
                let uuid = p.str("uuid")?;
                let label = p.opt_str("name_label")?;
                let desc = p.opt_str("name_description")?;
                p.done()?;
                return self
                    .write(move |tx| db::set_vdi_name(tx, &uuid, label.as_deref(), desc.as_deref()))
                    .await
                    .map(|()| Value::Null);
            }
            "VM.create" => return self.vm_create(p).await,
            "VM.destroy" => {
                let uuid = p.str("uuid")?;
                p.done()?;
                return self.vm_destroy(uuid).await;
            }
            "VM.start" => {
                let uuid = p.str("uuid")?;
                p.done()?;
                return self.vm_start(uuid).await;
            }
            "VM.shutdown" => {
                let uuid = p.str("uuid")?;
                let force = p.opt_bool("force")?.unwrap_or(false);
                p.done()?;
                return self.vm_shutdown(uuid, force).await;
            }
            "VM.get_all_records" => self.vm_records(None).await.and_then(to_value),
            "VM.get_record" => {
                let uuid = p.str("uuid")?;
                let mut v = self.vm_records(Some(uuid)).await?;
                to_value(v.remove(0))
            }
            "VM.get_guest_metrics" => {
                let uuid = p.str("uuid")?;
                p.done()?;
                return self.vm_guest_metrics(uuid).await.and_then(to_value);
            }
            "VM.set" => return self.vm_set(p).await,
            "VBD.create" => return self.vbd_create(p).await,
            "VBD.destroy" => {
                let uuid = p.str("uuid")?;
                p.done()?;
                return self.vbd_destroy(uuid).await;
            }
            "VBD.plug" => {
                let uuid = p.str("uuid")?;
                p.done()?;
                return self.vbd_plug(uuid).await;
            }
            "VBD.unplug" => {
                let uuid = p.str("uuid")?;
                let force = p.opt_bool("force")?.unwrap_or(false);
                p.done()?;
                return self.vbd_unplug(uuid, force).await;
            }
            "VBD.get_all_records" => self.read(|c| db::vbds(c, None)).await.and_then(to_value),
            "VBD.get_record" => {
                let uuid = p.str("uuid")?;
                self.read(move |c| db::vbd(c, &uuid))
                    .await
                    .and_then(to_value)
            }
            "VIF.create" => return self.vif_create(p).await,
            "VIF.destroy" => {
                let uuid = p.str("uuid")?;
                p.done()?;
                return self
                    .write(move |tx| {
                        db::require(tx, Class::Vif, &uuid)?;
                        db::delete_vif(tx, &uuid)
                    })
                    .await
                    .map(|()| Value::Null);
            }
            "VIF.get_all_records" => self.read(|c| db::vifs(c, None)).await.and_then(to_value),
            "VIF.get_record" => {
                let uuid = p.str("uuid")?;
                self.read(move |c| Ok(db::vifs(c, Some(&uuid))?.remove(0)))
                    .await
                    .and_then(to_value)
            }
            _ => return Err(ApiError::method_unknown(method)),
        };
        // Read methods check for unknown parameters after the fact: they
        // change nothing.
        p.done()?;
        result
    }

    // ------------------------------------------------------------ reads

    async fn host_records(
        &self,
        uuid: Option<String>,
    ) -> Result<Vec<crate::model::HostRecord>, ApiError> {
        let mut h = self.read(|c| db::host(c)).await?;
        if let Some(u) = uuid {
            if u != h.uuid {
                return Err(ApiError::uuid_invalid("host", &u));
            }
        }
        h.memory_free = memory_available();
        h.software_version = BTreeMap::from([
            ("product_brand".to_string(), "pvio".to_string()),
            (
                "product_version".to_string(),
                env!("CARGO_PKG_VERSION").to_string(),
            ),
        ]);
        Ok(vec![h])
    }

    async fn sr_records(
        &self,
        uuid: Option<String>,
    ) -> Result<Vec<crate::model::SrRecord>, ApiError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            let (mut srs, vdis) = db.read(|c| {
                let srs = db::srs(c, uuid.as_deref())?;
                let vdis = db::vdis(c, None)?;
                Ok((srs, vdis))
            })?;
            for s in &mut srs {
                let loc = s
                    .device_config
                    .get(sr::KEY_LOCATION)
                    .cloned()
                    .unwrap_or_default();
                s.physical_size = sr::filesystem_size(Path::new(&loc));
                s.physical_utilisation = vdis
                    .iter()
                    .filter(|v| v.sr == s.uuid)
                    .map(|v| sr::allocated_bytes(Path::new(&v.location)))
                    .sum();
            }
            Ok(srs)
        })
        .await
        .map_err(ApiError::internal)?
    }

    async fn vdi_records(
        &self,
        uuid: Option<String>,
    ) -> Result<Vec<crate::model::VdiRecord>, ApiError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            let mut vdis = db.read(|c| db::vdis(c, uuid.as_deref()))?;
            for v in &mut vdis {
                v.physical_utilisation = sr::allocated_bytes(Path::new(&v.location));
            }
            Ok(vdis)
        })
        .await
        .map_err(ApiError::internal)?
    }

    async fn vm_records(&self, uuid: Option<String>) -> Result<Vec<VmRecord>, ApiError> {
        let mut vms = self.read(move |c| db::vms(c, uuid.as_deref())).await?;
        for vm in &mut vms {
            if let Some(op) = self.ops.current(&vm.uuid) {
                vm.current_operations = vec![op.to_string()];
            }
        }
        Ok(vms)
    }

    async fn vm_guest_metrics(&self, uuid: String) -> Result<BTreeMap<String, String>, ApiError> {
        let u = uuid.clone();
        let state = self.read(move |c| db::power_state(c, &u)).await?;
        if state != PowerState::Running {
            return Ok(BTreeMap::new());
        }
        match tokio::time::timeout(GUEST_METRICS_TIMEOUT, self.xenops.guest_metrics(&uuid)).await
        {
            Ok(r) => r.map_err(|e| xenops_error(&uuid, e)),
            Err(_) => Err(ApiError::internal(format!(
                "the lifecycle engine did not report VM {uuid}'s guest metrics within {GUEST_METRICS_TIMEOUT:?}"
            ))),
        }
    }

    // ------------------------------------------------------------ SR, VDI

    async fn sr_create(&self, mut p: Params) -> Result<Value, ApiError> {
        let name_label = p.str("name_label")?;
        let name_description = p.opt_str("name_description")?.unwrap_or_default();
        let sr_type = p.str("type")?;
        let content_type = p.opt_str("content_type")?.unwrap_or_default();
        let device_config = p.opt_map("device_config")?;
        p.done()?;
        if sr_type != SR_TYPE_FILE {
            return Err(ApiError::sr_unknown_driver(&sr_type));
        }
        let uuid = new_uuid();
        let file_sr = FileSr::from_device_config(&device_config, &self.sr_parent, &uuid)?;
        let u = uuid.clone();
        self.write(move |tx| {
            // The host row must exist (it does once the daemon runs).
            db::host_uuid(tx)?;
            let created = sr::prepare_location(&file_sr)?;
            let r = db::insert_sr(
                tx,
                &db::NewSr {
                    uuid: &u,
                    name_label: &name_label,
                    name_description: &name_description,
                    sr_type: &sr_type,
                    content_type: &content_type,
                    location: &file_sr.location,
                    attach_delay_ms: file_sr.attach_delay_ms,
                },
            );
            if r.is_err() && created {
                let _ = std::fs::remove_dir(&file_sr.location);
            }
            r
        })
        .await?;
        tracing::info!(sr = %uuid, "SR created");
        Ok(Value::String(uuid))
    }

    async fn sr_destroy(&self, uuid: String) -> Result<Value, ApiError> {
        self.write(move |tx| {
            let s = db::sr(tx, &uuid)?;
            if !s.vdis.is_empty() {
                return Err(ApiError::sr_not_empty());
            }
            db::delete_sr(tx, &uuid)?;
            // The directory goes if it is empty; a user's own stays.
            if let Some(loc) = s.device_config.get(sr::KEY_LOCATION) {
                let _ = std::fs::remove_dir(loc);
            }
            Ok(Value::Null)
        })
        .await
    }

    async fn vdi_create(&self, mut p: Params) -> Result<Value, ApiError> {
        let sr_uuid = p.str("SR")?;
        let name_label = p.str("name_label")?;
        let name_description = p.opt_str("name_description")?.unwrap_or_default();
        let size = p
            .opt_u64("virtual_size")?
            .ok_or_else(|| ApiError::missing_parameter("virtual_size"))?;
        let sharable = p.opt_bool("sharable")?.unwrap_or(false);
        let read_only = p.opt_bool("read_only")?.unwrap_or(false);
        p.done()?;
        if size == 0 || size > MAX_VIRTUAL_SIZE {
            return Err(ApiError::value_not_supported(
                "virtual_size",
                &size.to_string(),
                &format!("a VDI is 1 byte to {}", human_bytes(MAX_VIRTUAL_SIZE)),
            ));
        }
        let size = round_to_sector(size);
        let uuid = new_uuid();
        let u = uuid.clone();
        self.write(move |tx| {
            let (location, _) = db::sr_storage(tx, &sr_uuid)?;
            db::insert_vdi(
                tx,
                &db::NewVdi {
                    uuid: &u,
                    sr: &sr_uuid,
                    name_label: &name_label,
                    name_description: &name_description,
                    virtual_size: size,
                    sharable,
                    read_only,
                },
            )?;
            // The file last: if it cannot be made, the row is rolled back.
            let path = sr::vdi_path(&location, &u);
            sr::create_image(&path, size).map_err(|e| sr::image_error(&location, &path, size, e))
        })
        .await?;
        tracing::info!(vdi = %uuid, size, "VDI created");
        Ok(Value::String(uuid))
    }

    async fn vdi_destroy(&self, uuid: String) -> Result<Value, ApiError> {
        self.write(move |tx| {
            let vdi = db::vdi(tx, &uuid)?;
            if !vdi.vbds.is_empty() {
                return Err(ApiError::vdi_in_use(&uuid, "destroy"));
            }
            db::delete_vdi(tx, &uuid)?;
            // The row goes only if the file does.
            sr::remove_image(Path::new(&vdi.location))
                .map_err(|e| ApiError::internal(format!("removing {}: {e}", vdi.location)))?;
            Ok(Value::Null)
        })
        .await
    }

    // ------------------------------------------------------------ VM

    async fn vm_create(&self, mut p: Params) -> Result<Value, ApiError> {
        let name_label = p.str("name_label")?;
        let name_description = p.opt_str("name_description")?.unwrap_or_default();
        let vcpus = check_vcpus(p.opt_u64("VCPUs_max")?.unwrap_or(1))?;
        let memory = check_memory(p.opt_u64("memory_static_max")?.unwrap_or(DEFAULT_MEMORY))?;
        let workload = p.opt_str("workload")?.unwrap_or_else(|| "idle".into());
        p.done()?;
        let workload = parse_workload(&workload)?.to_string();
        let uuid = new_uuid();
        let u = uuid.clone();
        self.write(move |tx| {
            db::insert_vm(
                tx,
                &db::NewVm {
                    uuid: &u,
                    name_label: &name_label,
                    name_description: &name_description,
                    vcpus,
                    memory,
                    workload: &workload,
                },
            )
        })
        .await?;
        tracing::info!(vm = %uuid, "VM created");
        Ok(Value::String(uuid))
    }

    async fn vm_set(&self, mut p: Params) -> Result<Value, ApiError> {
        let uuid = p.str("uuid")?;
        let changes = db::VmChanges {
            name_label: p.opt_str("name_label")?,
            name_description: p.opt_str("name_description")?,
            vcpus: p.opt_u64("VCPUs_max")?.map(check_vcpus).transpose()?,
            memory: p
                .opt_u64("memory_static_max")?
                .map(check_memory)
                .transpose()?,
            workload: p
                .opt_str("workload")?
                .map(|w| parse_workload(&w).map(|w| w.to_string()))
                .transpose()?,
        };
        p.done()?;
        let hardware =
            changes.vcpus.is_some() || changes.memory.is_some() || changes.workload.is_some();
        let token = if hardware {
            Some(self.ops.begin(&uuid, "set")?)
        } else {
            None
        };
        let u = uuid.clone();
        let r = self
            .write(move |tx| {
                if hardware && db::power_state(tx, &u)? != PowerState::Halted {
                    return Err(ApiError::vm_bad_power_state(&u, "halted", "running"));
                }
                db::update_vm(tx, &u, &changes)
            })
            .await;
        self.end_op(&uuid, token).await;
        r.map(|()| Value::Null)
    }

    async fn vm_destroy(&self, uuid: String) -> Result<Value, ApiError> {
        let token = self.ops.begin(&uuid, "destroy")?;
        let u = uuid.clone();
        let r = self
            .write(move |tx| {
                if db::power_state(tx, &u)? != PowerState::Halted {
                    return Err(ApiError::vm_bad_power_state(&u, "halted", "running"));
                }
                db::delete_vm(tx, &u)
            })
            .await;
        self.end_op(&uuid, Some(token)).await;
        r?;
        tracing::info!(vm = %uuid, "VM destroyed");
        Ok(Value::Null)
    }

    async fn vm_start(&self, uuid: String) -> Result<Value, ApiError> {
        let token = self.ops.begin(&uuid, "start")?;
        let r = self.vm_start_locked(&uuid).await;
        self.end_op(&uuid, Some(token)).await;
        r.map(|()| Value::Null)
    }

    async fn vm_start_locked(&self, uuid: &str) -> Result<(), ApiError> {
        let u = uuid.to_string();
        let spec = self
            .read(move |c| {
                let vm = db::vm(c, &u)?;
                if vm.power_state != PowerState::Halted {
                    return Err(ApiError::vm_bad_power_state(
                        &u,
                        "halted",
                        vm.power_state.as_str(),
                    ));
                }
                let mut vbds = Vec::new();
                for vbd in db::vbds_of_vm(c, &u)? {
                    check_vdi_free(c, &vbd, Attach::Start)?;
                    vbds.push(vbd_spec(c, &vbd)?);
                }
                Ok(VmSpec {
                    uuid: vm.uuid,
                    name: vm.name_label,
                    memory_mib: vm.memory_static_max.div_ceil(1 << 20) as u32,
                    vcpus: vm.vcpus_max,
                    vbds,
                    workload: parse_workload(&vm.workload)?,
                })
            })
            .await?;
        let ndisks = spec.vbds.len();
        tracing::info!(vm = %uuid, disks = ndisks, "starting VM");
        let running = match self.xenops.start_vm(spec).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(vm = %uuid, error = %e, "VM start failed");
                return Err(xenops_error(uuid, e));
            }
        };
        let u = uuid.to_string();
        let domid = i64::from(running.domid);
        self.write(move |tx| db::set_running(tx, &u, domid, &running.vbds))
            .await?;
        tracing::info!(vm = %uuid, domid, "VM running");
        Ok(())
    }

    async fn vm_shutdown(&self, uuid: String, force: bool) -> Result<Value, ApiError> {
        let op = if force {
            "hard_shutdown"
        } else {
            "clean_shutdown"
        };
        let token = self.ops.begin(&uuid, op)?;
        let r = self.vm_shutdown_locked(&uuid, force).await;
        self.end_op(&uuid, Some(token)).await;
        r.map(|()| Value::Null)
    }

    async fn vm_shutdown_locked(&self, uuid: &str, force: bool) -> Result<(), ApiError> {
        let u = uuid.to_string();
        let state = self.read(move |c| db::power_state(c, &u)).await?;
        if state != PowerState::Running {
            return Err(ApiError::vm_bad_power_state(
                uuid,
                "running",
                state.as_str(),
            ));
        }
        match self.xenops.shutdown_vm(uuid, force).await {
            Ok(()) => {}
            Err(XenopsError::NotRunning(_)) => {
                tracing::warn!(vm = %uuid, "the engine had no such running VM: recording it halted");
            }
            Err(e) => {
                tracing::warn!(vm = %uuid, error = %e, "VM shutdown failed");
                return Err(xenops_error(uuid, e));
            }
        }
        let u = uuid.to_string();
        self.write(move |tx| db::set_halted(tx, &u)).await?;
        tracing::info!(vm = %uuid, force, "VM halted");
        Ok(())
    }

    /// Ends an operation and records a guest death that happened during it.
    async fn end_op(&self, vm: &str, token: Option<crate::ops::OpToken>) {
        if let Some(reason) = token.and_then(|t| t.finish()) {
            self.record_halted(vm, &reason).await;
        }
    }

    async fn record_halted(&self, vm: &str, reason: &str) {
        let u = vm.to_string();
        match self.write(move |tx| db::set_halted(tx, &u)).await {
            Ok(true) => tracing::info!(vm, reason, "VM halted by itself"),
            Ok(false) => tracing::debug!(vm, "halted VM is no longer recorded"),
            Err(e) => tracing::error!(vm, error = %e, "recording a halted VM"),
        }
    }

    /// Applies an event from the lifecycle engine.
    pub async fn on_event(&self, ev: VmEvent) {
        match ev {
            VmEvent::Halted { uuid, reason } => {
                if !self.ops.defer_halt(&uuid, &reason) {
                    self.record_halted(&uuid, &reason).await;
                }
            }
            VmEvent::TapdiskRestarted {
                uuid,
                devid,
                restarts,
                status,
            } => {
                // xenops logged the death, with the VM's name, at warn.
                tracing::debug!(vm = %uuid, devid, restarts, "tapdisk restarted after {status}");
                self.record_vbd_health(uuid, devid, Some(restarts), None)
                    .await;
            }
            VmEvent::VbdFailed {
                uuid,
                devid,
                reason,
            } => {
                // xenops logged why, with the VM's name, at error.
                tracing::debug!(vm = %uuid, devid, "VBD failed: {reason}");
                self.record_vbd_health(uuid, devid, None, Some(reason))
                    .await;
            }
        }
    }

    async fn record_vbd_health(
        &self,
        vm: String,
        devid: u32,
        restarts: Option<u32>,
        failed: Option<String>,
    ) {
        let Some(userdevice) = crate::vbd::userdevice_of_devid(devid) else {
            tracing::warn!(vm, devid, "an event for a device id no slot has");
            return;
        };
        let v = vm.clone();
        let r = self
            .write(move |tx| db::set_vbd_health(tx, &v, userdevice, restarts, failed.as_deref()))
            .await;
        if let Err(e) = r {
            tracing::error!(vm, devid, error = %e, "recording a VBD's tapdisk");
        }
    }

    // ------------------------------------------------------------ VBD

    async fn vbd_create(&self, mut p: Params) -> Result<Value, ApiError> {
        let vm = p.str("VM")?;
        let vdi = p.str("VDI")?;
        let userdevice = p
            .opt_str_or_int("userdevice")?
            .ok_or_else(|| ApiError::missing_parameter("userdevice"))?;
        let mode = match p.opt_str("mode")? {
            None => VbdMode::RW,
            Some(m) => VbdMode::parse(&m).ok_or_else(|| ApiError::invalid_value("mode", &m))?,
        };
        if let Some(t) = p.opt_str("type")? {
            if !t.eq_ignore_ascii_case("disk") {
                return Err(ApiError::value_not_supported(
                    "type",
                    &t,
                    "pvio VBDs are disks",
                ));
            }
        }
        let bootable = p.opt_bool("bootable")?.unwrap_or(false);
        let unpluggable = p.opt_bool("unpluggable")?.unwrap_or(true);
        p.done()?;
        let wanted = if userdevice == "autodetect" {
            None
        } else {
            Some(
                parse_userdevice(&userdevice)
                    .ok_or_else(|| ApiError::invalid_device(&userdevice))?,
            )
        };
        let uuid = new_uuid();
        let u = uuid.clone();
        self.write(move |tx| {
            db::require(tx, Class::Vm, &vm)?;
            db::require(tx, Class::Vdi, &vdi)?;
            let used = db::used_userdevices(tx, &vm)?;
            let slot = match wanted {
                Some(n) if used.contains(&n) => {
                    return Err(ApiError::device_already_exists(&n.to_string()))
                }
                Some(n) => n,
                None => (0..=MAX_USERDEVICE)
                    .find(|n| !used.contains(n))
                    .ok_or_else(|| {
                        ApiError::operation_not_allowed(
                            "the VM has 255 VBDs, every userdevice is taken",
                        )
                    })?,
            };
            db::insert_vbd(
                tx,
                &db::NewVbd {
                    uuid: &u,
                    vm: &vm,
                    vdi: &vdi,
                    userdevice: slot,
                    mode,
                    bootable,
                    unpluggable,
                },
            )?;
            // A running VM's new VBD of a VDI that is attached already (to
            // this VM or another) could only be plugged to open it twice.
            if db::power_state(tx, &vm)? == PowerState::Running {
                check_vdi_free(tx, &db::vbd(tx, &u)?, Attach::Create)?;
            }
            Ok(())
        })
        .await?;
        Ok(Value::String(uuid))
    }

    async fn vbd_destroy(&self, uuid: String) -> Result<Value, ApiError> {
        let u = uuid.clone();
        let vbd = self.read(move |c| db::vbd(c, &u)).await?;
        let token = self.ops.begin(&vbd.vm, "vbd_destroy")?;
        let r = self
            .write(move |tx| {
                let vbd = db::vbd(tx, &uuid)?;
                if vbd.currently_attached {
                    return Err(ApiError::operation_not_allowed(
                        "the VBD is attached to a running VM: unplug it first",
                    ));
                }
                db::delete_vbd(tx, &uuid)
            })
            .await;
        self.end_op(&vbd.vm, Some(token)).await;
        r.map(|()| Value::Null)
    }

    async fn vbd_plug(&self, uuid: String) -> Result<Value, ApiError> {
        let u = uuid.clone();
        let vbd = self.read(move |c| db::vbd(c, &u)).await?;
        let token = self.ops.begin(&vbd.vm, "vbd_plug")?;
        let r = self.vbd_plug_locked(uuid).await;
        self.end_op(&vbd.vm, Some(token)).await;
        r.map(|()| Value::Null)
    }

    async fn vbd_plug_locked(&self, uuid: String) -> Result<(), ApiError> {
        let u = uuid.clone();
        let (vbd, spec) = self
            .read(move |c| {
                let vbd = db::vbd(c, &u)?;
                let state = db::power_state(c, &vbd.vm)?;
                if state != PowerState::Running {
                    return Err(ApiError::vm_bad_power_state(
                        &vbd.vm,
                        "running",
                        state.as_str(),
                    ));
                }
                if vbd.currently_attached {
                    return Err(ApiError::device_already_attached(&vbd.uuid));
                }
                check_vdi_free(c, &vbd, Attach::Plug)?;
                let spec = vbd_spec(c, &vbd)?;
                Ok((vbd, spec))
            })
            .await?;
        self.xenops
            .plug_vbd(&vbd.vm, spec)
            .await
            .map_err(|e| xenops_error(&vbd.vm, e))?;
        self.write(move |tx| db::set_vbd_attached(tx, &uuid, true))
            .await
    }

    async fn vbd_unplug(&self, uuid: String, force: bool) -> Result<Value, ApiError> {
        let u = uuid.clone();
        let vbd = self.read(move |c| db::vbd(c, &u)).await?;
        let op = if force {
            "vbd_unplug_force"
        } else {
            "vbd_unplug"
        };
        let token = self.ops.begin(&vbd.vm, op)?;
        let r = self.vbd_unplug_locked(uuid, force).await;
        self.end_op(&vbd.vm, Some(token)).await;
        r.map(|()| Value::Null)
    }

    async fn vbd_unplug_locked(&self, uuid: String, force: bool) -> Result<(), ApiError> {
        let u = uuid.clone();
        let vbd = self
            .read(move |c| {
                let vbd = db::vbd(c, &u)?;
                let state = db::power_state(c, &vbd.vm)?;
                if state != PowerState::Running {
                    return Err(ApiError::vm_bad_power_state(
                        &vbd.vm,
                        "running",
                        state.as_str(),
                    ));
                }
                if !vbd.currently_attached {
                    return Err(ApiError::device_already_detached(&vbd.uuid));
                }
                if !vbd.unpluggable {
                    return Err(ApiError::vbd_not_unpluggable(&vbd.uuid));
                }
                Ok(vbd)
            })
            .await?;
        self.xenops
            .unplug_vbd(&vbd.vm, devid_of_userdevice(vbd.userdevice), force)
            .await
            .map_err(|e| xenops_error(&vbd.vm, e))?;
        self.write(move |tx| db::set_vbd_attached(tx, &uuid, false))
            .await
    }

    // ------------------------------------------------------------ VIF

    async fn vif_create(&self, mut p: Params) -> Result<Value, ApiError> {
        let vm = p.str("VM")?;
        let device = p
            .opt_str_or_int("device")?
            .ok_or_else(|| ApiError::missing_parameter("device"))?;
        let mac = p.opt_str("MAC")?.filter(|m| !m.is_empty() && m != "random");
        let network = p
            .opt_str("network")?
            .unwrap_or_else(|| DEFAULT_NETWORK.to_string());
        let mtu = p.opt_u64("MTU")?.unwrap_or(u64::from(DEFAULT_MTU));
        p.done()?;
        let device_n = device
            .parse::<u32>()
            .ok()
            .filter(|d| *d <= MAX_USERDEVICE && (device == "0" || !device.starts_with('0')))
            .ok_or_else(|| ApiError::invalid_device(&device))?;
        let (mac, generated) = match mac {
            Some(m) => (
                parse_mac(&m).ok_or_else(|| ApiError::mac_invalid(&m))?,
                false,
            ),
            None => (random_mac(), true),
        };
        if !(68..=65535).contains(&mtu) {
            return Err(ApiError::invalid_value("MTU", &mtu.to_string()));
        }
        if network.is_empty() {
            return Err(ApiError::invalid_value("network", &network));
        }
        let uuid = new_uuid();
        let u = uuid.clone();
        self.write(move |tx| {
            db::require(tx, Class::Vm, &vm)?;
            if db::vif_device_used(tx, &vm, device_n)? {
                return Err(ApiError::device_already_exists(&device_n.to_string()));
            }
            db::insert_vif(
                tx,
                &db::NewVif {
                    uuid: &u,
                    vm: &vm,
                    device: device_n,
                    mac: &mac,
                    mac_autogenerated: generated,
                    mtu: mtu as u32,
                    network: &network,
                },
            )
        })
        .await?;
        Ok(Value::String(uuid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn macs_are_checked_and_generated_locally_administered() {
        assert_eq!(
            parse_mac("AA:bb:0c:dd:ee:ff").as_deref(),
            Some("aa:bb:0c:dd:ee:ff")
        );
        for bad in [
            "",
            "aa:bb:cc:dd:ee",
            "aa:bb:cc:dd:ee:fg",
            "aabb.ccdd.eeff",
            "a:b:c:d:e:f",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad:?}");
        }
        for _ in 0..100 {
            let m = random_mac();
            assert_eq!(parse_mac(&m).as_deref(), Some(m.as_str()));
            let first = u8::from_str_radix(&m[..2], 16).unwrap();
            assert_eq!(first & 0x03, 0x02, "{m}: not local unicast");
        }
    }

    #[test]
    fn sizes_round_to_sectors() {
        assert_eq!(round_to_sector(1), 512);
        assert_eq!(round_to_sector(512), 512);
        assert_eq!(round_to_sector(1 << 30), 1 << 30);
        assert_eq!(round_to_sector(1000), 1024);
    }

    #[test]
    fn params_are_typed_and_all_used() {
        let mut p = Params::new(
            "VDI.create",
            json!({"SR": "s", "virtual_size": 5, "sharable": "yes", "extra": 1}),
        )
        .unwrap();
        assert_eq!(p.str("SR").unwrap(), "s");
        assert_eq!(p.opt_u64("virtual_size").unwrap(), Some(5));
        assert_eq!(
            p.str("name_label").unwrap_err(),
            ApiError::missing_parameter("name_label")
        );
        assert_eq!(
            p.opt_bool("sharable").unwrap_err(),
            ApiError::field_type_error("sharable")
        );
        assert_eq!(
            p.done().unwrap_err(),
            ApiError::unknown_parameter("VDI.create", "extra")
        );
        let mut p = Params::new("x", json!({"n": -1})).unwrap();
        assert_eq!(
            p.opt_u64("n").unwrap_err(),
            ApiError::invalid_value("n", "-1")
        );
        assert!(Params::new("x", json!([1])).is_err());
    }
}
