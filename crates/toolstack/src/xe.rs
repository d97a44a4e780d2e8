//! The xe-style commands (`pvio vm-list`, `pvio vdi-create ...`): the
//! client side of toolstackd's JSON-RPC. Each command checks its whole
//! command line (required and known parameters, values that parse) before
//! it sends anything, so a wrong command line changes nothing; the server
//! checks the rest in one transaction. Output follows xe's printer (see
//! [`crate::records`]); failures print xe's messages on stderr and exit 1.
//!
//! Commands (xe's names, parameters and defaults; xen-api
//! `cli_frontend.ml`):
//!
//! * `<class>-list [params=a,b|all] [FIELD=VALUE ...] [--minimal]` for
//!   `vm`, `vdi`, `vbd`, `sr`, `vif`, `host`; filters are `field=value`,
//!   `map-field:key=value`, `set-field:contains=value`;
//! * `<class>-param-list uuid=`, `<class>-param-get uuid= param-name=
//!   [param-key=]`, and `param-set` for `vm`, `vdi`, `sr`, `host`;
//! * `sr-create`, `sr-destroy`, `vdi-create`, `vdi-destroy`, `vm-create`,
//!   `vm-destroy`, `vm-start`/`vm-shutdown` (VM selectors: any VM field,
//!   or `vm=NAME-OR-UUID`; more than one match needs `--multiple`),
//!   `vbd-create`, `vbd-plug`, `vbd-unplug`, `vbd-destroy`, `vif-create`,
//!   `vif-destroy`.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;

use serde_json::{json, Map, Value};

use crate::args::{parse_bool, parse_int, parse_size, RawArgs, SyntaxError};
use crate::error::{ApiError, Code};
use crate::model::{
    Class, HostRecord, PowerState, SrRecord, VbdRecord, VdiRecord, VifRecord, VmRecord,
};
use crate::records::{self, class_def, ClassDef, Context, Filter, Record};
use crate::rpc::{Client, ClientError};

/// Where the CLI finds toolstackd without `--socket` or the environment.
pub const DEFAULT_SOCKET: &str = "/run/pvio/toolstackd.sock";

/// What a command does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    List(Class),
    ParamList(Class),
    ParamGet(Class),
    ParamSet(Class),
    SrCreate,
    SrDestroy,
    VdiCreate,
    VdiDestroy,
    VmCreate,
    VmDestroy,
    VmStart,
    VmShutdown,
    VbdCreate,
    VbdDestroy,
    VbdPlug,
    VbdUnplug,
    VifCreate,
    VifDestroy,
}

/// Which extra parameters a command takes besides its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// Only `reqd` and `optn`.
    Plain,
    /// Any field of the class, as a filter.
    Filters(Class),
    /// VM selectors: any VM field, or `vm=NAME-OR-UUID`.
    VmSelectors,
}

/// One xe command.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    pub name: String,
    pub reqd: Vec<&'static str>,
    /// Optional parameters; a name ending in `:` takes `name:key=value` entries.
    pub optn: Vec<&'static str>,
    pub help: String,
    action: Action,
    scope: Scope,
}

impl CommandSpec {
    /// The first sentence of the help, for command lists.
    pub fn summary(&self) -> &str {
        let h = self.help.as_str();
        match h.find(". ") {
            Some(i) => &h[..=i],
            None => h,
        }
    }

    /// xe's help record for the command.
    pub fn help_text(&self) -> String {
        let mut optional: Vec<String> = self.optn.iter().map(|s| s.to_string()).collect();
        match self.scope {
            Scope::Plain => {}
            Scope::Filters(c) => {
                optional.extend(class_def(c).fields.iter().map(|f| f.name.to_string()));
            }
            Scope::VmSelectors => optional.push("<vm-selectors>".into()),
        }
        optional.push("--minimal".into());
        let mut help = self.help.clone();
        if self.scope == Scope::VmSelectors {
            help.push_str(VM_SELECTORS_INFO);
        }
        let rows = [
            ("command name        ", self.name.clone()),
            ("reqd params     ", self.reqd.join(", ")),
            ("optional params ", optional.join(", ")),
            ("description     ", help),
        ];
        let width = 4 + rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let mut out = String::new();
        for (i, (k, v)) in rows.iter().enumerate() {
            if i == 0 {
                out.push_str(&format!("{k:<width$}: {v}\n"));
            } else {
                out.push_str(&format!("{k:>width$}: {v}\n"));
            }
        }
        out.push_str(
            "\nArguments are key=value (maps as name:key=value); --minimal prints only the \
             first field of each record, comma-separated. The toolstackd socket is --socket \
             PATH, else $PVIO_TOOLSTACK_SOCKET, else $PVIO_STATE/toolstackd.sock, else \
             /run/pvio/toolstackd.sock.\n",
        );
        out
    }
}

