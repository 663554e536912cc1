#!/usr/bin/env bash
# Fetches NVIDIA's own nvidia-smi binaries from Debian's non-free component, for the tests that
# run the real binary against the simulated GPU (cuda-tests/e2e/tests/nvidia_smi.rs):
#   bookworm non-free: nvidia-smi 535.261.03 (the one Debian 12 ships)
#   trixie   non-free: nvidia-smi 550.163.01 (the newest NVIDIA build Debian's archive offers;
#                      bookworm-backports has only 535.216.03)
# Only the nvidia-smi package is downloaded (`apt-get download`) and unpacked (`dpkg -x`):
# nothing is installed, so its dependencies on the driver (nvidia-alternative,
# libnvidia-ml1, the kernel module) are never pulled. apt runs on a private sources list and
# private index directories under $DEST/apt, so the system's apt configuration is untouched
# and no other package can come from non-free. The mirror is the one /etc/apt/sources.list*
# already uses for Debian, else deb.debian.org.
#
# Result: $DEST/<suite>/nvidia-smi (+ VERSION) (DEST defaults to /opt/gpuslice-ci/nvidia-smi), which the
# tests find on their own; E2E_NVIDIA_SMI=/path/to/nvidia-smi picks one binary instead.
# Idempotent: a build already unpacked is kept. Cost on a clean machine: 0.4 s measured (two small
# index downloads and two packages under 1 MB each).
set -euo pipefail

DEST=${GPUSLICE_NVIDIA_SMI_DIR:-/opt/gpuslice-ci/nvidia-smi}
SUITES=(bookworm trixie)

have_all=true
for suite in "${SUITES[@]}"; do
    [ -x "$DEST/$suite/nvidia-smi" ] || have_all=false
done
if $have_all; then
    echo "nvidia-smi-setup: already present under $DEST"
    exit 0
fi

. "$(dirname "$0")/private-apt.sh"
private_apt "$DEST/apt" "${SUITES[@]/%/:non-free}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for suite in "${SUITES[@]}"; do
    if [ -x "$DEST/$suite/nvidia-smi" ]; then
        continue
    fi
    (cd "$work" && apt-get "${APT_OPTS[@]}" download "nvidia-smi/$suite" >/dev/null)
    deb=$(ls "$work"/nvidia-smi_*.deb)
    version=$(dpkg-deb -f "$deb" Version)
    dpkg -x "$deb" "$work/x"
    mkdir -p "$DEST/$suite.tmp"
    cp "$work/x/usr/lib/nvidia/current/nvidia-smi" "$DEST/$suite.tmp/nvidia-smi"
    echo "$version" >"$DEST/$suite.tmp/VERSION"
    rm -rf "$DEST/$suite" "$work/x" "$deb"
    mv "$DEST/$suite.tmp" "$DEST/$suite"
    echo "nvidia-smi-setup: $DEST/$suite/nvidia-smi ($version)"
done
