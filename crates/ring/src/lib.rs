//! Xen shared rings (work in progress).
