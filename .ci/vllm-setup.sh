#!/usr/bin/env bash
# vLLM from PyPI, unmodified, in a venv of its own for cuda-tests/e2e/tests/vllm.rs: it pins
# torch 2.14 (and its CUDA 13.0 wheels), which the system Python's torch 2.15 would clash with.
# The venv lives outside the clone, so a CI machine that keeps /var/cache builds it once:
#   GPUSLICE_VENVS (default /var/cache/gpuslice/venvs)/vllm, its interpreter handed to the
#   tests as E2E_VLLM_PYTHON by .ci/run.
#
# Idempotent: a venv stamped with the pinned version is kept as it is.
#
# Measured on the 2-core development machine (shared with other builds, load average ~25):
# - cold (no venv, nothing in pip's cache): 16.4 min wall through this script, 23 min in an
#   earlier run by hand, 3.4 min CPU; the download is most of it: 9.4 GB installed (torch
#   1.2 GB, the nvidia-* CUDA 13 wheels 3.5 GB, triton 0.9 GB, vllm 0.9 GB, flashinfer 0.5 GB,
#   cutlass-dsl 0.5 GB, the rest tilelang, opencv, llvmlite...);
# - warm (the stamped venv is there): 0.2 s.
# .ci/run starts this in the background right after its own pip installs and waits for it
# only before `cargo xtask test`, so the download overlaps the apt installs, fmt and the
# workspace's clippy build instead of adding to them.
# The tests (serial: `cargo test -p cuda-e2e --test vllm -- --test-threads=1`) start vLLM six
# times; measured on the same machine: 9.3 min as one run inside `cargo xtask test`; run one by
# one (load 15-65) sizing + generate 177 s, refusal 175 s, two processes (three starts) 288 s,
# `gpuslice run -m 8GiB` 231 s. Each start is about a minute of import and a minute or two of
# engine start (dummy weights, profiling, KV cache); on a quiet machine the refusal took
# 105 s. A warm run costs the same: nothing of a start is cached between runs.
set -euo pipefail

VLLM_VERSION=0.33.0
VENV="${GPUSLICE_VENVS:-/var/cache/gpuslice/venvs}/vllm"
STAMP="$VENV/.gpuslice-vllm-$VLLM_VERSION"

# (Finding the package, not importing it: `import vllm` alone takes most of a minute.)
if [ -f "$STAMP" ] && "$VENV/bin/python" -c "import importlib.util, sys
sys.exit(importlib.util.find_spec('vllm') is None)" >/dev/null 2>&1; then
    exit 0
fi

rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
if ! python3 -m venv "$VENV" 2>/dev/null; then
    # Debian's python3 keeps venv in a package of its own; virtualenv from PyPI needs no apt
    # (.ci/run runs this script beside its own apt-get calls, which hold dpkg's lock).
    rm -rf "$VENV"
    python3 -m pip install --quiet virtualenv
    python3 -m virtualenv --quiet "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet "vllm==$VLLM_VERSION"
touch "$STAMP"
