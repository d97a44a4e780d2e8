#!/usr/bin/env bash
# Installs the system packages pvio's build, tests, demo and benchmarks need.
#
# Idempotent and quick: it asks dpkg first and only runs apt-get when a
# package is missing. Needs root (or sudo) the first time on a fresh Debian.
#
#   scripts/install-deps.sh          install what is missing
#   scripts/install-deps.sh --check  only report what is missing (exit 1 if any)
set -euo pipefail

packages=(
    build-essential pkg-config   # cc for the ABI and libxenstore tests
    libxen-dev                   # /usr/include/xen: the ABI reference, libxenstore
    xenstore-utils               # xenstore-read/-write/-ls/...: third-party xenstore clients
    qemu-utils                   # qemu-img: disk images, NBD client
    libnbd-bin                   # nbdinfo/nbdcopy: NBD clients
    fio                          # bare-metal block baseline
    iperf3                       # TCP baseline
    iproute2                     # ip link/netns for TAP networking
    procps                       # pgrep/ps in scripts
)

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if [[ ${1:-} == --check ]]; then
    if ((${#missing[@]})); then
        echo "missing packages: ${missing[*]}"
        exit 1
    fi
    echo "all system packages present"
    exit 0
fi

if ((${#missing[@]})); then
    echo "install-deps: installing ${missing[*]}"
    sudo=""
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null || { echo "install-deps: need root or sudo for apt-get" >&2; exit 1; }
        sudo=sudo
    fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Rust comes from rustup (preinstalled on the project's machines); Debian's
# rustc is too old for the workspace.
if ! command -v cargo >/dev/null 2>&1 && [[ -x $HOME/.cargo/bin/cargo ]]; then
    export PATH=$HOME/.cargo/bin:$PATH
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "install-deps: cargo not found; install Rust with rustup (https://rustup.rs), then rerun" >&2
    exit 1
fi
echo "install-deps: ok"
