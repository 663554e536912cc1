//! The session layer: everything that is "this process's slice", below both policies
//! (`memory`, `throttle`) and above the ground. Each policy reads it; neither reaches into the
//! other for it (checked by `layers`).
//!
//! * [`clock`]: the monotonic clock and the absolute sleep (no state);
//! * [`mode`]: the one published [`mode::Mode`] of this process (loaded by `lifecycle`);

pub mod clock;
pub mod mode;
