//! libgpuslice.so
