#!/usr/bin/env bash
# Assembles the build context of the `prebuilt` image target (docker/Dockerfile) from binaries
# cargo already built, for machines that cannot reach an image registry (CI): no base image is
# pulled, the image is `FROM scratch` plus exactly the files copied here.
#
# Usage: docker/assemble-prebuilt.sh OUT [BIN_DIR]
#   BIN_DIR: where libgpuslice.so and gpuslice are (default: target/release, else target/debug)
# Then:  podman build -f docker/Dockerfile --target prebuilt -t gpuslice:prebuilt OUT
#
# OUT/rootfs/ gets /opt/gpuslice/{libgpuslice.so,libgpuslice_core.so,gpuslice,install.sh} (plus
# libgpuslice_core.so.debug,
# split off when objcopy is available), /bin/sh, cp and mv, and
# the shared libraries all of them need (from ldd, at the same paths as on this machine).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
out="${1:?usage: assemble-prebuilt.sh OUT [BIN_DIR]}"
bin_dir="${2:-}"
if [ -z "$bin_dir" ]; then
    if [ -f "$root/target/release/libgpuslice.so" ]; then
        bin_dir="$root/target/release"
    else
        bin_dir="$root/target/debug"
    fi
fi
for file in libgpuslice.so libgpuslice_core.so gpuslice; do
    if [ ! -f "$bin_dir/$file" ]; then
        echo "assemble-prebuilt: $bin_dir/$file not found; build it first" \
            "(cargo build -p gpuslice-shim -p gpuslice-ctl)" >&2
        exit 1
    fi
done

rootfs="$out/rootfs"
rm -rf "$rootfs"
mkdir -p "$rootfs/opt/gpuslice" "$rootfs/bin" "$rootfs/tmp" "$rootfs/host"

# Copies a file and every library ldd resolves for it to the same path under the rootfs.
copy_with_libs() {
    local file="$1" target="$2"
    mkdir -p "$rootfs$(dirname "$target")"
    cp -L "$file" "$rootfs$target"
    # ldd prints "name => /path (addr)" or "/path (addr)"; "not found" lines have no path.
    ldd "$file" 2>/dev/null | grep -o '/[^ ]*' | while read -r lib; do
        if [ ! -e "$rootfs$lib" ]; then
            mkdir -p "$rootfs$(dirname "$lib")"
            cp -L "$lib" "$rootfs$lib"
        fi
    done
}

copy_with_libs "$bin_dir/libgpuslice.so" /opt/gpuslice/libgpuslice.so
copy_with_libs "$bin_dir/libgpuslice_core.so" /opt/gpuslice/libgpuslice_core.so
# Ship the shim as the source-built image does: debug info split off (docker/split-debug.sh).
if command -v objcopy >/dev/null; then
    sh "$here/split-debug.sh" "$bin_dir/libgpuslice.so" "$rootfs/opt/gpuslice"
fi
copy_with_libs "$bin_dir/gpuslice" /opt/gpuslice/gpuslice
copy_with_libs "$(command -v sh)" /bin/sh
copy_with_libs "$(command -v cp)" /bin/cp
copy_with_libs "$(command -v mv)" /bin/mv
cp "$here/install.sh" "$rootfs/opt/gpuslice/install.sh"
chmod 0755 "$rootfs/opt/gpuslice/install.sh" "$rootfs/opt/gpuslice/gpuslice"
echo "assemble-prebuilt: context ready in $out (from $bin_dir)"
