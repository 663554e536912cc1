//! The simulated GPU ("fakegpu"): device specs, the state shared by every process through one
//! mapped file, and the plain-Rust model of the CUDA driver API that `fakegpu-cuda` exports.

pub mod cuda;
pub mod export_table;
pub mod host_pid;
pub mod nvml_sampling;
pub mod nvml_view;
pub mod spec;
pub mod state;
pub mod timeline;

pub use spec::DeviceSpec;
pub use state::{now_ns, open_state_at, state, ProcessUsage, SharedState, StateError};
