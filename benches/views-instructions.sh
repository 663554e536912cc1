#!/usr/bin/env bash
# Instructions the shim adds to the memory and process views (cuMemGetInfo_v2,
# cuDeviceTotalMem_v2, nvmlDeviceGetMemoryInfo, nvmlDeviceGetMemoryInfo_v2,
# nvmlDeviceGetComputeRunningProcesses_v3) and to the cuMemAlloc_v2 + cuMemFree_v2 pair, with
# 1, 64 and 1,024 LIVE processes in the slice: the measured process and N - 1 real, separate
# peers (`slice-peers`), each registered through libgpuslice.so with a context and 2 MiB on the
# fake card, alive for the whole measurement. The fake driver's own figure is measured with
# the same peers alive (its process list and its reaping grow with them too), so "added" is
# the shim's work alone. Counted by callgrind as in alloc-instructions.sh: the difference
# between a run of P2 and a run of P1 calls, divided by P2 - P1.
#
# Usage: benches/views-instructions.sh [P1 P2 [SIZES...]]   (default 200 1200 1 64 1024)
# Build first: cargo build --release -p fakegpu-cuda -p fakegpu-nvml -p gpuslice-shim \
#              -p gpuslice-benches
set -euo pipefail
shopt -s inherit_errexit
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${ALLOC_PAIRS_BIN:-$root/target/release/alloc-pairs}"
p1="${1:-200}"
p2="${2:-1200}"
sizes=(1 64 1024)
if [ "$#" -gt 2 ]; then
    sizes=("${@:3}")
fi
work="$(mktemp -d)"
peers_pid=""
stop_peers() {
    if [ -n "$peers_pid" ]; then
        exec {hold}>&-
        wait "$peers_pid" || true
        peers_pid=""
    fi
}
trap 'stop_peers; rm -rf "$work"' EXIT
# Small contexts: a thousand of the fake's default 300 MiB would not fit a card.
export FAKEGPU_CTX_OVERHEAD=$((4 << 20))

count() { # SCRATCH MODE CALLS CALL
    local scratch="$1" mode="$2" calls="$3" call="$4" err
    err="$(mktemp "$work/err.XXXX")"
    if ! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        "$bin" "--$mode" --threads 1 --pairs "$calls" --scratch "$scratch" --call "$call" \
        2>"$err" || ! grep -q 'Collected : [0-9]' "$err"; then
        echo "views-instructions: $mode $call ($calls calls) gave no count:" >&2
        grep -v '^==' "$err" | tail -20 >&2
        return 1
    fi
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$err"
}

per_call() { # SCRATCH MODE CALL
    local a b
    a="$(count "$1" "$2" "$p1" "$3")"
    b="$(count "$1" "$2" "$p2" "$3")"
    awk -v a="$a" -v b="$b" -v d="$((p2 - p1))" 'BEGIN { printf "%.0f", (b - a) / d }'
}

calls=(pair mem-get-info device-total-mem nvml-memory nvml-memory-v2 nvml-processes)
declare -A driver added
for n in "${sizes[@]}"; do
    scratch="$work/slice-$n"
    mkdir -p "$scratch"
    fifo="$work/peers-$n"
    mkfifo "$fifo"
    "$(dirname "$bin")/slice-peers" --scratch "$scratch" --peers "$((n - 1))" \
        <"$fifo" >"$work/peers-$n.out" 2>"$work/peers-$n.err" &
    peers_pid=$!
    exec {hold}>"$fifo"
    until grep -q '^ready' "$work/peers-$n.out" 2>/dev/null; do
        if ! kill -0 "$peers_pid" 2>/dev/null; then
            echo "views-instructions: the peers did not start:" >&2
            cat "$work/peers-$n.err" >&2
            exit 1
        fi
        sleep 0.2
    done
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
