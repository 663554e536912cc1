//! The shim's policy models, pure: plain data and arithmetic over atomics and maps, with no
//! driver call, no FFI, no clock and no process state (time, sizes and the driver's answers
//! are passed in). The shim (`libgpuslice_core.so`) owns the state these models run on and
//! the driver calls that feed them; this crate cannot name the shim, so that the models never
//! reach up into the hook or session layers is enforced by Cargo, not by a review.
//!
//! The modules are private; what the shim uses is the facade below, one group per model.
//! The compute-share models (`throttle/`) and the memory models (`memory/`) are siblings and
//! never import each other (checked by a test below).

mod throttle {
    pub(crate) mod bucket;
    pub(crate) mod controller;
    pub(crate) mod probe;
}

mod memory {
    pub(crate) mod graph_book;
    pub(crate) mod ledger;
    pub(crate) mod objects;
    pub(crate) mod pool_book;
    pub(crate) mod report;
    pub(crate) mod vmm_book;
}

// Compute share: the token bucket (a GCRA word shared by the slice's processes, and the
// process-local credit the common launch spends).
pub use throttle::bucket::{
    adjust, gpu_ns, inv_rate_fixed, repair_lead, rescale_lead, rescaled_due, reserve, Credit,
    LaunchCost, PidTable,
};
// Compute share: the feedback law that steers the bucket's rate toward the share.
pub use throttle::controller::{Controller, Tick, INITIAL_COST_NS};
// Compute share: the start-up estimate of the per-launch cost from the launches' own timing.
pub use throttle::probe::{estimate_within, Probe, ProbeWait};

// Memory: the ledger, sizes as the device spends them and reserve-before-allocate against a
// budget, over the books below.
pub use memory::ledger::{
    charge_size, lock, pitch_upper_bound, Budget, Ledger, OutOfMemory, PlacedCharges,
    PrimaryContext, Settled,
};
// Memory: the sharded per-process table object -> (device entry, bytes, owning context).
pub use memory::objects::{Charged, ObjectKind, ObjectTable, OWNER_NOT_ASKED};
// Memory: when the application's pool memory really returns to the card.
pub use memory::pool_book::{cover, home_of, Cover, Freed, PoolBook, PoolHome, PoolHomes, Settle};
// Memory: when a VMM allocation (`cuMemCreate` & co.) really returns to the card.
pub use memory::vmm_book::VmmBook;
// Memory: CUDA graph memory as the ledger books it, per device's graph pool.
pub use memory::graph_book::GraphBook;
// Memory: what a slice's memory numbers look like from inside (totals, free, process lists).
pub use memory::report::{
    list_fits, nvml_slice_view, slice_process_list, slice_view, MemoryView, NvmlView,
};

/// The sibling rule inside this crate: a compute-share model never names a memory model, nor
/// the other way round.
#[cfg(test)]
mod siblings {
    use std::path::Path;

    fn names_in(folder: &str, sibling: &str) -> Vec<String> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src")
            .join(folder);
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&dir).expect("the models' folder is readable") {
            let path = entry.expect("directory entry").path();
            let source = std::fs::read_to_string(&path).expect("a model's source");
            for (number, line) in source.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                if code.contains(&format!("crate::{sibling}")) || code.contains("super::super") {
                    found.push(format!("{}:{}: {line}", path.display(), number + 1));
                }
            }
        }
        found
    }

    #[test]
    fn the_throttle_and_memory_models_never_import_each_other() {
        assert_eq!(names_in("throttle", "memory"), Vec::<String>::new());
        assert_eq!(names_in("memory", "throttle"), Vec::<String>::new());
    }
}
