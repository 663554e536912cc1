//! Logic shared by `libgpuslice.so` and the `gpuslice` CLI: the limit-file contract
//! (`config`, `size`), which configured devices exist (`visible`), bounded message text
//! (`text`), the monotonic clock (`clock`), the cross-process shared region (`region`),
//! the process-local short lock (`turn`), the bound on memory the driver holds unpriced
//! (`unpriced`) and the host memory of oversubscribed slices (`host_memory`).
//!
//! Nothing here exports C symbols: the CLI links this crate and must never carry the
//! shim's hook exports.

pub mod cdi;
pub mod clock;
pub mod config;
pub mod host_memory;
pub mod host_pid_broker;
pub mod region;
pub mod size;
pub mod text;
pub mod turn;
pub mod unpriced;
pub mod visible;

/// Devices one slice can describe: limit-file indices are `0..MAX_DEVICES` and the shared
/// region has this many device entries.
pub const MAX_DEVICES: usize = 16;
