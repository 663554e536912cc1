#!/usr/bin/env bash
# What oversubscription costs on the simulated driver: a 2 GiB slice with a virtual size of
# 3 GiB, filled with 256 MiB cuMemAlloc_v2 chunks by procaddr-client's `oversubscribe`
# scenario (FAKEGPU_MANAGED_MEMORY=on-demand); per card, the time of one allocation on the
# card and of one placed in host memory (wall, includes populating its 256 MiB of pages; it
# depends on the machine's load), and the time of one kernel launch reading a 256 MiB chunk on
# the card and one reading a chunk in host memory (the fake's timeline: the kernel's base
# time plus what crosses the host link at FAKEGPU_HOST_LINK_GBPS, PCIe 3.0's 12 GB/s on a
# V100, 5.0's 50 GB/s on an H200), each launch timed to its synchronisation, averaged over
# TOUCHES launches. The fake charges no time for reading the card's own memory; the last
# column is the same read at the card's memory bandwidth (computed from the data sheets:
# V100 HBM2 900 GB/s, H200 HBM3e 4.8 TB/s), against the host read.
#
# Usage: benches/oversubscribe-throughput.sh [TOUCHES]   (default 8)
# Build first: cargo build -p gpuslice-shim -p fakegpu -p fakegpu-cuda -p fakegpu-nvml \
#              -p cuda-clients   (or --release, with TARGET=release)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
target="$root/target/${TARGET:-debug}"
touches="${1:-8}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$target/fakegpu" install "$work/lib" >/dev/null
cat >"$work/limits.json" <<JSON
{"version": 1, "region": "$work/region", "devices": [{"index": 0, "memory": "2GiB", "virtual": "3GiB"}]}
JSON
printf '%-6s %12s %12s %14s %14s %20s\n' card alloc-card alloc-host launch-card launch-host 'HBM read (computed)'
for card in v100 h200; do
    line="$(env LD_LIBRARY_PATH="$work/lib" FAKEGPU_STATE="$work/$card.state" FAKEGPU_DEVICES="$card" \
        FAKEGPU_MANAGED_MEMORY=on-demand GPUSLICE_CONFIG="$work/limits.json" \
        LD_PRELOAD="$target/libgpuslice.so" \
        "$target/procaddr-client" oversubscribe 256MiB --touches "$touches" </dev/null 2>/dev/null)"
    python3 - "$card" "$line" <<'PY'
import json, sys
card, line = sys.argv[1], json.loads(sys.argv[2])
ms = lambda ns: f"{ns / 1e6:.2f} ms"
first, last = line["first_touch_ns"], line["last_touch_ns"]
hbm = line["chunk"] / {"v100": 900e9, "h200": 4800e9}[card] * 1e9
print(f"{card:<6} {ms(line['first_alloc_ns']):>12} {ms(line['last_alloc_ns']):>12} "
      f"{ms(first):>14} {ms(last):>14} {ms(hbm) + f' ({last / hbm:.0f}x)':>20}")
PY
done
