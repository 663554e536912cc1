#!/usr/bin/env bash
# Instructions the shim adds to one cuLaunchKernel, with no share and with a 90 % share (tokens
# available, as in the criterion bench `--bench throttle`), counted by callgrind inside the
# workload's `measured` loop only (`benches/src/bin/launch_loop.rs`): the loop through the
# shim's export minus the same loop calling the fake's cuLaunchKernel directly, divided by
# the launches. The count does not depend on how the shared VM schedules the process; at
# >= 1 instruction per cycle and >= 2 GHz, N instructions take at most N / 2 ns (and about
# N / 10 ns on a current x86 core at 3-4 instructions per cycle).
#
# Usage: benches/launch-instructions.sh [LAUNCHES]   (default 20000)
# Build first: cargo build --release -p fakegpu-cuda -p fakegpu-nvml -p gpuslice-shim \
#              -p gpuslice-benches
set -euo pipefail
# The fake's drivers look for dead processes on every call, as before the liveness lag: a
# count must not depend on how long the run took (FAKEGPU_LIVENESS_LAG_US, cuda-tests/README.md).
export FAKEGPU_LIVENESS_LAG_US=0
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${LAUNCH_LOOP_BIN:-$root/target/release/launch-loop}"
launches="${1:-20000}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

count() { # SHARE_FLAG [--driver]
    local out="$work/cg.$RANDOM"
    valgrind --tool=callgrind --toggle-collect='*measured*' --callgrind-out-file="$out" \
        "$bin" "$@" --launches "$launches" --scratch "$(mktemp -d "$work/run.XXXX")" 2>/dev/null
    sed -n 's/^summary: \([0-9]*\).*/\1/p;s/^totals: \([0-9]*\).*/\1/p' "$out" | head -1
}

printf '%-10s %14s %14s %10s\n' "case" "driver/launch" "shim/launch" "added"
for flag in --no-share --share; do
    driver="$(count "$flag" --driver)"
    shim="$(count "$flag")"
    awk -v c="${flag#--}" -v d="$driver" -v s="$shim" -v n="$launches" \
        'BEGIN { printf "%-10s %14.1f %14.1f %10.1f\n", c, d / n, s / n, (s - d) / n }'
done
