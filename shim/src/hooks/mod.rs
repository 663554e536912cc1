//! The hook layer: everything a CUDA or NVML client reaches. It may use every layer below
//! (`memory`, `throttle`, `ground`); nothing below imports it (checked by `layers`).
//!
//! * [`registry`]: the ONE table of hooked functions; generates the exports, the name ->
//!   wrapper table (dlsym) and the real-pointer -> wrapper map (cuGetProcAddress).
//! * [`dlsym`]: the exported `dlsym` trampoline and its decision function.
//! * [`front`]: how the front library (`libgpuslice.so`, `shim/front/`) attaches this one:
//!   its exports become the pointers the shim hands out, its `RTLD_NEXT` lookups ours.
//! * [`proc_address`]: the cuGetProcAddress handlers.
//! * [`refusal`]: what a fail-closed process says (one line naming what to run) and which
//!   entry points stay open (cuGetProcAddress, so bindings see error codes, not missing
//!   functions).
//! * [`lifecycle`]: the process's way through its states (`session::state`): the lazy load
//!   of the configuration, the gate every export passes, `cuInit`;
//! * [`device_check`]: fails the slice closed when a limit-file entry names no device.
//! * [`nesting`]: hooks never nest on a thread (a driver calling its own exports).
//! * the handlers ("wrapper bodies") named by the registry, one file per family. Each takes
//!   the real function first, then the caller's arguments unchanged, and returns the C result
//!   code. They run inside the export's panic boundary and after its fail-closed gate.
//! * [`out`]: the caller's out-parameters as handlers answer through them.
//!
//! ## The handler contract
//! Every handler's `# Safety`: it is sound to call with `real`, the real function of the
//! registry's signature, and the caller's arguments as the C API requires them of its caller
//! (an out-pointer NULL or valid for writes of its type, an in-pointer NULL or valid for reads
//! of what it describes, a buffer as large as its count says; handles may be anything, the
//! driver validates them). The exports of the registry call them so, and nothing else does.
//! A handler decodes those arguments into values ([`out::Out`] for out-parameters), makes
//! one policy call and writes the answer; the policy below takes and returns values.

pub mod context;
pub mod device_check;
pub mod dlsym;
pub mod front;
pub mod launch;
pub mod lifecycle;
pub mod memory;
pub mod module;
pub mod nesting;
pub mod nvml;
pub mod out;
pub mod proc_address;
pub mod query;
pub mod refusal;
#[macro_use]
pub mod registry;
