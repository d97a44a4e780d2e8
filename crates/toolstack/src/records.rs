//! Records as `xe` prints them (xen-api's `records.ml`, `cli_printer.ml`
//! and `cli_operations.ml`): each class has an ordered list of fields, each
//! field a tag (` ( RO)`, ` ( RW)`, ` (MRO)`, ` (MRW)`, ` (SRO)`, ` (SRW)`);
//! a record prints as `key: value` lines where the longest key plus four
//! sets the width, the first key is padded on the right and the others on
//! the left, and the record ends with `\n\n` after its last line (so two
//! empty lines follow each record, as xe's `Print (record ^ "\n")` through
//! `print_endline` gives). Maps print as `k1: v1; k2: v2`, sets as
//! `a; b`. Fields print in the class's order whatever order `params=`
//! names them in. `--minimal` prints the first selected field of every
//! record, comma-joined, with `\` and `,` escaped.
//!
//! pvio's classes are subsets of XenAPI's in XenAPI's order, plus
//! `workload` and `guest-metrics` on VMs and `device-config` on SRs (which
//! XenAPI keeps on the PBD that pvio does not have).

use std::collections::{BTreeMap, HashMap};

use crate::model::{
    Class, HostRecord, PowerState, SrRecord, VbdRecord, VdiRecord, VifRecord, VmRecord,
};

/// What xe prints for a reference to nothing.
pub const NOT_IN_DATABASE: &str = "<not in database>";

/// The shape of a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Scalar,
    Map,
    Set,
}

/// A field of a class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldDef {
    pub name: &'static str,
    pub kind: Kind,
    /// Settable (a `param-set` target in XenAPI): tagged RW.
    pub writable: bool,
    /// Filters on it ignore case.
    pub case_insensitive: bool,
}

impl FieldDef {
    /// The tag xe appends to the name.
    pub fn tag(&self) -> &'static str {
        match (self.kind, self.writable) {
            (Kind::Scalar, false) => "( RO)",
            (Kind::Scalar, true) => "( RW)",
            (Kind::Map, false) => "(MRO)",
            (Kind::Map, true) => "(MRW)",
            (Kind::Set, false) => "(SRO)",
            (Kind::Set, true) => "(SRW)",
        }
    }
}

const fn ro(name: &'static str) -> FieldDef {
    FieldDef {
        name,
        kind: Kind::Scalar,
        writable: false,
        case_insensitive: false,
    }
}
const fn rw(name: &'static str) -> FieldDef {
    FieldDef {
        writable: true,
        ..ro(name)
    }
}
const fn mro(name: &'static str) -> FieldDef {
    FieldDef {
        kind: Kind::Map,
        ..ro(name)
    }
}
const fn sro(name: &'static str) -> FieldDef {
    FieldDef {
        kind: Kind::Set,
        ..ro(name)
    }
}
const fn ci(f: FieldDef) -> FieldDef {
    FieldDef {
        case_insensitive: true,
        ..f
    }
}

/// A class as the CLI sees it.
#[derive(Debug)]
pub struct ClassDef {
    pub class: Class,
    pub fields: &'static [FieldDef],
    /// What `<class>-list` shows without `params=`.
    pub default_list: &'static [&'static str],
    /// Other names accepted for fields (`domid` for `dom-id`).
    pub aliases: &'static [(&'static str, &'static str)],
}

pub static VM: ClassDef = ClassDef {
    class: Class::Vm,
    fields: &[
        ro("uuid"),
        rw("name-label"),
        rw("name-description"),
        rw("is-a-template"),
        ro("is-control-domain"),
        ci(ro("power-state")),
        ro("memory-actual"),
        rw("memory-static-max"),
        rw("VCPUs-max"),
        rw("VCPUs-at-startup"),
        sro("allowed-operations"),
        sro("current-operations"),
        ro("resident-on"),
        ro("dom-id"),
        sro("VBDs"),
        mro("failed-VBDs"),
        mro("guest-metrics"),
        rw("workload"),
    ],
    default_list: &["name-label", "uuid", "power-state"],
    aliases: &[("domid", "dom-id"), ("memory", "memory-static-max")],
};