const VM_SELECTORS_INFO: &str = " VMs can be specified by filtering the full list of VMs on the \
    values of zero or more fields. For example, specifying 'uuid=<some_uuid>' will select only \
    the VM with that uuid, and 'power-state=halted' will select only VMs whose 'power-state' \
    field is equal to 'halted'. The special pseudo-field 'vm' matches either of name-label or \
    uuid. Where multiple VMs are matching, the option '--multiple' must be specified to perform \
    the operation. The full list of fields that can be matched can be obtained by the command \
    'pvio vm-list params=all'. If no parameters to select VMs are given, the operation will be \
    performed on all VMs.";

fn spec(
    name: &str,
    reqd: &[&'static str],
    optn: &[&'static str],
    help: &str,
    action: Action,
    scope: Scope,
) -> CommandSpec {
    CommandSpec {
        name: name.to_string(),
        reqd: reqd.to_vec(),
        optn: optn.to_vec(),
        help: help.to_string(),
        action,
        scope,
    }
}

/// Every xe command, sorted by name.
pub fn commands() -> &'static [CommandSpec] {
    static TABLE: OnceLock<Vec<CommandSpec>> = OnceLock::new();
    TABLE.get_or_init(|| {
        use Action::*;
        let mut t = vec![
            spec(
                "sr-create",
                &["name-label", "type"],
                &["name-description", "content-type", "device-config:"],
                "Create an SR. The only type is 'file': a directory of raw images, \
                 device-config:location=DIR (default <state>/sr/<uuid>), and \
                 device-config:attach-delay-ms=N (default 0), how long each attach and \
                 detach of one of its VDIs takes.",
                SrCreate,
                Scope::Plain,
            ),
            spec(
                "sr-destroy",
                &["uuid"],
                &[],
                "Destroy an SR that has no VDIs.",
                SrDestroy,
                Scope::Plain,
            ),
            spec(
                "vdi-create",
                &["sr-uuid", "name-label", "virtual-size"],
                &["name-description", "sharable", "read-only"],
                "Create a VDI: a sparse raw file of virtual-size bytes (units KiB, MiB, GiB, \
                 TiB, PiB accepted; at most what the SR's filesystem takes in one file) in \
                 the SR.",
                VdiCreate,
                Scope::Plain,
            ),
            spec(
                "vdi-destroy",
                &["uuid"],
                &[],
                "Destroy a VDI and delete its file. VBDs using it must be destroyed first.",
                VdiDestroy,
                Scope::Plain,
            ),
            spec(
                "vm-create",
                &["name-label"],
                &[
                    "name-description",
                    "VCPUs-max",
                    "memory-static-max",
                    "memory",
                    "workload",
                ],
                "Create a new halted VM. VCPUs-max defaults to 1, memory (memory-static-max) \
                 to 256MiB, workload to 'idle' (else job:SPEC, boot-read:MIB or nbd:SOCKET).",
                VmCreate,
                Scope::Plain,
            ),
            spec(
                "vm-destroy",
                &["uuid"],
                &[],
                "Destroy a halted VM with its VBDs and VIFs. This leaves the VDIs intact.",
                VmDestroy,
                Scope::Plain,
            ),
            spec(
                "vm-start",
                &[],
                &["multiple"],
                "Start the selected VM(s): plug their VBDs in parallel and run their guests.",
                VmStart,
                Scope::VmSelectors,
            ),
            spec(
                "vm-shutdown",
                &[],
                &["force", "multiple"],
                "Shutdown the selected VM(s). The optional argument --force will forcibly shut \
                 down the VM.",
                VmShutdown,
                Scope::VmSelectors,
            ),
            spec(
                "vbd-create",
                &["vm-uuid", "device", "vdi-uuid"],
                &["bootable", "type", "mode", "unpluggable"],
                "Create a VBD. The device is the userdevice, 0 to 254 (or 'autodetect' for the \
                 first free one). The type is 'Disk' and the mode is 'RO' or 'RW' (the default).",
                VbdCreate,
                Scope::Plain,
            ),
            spec(
                "vbd-destroy",
                &["uuid"],
                &[],
                "Destroy a VBD.",
                VbdDestroy,
                Scope::Plain,
            ),
            spec(
                "vbd-plug",
                &["uuid"],
                &[],
                "Attempt to attach the VBD while the VM is in the running state.",
                VbdPlug,
                Scope::Plain,
            ),
            spec(
                "vbd-unplug",
                &["uuid"],
                &["force"],
                "Attempt to detach the VBD while the VM is in the running state. If the \
                 optional argument 'force' is given then it will be immediately unplugged.",
                VbdUnplug,
                Scope::Plain,
            ),
            spec(
                "vif-create",
                &["device", "vm-uuid"],
                &["mac", "network"],
                "Create a VIF. If specified, the MAC parameter is of the form \
                 aa:bb:cc:dd:ee:ff; if not, a random locally administered MAC is chosen. The \
                 network is a name (default xenbr0). VIFs are recorded only: nothing plugs \
                 them yet.",
                VifCreate,
                Scope::Plain,
            ),
            spec(
                "vif-destroy",
                &["uuid"],
                &[],
                "Destroy a VIF.",
                VifDestroy,
                Scope::Plain,
            ),
        ];
        for class in [
            Class::Vm,
            Class::Vdi,
            Class::Vbd,
            Class::Sr,
            Class::Vif,
            Class::Host,
        ] {
            let c = class.cli_name();
            let plural = format!("{c}s");
            t.push(spec(
                &format!("{c}-list"),
                &[],
                &["params"],
                &format!(
                    "Lists all the {plural}, filtering on the optional arguments. To filter on \
                     map parameters, use the syntax 'map-param:key=value'"
                ),
                List(class),
                Scope::Filters(class),
            ));
            t.push(spec(
                &format!("{c}-param-list"),
                &["uuid"],
                &[],
                "Lists all the parameters of the object specified by the uuid.",
                ParamList(class),
                Scope::Plain,
            ));
            t.push(spec(
                &format!("{c}-param-get"),
                &["uuid", "param-name"],
                &["param-key"],
                "Gets the parameter specified of the object. If the parameter is a map of \
                 key=value pairs, use 'param-key=<key>' to get the value associated with a \
                 particular key.",
                ParamGet(class),
                Scope::Plain,
            ));
            let settable = settable_fields(class);
            if !settable.is_empty() {
                t.push(spec(
                    &format!("{c}-param-set"),
                    &["uuid"],
                    settable,
                    "Sets the parameter specified.",
                    ParamSet(class),
                    Scope::Plain,
                ));
            }
        }
        t.sort_by(|a, b| a.name.cmp(&b.name));
        t
    })
}

/// The fields pvio can change through `<class>-param-set`.
fn settable_fields(class: Class) -> &'static [&'static str] {
    match class {
        Class::Vm => &[
            "name-label",
            "name-description",
            "VCPUs-max",
            "memory-static-max",
            "workload",
        ],
        Class::Sr | Class::Vdi | Class::Host => &["name-label", "name-description"],
        Class::Vbd | Class::Vif => &[],
    }
}

