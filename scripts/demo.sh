#!/usr/bin/env bash
# `make demo`: start a host in a temporary state directory, create an SR,
# two VMs with two disks each, start both VMs in parallel, run a short
# random read/write job with verification in each, print a per-VM table,
# shut everything down and check that nothing is left running.
#
# Everything here goes through the xe-style CLI (`pvio vm-create ...`)
# against `pvio host up`, as a user would.
set -euo pipefail
cd "$(dirname "$0")/.."
PVIO=${PVIO:-$PWD/target/release/pvio}
JOB=${PVIO_DEMO_JOB:-rw=randrw,bs=4k,iodepth=16,numjobs=2,runtime=5s,size=64t,range=32m,verify=crc32c}
export PVIO_STATE
PVIO_STATE=$(mktemp -d /tmp/pvio-demo.XXXXXX)
host_pid=

say() { printf '\n== %s\n' "$*"; }
xe() { "$PVIO" "$@"; }

cleanup() {
    local rc=$?
    if [[ -n $host_pid ]] && kill -0 "$host_pid" 2>/dev/null; then
        kill -TERM "$host_pid" 2>/dev/null || true
        wait "$host_pid" 2>/dev/null || true
    fi
    if ((rc != 0)); then
        echo "demo failed (exit $rc); the host's logs:" >&2
        tail -n 20 "$PVIO_STATE"/logs/*.log 2>/dev/null >&2 || true
    fi
    rm -rf "$PVIO_STATE"
    exit "$rc"
}
trap cleanup EXIT

# Waits until a command succeeds, for at most $1 seconds.
wait_until() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || { echo "timed out waiting for: $*" >&2; return 1; }
        sleep 0.1
    done
}

t0=$SECONDS
say "starting a host (hvd, xenstored, toolstackd) in $PVIO_STATE"
PVIO_LOG=${PVIO_LOG:-warn} "$PVIO" host up --state "$PVIO_STATE" --shutdown-timeout-s 20 &
host_pid=$!
wait_until 30 test -S "$PVIO_STATE/toolstackd.sock"
wait_until 30 xe host-list
xe host-param-list uuid="$(xe host-list --minimal)"

say "creating an SR, four 64 MiB disks and two VMs (xe-style CLI)"
sr=$(xe sr-create name-label=demo-sr type=file)
echo "sr-create                -> $sr"
declare -A uuid_of
for vm in vm1 vm2; do
    uuid=$(xe vm-create name-label="$vm" VCPUs-max=2 memory=256MiB workload="job:$JOB")
    uuid_of[$vm]=$uuid
    echo "vm-create $vm            -> $uuid"
    for dev in 0 1; do
        vdi=$(xe vdi-create sr-uuid="$sr" name-label="$vm-disk$dev" virtual-size=64MiB)
        vbd=$(xe vbd-create vm-uuid="$uuid" vdi-uuid="$vdi" device="$dev" mode=RW)
        echo "  vdi-create + vbd-create -> device $dev: vdi $vdi, vbd $vbd"
    done
done
xe vbd-list params=vm-name-label,device,vdi-uuid

say "starting both VMs in parallel (their disks plug in parallel too)"
ts=$SECONDS
xe vm-start vm=vm1 &
p1=$!
xe vm-start vm=vm2 &
p2=$!
wait "$p1"
wait "$p2"
echo "both VMs running after $((SECONDS - ts)) s"
xe vm-list params=name-label,power-state,dom-id

say "each guest runs: $JOB"
for vm in vm1 vm2; do
    wait_until 90 bash -c "[[ \$('$PVIO' vm-param-get uuid=${uuid_of[$vm]} param-name=guest-metrics param-key=workload/state 2>/dev/null) =~ ^(done|failed)$ ]]"
done

metric() { xe vm-param-get uuid="${uuid_of[$1]}" param-name=guest-metrics param-key="workload/$2" 2>/dev/null || echo "-"; }
say "results"
printf '%-6s %10s %8s %14s %14s %14s %14s  %s\n' VM IOPS "MB/s" "read p50 us" "read p99 us" "write p50 us" "write p99 us" verify
ok=1
for vm in vm1 vm2; do
    state=$(metric "$vm" state)
    verify=$(metric "$vm" verify)
    printf '%-6s %10s %8s %14s %14s %14s %14s  %s\n' "$vm" \
        "$(metric "$vm" iops)" "$(metric "$vm" mb_s)" \
        "$(metric "$vm" read_p50_us)" "$(metric "$vm" read_p99_us)" \
        "$(metric "$vm" write_p50_us)" "$(metric "$vm" write_p99_us)" "$verify"
    [[ $state == done && $verify == ok ]] || ok=0
done
((ok)) || { echo "a guest's job failed or did not verify" >&2; exit 1; }

say "shutting down both VMs (in parallel) and the host"
xe vm-shutdown vm=vm1 &
p1=$!
xe vm-shutdown vm=vm2 &
p2=$!
wait "$p1"
wait "$p2"
xe vm-list params=name-label,power-state
kill -TERM "$host_pid"
wait "$host_pid" || true
host_pid=
left=$(pgrep -f "$PVIO_STATE" || true)
if [[ -n $left ]]; then
    echo "processes left running:" >&2
    ps -o pid,args -p $left >&2
    exit 1
fi
echo "nothing left running; the demo took $((SECONDS - t0)) s"