pub static VBD: ClassDef = ClassDef {
    class: Class::Vbd,
    fields: &[
        ro("uuid"),
        ro("vm-uuid"),
        ro("vm-name-label"),
        ro("vdi-uuid"),
        ro("vdi-name-label"),
        ro("empty"),
        ro("device"),
        rw("userdevice"),
        rw("bootable"),
        rw("mode"),
        rw("type"),
        rw("unpluggable"),
        ro("currently-attached"),
        ro("tapdisk-restarts"),
        ro("status-detail"),
    ],
    default_list: &[
        "uuid",
        "vm-uuid",
        "vm-name-label",
        "vdi-uuid",
        "device",
        "empty",
    ],
    aliases: &[],
};

pub static VDI: ClassDef = ClassDef {
    class: Class::Vdi,
    fields: &[
        ro("uuid"),
        rw("name-label"),
        rw("name-description"),
        ro("sr-uuid"),
        ro("sr-name-label"),
        sro("vbd-uuids"),
        ro("virtual-size"),
        ro("physical-utilisation"),
        ro("location"),
        ro("type"),
        ro("sharable"),
        ro("read-only"),
    ],
    default_list: &[
        "uuid",
        "name-label",
        "name-description",
        "virtual-size",
        "read-only",
        "sharable",
        "sr-uuid",
    ],
    aliases: &[],
};

pub static SR: ClassDef = ClassDef {
    class: Class::Sr,
    fields: &[
        ro("uuid"),
        rw("name-label"),
        rw("name-description"),
        ro("host"),
        sro("VDIs"),
        ro("virtual-allocation"),
        ro("physical-utilisation"),
        ro("physical-size"),
        ro("type"),
        ro("content-type"),
        rw("shared"),
        mro("device-config"),
    ],
    default_list: &[
        "uuid",
        "name-label",
        "name-description",
        "host",
        "type",
        "content-type",
    ],
    aliases: &[],
};

pub static VIF: ClassDef = ClassDef {
    class: Class::Vif,
    fields: &[
        ro("uuid"),
        ro("vm-uuid"),
        ro("vm-name-label"),
        ro("device"),
        ro("MAC"),
        ro("MAC-autogenerated"),
        ro("MTU"),
        ro("currently-attached"),
        ro("network-uuid"),
        ro("network-name-label"),
    ],
    default_list: &["uuid", "device", "vm-uuid", "network-uuid"],
    aliases: &[],
};

pub static HOST: ClassDef = ClassDef {
    class: Class::Host,
    fields: &[
        ro("uuid"),
        rw("name-label"),
        rw("name-description"),
        ro("enabled"),
        ro("API-version-major"),
        ro("API-version-minor"),
        mro("software-version"),
        mro("cpu_info"),
        ro("hostname"),
        ro("memory-total"),
        ro("memory-free"),
        sro("resident-vms"),
    ],
    default_list: &["uuid", "name-label", "name-description"],
    aliases: &[],
};

/// The CLI definition of `class`.
pub fn class_def(class: Class) -> &'static ClassDef {
    match class {
        Class::Vm => &VM,
        Class::Vbd => &VBD,
        Class::Vdi => &VDI,
        Class::Sr => &SR,
        Class::Vif => &VIF,
        Class::Host => &HOST,
    }
}

impl ClassDef {
    /// The field called `name` (or an alias of it).
    pub fn field(&self, name: &str) -> Option<&'static FieldDef> {
        let name = self
            .aliases
            .iter()
            .find(|(a, _)| *a == name)
            .map_or(name, |(_, real)| real);
        self.fields.iter().find(|f| f.name == name)
    }
}

/// A field's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Scalar(String),
    Map(Vec<(String, String)>),
    Set(Vec<String>),
}

impl Value {
    /// The value as xe prints it.
    pub fn render(&self) -> String {
        match self {
            Value::Scalar(s) => s.clone(),
            Value::Map(m) => m
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect::<Vec<_>>()
                .join("; "),
            Value::Set(s) => s.join("; "),
        }
    }
}

fn s(v: impl ToString) -> Value {
    Value::Scalar(v.to_string())
}

