//! Framework kernel launches under a compute share (serial binary: `test = false`, run by
//! `cargo xtask test`): a loop of PyTorch elementwise kernels, a loop of cuBLAS matmuls and a
//! loop of CuPy's NVRTC-compiled elementwise kernels (what a framework's step is made of,
//! launched by NVIDIA's runtime from the frameworks' fatbins) each hold their share within 5
//! points on the fake's timeline, which is the only figure looked at.
//!
//! Kernels from fatbins take the time their geometry gives at `FAKEGPU_NS_PER_WAVE`, set
//! here so that one kernel is ~1 ms and an unthrottled loop keeps the device busy. PyTorch's
//! CUDA 13 build, cuBLAS 13 and NVRTC 13 have no code for a V100 (sm_70), so every loop runs on
//! a simulated A100.
//!
//! Skipping as in `frameworks.rs`.

#[path = "common/python.rs"]
mod python;

use cuda_e2e::{FakeGpu, Slice};
use python::{have, Py};

const SETTLE_NS: u64 = 2_000_000_000;
const WINDOW_NS: u64 = 2_000_000_000;
const TOLERANCE: f64 = 5.0;

/// One loop: the card, the rate, what is set up once, and the statement repeated.
struct Workload {
    what: &'static str,
    /// The framework's module and its statement that waits for the device.
    module: &'static str,
    sync: &'static str,
    preset: &'static str,
    ns_per_wave: &'static str,
    setup: &'static str,
    step: &'static str,
}

/// `x.mul_(1.0)` on 16 Mi floats: 32768 blocks of 128 threads, 19 waves on an A100 (108 SMs
/// x 16 such blocks; PyTorch's CUDA 13 build has no code for a V100) at this rate: about
/// 1.3 ms.
const ELEMENTWISE: Workload = Workload {
    what: "torch elementwise",
    module: "torch",
    sync: "torch.cuda.synchronize()",
    preset: "a100",
    ns_per_wave: "68000",
    setup: "x = torch.ones(16 << 20, device='cuda')",
    step: "x.mul_(1.0)",
};

/// A 4096 x 4096 fp32 matmul: cuBLAS picks a kernel of 32 x 64 blocks of 128 threads,
/// 2 waves on an A100 (108 SMs x 16 such blocks) at this rate: 1 ms.
const MATMUL: Workload = Workload {
    what: "torch matmul",
    module: "torch",
    sync: "torch.cuda.synchronize()",
    preset: "a100",
    ns_per_wave: "500000",
    setup: "a = torch.ones(4096, 4096, device='cuda'); b = torch.ones(4096, 4096, device='cuda'); \
            c = a @ b",
    step: "c = a @ b",
};

/// CuPy's `x *= 1.0` on 16 Mi floats, compiled by NVRTC for the card (an A100: NVRTC 13
/// has no sm_70): 131072 blocks of 128 threads, 76 waves at this rate: about 1.3 ms.
const CUPY_ELEMENTWISE: Workload = Workload {
    what: "cupy elementwise",
    module: "cupy",
    sync: "cupy.cuda.runtime.deviceSynchronize()",
    preset: "a100",
    ns_per_wave: "17000",
    setup: "x = cupy.ones(16 << 20, dtype=cupy.float32); x *= 1.0",
    step: "x *= 1.0",
};

/// The loop's busy share of the device (percent) over a window after it has settled.
fn run(w: &Workload, share: Option<u32>) -> f64 {
    let gpu = FakeGpu::start(w.preset);
    let slice = Slice::builder().device(0, "8GiB", share).build();
    let mut env = slice.env(&gpu);
    env.push(("FAKEGPU_NS_PER_WAVE".into(), w.ns_per_wave.into()));
    let mut py = Py::start(&format!("{} compute {share:?}", w.what), &env);
    py.ok(&format!(
        "import {}, time; {}; {}",
        w.module, w.setup, w.sync
    ));
    let start = fakegpu::state::now_ns();
    py.ok(&format!(
        "end = time.monotonic() + 4.5\n\
         while time.monotonic() < end:\n    {}\n\
         {}",
        w.step, w.sync
    ));
    let from = start + SETTLE_NS;
    let busy = gpu
        .truth()
        .busy_ns(0, Some(py.pid()), from, from + WINDOW_NS);
    py.finish();
    busy as f64 * 100.0 / WINDOW_NS as f64
}

fn holds_its_share(w: &Workload) {
    // Unthrottled, the loop keeps the device busy: the share is what holds it back.
    let free = run(w, None);
    eprintln!("{} loop without a share: {free:.1}% busy", w.what);
    assert!(
        free >= 90.0,
        "the {} loop alone should fill the device: {free:.1}%",
        w.what
    );
    for share in [25, 50] {
        let got = run(w, Some(share));
        eprintln!("{} loop at compute {share}: {got:.1}% busy", w.what);
        assert!(
            (got - share as f64).abs() <= TOLERANCE,
            "compute {share}: the {} loop held {got:.1}% of the device",
            w.what
        );
    }
}

#[test]
fn a_torch_kernel_loop_holds_its_compute_share() {
    if !have("torch") {
        return;
    }
    holds_its_share(&ELEMENTWISE);
}

#[test]
fn a_torch_matmul_loop_holds_its_compute_share() {
    if !have("torch") {
        return;
    }
    holds_its_share(&MATMUL);
}

#[test]
fn a_cupy_kernel_loop_holds_its_compute_share() {
    if !have("cupy") {
        return;
    }
    holds_its_share(&CUPY_ELEMENTWISE);
}
