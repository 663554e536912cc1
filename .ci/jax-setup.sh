#!/usr/bin/env bash
# JAX from PyPI with its CUDA 13 plugin (`jax[cuda13]`: jax, jaxlib, jax-cuda13-plugin,
# jax-cuda13-pjrt and the NVIDIA CUDA 13 wheels they pin: runtime, CUPTI, cuBLAS, cuDNN, NCCL,
# nvcc/ptxas, ...) for cuda-tests/e2e/tests/jax.rs, in a venv of its own outside the clone:
# its NVIDIA wheels differ from PyTorch's in the system Python. The tests find it at
# /opt/gpuslice-ci/venvs/jax (GPUSLICE_JAX_VENV here, E2E_JAX_PYTHON in the tests, name
# another). Idempotent: a venv with this JAX already importable is kept.
#
# Cost measured on the 2-core dev machine under load (other builds running): cold 7 min 6 s
# (about 3 GB of wheels from PyPI, 4.4 GB installed), 5 min 44 s with pip's cache warm and the
# venv gone (unpacking dominates), warm (venv present: one `import jax`) 10 s.
set -euo pipefail

JAX_VERSION=0.10.2
VENV=${GPUSLICE_JAX_VENV:-/opt/gpuslice-ci/venvs/jax}

if "$VENV/bin/python" -c "import jax, sys; sys.exit(jax.__version__ != '$JAX_VERSION')" \
    2>/dev/null; then
    echo "jax-setup: jax $JAX_VERSION already in $VENV"
    exit 0
fi
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet "jax[cuda13]==$JAX_VERSION"
echo "jax-setup: jax $JAX_VERSION in $VENV"
