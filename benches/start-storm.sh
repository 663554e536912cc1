#!/usr/bin/env bash
# Start storms with and without the shim, side by side: N processes of one slice (64, 200 and
# 1,024 by default) stand at a barrier after cuInit, are released in the same instant, make
# their contexts and allocate 2 MiB each; the figure is the time from the release to each
# one's first line (p50 and max, medians over rounds), and the ratio to the same storm on the
# fake driver alone. Wall-clock figures: they depend on the machine's load, so both storms of
# a round run back to back. The correctness of a storm (no failure, the card never above the
# cap, the ledger back to zero) is the start_storm test's.
#
# Usage: benches/start-storm.sh [SIZES [ROUNDS]]   (default 64,200,1024 and 3)
#        PROFILE=release builds and runs everything optimised (default: debug, as the tests).
#        STORM_STARTS=barrier|spawn measures one way only (default both).
#        STORM_PIDS=namespaces runs each member in a PID namespace of its own (unshare --pid,
#        as in a pod: the driver lists it under a host PID it cannot see) with the shim's
#        host-PID broker; namespaces-measured the same without the broker (each process
#        measures its host PID at its first context); host (default) in the test's namespace.
#        STORM_CONTEXT_BOUND=512MiB sets the shim's bound on a context's cost
#        (GPUSLICE_CONTEXT_OVERHEAD; default 8 MiB, twice the storm's 4 MiB contexts): a slice
#        makes at most its room over twice the bound of first contexts at once.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
profile=()
[ "${PROFILE:-debug}" = release ] && profile=(--release)
cargo build "${profile[@]}" -p gpuslice-shim -p fakegpu -p fakegpu-cuda -p fakegpu-nvml \
    -p cuda-clients -p gpuslice-ctl
STORM_SIZES="${1:-64,200,1024}" STORM_ROUNDS="${2:-3}" \
    cargo test "${profile[@]}" -p cuda-e2e --test start_storm -- --ignored --nocapture \
    --test-threads=1 measure_storms 2>&1 | grep -v '^\[gpuslice\]'