/// The command called `name`.
pub fn find(name: &str) -> Option<&'static CommandSpec> {
    commands().iter().find(|c| c.name == name)
}

/// Why a command failed, printed as xe prints it.
#[derive(Debug, thiserror::Error)]
pub enum XeError {
    #[error("Syntax error: {0}")]
    Syntax(#[from] SyntaxError),
    #[error("Required parameter not found: {0}")]
    MissingParam(String),
    #[error("Unknown parameter: {0}")]
    UnknownParam(String),
    #[error("Error: {0}")]
    Failure(String),
    #[error("{0}")]
    Api(#[from] ApiError),
    #[error("Error: {0}")]
    Client(ClientError),
    /// Some of several VMs failed.
    #[error("{}", .0.iter().map(|(u, m)| format!("operation failed on {u}: {m}")).collect::<Vec<_>>().join("\n"))]
    Multiple(Vec<(String, String)>),
}

impl XeError {
    fn is_usage(&self) -> bool {
        matches!(
            self,
            XeError::Syntax(_) | XeError::MissingParam(_) | XeError::UnknownParam(_)
        )
    }

    /// A server error about a field names it as the user typed it
    /// (`virtual-size`, `memory`, `VCPUs-max`), not as the API calls it.
    fn in_cli_words(self, typed: &Checked) -> Self {
        let XeError::Api(mut e) = self else {
            return self;
        };
        let about_a_field = [
            Code::InvalidValue,
            Code::ValueNotSupported,
            Code::FieldTypeError,
            Code::MissingParameter,
        ]
        .iter()
        .any(|c| e.is(*c));
        if let (true, Some(field)) = (about_a_field, e.params.first_mut()) {
            let cli = typed.params.keys().find(|k| {
                api_field_name(k) == *field
                    || (k.as_str() == "memory" && field == "memory_static_max")
            });
            if let Some(k) = cli {
                *field = k.clone();
            }
        }
        XeError::Api(e)
    }
}

impl From<ClientError> for XeError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Api(a) => XeError::Api(a),
            other => XeError::Client(other),
        }
    }
}

/// Where the CLI looks for toolstackd.
#[derive(Debug, Clone, Default)]
pub struct Env {
    /// `PVIO_TOOLSTACK_SOCKET`.
    pub toolstack_socket: Option<PathBuf>,
    /// `PVIO_STATE`.
    pub state: Option<PathBuf>,
}

