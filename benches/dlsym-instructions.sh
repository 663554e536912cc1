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
# The fake's drivers look for dead processes on every call, as before the liveness lag: a
# count must not depend on how long the run took (FAKEGPU_LIVENESS_LAG_US, cuda-tests/README.md).
export FAKEGPU_LIVENESS_LAG_US=0
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

# dlsym as the application sees it.
release="$(dirname "$bin")"
app="$release/app-dlsym"
"$release/fakegpu" install "$work/lib" >/dev/null
app_count() { # SCRATCH HANDLE NAME [ENV...]
    local scratch="$1" handle="$2" name="$3" out="$work/cg.$RANDOM"
    shift 3
    env LD_LIBRARY_PATH="$work/lib" "$@" valgrind --tool=callgrind --toggle-collect='*measured*' \
        --callgrind-out-file="$out" "$app" --scratch "$scratch" --handle "$handle" \
        --name "$name" --lookups "$lookups" 2>/dev/null
    sed -n 's/^summary: \([0-9]*\).*/\1/p;s/^totals: \([0-9]*\).*/\1/p' "$out" | head -1
}
echo
printf '%-20s %14s %14s %10s\n' "as the app sees it" "no shim/lookup" "shim/lookup" "added"
for handle in default libc; do
    for name in malloc cuserid; do
        plain="$(app_count "$work/plain" "$handle" "$name")"
        shim="$(app_count "$work/shim" "$handle" "$name" LD_PRELOAD="$release/libgpuslice.so")"
        awk -v c="$name in $handle" -v d="$plain" -v s="$shim" -v n="$lookups" \
            'BEGIN { printf "%-20s %14.1f %14.1f %10.1f\n", c, d / n, s / n, (s - d) / n }'
    done
done
