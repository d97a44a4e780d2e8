//! The frontend's transport keys, read and validated once at connect.
//!
//! They come from the guest and are untrusted: every value is parsed with a
//! clear error, and the limits Linux blkback enforces in `connect_ring` and
//! `read_per_ring_refs` apply (row 13 of the checks table in
//! docs/xen-protocols.md §7.2): a known protocol, a ring order within the
//! backend's maximum, a queue count within `multi-queue-max-queues`, and
//! every ring ref and event channel present.

use std::collections::HashMap;

use pvio_abi::event_channel::EvtchnPort;
use pvio_abi::grant_table::GrantRef;
use pvio_abi::XEN_IO_PROTO_ABI_X86_64;

use crate::xenbus_keys::frontend as keys;

/// One queue's ring and event channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueTransport {
    /// Grant refs of the ring pages, in order.
    pub ring_refs: Vec<GrantRef>,
    pub event_channel: EvtchnPort,
}

/// Everything the frontend published for the backend to connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontendTransport {
    /// Ring pages are `2^ring_order` per queue.
    pub ring_order: u32,
    pub queues: Vec<QueueTransport>,
    /// The frontend reuses grants (`feature-persistent`).
    pub persistent: bool,
}

/// Why the transport is unusable; the backend reports it like
/// `xenbus_dev_fatal` and does not connect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    #[error("the frontend did not write {0}")]
    Missing(String),
    #[error("the frontend's {key} = {value:?} is invalid: {why}")]
    BadValue {
        key: String,
        value: String,
        why: String,
    },
    #[error(
        "unsupported protocol {0:?}: pvio backends speak {XEN_IO_PROTO_ABI_X86_64} only \
         (a frontend that writes no protocol key means x86_32-abi to Linux blkback)"
    )]
    Protocol(String),
    #[error("ring-page-order {order} is above the backend's max-ring-page-order {max}")]
    RingOrder { order: u32, max: u32 },
    #[error("multi-queue-num-queues {n} is outside 1..={max}")]
    Queues { n: u32, max: u32 },
}

fn get<'a>(m: &'a HashMap<String, String>, key: &str) -> Result<&'a str, TransportError> {
    m.get(key)
        .map(|s| s.trim_end_matches('\0').trim())
        .ok_or_else(|| TransportError::Missing(key.to_string()))
}

fn number<T: std::str::FromStr>(
    m: &HashMap<String, String>,
    key: &str,
) -> Result<T, TransportError> {
    let v = get(m, key)?;
    v.parse().map_err(|_| TransportError::BadValue {
        key: key.to_string(),
        value: v.to_string(),
        why: "not a decimal number in range".to_string(),
    })
}

fn optional<T: std::str::FromStr>(
    m: &HashMap<String, String>,
    key: &str,
) -> Result<Option<T>, TransportError> {
    if m.contains_key(key) {
        number(m, key).map(Some)
    } else {
        Ok(None)
    }
}

/// Parses the frontend's keys (`keys` holds paths relative to the frontend
/// directory, e.g. `ring-ref0` and `queue-1/event-channel`).
pub fn parse_transport(
    m: &HashMap<String, String>,
    max_queues: u32,
    max_ring_order: u32,
) -> Result<FrontendTransport, TransportError> {
    let protocol = get(m, keys::PROTOCOL).map_err(|_| TransportError::Protocol(String::new()))?;
    if protocol != XEN_IO_PROTO_ABI_X86_64 {
        return Err(TransportError::Protocol(protocol.to_string()));
    }
    let persistent = optional::<u32>(m, keys::FEATURE_PERSISTENT)?.unwrap_or(0) == 1;
    let nq = optional::<u32>(m, keys::MULTI_QUEUE_NUM_QUEUES)?.unwrap_or(1);
    if nq == 0 || nq > max_queues {
        return Err(TransportError::Queues {
            n: nq,
            max: max_queues,
        });
    }
    let order = optional::<u32>(m, keys::RING_PAGE_ORDER)?;
    if let Some(o) = order {
        if o > max_ring_order {
            return Err(TransportError::RingOrder {
                order: o,
                max: max_ring_order,
            });
        }
    }
    let mut queues = Vec::with_capacity(nq as usize);
    for q in 0..nq {
        let prefix = if nq == 1 {
            String::new()
        } else {
            format!("{}/", keys::queue_dir(q))
        };
        let ring_refs = match order {
            None => vec![number(m, &format!("{prefix}{}", keys::RING_REF))?],
            Some(o) => (0..1u32 << o)
                .map(|i| number(m, &format!("{prefix}{}", keys::ring_ref_n(i))))
                .collect::<Result<Vec<GrantRef>, _>>()?,
        };
        let event_channel = number(m, &format!("{prefix}{}", keys::EVENT_CHANNEL))?;
        if event_channel == 0 {
            return Err(TransportError::BadValue {
                key: format!("{prefix}{}", keys::EVENT_CHANNEL),
                value: "0".into(),
                why: "port 0 is never a valid event channel".into(),
            });
        }
        queues.push(QueueTransport {
            ring_refs,
            event_channel,
        });
    }
    Ok(FrontendTransport {
        ring_order: order.unwrap_or(0),
        queues,
        persistent,
    })
}

