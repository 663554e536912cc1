#!/usr/bin/env bash
# Installs what the container end-to-end tests (cuda-tests/e2e/tests/containers.rs) need:
# podman and runc, plus a containers.conf that works on a CI machine without systemd:
#  - runc, because crun refuses cgroups in hybrid mode ("cgroups in hybrid mode not supported");
#  - the cgroupfs cgroup manager and a file events logger (no systemd/journald);
#  - no default ulimits (podman's defaults are refused inside an unprivileged CI sandbox).
# Idempotent: installs only what is missing, rewrites the config only when it differs.
# Prints the `export CONTAINERS_CONF=...` line to use; the tests also pick the file up on
# their own (they look at $CONTAINERS_CONF, then at this path).
set -euo pipefail

CONF=/etc/gpuslice-ci/containers.conf

if [ "$(id -u)" != 0 ]; then
    echo "container-setup: must run as root (podman is used rootful)" >&2
    exit 1
fi

missing=()
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v runc >/dev/null 2>&1 || missing+=(runc)
if [ "${#missing[@]}" -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q "${missing[@]}"
fi

want='# Written by .ci/container-setup.sh for the gpuslice container tests.
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
'
mkdir -p "$(dirname "$CONF")"
if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$(printf '%s' "$want")" ]; then
    printf '%s' "$want" >"$CONF.tmp"
    mv "$CONF.tmp" "$CONF"
fi
mkdir -p /etc/cdi

echo "container-setup: $(podman --version), $(runc --version | head -n1)"
echo "export CONTAINERS_CONF=$CONF"
