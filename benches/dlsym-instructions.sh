#!/usr/bin/env bash
# Instructions the exported `dlsym` (the front, libgpuslice.so) adds to one lookup of a name
# outside the registry, counted by callgrind inside the workload's `measured` loop only
# (`benches/src/bin/dlsym_loop.rs`): the loop through the front's dlsym minus the same loop
# through glibc's, divided by the lookups. `malloc` is rejected at its first byte; `cuserid`
# (libc's, `cu`-prefixed) is looked up in the front's name table first.
#
# Usage: benches/dlsym-instructions.sh [LOOKUPS]   (default 20000)
# Build first: cargo build --release -p gpuslice-shim -p gpuslice-benches
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${DLSYM_LOOP_BIN:-$root/target/release/dlsym-loop}"
lookups="${1:-20000}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

count() { # NAME [--real]
    local out="$work/cg.$RANDOM"
    valgrind --tool=callgrind --toggle-collect='*measured*' --callgrind-out-file="$out" \
        "$bin" --name "$@" --lookups "$lookups" 2>/dev/null
    sed -n 's/^summary: \([0-9]*\).*/\1/p;s/^totals: \([0-9]*\).*/\1/p' "$out" | head -1
}

printf '%-10s %14s %14s %10s\n' "name" "glibc/lookup" "front/lookup" "added"
for name in malloc cuserid; do
    real="$(count "$name" --real)"
    front="$(count "$name")"
    awk -v c="$name" -v d="$real" -v s="$front" -v n="$lookups" \
        'BEGIN { printf "%-10s %14.1f %14.1f %10.1f\n", c, d / n, s / n, (s - d) / n }'
done
