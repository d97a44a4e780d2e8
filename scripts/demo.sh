#!/usr/bin/env bash
# `make demo`: start a host, run guests and their workloads, print what happened.
#
# Until the toolstack lands this demo drives the foundation directly: a
# private hvd, a guest domain exchanging requests with a dom0 backend over a
# blkif ring and event channels, and the ring benchmark against its raw
# baselines.
set -euo pipefail
cd "$(dirname "$0")/.."
PVIO=${PVIO:-target/release/pvio}
state=$(mktemp -d /tmp/pvio-demo.XXXXXX)
cleanup() {
    [[ -n ${hvd_pid:-} ]] && kill "$hvd_pid" 2>/dev/null && wait "$hvd_pid" 2>/dev/null
    rm -rf "$state"
}
trap cleanup EXIT

echo "== starting hvd (the hypervisor services) in $state"
PVIO_LOG=warn "$PVIO" hvd --socket "$state/hvd.sock" &
hvd_pid=$!
for _ in $(seq 200); do [[ -S $state/hvd.sock ]] && break; sleep 0.05; done

echo "== a guest domain offers an event channel and grants a page to dom0"
coproc GUEST { PVIO_LOG=warn "$PVIO" internal guest-shell --socket "$state/hvd.sock" --name demo-guest --frames 64; }
guest_pid=$GUEST_PID
ask() { echo "$1" >&"${GUEST[1]}"; read -r reply <&"${GUEST[0]}"; echo "   guest> $1  ->  $reply"; }
ask domid
ask "write 10 0 hello from the guest"
ask "grant 0 10 ro"
ask "unbound 0"
echo "== the guest's event-channel ports, as Xen's lsevtchn shows them"
domid=$(echo domid >&"${GUEST[1]}"; read -r r <&"${GUEST[0]}"; echo "${r#ok }")
"$PVIO" lsevtchn "$domid" --socket "$state/hvd.sock" | sed 's/^/   /'
echo exit >&"${GUEST[1]}"
wait "$guest_pid" 2>/dev/null || true

echo "== queue-depth-1 round trips through a blkif ring, next to the raw baselines"
"$PVIO" bench ring --quick 2>/dev/null | sed 's/^/   /'
echo "== done; everything stopped"
