//! nvml-wrapper, the Rust NVML client (used by Rust tooling and by gpuslice's own tests),
//! reads the fake through its safe API and sees the state: the calls gpuslice cares about
//! (`name`, `uuid`, `memory_info` (v2), `running_compute_processes` (v3),
//! `utilization_rates`) plus compute capability and PCI info.
//!
//! Needs `cargo build -p fakegpu -p fakegpu-cuda -p fakegpu-nvml` first.

mod common;

use common::{artifact, isolated, spawn_holder, truth};
use fakegpu::nvml_view::RESERVED_MEMORY_BYTES;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;

const MIB: u64 = 1 << 20;

#[test]
fn nvml_wrapper_sees_the_fake_gpu_state() {
    const NAME: &str = "nvml_wrapper_sees_the_fake_gpu_state";
    isolated(
        NAME,
        &[
            ("FAKEGPU_PID_OFFSET", "42"),
            ("FAKEGPU_CTX_OVERHEAD", "16777216"),
        ],
        || {
            if common::is_holder() {
                common::run_holder();
                return;
            }
            let holder = spawn_holder(NAME, 8 * MIB);
            let lib = artifact("libfakegpu_nvml.so");
            let nvml = Nvml::builder()
                .lib_path(lib.as_os_str())
                .init()
                .expect("nvml-wrapper initialises the fake");
            let state = truth();
            let spec = state.device(0).unwrap();

            assert_eq!(nvml.device_count().unwrap(), 1);
            assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 13000);
            let dev = nvml.device_by_index(0).unwrap();
            assert_eq!(dev.name().unwrap(), spec.name);
            assert_eq!(dev.uuid().unwrap(), spec.uuid);
            assert_eq!(dev.index().unwrap(), 0);
            let cc = dev.cuda_compute_capability().unwrap();
            assert_eq!((cc.major as u32, cc.minor as u32), (7, 0));
            assert_eq!(dev.pci_info().unwrap().bus_id, spec.pci_bus_id);

            let used = 16 * MIB + 8 * MIB;
            let mem = dev.memory_info().unwrap();
            assert_eq!(mem.total, spec.total_memory);
            assert_eq!(mem.reserved, RESERVED_MEMORY_BYTES);
            assert_eq!(mem.used, used);
            assert_eq!(mem.free, spec.total_memory - RESERVED_MEMORY_BYTES - used);

            let procs = dev.running_compute_processes().unwrap();
            assert_eq!(procs.len(), 1);
            assert_eq!(procs[0].pid, holder.pid + 42);
            assert_eq!(procs[0].used_gpu_memory, UsedGpuMemory::Used(used));
            assert_eq!(procs[0].gpu_instance_id, None, "not a MIG device");

            let util = dev.utilization_rates().unwrap();
            assert_eq!((util.gpu, util.memory), (0, 0));
        },
    );
}
