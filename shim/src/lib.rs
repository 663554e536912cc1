//! libgpuslice.so: injected into every process of a container (LD_PRELOAD or
//! `/etc/ld.so.preload`), it sits between CUDA/NVML clients and the real driver and turns one
//! GPU into an enforced slice.
//!
//! Module map (the FFI shell is tiny; the logic is plain Rust with unit tests):
//! * [`registry`]: the ONE table of hooked functions; generates the exports, the real-function
//!   slots, the name -> wrapper table (dlsym) and the real-pointer -> wrapper map
//!   (cuGetProcAddress).
//! * [`real`]: the real `dlsym` (via `dlvsym`), the real driver libraries, lazily resolved slots.
//! * [`dlsym_hook`]: the exported `dlsym` trampoline and its decision function.
//! * [`hooks`]: the wrapper bodies (CUDA, NVML, cuGetProcAddress).
//! * [`state`]: lazy, once-per-process initialisation (config), fork handling, fail-closed gate.
//! * [`refusal`]: what a fail-closed process says (one line naming what to run) and which
//!   entry points stay open (cuGetProcAddress, so bindings see error codes, not missing functions).
//! * [`devices`]: which limit applies to which device (UUID, then index).
//! * [`device_check`]: fails the slice closed when a limit-file entry names no device.
//! * [`report`]: the reporting math (slice view of memory numbers: clamping, no wrap).
//! * [`memory`], [`throttle`]: policy seams, pass-through for now.
//! * [`nesting`]: hooks never nest on a thread (a driver calling its own exports).
//! * [`ffi_boundary`], [`log`]: panic containment and `[gpuslice]` logging.
//! * [`math`]: the built-in `exp`, so libm is not loaded into every process.
//! * [`find_object`]: a hidden `_dl_find_object` for the static unwinder, so libgcc_s is not
//!   loaded into every process and the glibc floor stays 2.34.
//!
//! Exports are compiled only outside `cfg(test)`: a unit-test binary must never interpose its
//! own `dlsym` or `cu*` symbols.

#![allow(clippy::missing_safety_doc)]

#[macro_use]
pub mod ffi_boundary;
#[macro_use]
pub mod log;
pub mod device_check;
pub mod devices;
pub mod dlsym_hook;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub mod find_object;
pub mod hooks;
pub mod math;
pub mod memory;
pub mod nesting;
pub mod real;
#[macro_use]
pub mod registry;
pub mod refusal;
pub mod report;
pub mod state;
pub mod throttle;
