//! Xenstore (work in progress).
