/*
 * Prints the size and field offsets of Xen's PV wire structures, as compiled
 * against the real headers in /usr/include/xen (Debian's libxen-dev).
 * crates/abi/tests/xen_headers.rs compiles and runs this program and checks
 * that pvio's Rust definitions agree line by line.
 *
 * Output lines:  size <struct> <bytes>
 *                off <struct>.<field> <bytes>
 *                const <NAME> <value>
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <errno.h>

/* Ask for the newest interface, as a current toolstack does. */
#define __XEN_INTERFACE_VERSION__ 0x00040e00
#include <xen/xen.h>
#include <xen/grant_table.h>
#include <xen/event_channel.h>
#include <xen/io/ring.h>
#include <xen/io/blkif.h>
#include <xen/io/netif.h>
#include <xen/io/xenbus.h>
#include <xen/io/xs_wire.h>
#include <xen/io/protocols.h>

#define SIZE(s) printf("size %s %zu\n", #s, sizeof(struct s))
#define OFF(s, f) printf("off %s.%s %zu\n", #s, #f, offsetof(struct s, f))
#define CONST(n) printf("const %s %lld\n", #n, (long long)(n))

/* A multi-page blkif ring of 2^order pages, as a backend sizes it. */
#define BLKIF_RING_SIZE_ORDER(o) __CONST_RING_SIZE(blkif, (1UL << (o)) * 4096)

