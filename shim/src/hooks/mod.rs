//! Wrapper bodies ("handlers") named by the registry. Each takes the real function first, then
//! the caller's arguments unchanged, and returns the C result code. They run inside the
//! export's panic boundary and after its fail-closed gate.

pub mod cuda;
pub mod nvml;
pub mod proc_address;
