//! pvio hypervisor services (work in progress).