int main(void)
{
    /* io/ring.h: the shared ring header, via the blkif instance. */
    SIZE(blkif_sring);
    OFF(blkif_sring, req_prod);
    OFF(blkif_sring, req_event);
    OFF(blkif_sring, rsp_prod);
    OFF(blkif_sring, rsp_event);
    OFF(blkif_sring, pvt);
    OFF(blkif_sring, __pad);
    OFF(blkif_sring, ring);
    printf("size blkif_sring_entry %zu\n", sizeof(union blkif_sring_entry));
    printf("size netif_tx_sring_entry %zu\n", sizeof(union netif_tx_sring_entry));
    printf("size netif_rx_sring_entry %zu\n", sizeof(union netif_rx_sring_entry));
    printf("size xen_netif_ctrl_sring_entry %zu\n", sizeof(union xen_netif_ctrl_sring_entry));
    printf("ring blkif 0 %lu\n", (unsigned long)BLKIF_RING_SIZE_ORDER(0));
    printf("ring blkif 1 %lu\n", (unsigned long)BLKIF_RING_SIZE_ORDER(1));
    printf("ring blkif 2 %lu\n", (unsigned long)BLKIF_RING_SIZE_ORDER(2));
    printf("ring blkif 3 %lu\n", (unsigned long)BLKIF_RING_SIZE_ORDER(3));
    printf("ring blkif 4 %lu\n", (unsigned long)BLKIF_RING_SIZE_ORDER(4));
    printf("ring netif_tx 0 %lu\n", (unsigned long)__CONST_RING_SIZE(netif_tx, 4096));
    printf("ring netif_rx 0 %lu\n", (unsigned long)__CONST_RING_SIZE(netif_rx, 4096));
    printf("ring xen_netif_ctrl 0 %lu\n", (unsigned long)__CONST_RING_SIZE(xen_netif_ctrl, 4096));

    /* io/blkif.h */
    SIZE(blkif_request_segment);
    OFF(blkif_request_segment, gref);
    OFF(blkif_request_segment, first_sect);
    OFF(blkif_request_segment, last_sect);
    SIZE(blkif_request);
    OFF(blkif_request, operation);
    OFF(blkif_request, nr_segments);
    OFF(blkif_request, handle);
    OFF(blkif_request, id);
    OFF(blkif_request, sector_number);
    OFF(blkif_request, seg);
    SIZE(blkif_request_discard);
    OFF(blkif_request_discard, operation);
    OFF(blkif_request_discard, flag);
    OFF(blkif_request_discard, handle);
    OFF(blkif_request_discard, id);
    OFF(blkif_request_discard, sector_number);
    OFF(blkif_request_discard, nr_sectors);
    SIZE(blkif_request_indirect);
    OFF(blkif_request_indirect, operation);
    OFF(blkif_request_indirect, indirect_op);
    OFF(blkif_request_indirect, nr_segments);
    OFF(blkif_request_indirect, id);
    OFF(blkif_request_indirect, sector_number);
    OFF(blkif_request_indirect, handle);
    OFF(blkif_request_indirect, indirect_grefs);
    SIZE(blkif_response);
    OFF(blkif_response, id);
    OFF(blkif_response, operation);
    OFF(blkif_response, status);
    CONST(BLKIF_OP_READ);
    CONST(BLKIF_OP_WRITE);
    CONST(BLKIF_OP_WRITE_BARRIER);
    CONST(BLKIF_OP_FLUSH_DISKCACHE);
    CONST(BLKIF_OP_RESERVED_1);
    CONST(BLKIF_OP_DISCARD);
    CONST(BLKIF_OP_INDIRECT);
    CONST(BLKIF_DISCARD_SECURE);
    CONST(BLKIF_MAX_SEGMENTS_PER_REQUEST);
    CONST(BLKIF_MAX_INDIRECT_PAGES_PER_REQUEST);
    CONST(BLKIF_RSP_OKAY);
    CONST(BLKIF_RSP_ERROR);
    CONST(BLKIF_RSP_EOPNOTSUPP);
    CONST(VDISK_CDROM);
    CONST(VDISK_REMOVABLE);
    CONST(VDISK_READONLY);

    /* io/netif.h */
    SIZE(netif_tx_request);
    OFF(netif_tx_request, gref);
    OFF(netif_tx_request, offset);
    OFF(netif_tx_request, flags);
    OFF(netif_tx_request, id);
    OFF(netif_tx_request, size);
    SIZE(netif_tx_response);
    OFF(netif_tx_response, id);
    OFF(netif_tx_response, status);
    SIZE(netif_rx_request);
    OFF(netif_rx_request, id);
    OFF(netif_rx_request, pad);
    OFF(netif_rx_request, gref);
    SIZE(netif_rx_response);
    OFF(netif_rx_response, id);
    OFF(netif_rx_response, offset);
    OFF(netif_rx_response, flags);
    OFF(netif_rx_response, status);
    SIZE(netif_extra_info);
    OFF(netif_extra_info, type);
    OFF(netif_extra_info, flags);
    OFF(netif_extra_info, u);
    OFF(netif_extra_info, u.gso.size);
    OFF(netif_extra_info, u.gso.type);
    OFF(netif_extra_info, u.gso.pad);
    OFF(netif_extra_info, u.gso.features);
    OFF(netif_extra_info, u.mcast.addr);
    OFF(netif_extra_info, u.hash.type);
    OFF(netif_extra_info, u.hash.algorithm);
    OFF(netif_extra_info, u.hash.value);
    SIZE(xen_netif_ctrl_request);
    OFF(xen_netif_ctrl_request, id);
    OFF(xen_netif_ctrl_request, type);
    OFF(xen_netif_ctrl_request, data);
    SIZE(xen_netif_ctrl_response);
    OFF(xen_netif_ctrl_response, id);
    OFF(xen_netif_ctrl_response, type);
    OFF(xen_netif_ctrl_response, status);
    OFF(xen_netif_ctrl_response, data);
    SIZE(xen_netif_gref);
    OFF(xen_netif_gref, ref);
    OFF(xen_netif_gref, flags);
    OFF(xen_netif_gref, status);
    CONST(XEN_NETIF_NR_SLOTS_MIN);
    CONST(XEN_NETIF_MAX_TX_SIZE);
    CONST(NETTXF_csum_blank);
    CONST(NETTXF_data_validated);
    CONST(NETTXF_more_data);
    CONST(NETTXF_extra_info);
    CONST(NETRXF_data_validated);
    CONST(NETRXF_csum_blank);
    CONST(NETRXF_more_data);
    CONST(NETRXF_extra_info);
    CONST(NETRXF_gso_prefix);
    CONST(NETIF_RSP_DROPPED);
    CONST(NETIF_RSP_ERROR);
    CONST(NETIF_RSP_OKAY);
    CONST(NETIF_RSP_NULL);
    CONST(XEN_NETIF_EXTRA_TYPE_NONE);
    CONST(XEN_NETIF_EXTRA_TYPE_GSO);
    CONST(XEN_NETIF_EXTRA_TYPE_MCAST_ADD);
    CONST(XEN_NETIF_EXTRA_TYPE_MCAST_DEL);
    CONST(XEN_NETIF_EXTRA_TYPE_HASH);
    CONST(XEN_NETIF_EXTRA_TYPE_MAX);
    CONST(XEN_NETIF_EXTRA_FLAG_MORE);
    CONST(XEN_NETIF_GSO_TYPE_NONE);
    CONST(XEN_NETIF_GSO_TYPE_TCPV4);
    CONST(XEN_NETIF_GSO_TYPE_TCPV6);
    CONST(XEN_NETIF_CTRL_TYPE_INVALID);
    CONST(XEN_NETIF_CTRL_TYPE_GET_HASH_FLAGS);
    CONST(XEN_NETIF_CTRL_TYPE_SET_HASH_FLAGS);
    CONST(XEN_NETIF_CTRL_TYPE_SET_HASH_KEY);
    CONST(XEN_NETIF_CTRL_TYPE_GET_HASH_MAPPING_SIZE);
    CONST(XEN_NETIF_CTRL_TYPE_SET_HASH_MAPPING_SIZE);
    CONST(XEN_NETIF_CTRL_TYPE_SET_HASH_MAPPING);
    CONST(XEN_NETIF_CTRL_TYPE_SET_HASH_ALGORITHM);
    CONST(XEN_NETIF_CTRL_TYPE_GET_GREF_MAPPING_SIZE);
    CONST(XEN_NETIF_CTRL_TYPE_ADD_GREF_MAPPING);
    CONST(XEN_NETIF_CTRL_TYPE_DEL_GREF_MAPPING);
    CONST(XEN_NETIF_CTRL_STATUS_SUCCESS);
    CONST(XEN_NETIF_CTRL_STATUS_NOT_SUPPORTED);
    CONST(XEN_NETIF_CTRL_STATUS_INVALID_PARAMETER);
    CONST(XEN_NETIF_CTRL_STATUS_BUFFER_OVERFLOW);
    CONST(XEN_NETIF_CTRL_HASH_TYPE_IPV4);
    CONST(XEN_NETIF_CTRL_HASH_TYPE_IPV4_TCP);
    CONST(XEN_NETIF_CTRL_HASH_TYPE_IPV6);
    CONST(XEN_NETIF_CTRL_HASH_TYPE_IPV6_TCP);
    CONST(XEN_NETIF_CTRL_HASH_ALGORITHM_NONE);
    CONST(XEN_NETIF_CTRL_HASH_ALGORITHM_TOEPLITZ);

    /* io/xs_wire.h */
    SIZE(xsd_sockmsg);
    OFF(xsd_sockmsg, type);
    OFF(xsd_sockmsg, req_id);
    OFF(xsd_sockmsg, tx_id);
    OFF(xsd_sockmsg, len);
    SIZE(xenstore_domain_interface);
    OFF(xenstore_domain_interface, req);
    OFF(xenstore_domain_interface, rsp);
    OFF(xenstore_domain_interface, req_cons);
    OFF(xenstore_domain_interface, req_prod);
    OFF(xenstore_domain_interface, rsp_cons);
    OFF(xenstore_domain_interface, rsp_prod);
    OFF(xenstore_domain_interface, server_features);
    OFF(xenstore_domain_interface, connection);
    OFF(xenstore_domain_interface, error);
    CONST(XS_CONTROL);
    CONST(XS_DIRECTORY);
    CONST(XS_READ);
    CONST(XS_GET_PERMS);
    CONST(XS_WATCH);
    CONST(XS_UNWATCH);
    CONST(XS_TRANSACTION_START);
    CONST(XS_TRANSACTION_END);
    CONST(XS_INTRODUCE);
    CONST(XS_RELEASE);
    CONST(XS_GET_DOMAIN_PATH);
    CONST(XS_WRITE);
    CONST(XS_MKDIR);
    CONST(XS_RM);
    CONST(XS_SET_PERMS);
    CONST(XS_WATCH_EVENT);
    CONST(XS_ERROR);
    CONST(XS_IS_DOMAIN_INTRODUCED);
    CONST(XS_RESUME);
    CONST(XS_SET_TARGET);
    CONST(XS_RESET_WATCHES);
    CONST(XS_DIRECTORY_PART);
    CONST(XS_TYPE_COUNT);
    CONST(XS_INVALID);
    CONST(XS_WATCH_PATH);
    CONST(XS_WATCH_TOKEN);
    CONST(XENSTORE_PAYLOAD_MAX);
    CONST(XENSTORE_ABS_PATH_MAX);
    CONST(XENSTORE_REL_PATH_MAX);
    CONST(XENSTORE_RING_SIZE);
    CONST(XENSTORE_SERVER_FEATURE_RECONNECTION);
    CONST(XENSTORE_SERVER_FEATURE_ERROR);
    CONST(XENSTORE_CONNECTED);
    CONST(XENSTORE_RECONNECT);
    CONST(XENSTORE_ERROR_NONE);
    CONST(XENSTORE_ERROR_COMM);
    CONST(XENSTORE_ERROR_RINGIDX);
    CONST(XENSTORE_ERROR_PROTO);
    for (size_t i = 0; i < sizeof(xsd_errors) / sizeof(xsd_errors[0]); i++)
        printf("xserr %zu %d %s\n", i, xsd_errors[i].errnum, xsd_errors[i].errstring);

    /* grant_table.h */
    SIZE(grant_entry_v1);
    OFF(grant_entry_v1, flags);
    OFF(grant_entry_v1, domid);
    OFF(grant_entry_v1, frame);
    CONST(GNTTAB_NR_RESERVED_ENTRIES);
    CONST(GNTTAB_RESERVED_CONSOLE);
    CONST(GNTTAB_RESERVED_XENSTORE);
    CONST(GTF_invalid);
    CONST(GTF_permit_access);
    CONST(GTF_accept_transfer);
    CONST(GTF_transitive);
    CONST(GTF_type_mask);
    CONST(GTF_readonly);
    CONST(GTF_reading);
    CONST(GTF_writing);
    CONST(GTF_PWT);
    CONST(GTF_PCD);
    CONST(GTF_PAT);
    CONST(GTF_sub_page);
    CONST(GTF_transfer_committed);
    CONST(GTF_transfer_completed);
    CONST(GNTMAP_device_map);
    CONST(GNTMAP_host_map);
    CONST(GNTMAP_readonly);
    CONST(GNTMAP_application_map);
    CONST(GNTMAP_contains_pte);
    CONST(GNTTABOP_map_grant_ref);
    CONST(GNTTABOP_unmap_grant_ref);
    CONST(GNTTABOP_setup_table);
    CONST(GNTTABOP_dump_table);
    CONST(GNTTABOP_transfer);
    CONST(GNTTABOP_copy);
    CONST(GNTTABOP_query_size);
    CONST(GNTTABOP_unmap_and_replace);
    CONST(GNTTABOP_set_version);
    CONST(GNTTABOP_get_status_frames);
    CONST(GNTTABOP_get_version);
    CONST(GNTTABOP_swap_grant_ref);
    CONST(GNTTABOP_cache_flush);
    CONST(GNTST_okay);
    CONST(GNTST_general_error);
    CONST(GNTST_bad_domain);
    CONST(GNTST_bad_gntref);
    CONST(GNTST_bad_handle);
    CONST(GNTST_bad_virt_addr);
    CONST(GNTST_bad_dev_addr);
    CONST(GNTST_no_device_space);
    CONST(GNTST_permission_denied);
    CONST(GNTST_bad_page);
    CONST(GNTST_bad_copy_arg);
    CONST(GNTST_address_too_big);
    CONST(GNTST_eagain);
    CONST(GNTST_no_space);

    /* event_channel.h and the 2-level / FIFO limits */
    CONST(EVTCHNOP_bind_interdomain);
    CONST(EVTCHNOP_bind_virq);
    CONST(EVTCHNOP_bind_pirq);
    CONST(EVTCHNOP_close);
    CONST(EVTCHNOP_send);
    CONST(EVTCHNOP_status);
    CONST(EVTCHNOP_alloc_unbound);
    CONST(EVTCHNOP_bind_ipi);
    CONST(EVTCHNOP_bind_vcpu);
    CONST(EVTCHNOP_unmask);
    CONST(EVTCHNOP_reset);
    CONST(EVTCHNOP_init_control);
    CONST(EVTCHNOP_expand_array);
    CONST(EVTCHNOP_set_priority);
    CONST(EVTCHNSTAT_closed);
    CONST(EVTCHNSTAT_unbound);
    CONST(EVTCHNSTAT_interdomain);
    CONST(EVTCHNSTAT_pirq);
    CONST(EVTCHNSTAT_virq);
    CONST(EVTCHNSTAT_ipi);
    CONST(EVTCHN_2L_NR_CHANNELS);
    CONST(EVTCHN_FIFO_LINK_BITS);
    CONST(EVTCHN_FIFO_NR_CHANNELS);
    CONST(DOMID_SELF);
    CONST(DOMID_MASK);

    /* io/xenbus.h */
    CONST(XenbusStateUnknown);
    CONST(XenbusStateInitialising);
    CONST(XenbusStateInitWait);
    CONST(XenbusStateInitialised);
    CONST(XenbusStateConnected);
    CONST(XenbusStateClosing);
    CONST(XenbusStateClosed);
    CONST(XenbusStateReconfiguring);
    CONST(XenbusStateReconfigured);

    printf("str XEN_IO_PROTO_ABI_X86_64 %s\n", XEN_IO_PROTO_ABI_X86_64);
    printf("str XEN_IO_PROTO_ABI_X86_32 %s\n", XEN_IO_PROTO_ABI_X86_32);
    printf("str XEN_IO_PROTO_ABI_ARM %s\n", XEN_IO_PROTO_ABI_ARM);
    return 0;
}
