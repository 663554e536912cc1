//! The one bound shared by the shim's pricing of the memory a driver places by itself and the
//! node agent's backstop: how many bytes the driver may hold for a registered process on one
//! device beyond what that process's slot is charged before those bytes are "unaccounted".
//!
//! The shim prices what the driver places by itself (stack, printf FIFO and heap limits, module
//! data, local memory, contexts) before the call that makes the driver place it; what its model
//! cannot know exactly (rounding, the driver's bookkeeping) stays within this bound. Anything
//! beyond it is no model error: the node agent reports it and, when enforcing, ends the process
//! that holds it (`agent/src/backstop.rs`).

/// Per process and device. The shim's model errs, per context, by what a context's measured
/// cost holds of its first module pages (`CONTEXT_MODULE_ARENA`, 8 MiB: the shim takes them to
/// be there, a driver may make them later) and by the driver's rounding past what its read-back
/// shows (at most one 2 MiB page each for the stack and local memory, the printf FIFO, the
/// malloc heap and the modules' images): 16 MiB per context. 64 MiB covers four contexts of
/// one process on one device (a process usually has one, its primary context); a process
/// holding more than its charge plus this is not erring by the model.
pub const UNPRICED_BOUND_BYTES: u64 = 64 << 20;
