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
# Cost on this project's 2-core machine (go build -p 2, one binary at a time), 1.37.2:
#   cold (empty module and build caches): see COLD below; warm (binaries present): < 1 s,
#   warm caches but binaries missing: see WARM below.
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${GPUSLICE_K8S_CACHE:-/var/cache/gpuslice}
export GOMODCACHE=${GOMODCACHE:-$cache/go/mod}
export GOCACHE=${GOCACHE:-$cache/go/build}
export GOFLAGS=-buildvcs=false
export CGO_ENABLED=0

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