fn map(m: &BTreeMap<String, String>) -> Value {
    Value::Map(m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

/// A record: the class's fields with their values, in class order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub fields: Vec<(&'static FieldDef, Value)>,
}

impl Record {
    fn build(class: &'static ClassDef, mut get: impl FnMut(&str) -> Value) -> Self {
        Record {
            fields: class.fields.iter().map(|f| (f, get(f.name))).collect(),
        }
    }

    /// The value of field `name`.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.fields
            .iter()
            .find(|(f, _)| f.name == name)
            .map(|(_, v)| v)
    }

    /// Keeps only the fields named in `names` (still in class order).
    pub fn select(&self, names: &[&str]) -> Record {
        Record {
            fields: self
                .fields
                .iter()
                .filter(|(f, _)| names.contains(&f.name))
                .cloned()
                .collect(),
        }
    }

    /// The record as xe prints it: its lines, then two newlines.
    pub fn to_text(&self) -> String {
        let keys: Vec<String> = self
            .fields
            .iter()
            .map(|(f, _)| format!("{} {}", f.name, f.tag()))
            .collect();
        let width = 4 + keys.iter().map(String::len).max().unwrap_or(0);
        let mut out = String::new();
        for (i, (key, (_, value))) in keys.iter().zip(&self.fields).enumerate() {
            if i == 0 {
                out.push_str(&format!("{key:<width$}: {}\n", value.render()));
            } else {
                out.push_str(&format!("{key:>width$}: {}\n", value.render()));
            }
        }
        out.push_str("\n\n");
        out
    }
}

/// Prints records as xe does, or with `minimal`, their first fields.
pub fn print_table(records: &[Record], minimal: bool) -> String {
    if minimal {
        let firsts: Vec<String> = records
            .iter()
            .filter_map(|r| r.fields.first())
            .map(|(_, v)| v.render())
            .collect();
        return minimal_line(&firsts);
    }
    records.iter().map(Record::to_text).collect()
}

/// `--minimal`'s line: values comma-joined, `\` and `,` escaped.
pub fn minimal_line(values: &[String]) -> String {
    let mut out = values
        .iter()
        .map(|v| escape_minimal(v))
        .collect::<Vec<_>>()
        .join(",");
    out.push('\n');
    out
}

/// Escapes one value for `--minimal` (xe's `escape_commas`).
pub fn escape_minimal(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            ',' => out.push_str("\\,"),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out
}

/// Splits a `--minimal` line (without its newline) back into values.
pub fn split_minimal(line: &str) -> Vec<String> {
    if line.is_empty() {
        return Vec::new();
    }
    let mut out = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    out.last_mut().expect("never empty").push(n);
                }
            }
            ',' => out.push(String::new()),
            c => out.last_mut().expect("never empty").push(c),
        }
    }
    out
}

/// The other objects a record refers to, for names and derived fields.
#[derive(Debug, Default)]
pub struct Context {
    pub vms: HashMap<String, VmRecord>,
    pub vdis: HashMap<String, VdiRecord>,
    pub srs: HashMap<String, SrRecord>,
    pub host: Option<HostRecord>,
    /// Guest metrics of running VMs, or why they could not be read.
    pub guest_metrics: HashMap<String, Result<BTreeMap<String, String>, String>>,
}

impl Context {
    fn vm_name(&self, uuid: &str) -> String {
        self.vms
            .get(uuid)
            .map_or_else(|| NOT_IN_DATABASE.to_string(), |v| v.name_label.clone())
    }
}

fn bool_str(b: bool) -> Value {
    s(if b { "true" } else { "false" })
}

pub fn vm_record(vm: &VmRecord, ctx: &Context) -> Record {
    let running = vm.power_state == PowerState::Running;
    Record::build(&VM, |name| match name {
        "uuid" => s(&vm.uuid),
        "name-label" => s(&vm.name_label),
        "name-description" => s(&vm.name_description),
        "is-a-template" | "is-control-domain" => bool_str(false),
        "power-state" => s(vm.power_state.as_str()),
        "memory-actual" => s(if running { vm.memory_static_max } else { 0 }),
        "memory-static-max" => s(vm.memory_static_max),
        "VCPUs-max" | "VCPUs-at-startup" => s(vm.vcpus_max),
        "allowed-operations" => Value::Set(
            match (vm.current_operations.is_empty(), running) {
                (false, _) => &[][..],
                (true, false) => &["start", "destroy"][..],
                (true, true) => &["clean_shutdown", "hard_shutdown"][..],
            }
            .iter()
            .map(|o| o.to_string())
            .collect(),
        ),
        "current-operations" => Value::Set(vm.current_operations.clone()),
        "resident-on" => s(if vm.resident_on.is_empty() {
            NOT_IN_DATABASE
        } else {
            &vm.resident_on
        }),
        "dom-id" => s(vm.domid),
        "VBDs" => Value::Set(vm.vbds.clone()),
        "failed-VBDs" => map(&vm.failed_vbds),
        "guest-metrics" => match ctx.guest_metrics.get(&vm.uuid) {
            Some(Ok(m)) => map(m),
            Some(Err(_)) => s("<unknown>"),
            None => Value::Map(Vec::new()),
        },
        "workload" => s(&vm.workload),
        other => unreachable!("VM field {other}"),
    })
}