impl Env {
    /// From the process environment.
    pub fn from_process() -> Env {
        let get = |k| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        Env {
            toolstack_socket: get("PVIO_TOOLSTACK_SOCKET"),
            state: get("PVIO_STATE"),
        }
    }

    /// The socket to use, given an explicit `--socket`.
    pub fn socket(&self, explicit: Option<PathBuf>) -> PathBuf {
        explicit
            .or_else(|| self.toolstack_socket.clone())
            .or_else(|| {
                self.state
                    .as_ref()
                    .map(|s| s.join(crate::server::SOCKET_FILE))
            })
            .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET))
    }
}

/// Runs command `name` with `args`, printing to stdout and stderr; returns
/// the exit status.
pub fn main(name: &str, args: &[String]) -> i32 {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let code = run(name, args, &Env::from_process(), &mut out, &mut err);
    let _ = std::io::stdout().write_all(&out);
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().write_all(&err);
    code
}

/// Runs command `name` with `args`, writing what it prints to `out` and
/// `err`; returns the exit status (0 or 1).
pub fn run(name: &str, args: &[String], env: &Env, out: &mut Vec<u8>, err: &mut Vec<u8>) -> i32 {
    let Some(cmd) = find(name) else {
        let _ = writeln!(err, "Unknown command: {name}\nFor usage run: 'pvio --help'");
        return 1;
    };
    let result = RawArgs::parse(args).map_err(XeError::from).and_then(|raw| {
        if raw.help {
            out.extend_from_slice(cmd.help_text().as_bytes());
            return Ok(());
        }
        let checked = check(cmd, &raw)?;
        let mut session = Session {
            socket: env.socket(raw.socket.clone()),
            client: None,
        };
        let text = execute(cmd, &checked, &mut session).map_err(|e| e.in_cli_words(&checked))?;
        out.extend_from_slice(text.as_bytes());
        Ok(())
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            let _ = writeln!(err, "{e}");
            if e.is_usage() {
                let _ = writeln!(err, "For usage run: 'pvio {name} --help'");
            }
            1
        }
    }
}

/// A command line checked against its command.
#[derive(Debug)]
struct Checked {
    params: HashMap<String, String>,
    filters: Vec<Filter>,
    /// `vm=NAME-OR-UUID`.
    vm_selector: Option<String>,
    minimal: bool,
}

impl Checked {
    fn get(&self, k: &str) -> Option<&str> {
        self.params.get(k).map(String::as_str)
    }

    fn req(&self, k: &str) -> &str {
        self.get(k).unwrap_or_default()
    }

    fn bool(&self, k: &str) -> Result<Option<bool>, XeError> {
        self.get(k)
            .map(|v| parse_bool(k, v).map_err(XeError::Failure))
            .transpose()
    }

    /// `prefix:key=value` entries as a map.
    fn map(&self, prefix: &str) -> Map<String, Value> {
        let mut m = Map::new();
        for (k, v) in &self.params {
            if let Some(key) = k.strip_prefix(prefix).and_then(|r| r.strip_prefix(':')) {
                m.insert(key.to_string(), Value::String(v.clone()));
            }
        }
        m
    }
}

/// Checks every parameter: required ones present, each one known, filters
/// resolved against their class.
fn check(cmd: &CommandSpec, raw: &RawArgs) -> Result<Checked, XeError> {
    let mut checked = Checked {
        params: HashMap::new(),
        filters: Vec::new(),
        vm_selector: None,
        minimal: false,
    };
    for (k, v) in &raw.pairs {
        if k == "minimal" {
            checked.minimal = parse_bool(k, v).map_err(XeError::Failure)?;
            continue;
        }
        let own = cmd.reqd.contains(&k.as_str())
            || cmd.optn.contains(&k.as_str())
            || cmd
                .optn
                .iter()
                .any(|o| o.ends_with(':') && k.len() > o.len() && k.starts_with(o));
        if own {
            checked.params.insert(k.clone(), v.clone());
            continue;
        }
        let class = match cmd.scope {
            Scope::Plain => None,
            Scope::Filters(c) => Some(c),
            Scope::VmSelectors if k == "vm" => {
                checked.vm_selector = Some(v.clone());
                continue;
            }
            Scope::VmSelectors => Some(Class::Vm),
        };
        let Some(class) = class else {
            return Err(XeError::UnknownParam(k.clone()));
        };
        if class == Class::Vm && k == "vm" {
            checked.vm_selector = Some(v.clone());
            continue;
        }
        let f = Filter::parse(class_def(class), k, v)
            .map_err(|e| XeError::UnknownParam(format!("{k} ({e})")))?;
        checked.filters.push(f);
    }
    for r in &cmd.reqd {
        if !checked.params.contains_key(*r) {
            return Err(XeError::MissingParam(r.to_string()));
        }
    }
    Ok(checked)
}

/// A connection made on first use.
struct Session {
    socket: PathBuf,
    client: Option<Client>,
}

