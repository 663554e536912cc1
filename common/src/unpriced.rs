//! The one bound shared by the shim's pricing of the memory a driver places by itself and the
//! node agent's backstop: how many bytes the driver may hold for a registered process on one
//! device beyond what that process's slot is charged before those bytes are "unaccounted".
//!
//! The shim prices what the driver places by itself (stack, printf FIFO and heap limits, module
//! data, local memory, contexts) before the call that makes the driver place it; what its model
//! cannot know exactly (rounding, the driver's bookkeeping) stays within this bound. Anything
//! beyond it is no model error: the node agent reports it and, when enforcing, ends the process
//! that holds it (`agent/src/backstop.rs`).

/// Per process and device.
pub const UNPRICED_BOUND_BYTES: u64 = 64 << 20;