/// The relative keys [`parse_transport`] may read, for a reader that
/// fetches them from the xenstore.
pub fn keys_to_read(nq_hint: u32, max_ring_order: u32) -> Vec<String> {
    let mut v = vec![
        keys::PROTOCOL.to_string(),
        keys::FEATURE_PERSISTENT.to_string(),
        keys::MULTI_QUEUE_NUM_QUEUES.to_string(),
        keys::RING_PAGE_ORDER.to_string(),
    ];
    let per_queue = |prefix: &str, v: &mut Vec<String>| {
        v.push(format!("{prefix}{}", keys::RING_REF));
        v.push(format!("{prefix}{}", keys::EVENT_CHANNEL));
        for i in 0..1u32 << max_ring_order {
            v.push(format!("{prefix}{}", keys::ring_ref_n(i)));
        }
    };
    if nq_hint <= 1 {
        per_queue("", &mut v);
    } else {
        for q in 0..nq_hint {
            per_queue(&format!("{}/", keys::queue_dir(q)), &mut v);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn single_page_single_queue() {
        let t = parse_transport(
            &map(&[
                ("protocol", "x86_64-abi"),
                ("ring-ref", "8"),
                ("event-channel", "3"),
            ]),
            2,
            4,
        )
        .unwrap();
        assert_eq!(t.ring_order, 0);
        assert_eq!(
            t.queues,
            vec![QueueTransport {
                ring_refs: vec![8],
                event_channel: 3
            }]
        );
        assert!(!t.persistent);
    }

    #[test]
    fn multi_page_multi_queue() {
        let t = parse_transport(
            &map(&[
                ("protocol", "x86_64-abi"),
                ("feature-persistent", "1"),
                ("multi-queue-num-queues", "2"),
                ("ring-page-order", "1"),
                ("queue-0/ring-ref0", "8"),
                ("queue-0/ring-ref1", "9"),
                ("queue-0/event-channel", "3"),
                ("queue-1/ring-ref0", "10"),
                ("queue-1/ring-ref1", "11"),
                ("queue-1/event-channel", "4"),
            ]),
            2,
            4,
        )
        .unwrap();
        assert!(t.persistent);
        assert_eq!(t.queues[1].ring_refs, vec![10, 11]);
    }

    #[test]
    fn hostile_values_are_refused() {
        let base = [
            ("protocol", "x86_64-abi"),
            ("ring-ref", "8"),
            ("event-channel", "3"),
        ];
        let with = |k: &str, v: &str| {
            let mut m = map(&base);
            m.insert(k.into(), v.into());
            parse_transport(&m, 2, 4)
        };
        assert!(matches!(
            with("protocol", "x86_32-abi"),
            Err(TransportError::Protocol(_))
        ));
        let mut m = map(&base);
        m.remove("protocol");
        assert!(matches!(
            parse_transport(&m, 2, 4),
            Err(TransportError::Protocol(_))
        ));
        assert!(matches!(
            with("ring-ref", "-1"),
            Err(TransportError::BadValue { .. })
        ));
        assert!(matches!(
            with("ring-ref", "99999999999"),
            Err(TransportError::BadValue { .. })
        ));
        assert!(matches!(
            with("event-channel", "0"),
            Err(TransportError::BadValue { .. })
        ));
        assert!(matches!(
            with("ring-page-order", "5"),
            Err(TransportError::RingOrder { .. })
        ));
        assert!(matches!(
            with("ring-page-order", "1"),
            Err(TransportError::Missing(_))
        ));
        assert!(matches!(
            with("multi-queue-num-queues", "0"),
            Err(TransportError::Queues { .. })
        ));
        assert!(matches!(
            with("multi-queue-num-queues", "3"),
            Err(TransportError::Queues { .. })
        ));
        assert!(matches!(
            with("multi-queue-num-queues", "2"),
            Err(TransportError::Missing(_))
        ));
        assert!(matches!(
            with("multi-queue-num-queues", "x"),
            Err(TransportError::BadValue { .. })
        ));
    }
}