impl Session {
    fn call(&mut self, method: &str, params: Value) -> Result<Value, XeError> {
        if self.client.is_none() {
            self.client = Some(Client::connect(&self.socket)?);
        }
        let c = self.client.as_mut().expect("just connected");
        Ok(c.call(method, params)?)
    }

    fn call_as<T: serde::de::DeserializeOwned>(
        &mut self,
        method: &str,
        params: Value,
    ) -> Result<T, XeError> {
        let v = self.call(method, params)?;
        serde_json::from_value(v)
            .map_err(|e| XeError::Client(ClientError::Protocol(format!("{method}: {e}"))))
    }

    fn all<T: serde::de::DeserializeOwned>(&mut self, class: Class) -> Result<Vec<T>, XeError> {
        self.call_as(
            &format!("{}.get_all_records", class.api_name()),
            Value::Null,
        )
    }

    fn one<T: serde::de::DeserializeOwned>(
        &mut self,
        class: Class,
        uuid: &str,
    ) -> Result<T, XeError> {
        self.call_as(
            &format!("{}.get_record", class.api_name()),
            json!({ "uuid": uuid }),
        )
    }
}

fn by_uuid<T>(items: Vec<T>, uuid: impl Fn(&T) -> &str) -> HashMap<String, T> {
    items
        .into_iter()
        .map(|i| (uuid(&i).to_string(), i))
        .collect()
}

/// Fetches the records of `class` (one, or all) with what they refer to;
/// guest metrics of running VMs only when `metrics`.
fn load(
    s: &mut Session,
    class: Class,
    uuid: Option<&str>,
    metrics: bool,
) -> Result<Vec<Record>, XeError> {
    fn fetch<T: serde::de::DeserializeOwned>(
        s: &mut Session,
        class: Class,
        uuid: Option<&str>,
    ) -> Result<Vec<T>, XeError> {
        match uuid {
            Some(u) => Ok(vec![s.one(class, u)?]),
            None => s.all(class),
        }
    }
    let mut ctx = Context::default();
    Ok(match class {
        Class::Vm => {
            let vms: Vec<VmRecord> = fetch(s, class, uuid)?;
            if metrics {
                for vm in vms.iter().filter(|v| v.power_state == PowerState::Running) {
                    let m = match s.call_as("VM.get_guest_metrics", json!({ "uuid": vm.uuid })) {
                        Ok(m) => Ok(m),
                        Err(e) => Err(e.to_string()),
                    };
                    ctx.guest_metrics.insert(vm.uuid.clone(), m);
                }
            }
            vms.iter().map(|v| records::vm_record(v, &ctx)).collect()
        }
        Class::Vbd => {
            let vbds: Vec<VbdRecord> = fetch(s, class, uuid)?;
            ctx.vms = by_uuid(s.all::<VmRecord>(Class::Vm)?, |v| &v.uuid);
            ctx.vdis = by_uuid(s.all::<VdiRecord>(Class::Vdi)?, |v| &v.uuid);
            vbds.iter().map(|v| records::vbd_record(v, &ctx)).collect()
        }
        Class::Vdi => {
            let vdis: Vec<VdiRecord> = fetch(s, class, uuid)?;
            ctx.srs = by_uuid(s.all::<SrRecord>(Class::Sr)?, |v| &v.uuid);
            vdis.iter().map(|v| records::vdi_record(v, &ctx)).collect()
        }
        Class::Sr => {
            let srs: Vec<SrRecord> = fetch(s, class, uuid)?;
            ctx.host = s.all::<HostRecord>(Class::Host)?.into_iter().next();
            srs.iter().map(|v| records::sr_record(v, &ctx)).collect()
        }
        Class::Vif => {
            let vifs: Vec<VifRecord> = fetch(s, class, uuid)?;
            ctx.vms = by_uuid(s.all::<VmRecord>(Class::Vm)?, |v| &v.uuid);
            vifs.iter().map(|v| records::vif_record(v, &ctx)).collect()
        }
        Class::Host => {
            let hosts: Vec<HostRecord> = fetch(s, class, uuid)?;
            hosts.iter().map(records::host_record).collect()
        }
    })
}

/// The fields `params=` asks for (None: the class's defaults).
fn selected_fields(class: &ClassDef, params: Option<&str>) -> Result<Vec<&'static str>, XeError> {
    match params {
        None => Ok(class.default_list.to_vec()),
        Some("all") => Ok(class.fields.iter().map(|f| f.name).collect()),
        Some(list) => list
            .split(',')
            .map(|n| {
                class.field(n.trim()).map(|f| f.name).ok_or_else(|| {
                    XeError::UnknownParam(format!(
                        "params: '{n}' is not a field of the {} class",
                        class.class.api_name()
                    ))
                })
            })
            .collect(),
    }
}

