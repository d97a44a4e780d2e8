//! Xenbus conventions on top of the client (`io/xenbus.h`, xen-protocols
//! §4): where a device's frontend and backend directories live, reading and
//! switching a `state` node, and waiting for the peer to reach a state.

use crate::client::Client;
use crate::error::{Error, XsError};
use pvio_abi::xenbus::XenbusState;
use pvio_abi::DomId;
use std::time::Instant;

/// `/local/domain/<frontend>/device/<kind>/<devid>`.
pub fn frontend_path(frontend: DomId, kind: &str, devid: u32) -> String {
    format!("/local/domain/{frontend}/device/{kind}/{devid}")
}

/// `/local/domain/<backend>/backend/<kind>/<frontend>/<devid>`.
pub fn backend_path(backend: DomId, kind: &str, frontend: DomId, devid: u32) -> String {
    format!("/local/domain/{backend}/backend/{kind}/{frontend}/{devid}")
}

/// `<dir>/state`.
pub fn state_path(dir: &str) -> String {
    format!("{dir}/state")
}

/// Reads several nodes in one round trip, as text (`None` where missing):
/// what a driver reads of its device directories at each step.
pub async fn read_paths<const N: usize>(
    c: &Client,
    paths: [String; N],
) -> Result<[Option<String>; N], Error> {
    let mut values = c.try_read_texts(&paths).await?.into_iter();
    Ok(std::array::from_fn(|_| values.next().flatten()))
}

/// [`read_paths`] of `dir/<name>` for each name.
pub async fn read_keys<const N: usize>(
    c: &Client,
    dir: &str,
    names: [&str; N],
) -> Result<[Option<String>; N], Error> {
    read_paths(c, names.map(|k| format!("{dir}/{k}"))).await
}

/// The state of the device end at `dir`; a missing or unparsable node
/// reads as `Unknown`, as in Linux's `xenbus_read_driver_state()`.
pub async fn read_state(c: &Client, dir: &str) -> Result<XenbusState, Error> {
    Ok(match c.try_read(&state_path(dir)).await? {
        Some(v) => XenbusState::parse(&String::from_utf8_lossy(&v)).unwrap_or(XenbusState::Unknown),
        None => XenbusState::Unknown,
    })
}

/// Moves this end to `state`, in a transaction that fails with ENOENT if
/// the device directory has gone (like Linux's `xenbus_switch_state()`, which
/// never resurrects a removed device).
pub async fn switch_state(c: &Client, dir: &str, state: XenbusState) -> Result<(), Error> {
    c.transaction(async |t| {
        if !t.exists(dir).await? {
            return Err(Error::Xen(XsError::Enoent));
        }
        t.write(&state_path(dir), state.as_node_value()).await
    })
    .await
}

/// The peer directory named by `<dir>/<key>` (`backend` or `frontend`).
pub async fn peer_dir(c: &Client, dir: &str, key: &str) -> Result<String, Error> {
    c.read_string(&format!("{dir}/{key}")).await
}

/// Waits until the state at `dir` satisfies `done`, or the deadline
/// passes. Watches `<dir>/state` and re-reads on every event, so spurious
/// events are harmless.
pub async fn wait_for_state(
    c: &Client,
    dir: &str,
    deadline: Instant,
    mut done: impl FnMut(XenbusState) -> bool,
) -> Result<XenbusState, Error> {
    let mut w = c.watch(&state_path(dir)).await?;
    loop {
        let s = read_state(c, dir).await?;
        if done(s) {
            return Ok(s);
        }
        let d = tokio::time::Instant::from_std(deadline);
        match tokio::time::timeout_at(d, w.next()).await {
            Ok(Some(_)) => continue,
            Ok(None) => return Err(Error::Closed),
            Err(_) => return Err(Error::Timeout(format!("{dir}/state (last {})", s.name()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(
            frontend_path(5, "vbd", 51712),
            "/local/domain/5/device/vbd/51712"
        );
        assert_eq!(
            backend_path(0, "vif", 5, 0),
            "/local/domain/0/backend/vif/5/0"
        );
        assert_eq!(state_path("/x"), "/x/state");
    }
}
