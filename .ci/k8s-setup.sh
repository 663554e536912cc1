#!/usr/bin/env bash
# Builds upstream Kubernetes' own binaries (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl) from the Go module proxy for the cluster tests
# (dra/tests/cluster*.rs), into a cache outside the clone, and builds only what is missing.
#
# Usage: .ci/k8s-setup.sh [MINOR ...]   (default: the minors in GPUSLICE_K8S_MINORS, else 1.37)
#   Each MINOR names a module under dra/k8s/<MINOR>/ whose go.mod pins one release of
#   k8s.io/kubernetes and every staging module at the matching v0.x.y.
#   Binaries go to $GPUSLICE_K8S_CACHE/k8s-<release>/bin/ (default /var/cache/gpuslice);
#   GOMODCACHE and GOCACHE default to $GPUSLICE_K8S_CACHE/go/{mod,build}.
#   The last line printed for each minor is its bin directory.
#
# Cost of 1.37.2, measured on this project's 2-core machine (go build -p 2, one binary at a
# time):
#   cold (empty GOCACHE; 25 s of `go mod tidy` had filled the module cache, about 0.8 GB):
#     18 min of CPU (user 14m52s + sys 2m56s); 92 min of wall time on a machine shared with
#     eight other builds (load average 25-45): etcd 404 s, kube-apiserver 3522 s,
#     kube-controller-manager 1091 s, kube-scheduler 254 s, kubectl 264 s. Alone on the two
#     cores that is about 10-12 min. The caches then hold about 3 GB, the binaries 375 MB.
#   warm (binaries present, stamp unchanged): 0.1 s.
# Cost of 1.34.4 (GPUSLICE_K8S_MINORS="1.37 1.34"; its own modules, so little of 1.37's
# GOCACHE is reused): 43 min of wall time, from the binaries' timestamps, on the same machine
# shared with other builds (load average far above 2): etcd 3.6.4 about 6 min,
# kube-apiserver 24, kube-controller-manager 7, kube-scheduler 3, kubectl 3. CPU time was not
# measured; expect the order of 1.37's. Binaries 356 MB.
# CI keeps all of it in /var/cache/gpuslice, outside the clone.
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${GPUSLICE_K8S_CACHE:-/var/cache/gpuslice}
export GOMODCACHE=${GOMODCACHE:-$cache/go/mod}
export GOCACHE=${GOCACHE:-$cache/go/build}
export GOFLAGS=-buildvcs=false
export CGO_ENABLED=0

# One build at a time per cache (two at once would race on the same files).
mkdir -p "$cache"
exec 9>"$cache/.k8s-setup.lock"
flock 9

minors=("$@")
if [ ${#minors[@]} -eq 0 ]; then
    read -r -a minors <<<"${GPUSLICE_K8S_MINORS:-1.37}"
fi

for minor in "${minors[@]}"; do
    module=dra/k8s/$minor
    [ -f "$module/go.mod" ] || { echo "k8s-setup: no module $module/go.mod" >&2; exit 1; }
    release=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2 }' "$module/go.mod")
    [ -n "$release" ] || { echo "k8s-setup: $module/go.mod requires no k8s.io/kubernetes" >&2; exit 1; }
    bin=$cache/k8s-${release#v}/bin
    # A change to the module (a new pin) rebuilds everything.
    stamp=$(cat "$module/go.mod" "$module/go.sum" "$module/etcd/main.go" | sha256sum | cut -c1-16)
    if [ "$(cat "$bin/.stamp" 2>/dev/null)" != "$stamp" ]; then
        rm -rf "$bin"
    fi
    mkdir -p "$bin"

    major=${release#v}; major=${major%%.*}
    minor_number=${release#v$major.}; minor_number=${minor_number%%.*}
    ldflags="-s -w"
    # Without these the binaries report v0.0.0 (the version package's defaults).
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $pkg.gitVersion=$release -X $pkg.gitMajor=$major"
        ldflags+=" -X $pkg.gitMinor=$minor_number -X $pkg.gitTreeState=clean"
    done

    for name in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl; do
        [ -x "$bin/$name" ] && continue
        if [ "$name" = etcd ]; then pkg=./etcd; else pkg=k8s.io/kubernetes/cmd/$name; fi
        start=$(date +%s)
        # One binary at a time, two compile jobs: the machine has 2 cores and shares its memory.
        (cd "$module" && nice -n 10 go build -p 2 -trimpath -ldflags "$ldflags" \
            -o "$bin/$name.tmp" "$pkg")
        mv "$bin/$name.tmp" "$bin/$name"
        echo "k8s-setup: built $name $release in $(($(date +%s) - start)) s" >&2
    done
    echo "$stamp" >"$bin/.stamp"
    echo "$bin"
done
