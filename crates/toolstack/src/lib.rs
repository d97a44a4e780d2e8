//! The toolstack of a pvio host, like xapi and `xe`: the objects (host,
//! SRs, VDIs, VMs, VBDs, VIFs) in a SQLite database, the `pvio toolstackd`
//! daemon that serves them over JSON-RPC and drives VM lifecycles through
//! the lifecycle engine ([`pvio_xenops`]), and the xe-style CLI commands
//! (`pvio vm-list`, `pvio vdi-create ...`) that talk to it.
//!
//! This crate owns the object model and every rule about it (uuids,
//! power states, one VBD per userdevice, VDI files created and deleted
//! with their records); it never runs a VM itself (that is xenops) and
//! never keeps a database lock across an await, so reads never wait
//! behind a VM start.
//!
//! # Files
//!
//! * [`model`]: the typed records; [`db`]: schema, migrations, queries;
//!   [`sr`]: the `file` SR and its VDI images; [`vbd`]: userdevices and
//!   device ids.
//! * [`api`]: the RPC methods; [`ops`]: one lifecycle operation per VM;
//!   [`rpc`]: the JSON-RPC envelope and a blocking client; [`server`]: the
//!   daemon.
//! * [`args`]: xe's argument syntax; [`records`]: fields, tags and xe's
//!   printer; [`xe`]: the commands.
//! * [`error`]: XenAPI error codes.
//!
//! # The database
//!
//! `<state>/toolstack.db` (WAL mode, foreign keys on, `schema_version`
//! table, migrated at open). One host row is made at the first start
//! (name-label = hostname). SRs default to `<state>/sr/<uuid>/`; a VDI is
//! `<sr location>/<uuid>.raw`, a sparse file made by `VDI.create` and
//! deleted by `VDI.destroy`. When toolstackd starts, every VM is recorded
//! halted: VMs do not survive their toolstack.
//!
//! # RPC
//!
//! JSON-RPC 2.0, one object per line, on `<state>/toolstackd.sock` (see
//! [`rpc`] for the envelope and error mapping). Parameters are named, with
//! XenAPI's field names; objects are named by uuid. Every method:
//!
//! | method | parameters | result |
//! |---|---|---|
//! | `system.listMethods` | | method names |
//! | `host.get_all_records`, `host.get_record` | `uuid` | [`model::HostRecord`]s |
//! | `host.set`, `SR.set`, `VDI.set` | `uuid`, `name_label`?, `name_description`? | null |
//! | `SR.create` | `name_label`, `type` (`file`), `name_description`?, `content_type`?, `device_config`? {`location`, `attach-delay-ms`} | uuid |
//! | `SR.destroy` | `uuid` (no VDIs left: else `SR_NOT_EMPTY`) | null |
//! | `SR.get_all_records`, `SR.get_record` | `uuid` | [`model::SrRecord`]s |
//! | `VDI.create` | `SR`, `name_label`, `virtual_size` (bytes, rounded up to 512), `name_description`?, `sharable`?, `read_only`? | uuid |
//! | `VDI.destroy` | `uuid` (no VBDs left: else `VDI_IN_USE`) | null |
//! | `VDI.get_all_records`, `VDI.get_record` | `uuid` | [`model::VdiRecord`]s |
//! | `VM.create` | `name_label`, `name_description`?, `VCPUs_max`? (1), `memory_static_max`? (256 MiB), `workload`? (`idle`) | uuid |
//! | `VM.set` | `uuid`, any of the above (`VCPUs_max`, `memory_static_max`, `workload` only while halted) | null |
//! | `VM.destroy` | `uuid` (halted; takes its VBDs and VIFs) | null |
//! | `VM.start` | `uuid` | null |
//! | `VM.shutdown` | `uuid`, `force`? | null |
//! | `VM.get_all_records`, `VM.get_record` | `uuid` | [`model::VmRecord`]s |
//! | `VM.get_guest_metrics` | `uuid` | `{key: value}` from the guest |
//! | `VBD.create` | `VM`, `VDI`, `userdevice` (0..=254 or `autodetect`), `mode`? (`RW`), `type`? (`Disk`), `bootable`?, `unpluggable`? (true) | uuid |
//! | `VBD.destroy` | `uuid` (not attached) | null |
//! | `VBD.plug`, `VBD.unplug` | `uuid`, `force`? (unplug) — VM running | null |
//! | `VBD.get_all_records`, `VBD.get_record` | `uuid` | [`model::VbdRecord`]s |
//! | `VIF.create` | `VM`, `device` (0..=254), `MAC`?, `network`? (`xenbr0`), `MTU`? (1500) | uuid |
//! | `VIF.destroy` | `uuid` | null |
//! | `VIF.get_all_records`, `VIF.get_record` | `uuid` | [`model::VifRecord`]s |
//!
//! Errors are XenAPI's ([`error::Code`]): `UUID_INVALID` for an unknown
//! object, `VM_BAD_POWER_STATE`, `OTHER_OPERATION_IN_PROGRESS` (a second
//! lifecycle call on a busy VM), `VDI_IN_USE`, `DEVICE_ALREADY_EXISTS`,
//! `DEVICE_ALREADY_ATTACHED`/`DETACHED`, `INVALID_VALUE`, and pvio's
//! `MISSING_PARAMETER`/`UNKNOWN_PARAMETER`.
//!
//! # The CLI
//!
//! See [`xe`]: xe's commands, parameters and output, byte for byte where
//! xe defines it ([`records`]).

pub mod api;
pub mod args;
pub mod db;
pub mod error;
pub mod model;
pub mod ops;
pub mod records;
pub mod rpc;
pub mod server;
pub mod sr;
pub mod vbd;
pub mod xe;

pub use error::{ApiError, Code};