pub fn vbd_record(vbd: &VbdRecord, ctx: &Context) -> Record {
    Record::build(&VBD, |name| match name {
        "uuid" => s(&vbd.uuid),
        "vm-uuid" => s(&vbd.vm),
        "vm-name-label" => s(ctx.vm_name(&vbd.vm)),
        "vdi-uuid" => s(&vbd.vdi),
        "vdi-name-label" => s(ctx
            .vdis
            .get(&vbd.vdi)
            .map_or(NOT_IN_DATABASE, |v| v.name_label.as_str())),
        "empty" => bool_str(false),
        "device" => s(&vbd.device),
        "userdevice" => s(vbd.userdevice),
        "bootable" => bool_str(vbd.bootable),
        "mode" => s(vbd.mode.as_str()),
        "type" => s(&vbd.vbd_type),
        "unpluggable" => bool_str(vbd.unpluggable),
        "currently-attached" => bool_str(vbd.currently_attached),
        "tapdisk-restarts" => s(vbd.tapdisk_restarts),
        "status-detail" => s(&vbd.status_detail),
        other => unreachable!("VBD field {other}"),
    })
}

pub fn vdi_record(vdi: &VdiRecord, ctx: &Context) -> Record {
    Record::build(&VDI, |name| match name {
        "uuid" => s(&vdi.uuid),
        "name-label" => s(&vdi.name_label),
        "name-description" => s(&vdi.name_description),
        "sr-uuid" => s(&vdi.sr),
        "sr-name-label" => s(ctx
            .srs
            .get(&vdi.sr)
            .map_or(NOT_IN_DATABASE, |s| s.name_label.as_str())),
        "vbd-uuids" => Value::Set(vdi.vbds.clone()),
        "virtual-size" => s(vdi.virtual_size),
        "physical-utilisation" => s(vdi.physical_utilisation),
        "location" => s(&vdi.location),
        "type" => s(&vdi.vdi_type),
        "sharable" => bool_str(vdi.sharable),
        "read-only" => bool_str(vdi.read_only),
        other => unreachable!("VDI field {other}"),
    })
}

pub fn sr_record(sr: &SrRecord, ctx: &Context) -> Record {
    Record::build(&SR, |name| match name {
        "uuid" => s(&sr.uuid),
        "name-label" => s(&sr.name_label),
        "name-description" => s(&sr.name_description),
        "host" => s(ctx
            .host
            .as_ref()
            .filter(|h| h.uuid == sr.host)
            .map_or(NOT_IN_DATABASE, |h| h.name_label.as_str())),
        "VDIs" => Value::Set(sr.vdis.clone()),
        "virtual-allocation" => s(sr.virtual_allocation),
        "physical-utilisation" => s(sr.physical_utilisation),
        "physical-size" => s(sr.physical_size),
        "type" => s(&sr.sr_type),
        "content-type" => s(&sr.content_type),
        "shared" => bool_str(sr.shared),
        "device-config" => map(&sr.device_config),
        other => unreachable!("SR field {other}"),
    })
}

pub fn vif_record(vif: &VifRecord, ctx: &Context) -> Record {
    Record::build(&VIF, |name| match name {
        "uuid" => s(&vif.uuid),
        "vm-uuid" => s(&vif.vm),
        "vm-name-label" => s(ctx.vm_name(&vif.vm)),
        "device" => s(vif.device),
        "MAC" => s(&vif.mac),
        "MAC-autogenerated" => bool_str(vif.mac_autogenerated),
        "MTU" => s(vif.mtu),
        "currently-attached" => bool_str(vif.currently_attached),
        "network-uuid" => s(NOT_IN_DATABASE),
        "network-name-label" => s(&vif.network),
        other => unreachable!("VIF field {other}"),
    })
}

