//! Checks pvio's ABI definitions against Xen's own C headers.
//!
//! `c/xen_layout.c` is compiled against `/usr/include/xen` (Debian's
//! libxen-dev, installed by `scripts/install-deps.sh`) and prints the size of
//! every structure, the offset of every field, the computed ring sizes and
//! the protocol constants. Every line it prints must have a Rust counterpart
//! with the same value, so a field added to the C side without a Rust twin
//! fails too.

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

use pvio_abi::blkif::*;
use pvio_abi::event_channel::*;
use pvio_abi::grant_table::*;
use pvio_abi::netif::*;
use pvio_abi::ring::*;
use pvio_abi::xenbus::XenbusState;
use pvio_abi::xs_wire::*;

fn c_layout() -> String {
    let hdr = PathBuf::from("/usr/include/xen/io/ring.h");
    assert!(
        hdr.exists(),
        "{} is missing: install Debian's libxen-dev (scripts/install-deps.sh does)",
        hdr.display()
    );
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/xen_layout.c");
    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let exe = out_dir.join("xen_layout");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = Command::new(&cc)
        .args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O0", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    assert!(status.success(), "compiling {} failed", src.display());
    let out = Command::new(&exe).output().expect("run xen_layout");
    assert!(out.status.success());
    String::from_utf8(out.stdout).expect("utf8")
}