fn matches_vm_selector(r: &Record, sel: &str) -> bool {
    let field = |n| r.get(n).map(records::Value::render);
    field("uuid").as_deref() == Some(sel) || field("name-label").as_deref() == Some(sel)
}

fn minimal_or_line(value: &str, minimal: bool) -> String {
    if minimal {
        records::minimal_line(&[value.to_string()])
    } else {
        format!("{value}\n")
    }
}

fn execute(cmd: &CommandSpec, a: &Checked, s: &mut Session) -> Result<String, XeError> {
    use Action::*;
    let created = |s: &mut Session, method: &str, params: Value| -> Result<String, XeError> {
        let uuid: String = s.call_as(method, params)?;
        Ok(minimal_or_line(&uuid, a.minimal))
    };
    let done = |s: &mut Session, method: &str, params: Value| -> Result<String, XeError> {
        s.call(method, params)?;
        Ok(String::new())
    };
    match cmd.action {
        List(class) => {
            let def = class_def(class);
            let fields = selected_fields(def, a.get("params"))?;
            let metrics = fields.contains(&"guest-metrics")
                || a.filters.iter().any(|f| f.field().name == "guest-metrics");
            let records: Vec<Record> = load(s, class, None, metrics)?
                .into_iter()
                .filter(|r| a.filters.iter().all(|f| f.matches(r)))
                .filter(|r| {
                    a.vm_selector
                        .as_deref()
                        .is_none_or(|v| matches_vm_selector(r, v))
                })
                .map(|r| r.select(&fields))
                .collect();
            Ok(records::print_table(&records, a.minimal))
        }
        ParamList(class) => {
            let records = load(s, class, Some(a.req("uuid")), true)?;
            Ok(records::print_table(&records, a.minimal))
        }
        ParamGet(class) => {
            let def = class_def(class);
            let name = a.req("param-name");
            let field = def.field(name).ok_or_else(|| {
                XeError::Failure(format!(
                    "Parameter '{name}' is not a field of the {} class",
                    class.api_name()
                ))
            })?;
            let metrics = field.name == "guest-metrics";
            let record = load(s, class, Some(a.req("uuid")), metrics)?.remove(0);
            let value = record.get(field.name).expect("every field has a value");
            let text = match (a.get("param-key"), value) {
                (Some(key), records::Value::Map(m)) => m
                    .iter()
                    .find(|(k, _)| k == key)
                    .map(|(_, v)| v.clone())
                    .ok_or_else(|| XeError::Failure(format!("Key {key} not found in map")))?,
                _ => value.render(),
            };
            Ok(minimal_or_line(&text, a.minimal))
        }
        ParamSet(class) => {
            let mut p = Map::new();
            p.insert("uuid".into(), a.req("uuid").into());
            for (k, v) in &a.params {
                let value: Value = match k.as_str() {
                    "uuid" => continue,
                    "name-label" | "name-description" | "workload" => v.clone().into(),
                    "VCPUs-max" => parse_int(k, v).map_err(XeError::Failure)?.into(),
                    "memory-static-max" => parse_size(k, v).map_err(XeError::Failure)?.into(),
                    other => return Err(XeError::UnknownParam(other.to_string())),
                };
                p.insert(api_field_name(k), value);
            }
            done(s, &format!("{}.set", class.api_name()), Value::Object(p))
        }
        SrCreate => created(
            s,
            "SR.create",
            json!({
                "name_label": a.req("name-label"),
                "name_description": a.get("name-description").unwrap_or(""),
                "type": a.req("type"),
                "content_type": a.get("content-type").unwrap_or(""),
                "device_config": a.map("device-config"),
            }),
        ),
        SrDestroy => done(s, "SR.destroy", json!({ "uuid": a.req("uuid") })),
        VdiCreate => {
            let size =
                parse_size("virtual-size", a.req("virtual-size")).map_err(XeError::Failure)?;
            let sharable = a.bool("sharable")?.unwrap_or(false);
            let read_only = a.bool("read-only")?.unwrap_or(false);
            created(
                s,
                "VDI.create",
                json!({
                    "SR": a.req("sr-uuid"),
                    "name_label": a.req("name-label"),
                    "name_description": a.get("name-description").unwrap_or(""),
                    "virtual_size": size,
                    "sharable": sharable,
                    "read_only": read_only,
                }),
            )
        }
        VdiDestroy => done(s, "VDI.destroy", json!({ "uuid": a.req("uuid") })),
        VmCreate => {
            let mut p = Map::new();
            p.insert("name_label".into(), a.req("name-label").into());
            if let Some(d) = a.get("name-description") {
                p.insert("name_description".into(), d.into());
            }
            if let Some(v) = a.get("VCPUs-max") {
                let n = parse_int("VCPUs-max", v).map_err(XeError::Failure)?;
                p.insert("VCPUs_max".into(), n.into());
            }
            let memory = match (a.get("memory-static-max"), a.get("memory")) {
                (Some(_), Some(_)) => {
                    return Err(XeError::Failure(
                        "give memory or memory-static-max, not both".into(),
                    ))
                }
                (Some(m), None) => Some(("memory-static-max", m)),
                (None, Some(m)) => Some(("memory", m)),
                (None, None) => None,
            };
            if let Some((field, m)) = memory {
                let bytes = parse_size(field, m).map_err(XeError::Failure)?;
                p.insert("memory_static_max".into(), bytes.into());
            }
            if let Some(w) = a.get("workload") {
                p.insert("workload".into(), w.into());
            }
            created(s, "VM.create", Value::Object(p))
        }
        VmDestroy => done(s, "VM.destroy", json!({ "uuid": a.req("uuid") })),
        VmStart | VmShutdown => {
            let force = a.bool("force")?.unwrap_or(false);
            let multiple = a.bool("multiple")?.unwrap_or(false);
            let metrics = a.filters.iter().any(|f| f.field().name == "guest-metrics");
            let chosen: Vec<String> = load(s, Class::Vm, None, metrics)?
                .into_iter()
                .filter(|r| a.filters.iter().all(|f| f.matches(r)))
                .filter(|r| {
                    a.vm_selector
                        .as_deref()
                        .is_none_or(|v| matches_vm_selector(r, v))
                })
                .filter_map(|r| r.get("uuid").map(records::Value::render))
                .collect();
            let run = |s: &mut Session, uuid: &str| {
                if cmd.action == VmStart {
                    s.call("VM.start", json!({ "uuid": uuid }))
                } else {
                    s.call("VM.shutdown", json!({ "uuid": uuid, "force": force }))
                }
            };
            match chosen.len() {
                0 => Err(XeError::Failure("No matching VMs found".into())),
                1 => run(s, &chosen[0]).map(|_| String::new()),
                n if !multiple => Err(XeError::Failure(format!(
                    "{n} VMs match; add --multiple to act on all of them, or choose one by uuid"
                ))),
                _ => {
                    let failures: Vec<(String, String)> = chosen
                        .iter()
                        .filter_map(|u| run(s, u).err().map(|e| (u.clone(), e.to_string())))
                        .collect();
                    if failures.is_empty() {
                        Ok(String::new())
                    } else {
                        Err(XeError::Multiple(failures))
                    }
                }
            }
        }
        VbdCreate => {
            let mut p = Map::new();
            p.insert("VM".into(), a.req("vm-uuid").into());
            p.insert("VDI".into(), a.req("vdi-uuid").into());
            p.insert("userdevice".into(), a.req("device").into());
            if let Some(m) = a.get("mode") {
                p.insert("mode".into(), m.into());
            }
            if let Some(t) = a.get("type") {
                p.insert("type".into(), t.into());
            }
            if let Some(b) = a.bool("bootable")? {
                p.insert("bootable".into(), b.into());
            }
            if let Some(u) = a.bool("unpluggable")? {
                p.insert("unpluggable".into(), u.into());
            }
            created(s, "VBD.create", Value::Object(p))
        }
        VbdDestroy => done(s, "VBD.destroy", json!({ "uuid": a.req("uuid") })),
        VbdPlug => done(s, "VBD.plug", json!({ "uuid": a.req("uuid") })),
        VbdUnplug => {
            let force = a.bool("force")?.unwrap_or(false);
            done(
                s,
                "VBD.unplug",
                json!({ "uuid": a.req("uuid"), "force": force }),
            )
        }
        VifCreate => {
            let mut p = Map::new();
            p.insert("VM".into(), a.req("vm-uuid").into());
            p.insert("device".into(), a.req("device").into());
            if let Some(m) = a.get("mac") {
                p.insert("MAC".into(), m.into());
            }
            if let Some(n) = a.get("network") {
                p.insert("network".into(), n.into());
            }
            created(s, "VIF.create", Value::Object(p))
        }
        VifDestroy => done(s, "VIF.destroy", json!({ "uuid": a.req("uuid") })),
    }
}

