#!/usr/bin/env bash
# What one process's start costs beside K LIVE processes of its slice, with and without the
# shim: `linked-client alloc 2MiB` (cuInit, its first context, 2 MiB, exit) started beside K
# real, separate `slice-peers` (each registered through libgpuslice.so, with a context and
# 2 MiB on the fake card). Two figures per K: the whole process's instructions (callgrind,
# loader and exit included) and its `fcntl` calls (`strace -f -c`: the region's lock probes
# are F_OFD_GETLK). "Added" is with the shim minus without, the same peers alive; the fake
# driver's own reaping and process list grow with the peers in both.
#
# Usage: benches/start-instructions.sh [SIZES...]   (default 0 199 1023)
# Build first: cargo build --release -p fakegpu -p fakegpu-cuda -p fakegpu-nvml \
#              -p gpuslice-shim -p gpuslice-benches -p cuda-clients
set -euo pipefail
# The fake's drivers look for dead processes on every call, as before the liveness lag: a
# count must not depend on how long the run took (FAKEGPU_LIVENESS_LAG_US, cuda-tests/README.md).
export FAKEGPU_LIVENESS_LAG_US=0
shopt -s inherit_errexit
root="$(cd "$(dirname "$0")/.." && pwd)"
release="$root/target/release"
# The shim measured: SHIM=/path/to/libgpuslice.so (its libgpuslice_core.so beside it) to
# compare another build with the same peers and driver.
shim="${SHIM:-$release/libgpuslice.so}"
sizes=(0 199 1023)
if [ "$#" -gt 0 ]; then
    sizes=("$@")
fi
work="$(mktemp -d)"
peers_bin="$release/slice-peers"
peers_for=start-instructions
# shellcheck source=benches/slice-peers.sh
source "$root/benches/slice-peers.sh"
trap 'stop_peers; rm -rf "$work"' EXIT
# Small contexts: a thousand of the fake's default 300 MiB would not fit a card.
export FAKEGPU_CTX_OVERHEAD=$((4 << 20))
"$release/fakegpu" install "$work/lib" >/dev/null

start() { # SCRATCH MODE TOOL...: runs one start under TOOL, with the shim or without
    local scratch="$1" mode="$2"
    shift 2
    local preload=()
    [ "$mode" = shim ] && preload=(LD_PRELOAD="$shim")
    env LD_LIBRARY_PATH="$work/lib" FAKEGPU_STATE="$scratch/state" \
        GPUSLICE_CONFIG="$scratch/limits.json" "${preload[@]}" \
        "$@" "$release/linked-client" alloc 2MiB
}

instructions() { # SCRATCH MODE
    local out="$work/cg.out"
    start "$1" "$2" valgrind --tool=callgrind --callgrind-out-file="$out" >/dev/null 2>&1
    sed -n 's/^summary: \([0-9]*\).*/\1/p;s/^totals: \([0-9]*\).*/\1/p' "$out" | head -1
}

fcntls() { # SCRATCH MODE
    start "$1" "$2" strace -f -qq -c -o "$work/strace.out" >/dev/null 2>&1
    awk '$NF == "fcntl" { print $4 } END {}' "$work/strace.out" | head -1 | grep . || echo 0
}

# Each start with the shim meets K live peers and no dead slot: it is the first start with
# the shim beside a fresh set of peers (a process that exits leaves its slot to be reaped).
declare -A figure
for k in "${sizes[@]}"; do
    scratch="$work/slice-$k"
    peers_up "$k" "$scratch"
    # The fake's files made before anything is counted.
    start "$scratch" driver >/dev/null 2>&1
    figure[driver,ins,$k]="$(instructions "$scratch" driver)"
    figure[driver,fcntl,$k]="$(fcntls "$scratch" driver)"
    figure[shim,ins,$k]="$(instructions "$scratch" shim)"
    stop_peers
    peers_up "$k" "$scratch"
    start "$scratch" driver >/dev/null 2>&1
    figure[shim,fcntl,$k]="$(fcntls "$scratch" shim)"
    stop_peers
done

printf '%-14s %14s %14s %14s %10s %10s\n' "live peers" "no shim" "shim" "added" \
    "fcntl" "(no shim)"
for k in "${sizes[@]}"; do
    d="${figure[driver,ins,$k]}" s="${figure[shim,ins,$k]}"
    printf '%-14s %14s %14s %14s %10s %10s\n' "$k" "$d" "$s" "+$((s - d))" \
        "${figure[shim,fcntl,$k]}" "${figure[driver,fcntl,$k]}"
done
