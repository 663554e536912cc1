#!/bin/sh
# gpuslice installer: copies the shim's two files, libgpuslice.so (the front every process
# maps) and libgpuslice_core.so (which the front loads from its own directory; plus its
# separate .debug file, when the image has one), and gpuslice from this image into a host
# directory (the DaemonSet pattern: `-v /opt/gpuslice:/host`, or a hostPath volume).
#
# Usage: install.sh [DEST]   (DEST defaults to /host; the source is $GPUSLICE_SRC or
#                             /opt/gpuslice inside the image)
#
# Each file is copied to a temporary name in DEST and renamed over the old one: processes
# on the node that have the old libgpuslice.so mapped keep their (now unlinked) copy, instead
# of having the file rewritten under them (which would crash them with SIGBUS).
# Needs only sh, cp and mv, so it runs in the minimal `prebuilt` image too.
set -eu

dest="${1:-/host}"
src="${GPUSLICE_SRC:-/opt/gpuslice}"

if [ ! -d "$dest" ]; then
    echo "gpuslice install: $dest is not a directory; mount the host directory there" \
        "(podman run -v /opt/gpuslice:$dest ..., or a hostPath volume)" >&2
    exit 1
fi

# libgpuslice_core.so.debug (the core's separate debug info, for debuggers) is optional.
# The core goes first: a front that finds a core of another version refuses it and fails
# closed (CUDA and NVML calls error), so a process started mid-install is never unlimited.
for file in libgpuslice_core.so libgpuslice.so gpuslice libgpuslice_core.so.debug; do
    if [ ! -f "$src/$file" ]; then
        [ "$file" = libgpuslice_core.so.debug ] && continue
        echo "gpuslice install: $src/$file is missing from the image" >&2
        exit 1
    fi
    tmp="$dest/.$file.install.$$"
    cp "$src/$file" "$tmp"
    mv -f "$tmp" "$dest/$file"
    echo "gpuslice install: installed $dest/$file"
done
