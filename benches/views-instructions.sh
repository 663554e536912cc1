#!/usr/bin/env bash
# Instructions the shim adds to the memory and process views (cuMemGetInfo_v2,
# cuDeviceTotalMem_v2, nvmlDeviceGetMemoryInfo, nvmlDeviceGetMemoryInfo_v2,
# nvmlDeviceGetComputeRunningProcesses_v3) and to the cuMemAlloc_v2 + cuMemFree_v2 pair, with
# 1, 64 and 1,024 LIVE processes in the slice: the measured process and N - 1 real, separate
# peers (`slice-peers`), each registered through libgpuslice.so with a context and 2 MiB on the
# fake card, alive for the whole measurement. The fake driver's own figure is measured with
# the same peers alive (its process list and its reaping grow with them too), so "added" is
# the shim's work alone. Counted by callgrind inside the workload's measured loop only (after a
# few calls that are not counted: the first view runs the sweep a start asks for), divided by
# the calls. Each measured process gives its context back before it exits, so the next one
# meets the same slice.
#
# Usage: benches/views-instructions.sh [CALLS [SIZES...]]   (default 1000 1 64 1024)
# Build first: cargo build --release -p fakegpu-cuda -p fakegpu-nvml -p gpuslice-shim \
#              -p gpuslice-benches
set -euo pipefail
# The fake's drivers look for dead processes on every call, as before the liveness lag: a
# count must not depend on how long the run took (FAKEGPU_LIVENESS_LAG_US, cuda-tests/README.md).
export FAKEGPU_LIVENESS_LAG_US=0
shopt -s inherit_errexit
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${ALLOC_PAIRS_BIN:-$root/target/release/alloc-pairs}"
calls_per_run="${1:-1000}"
sizes=(1 64 1024)
if [ "$#" -gt 1 ]; then
    sizes=("${@:2}")
fi
work="$(mktemp -d)"
peers_bin="$(dirname "$bin")/slice-peers"
peers_for=views-instructions
# shellcheck source=benches/slice-peers.sh
source "$root/benches/slice-peers.sh"
trap 'stop_peers; rm -rf "$work"' EXIT
# Small contexts: a thousand of the fake's default 300 MiB would not fit a card.
export FAKEGPU_CTX_OVERHEAD=$((4 << 20))

# Instructions of the measured loop of one run (CALLS calls + the uncounted warm-up).
count() { # SCRATCH MODE CALLS CALL
    local scratch="$1" mode="$2" calls="$3" call="$4" err out
    err="$(mktemp "$work/err.XXXX")"
    out="$(mktemp "$work/cg.XXXX")"
    if ! valgrind --tool=callgrind --toggle-collect='*measured*' --callgrind-out-file="$out" \
        "$bin" "--$mode" --threads 1 --pairs "$calls" --scratch "$scratch" --call "$call" \
        2>"$err"; then
        echo "views-instructions: $mode $call ($calls calls) failed:" >&2
        grep -v '^==' "$err" | tail -20 >&2
        return 1
    fi
    sed -n 's/^summary: \([0-9]*\).*/\1/p;s/^totals: \([0-9]*\).*/\1/p' "$out" | head -1
}

# The warm-up calls alloc-pairs makes before the counted ones (its WARM_UP).
warm_up=4

per_call() { # SCRATCH MODE CALL
    local n
    n="$(count "$1" "$2" "$((calls_per_run + warm_up))" "$3")"
    awk -v n="$n" -v c="$calls_per_run" 'BEGIN { printf "%.0f", n / c }'
}

calls=(pair mem-get-info device-total-mem nvml-memory nvml-memory-v2 nvml-processes)
declare -A driver added
for n in "${sizes[@]}"; do
    scratch="$work/slice-$n"
    peers_up "$((n - 1))" "$scratch"
    # One throwaway run of each: every measured run then meets the same slice (the one before
    # it dead in its slot until a sweep reaps it, the driver's and the region's files made).
    count "$scratch" driver 1 pair >/dev/null
    count "$scratch" shim 1 pair >/dev/null
    for call in "${calls[@]}"; do
        d="$(per_call "$scratch" driver "$call")"
        s="$(per_call "$scratch" shim "$call")"
        driver[$call,$n]="$d"
        added[$call,$n]="$((s - d))"
    done
    stop_peers
done

printf '%-18s' "call (added)"
for n in "${sizes[@]}"; do printf '%14s' "$n live"; done
printf '%26s\n' "driver at each size"
for call in "${calls[@]}"; do
    printf '%-18s' "$call"
    line=""
    for n in "${sizes[@]}"; do
        printf '%14s' "+${added[$call,$n]}"
        line+="${driver[$call,$n]} "
    done
    printf '%26s\n' "$line"
done
