//! The implementations of the fake libcuda's exports, one module per family of the driver
//! API.
//!
//! Each `pub(crate) fn` here named like a CUDA export implements that export, and the
//! variants of it that behave alike (`_v2`, `_ptds`, `_ptsz`, ... with the same signature):
//! the `cuda_api!` table in `lib.rs` declares each export (name, `cuGetProcAddress` base
//! name, version, variant, signature) and names its function here; the table's shell wraps the
//! call in `guard` and traces it, so a body reads and writes the caller's pointers through
//! `ffi` (`get`, `put`, ...) and returns `R<()>`. Each module takes the crate root's names
//! (`use crate::*`: `cu()`, the `ffi` helpers, the ABI's types and constants) and keeps the
//! helpers only its family uses after its entry points.

pub(crate) mod array;
pub(crate) mod context;
pub(crate) mod device;
pub(crate) mod graph;
pub(crate) mod ipc;
pub(crate) mod launch;
pub(crate) mod lookup;
pub(crate) mod memory;
pub(crate) mod module;
pub(crate) mod pool;
pub(crate) mod stream;
pub(crate) mod tensor_map;
pub(crate) mod tools;
pub(crate) mod virtual_memory;
