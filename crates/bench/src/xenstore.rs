//! `pvio bench xenstore`: read and write round trips and aggregate read rate.
