#!/bin/sh
# Installs the shim the way it ships. The shim is two files (docs/architecture.md, "Front and
# core"): libgpuslice.so, the small front library every process of a container maps (built
# without debug info; copied as is), and libgpuslice_core.so beside it, loaded at the first
# CUDA/NVML call: the core ships without its debug sections (its symbol table stays, so
# backtraces and profilers still name functions) plus a separate libgpuslice_core.so.debug
# (DWARF, compressed) that it names in .gnu_debuglink, so gdb and other debuggers find
# file:line information when the .debug file sits beside it. Why: the core is ~1 MB instead
# of ~5 MB (debug info is never mapped, but it is copied to every node and image layer).
#
# Usage: split-debug.sh LIB DEST_DIR
#   LIB: the front libgpuslice.so as cargo built it; the core is taken from beside it.
#   Writes DEST_DIR/libgpuslice.so, DEST_DIR/libgpuslice_core.so{,.debug}.
# Needs objcopy (binutils).
set -eu
lib="${1:?usage: split-debug.sh LIB DEST_DIR}"
dest="${2:?usage: split-debug.sh LIB DEST_DIR}"
core="$(dirname "$lib")/libgpuslice_core.so"
if [ ! -f "$core" ]; then
    echo "split-debug.sh: $core not found beside $lib (the shim is two files)" >&2
    exit 1
fi
mkdir -p "$dest"
tmp="$dest/.libgpuslice.so.split.$$"
objcopy --only-keep-debug --compress-debug-sections=zlib "$core" "$dest/libgpuslice_core.so.debug"
chmod 0644 "$dest/libgpuslice_core.so.debug"
# --add-gnu-debuglink records the .debug file's base name and CRC; debuggers look for it
# beside the library (and under /usr/lib/debug/<dir of the library>).
objcopy --strip-debug --add-gnu-debuglink="$dest/libgpuslice_core.so.debug" "$core" "$tmp"
chmod 0755 "$tmp"
mv -f "$tmp" "$dest/libgpuslice_core.so"
cp "$lib" "$tmp"
chmod 0755 "$tmp"
mv -f "$tmp" "$dest/libgpuslice.so"
