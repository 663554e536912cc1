#!/usr/bin/env bash
# Unpacks llama.cpp from Debian sid for cuda-tests/e2e/tests/llama_cpp.rs: the CLI tools and
# server (contrib: llama.cpp-tools, libllama0, libggml0, libggml0-backend-cuda) and NVIDIA's
# CUDA 12.4 runtime and cuBLAS they link (non-free: libcudart12, libcublas12, libcublaslt12),
# with sid's own C/C++ runtime (main: libc6, libstdc++6, libgcc-s1, libgomp1, libssl3t64):
# the binaries need glibc 2.43, so the tests run them with the tree's own loader
# (usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 --library-path ...), never the system's.
# Nothing is installed: the packages are downloaded (`apt-get download`) and unpacked
# (`dpkg -x`) into $DEST, from a private sources list and private index directories under
# $DEST.apt, as .ci/nvidia-smi-setup.sh does; the system's apt configuration is untouched and no
# driver package is fetched (the tests bring the fake libcuda). sid moves: whatever it has is
# taken, and $DEST/VERSIONS records the versions unpacked (0.7.0 / ggml 0.27.0 / CUDA 12.4
# when this was written).
#
# Result: $DEST/usr/... (DEST defaults to /opt/gpuslice-ci/llama.cpp; the tests find it there,
# E2E_LLAMA_CPP=/path names another tree). Idempotent: a tree already unpacked is kept.
# Cost measured on the 2-core dev machine under load: cold 74 s to 148 s (sid's indexes 16 s,
# 335 MB of packages 18 s, unpacking 1.1 GB the rest), warm 0.06 s; disk 1.1 GB (the .debs
# are removed).
set -euo pipefail

DEST=${GPUSLICE_LLAMA_CPP_DIR:-/opt/gpuslice-ci/llama.cpp}
PACKAGES=(llama.cpp-tools libllama0 libggml0 libggml0-backend-cuda
    libcudart12 libcublas12 libcublaslt12
    libc6 libstdc++6 libgcc-s1 libgomp1 libssl3t64)

if [ -x "$DEST/usr/bin/llama-server" ] && [ -f "$DEST/VERSIONS" ]; then
    echo "llama-cpp-setup: already present under $DEST"
    exit 0
fi

. "$(dirname "$0")/private-apt.sh"
private_apt "$DEST.apt" "sid:main contrib non-free"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get "${APT_OPTS[@]}" download "${PACKAGES[@]}" >/dev/null)
rm -rf "$DEST.tmp"
mkdir -p "$DEST.tmp"
for deb in "$work"/*.deb; do
    dpkg -x "$deb" "$DEST.tmp"
    echo "$(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version)" >>"$DEST.tmp/VERSIONS"
done
rm -rf "$DEST"
mv "$DEST.tmp" "$DEST"
echo "llama-cpp-setup: $DEST ($(grep -E '^(llama.cpp-tools|libggml0-backend-cuda|libcudart12) ' "$DEST/VERSIONS" | tr '\n' ' '))"