/// The RPC parameter behind a CLI field (`VCPUs-max` → `VCPUs_max`).
fn api_field_name(cli: &str) -> String {
    cli.replace('-', "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| s.to_string()).collect()
    }

    fn run_offline(name: &str, w: &[&str]) -> (i32, String, String) {
        // A socket nobody listens on: commands that get past checking fail to connect.
        let env = Env {
            toolstack_socket: Some("/nonexistent/pvio-unit.sock".into()),
            state: None,
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run(name, &words(w), &env, &mut out, &mut err);
        (
            code,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    #[test]
    fn the_table_is_complete_and_consistent() {
        for name in [
            "sr-create",
            "sr-list",
            "vdi-create",
            "vdi-list",
            "vdi-destroy",
            "vm-create",
            "vm-list",
            "vm-start",
            "vm-shutdown",
            "vm-destroy",
            "vm-param-list",
            "vm-param-get",
            "vm-param-set",
            "vbd-create",
            "vbd-plug",
            "vbd-unplug",
            "vbd-list",
            "vbd-destroy",
            "host-param-list",
            "host-list",
            "vif-create",
            "vif-list",
            "vif-destroy",
        ] {
            let c = find(name).unwrap_or_else(|| panic!("{name} missing"));
            assert!(!c.summary().is_empty());
        }
        let names: Vec<_> = commands().iter().map(|c| c.name.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(names, sorted, "not sorted or duplicated");
    }

    #[test]
    fn help_lists_required_and_optional_parameters() {
        let (code, out, _) = run_offline("vdi-create", &["--help"]);
        assert_eq!(code, 0);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "command name            : vdi-create");
        assert_eq!(
            lines[1],
            "        reqd params     : sr-uuid, name-label, virtual-size"
        );
        assert_eq!(
            lines[2],
            "        optional params : name-description, sharable, read-only, --minimal"
        );
        assert!(lines[3].starts_with("        description     : Create a VDI"));
        let (_, out, _) = run_offline("vm-start", &["help"]);
        assert!(
            out.contains("<vm-selectors>") && out.contains("pseudo-field 'vm'"),
            "{out}"
        );
    }

    #[test]
    fn bad_command_lines_fail_before_connecting() {
        let cases: &[(&str, &[&str], &str)] = &[
            (
                "vdi-create",
                &["sr-uuid=x", "virtual-size=1GiB"],
                "Required parameter not found: name-label",
            ),
            (
                "vdi-create",
                &[
                    "sr-uuid=x",
                    "name-label=a",
                    "virtual-size=1GiB",
                    "colour=red",
                ],
                "Unknown parameter: colour",
            ),
            (
                "vdi-create",
                &["sr-uuid=x", "name-label=a", "virtual-size=big"],
                "Error: Failed to parse field 'virtual-size'",
            ),
            (
                "vdi-create",
                &[
                    "sr-uuid=x",
                    "name-label=a",
                    "virtual-size=1",
                    "sharable=perhaps",
                ],
                "'sharable'",
            ),
            (
                "vm-create",
                &["name-label=a", "VCPUs-max=two"],
                "'VCPUs-max'",
            ),
            (
                "vm-create",
                &["name-label=a", "memory=1", "memory-static-max=1"],
                "not both",
            ),
            ("vm-list", &["colour=red"], "Unknown parameter: colour"),
            (
                "vm-list",
                &["params=uuid,colour"],
                "'colour' is not a field of the VM class",
            ),
            ("vm-list", &["uuid:x=1"], "Unknown parameter: uuid:x"),
            (
                "vm-list",
                &["stray"],
                "Syntax error: expected key=value, got 'stray'",
            ),
            (
                "vm-param-get",
                &["uuid=x"],
                "Required parameter not found: param-name",
            ),
            ("vm-shutdown", &["colour=red"], "Unknown parameter: colour"),
            (
                "vbd-create",
                &["vm-uuid=a", "device=0"],
                "Required parameter not found: vdi-uuid",
            ),
            (
                "vm-param-set",
                &["uuid=a", "power-state=running"],
                "Unknown parameter: power-state",
            ),
        ];
        for (cmd, w, want) in cases {
            let (code, out, err) = run_offline(cmd, w);
            assert_eq!(code, 1, "{cmd} {w:?}");
            assert!(out.is_empty(), "{cmd} {w:?} printed {out}");
            assert!(err.contains(want), "{cmd} {w:?}: {err}");
            assert!(
                !err.contains("cannot reach"),
                "{cmd} {w:?} got as far as connecting: {err}"
            );
        }
        let (code, _, err) = run_offline("vm-list", &[]);
        assert_eq!(code, 1);
        assert!(
            err.contains("cannot reach toolstackd at /nonexistent/pvio-unit.sock"),
            "{err}"
        );
        let (code, _, err) = run_offline("vm-frobnicate", &[]);
        assert_eq!(code, 1);
        assert!(err.contains("Unknown command: vm-frobnicate"));
    }

    #[test]
    fn the_socket_comes_from_flag_env_state_or_default() {
        let mut env = Env::default();
        assert_eq!(env.socket(None), PathBuf::from(DEFAULT_SOCKET));
        env.state = Some("/st".into());
        assert_eq!(env.socket(None), PathBuf::from("/st/toolstackd.sock"));
        env.toolstack_socket = Some("/ts.sock".into());
        assert_eq!(env.socket(None), PathBuf::from("/ts.sock"));
        assert_eq!(env.socket(Some("/x".into())), PathBuf::from("/x"));
    }
}
