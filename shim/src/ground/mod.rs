//! The ground layer: what the policy layer and the hook layer stand on. Nothing here imports
//! `hooks`, `memory`, `throttle` or `session` (checked by `layers`).
//!
//! * [`driver`]: the typed real-driver table (slots, signatures, `real::NAME()`), generated
//!   from the registry's one declaration.
//! * [`real`]: the real `dlsym` (via `dlvsym`), the real driver libraries, lazily resolved slots.
//! * [`devices`]: which limit applies to which device (UUID, then index), and the driver
//!   queries that tell.
//! * [`ffi_boundary`], [`log`]: panic containment and `[gpuslice]` logging.
//! * [`math`]: the built-in `exp`, so the core does not name libm.
//! * [`find_object`]: a hidden `_dl_find_object` for the static unwinder, so the core does not
//!   name libgcc_s and its glibc floor stays 2.34.

#[macro_use]
pub mod ffi_boundary;
#[macro_use]
pub mod log;
pub mod devices;
pub mod driver;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub mod find_object;
pub mod math;
pub mod real;
