//! `pvio bench ring`: queue-depth-1 round trips through a shared ring and
//! event channels, against raw eventfd and cache-line ping-pong baselines.
