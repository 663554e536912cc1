//! The implementations of the fake NVML's exports, one module per family.
//!
//! Each `pub(crate) unsafe fn` here named like an NVML export implements that export: the
//! `nvml_api!` table in `lib.rs` declares the export (name, signature) and names its
//! function here (or in `smi_entry` for what nvidia-smi alone looks up). A body wraps its
//! work in `core::guard`, so no panic crosses the C boundary, over the plain Rust in `core`.

pub(crate) mod board;
pub(crate) mod device;
pub(crate) mod event;
pub(crate) mod memory;
pub(crate) mod nvlink;
pub(crate) mod process;
pub(crate) mod system;
