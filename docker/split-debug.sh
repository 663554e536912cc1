#!/bin/sh
# Installs libgpuslice.so the way it ships: the library without its debug sections (its
# symbol table stays, so backtraces and profilers still name functions) plus a separate
# libgpuslice.so.debug (DWARF, compressed) that the library names in .gnu_debuglink, so gdb
# and other debuggers find file:line information when the .debug file sits beside it.
# Why: /etc/ld.so.preload loads the shim into every process of a container; the shipped file
# is ~1 MB instead of ~5 MB (debug info is never mapped, but it is copied to every node and
# image layer).
#
# Usage: split-debug.sh LIB DEST_DIR   (writes DEST_DIR/libgpuslice.so{,.debug})
# Needs objcopy (binutils).
set -eu
lib="${1:?usage: split-debug.sh LIB DEST_DIR}"
dest="${2:?usage: split-debug.sh LIB DEST_DIR}"
mkdir -p "$dest"
tmp="$dest/.libgpuslice.so.split.$$"
objcopy --only-keep-debug --compress-debug-sections=zlib "$lib" "$dest/libgpuslice.so.debug"
chmod 0644 "$dest/libgpuslice.so.debug"
# --add-gnu-debuglink records the .debug file's base name and CRC; debuggers look for it
# beside the library (and under /usr/lib/debug/<dir of the library>).
objcopy --strip-debug --add-gnu-debuglink="$dest/libgpuslice.so.debug" "$lib" "$tmp"
chmod 0755 "$tmp"
mv -f "$tmp" "$dest/libgpuslice.so"