pub fn host_record(h: &HostRecord) -> Record {
    Record::build(&HOST, |name| match name {
        "uuid" => s(&h.uuid),
        "name-label" => s(&h.name_label),
        "name-description" => s(&h.name_description),
        "enabled" => bool_str(true),
        "API-version-major" => s(h.api_version_major),
        "API-version-minor" => s(h.api_version_minor),
        "software-version" => map(&h.software_version),
        "cpu_info" => map(&h.cpu_info),
        "hostname" => s(&h.hostname),
        "memory-total" => s(h.memory_total),
        "memory-free" => s(h.memory_free),
        "resident-vms" => Value::Set(h.resident_vms.clone()),
        other => unreachable!("host field {other}"),
    })
}

/// A filter from the command line, resolved against a class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filter {
    /// `field=value`: the printed value equals `value`.
    Equals(&'static FieldDef, String),
    /// `map:key=value`: the map has `key` with `value`.
    MapHas(&'static FieldDef, String, String),
    /// `set:contains=value`: the set has `value`.
    SetContains(&'static FieldDef, String),
}

/// Why a filter was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    #[error("'{0}' is not a field of the {1} class")]
    UnknownField(String, &'static str),
    #[error("field '{0}' is not a set or map")]
    NotMapOrSet(String),
    #[error("invalid syntax for set filtering (should be {0}:contains=value)")]
    SetSyntax(String),
}

impl Filter {
    /// Resolves `key=value` against `class`.
    pub fn parse(class: &ClassDef, key: &str, value: &str) -> Result<Filter, FilterError> {
        let unknown = || FilterError::UnknownField(key.to_string(), class.class.api_name());
        if let Some(f) = class.field(key) {
            return Ok(Filter::Equals(f, value.to_string()));
        }
        let (name, sub) = key.split_once(':').ok_or_else(unknown)?;
        let f = class.field(name).ok_or_else(unknown)?;
        match f.kind {
            Kind::Map => Ok(Filter::MapHas(f, sub.to_string(), value.to_string())),
            Kind::Set if sub == "contains" => Ok(Filter::SetContains(f, value.to_string())),
            Kind::Set => Err(FilterError::SetSyntax(f.name.to_string())),
            Kind::Scalar => Err(FilterError::NotMapOrSet(f.name.to_string())),
        }
    }

    /// The field it looks at.
    pub fn field(&self) -> &'static FieldDef {
        match self {
            Filter::Equals(f, _) | Filter::MapHas(f, _, _) | Filter::SetContains(f, _) => f,
        }
    }

    /// Whether `record` passes.
    pub fn matches(&self, record: &Record) -> bool {
        let eq = |f: &FieldDef, a: &str, b: &str| {
            if f.case_insensitive {
                a.eq_ignore_ascii_case(b)
            } else {
                a == b
            }
        };
        let Some(value) = record.get(self.field().name) else {
            return false;
        };
        match (self, value) {
            (Filter::Equals(f, want), v) => eq(f, &v.render(), want),
            (Filter::MapHas(f, key, want), Value::Map(m)) => {
                m.iter().any(|(k, v)| eq(f, k, key) && eq(f, v, want))
            }
            (Filter::SetContains(f, want), Value::Set(items)) => {
                items.iter().any(|i| eq(f, i, want))
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::VbdMode;

    fn vm() -> VmRecord {
        VmRecord {
            uuid: "3f2a0000-0000-4000-8000-000000000001".into(),
            name_label: "web, front".into(),
            name_description: String::new(),
            power_state: PowerState::Running,
            memory_static_max: 256 << 20,
            vcpus_max: 2,
            workload: "idle".into(),
            domid: 3,
            resident_on: "h".into(),
            vbds: vec!["b1".into(), "b2".into()],
            vifs: Vec::new(),
            current_operations: Vec::new(),
            failed_vbds: BTreeMap::from([("xvdb".to_string(), "its tapdisk died".to_string())]),
        }
    }

    #[test]
    fn a_record_prints_with_xes_padding_and_tags() {
        let r = vm_record(&vm(), &Context::default()).select(VM.default_list);
        assert_eq!(
            r.to_text(),
            "uuid ( RO)           : 3f2a0000-0000-4000-8000-000000000001\n\
             \x20    name-label ( RW): web, front\n\
             \x20   power-state ( RO): running\n\n\n"
        );
    }

    #[test]
    fn every_field_has_a_value_and_names_are_unique() {
        let mut ctx = Context::default();
        ctx.guest_metrics.insert(
            vm().uuid,
            Ok(BTreeMap::from([
                ("workload/iops".to_string(), "12".to_string()),
                ("ready".to_string(), "1".to_string()),
            ])),
        );
        let r = vm_record(&vm(), &ctx);
        assert_eq!(r.fields.len(), VM.fields.len());
        assert_eq!(
            r.get("guest-metrics").unwrap().render(),
            "ready: 1; workload/iops: 12"
        );
        assert_eq!(r.get("VBDs").unwrap().render(), "b1; b2");
        assert_eq!(r.get("dom-id").unwrap().render(), "3");
        assert_eq!(
            r.get("failed-VBDs").unwrap().render(),
            "xvdb: its tapdisk died"
        );
        let text = r.to_text();
        assert!(
            text.contains("     guest-metrics (MRO): ready: 1; workload/iops: 12\n"),
            "{text}"
        );
        for class in [&VM, &VBD, &VDI, &SR, &VIF, &HOST] {
            let mut names: Vec<_> = class.fields.iter().map(|f| f.name).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), class.fields.len(), "{:?}", class.class);
            for d in class.default_list {
                assert!(class.field(d).is_some(), "{d}");
            }
        }
        let vbd = VbdRecord {
            uuid: "b".into(),
            vm: "v".into(),
            vdi: "d".into(),
            userdevice: 1,
            device: "xvdb".into(),
            mode: VbdMode::RO,
            vbd_type: "Disk".into(),
            bootable: false,
            unpluggable: true,
            currently_attached: true,
            tapdisk_restarts: 2,
            status_detail: String::new(),
        };
        let r = vbd_record(&vbd, &Context::default());
        assert_eq!(r.get("vm-name-label").unwrap().render(), NOT_IN_DATABASE);
        assert_eq!(r.get("mode").unwrap().render(), "RO");
        assert_eq!(r.get("tapdisk-restarts").unwrap().render(), "2");
        assert_eq!(r.get("status-detail").unwrap().render(), "");
    }

    #[test]
    fn minimal_takes_the_first_field_in_record_order() {
        let r = vm_record(&vm(), &Context::default());
        // params=name-label,uuid still prints the uuid: record order wins.
        let sel = r.select(&["name-label", "uuid"]);
        assert_eq!(
            print_table(&[sel.clone(), sel], true),
            format!("{0},{0}\n", vm().uuid)
        );
        let names = r.select(&["name-label"]);
        assert_eq!(print_table(&[names], true), "web\\, front\n");
        assert_eq!(print_table(&[], true), "\n");
        assert_eq!(print_table(&[], false), "");
    }

    #[test]
    fn filters_match_scalars_maps_and_sets() {
        let mut ctx = Context::default();
        ctx.guest_metrics.insert(
            vm().uuid,
            Ok(BTreeMap::from([("ready".to_string(), "1".to_string())])),
        );
        let r = vm_record(&vm(), &ctx);
        let f = |k: &str, v: &str| Filter::parse(&VM, k, v).unwrap().matches(&r);
        assert!(f("power-state", "running"));
        assert!(f("power-state", "Running"), "power-state ignores case");
        assert!(!f("name-label", "WEB, FRONT"), "name-label does not");
        assert!(f("domid", "3"), "alias");
        assert!(f("guest-metrics:ready", "1"));
        assert!(!f("guest-metrics:ready", "0"));
        assert!(f("VBDs:contains", "b2"));
        assert!(!f("VBDs:contains", "b3"));
        assert!(matches!(
            Filter::parse(&VM, "colour", "x"),
            Err(FilterError::UnknownField(..))
        ));
        assert!(matches!(
            Filter::parse(&VM, "uuid:x", "x"),
            Err(FilterError::NotMapOrSet(..))
        ));
        assert!(matches!(
            Filter::parse(&VM, "VBDs:has", "x"),
            Err(FilterError::SetSyntax(..))
        ));
    }

    proptest::proptest! {
        #[test]
        fn minimal_escaping_round_trips(values in proptest::collection::vec(".*", 1..8)) {
            proptest::prop_assume!(!(values.len() == 1 && values[0].is_empty()));
            let line = minimal_line(&values);
            let line = line.strip_suffix('\n').unwrap();
            proptest::prop_assert_eq!(split_minimal(line), values);
        }

        #[test]
        fn minimal_escaping_round_trips_commas_and_backslashes(
            values in proptest::collection::vec("[a\\\\,]{0,6}", 2..8)
        ) {
            let line = minimal_line(&values);
            let line = line.strip_suffix('\n').unwrap();
            proptest::prop_assert_eq!(split_minimal(line), values);
        }
    }
}
