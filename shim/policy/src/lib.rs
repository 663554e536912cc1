//! The shim's policy models, pure: plain data and arithmetic over atomics and maps, with no
//! driver call, no FFI, no clock and no process state (time, sizes and answers are passed
//! in). The shim (`libgpuslice_core.so`) owns the state these models run on and the driver
//! calls that feed them; this crate cannot name the shim, so that the models never reach up
//! into the hook or session layers is enforced by Cargo, not by a review.
//!
//! The modules are private: what the shim uses is the facade below, one group per model.

mod bucket;
mod controller;
mod probe;

// Compute share: the token bucket (a GCRA word shared by the slice's processes, and the
// process-local credit the common launch spends).
pub use bucket::{
    adjust, gpu_ns, inv_rate_fixed, repair_lead, rescale_lead, rescaled_due, reserve, Credit,
    LaunchCost, PidTable,
};
// Compute share: the feedback law that steers the bucket's rate toward the share.
pub use controller::{Controller, Tick, INITIAL_COST_NS};
// Compute share: the start-up estimate of the per-launch cost from the launches' own timing.
pub use probe::{estimate_within, Probe, ProbeWait};
