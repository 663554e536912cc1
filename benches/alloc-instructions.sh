#!/usr/bin/env bash
# Instructions per cuMemAlloc_v2 + cuMemFree_v2 pair, fake driver alone vs through
# libgpuslice.so, at 1, 4 and 16 threads and at 4 processes x 16 threads (one slice, one
# region, one fake GPU); then, single-threaded, the pair and the memory views
# (cuMemGetInfo_v2, nvmlDeviceGetMemoryInfo, nvmlDeviceGetMemoryInfo_v2) with the slice's
# region holding 1, 64 and 1,024 registered processes (the others' slots registered before the
# measured process starts) and after 64 and 1,023 processes have exited (their slots given
# up: the region's high-water mark stays). Counted by callgrind, so the figure does not depend
# on how the shared 2-core VM schedules threads. Each figure is the difference between a run
# of P2 and a run of P1 calls per thread, divided by the extra calls: process start-up,
# library loading, registration and the first context cancel out.
#
# Caveats: callgrind runs one thread at a time, so lock waits that spin show up only as far as
# the serialised schedule makes them happen, and cache-line transfers cost no instructions at
# all; the figure is the work per pair, not its latency under contention.
#
# Usage: benches/alloc-instructions.sh [P1 P2]   (default 200 1200)
#        ALLOC_TABLES=threads|history restricts the output to one of the two tables.
# Build first: cargo build --release -p fakegpu-cuda -p fakegpu-nvml -p gpuslice-shim \
#              -p gpuslice-benches
set -euo pipefail
# The fake's drivers look for dead processes on every call, as before the liveness lag: a
# count must not depend on how long the run took (FAKEGPU_LIVENESS_LAG_US, cuda-tests/README.md).
export FAKEGPU_LIVENESS_LAG_US=0
# A failed run inside per_call's command substitutions must stop the script too.
shopt -s inherit_errexit
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${ALLOC_PAIRS_BIN:-$root/target/release/alloc-pairs}"
p1="${1:-200}"
p2="${2:-1200}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Instructions executed by one run (callgrind's "Collected"), per process for N processes.
count() { # MODE THREADS PAIRS PROCESSES [EXTRA ARGS...]
    local mode="$1" threads="$2" pairs="$3" procs="$4" scratch pids=() i
    shift 4
    scratch="$(mktemp -d "$work/run.XXXX")"
    for ((i = 0; i < procs; i++)); do
        valgrind --tool=callgrind --callgrind-out-file=/dev/null \
            "$bin" "--$mode" --threads "$threads" --pairs "$pairs" --scratch "$scratch" "$@" \
            2>"$scratch/err.$i" &
        pids+=($!)
    done
    # A run that failed or printed no count would pull the mean down (a negative "added"
    # figure once): say which and stop instead.
    for i in "${!pids[@]}"; do
        if ! wait "${pids[$i]}" || ! grep -q 'Collected : [0-9]' "$scratch/err.$i"; then
            echo "alloc-instructions: $mode run $i of $procs ($threads threads, $pairs pairs) gave no count:" >&2
            grep -v '^==' "$scratch/err.$i" | tail -20 >&2
            tail -3 "$scratch/err.$i" >&2
            return 1
        fi
    done
    cat "$scratch"/err.* | sed -n 's/.*Collected : \([0-9]*\).*/\1/p' |
        awk -v n="$procs" '{ s += $1 } END { printf "%.0f\n", s / n }'
}

# Instructions per call: (run of P2 - run of P1) / (threads x (P2 - P1)).
per_call() { # MODE THREADS PROCESSES [EXTRA ARGS...]
    local mode="$1" threads="$2" procs="$3" a b
    shift 3
    a="$(count "$mode" "$threads" "$p1" "$procs" "$@")"
    b="$(count "$mode" "$threads" "$p2" "$procs" "$@")"
    awk -v a="$a" -v b="$b" -v t="$threads" -v d="$((p2 - p1))" \
        'BEGIN { printf "%.0f", (b - a) / (t * d) }'
}

tables="${ALLOC_TABLES:-threads history}"
if [[ " $tables " == *" threads "* ]]; then
    printf '%-14s %12s %12s %12s\n' "case" "driver" "shim" "added"
    for case in "1 1" "4 1" "16 1" "16 4"; do
        set -- $case
        threads="$1" procs="$2"
        driver="$(per_call driver "$threads" "$procs")"
        shim="$(per_call shim "$threads" "$procs")"
        label="${threads} thr"
        [ "$procs" -gt 1 ] && label="${procs} proc x ${threads}"
        printf '%-14s %12s %12s %12s\n' "$label" "$driver" "$shim" "$((shim - driver))"
    done
fi

if [[ " $tables " == *" history "* ]]; then
    # One thread; "added" per call for each registration history of the slice.
    echo
    printf '%-16s %8s %9s %9s %9s %11s %11s\n' "call" "driver" "1 proc" "64 procs" \
        "1024 procs" "64 exited" "1023 exited"
    for call in pair mem-get-info nvml-memory nvml-memory-v2; do
        driver="$(per_call driver 1 1 --call "$call")"
        row=()
        for history in "--others 0" "--others 63" "--others 1023" "--exited 64" \
            "--exited 1023"; do
            # shellcheck disable=SC2086 # two words on purpose
            shim="$(per_call shim 1 1 --call "$call" $history)"
            row+=("+$((shim - driver))")
        done
        printf '%-16s %8s %9s %9s %9s %11s %11s\n' "$call" "$driver" "${row[@]}"
    done
fi