/// Everything the Rust side claims, keyed like the C program's output.
fn rust_layout() -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    let mut put = |k: String, v: String| {
        assert!(m.insert(k.clone(), v).is_none(), "duplicate key {k}");
    };
    macro_rules! size {
        ($c:literal, $t:ty) => {
            put(format!("size {}", $c), size_of::<$t>().to_string())
        };
    }
    macro_rules! off {
        ($c:literal, $t:ty, $f:ident) => {
            put(format!("off {}", $c), offset_of!($t, $f).to_string())
        };
        ($c:literal, $v:expr) => {
            put(format!("off {}", $c), ($v).to_string())
        };
    }
    macro_rules! constant {
        ($c:literal, $v:expr) => {
            put(format!("const {}", $c), (($v) as i64).to_string())
        };
    }

    // ring.h: the C struct has one slot of `ring[1]`, so its size is 64 + 112.
    put(
        "size blkif_sring".into(),
        (SRING_HEADER_SIZE + Blkif::SLOT_SIZE).to_string(),
    );
    off!("blkif_sring.req_prod", SringHeader, req_prod);
    off!("blkif_sring.req_event", SringHeader, req_event);
    off!("blkif_sring.rsp_prod", SringHeader, rsp_prod);
    off!("blkif_sring.rsp_event", SringHeader, rsp_event);
    off!("blkif_sring.pvt", SringHeader, pvt);
    off!("blkif_sring.__pad", SringHeader, pad);
    off!("blkif_sring.ring", SRING_HEADER_SIZE);
    put(
        "size blkif_sring_entry".into(),
        Blkif::SLOT_SIZE.to_string(),
    );
    put(
        "size netif_tx_sring_entry".into(),
        NetifTx::SLOT_SIZE.to_string(),
    );
    put(
        "size netif_rx_sring_entry".into(),
        NetifRx::SLOT_SIZE.to_string(),
    );
    put(
        "size xen_netif_ctrl_sring_entry".into(),
        NetifCtrl::SLOT_SIZE.to_string(),
    );
    for order in 0..=BLKIF_MAX_RING_PAGE_ORDER {
        put(
            format!("ring blkif {order}"),
            blkif_ring_size(order).to_string(),
        );
    }
    put(
        "ring netif_tx 0".into(),
        NetifTx::ring_size_for_pages(1).to_string(),
    );
    put(
        "ring netif_rx 0".into(),
        NetifRx::ring_size_for_pages(1).to_string(),
    );
    put(
        "ring xen_netif_ctrl 0".into(),
        NetifCtrl::ring_size_for_pages(1).to_string(),
    );

    // blkif.h
    size!("blkif_request_segment", BlkifRequestSegment);
    off!("blkif_request_segment.gref", BlkifRequestSegment, gref);
    off!(
        "blkif_request_segment.first_sect",
        BlkifRequestSegment,
        first_sect
    );
    off!(
        "blkif_request_segment.last_sect",
        BlkifRequestSegment,
        last_sect
    );
    size!("blkif_request", BlkifRequest);
    off!("blkif_request.operation", BlkifRequest, operation);
    off!("blkif_request.nr_segments", BlkifRequest, nr_segments);
    off!("blkif_request.handle", BlkifRequest, handle);
    off!("blkif_request.id", BlkifRequest, id);
    off!("blkif_request.sector_number", BlkifRequest, sector_number);
    off!("blkif_request.seg", BlkifRequest, seg);
    size!("blkif_request_discard", BlkifRequestDiscard);
    off!(
        "blkif_request_discard.operation",
        BlkifRequestDiscard,
        operation
    );
    off!("blkif_request_discard.flag", BlkifRequestDiscard, flag);
    off!("blkif_request_discard.handle", BlkifRequestDiscard, handle);
    off!("blkif_request_discard.id", BlkifRequestDiscard, id);
    off!(
        "blkif_request_discard.sector_number",
        BlkifRequestDiscard,
        sector_number
    );
    off!(
        "blkif_request_discard.nr_sectors",
        BlkifRequestDiscard,
        nr_sectors
    );
    size!("blkif_request_indirect", BlkifRequestIndirect);
    off!(
        "blkif_request_indirect.operation",
        BlkifRequestIndirect,
        operation
    );
    off!(
        "blkif_request_indirect.indirect_op",
        BlkifRequestIndirect,
        indirect_op
    );
    off!(
        "blkif_request_indirect.nr_segments",
        BlkifRequestIndirect,
        nr_segments
    );
    off!("blkif_request_indirect.id", BlkifRequestIndirect, id);
    off!(
        "blkif_request_indirect.sector_number",
        BlkifRequestIndirect,
        sector_number
    );
    off!(
        "blkif_request_indirect.handle",
        BlkifRequestIndirect,
        handle
    );
    off!(
        "blkif_request_indirect.indirect_grefs",
        BlkifRequestIndirect,
        indirect_grefs
    );
    size!("blkif_response", BlkifResponse);
    off!("blkif_response.id", BlkifResponse, id);
    off!("blkif_response.operation", BlkifResponse, operation);
    off!("blkif_response.status", BlkifResponse, status);
    constant!("BLKIF_OP_READ", BLKIF_OP_READ);
    constant!("BLKIF_OP_WRITE", BLKIF_OP_WRITE);
    constant!("BLKIF_OP_WRITE_BARRIER", BLKIF_OP_WRITE_BARRIER);
    constant!("BLKIF_OP_FLUSH_DISKCACHE", BLKIF_OP_FLUSH_DISKCACHE);
    constant!("BLKIF_OP_RESERVED_1", BLKIF_OP_RESERVED_1);
    constant!("BLKIF_OP_DISCARD", BLKIF_OP_DISCARD);
    constant!("BLKIF_OP_INDIRECT", BLKIF_OP_INDIRECT);
    constant!("BLKIF_DISCARD_SECURE", BLKIF_DISCARD_SECURE);
    constant!(
        "BLKIF_MAX_SEGMENTS_PER_REQUEST",
        BLKIF_MAX_SEGMENTS_PER_REQUEST
    );
    constant!(
        "BLKIF_MAX_INDIRECT_PAGES_PER_REQUEST",
        BLKIF_MAX_INDIRECT_PAGES_PER_REQUEST
    );
    constant!("BLKIF_RSP_OKAY", BLKIF_RSP_OKAY);
    constant!("BLKIF_RSP_ERROR", BLKIF_RSP_ERROR);
    constant!("BLKIF_RSP_EOPNOTSUPP", BLKIF_RSP_EOPNOTSUPP);
    constant!("VDISK_CDROM", VDISK_CDROM);
    constant!("VDISK_REMOVABLE", VDISK_REMOVABLE);
    constant!("VDISK_READONLY", VDISK_READONLY);

    // netif.h
    size!("netif_tx_request", NetifTxRequest);
    off!("netif_tx_request.gref", NetifTxRequest, gref);
    off!("netif_tx_request.offset", NetifTxRequest, offset);
    off!("netif_tx_request.flags", NetifTxRequest, flags);
    off!("netif_tx_request.id", NetifTxRequest, id);
    off!("netif_tx_request.size", NetifTxRequest, size);
    size!("netif_tx_response", NetifTxResponse);
    off!("netif_tx_response.id", NetifTxResponse, id);
    off!("netif_tx_response.status", NetifTxResponse, status);
    size!("netif_rx_request", NetifRxRequest);
    off!("netif_rx_request.id", NetifRxRequest, id);
    off!("netif_rx_request.pad", NetifRxRequest, pad);
    off!("netif_rx_request.gref", NetifRxRequest, gref);
    size!("netif_rx_response", NetifRxResponse);
    off!("netif_rx_response.id", NetifRxResponse, id);
    off!("netif_rx_response.offset", NetifRxResponse, offset);
    off!("netif_rx_response.flags", NetifRxResponse, flags);
    off!("netif_rx_response.status", NetifRxResponse, status);
    size!("netif_extra_info", NetifExtraInfo);
    let u = offset_of!(NetifExtraInfo, u);
    off!("netif_extra_info.type", NetifExtraInfo, type_);
    off!("netif_extra_info.flags", NetifExtraInfo, flags);
    off!("netif_extra_info.u", u);
    off!(
        "netif_extra_info.u.gso.size",
        u + offset_of!(NetifExtraGso, size)
    );
    off!(
        "netif_extra_info.u.gso.type",
        u + offset_of!(NetifExtraGso, type_)
    );
    off!(
        "netif_extra_info.u.gso.pad",
        u + offset_of!(NetifExtraGso, pad)
    );
    off!(
        "netif_extra_info.u.gso.features",
        u + offset_of!(NetifExtraGso, features)
    );
    off!(
        "netif_extra_info.u.mcast.addr",
        u + offset_of!(NetifExtraMcast, addr)
    );
    off!(
        "netif_extra_info.u.hash.type",
        u + offset_of!(NetifExtraHash, type_)
    );
    off!(
        "netif_extra_info.u.hash.algorithm",
        u + offset_of!(NetifExtraHash, algorithm)
    );
    off!(
        "netif_extra_info.u.hash.value",
        u + offset_of!(NetifExtraHash, value)
    );
    size!("xen_netif_ctrl_request", XenNetifCtrlRequest);
    off!("xen_netif_ctrl_request.id", XenNetifCtrlRequest, id);
    off!("xen_netif_ctrl_request.type", XenNetifCtrlRequest, type_);
    off!("xen_netif_ctrl_request.data", XenNetifCtrlRequest, data);
    size!("xen_netif_ctrl_response", XenNetifCtrlResponse);
    off!("xen_netif_ctrl_response.id", XenNetifCtrlResponse, id);
    off!("xen_netif_ctrl_response.type", XenNetifCtrlResponse, type_);
    off!(
        "xen_netif_ctrl_response.status",
        XenNetifCtrlResponse,
        status
    );
    off!("xen_netif_ctrl_response.data", XenNetifCtrlResponse, data);
    size!("xen_netif_gref", XenNetifGref);
    off!("xen_netif_gref.ref", XenNetifGref, ref_);
    off!("xen_netif_gref.flags", XenNetifGref, flags);
    off!("xen_netif_gref.status", XenNetifGref, status);
    constant!("XEN_NETIF_NR_SLOTS_MIN", XEN_NETIF_NR_SLOTS_MIN);
    constant!("XEN_NETIF_MAX_TX_SIZE", XEN_NETIF_MAX_TX_SIZE);
    constant!("NETTXF_csum_blank", NETTXF_CSUM_BLANK);
    constant!("NETTXF_data_validated", NETTXF_DATA_VALIDATED);
    constant!("NETTXF_more_data", NETTXF_MORE_DATA);
    constant!("NETTXF_extra_info", NETTXF_EXTRA_INFO);
    constant!("NETRXF_data_validated", NETRXF_DATA_VALIDATED);
    constant!("NETRXF_csum_blank", NETRXF_CSUM_BLANK);
    constant!("NETRXF_more_data", NETRXF_MORE_DATA);
    constant!("NETRXF_extra_info", NETRXF_EXTRA_INFO);
    constant!("NETRXF_gso_prefix", NETRXF_GSO_PREFIX);
    constant!("NETIF_RSP_DROPPED", NETIF_RSP_DROPPED);
    constant!("NETIF_RSP_ERROR", NETIF_RSP_ERROR);
    constant!("NETIF_RSP_OKAY", NETIF_RSP_OKAY);
    constant!("NETIF_RSP_NULL", NETIF_RSP_NULL);
    constant!("XEN_NETIF_EXTRA_TYPE_NONE", XEN_NETIF_EXTRA_TYPE_NONE);
    constant!("XEN_NETIF_EXTRA_TYPE_GSO", XEN_NETIF_EXTRA_TYPE_GSO);
    constant!(
        "XEN_NETIF_EXTRA_TYPE_MCAST_ADD",
        XEN_NETIF_EXTRA_TYPE_MCAST_ADD
    );
    constant!(
        "XEN_NETIF_EXTRA_TYPE_MCAST_DEL",
        XEN_NETIF_EXTRA_TYPE_MCAST_DEL
    );
    constant!("XEN_NETIF_EXTRA_TYPE_HASH", XEN_NETIF_EXTRA_TYPE_HASH);
    constant!("XEN_NETIF_EXTRA_TYPE_MAX", XEN_NETIF_EXTRA_TYPE_MAX);
    constant!("XEN_NETIF_EXTRA_FLAG_MORE", XEN_NETIF_EXTRA_FLAG_MORE);
    constant!("XEN_NETIF_GSO_TYPE_NONE", XEN_NETIF_GSO_TYPE_NONE);
    constant!("XEN_NETIF_GSO_TYPE_TCPV4", XEN_NETIF_GSO_TYPE_TCPV4);
    constant!("XEN_NETIF_GSO_TYPE_TCPV6", XEN_NETIF_GSO_TYPE_TCPV6);
    constant!("XEN_NETIF_CTRL_TYPE_INVALID", ctrl_type::INVALID);
    constant!(
        "XEN_NETIF_CTRL_TYPE_GET_HASH_FLAGS",
        ctrl_type::GET_HASH_FLAGS
    );
    constant!(
        "XEN_NETIF_CTRL_TYPE_SET_HASH_FLAGS",
        ctrl_type::SET_HASH_FLAGS
    );
    constant!("XEN_NETIF_CTRL_TYPE_SET_HASH_KEY", ctrl_type::SET_HASH_KEY);
    constant!(
        "XEN_NETIF_CTRL_TYPE_GET_HASH_MAPPING_SIZE",
        ctrl_type::GET_HASH_MAPPING_SIZE
    );
    constant!(
        "XEN_NETIF_CTRL_TYPE_SET_HASH_MAPPING_SIZE",
        ctrl_type::SET_HASH_MAPPING_SIZE
    );
    constant!(
        "XEN_NETIF_CTRL_TYPE_SET_HASH_MAPPING",
        ctrl_type::SET_HASH_MAPPING
    );
    constant!(
        "XEN_NETIF_CTRL_TYPE_SET_HASH_ALGORITHM",
        ctrl_type::SET_HASH_ALGORITHM
    );
    constant!(
        "XEN_NETIF_CTRL_TYPE_GET_GREF_MAPPING_SIZE",
        ctrl_type::GET_GREF_MAPPING_SIZE
    );
    constant!(
        "XEN_NETIF_CTRL_TYPE_ADD_GREF_MAPPING",
        ctrl_type::ADD_GREF_MAPPING
    );
    constant!(
        "XEN_NETIF_CTRL_TYPE_DEL_GREF_MAPPING",
        ctrl_type::DEL_GREF_MAPPING
    );
    constant!("XEN_NETIF_CTRL_STATUS_SUCCESS", ctrl_status::SUCCESS);
    constant!(
        "XEN_NETIF_CTRL_STATUS_NOT_SUPPORTED",
        ctrl_status::NOT_SUPPORTED
    );
    constant!(
        "XEN_NETIF_CTRL_STATUS_INVALID_PARAMETER",
        ctrl_status::INVALID_PARAMETER
    );
    constant!(
        "XEN_NETIF_CTRL_STATUS_BUFFER_OVERFLOW",
        ctrl_status::BUFFER_OVERFLOW
    );
    constant!("XEN_NETIF_CTRL_HASH_TYPE_IPV4", hash_type::IPV4);
    constant!("XEN_NETIF_CTRL_HASH_TYPE_IPV4_TCP", hash_type::IPV4_TCP);
    constant!("XEN_NETIF_CTRL_HASH_TYPE_IPV6", hash_type::IPV6);
    constant!("XEN_NETIF_CTRL_HASH_TYPE_IPV6_TCP", hash_type::IPV6_TCP);
    constant!(
        "XEN_NETIF_CTRL_HASH_ALGORITHM_NONE",
        XEN_NETIF_CTRL_HASH_ALGORITHM_NONE
    );
    constant!(
        "XEN_NETIF_CTRL_HASH_ALGORITHM_TOEPLITZ",
        XEN_NETIF_CTRL_HASH_ALGORITHM_TOEPLITZ
    );

    // xs_wire.h
    size!("xsd_sockmsg", XsdSockmsg);
    off!("xsd_sockmsg.type", XsdSockmsg, type_);
    off!("xsd_sockmsg.req_id", XsdSockmsg, req_id);
    off!("xsd_sockmsg.tx_id", XsdSockmsg, tx_id);
    off!("xsd_sockmsg.len", XsdSockmsg, len);
    size!("xenstore_domain_interface", XenstoreDomainInterface);
    off!(
        "xenstore_domain_interface.req",
        XenstoreDomainInterface,
        req
    );
    off!(
        "xenstore_domain_interface.rsp",
        XenstoreDomainInterface,
        rsp
    );
    off!(
        "xenstore_domain_interface.req_cons",
        XenstoreDomainInterface,
        req_cons
    );
    off!(
        "xenstore_domain_interface.req_prod",
        XenstoreDomainInterface,
        req_prod
    );
    off!(
        "xenstore_domain_interface.rsp_cons",
        XenstoreDomainInterface,
        rsp_cons
    );
    off!(
        "xenstore_domain_interface.rsp_prod",
        XenstoreDomainInterface,
        rsp_prod
    );
    off!(
        "xenstore_domain_interface.server_features",
        XenstoreDomainInterface,
        server_features
    );
    off!(
        "xenstore_domain_interface.connection",
        XenstoreDomainInterface,
        connection
    );
    off!(
        "xenstore_domain_interface.error",
        XenstoreDomainInterface,
        error
    );
    for t in XsdSockmsgType::ALL {
        put(format!("const {}", t.name()), (t as u32).to_string());
    }
    constant!("XS_TYPE_COUNT", XS_TYPE_COUNT);
    constant!("XS_INVALID", XS_INVALID);
    constant!("XS_WATCH_PATH", XS_WATCH_PATH);
    constant!("XS_WATCH_TOKEN", XS_WATCH_TOKEN);
    constant!("XENSTORE_PAYLOAD_MAX", XENSTORE_PAYLOAD_MAX);
    constant!("XENSTORE_ABS_PATH_MAX", XENSTORE_ABS_PATH_MAX);
    constant!("XENSTORE_REL_PATH_MAX", XENSTORE_REL_PATH_MAX);
    constant!("XENSTORE_RING_SIZE", XENSTORE_RING_SIZE);
    constant!(
        "XENSTORE_SERVER_FEATURE_RECONNECTION",
        XENSTORE_SERVER_FEATURE_RECONNECTION
    );
    constant!(
        "XENSTORE_SERVER_FEATURE_ERROR",
        XENSTORE_SERVER_FEATURE_ERROR
    );
    constant!("XENSTORE_CONNECTED", XENSTORE_CONNECTED);
    constant!("XENSTORE_RECONNECT", XENSTORE_RECONNECT);
    constant!("XENSTORE_ERROR_NONE", XENSTORE_ERROR_NONE);
    constant!("XENSTORE_ERROR_COMM", XENSTORE_ERROR_COMM);
    constant!("XENSTORE_ERROR_RINGIDX", XENSTORE_ERROR_RINGIDX);
    constant!("XENSTORE_ERROR_PROTO", XENSTORE_ERROR_PROTO);
    for (i, (errno, name)) in XSD_ERRORS.iter().enumerate() {
        put(format!("xserr {i}"), format!("{errno} {name}"));
    }

    // grant_table.h
    size!("grant_entry_v1", GrantEntryV1);
    off!("grant_entry_v1.flags", GrantEntryV1, flags);
    off!("grant_entry_v1.domid", GrantEntryV1, domid);
    off!("grant_entry_v1.frame", GrantEntryV1, frame);
    constant!("GNTTAB_NR_RESERVED_ENTRIES", GNTTAB_NR_RESERVED_ENTRIES);
    constant!("GNTTAB_RESERVED_CONSOLE", GNTTAB_RESERVED_CONSOLE);
    constant!("GNTTAB_RESERVED_XENSTORE", GNTTAB_RESERVED_XENSTORE);
    constant!("GTF_invalid", GTF_INVALID);
    constant!("GTF_permit_access", GTF_PERMIT_ACCESS);
    constant!("GTF_accept_transfer", GTF_ACCEPT_TRANSFER);
    constant!("GTF_transitive", GTF_TRANSITIVE);
    constant!("GTF_type_mask", GTF_TYPE_MASK);
    constant!("GTF_readonly", GTF_READONLY);
    constant!("GTF_reading", GTF_READING);
    constant!("GTF_writing", GTF_WRITING);
    constant!("GTF_PWT", GTF_PWT);
    constant!("GTF_PCD", GTF_PCD);
    constant!("GTF_PAT", GTF_PAT);
    constant!("GTF_sub_page", GTF_SUB_PAGE);
    constant!("GTF_transfer_committed", GTF_TRANSFER_COMMITTED);
    constant!("GTF_transfer_completed", GTF_TRANSFER_COMPLETED);
    constant!("GNTMAP_device_map", GNTMAP_DEVICE_MAP);
    constant!("GNTMAP_host_map", GNTMAP_HOST_MAP);
    constant!("GNTMAP_readonly", GNTMAP_READONLY);
    constant!("GNTMAP_application_map", GNTMAP_APPLICATION_MAP);
    constant!("GNTMAP_contains_pte", GNTMAP_CONTAINS_PTE);
    constant!(
        "GNTTABOP_map_grant_ref",
        pvio_abi::grant_table::op::MAP_GRANT_REF
    );
    constant!(
        "GNTTABOP_unmap_grant_ref",
        pvio_abi::grant_table::op::UNMAP_GRANT_REF
    );
    constant!(
        "GNTTABOP_setup_table",
        pvio_abi::grant_table::op::SETUP_TABLE
    );
    constant!("GNTTABOP_dump_table", pvio_abi::grant_table::op::DUMP_TABLE);
    constant!("GNTTABOP_transfer", pvio_abi::grant_table::op::TRANSFER);
    constant!("GNTTABOP_copy", pvio_abi::grant_table::op::COPY);
    constant!("GNTTABOP_query_size", pvio_abi::grant_table::op::QUERY_SIZE);
    constant!(
        "GNTTABOP_unmap_and_replace",
        pvio_abi::grant_table::op::UNMAP_AND_REPLACE
    );
    constant!(
        "GNTTABOP_set_version",
        pvio_abi::grant_table::op::SET_VERSION
    );
    constant!(
        "GNTTABOP_get_status_frames",
        pvio_abi::grant_table::op::GET_STATUS_FRAMES
    );
    constant!(
        "GNTTABOP_get_version",
        pvio_abi::grant_table::op::GET_VERSION
    );
    constant!(
        "GNTTABOP_swap_grant_ref",
        pvio_abi::grant_table::op::SWAP_GRANT_REF
    );
    constant!(
        "GNTTABOP_cache_flush",
        pvio_abi::grant_table::op::CACHE_FLUSH
    );
    for s in GntStatus::ALL {
        let c = match s {
            GntStatus::Okay => "okay",
            GntStatus::GeneralError => "general_error",
            GntStatus::BadDomain => "bad_domain",
            GntStatus::BadGntref => "bad_gntref",
            GntStatus::BadHandle => "bad_handle",
            GntStatus::BadVirtAddr => "bad_virt_addr",
            GntStatus::BadDevAddr => "bad_dev_addr",
            GntStatus::NoDeviceSpace => "no_device_space",
            GntStatus::PermissionDenied => "permission_denied",
            GntStatus::BadPage => "bad_page",
            GntStatus::BadCopyArg => "bad_copy_arg",
            GntStatus::AddressTooBig => "address_too_big",
            GntStatus::Eagain => "eagain",
            GntStatus::NoSpace => "no_space",
        };
        put(format!("const GNTST_{c}"), (s as i16).to_string());
    }

    // event_channel.h
    use pvio_abi::event_channel::op as ev;
    constant!("EVTCHNOP_bind_interdomain", ev::BIND_INTERDOMAIN);
    constant!("EVTCHNOP_bind_virq", ev::BIND_VIRQ);
    constant!("EVTCHNOP_bind_pirq", ev::BIND_PIRQ);
    constant!("EVTCHNOP_close", ev::CLOSE);
    constant!("EVTCHNOP_send", ev::SEND);
    constant!("EVTCHNOP_status", ev::STATUS);
    constant!("EVTCHNOP_alloc_unbound", ev::ALLOC_UNBOUND);
    constant!("EVTCHNOP_bind_ipi", ev::BIND_IPI);
    constant!("EVTCHNOP_bind_vcpu", ev::BIND_VCPU);
    constant!("EVTCHNOP_unmask", ev::UNMASK);
    constant!("EVTCHNOP_reset", ev::RESET);
    constant!("EVTCHNOP_init_control", ev::INIT_CONTROL);
    constant!("EVTCHNOP_expand_array", ev::EXPAND_ARRAY);
    constant!("EVTCHNOP_set_priority", ev::SET_PRIORITY);
    constant!("EVTCHNSTAT_closed", EvtchnStat::Closed);
    constant!("EVTCHNSTAT_unbound", EvtchnStat::Unbound);
    constant!("EVTCHNSTAT_interdomain", EvtchnStat::Interdomain);
    constant!("EVTCHNSTAT_pirq", EvtchnStat::Pirq);
    constant!("EVTCHNSTAT_virq", EvtchnStat::Virq);
    constant!("EVTCHNSTAT_ipi", EvtchnStat::Ipi);
    constant!("EVTCHN_2L_NR_CHANNELS", EVTCHN_2L_NR_CHANNELS_64);
    constant!("EVTCHN_FIFO_LINK_BITS", EVTCHN_FIFO_LINK_BITS);
    constant!("EVTCHN_FIFO_NR_CHANNELS", EVTCHN_FIFO_NR_CHANNELS);
    constant!("DOMID_SELF", pvio_abi::DOMID_SELF);
    constant!("DOMID_MASK", pvio_abi::DOMID_MASK);

    // xenbus.h
    for s in XenbusState::ALL {
        put(
            format!("const XenbusState{}", s.name()),
            (s as u32).to_string(),
        );
    }

    put(
        "str XEN_IO_PROTO_ABI_X86_64".into(),
        pvio_abi::XEN_IO_PROTO_ABI_X86_64.into(),
    );
    put(
        "str XEN_IO_PROTO_ABI_X86_32".into(),
        pvio_abi::XEN_IO_PROTO_ABI_X86_32.into(),
    );
    put(
        "str XEN_IO_PROTO_ABI_ARM".into(),
        pvio_abi::XEN_IO_PROTO_ABI_ARM.into(),
    );
    m
}

#[test]
fn rust_definitions_match_xen_headers() {
    let c = c_layout();
    let rust = rust_layout();
    let mut seen = 0;
    let mut wrong = Vec::new();
    for line in c.lines() {
        let (key, value) = match line.rsplit_once(' ') {
            // Error-table lines carry two values: "xserr <i> <errno> <name>".
            Some(_) if line.starts_with("xserr ") => {
                let mut it = line.splitn(3, ' ');
                let (_, i, rest) = (it.next(), it.next().unwrap(), it.next().unwrap());
                (format!("xserr {i}"), rest.to_string())
            }
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => panic!("unparsable line from xen_layout: {line:?}"),
        };
        seen += 1;
        match rust.get(&key) {
            Some(v) if *v == value => {}
            Some(v) => wrong.push(format!("{key}: C says {value}, Rust says {v}")),
            None => wrong.push(format!("{key}: C says {value}, Rust has no definition")),
        }
    }
    assert!(wrong.is_empty(), "ABI mismatches:\n{}", wrong.join("\n"));
    assert_eq!(
        seen,
        rust.len(),
        "Rust checks keys the C program never printed"
    );
}
