#!/usr/bin/env bash
# Instructions per cuMemAlloc_v2 + cuMemFree_v2 pair, fake driver alone vs through
# libgpuslice.so, at 1, 4 and 16 threads and at 4 processes x 16 threads (one slice, one
# region, one fake GPU). Counted by callgrind, so the figure does not depend on how the shared
# 2-core VM schedules threads. Each figure is the difference between a run of P2 and a run of
# P1 pairs per thread, divided by the extra pairs: process start-up, library loading and the
# first context cancel out.
#
# Caveats: callgrind runs one thread at a time, so lock waits that spin show up only as far as
# the serialised schedule makes them happen, and cache-line transfers cost no instructions at
# all; the figure is the work per pair, not its latency under contention.
#
# Usage: benches/alloc-instructions.sh [P1 P2]   (default 200 1200)
# Build first: cargo build --release -p fakegpu-cuda -p fakegpu-nvml -p gpuslice-shim \
#              -p gpuslice-benches
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${ALLOC_PAIRS_BIN:-$root/target/release/alloc-pairs}"
p1="${1:-200}"
p2="${2:-1200}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Instructions executed by one run (callgrind's "Collected"), per process for N processes.
count() { # MODE THREADS PAIRS PROCESSES
    local mode="$1" threads="$2" pairs="$3" procs="$4" scratch pids=() i
    scratch="$(mktemp -d "$work/run.XXXX")"
    for ((i = 0; i < procs; i++)); do
        valgrind --tool=callgrind --callgrind-out-file=/dev/null \
            "$bin" "--$mode" --threads "$threads" --pairs "$pairs" --scratch "$scratch" \
            2>"$scratch/err.$i" &
        pids+=($!)
    done
    # A run that failed or printed no count would pull the mean down (a negative "added"
    # figure once): say which and stop instead.
    for i in "${!pids[@]}"; do
        if ! wait "${pids[$i]}" || ! grep -q 'Collected : [0-9]' "$scratch/err.$i"; then
            echo "alloc-instructions: $mode run $i of $procs ($threads threads, $pairs pairs) gave no count:" >&2
            tail -5 "$scratch/err.$i" >&2
            return 1
        fi
    done
    cat "$scratch"/err.* | sed -n 's/.*Collected : \([0-9]*\).*/\1/p' |
        awk -v n="$procs" '{ s += $1 } END { printf "%.0f\n", s / n }'
}

printf '%-14s %12s %12s %12s\n' "case" "driver" "shim" "added"
for case in "1 1" "4 1" "16 1" "16 4"; do
    set -- $case
    threads="$1" procs="$2"
    per_pair=()
    for mode in driver shim; do
        a="$(count "$mode" "$threads" "$p1" "$procs")"
        b="$(count "$mode" "$threads" "$p2" "$procs")"
        per_pair+=("$(awk -v a="$a" -v b="$b" -v t="$threads" -v d="$((p2 - p1))" \
            'BEGIN { printf "%.0f", (b - a) / (t * d) }')")
    done
    label="${threads} thr"
    [ "$procs" -gt 1 ] && label="${procs} proc x ${threads}"
    printf '%-14s %12s %12s %12s\n' "$label" "${per_pair[0]}" "${per_pair[1]}" \
        "$((per_pair[1] - per_pair[0]))"
done
