//! PyTorch's kernel launches under a compute share (serial binary: `test = false`, run by
//! `cargo xtask test`): a loop of elementwise kernels (what a framework's step is made of,
//! launched by NVIDIA's runtime from PyTorch's fatbins) holds its share within 5 points on
//! the fake's timeline, which is the only figure looked at.
//!
//! cuBLAS's matmul does not run on the fake yet (its static runtime calls a private slot
//! the fake does not serve; see cuda-tests/README.md), so the loop is elementwise. Kernels
//! from fatbins take the time their geometry gives at `FAKEGPU_NS_PER_WAVE`, set here so
//! that one kernel is ~1 ms and an unthrottled loop keeps the device busy.
//!
//! Skipping as in `frameworks.rs`.

#[path = "common/python.rs"]
mod python;

use cuda_e2e::{FakeGpu, Slice};
use python::{have, Py};

const SETTLE_NS: u64 = 2_000_000_000;
const WINDOW_NS: u64 = 2_000_000_000;
const TOLERANCE: f64 = 5.0;

/// One launch of `x.mul_(1.0)` on 16 Mi floats: 32768 blocks of 128 threads, 26 waves on a
/// V100 at this rate: about 1.3 ms.
const NS_PER_WAVE: &str = "50000";

fn run(share: Option<u32>) -> f64 {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "8GiB", share).build();
    let mut env = slice.env(&gpu);
    env.push(("FAKEGPU_NS_PER_WAVE".into(), NS_PER_WAVE.into()));
    let mut py = Py::start(&format!("compute {share:?}"), &env);
    py.ok("import torch, time; x = torch.ones(16 << 20, device='cuda'); torch.cuda.synchronize()");
    let start = fakegpu::state::now_ns();
    py.ok("end = time.monotonic() + 4.5\n\
         while time.monotonic() < end:\n    x.mul_(1.0)\n\
         torch.cuda.synchronize()");
    let from = start + SETTLE_NS;
    let busy = gpu
        .truth()
        .busy_ns(0, Some(py.pid()), from, from + WINDOW_NS);
    py.finish();
    busy as f64 * 100.0 / WINDOW_NS as f64
}

#[test]
fn a_torch_kernel_loop_holds_its_compute_share() {
    if !have("torch") {
        return;
    }
    // Unthrottled, the loop keeps the device busy: the share is what holds it back.
    let free = run(None);
    eprintln!("torch elementwise loop without a share: {free:.1}% busy");
    assert!(
        free >= 90.0,
        "the loop alone should fill the device: {free:.1}%"
    );
    for share in [25, 50] {
        let got = run(Some(share));
        eprintln!("torch elementwise loop at compute {share}: {got:.1}% busy");
        assert!(
            (got - share as f64).abs() <= TOLERANCE,
            "compute {share}: the loop held {got:.1}% of the device"
        );
    }
}
